"""Synthetic tasks and a byte-level text corpus for the length extrapolation lab.

The lab trains tiny decoder-only transformers at one length and evaluates them
at longer ones; this module makes the data. Every batch is a :class:`Batch` of
int64 ``tokens`` and ``targets`` of the same shape, where ``targets[b, t]`` is
the token the model must predict at position ``t`` (``tokens[b, t + 1]``) and
:data:`IGNORE` marks positions that are not scored, so a trainer computes
``cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE)``
for every task alike.

Synthetic tasks (:data:`TASKS` minus ``"text"``) lay out an example of length
``n`` as ``BOS <input> SEP <answer> EOS`` and score exactly the answer tokens
and the final ``EOS``. Symbols are the ten tokens ``4 .. 13`` (digit ``d`` is
token ``4 + d``):

- ``copy``: ``n`` random symbols; the answer repeats them.
- ``reverse``: the answer is the input reversed.
- ``sort``: the answer is the input sorted ascending by token id.
- ``recall`` (associative recall): ``n`` key-value pairs ``k1 v1 .. kn vn`` and
  a query key ``q``; the answer is the one value paired with ``q``. Keys are
  distinct tokens ``14 .. 77`` (64 of them, so ``n <= 64``), values symbols.
- ``addition``: two ``n``-digit numbers, least-significant digit first,
  ``a_0 .. a_{n-1} PLUS b_0 .. b_{n-1}``; the answer is ``a + b`` in exactly
  ``n + 1`` digits, least-significant first (the last digit is the carry).

``flipflop`` (Liu et al. 2023, :mod:`posenc.lab.flipflop`) has no answer after
``SEP``: its ``n`` instruction/bit pairs are scored at every read, whose bit is the
last one written. ``passkey`` (Mohtashami & Jaggi 2023, :mod:`posenc.lab.passkey`)
hides a five-digit key in ``n - 14`` bytes of filler and scores it asked for at the end.
The suite's tasks (:mod:`posenc.lab.suite_tasks`) pad to the longest example of a length.

Every synthetic task is an entry of :data:`SYNTHETIC` (its vocabulary, sequence
length, batches and lengths), which :func:`vocab_size`, :func:`sequence_length`,
:func:`lengths` and :func:`make_batch` look up: a new task is one entry there and
its name in :data:`posenc.lab.names.TASKS`.

``text`` is a byte-level language model (:class:`TextCorpus`) over the Python
standard library's own source or over your own text (:meth:`TextCorpus.from_data`):
byte ``b`` is token ``b + 4``, and every position of a window is scored.

Everything random is drawn from the ``torch.Generator`` passed in, so a batch
is a function of the generator's state alone; tensors are made on the
generator's device.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sysconfig
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import torch

from posenc.core import checks
from posenc.faces.lab import arithmetic_tasks, flipflop, names, passkey, suite_tasks
from posenc.faces.lab._layout import BOS, EOS, IGNORE, PLUS, SEP, Batch
from posenc.faces.lab._layout import PAD as PAD

# The special tokens and Batch live in _layout, shared with suite_tasks, and are re-exported.

#: Every task name; all but ``"text"`` are synthetic and come from :func:`make_batch`.
TASKS = names.TASKS  # ("copy", .., "text", *SUITE_TASKS, "flipflop", "passkey", ..)

_SYMBOL0 = 4  # first symbol token (digit 0)
_NUM_SYMBOLS = 10
_KEY0 = _SYMBOL0 + _NUM_SYMBOLS  # first key token of recall
_NUM_KEYS = 64
_BYTE0 = 4  # token of byte 0 in the text task
_SYNTHETIC = tuple(task for task in TASKS if task != "text")
# the tasks whose answers answers() recomputes from the prompt
_ANSWERED = ("copy", "reverse", "sort", "recall", "addition")
# Directories skipped when walking the stdlib: third-party packages live there, and the
# corpus is meant to be the standard library only (Debian names the directory dist-packages).
_PRUNED_DIRS = frozenset({"site-packages", "dist-packages"})
_TEST_EVERY = 10  # every 10th file (in sorted order) goes to the test split
# git's test for a binary file: a NUL byte among its first 8000 bytes
_SNIFF = 8000


# ------------------------------------------------------------------------------ validation


def _check_task(task: Any, accepted: tuple[str, ...] = TASKS) -> str:
    """``task`` if it is one of ``accepted``, else a TypeError/ValueError listing them."""
    valid = ", ".join(map(repr, accepted))
    if not isinstance(task, str):
        raise TypeError(f"task must be a str, one of {valid}; got {type(task).__name__}")
    if task not in accepted:
        if task in TASKS:  # a real task that this function does not handle: text
            raise ValueError(
                f"task {task!r} is not synthetic: text batches come from TextCorpus "
                f"(TextCorpus.batch / TextCorpus.windows); synthetic tasks: {valid}"
            )
        raise ValueError(f"task must be one of {valid}; got {task!r}")
    return task


def _check_n(task: str, n: Any) -> int:
    """The task length ``n`` as an int, within what ``task`` can generate."""
    n = checks.check_int(n, "n", 1)
    if task == "recall" and n > _NUM_KEYS:
        raise ValueError(
            f"n must be <= {_NUM_KEYS} for recall (keys are distinct, drawn from "
            f"{_NUM_KEYS} key tokens); got {n}"
        )
    return n


def _check_generator(generator: Any) -> torch.Generator:
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator; got {type(generator).__name__}")
    return generator


# ------------------------------------------------------------------------------ task shapes


def _every_length(high: int) -> list[int]:
    return list(range(1, high + 1))


@dataclass(frozen=True)
class SyntheticTask:
    """How one synthetic task makes its batches: an entry of :data:`SYNTHETIC`.

    Attributes:
        vocab: The token ids a model for the task needs (every token is below it).
        sequence_length: ``n ->`` the columns of a batch at length ``n`` (``n``
            checked: a TypeError or ValueError for one the task has not).
        make: ``(n, batch_size, generator) ->`` a :class:`Batch` of ``batch_size``
            examples at length ``n``, drawn from ``generator`` alone (every
            argument checked).
        lengths: ``high ->`` the lengths up to ``high`` that ``make`` accepts, in
            order (``high >= 1`` checked by the caller); ``1 .. high`` by default.
        train: ``(high, batch_size, generator) ->`` a training batch of lengths up to
            ``high``, drawn as the task's paper draws them (the arithmetic formats
            draw every operand's length); None: ``make`` at a length drawn
            uniformly from ``lengths(high)`` per batch.
        columns: ``n ->`` the widest number's digits at length ``n`` (the arithmetic
            formats: what a table of ids per digit column must cover); None for tasks
            without numbers to align.
    """

    vocab: int
    sequence_length: Callable[[int], int]
    make: Callable[[int, int, torch.Generator], Batch]
    lengths: Callable[[int], list[int]] = _every_length
    train: Callable[[int, int, torch.Generator], Batch] | None = None
    columns: Callable[[int], int] | None = None


def vocab_size(task: str) -> int:
    """Number of token ids a model for ``task`` needs (every token is below it).

    Args:
        task: One of :data:`TASKS`.

    Returns:
        14 for copy/reverse/sort (4 specials + 10 symbols), 78 for recall (+ 64 keys),
        15 for addition (+ ``PLUS``), 260 for text (4 specials + 256 bytes); a
        synthetic task's :attr:`SyntheticTask.vocab`.

    Raises:
        ValueError: If ``task`` is not one of :data:`TASKS` (TypeError if not a str).
    """
    task = _check_task(task)
    return _BYTE0 + 256 if task == "text" else SYNTHETIC[task].vocab


def _input_length(task: str, n: int) -> int:
    """Tokens between ``BOS`` and ``SEP`` in an example of length ``n``."""
    if task == "recall":
        return 2 * n + 1  # n key-value pairs and the query
    if task == "addition":
        return 2 * n + 1  # two n-digit operands and PLUS
    return n


def _answer_length(task: str, n: int) -> int:
    """Tokens between ``SEP`` and ``EOS`` in an example of length ``n``."""
    if task == "recall":
        return 1
    if task == "addition":
        return n + 1  # the sum of two n-digit numbers has at most n + 1 digits
    return n


def sequence_length(task: str, n: int) -> int:
    """Number of tokens in one example of ``task`` at length ``n``.

    Args:
        task: One of :data:`TASKS`.
        n: Task length, an int ``>= 1`` (``<= 64`` for recall).

    Returns:
        ``2n + 3`` for copy/reverse/sort, ``2n + 5`` for recall, ``3n + 5`` for
        addition, ``2n + 1`` for flipflop, ``n`` for passkey and for text (a window of
        ``n`` tokens).

    Raises:
        ValueError: If ``task`` is unknown or ``n`` is out of range.
        TypeError: If ``n`` is not an int.
    """
    task = _check_task(task)
    if task == "text":
        return _check_n(task, n)
    return SYNTHETIC[task].sequence_length(n)


def _own_length(task: str) -> Callable[[int], int]:
    """The sequence length of one of the lab's own tasks at a checked ``n``."""

    def length(n: int) -> int:
        n = _check_n(task, n)
        # BOS, input, SEP, answer, EOS
        return 1 + _input_length(task, n) + 1 + _answer_length(task, n) + 1

    return length


