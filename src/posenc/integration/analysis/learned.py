"""A learned position table, trained for a few steps on a task that needs positions.

:func:`train_learned` trains one causal attention layer over token plus
learned position embeddings to copy the previous token; :class:`Learned`
holds the table and measures how similar its positions came out. torch is
imported when training starts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Learned:
    """A learned position table from a tiny training run and what it was trained on.

    Attributes:
        table: the ``(length, dim)`` float64 position table.
        accuracy: copy accuracy on fresh batches after training.
        steps: training steps.
        seconds: training time (0 for a run read back from a file rather than trained).
    """

    table: Any
    accuracy: float
    steps: int
    seconds: float

    def similarity(self, apart: int = 8) -> tuple[float, float]:
        """Mean cosine of neighbouring positions, and of positions more than ``apart`` apart."""
        unit = self.table / np.linalg.norm(self.table, axis=1, keepdims=True)
        sim = unit @ unit.T
        n = len(self.table)
        near = float(np.mean([sim[i, i + 1] for i in range(n - 1)]))
        far = float(np.mean([sim[i, j] for i in range(n) for j in range(n) if abs(i - j) > apart]))
        return near, far


def train_learned(
    length: int = 32, dim: int = 32, steps: int = 300, vocab: int = 16, seed: int = 0
) -> Learned:
    """Train a learned position table on a task that needs positions: copy the previous token.

    One causal attention layer (:func:`posenc.attention`) over token + learned
    position embeddings, trained with Adam; the task cannot be solved without
    telling positions apart, so the table must learn them.

    Args:
        length: positions (the table's rows).
        dim: channels.
        steps: Adam steps, batches of 64 sequences.
        vocab: tokens.
        seed: seed of the initialisation and the batches.

    Examples:
        >>> import posenc.analysis
        >>> learned = posenc.analysis.train_learned(length=8, dim=16, steps=100, vocab=8)
        >>> learned.table.shape, learned.steps
        ((8, 16), 100)
        >>> learned.accuracy > 0.9  # copying the previous token needs the positions
        True
    """
    import torch
    from torch import nn

    from posenc.integration.attention import attention

    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    tok = nn.Embedding(vocab, dim)
    pos = nn.Parameter(torch.randn(length, dim) * 0.02)
    wq, wk, wv = (nn.Linear(dim, dim, bias=False) for _ in range(3))
    head = nn.Linear(dim, vocab)
    params = [pos, *tok.parameters(), *wq.parameters(), *wk.parameters(), *wv.parameters()]
    params += list(head.parameters())
    opt = torch.optim.Adam(params, lr=1e-2)

    def forward(x: torch.Tensor) -> torch.Tensor:
        h = tok(x) + pos
        q, k, v = (w(h)[:, None] for w in (wq, wk, wv))
        return head(attention(q, k, v, causal=True)[:, 0])

    start = time.perf_counter()
    for _ in range(steps):
        x = torch.randint(0, vocab, (64, length), generator=gen)
        logits = forward(x)[:, 1:]
        loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), x[:, :-1].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        x = torch.randint(0, vocab, (256, length), generator=gen)
        acc = (forward(x)[:, 1:].argmax(-1) == x[:, :-1]).float().mean().item()
    return Learned(pos.detach().double().numpy(), acc, steps, time.perf_counter() - start)
