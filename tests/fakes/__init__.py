"""Fakes for what cannot run on this machine (no GPU, NVIDIA driver, NVML or DCGM host engine).

Each fake sits at the narrowest seam: the module object a backend imports. They re-use the real
libraries' error classes, constants and ctypes structures wherever those import without hardware.
"""
