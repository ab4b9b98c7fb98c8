"""Client library for training code: step and phase timing, FLOPs accounting, PyTorch hooks.

Imports nothing from the agent or prometheus_client, so a training job pays only for this client.
`flopwatch.train.torch` (the DDP integration) imports torch lazily.
"""

from flopwatch.train.flops import DecoderShape, FlopsAccount, account
from flopwatch.train.monitor import StepMonitor

__all__ = ["DecoderShape", "FlopsAccount", "StepMonitor", "account"]
