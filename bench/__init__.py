"""Benchmarks: each measures FlopWatch against a reference run on the same machine in the same run,
and prints a markdown table for bench/RESULTS.md. Run one with `.venv/bin/python -m bench.<name>`."""
