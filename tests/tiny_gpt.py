"""A GPT-style decoder small enough for a CPU test (import as `from tiny_gpt import TinyGPT`):
token and position embeddings, pre-norm attention and MLP blocks, an untied LM head. The FLOPs
tests count it, the DDP test trains it in real processes (with `delay` making one rank slow)."""

from __future__ import annotations

import time

import torch
from torch import nn
from torch.nn import functional
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-1, -2)) / (d // self.heads) ** 0.5
        att = att.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.down(functional.gelu(self.up(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, dim: int, heads: int, layers: int, seq: int, recompute: bool = False) -> None:
        super().__init__()
        self.recompute = recompute
        self.delay = 0.0                      # seconds of sleep per forward: a straggling rank
        self.embed, self.position = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def body(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        if self.delay:
            time.sleep(self.delay)
        x = self.embed(idx) + self.position(torch.arange(idx.shape[1]))
        if self.recompute:                    # full activation recomputation of every matmul
            with set_checkpoint_early_stop(False):    # (early stop would skip the last matmul)
                return checkpoint(self.body, x, use_reentrant=False)
        return self.body(x)