def lengths(task: str, high: int) -> list[int]:
    """The task lengths ``1 .. high`` that :func:`make_batch` accepts for ``task``.

    Every length for most tasks (:func:`make_batch` still refuses recall beyond 64 and
    lego beyond 26); for ``scan`` the lengths some SCAN command's action sequence has
    (none has 23 actions, for instance), for ``flipflop`` those from 2 (a write and a
    read), for ``passkey`` the multiples of 16 (it makes any length from 14):
    :attr:`SyntheticTask.lengths`.

    Raises:
        ValueError: If ``task`` is not synthetic or ``high`` < 1.
        TypeError: If ``high`` is not an int.
    """
    task = _check_task(task, _SYNTHETIC)
    high = checks.check_int(high, "high", 1)
    return SYNTHETIC[task].lengths(high)


def _scan_lengths(high: int) -> list[int]:
    return [n for n in suite_tasks.SCAN_LENGTHS if n <= high]


# ------------------------------------------------------------------------------ synthetic


def _layout(task: str, n: int, inputs: torch.Tensor, answer: torch.Tensor) -> Batch:
    """Assemble ``BOS inputs SEP answer EOS`` and score the answer and ``EOS``."""
    rows = inputs.shape[0]
    device = inputs.device

    def column(token: int) -> torch.Tensor:
        return torch.full((rows, 1), token, dtype=torch.int64, device=device)

    tokens = torch.cat([column(BOS), inputs, column(SEP), answer, column(EOS)], dim=1)
    sep = 1 + inputs.shape[1]
    targets = torch.full_like(tokens, IGNORE)
    # Predicting at SEP yields the first answer token, ..., at the last answer token EOS.
    targets[:, sep:-1] = tokens[:, sep + 1 :]
    assert tokens.shape[1] == sequence_length(task, n)
    return Batch(tokens=tokens, targets=targets, length=n)


