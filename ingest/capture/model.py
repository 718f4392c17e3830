"""A tiny GPT (pre-LN decoder) whose operators are the ones of a real transformer.

Linear layers become ``aten::addmm``/``aten::mm`` and, with ``attention="math"``, the
attention scores and context are ``aten::bmm``: every matmul of the seed-004 FLOP count
appears in a ``record_shapes`` trace with its dimensions.  Imports torch: load it only
from code that trains.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from calib.ingest.capture.runspec import GPTShape
from torch import nn


class Block(nn.Module):
    """One transformer layer: LN, attention (qkv, scores, context, proj), LN, MLP (4d)."""

    def __init__(self, shape: GPTShape) -> None:
        super().__init__()
        d = shape.d
        self.heads = shape.a
        self.attention = shape.attention
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)
        mask = torch.triu(torch.ones(shape.s, shape.s, dtype=torch.bool), diagonal=1)
        self.register_buffer("mask", mask, persistent=False)

    def _attend(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        h = self.heads
        q, k, v = self.qkv(x).split(d, dim=-1)
        # (b, s, d) -> (b*h, s, d/h): the layout Megatron's core attention uses
        q, k, v = (t.reshape(b, s, h, d // h).transpose(1, 2).reshape(b * h, s, d // h) for t in (q, k, v))
        if self.attention == "sdpa":
            ctx = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = torch.bmm(q, k.transpose(1, 2)) * (1.0 / math.sqrt(d // h))
            scores = scores.masked_fill(self.mask[:s, :s], float("-inf"))
            ctx = torch.bmm(torch.softmax(scores, dim=-1), v)
        ctx = ctx.reshape(b, h, s, d // h).transpose(1, 2).reshape(b, s, d)
        return self.proj(ctx)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self._attend(self.ln1(x))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyGPT(nn.Module):
    """Token + position embeddings, ``l`` blocks, final LN and an untied LM head."""

    def __init__(self, shape: GPTShape) -> None:
        super().__init__()
        self.shape = shape
        self.tok = nn.Embedding(shape.V, shape.d)
        self.pos = nn.Embedding(shape.s, shape.d)
        self.blocks = nn.ModuleList(Block(shape) for _ in range(shape.l))
        self.ln_f = nn.LayerNorm(shape.d)
        self.head = nn.Linear(shape.d, shape.V, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        b, s = idx.shape
        x = self.tok(idx) + self.pos(torch.arange(s, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.reshape(b * s, -1), targets.reshape(b * s))


def batch(shape: GPTShape, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed random (tokens, next-token targets) batch of ``b`` sequences of ``s`` tokens."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, shape.V, (shape.b, shape.s + 1), generator=g)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
