"""A small GPT-style decoder (notebook 13), nanoGPT's shape in a few dozen lines, and its generation (notebook 15).

Its attention is a function passed in with ``scaled_dot_product_attention``'s signature, so that the same
model runs on ``flashattn.scaled_dot_product_attention`` or on torch's: the only difference between the two
models notebook 13 trains side by side.

Generation (:meth:`GPT.generate`, greedy) runs the whole sequence again for every new token, or, with a
:class:`KVCache`, keeps each layer's keys and values: the prompt goes through once, then each step computes one
token's query, key and value and attends over the cache with ``attention_with_kvcache``'s signature
(``flashattn.attention_with_kvcache``, or :func:`sdpa_with_kvcache`, the same on torch's SDPA).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from flashattn.kernels.decode import attention_with_kvcache


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

    def forward(self, x, cache: KVCache | None = None, layer: int = 0):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split([self.n_heads * self.head_dim, self.n_kv * self.head_dim,
                                     self.n_kv * self.head_dim], dim=-1)
        q = q.view(B, T, self.n_heads, self.head_dim)  # (B, T, H, head_dim)
        k = k.view(B, T, self.n_kv, self.head_dim)
        v = v.view(B, T, self.n_kv, self.head_dim)
        if cache is not None:  # append this step's keys and values, attend over everything cached
            start = cache.length
            cache.k[layer][:, start:start + T] = k
            cache.v[layer][:, start:start + T] = v
            y = cache.attention(q, cache.k[layer], cache.v[layer], start + T, causal=True)
            return self.proj(y.reshape(B, T, C))
        y = self.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                           enable_gqa=self.n_kv != self.n_heads)  # (B, H, T, head_dim)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, config: GPTConfig, attention):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(config.d_model), nn.LayerNorm(config.d_model)
        self.attn = CausalSelfAttention(config, attention)
        self.mlp = nn.Sequential(nn.Linear(config.d_model, 4 * config.d_model), nn.GELU(),
                                 nn.Linear(4 * config.d_model, config.d_model))

    def forward(self, x, cache: KVCache | None = None, layer: int = 0):
        x = x + self.attn(self.ln1(x), cache, layer)
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

    def forward(self, tokens, cache: KVCache | None = None):
        """(B, T) token ids -> (B, T, vocab_size) logits of each next token. With a ``cache``, the tokens follow
        the ``cache.length`` tokens already in it, and their keys and values are appended."""
        start = 0 if cache is None else cache.length
        x = self.tok_emb(tokens) + self.pos_emb(torch.arange(start, start + tokens.shape[1], device=tokens.device))
        for layer, block in enumerate(self.blocks):
            x = block(x, cache, layer)
        if cache is not None:
            cache.length += tokens.shape[1]
        return self.head(self.ln_f(x))

    def new_cache(self, batch: int, max_len: int | None = None, *, attention=attention_with_kvcache) -> KVCache:
        """An empty :class:`KVCache` for ``batch`` sequences of up to ``max_len`` tokens (default: the model's
        seq_len), on the model's device and in its dtype."""
        c, param = self.config, self.head.weight
        max_len = c.seq_len if max_len is None else max_len
        shape = (batch, max_len, c.n_kv_heads or c.n_heads, c.d_model // c.n_heads)
        return KVCache([param.new_zeros(shape) for _ in range(c.n_layers)],
                       [param.new_zeros(shape) for _ in range(c.n_layers)], attention=attention)

    @torch.no_grad()
    def generate(self, prompt, new_tokens: int, cache: KVCache | None = None) -> torch.Tensor:
        """Greedy generation: (B, P) prompt ids -> (B, new_tokens) ids, each the argmax of the next-token logits.
        Without a cache every step runs the whole sequence; with an (empty) ``cache`` the prompt runs once and each
        step runs one token against the cache."""
        if prompt.shape[1] + new_tokens > self.config.seq_len:
            raise ValueError(f"generate: prompt ({prompt.shape[1]}) + new_tokens ({new_tokens}) exceeds the model's "
                             f"seq_len={self.config.seq_len} (its position embeddings)")
        if cache is not None and cache.length:
            raise ValueError(f"generate: the cache must be empty, it holds {cache.length} tokens")
        seq, out = prompt, []
        for _ in range(new_tokens):
            logits = self(seq) if cache is None else self(seq if not out else out[-1], cache)
            out.append(logits[:, -1].argmax(-1, keepdim=True))
            seq = torch.cat([seq, out[-1]], 1) if cache is None else seq
        return torch.cat(out, 1)


@dataclass
class KVCache:
    """Each layer's keys and values, (B, max_len, Hkv, head_dim) as FlashAttention lays a cache out, of ``length``
    tokens of every sequence, and the attention over them (``attention_with_kvcache``'s signature)."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    length: int = 0
    attention: Callable = field(default=attention_with_kvcache)


def sdpa_with_kvcache(q, k_cache, v_cache, cache_seqlens: int, *, causal=True):
    """``attention_with_kvcache`` for a contiguous cache whose sequences all hold ``cache_seqlens`` keys, on torch's
    ``scaled_dot_product_attention``: the baseline generation is measured against."""
    L, n = q.shape[1], cache_seqlens
    k, v = k_cache[:, :n].transpose(1, 2), v_cache[:, :n].transpose(1, 2)  # (B, Hkv, n, D) views
    mask = None
    if causal and 1 < L < n:  # bottom right: query i sees keys j <= n - L + i
        mask = torch.ones(L, n, dtype=torch.bool, device=q.device).tril(n - L)
    y = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask,
                                                         is_causal=causal and L == n and L > 1,
                                                         enable_gqa=q.shape[2] != k.shape[1])
    return y.transpose(1, 2)
