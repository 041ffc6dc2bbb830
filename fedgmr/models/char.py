"""Character LSTM for Shakespeare (LEAF's model: embedding 8, 2-layer LSTM 256)."""

from __future__ import annotations

import torch
import torch.nn as nn

from fedgmr.models.registry import MODELS, scaled, shape_mismatch
from fedgmr.options import int_option


class CharLSTM(nn.Module):
    """Embedding -> stacked LSTM -> linear head at every position: (B, T) -> (B, T, vocab)."""

    def __init__(self, vocab_size: int, embed_dim: int = 8, hidden: int = 256, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embed_dim)
        self.lstm = nn.LSTM(embed_dim, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embed(tokens))
        return self.head(out)


@MODELS.register("char_lstm")
def build_char_lstm(num_classes: int, input_shape: tuple[int, ...], width: float = 1.0,
                    embed_dim: int = 8, hidden: int = 256, layers: int = 2) -> nn.Module:
    """LEAF's Shakespeare LSTM; ``width`` scales the LSTM hidden size (embedding stays 8)."""
    embed_dim = int_option("model.options.embed_dim", embed_dim)
    hidden = int_option("model.options.hidden", hidden)
    layers = int_option("model.options.layers", layers)
    if len(input_shape) != 1:
        raise shape_mismatch("char_lstm", "token-sequence (seq_len,)", input_shape)
    return CharLSTM(num_classes, embed_dim, scaled(hidden, width), layers)