def _symbols(rows: int, cols: int, generator: torch.Generator) -> torch.Tensor:
    """``(rows, cols)`` uniform random symbol tokens."""
    return torch.randint(
        _SYMBOL0,
        _SYMBOL0 + _NUM_SYMBOLS,
        (rows, cols),
        generator=generator,
        device=generator.device,
        dtype=torch.int64,
    )


def _recall(n: int, batch_size: int, generator: torch.Generator) -> Batch:
    device = generator.device
    # The first n of a random permutation of the key alphabet: n distinct keys in random order,
    # for the whole batch at once (argsort of uniform noise is a uniform permutation per row).
    noise = torch.rand(batch_size, _NUM_KEYS, generator=generator, device=device)
    keys = noise.argsort(dim=1)[:, :n] + _KEY0
    values = _symbols(batch_size, n, generator)
    pick = torch.randint(0, n, (batch_size, 1), generator=generator, device=device)
    query = keys.gather(1, pick)
    pairs = torch.stack([keys, values], dim=2).reshape(batch_size, 2 * n)
    return _layout("recall", n, torch.cat([pairs, query], dim=1), values.gather(1, pick))


def _addition(n: int, batch_size: int, generator: torch.Generator) -> Batch:
    a = _symbols(batch_size, n, generator) - _SYMBOL0
    b = _symbols(batch_size, n, generator) - _SYMBOL0
    # Schoolbook addition from the least significant digit, vectorised over the batch.
    digits = torch.empty(batch_size, n + 1, dtype=torch.int64, device=a.device)
    carry = torch.zeros(batch_size, dtype=torch.int64, device=a.device)
    for i in range(n):
        total = a[:, i] + b[:, i] + carry
        digits[:, i] = total % 10
        carry = total // 10
    digits[:, n] = carry
    plus = torch.full((batch_size, 1), PLUS, dtype=torch.int64, device=a.device)
    inputs = torch.cat([a + _SYMBOL0, plus, b + _SYMBOL0], dim=1)
    return _layout("addition", n, inputs, digits + _SYMBOL0)


