"""Passkey retrieval: find a five-digit key hidden at some depth of repetitive filler text.

"Landmark Attention: Random-Access Infinite Context Length for Transformers" (Mohtashami
& Jaggi, 2023) hides a pass key in a long stretch of filler and asks for it at the end;
YaRN (Peng et al. 2023, ``eval/passkey.py``, its ``generate_prompt``) runs the same test:
the filler repeats "The grass is green. The sky is blue. The sun is yellow. Here we go.
There and back again." (:data:`FILLER`), the information line "The pass key is
``<key>``. Remember it. ``<key>`` is the pass key." goes after a prefix of filler whose
length is drawn uniformly, and the prompt ends "What is the pass key? The pass key is",
which a model continues with the key. Retrieving the key needs attention to one span,
however far back it is, and the filler around it says nothing about it.

As a lab task (``passkey``, :func:`posenc.lab.tasks.make_batch`) the test is made
compact enough for byte-level models trained on 64 tokens: the length ``n`` counts
every token, and an example is ::

    BOS filler[:a] KEY d1 .. d5 filler[a:f] ASK d1 .. d5 EOS

where :data:`KEY` stands for "The pass key is", :data:`ASK` for "What is the pass key?
The pass key is", ``d1 .. d5`` are the key's digits (:data:`DIGITS` of them, as byte
tokens), and ``filler`` is ``f = n - 14`` bytes of :data:`FILLER` read cyclically from
a random phase (the reference's task description, its "Remember it." repetition of the
key and its filler restarting after the key are dropped). ``a = round(depth * f)``
places the needle: depth 0 right after ``BOS``, depth 1 right before ``ASK``. The key is
uniform over ``00000 .. 99999`` (the reference draws ``1 .. 50000`` and writes it
without leading zeros). Scored are the answer, as in every lab task: the column of
``ASK`` (target ``d1``), of ``d1 .. d4`` (targets ``d2 .. d5``) and of ``d5`` (target
``EOS``), so the lab's exact match of a row is the pass key retrieved.

Tokens: the lab's specials (``PAD, BOS, SEP, EOS = 0 .. 3``; ``PAD`` and ``SEP`` are
unused), byte ``b`` as token ``b + 4`` (as the lab's ``text`` task), then :data:`KEY`
and :data:`ASK`.
"""

from __future__ import annotations

import numbers
from typing import Any

import torch

from posenc.core import checks
from posenc.faces.lab._layout import BOS, EOS, IGNORE, Batch

#: Token of byte 0 (byte ``b`` is ``BYTE0 + b``), as the lab's text task.
BYTE0 = 4
#: The marker that stands for "The pass key is", before the hidden key.
KEY = BYTE0 + 256
#: The marker that stands for "What is the pass key? The pass key is", before the answer.
ASK = KEY + 1
#: Token ids a passkey model needs.
VOCAB = ASK + 1
#: Decimal digits of a pass key.
DIGITS = 5
#: The filler of the reference, one sentence cycle (it holds no digit); a row reads it
#: cyclically from a random phase.
FILLER = (
    b"The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
)
#: Tokens of an example besides its filler: ``BOS``, ``KEY`` and the key, ``ASK`` and the
#: key, ``EOS``; the shortest example has no filler.
SHORTEST = 1 + (1 + DIGITS) + (1 + DIGITS) + 1
#: The lab evaluates the multiples of this length.
STEP = 16


def _check_n(n: Any) -> int:
    return checks.check_int(n, "n", minimum=SHORTEST)


def _check_depth(depth: Any) -> float | None:
    """``depth`` as a float in ``[0, 1]``, or None."""
    if depth is None:
        return None
    if isinstance(depth, bool) or not isinstance(depth, numbers.Real):
        raise TypeError(
            f"depth must be None or a real number in [0, 1]; got {type(depth).__name__} {depth!r}"
        )
    value = float(depth)
    if not 0.0 <= value <= 1.0:  # NaN fails this too
        raise ValueError(f"depth must be None or a real number in [0, 1]; got {depth!r}")
    return value


def sequence_length(n: int) -> int:
    """Tokens of a passkey example of length ``n``: ``n`` itself (``n`` counts every token).

    Raises:
        TypeError: ``n`` not an int.
        ValueError: ``n < 14`` (``BOS``, the key twice with its markers, and ``EOS``).
    """
    return _check_n(n)


