# The two commands a new user needs. Both set everything up first (scripts/setup.sh).
.PHONY: setup demo test lint docs bench clean

setup:
	@scripts/setup.sh

demo: setup
	.venv/bin/flopwatch demo

test: setup
	.venv/bin/ruff check .
	.venv/bin/python -m pytest

lint: setup
	.venv/bin/ruff check .

docs: setup
	.venv/bin/flopwatch docs metrics --out docs/metrics.md
	.venv/bin/flopwatch docs agent --out docs/agent.md

bench: setup
	.venv/bin/python -m bench.scrape_latency

clean:
	rm -rf .venv .pytest_cache .ruff_cache
