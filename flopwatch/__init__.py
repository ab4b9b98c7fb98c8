"""FlopWatch: observability for GPU training clusters (MFU, goodput, stragglers, faults)."""

__version__ = "0.1.0"