def make_batch(task: str, n: int, batch_size: int, generator: torch.Generator) -> Batch:
    """A batch of random examples of a synthetic task, all of length ``n``.

    Each row is ``BOS <input> SEP <answer> EOS`` (see the module docstring for each
    task's input and answer); ``targets`` holds ``tokens[:, t + 1]`` for ``t`` from
    the ``SEP`` position to the token before ``EOS`` and :data:`IGNORE` elsewhere,
    so exactly the answer tokens and ``EOS`` are scored. Rows have equal length, so
    there is no padding.

    ``addition`` writes numbers least-significant digit first, the usual choice in
    length-generalisation work: the carry then flows in the direction the model
    generates, so each answer digit depends only on digits already seen and the
    carry from the previous one.

    Args:
        task: A synthetic task: ``"copy"``, ``"reverse"``, ``"sort"``, ``"recall"``,
            ``"addition"``, ``"flipflop"``, ``"passkey"`` or a suite task (every key of
            :data:`SYNTHETIC`).
        n: Task length, an int ``>= 1`` (``<= 64`` for recall, ``>= 2`` for flipflop,
            ``>= 14`` for passkey).
        batch_size: Number of examples, an int ``>= 1``.
        generator: The only source of randomness: the same generator state gives the
            same batch. Tensors are made on its device.

    Returns:
        A :class:`Batch` of ``(batch_size, sequence_length(task, n))`` int64 tensors.

    Raises:
        ValueError: If ``task`` is unknown or ``"text"`` (text batches come from
            :class:`TextCorpus`), or ``n`` / ``batch_size`` is out of range.
        TypeError: If ``n`` or ``batch_size`` is not an int, or ``generator`` is not a
            ``torch.Generator``.
    """
    task = _check_task(task, _SYNTHETIC)
    return SYNTHETIC[task].make(n, batch_size, generator)


def _own(task: str, make: Callable[[int, int, torch.Generator], Batch]) -> SyntheticTask:
    """The entry of one of the lab's own tasks: its arguments checked, then ``make``."""

    def checked(n: int, batch_size: int, generator: torch.Generator) -> Batch:
        n = _check_n(task, n)
        batch_size = checks.check_int(batch_size, "batch_size", 1)
        return make(n, batch_size, _check_generator(generator))

    vocab = {"recall": _KEY0 + _NUM_KEYS, "addition": PLUS + 1}.get(task, _SYMBOL0 + _NUM_SYMBOLS)
    return SyntheticTask(vocab, _own_length(task), checked)


def _symbol_task(task: str, rule: Callable[[torch.Tensor], torch.Tensor]) -> SyntheticTask:
    """copy, reverse or sort: ``n`` symbols, the answer ``rule`` of them."""

    def make(n: int, batch_size: int, generator: torch.Generator) -> Batch:
        inputs = _symbols(batch_size, n, generator)
        return _layout(task, n, inputs, rule(inputs))

    return _own(task, make)


def _arithmetic_task(task: str) -> SyntheticTask:
    """An arithmetic format of :mod:`posenc.lab.arithmetic_tasks`: its own training draws."""
    fmt = arithmetic_tasks.FORMATS[task]
    vocab, length, make, train = arithmetic_tasks.task(task)
    return SyntheticTask(vocab, length, make, train=train, columns=fmt.columns)


def _suite_task(task: str) -> SyntheticTask:
    """A task of Kazemnejad et al.'s suite: :mod:`posenc.lab.suite_tasks` makes it."""
    return SyntheticTask(
        suite_tasks.vocab_size(task),
        functools.partial(suite_tasks.sequence_length, task),
        functools.partial(suite_tasks.make_batch, task),
        _scan_lengths if task == "scan" else _every_length,
    )


#: Every synthetic task by name (read-only): what :func:`make_batch` and the functions
#: beside it look up. Its keys are :data:`TASKS` less ``"text"``, in that order.
SYNTHETIC: Mapping[str, SyntheticTask] = MappingProxyType({
    "copy": _symbol_task("copy", lambda x: x),
    "reverse": _symbol_task("reverse", lambda x: x.flip(1)),
    "sort": _symbol_task("sort", lambda x: x.sort(dim=1).values),
    "recall": _own("recall", _recall),
    "addition": _own("addition", _addition),
    **{task: _suite_task(task) for task in names.SUITE_TASKS},
    "flipflop": SyntheticTask(
        flipflop.VOCAB, flipflop.sequence_length, flipflop.make_batch, flipflop.lengths
    ),
    "passkey": SyntheticTask(
        passkey.VOCAB, passkey.sequence_length, passkey.make_batch, passkey.lengths
    ),
    **{task: _arithmetic_task(task) for task in names.ARITHMETIC_TASKS},
})  # fmt: skip
assert tuple(SYNTHETIC) == _SYNTHETIC, "names.TASKS and SYNTHETIC name the same tasks"


def _infer_n(task: str, seq: int) -> int:
    """The task length of a full example of ``seq`` tokens (inverse of sequence_length)."""
    per_n, fixed = {"recall": (2, 5), "addition": (3, 5)}.get(task, (2, 3))
    n, rest = divmod(seq - fixed, per_n)
    if rest or n < 1 or (task == "recall" and n > _NUM_KEYS):
        raise ValueError(
            f"tokens must have sequence_length({task!r}, n) = {per_n}n + {fixed} columns for "
            f"some n >= 1; got {seq}"
        )
    return n


