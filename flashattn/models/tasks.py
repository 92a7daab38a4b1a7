"""A task that needs attention, generated here (notebook 13): multi-query associative recall.

A sequence lists ``n_pairs`` (key, value) pairs, then asks for the keys again in another order, each
followed by its value::

    k3 v7  k0 v2  k5 v1 ...  |  k0 v2  k5 v1  k3 v7 ...
    └──────── the pairs ────┘  └──── the queries and their answers ────┘

Predicting an answer means finding, earlier in the sequence, where its key appeared and copying the token
after it: a lookup by content, which one attention layer cannot do alone (it finds the key, not what
follows it) and two can (the first moves each key onto its value's position, the second matches the
query against them). Keys and values are drawn afresh for every sequence, so nothing can be memorised.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AssociativeRecall:
    n_pairs: int = 8
    n_keys: int = 16    # keys are the tokens 0 .. n_keys - 1 (distinct within a sequence)
    n_values: int = 16  # values are the tokens n_keys .. n_keys + n_values - 1

    def __post_init__(self):
        if not 1 <= self.n_pairs <= self.n_keys or self.n_values < 1:
            raise ValueError(f"need 1 <= n_pairs <= n_keys and n_values >= 1, got n_pairs={self.n_pairs}, "
                             f"n_keys={self.n_keys}, n_values={self.n_values}")

    @property
    def vocab_size(self) -> int:
        return self.n_keys + self.n_values

    @property
    def seq_len(self) -> int:
        """Tokens the model reads: the 4·n_pairs tokens of a sequence but the last."""
        return 4 * self.n_pairs - 1

    def sample(self, batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(inputs, targets, answer)``: (batch, seq_len) token ids, the next tokens, and a mask of the
        positions whose next token is an answer (the only ones the loss and the accuracy count)."""
        n = self.n_pairs
        keys = torch.rand(batch, self.n_keys, generator=generator).argsort(dim=1)[:, :n]
        values = self.n_keys + torch.randint(0, self.n_values, (batch, n), generator=generator)
        order = torch.rand(batch, n, generator=generator).argsort(dim=1)
        pairs = torch.stack([keys, values], dim=2).reshape(batch, 2 * n)
        queries = torch.stack([keys.gather(1, order), values.gather(1, order)], dim=2).reshape(batch, 2 * n)
        tokens = torch.cat([pairs, queries], dim=1)
        answer = torch.zeros(batch, 4 * n - 1, dtype=torch.bool)
        answer[:, 2 * n::2] = True  # input position 2n + 2i holds query i; its next token is the answer
        return tokens[:, :-1], tokens[:, 1:], answer
