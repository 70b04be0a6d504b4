"""Arithmetic in the formats the length-generalisation papers use: one task per format.

An :class:`ArithmeticFormat` says how a sum or product is written, with digit-level
tokens (digit ``d`` is token ``4 + d``):

- ``operation``: ``"add"`` (``operands`` numbers, 2 or more) or ``"multiply"``
  (an ``n``-digit number times a ``multiplier``-digit one: Cho et al. 2024b's N x M);
- ``reverse_operands`` and ``reverse_answer``: written least significant digit
  first (McLeish et al. 2024 reverse both; Cho et al. 2024 the answer only);
- ``pad``: operands zero-padded to the longest one and the answer to the widest
  result they can have (Cho et al. 2024's zero-padding: every column has a digit
  in every number);
- ``hints``: a hint token before every digit naming its significance (Zhou et
  al. 2024's index hints, :func:`posenc.families.arithmetic.index_hints`), random
  consecutive hints in training and hints from 0 at evaluation;
- ``sampling``: in training, ``"independent"`` draws every operand's length
  uniformly from ``1 .. n`` (Cho et al. 2024 and McLeish et al. 2024 sample each
  operand's length so), ``"equal"`` gives every operand ``n`` digits; at
  evaluation every operand has ``n`` digits (the multiplier ``multiplier``), so
  that accuracy is per operand length.

An example is ``BOS a PLUS b ... SEP answer EOS`` (``TIMES`` for a product; ``SEP``
is the ``=``), and the answer and ``EOS`` are scored. Every batch also carries its
``significance`` (:mod:`posenc.families.arithmetic`'s layout: each digit's power of
ten, -1 for the operator or ``=`` after a number, -2 elsewhere), which the
encodings that compute ids from the numbers (Abacus, position coupling) read.

Each format is a task of the lab: :data:`FORMATS` names them, and
:func:`task` makes the :class:`~posenc.lab.tasks.SyntheticTask` of one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

import torch

from posenc.core import checks
from posenc.faces.lab._layout import BOS, EOS, IGNORE, PAD, PLUS, SEP, Batch

#: The ``x`` of a product.
TIMES = PLUS + 1
#: The first hint token; hint ``h`` is token ``HINT0 + h``.
HINT0 = TIMES + 1
#: Hint tokens a format with hints has: numbers up to this many digits. Zhou et al. size
#: their hint set to the longest test number (102 hints, tested to 100 digits): 48 covers
#: the lab's tests to 40 digits and leaves each hint trained often at 10.
HINTS = 48
#: The most digits an operand may have (Python converts at most 4300 digits to a string).
MAX_DIGITS = 4000
_DIGIT0 = 4
_AFTER, _OUTSIDE = -1, -2  # posenc.families.arithmetic's AFTER_NUMBER and OUTSIDE

Operation = Literal["add", "multiply"]
Sampling = Literal["independent", "equal"]


@dataclass(frozen=True)
class ArithmeticFormat:
    """How one arithmetic task writes its examples (the module docstring's options).

    Attributes:
        operation: ``"add"`` or ``"multiply"``.
        operands: numbers added (``>= 2``); 2 for a product.
        multiplier: a product's second operand's digits (``N x multiplier``).
        reverse_operands: operands least significant digit first.
        reverse_answer: the answer least significant digit first.
        pad: zero-padding of the operands (to the longest) and the answer (to its
            widest).
        hints: index hints before every digit.
        sampling: how training draws the operands' lengths up to ``n``.
        description: one line for people.
    """

    description: str
    operation: Operation = "add"
    operands: int = 2
    multiplier: int = 2
    reverse_operands: bool = True
    reverse_answer: bool = True
    pad: bool = True
    hints: bool = False
    sampling: Sampling = "independent"

    def __post_init__(self) -> None:
        checks.check_choice(self.operation, "operation", ("add", "multiply"))
        checks.check_choice(self.sampling, "sampling", ("independent", "equal"))
        checks.check_int(self.operands, "operands", minimum=2)
        checks.check_int(self.multiplier, "multiplier", minimum=1)
        if self.operation == "multiply" and self.operands != 2:
            raise ValueError(f"operands must be 2 for a product; got {self.operands}")
        for name in ("reverse_operands", "reverse_answer", "pad", "hints"):
            checks.check_bool(getattr(self, name), name)

    @property
    def vocab(self) -> int:
        """Token ids a model needs: specials, digits, ``PLUS``, ``TIMES``, the hints."""
        return HINT0 + (HINTS if self.hints else 0)

    def lengths_of(self, n: int) -> tuple[int, ...]:
        """Every operand's digits at evaluation length ``n``."""
        if self.operation == "multiply":
            return (n, self.multiplier)
        return (n,) * self.operands

    def answer_width(self, lengths: tuple[int, ...]) -> int:
        """The widest result of operands of these digits: its zero-padded width."""
        if self.operation == "multiply":
            return sum(lengths)
        largest, width = sum(10**d - 1 for d in lengths), max(lengths)
        while largest >= 10**width:  # its digits, without converting it to a string
            width += 1
        return width

    def columns(self, n: int) -> int:
        """The widest number's digits at length ``n``: its answer's, zero-padded."""
        return self.answer_width(self.lengths_of(checks.check_int(n, "n", minimum=1)))

    def sequence_length(self, n: int) -> int:
        """Tokens of an example at length ``n`` (every operand ``n`` digits): the longest."""
        n = checks.check_int(n, "n", minimum=1)
        per_digit = 2 if self.hints else 1
        lengths = self.lengths_of(n)
        numbers = sum(lengths) + self.answer_width(lengths)
        # BOS, digits (and hints), an operator or SEP after each operand, EOS
        return 1 + per_digit * numbers + len(lengths) + 1


def _number(digits: int, generator: torch.Generator) -> int:
    """A uniform number of exactly ``digits`` digits (0 .. 9 for one digit)."""
    if digits == 1:
        return int(torch.randint(0, 10, (1,), generator=generator))
    low = 10 ** (digits - 1)
    # uniform over [low, 10 low): a leading digit 1 .. 9, then the rest uniform
    lead = int(torch.randint(1, 10, (1,), generator=generator))
    rest = torch.randint(0, 10, (digits - 1,), generator=generator).tolist()
    return lead * low + int("".join(map(str, rest)))


def _written(value: int, width: int, reverse: bool) -> list[int]:
    """Digits of ``value`` zero-padded to ``width`` (its own if shorter), most significant first
    or reversed."""
    text = str(value).zfill(width)
    digits = [int(c) for c in text]
    return digits[::-1] if reverse else digits


def example_tokens(
    fmt: ArithmeticFormat, numbers: tuple[int, ...], hint_start: int = 0
) -> tuple[list[int], list[int], int]:
    """One example: its tokens, each token's significance, and where the answer starts.

    Args:
        fmt: the format.
        numbers: the operands' values.
        hint_start: the hint of the units (index hints only).

    Returns:
        ``(tokens, significance, sep)``: ``tokens[sep]`` is ``SEP``.

    Raises:
        ValueError: a hint beyond the :data:`HINTS` the format has.
    """
    lengths = tuple(len(str(v)) for v in numbers)
    result = sum(numbers) if fmt.operation == "add" else numbers[0] * numbers[1]
    widths = [0] * len(numbers)  # each number its own digits
    answer_width = 0
    if fmt.pad:
        # a sum's operands padded to the longest; a product's factors keep their digits
        widths = [max(lengths) if fmt.operation == "add" else d for d in lengths]
        answer_width = fmt.answer_width(tuple(widths))
    tokens, places = [BOS], [_OUTSIDE]

    def write(value: int, pad_to: int, reverse: bool) -> None:
        digits = _written(value, pad_to, reverse)
        count = len(digits)
        for i, d in enumerate(digits):
            place = i if reverse else count - 1 - i
            if fmt.hints:
                hint = hint_start + place
                if hint >= HINTS:
                    raise ValueError(
                        f"index hints: a {count}-digit number from hint {hint_start} needs "
                        f"hint {hint}; the format has {HINTS} (0 .. {HINTS - 1})"
                    )
                tokens.append(HINT0 + hint)
                places.append(_OUTSIDE)
            tokens.append(_DIGIT0 + d)
            places.append(place)

    operator = PLUS if fmt.operation == "add" else TIMES
    for k, value in enumerate(numbers):
        write(value, widths[k], fmt.reverse_operands)
        tokens.append(operator if k < len(numbers) - 1 else SEP)
        places.append(_AFTER)
    sep = len(tokens) - 1
    write(result, answer_width, fmt.reverse_answer)
    tokens.append(EOS)
    places.append(_OUTSIDE)
    return tokens, places, sep


def _batch(rows: list[tuple[list[int], list[int], int]], n: int) -> Batch:
    """Right-pad the rows with ``PAD`` (significance -2), the answers and ``EOS`` scored."""
    seq = max(len(t) for t, _, _ in rows)
    tokens = torch.full((len(rows), seq), PAD, dtype=torch.int64)
    places = torch.full((len(rows), seq), _OUTSIDE, dtype=torch.int64)
    targets = torch.full((len(rows), seq), IGNORE, dtype=torch.int64)
    for r, (t, p, sep) in enumerate(rows):
        tokens[r, : len(t)] = torch.tensor(t)
        places[r, : len(p)] = torch.tensor(p)
        # predicting at SEP yields the first answer token, ..., at the last answer token EOS
        targets[r, sep : len(t) - 1] = tokens[r, sep + 1 : len(t)]
    return Batch(tokens=tokens, targets=targets, length=n, significance=places)


def _maker(fmt: ArithmeticFormat, training: bool) -> Callable[[int, int, torch.Generator], Batch]:
    def make(n: int, batch_size: int, generator: torch.Generator) -> Batch:
        n = checks.check_int(n, "n", minimum=1)
        if n > MAX_DIGITS:
            raise ValueError(f"n must be at most {MAX_DIGITS} digits per operand; got {n}")
        batch_size = checks.check_int(batch_size, "batch_size", minimum=1)
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator; got {type(generator).__name__}")
        # huge sizes fail here, before a number is drawn
        checks.check_elements(
            batch_size * fmt.sequence_length(n), f"a batch of {batch_size} examples at n={n}"
        )
        widest = fmt.answer_width(fmt.lengths_of(n))
        if fmt.hints and widest > HINTS:
            raise ValueError(
                f"n={n}: a {widest}-digit answer needs more than the {HINTS} index hints the "
                "format has"
            )
        rows = []
        for _ in range(batch_size):
            lengths = fmt.lengths_of(n)
            if training and fmt.sampling == "independent":
                drawn = torch.randint(1, n + 1, (len(lengths),), generator=generator).tolist()
                lengths = (
                    (drawn[0], fmt.multiplier) if fmt.operation == "multiply" else tuple(drawn)
                )
            numbers = tuple(_number(d, generator) for d in lengths)
            start = 0
            if training and fmt.hints:
                # consecutive hints from a random first one: every hint up to the last trained
                start = int(torch.randint(0, HINTS - widest + 1, (1,), generator=generator))
            rows.append(example_tokens(fmt, numbers, start))
        return _batch(rows, n).to(generator.device)

    return make


#: The arithmetic tasks of the lab, by name (read-only).
FORMATS: Mapping[str, ArithmeticFormat] = MappingProxyType({
    "add-reversed": ArithmeticFormat(
        "a + b, operands and answer least significant digit first, zero-padded"
    ),
    "add-reversed-hints": ArithmeticFormat(
        "add-reversed with an index hint before every digit (Zhou et al. 2024)", hints=True
    ),
    "add-unpadded": ArithmeticFormat(
        "a + b, reversed, every number its own length (McLeish et al. 2024)", pad=False
    ),
    "add-answer-reversed": ArithmeticFormat(
        "a + b, operands most significant digit first and zero-padded, the answer reversed "
        "(Cho et al. 2024)",
        reverse_operands=False,
    ),
    "add-3": ArithmeticFormat("a + b + c, reversed, zero-padded", operands=3),
    "multiply-nx2": ArithmeticFormat(
        "an n-digit a times a 2-digit b, operands most significant digit first, the answer "
        "reversed and zero-padded (Cho et al. 2024b's N x 2)",
        operation="multiply",
        reverse_operands=False,
    ),
})  # fmt: skip


def task(name: str) -> tuple[int, Callable[[int], int], Callable[..., Batch], Callable[..., Batch]]:
    """``(vocab, sequence_length, make, train)`` of the format ``name``.

    ``make(n, batch_size, generator)`` is evaluation's batch at length ``n`` (every
    operand ``n`` digits, hints from 0); ``train(n, batch_size, generator)`` draws as
    the format's training does up to ``n``.
    """
    checks.check_choice(name, "task", tuple(FORMATS))
    fmt = FORMATS[name]
    return fmt.vocab, fmt.sequence_length, _maker(fmt, False), _maker(fmt, True)
