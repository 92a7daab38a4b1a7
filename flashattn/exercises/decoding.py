"""The exercise of notebook 13: the causal mask of a decoder that appends queries to a key/value cache.

``check_decode_mask(fn)``: ``fn(L, S)`` returns the boolean (L, S) mask, True where query i may attend to key
j, for L new queries that are the *last* L positions of a sequence of S keys (the first S − L keys come from
the cache): query i sits at position S − L + i and sees keys j <= S − L + i (bottom-right alignment). With
L = S it is the usual causal mask; torch's ``is_causal=True`` aligns top-left instead, which is right for
training and wrong here. The check compares with mistake models and names the one that matches, then shows
that attention with the mask gives the last L rows of full causal attention.
"""

from __future__ import annotations

import torch

from ._check import ExerciseFailed, call, exercise

CASES = ((3, 6), (1, 6), (4, 4), (5, 9), (1, 1), (2, 7))


def _mistakes(L: int, S: int) -> dict[str, torch.Tensor]:
    ones = torch.ones(L, S, dtype=torch.bool)
    right = ones.tril(S - L)
    return {
        "that is torch's is_causal=True (top left: query i sees keys j <= i); the new queries are the last L "
        "positions, so query i sees keys j <= i + (S − L): tril(diagonal=S - L)": ones.tril(),
        "True must mean 'may attend' (as in scaled_dot_product_attention's boolean attn_mask); yours is the "
        "opposite": ~right,
        "off by one: each new query sees its own key (the diagonal shifted by S − L is included)": ones.tril(S - L - 1),
        "off by one: a query sees the key right after its own position; use diagonal=S - L": ones.tril(S - L + 1),
        "the mask lets every query see every key: nothing is masked": ones,
    }


@exercise("decoding mask")
def check_decode_mask(fn):
    """``fn(L, S)`` → boolean (L, S) mask for L new queries after S − L cached keys (see the module docstring)."""
    for L, S in CASES:
        got = call(fn, L, S)
        where = f"L={L}, S={S}"
        if not isinstance(got, torch.Tensor):
            raise ExerciseFailed(f"{where}: return a torch.Tensor, got {type(got).__name__}")
        if tuple(got.shape) != (L, S):
            hint = " (rows are queries, columns keys: did you transpose it?)" if tuple(got.shape) == (S, L) else ""
            raise ExerciseFailed(f"{where}: the mask has shape {tuple(got.shape)}, expected (L, S) = {(L, S)}{hint}")
        if got.dtype != torch.bool:
            raise ExerciseFailed(f"{where}: the mask has dtype {got.dtype}; use a boolean mask (True: may attend). "
                                 "A float attn_mask is *added* to the scores, so 1.0 and 0.0 would not mask anything")
        got = got.cpu()
        right = torch.ones(L, S, dtype=torch.bool).tril(S - L)
        if torch.equal(got, right):
            continue
        for message, model in _mistakes(L, S).items():
            if torch.equal(got, model):
                raise ExerciseFailed(f"{where}: {message}")
        row = int((got != right).any(1).nonzero()[0])
        raise ExerciseFailed(f"{where}: row {row} (query at position {S - L + row}) is {got[row].int().tolist()}, "
                             f"expected {right[row].int().tolist()}")
    # the point of it: attention of the new queries with the mask = the last L rows of full causal attention
    gen = torch.Generator().manual_seed(0)
    L, S = 3, 7
    q, k, v = (torch.randn(1, 1, S, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    full = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    new = torch.nn.functional.scaled_dot_product_attention(q[:, :, -L:], k, v, attn_mask=call(fn, L, S).cpu())
    assert torch.allclose(new, full[:, :, -L:], atol=1e-12)
    return "with this mask, the last L queries against the whole cache give the last L rows of causal attention"
