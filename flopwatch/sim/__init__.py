"""The fleet simulator: scenario files, synchronous-training physics, faults, serving and history."""
