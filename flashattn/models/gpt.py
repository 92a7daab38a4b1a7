"""A small GPT-style decoder (notebook 13), nanoGPT's shape in a few dozen lines.

Its attention is a function passed in with ``scaled_dot_product_attention``'s signature, so that the same
model runs on ``flashattn.scaled_dot_product_attention`` or on torch's: the only difference between the two
models notebook 13 trains side by side.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int
    seq_len: int
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int | None = None  # fewer key/value heads than query heads: grouped-query attention
    d_model: int = 128


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig, attention):
        super().__init__()
        self.n_heads, self.n_kv = config.n_heads, config.n_kv_heads or config.n_heads
        self.head_dim = config.d_model // config.n_heads
        self.qkv = nn.Linear(config.d_model, (self.n_heads + 2 * self.n_kv) * self.head_dim, bias=False)
        self.proj = nn.Linear(config.d_model, config.d_model, bias=False)
        self.attention = attention

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split([self.n_heads * self.head_dim, self.n_kv * self.head_dim,
                                     self.n_kv * self.head_dim], dim=-1)
        q = q.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, head_dim)
        k = k.view(B, T, self.n_kv, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.n_kv, self.head_dim).transpose(1, 2)
        y = self.attention(q, k, v, is_causal=True, enable_gqa=self.n_kv != self.n_heads)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, config: GPTConfig, attention):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(config.d_model), nn.LayerNorm(config.d_model)
        self.attn = CausalSelfAttention(config, attention)
        self.mlp = nn.Sequential(nn.Linear(config.d_model, 4 * config.d_model), nn.GELU(),
                                 nn.Linear(4 * config.d_model, config.d_model))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig, attention):
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.seq_len, config.d_model)
        self.blocks = nn.ModuleList(Block(config, attention) for _ in range(config.n_layers))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)

    def forward(self, tokens):
        """(B, T) token ids -> (B, T, vocab_size) logits of each next token."""
        x = self.tok_emb(tokens) + self.pos_emb(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))
