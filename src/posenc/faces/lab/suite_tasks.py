"""The task families of Kazemnejad et al.'s length-generalisation suite, generated on the fly.

"The Impact of Positional Encoding on Length Generalization in Transformers"
(Kazemnejad et al., NeurIPS 2023; reference code McGill-NLP/length-generalization,
``scripts/dataset_builders/make_*_dataset.py`` for the data and
``src/data/data_instance_processor/`` for the prompts) trains decoder-only models
on short examples and tests them on longer ones. This module makes those tasks as
lab tasks: :func:`posenc.lab.tasks.make_batch` dispatches here for every name in
:data:`SUITE_TASKS`, with the lab's layout ``BOS <input> SEP <answer> EOS`` and the
answer and ``EOS`` scored. The reference's English prompt words ("Compute", "Sort the
following list", "The answer is") are dropped; the tokens that carry the task stay.

Where inputs or answers vary in length within a length ``n`` (SCAN, multi-digit sort,
addition, polynomial evaluation) every row is right-padded with ``PAD`` up to
``sequence_length(task, n)`` (the bound for any example of length ``n``) and the padding
is never scored, so a batch is one tensor and an exact match reads only a row's real
answer. ``SEP`` then sits at a different column in different rows.

Tokens (ids below :func:`vocab_size`): ``PAD, BOS, SEP, EOS = 0, 1, 2, 3``; digits and
symbols ``4 .. 13`` (digit ``d`` is ``4 + d``); ``PLUS`` 14; then ``MINUS`` 15, ``TIMES``
16, ``POW`` 17, ``X`` 18, ``EQUALS`` 19, ``COMMA`` 20, ``NEXT`` 21 (the reference's
``[NEXT]`` between the two halves of a doubled answer), ``QUERY`` 22; LEGO's 26 variables
``23 .. 48``; SCAN's 13 command words ``23 .. 35`` and 6 actions ``36 .. 41`` (tasks never
share a model, so ids need only be unique within a task).

The lab's own ``copy``, ``reverse`` and ``sort`` are the suite's Copy, Reverse and
Sort (single token) over 10 symbols (the reference draws from 100, and 50 for sort);
the lab's ``addition`` (equal lengths, least-significant digit first) is not the
reference's, which is ``addition-msd`` here.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from posenc.core import checks
from posenc.faces.lab._layout import BOS, EOS, IGNORE, PAD, PLUS, SEP, Batch
from posenc.faces.lab.names import SUITE as SUITE
from posenc.faces.lab.names import SUITE_TASKS
from posenc.faces.lab.names import SuiteTask as SuiteTask

#: The suite's own tokens after ``PLUS``: the signs and punctuation its tasks print.
MINUS, TIMES, POW, X, EQUALS, COMMA, NEXT, QUERY = 15, 16, 17, 18, 19, 20, 21, 22
_DIGIT0 = 4
_VAR0 = 23  # LEGO's first variable
_NUM_VARS = 26  # the reference's a .. z
_WORD0 = 23  # SCAN's first command word
SCAN_WORDS = (
    "walk", "look", "run", "jump", "turn", "left", "right",
    "opposite", "around", "twice", "thrice", "and", "after",
)  # fmt: skip
SCAN_ACTIONS = ("WALK", "LOOK", "RUN", "JUMP", "LTURN", "RTURN")
_ACTION0 = _WORD0 + len(SCAN_WORDS)
#: Action-sequence lengths that some SCAN command has (none has 23, 29, 31, 34, 35, 37 ..
#: 39 or 41 .. 47 actions); the tests recount them from the grammar.
SCAN_LENGTHS = (
    *range(1, 23), 24, 25, 26, 27, 28, 30, 32, 33, 36, 40, 48,
)  # fmt: skip
_SCAN_MAX_WORDS = 9  # "jump around left twice and walk opposite right thrice"

# Tokens between BOS and SEP, and between SEP and EOS, at most, for length n.
_BOUNDS = {
    "copy-repeat": (lambda n: n, lambda n: n),
    "copy-replace": (lambda n: n + 2, lambda n: n),
    "copy-repeat-2x": (lambda n: n, lambda n: 2 * n),
    "copy-2x": (lambda n: n, lambda n: 2 * n + 1),
    "reverse-2x": (lambda n: n, lambda n: 2 * n + 1),
    "reverse-copy": (lambda n: n, lambda n: 2 * n + 1),
    "addition-msd": (lambda n: 2 * n + 1, lambda n: n + 1),
    "summation": (lambda n: 2 * n - 1, lambda n: 1),
    "parity": (lambda n: n, lambda n: 1),
    "lego": (lambda n: 5 * n + 1, lambda n: 2),
    "sort-multidigit": (lambda n: 5 * n - 1, lambda n: 5 * n - 1),
    "polynomial": (lambda n: 7 * n + 4, lambda n: 1),
    "scan": (lambda n: _SCAN_MAX_WORDS, lambda n: n),
}
_VOCAB = {
    "copy-repeat": 14, "copy-replace": 14, "copy-repeat-2x": 14,
    "copy-2x": NEXT + 1, "reverse-2x": NEXT + 1, "reverse-copy": NEXT + 1,
    "addition-msd": PLUS + 1, "summation": PLUS + 1, "parity": 14,
    "lego": _VAR0 + _NUM_VARS, "sort-multidigit": COMMA + 1, "polynomial": COMMA + 1,
    "scan": _ACTION0 + len(SCAN_ACTIONS),
}  # fmt: skip
assert set(_BOUNDS) == set(_VOCAB) == set(SUITE_TASKS)


def _check_task(task: Any) -> str:
    if not isinstance(task, str) or task not in SUITE_TASKS:
        valid = ", ".join(map(repr, SUITE_TASKS))
        raise ValueError(f"task must be one of {valid}; got {task!r}")
    return task


def _check_n(task: str, n: Any) -> int:
    n = checks.check_int(n, "n", 1)
    if task == "lego" and n > _NUM_VARS:
        raise ValueError(f"n must be <= {_NUM_VARS} for lego (one variable per letter); got {n}")
    if task == "scan" and n not in SCAN_LENGTHS:
        raise ValueError(
            f"n must be an action-sequence length that SCAN has, one of {SCAN_LENGTHS}; got {n}"
        )
    return n


def vocab_size(task: str) -> int:
    """Number of token ids a model for the suite task ``task`` needs (every token is below it)."""
    return _VOCAB[_check_task(task)]


def sequence_length(task: str, n: int) -> int:
    """Columns of a batch of ``task`` at length ``n``: the longest example, padding the rest.

    ``1 + max_input + 1 + max_answer + 1`` (``BOS``, input, ``SEP``, answer, ``EOS``).
    """
    task = _check_task(task)
    # any n bounds SCAN (a model's max_positions may name a length no command has)
    n = checks.check_int(n, "n", 1) if task == "scan" else _check_n(task, n)
    max_input, max_answer = _BOUNDS[task]
    return max_input(n) + max_answer(n) + 3


# ------------------------------------------------------------------------------ layout


def _pack(task: str, n: int, rows: list[tuple[list[int], list[int]]], device: Any) -> Batch:
    """``BOS input SEP answer EOS`` per row, right-padded to ``sequence_length(task, n)``."""
    width = sequence_length(task, n)
    tokens = torch.full((len(rows), width), PAD, dtype=torch.int64)
    targets = torch.full((len(rows), width), IGNORE, dtype=torch.int64)
    for r, (inputs, answer) in enumerate(rows):
        row = [BOS, *inputs, SEP, *answer, EOS]
        tokens[r, : len(row)] = torch.tensor(row)
        sep = len(inputs) + 1
        # Predicting at SEP yields the first answer token, ..., at the last answer token EOS.
        targets[r, sep : len(row) - 1] = tokens[r, sep + 1 : len(row)]
    return Batch(tokens=tokens.to(device), targets=targets.to(device), length=n)


def _randint(low: int, high: int, size: tuple[int, ...], generator: torch.Generator) -> list[Any]:
    """Uniform ints in ``[low, high)`` from ``generator``, as nested Python lists."""
    drawn = torch.randint(low, high, size, generator=generator, device=generator.device)
    return drawn.cpu().tolist()


def _digits(value: int) -> list[int]:
    """Digit tokens of a non-negative int, most significant first."""
    return [_DIGIT0 + int(c) for c in str(value)]


def _signed(value: int) -> list[int]:
    """``MINUS`` and the digits for a negative int, the digits alone otherwise."""
    return [MINUS, *_digits(-value)] if value < 0 else _digits(value)


# ------------------------------------------------------------------------------ the tasks


def _copies(task: str, n: int, batch_size: int, generator: torch.Generator) -> list[Any]:
    """The copy and reverse variants (the reference's ``make_copy_dataset`` and
    ``make_reverse_dataset`` task types)."""
    if task in ("copy-repeat", "copy-repeat-2x"):
        # repeat_single_char: one symbol n times; the 2x answer repeats it 2n times
        rows = []
        for (s,) in _randint(_DIGIT0, _DIGIT0 + 10, (batch_size, 1), generator):
            rows.append(([s] * n, [s] * (n * (2 if task == "copy-repeat-2x" else 1))))
        return rows
    if task == "copy-replace":
        # repeat_double_char: "Replace a with b in a a .. a" -> "b b .. b", a != b
        rows = []
        for a, shift in _randint(0, 9, (batch_size, 2), generator):
            source, target = _DIGIT0 + a, _DIGIT0 + (a + 1 + shift) % 10
            rows.append(([source, target, *[source] * n], [target] * n))
        return rows
    rows = []
    for x in _randint(_DIGIT0, _DIGIT0 + 10, (batch_size, n), generator):
        backward = x[::-1]
        answer = {
            "copy-2x": [*x, NEXT, *x],
            "reverse-2x": [*backward, NEXT, *backward],
            "reverse-copy": [*backward, NEXT, *x],
        }[task]
        rows.append((x, answer))
    return rows


def _addition_msd(n: int, batch_size: int, generator: torch.Generator) -> list[Any]:
    """Two numbers, most significant digit first; the longer has ``n`` digits.

    The reference draws a ``d``-digit operand uniformly from ``[10**(d-1), 10**d)``
    (``[0, 10)`` for one digit) and its length bins pair the two lengths; here one operand
    has ``n`` digits and the other a uniform ``1 .. n``, on a random side.
    """
    other = _randint(1, n + 1, (batch_size,), generator)
    side = _randint(0, 2, (batch_size,), generator)
    lead = _randint(1, 10, (batch_size, 2), generator)
    rest = _randint(0, 10, (batch_size, 2, n), generator)
    rows = []
    for r in range(batch_size):
        lengths = (n, other[r]) if side[r] == 0 else (other[r], n)
        operands = []
        for k, d in enumerate(lengths):
            body = rest[r][k][: d - 1]
            operands.append(int("".join(map(str, [lead[r][k], *body]))) if d > 1 else rest[r][k][0])
        a, b = operands
        rows.append(([*_digits(a), PLUS, *_digits(b)], _digits(a + b)))
    return rows


def _summation(n: int, batch_size: int, generator: torch.Generator) -> list[Any]:
    """``v1 + v2 + .. + vn`` with ``v`` in ``1 .. 9``; the answer is the sum modulo 10
    (the reference's ``s2s_sum`` with ``modulo_factor`` 10)."""
    rows = []
    for values in _randint(1, 10, (batch_size, n), generator):
        inputs = [tok for v in values for tok in (PLUS, _DIGIT0 + v)][1:]
        rows.append((inputs, [_DIGIT0 + sum(values) % 10]))
    return rows


def _parity(n: int, batch_size: int, generator: torch.Generator) -> list[Any]:
    """``n`` bits; the answer is their sum modulo 2 (the reference's "Yes" for an even count
    is digit 0 here, its "No" digit 1)."""
    rows = []
    for bits in _randint(0, 2, (batch_size, n), generator):
        rows.append(([_DIGIT0 + b for b in bits], [_DIGIT0 + sum(bits) % 2]))
    return rows


def _lego(n: int, batch_size: int, generator: torch.Generator) -> list[Any]:
    """A chain of ``n`` sign clauses over distinct variables and a query (``make_lego_dataset``).

    Values are random bits (1 is ``+1``); clause 0 is ``v0 = +1`` or ``v0 = -1``, clause
    ``i`` is ``vi = + v(i-1)`` when the two values agree and ``vi = - v(i-1)`` otherwise,
    in order, separated by commas, then ``QUERY q``. The query is one of the variables
    ``ceil(n / 2) .. n - 1`` (the reference's ``min_var_idx``), variable 0 when ``n`` is 1.
    The answer is the query's value, ``PLUS 1`` or ``MINUS 1``.
    """
    device = generator.device
    values = _randint(0, 2, (batch_size, n), generator)
    noise = torch.rand(batch_size, _NUM_VARS, generator=generator, device=device)
    names = (noise.argsort(dim=1)[:, :n] + _VAR0).cpu().tolist()
    low = (n + 1) // 2 if n > 1 else 0
    picks = _randint(low, n, (batch_size,), generator)
    one = _DIGIT0 + 1
    rows = []
    for v, name, q in zip(values, names, picks, strict=True):
        clauses = [[name[0], EQUALS, PLUS if v[0] else MINUS, one]]
        for i in range(1, n):
            clauses.append([name[i], EQUALS, PLUS if v[i] == v[i - 1] else MINUS, name[i - 1]])
        inputs = [tok for clause in clauses for tok in (COMMA, *clause)][1:]
        rows.append(([*inputs, QUERY, name[q]], [PLUS if v[q] else MINUS, one]))
    return rows


def _sort_multidigit(n: int, batch_size: int, generator: torch.Generator) -> list[Any]:
    """``n`` numbers uniform in ``[10, 10000)``, comma-separated; the answer lists them in
    ascending order (``make_sort_dataset`` without ``--single_digit``)."""

    def listed(numbers: list[int]) -> list[int]:
        return [tok for v in numbers for tok in (COMMA, *_digits(v))][1:]

    return [
        (listed(nums), listed(sorted(nums)))
        for nums in _randint(10, 10000, (batch_size, n), generator)
    ]


def _polynomial(n: int, batch_size: int, generator: torch.Generator) -> list[Any]:
    """``X = x , c1 * X ** d1 + .. + cn * X ** dn`` (``make_poly_dataset``): coefficients in
    ``-3 .. 3``, degrees ``0 .. 3``, ``x`` in ``-2 .. 2``; the answer is the value modulo 10
    (the reference's ``s2s_poly`` with ``modulo_factor`` 10), one digit."""
    coefficients = _randint(-3, 4, (batch_size, n), generator)
    degrees = _randint(0, 4, (batch_size, n), generator)
    xs = _randint(-2, 3, (batch_size,), generator)
    rows = []
    for c, d, x in zip(coefficients, degrees, xs, strict=True):
        terms = [
            tok
            for ci, di in zip(c, d, strict=True)
            for tok in (PLUS, *_signed(ci), TIMES, X, POW, _DIGIT0 + di)
        ]
        value = sum(ci * x**di for ci, di in zip(c, d, strict=True))
        rows.append(([X, EQUALS, *_signed(x), COMMA, *terms[1:]], [_DIGIT0 + value % 10]))
    return rows


@functools.cache
def scan_commands() -> dict[int, tuple[tuple[tuple[str, ...], tuple[str, ...]], ...]]:
    """Every SCAN command and its action sequence, grouped by the number of actions.

    Generated from SCAN's grammar (Lake & Baroni 2018, "Generalization without
    systematicity"): ``C -> S and S | S after S | S``, ``S -> V twice | V thrice | V``,
    ``V -> D opposite dir | D around dir | D | U``, ``D -> U dir | turn dir``,
    ``U -> walk | look | run | jump``, with its interpretation (``after`` runs the second
    command first; ``opposite`` turns twice, ``around`` four times, each turn followed by
    the action). The 20,910 commands of the dataset; its length split trains on those
    with at most 22 actions and tests on the rest (24 .. 48 actions).

    Returns:
        ``{actions: ((command words, action words), ...)}`` in a fixed order.
    """
    primitives = {"walk": ("WALK",), "look": ("LOOK",), "run": ("RUN",), "jump": ("JUMP",)}
    turns = {"left": ("LTURN",), "right": ("RTURN",)}
    verbs: list[tuple[tuple[str, ...], tuple[str, ...]]] = []
    for u in (*primitives, "turn"):
        act = primitives.get(u, ())
        if u != "turn":
            verbs.append(((u,), act))
        for side, turn in turns.items():
            verbs.append(((u, side), turn + act))
            verbs.append(((u, "opposite", side), turn + turn + act))
            verbs.append(((u, "around", side), (turn + act) * 4))
    simple = [
        (words + suffix, actions * times)
        for words, actions in verbs
        for suffix, times in (((), 1), (("twice",), 2), (("thrice",), 3))
    ]
    commands = list(simple)
    for w1, a1 in simple:
        for w2, a2 in simple:
            commands.append(((*w1, "and", *w2), a1 + a2))
            commands.append(((*w1, "after", *w2), a2 + a1))
    grouped: dict[int, list[tuple[tuple[str, ...], tuple[str, ...]]]] = {}
    for words, actions in commands:
        grouped.setdefault(len(actions), []).append((words, actions))
    return {k: tuple(v) for k, v in sorted(grouped.items())}


@functools.cache
def _scan_tokens(n: int) -> tuple[tuple[list[int], list[int]], ...]:
    words = {w: _WORD0 + i for i, w in enumerate(SCAN_WORDS)}
    actions = {a: _ACTION0 + i for i, a in enumerate(SCAN_ACTIONS)}
    return tuple(
        ([words[w] for w in command], [actions[a] for a in acts])
        for command, acts in scan_commands()[n]
    )


def _scan(n: int, batch_size: int, generator: torch.Generator) -> list[Any]:
    """A SCAN command drawn uniformly from those with ``n`` actions; the answer is its actions."""
    pool = _scan_tokens(n)
    return [pool[i] for i in _randint(0, len(pool), (batch_size,), generator)]


def make_batch(task: str, n: int, batch_size: int, generator: torch.Generator) -> Batch:
    """A batch of a suite task at length ``n`` (see :func:`posenc.lab.tasks.make_batch`).

    Args:
        task: One of :data:`SUITE_TASKS`.
        n: The task's length measure (:data:`SUITE` names it per task), an int ``>= 1``
            (``<= 26`` for lego; one of :data:`SCAN_LENGTHS` for scan).
        batch_size: Number of examples, an int ``>= 1``.
        generator: The only source of randomness; tensors are made on its device.

    Returns:
        A :class:`~posenc.lab.tasks.Batch` of ``(batch_size, sequence_length(task, n))``
        int64 tensors, rows right-padded with ``PAD`` (targets ``IGNORE``).

    Raises:
        ValueError: If ``task`` is not a suite task or ``n`` / ``batch_size`` is out of range.
        TypeError: If ``n`` or ``batch_size`` is not an int or ``generator`` is not a
            ``torch.Generator``.
    """
    task = _check_task(task)
    n = _check_n(task, n)
    batch_size = checks.check_int(batch_size, "batch_size", 1)
    checks.check_elements(batch_size * sequence_length(task, n), "batch_size * sequence_length")
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator; got {type(generator).__name__}")
    if task.startswith(("copy", "reverse")):
        rows = _copies(task, n, batch_size, generator)
    else:
        rows = {
            "addition-msd": _addition_msd,
            "summation": _summation,
            "parity": _parity,
            "lego": _lego,
            "sort-multidigit": _sort_multidigit,
            "polynomial": _polynomial,
            "scan": _scan,
        }[task](n, batch_size, generator)
    return _pack(task, n, rows, generator.device)
