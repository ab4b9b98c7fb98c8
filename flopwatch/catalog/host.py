"""Metrics of the host collector (filled in by its capability)."""
