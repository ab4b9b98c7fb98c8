# The two commands a new user needs. Both set everything up first (scripts/setup.sh).
.PHONY: setup servers demo test test-fast lint docs bench clean

setup:
	@scripts/setup.sh

# The current upstream servers (Prometheus 3, Alertmanager, VictoriaMetrics) built from their Go
# modules into ~/.cache/flopwatch/servers, for the compatibility matrix; a second run builds nothing.
servers:
	@scripts/build-servers.sh

demo: setup
	.venv/bin/flopwatch demo

# Everything, real servers included, each module's tests on one of two workers (they mostly wait
# on the servers' evaluation clocks); the 25 slowest tests listed at the end.
test: setup servers
	.venv/bin/ruff check .
	.venv/bin/python -m pytest -n 2 --dist loadfile --durations=25

# The developer's loop: unit tests only, no servers, no slow tests (under 2 minutes on 2 cores).
test-fast: setup servers
	.venv/bin/python -m pytest -q -m "not slow and not integration" --ignore=tests/integration tests

lint: setup
	.venv/bin/ruff check .

docs: setup
	.venv/bin/flopwatch docs metrics --out docs/metrics.md
	.venv/bin/flopwatch docs agent --out docs/agent.md

bench: setup
	.venv/bin/python -m bench.scrape_latency

clean:
	rm -rf .venv .pytest_cache .ruff_cache