def answers(task: str, tokens: torch.Tensor) -> torch.Tensor:
    """The correct answer tokens of full synthetic examples, recomputed from their inputs.

    Only the prompt (``BOS <input> SEP``) is read, so the result can check the answer
    part of :func:`make_batch`'s output or a model's generated answer. The rules are
    computed independently of :func:`make_batch`: sort by counting symbols, recall by
    matching the query against the keys, addition with Python ints.

    Args:
        task: A synthetic task (see :func:`make_batch`).
        tokens: ``(batch, seq)`` integer tensor of full examples, ``seq ==
            sequence_length(task, n)`` for some ``n``.

    Returns:
        ``(batch, answer_len)`` int64 tensor on ``tokens``' device, ``answer_len`` being
        ``n`` for copy/reverse/sort, 1 for recall and ``n + 1`` for addition.

    Raises:
        ValueError: If ``task`` is not synthetic or is a suite task
            (:data:`posenc.lab.names.SUITE_TASKS`), ``flipflop`` or ``passkey`` (whose
            answers are in :func:`make_batch`'s targets), or ``tokens`` has the wrong shape, has
            no ``BOS``/``SEP`` where the layout puts them, or holds a prompt the task
            cannot answer (a recall query that matches no key or several, an addition
            digit that is not a symbol).
        TypeError: If ``tokens`` is not an integer torch tensor.
    """
    task = _check_task(task, _SYNTHETIC)
    if task not in _ANSWERED:
        raise ValueError(
            f"answers covers the tasks {_ANSWERED}; {task!r} has examples of varying "
            "layout (read its answers from make_batch's targets)"
        )
    if not isinstance(tokens, torch.Tensor):
        raise TypeError(f"tokens must be a torch.Tensor; got {type(tokens).__name__}")
    if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
        raise TypeError(f"tokens must hold integer token ids; got {tokens.dtype}")
    if tokens.ndim != 2:
        raise ValueError(f"tokens must be (batch, seq); got shape {tuple(tokens.shape)}")
    n = _infer_n(task, tokens.shape[1])
    tokens = tokens.long()
    sep = 1 + _input_length(task, n)
    if not (bool((tokens[:, 0] == BOS).all()) and bool((tokens[:, sep] == SEP).all())):
        raise ValueError(f"tokens must have BOS at column 0 and SEP at column {sep} for {task!r}")
    inputs = tokens[:, 1:sep]

    if task == "copy":
        return inputs.clone()
    if task == "reverse":
        return inputs.flip(1)
    if task == "sort":
        # Counting sort: with ends[s] = how many inputs are <= symbol s, output position j
        # holds the first symbol whose end exceeds j, i.e. the number of ends <= j.
        symbols = torch.arange(_SYMBOL0, _SYMBOL0 + _NUM_SYMBOLS, device=tokens.device)
        counts = (inputs[:, :, None] == symbols).sum(dim=1)
        if bool((counts.sum(dim=1) != n).any()):
            raise ValueError(f"tokens of sort must hold symbols {_SYMBOL0}..{_KEY0 - 1}")
        ends = counts.cumsum(dim=1)
        position = torch.arange(n, device=tokens.device)
        return (position[None, :, None] >= ends[:, None, :]).sum(dim=2) + _SYMBOL0
    if task == "recall":
        keys, values = inputs[:, 0 : 2 * n : 2], inputs[:, 1 : 2 * n : 2]
        match = keys == inputs[:, 2 * n, None]
        if bool((match.sum(dim=1) != 1).any()):
            raise ValueError("tokens of recall must have a query equal to exactly one key per row")
        return values[match].reshape(-1, 1)

    # addition: parse both operands into Python ints, add, write the sum back.
    rows = inputs.tolist()
    result = []
    for row in rows:
        a_digits, plus, b_digits = row[:n], row[n], row[n + 1 :]
        digits = [d - _SYMBOL0 for d in a_digits + b_digits]
        if plus != PLUS or not all(0 <= d < _NUM_SYMBOLS for d in digits):
            raise ValueError(
                f"tokens of addition must hold digit tokens {_SYMBOL0}..{_KEY0 - 1} around "
                f"PLUS={PLUS}"
            )
        a = int("".join(str(d) for d in reversed(digits[:n])))
        b = int("".join(str(d) for d in reversed(digits[n:])))
        total = str(a + b).zfill(n + 1)
        result.append([int(c) + _SYMBOL0 for c in reversed(total)])
    return torch.tensor(result, dtype=torch.int64, device=tokens.device).reshape(-1, n + 1)


# ------------------------------------------------------------------------------ text


