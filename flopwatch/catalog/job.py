"""Metrics of the job collector (filled in by its capability)."""
