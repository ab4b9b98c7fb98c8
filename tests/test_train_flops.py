"""FLOPs accounting: the PaLM formula, recomputation for HFU, and the real torch FlopCounterMode."""

from __future__ import annotations

import pytest
import torch
from tiny_gpt import TinyGPT
from torch import nn
from torch.nn import functional

from flopwatch.train import DecoderShape, FlopsAccount, account
from flopwatch.train.flops import matmul_params, measure_step_flops

VOCAB, DIM, HEADS, LAYERS, SEQ, BATCH = 512, 128, 4, 3, 64, 2


def tiny(recompute: bool = False) -> TinyGPT:
    return TinyGPT(VOCAB, DIM, HEADS, LAYERS, SEQ, recompute=recompute)


def _shape(model: nn.Module) -> DecoderShape:
    return DecoderShape(matmul_params(model), LAYERS, HEADS, DIM // HEADS, SEQ)


def _measure(model: nn.Module) -> float:
    torch.manual_seed(0)
    idx, target = torch.randint(0, VOCAB, (BATCH, SEQ)), torch.randint(0, VOCAB, (BATCH, SEQ))
    return measure_step_flops(
        model, idx, loss_fn=lambda out: functional.cross_entropy(out.view(-1, VOCAB), target.view(-1)))


def test_palm_formula():
    shape = DecoderShape(params=70e9, layers=80, heads=64, head_dim=128, seq_len=4096)
    attention = 12 * 80 * 64 * 128 * 4096
    assert shape.model_flops_per_token() == 6 * 70e9 + attention
    assert shape.hardware_flops_per_token() == shape.model_flops_per_token()
    assert shape.hardware_flops_per_token("selective") == 6 * 70e9 + attention * 4 / 3
    assert shape.hardware_flops_per_token("full") == 8 * 70e9 + attention * 4 / 3
    with pytest.raises(ValueError, match="recompute"):
        shape.hardware_flops_per_token("some")  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["params", "layers", "heads", "head_dim", "seq_len"])
@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf"), True])
def test_shape_refuses_nonsense(field, value):
    args = {"params": 1e9, "layers": 2, "heads": 2, "head_dim": 64, "seq_len": 128, field: value}
    with pytest.raises(ValueError, match=field):
        DecoderShape(**args)


def test_matmul_params_counts_linear_weights_once():
    model = tiny()
    per_block = 3 * DIM * DIM + DIM * DIM + 2 * 4 * DIM * DIM
    assert matmul_params(model) == LAYERS * per_block + VOCAB * DIM
    model.head.weight = model.embed.weight                 # tied: still one matrix
    assert matmul_params(model) == LAYERS * per_block + VOCAB * DIM


def test_analytic_and_flop_counter_agree_within_two_percent():
    model = tiny()
    measured = _measure(model)
    analytic = _shape(model).model_flops_per_token() * BATCH * SEQ
    assert measured == pytest.approx(analytic, rel=0.02)
    assert all(p.grad is None for p in model.parameters())    # measuring left no gradients behind


def test_full_recomputation_is_hardware_flops_not_model_flops():
    model = tiny(recompute=True)
    measured = _measure(model)
    shape = _shape(model)
    assert measured == pytest.approx(shape.hardware_flops_per_token("full") * BATCH * SEQ, rel=0.02)
    assert measured > 1.2 * shape.model_flops_per_token() * BATCH * SEQ


def test_account_reports_both_side_by_side():
    shape = DecoderShape(params=1e6, layers=2, heads=2, head_dim=8, seq_len=16)
    both = account(1000, shape, measured_per_step=6.2e9)
    assert both.analytic_per_step == shape.model_flops_per_token() * 1000
    assert both.model_per_step == both.analytic_per_step           # the formula defines MFU
    assert "analytic 6.006e+09, measured 6.2e+09 (measured +3.2% vs analytic)" in both.describe()
    only_measured = account(1000, measured_per_step=5e9)
    assert only_measured.model_per_step == 5e9 == only_measured.hardware_per_step
    assert "measured 5e+09" in only_measured.describe()
    assert FlopsAccount(10).describe() == "model FLOPs per step: unknown"
    recomputed = account(1000, shape, recompute="full")
    assert "with recomputation" in recomputed.describe()
    with pytest.raises(ValueError, match="tokens_per_step"):
        account(0, shape)
    with pytest.raises(ValueError, match="measured_per_step"):
        account(10, measured_per_step=float("nan"))
