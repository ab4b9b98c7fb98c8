"""FLOPs per step: analytic for dense decoders, or measured once from the real model.

Model FLOPs per token of a dense decoder (PaLM, arXiv 2204.02311, appendix B):

    6·N + 12·L·H·Q·T

with N the parameters that take part in matrix multiplies, L layers, H heads, Q head dimension and
T sequence length; the first term is the forward (2N) and backward (4N) pass of every weight, the
second the attention scores and weighted sum. MFU uses these *model* FLOPs. Work redone by
activation recomputation counts toward HFU (hardware FLOPs) only: selective recomputation redoes the
attention core (+4·L·H·Q·T), full recomputation a whole forward pass (+2·N + 4·L·H·Q·T).

`measure_step_flops` counts what torch actually runs for one forward and backward pass with
`torch.utils.flop_counter.FlopCounterMode` — matrix multiplies and attention only, like the formula,
so the two agree closely on a plain decoder and disagree where a model is not one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

Recompute = Literal["none", "selective", "full"]


@dataclass(frozen=True)
class DecoderShape:
    """The figures of a dense decoder that fix its FLOPs per token."""

    params: float     # N: parameters used in matrix multiplies (embedding lookups excluded)
    layers: int       # L
    heads: int        # H
    head_dim: int     # Q
    seq_len: int      # T

    def __post_init__(self) -> None:
        for name in ("params", "layers", "heads", "head_dim", "seq_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
                    or value <= 0:
                raise ValueError(f"DecoderShape.{name} = {value!r}: expected a positive number")

    @property
    def attention_flops_per_token(self) -> float:
        """12·L·H·Q·T: forward and backward of QKᵀ and of the weighted sum of V."""
        return 12.0 * self.layers * self.heads * self.head_dim * self.seq_len

    def model_flops_per_token(self) -> float:
        return 6.0 * self.params + self.attention_flops_per_token

    def hardware_flops_per_token(self, recompute: Recompute = "none") -> float:
        """Model FLOPs plus what recomputing activations redoes in the backward pass."""
        extra = {"none": 0.0, "selective": self.attention_flops_per_token / 3,
                 "full": 2.0 * self.params + self.attention_flops_per_token / 3}
        if recompute not in extra:
            raise ValueError(f"recompute = {recompute!r}: expected one of none, selective, full")
        return self.model_flops_per_token() + extra[recompute]


@dataclass(frozen=True)
class FlopsAccount:
    """FLOPs of one step by every method available; MFU takes `model_per_step`."""

    tokens_per_step: float
    analytic_per_step: float | None = None
    measured_per_step: float | None = None
    hardware_analytic_per_step: float | None = None

    @property
    def model_per_step(self) -> float:
        """The analytic count when there is one (it is the definition of MFU), else the measured one."""
        if self.analytic_per_step is not None:
            return self.analytic_per_step
        return self.measured_per_step or 0.0

    @property
    def hardware_per_step(self) -> float:
        if self.hardware_analytic_per_step is not None:
            return self.hardware_analytic_per_step
        return self.model_per_step

    def describe(self) -> str:
        """One line for a training log, with both counts side by side when both exist."""
        parts = []
        if self.analytic_per_step is not None:
            parts.append(f"analytic {self.analytic_per_step:.4g}")
        if self.measured_per_step is not None:
            parts.append(f"measured {self.measured_per_step:.4g}")
        text = "model FLOPs per step: " + (", ".join(parts) or "unknown")
        if self.analytic_per_step and self.measured_per_step:
            text += f" (measured {self.measured_per_step / self.analytic_per_step - 1:+.1%} vs analytic)"
        if self.hardware_per_step != self.model_per_step:
            text += f"; hardware {self.hardware_per_step:.4g} with recomputation"
        return text


def account(tokens_per_step: float, shape: DecoderShape | None = None, *,
            measured_per_step: float | None = None, recompute: Recompute = "none") -> FlopsAccount:
    """A FlopsAccount for a step of `tokens_per_step` tokens from a shape and/or a measurement."""
    if not math.isfinite(tokens_per_step) or tokens_per_step <= 0:
        raise ValueError(f"tokens_per_step = {tokens_per_step!r}: expected a positive number")
    analytic = hardware = None
    if shape is not None:
        analytic = shape.model_flops_per_token() * tokens_per_step
        hardware = shape.hardware_flops_per_token(recompute) * tokens_per_step
    if measured_per_step is not None and (not math.isfinite(measured_per_step) or measured_per_step < 0):
        raise ValueError(f"measured_per_step = {measured_per_step!r}: expected a number >= 0")
    return FlopsAccount(tokens_per_step, analytic, measured_per_step, hardware)


def matmul_params(model: Any) -> int:
    """N for 6·N: weights of every torch.nn.Linear (a tied embedding/output matrix counted once).

    Embedding lookups, norms and biases do no matrix multiply and are left out.
    """
    import torch

    seen: set[int] = set()
    total = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and id(module.weight) not in seen:
            seen.add(id(module.weight))
            total += module.weight.numel()
    return total


def measure_step_flops(model: Any, *inputs: Any,
                       loss_fn: Callable[[Any], Any] | None = None) -> float:
    """FLOPs of one forward and backward pass of `model(*inputs)`, counted by FlopCounterMode.

    Run it once at start-up (it costs a training step); gradients it makes are cleared again.
    `loss_fn` turns the model's output into a scalar (default: the output's sum).
    """
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        output = model(*inputs)
        loss = loss_fn(output) if loss_fn is not None else output.sum()
        loss.backward()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.grad = None
    return float(counter.get_total_flops())