def _python_files(directory: Path) -> Iterator[Path]:
    """``*.py`` files under ``directory``, lazily, in sorted path order (by path components).

    Entries of each directory are visited in name order and subdirectories are entered
    where they sort, so the order equals ``sorted(paths, key=lambda p: p.parts)`` while
    allowing the caller to stop early without walking the whole tree.
    """
    with os.scandir(directory) as listing:
        entries = sorted(listing, key=lambda entry: entry.name)
    for entry in entries:
        # Not following directory symlinks keeps the walk finite and each file counted once.
        if entry.is_dir(follow_symlinks=False):
            if entry.name not in _PRUNED_DIRS:
                yield from _python_files(Path(entry.path))
        elif entry.name.endswith(".py") and entry.is_file():
            yield Path(entry.path)


def _text_files(directory: Path) -> Iterator[Path]:
    """Every file under ``directory`` but hidden ones, lazily, in sorted path order.

    The walk of ``_python_files`` without its filter: names starting with ``.``
    (``.git``, ``.venv``, dotfiles) are skipped, directories and files alike, and so are
    directories that cannot be listed; whether a file holds text is ``_read_text``'s test.
    """
    try:
        with os.scandir(directory) as listing:
            entries = sorted(listing, key=lambda entry: entry.name)
    except OSError:
        return
    for entry in entries:
        if entry.name.startswith("."):
            continue
        if entry.is_dir(follow_symlinks=False):
            yield from _text_files(Path(entry.path))
        elif entry.is_file():
            yield Path(entry.path)


def _read_all(path: Path, room: int | None) -> bytes | None:
    """A file's first ``room`` bytes (all of them if None)."""
    with open(path, "rb") as handle:
        return handle.read() if room is None else handle.read(room)


def _read_text(path: Path, room: int | None) -> bytes | None:
    """A file's first ``room`` bytes, or None for a file that is unreadable, empty or binary.

    Binary is git's test: a NUL byte among the first 8000 bytes (read even when ``room``
    is smaller, so whether a file counts does not depend on where the limit falls).
    """
    try:
        with open(path, "rb") as handle:
            data = handle.read() if room is None else handle.read(max(room, _SNIFF))
    except OSError:
        return None
    if not data or b"\0" in data[:_SNIFF]:
        return None
    return data if room is None else data[:room]


def _split_by_file(
    paths: Iterable[Path],
    max_bytes: int | None,
    read: Callable[[Path, int | None], bytes | None],
) -> tuple[list[bytes], list[bytes]]:
    """The (train, test) files' bytes: every 10th file read to test, within ``max_bytes``.

    ``read`` returns a file's first ``room`` bytes, or None to skip the file (it then
    takes no place in the every-10th count). The newline that will join a file to the
    one before it in its split counts against ``max_bytes`` too.
    """
    splits: tuple[list[bytes], list[bytes]] = ([], [])
    kept = 0
    for path in paths:
        split = splits[(len(splits[0]) + len(splits[1])) % _TEST_EVERY == _TEST_EVERY - 1]
        cost = 1 if split else 0
        room = None if max_bytes is None else max_bytes - kept - cost
        if room is not None and room <= 0:
            break
        data = read(path, room)
        if data is None:
            continue
        split.append(data)
        kept += cost + len(data)
    return splits


def _as_tensor(chunks: list[bytes]) -> torch.Tensor:
    """Files joined with one newline, as a uint8 tensor (copied: torch needs a writable buffer)."""
    joined = b"\n".join(chunks)
    return torch.from_numpy(np.frombuffer(joined, dtype=np.uint8).copy())


