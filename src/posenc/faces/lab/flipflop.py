"""Flip-flop language modeling: remember the last written bit across distractors.

"Exposing Attention Glitches with Flip-Flop Language Modeling" (Liu et al., NeurIPS
2023) probes whether a model reads one bit reliably: a string of the flip-flop
language FFL(p) is a sequence of instruction/bit pairs, ``w b`` (write ``b``),
``i b`` (ignore: ``b`` is a random distractor) and ``r b`` (read: ``b`` is the last
bit written). The first instruction is a write and the last a read; the others are
drawn independently, ``i`` with probability ``p`` and ``w`` and ``r`` with ``(1 - p) /
2`` each, and the written and ignored bits uniformly. The paper trains on FFL(0.8)
(:data:`P_IGNORE`) and scores the read bits: the only tokens a model can predict
exactly.

As a lab task (``flipflop``, :func:`posenc.lab.tasks.make_batch`), the length ``n``
counts instructions, so an example is ``BOS x_1 b_1 .. x_n b_n``, ``2n + 1`` tokens
(the paper's length ``T`` is ``2n``), and ``n >= 2`` (a write, then a read). The
target at every ``r`` is its bit, the last bit written before it; every other
position is unscored, and there is no ``EOS`` to predict (a read is followed by more
instructions or by nothing, which the model cannot tell apart). The lab's exact
match of a row is then the paper's flip-flop task solved for the whole sequence:
every read of it right.

Tokens: the lab's specials (``PAD, BOS, SEP, EOS = 0 .. 3``; ``SEP`` and ``EOS`` are
unused), the bits as digits (``b`` is ``4 + b``), then :data:`WRITE`, :data:`READ`
and :data:`SKIP` (the paper's ``i``; ``IGNORE`` is the lab's unscored target).
"""

from __future__ import annotations

from typing import Any

import torch

from posenc.core import checks
from posenc.faces.lab._layout import BOS, IGNORE, Batch

#: Token of bit 0 (bit ``b`` is ``BIT0 + b``): the lab's digit tokens.
BIT0 = 4
#: The instruction tokens: write, read, and ignore (``i``).
WRITE, READ, SKIP = 6, 7, 8
#: Token ids a flip-flop model needs.
VOCAB = SKIP + 1
#: The paper's training language FFL(0.8): ``i`` with probability 0.8, ``w`` and ``r`` 0.1.
P_IGNORE = 0.8
#: The fewest instructions of an example: its first write and its last read.
SHORTEST = 2


def _check_n(n: Any) -> int:
    return checks.check_int(n, "n", minimum=SHORTEST)


def sequence_length(n: int) -> int:
    """Tokens of a flip-flop example of ``n`` instructions: ``BOS`` and ``n`` pairs, ``2n + 1``.

    Raises:
        TypeError: ``n`` not an int.
        ValueError: ``n < 2`` (an example writes first and reads last).
    """
    return 2 * _check_n(n) + 1


def lengths(high: int) -> list[int]:
    """The lengths ``2 .. high`` (an example has a write and a read at least)."""
    return list(range(SHORTEST, high + 1))


def make_batch(
    n: int, batch_size: int, generator: torch.Generator, *, p_ignore: float = P_IGNORE
) -> Batch:
    """A batch of FFL(``p_ignore``) strings of ``n`` instructions, their read bits scored.

    Instructions 2 .. n - 1 are ``i`` with probability ``p_ignore`` and ``w`` or ``r``
    with ``(1 - p_ignore) / 2`` each; instruction 1 is ``w`` and instruction ``n`` is
    ``r``. Written and ignored bits are uniform; a read's bit is the last bit written
    before it. Draws, in order: one uniform per instruction (the first and last drawn
    too, then overwritten), then one bit per instruction.

    Args:
        n: Instructions per example, an int ``>= 2``.
        batch_size: Examples, an int ``>= 1``.
        generator: The only source of randomness; tensors are made on its device.
        p_ignore: The probability of ``i`` (the paper's ``p``), in ``[0, 1]``.

    Returns:
        A :class:`~posenc.lab.tasks.Batch` of ``(batch_size, 2n + 1)`` int64 tensors:
        ``targets`` holds the read bit at the column of each ``r`` and
        :data:`~posenc.lab.tasks.IGNORE` elsewhere.

    Raises:
        TypeError: ``n`` or ``batch_size`` not an int, ``generator`` not a
            ``torch.Generator``, ``p_ignore`` not a number.
        ValueError: ``n < 2``, ``batch_size < 1``, ``p_ignore`` outside ``[0, 1]``.
    """
    n = _check_n(n)
    batch_size = checks.check_int(batch_size, "batch_size", minimum=1)
    checks.check_elements(batch_size * sequence_length(n), "batch_size * sequence_length")
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator; got {type(generator).__name__}")
    p_ignore = checks.check_number(p_ignore, "p_ignore")
    if not 0.0 <= p_ignore <= 1.0:
        raise ValueError(f"p_ignore must be within [0, 1]; got {p_ignore}")
    device = generator.device
    p_write = (1.0 - p_ignore) / 2
    draw = torch.rand(batch_size, n, generator=generator, device=device)
    ops = torch.full((batch_size, n), SKIP, dtype=torch.int64, device=device)
    ops[draw < 2 * p_write] = READ
    ops[draw < p_write] = WRITE
    ops[:, 0], ops[:, -1] = WRITE, READ
    bits = torch.randint(0, 2, (batch_size, n), generator=generator, device=device)
    # each instruction's last write at or before it (the first instruction writes)
    steps = torch.arange(n, device=device).expand(batch_size, n)
    last_write = torch.where(ops == WRITE, steps, 0).cummax(dim=1).values
    reads = ops == READ
    bits = torch.where(reads, bits.gather(1, last_write), bits)
    tokens = torch.empty(batch_size, 2 * n + 1, dtype=torch.int64, device=device)
    tokens[:, 0] = BOS
    tokens[:, 1::2] = ops
    tokens[:, 2::2] = bits + BIT0
    targets = torch.full_like(tokens, IGNORE)
    # predicting at a read instruction's column yields its bit
    targets[:, 1::2] = torch.where(reads, bits + BIT0, IGNORE)
    return Batch(tokens=tokens, targets=targets, length=n)
