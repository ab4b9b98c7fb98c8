"""Metrics of the train collector (filled in by its capability)."""
