"""GPU telemetry: backends (NVML, DCGM, simulated) that read devices, and the collector that turns
their readings into catalogue families with per-GPU fault isolation."""