class TextCorpus:
    """Byte-level text of Python source files, split by file into train and test.

    :meth:`from_data` reads your own text instead (a file or a directory).

    Files (``*.py`` under ``root``, skipping any ``site-packages`` or ``dist-packages``
    directory) are read in sorted path order; every 10th file (the 10th, 20th, ... in
    that order) goes to the test split and the rest to train, so no file contributes
    to both. Each split is its files' bytes joined with a single ``b"\\n"`` and stored
    as one uint8 tensor, so a window is a slice. Byte ``b`` becomes token ``b + 4``
    (:data:`PAD`, :data:`BOS`, :data:`SEP`, :data:`EOS` never occur in text).

    Args:
        root: Directory to read; ``None`` for the running Python's standard library
            (``sysconfig.get_paths()["stdlib"]``).
        max_bytes: At most this many bytes are kept over both splits, counting the
            newline separators; the file that crosses the limit is cut there and no
            further files are read. ``None`` reads everything (about 160 MB for the
            stdlib; the default 8 MiB keeps the lab fast).

    Raises:
        ValueError: If ``root`` is not a directory or holds no ``.py`` files, or
            ``max_bytes`` < 1.
        TypeError: If ``root`` is not a str/path or ``max_bytes`` not an int.
    """

    def __init__(self, root: str | Path | None = None, *, max_bytes: int | None = 8 << 20) -> None:
        if root is None:
            root = sysconfig.get_paths()["stdlib"]
        if not isinstance(root, (str, os.PathLike)):
            raise TypeError(f"root must be a str, a path or None; got {type(root).__name__}")
        if max_bytes is not None:
            max_bytes = checks.check_int(max_bytes, "max_bytes", 1)
        self.root = Path(root)
        self.max_bytes = max_bytes
        if not self.root.is_dir():
            raise ValueError(f"root must be a directory; got {str(self.root)!r}")
        splits = _split_by_file(_python_files(self.root), max_bytes, _read_all)
        if not splits[0]:
            raise ValueError(f"root has no .py files: {str(self.root)!r}")
        self._keep(splits, "root")

    @classmethod
    def from_data(
        cls, data: str | os.PathLike[str], *, max_bytes: int | None = 8 << 20
    ) -> TextCorpus:
        """Byte-level text of your own: a text file, or a directory of them read recursively.

        A directory counts every file under it, in sorted path order (by path
        components), except: names starting with ``.`` (hidden files and directories,
        ``.git`` among them), files that cannot be read, empty files, and files that look
        binary by git's test (a NUL byte among their first 8000 bytes). Symbolic links to
        files are followed, those to directories are not. The files split as the
        standard library's do: every 10th file counted goes to the test split, so a
        directory needs 10 text files for a test split at all.

        A single file splits by position: its first nine tenths (rounded down) are the
        train split and the rest the test split. It must be readable text by the same test.

        Either way only the first ``max_bytes`` bytes are kept, as in :class:`TextCorpus`
        (for a single file, before the split).

        Args:
            data: A text file or a directory of text files.
            max_bytes: At most this many bytes are kept (newline separators included);
                ``None`` reads everything.

        Returns:
            The corpus; :attr:`digest` identifies its bytes (not its path).

        Raises:
            ValueError: If ``data`` does not exist, is neither a file nor a directory, is
                a file that is unreadable, empty or binary, or a directory without one text
                file; or ``max_bytes`` < 1.
            TypeError: If ``data`` is not a str/path or ``max_bytes`` not an int.
        """
        if not isinstance(data, (str, os.PathLike)):
            raise TypeError(f"data must be a str or a path; got {type(data).__name__}")
        if max_bytes is not None:
            max_bytes = checks.check_int(max_bytes, "max_bytes", 1)
        path = Path(data)
        if os.fspath(data) == "":
            raise ValueError("data (--data) must name a text file or a directory of them; got ''")
        by_position = path.is_file()
        if path.is_dir():
            splits = _split_by_file(_text_files(path), max_bytes, _read_text)
            if not splits[0]:
                raise ValueError(
                    f"data (--data) holds no text files: {str(path)!r} (files that are hidden, "
                    "unreadable, empty, or hold a NUL byte in their first 8000 bytes are "
                    "skipped)"
                )
        elif by_position:
            text = _read_text(path, max_bytes)
            if text is None:
                raise ValueError(
                    f"data (--data) must be a readable, non-empty text file (no NUL byte in its "
                    f"first 8000 bytes); got {str(path)!r}"
                )
            cut = len(text) * (_TEST_EVERY - 1) // _TEST_EVERY
            splits = ([text[:cut]], [text[cut:]])
        else:
            why = "not a regular file" if path.exists() else "no such file or directory"
            raise ValueError(
                f"data (--data) must be a text file or a directory of them; {why}: {str(path)!r}"
            )
        corpus = cls.__new__(cls)
        corpus.root, corpus.max_bytes = path, max_bytes
        corpus._keep(splits, "data", by_position=by_position)
        return corpus

    def _keep(
        self, splits: tuple[list[bytes], list[bytes]], source: str, by_position: bool = False
    ) -> None:
        """Store the (train, test) files' bytes, each split joined into one tensor."""
        self._source = source
        self._test_rule = (
            "the last tenth of the file" if by_position else f"every {_TEST_EVERY}th file"
        )
        self._data = {"train": _as_tensor(splits[0]), "test": _as_tensor(splits[1])}
        self._files = {"train": len(splits[0]), "test": len(splits[1])}

    @functools.cached_property
    def digest(self) -> str:
        """SHA-256 (hex) of the bytes the corpus holds, by split: what a model trained on it saw.

        Hashed: the train split's length (8 bytes, little-endian) and bytes, then the test
        split's. Paths do not enter it: moved or renamed files give the same digest as long
        as their order, and so the split, stays the same.
        """
        sha = hashlib.sha256()
        for split in ("train", "test"):
            data = self._data[split].numpy()
            sha.update(len(data).to_bytes(8, "little"))
            sha.update(data.tobytes())
        return sha.hexdigest()

    @property
    def train_bytes(self) -> int:
        """Bytes (tokens) in the train split, newline separators included."""
        return int(self._data["train"].numel())

    @property
    def test_bytes(self) -> int:
        """Bytes (tokens) in the test split, newline separators included."""
        return int(self._data["test"].numel())

    def __repr__(self) -> str:
        return (
            f"TextCorpus({self._source}={str(self.root)!r}, train: {self._files['train']} files "
            f"{self.train_bytes} bytes, test: {self._files['test']} files {self.test_bytes} bytes)"
        )

    def _split(self, split: Any, length: Any) -> tuple[torch.Tensor, int]:
        """The split's bytes and the validated window length (``length + 1`` bytes must fit)."""
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test'; got {split!r}")
        length = checks.check_int(length, "length", 1)
        data = self._data[split]
        if data.numel() < length + 1:
            raise ValueError(
                f"length {length} does not fit the {split} split: a window takes length + 1 "
                f"bytes and the split holds {data.numel()} (the test split is "
                f"{self._test_rule})"
            )
        return data, length

    @staticmethod
    def _batch(data: torch.Tensor, starts: torch.Tensor, length: int) -> Batch:
        """Windows of ``length + 1`` bytes at ``starts``; tokens and targets offset by one."""
        # One gather for the whole batch: rows of indices into the split's bytes.
        index = starts[:, None] + torch.arange(length + 1)
        window = data[index].long() + _BYTE0
        # Contiguous copies, so a trainer may .view() them like the synthetic batches.
        return Batch(
            tokens=window[:, :-1].contiguous(), targets=window[:, 1:].contiguous(), length=length
        )

    def batch(self, split: str, length: int, batch_size: int, generator: torch.Generator) -> Batch:
        """Random windows of ``length`` tokens from a split, every position scored.

        Each row is a window of ``length + 1`` consecutive bytes at a uniform random
        start: ``tokens`` are its first ``length`` and ``targets`` its last ``length``
        (so ``targets[:, t] == tokens[:, t + 1]``, and the last target is the byte after
        the tokens). Windows may cross file boundaries (the joining newline).

        Args:
            split: ``"train"`` or ``"test"``.
            length: Tokens per row, an int ``>= 1``; the split must hold ``length + 1`` bytes.
            batch_size: Number of windows, an int ``>= 1``.
            generator: Source of the random starts; tensors are returned on its device.

        Returns:
            A :class:`Batch` of ``(batch_size, length)`` int64 tensors with ``length=length``.

        Raises:
            ValueError: If ``split`` is not ``"train"``/``"test"``, or ``length`` /
                ``batch_size`` is out of range (``length`` too long for the split).
            TypeError: If ``length``/``batch_size`` is not an int or ``generator`` not a
                ``torch.Generator``.
        """
        data, length = self._split(split, length)
        batch_size = checks.check_int(batch_size, "batch_size", 1)
        generator = _check_generator(generator)
        starts = torch.randint(
            0,
            data.numel() - length,
            (batch_size,),
            generator=generator,
            device=generator.device,
        )
        result = self._batch(data, starts.cpu(), length)
        if generator.device.type == "cpu":
            return result
        return Batch(
            tokens=result.tokens.to(generator.device),
            targets=result.targets.to(generator.device),
            length=length,
        )

    def windows(self, split: str, length: int, count: int) -> Batch:
        """Deterministic evaluation windows from the start of a split.

        Window ``i`` is bytes ``i * (length + 1)`` to ``(i + 1) * (length + 1)`` of the
        split, so windows do not overlap; tokens and targets as in :meth:`batch`.

        Args:
            split: ``"train"`` or ``"test"``.
            length: Tokens per row, an int ``>= 1``.
            count: Windows wanted, an int ``>= 1``; fewer are returned if the split is
                too short for ``count``.

        Returns:
            A :class:`Batch` of ``(min(count, available), length)`` int64 CPU tensors.

        Raises:
            ValueError: If ``split`` is not ``"train"``/``"test"``, ``count`` < 1, or
                ``length`` < 1 or too long for even one window.
            TypeError: If ``length`` or ``count`` is not an int.
        """
        data, length = self._split(split, length)
        count = checks.check_int(count, "count", 1)
        available = data.numel() // (length + 1)
        starts = torch.arange(min(count, available)) * (length + 1)
        return self._batch(data, starts, length)