def lengths(high: int) -> list[int]:
    """The lengths the lab evaluates up to ``high``: ``16, 32, ..`` (none below 16)."""
    return list(range(STEP, high + 1, STEP))


def make_batch(
    n: int, batch_size: int, generator: torch.Generator, *, depth: float | None = None
) -> Batch:
    """A batch of ``n``-token passkey examples, the answer (the key and ``EOS``) scored.

    Each row has its own key, filler phase and, unless ``depth`` is given, needle depth.
    Draws, in order: the key's digits (``(batch_size, 5)`` uniform in ``0 .. 9``), the
    filler's phase per row (uniform in ``0 .. len(FILLER) - 1``), then, when ``depth`` is
    None, a depth per row (uniform in ``[0, 1)``, float32).

    Args:
        n: Tokens per example, an int ``>= 14``; ``n - 14`` of them are filler.
        batch_size: Examples, an int ``>= 1``.
        generator: The only source of randomness; tensors are made on its device.
        depth: Where the needle goes, in ``[0, 1]``: ``KEY`` is at column ``1 +
            round(depth * (n - 14))``, right after ``BOS`` at 0 and right before ``ASK``
            at 1; None draws it per row.

    Returns:
        A :class:`~posenc.lab.tasks.Batch` of ``(batch_size, n)`` int64 tensors:
        ``targets`` holds the next token at the columns ``n - 7 .. n - 2`` (``ASK`` and
        the answer's digits: the key's digits, then ``EOS``) and
        :data:`~posenc.lab.tasks.IGNORE` elsewhere.

    Raises:
        TypeError: ``n`` or ``batch_size`` not an int, ``generator`` not a
            ``torch.Generator``, ``depth`` not a number (a bool included) or None.
        ValueError: ``n < 14``, ``batch_size < 1``, ``depth`` outside ``[0, 1]`` or NaN.
    """
    n = _check_n(n)
    batch_size = checks.check_int(batch_size, "batch_size", minimum=1)
    checks.check_elements(batch_size * sequence_length(n), "batch_size * sequence_length")
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator; got {type(generator).__name__}")
    depth = _check_depth(depth)
    device = generator.device
    fill = n - SHORTEST
    digits = torch.randint(0, 10, (batch_size, DIGITS), generator=generator, device=device)
    key = digits + (BYTE0 + ord("0"))
    phase = torch.randint(0, len(FILLER), (batch_size, 1), generator=generator, device=device)
    if depth is None:
        drawn = torch.rand(batch_size, 1, generator=generator, device=device)
        # round half to even, as Python's round of a given depth
        at = torch.round(drawn * fill).long()
    else:
        at = torch.full((batch_size, 1), round(depth * fill), dtype=torch.int64, device=device)
    # the body between BOS and ASK: filler, with KEY and the key spliced in at column `at`
    body = torch.arange(fill + 1 + DIGITS, device=device).expand(batch_size, -1)
    after = body - at  # 0 at KEY, 1 .. 5 at the key's digits
    text = torch.tensor(list(FILLER), dtype=torch.int64, device=device) + BYTE0
    byte = torch.where(after > DIGITS, body - (1 + DIGITS), body)  # the filler byte's index
    tokens_body = text[(phase + byte) % len(FILLER)]
    spliced = key.gather(1, (after - 1).clamp(0, DIGITS - 1))
    tokens_body = torch.where((after >= 1) & (after <= DIGITS), spliced, tokens_body)
    tokens_body = torch.where(after == 0, KEY, tokens_body)

    def column(token: int) -> torch.Tensor:
        return torch.full((batch_size, 1), token, dtype=torch.int64, device=device)

    tokens = torch.cat([column(BOS), tokens_body, column(ASK), key, column(EOS)], dim=1)
    targets = torch.full_like(tokens, IGNORE)
    # predicting at ASK yields the first digit, ..., at the last digit EOS
    ask = n - 2 - DIGITS
    targets[:, ask:-1] = tokens[:, ask + 1 :]
    return Batch(tokens=tokens, targets=targets, length=n)
