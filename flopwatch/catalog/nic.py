"""Metrics of the nic collector (filled in by its capability)."""
