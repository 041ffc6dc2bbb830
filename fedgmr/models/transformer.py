"""Causal Transformer language model (the paper's StackOverflow model).

Attention is written with separate ``q``/``k``/``v``/``out`` linear layers so per-head
slices of the parameters can be taken: the head count is fixed and ``width`` shrinks the
head dimension (``ceil(width * E / heads)``), as HeteroFL does.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from fedgmr.errors import ConfigError
from fedgmr.models.registry import MODELS, scaled, shape_mismatch
from fedgmr.options import float_option, int_option


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention with a causal mask; heads are contiguous column blocks."""

    def __init__(self, dim: int, heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"embedding dim {dim} is not divisible by {heads} heads")
        self.heads, self.head_dim, self.dropout = heads, dim // heads, dropout
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape

        def split(z: torch.Tensor) -> torch.Tensor:
            return z.view(b, t, self.heads, self.head_dim).transpose(1, 2)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        attn = F.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        attn = F.dropout(attn, self.dropout, self.training)
        return self.out((attn @ v).transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


class TransformerBlock(nn.Module):
    """Post-norm encoder block (attention, then a GELU feed-forward), causal."""

    def __init__(self, dim: int, heads: int, hidden: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.attn = CausalSelfAttention(dim, heads, dropout)
        self.norm1 = nn.LayerNorm(dim)
        self.ff1 = nn.Linear(dim, hidden)
        self.ff2 = nn.Linear(hidden, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.drop(self.attn(x)))
        return self.norm2(x + self.drop(self.ff2(self.drop(F.gelu(self.ff1(x))))))


class TransformerLM(nn.Module):
    """Token + learned position embeddings, causal blocks, linear head to the vocabulary."""

    def __init__(self, vocab_size: int, dim: int, heads: int, hidden: int, layers: int,
                 max_len: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.max_len = max_len
        self.embed = nn.Embedding(vocab_size, dim)
        self.pos = nn.Embedding(max_len, dim)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(TransformerBlock(dim, heads, hidden, dropout) for _ in range(layers))
        self.head = nn.Linear(dim, vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        if t > self.max_len:
            raise ValueError(f"sequence length {t} exceeds max_len {self.max_len}")
        positions = torch.arange(t, device=tokens.device)
        x = self.drop(self.embed(tokens) + self.pos(positions))
        for block in self.blocks:
            x = block(x)
        return self.head(x)


@MODELS.register("transformer_lm")
def build_transformer_lm(num_classes: int, input_shape: tuple[int, ...], width: float = 1.0,
                         embed_dim: int = 96, hidden: int = 384, heads: int = 4, layers: int = 2,
                         max_len: int | None = None, dropout: float = 0.0) -> nn.Module:
    """Causal Transformer LM (paper: embedding 96, FFN 384, 4 heads, 2 layers).

    ``num_classes`` is the vocabulary size and ``input_shape`` is ``(seq_len,)``; the model maps
    token ids (B, T) to logits (B, T, vocab). ``width`` keeps the head count and scales the
    head dimension to ``ceil(width * embed_dim / heads)`` and the FFN to
    ``ceil(width * hidden)``. ``max_len`` (default ``seq_len``) sizes the position table.
    """
    embed_dim = int_option("model.options.embed_dim", embed_dim)
    hidden = int_option("model.options.hidden", hidden)
    heads = int_option("model.options.heads", heads)
    layers = int_option("model.options.layers", layers)
    max_len = int_option("model.options.max_len", max_len, optional=True)
    dropout = float_option("model.options.dropout", dropout, 0.0, 1.0, high_open=True)
    if len(input_shape) != 1:
        raise shape_mismatch("transformer_lm", "token-sequence (seq_len,)", input_shape)
    if max_len is not None and max_len < int(input_shape[0]):
        raise ConfigError(f"invalid value for 'model.options.max_len': shorter than the data's sequences of "
                          f"{int(input_shape[0])} tokens (got {max_len})")
    ffn = scaled(hidden, width)  # also validates width
    head_dim = max(1, math.ceil(width * embed_dim / heads - 1e-9))
    length = max_len if max_len is not None else int(input_shape[0])
    return TransformerLM(num_classes, heads * head_dim, heads, ffn, layers, length, dropout)
