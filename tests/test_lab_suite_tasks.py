"""posenc.lab.suite_tasks: Kazemnejad et al. (2023)'s task families, recomputed independently.

Every answer is recomputed here from the prompt alone (parsed back from the tokens)
with plain Python: the SCAN interpreter below follows the semantics of Lake & Baroni
(2018), table 1, not the enumeration the module generates from.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from posenc.faces.lab import names
from posenc.faces.lab import suite_tasks as S
from posenc.faces.lab.tasks import (
    BOS,
    EOS,
    IGNORE,
    PAD,
    PLUS,
    SEP,
    TASKS,
    answers,
    lengths,
    make_batch,
    sequence_length,
    vocab_size,
)
from posenc.faces.lab.training import LabConfig, _Data

D0 = 4  # digit d is token 4 + d
SEEDS = range(6)
BATCH = 48


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def wrong(value: Any) -> Any:
    return value


def rows(task: str, n: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """(input, answer) per row, after checking the layout, the padding and the targets."""
    batch = make_batch(task, n, BATCH, gen(seed))
    width = sequence_length(task, n)
    assert batch.tokens.shape == batch.targets.shape == (BATCH, width)
    assert batch.tokens.dtype == batch.targets.dtype == torch.int64 and batch.length == n
    assert int(batch.tokens.min()) >= 0 and int(batch.tokens.max()) < vocab_size(task)
    out = []
    for tokens, targets in zip(batch.tokens.tolist(), batch.targets.tolist(), strict=True):
        assert tokens[0] == BOS
        sep = tokens.index(SEP)
        eos = tokens.index(EOS, sep)
        assert all(t == PAD for t in tokens[eos + 1 :])  # right-padded
        assert PAD not in tokens[:eos] and SEP not in tokens[sep + 1 : eos]
        # scored: from SEP to the token before EOS, each the next token; nothing else
        expected = [IGNORE] * width
        expected[sep:eos] = tokens[sep + 1 : eos + 1]
        assert targets == expected
        out.append((tokens[1:sep], tokens[sep + 1 : eos]))
    return out


def split(tokens: list[int], separator: int) -> list[list[int]]:
    parts: list[list[int]] = [[]]
    for t in tokens:
        if t == separator:
            parts.append([])
        else:
            parts[-1].append(t)
    return parts


def number(digits: list[int]) -> int:
    assert digits and all(D0 <= t < D0 + 10 for t in digits)
    return int("".join(str(t - D0) for t in digits))


def signed(tokens: list[int]) -> int:
    return -number(tokens[1:]) if tokens[0] == S.MINUS else number(tokens)


# ------------------------------------------------------------------------------ answers


@pytest.mark.parametrize("n", [1, 2, 5, 20, 21, 40])
@pytest.mark.parametrize(
    "task",
    ["copy-repeat", "copy-replace", "copy-repeat-2x", "copy-2x", "reverse-2x", "reverse-copy"],
)
def test_copy_and_reverse_variants(task: str, n: int) -> None:
    symbols = range(D0, D0 + 10)
    for seed in SEEDS:
        for inputs, answer in rows(task, n, seed):
            if task == "copy-replace":
                source, target, body = inputs[0], inputs[1], inputs[2:]
                assert source != target and target in symbols and body == [source] * n
                assert answer == [target] * n
                continue
            assert len(inputs) == n and all(t in symbols for t in inputs)
            if task.startswith("copy-repeat"):
                assert len(set(inputs)) == 1
                assert answer == inputs * (2 if task == "copy-repeat-2x" else 1)
            else:
                first = inputs if task == "copy-2x" else inputs[::-1]
                second = inputs if task in ("copy-2x", "reverse-copy") else inputs[::-1]
                assert answer == [*first, S.NEXT, *second]


@pytest.mark.parametrize("n", [1, 2, 3, 8, 9, 16])
def test_addition_msd(n: int) -> None:
    shorter: set[int] = set()
    for seed in SEEDS:
        for inputs, answer in rows("addition-msd", n, seed):
            a, b = split(inputs, PLUS)
            assert max(len(a), len(b)) == n
            for operand in (a, b):  # the reference's draw: no leading zero beyond one digit
                assert len(operand) == 1 or operand[0] != D0
            shorter.add(min(len(a), len(b)))
            assert answer == [D0 + int(c) for c in str(number(a) + number(b))]
    assert shorter == set(range(1, n + 1))  # the other operand takes every length 1 .. n


@pytest.mark.parametrize("n", [1, 2, 8, 9, 16])
def test_summation_and_parity(n: int) -> None:
    for seed in SEEDS:
        for inputs, answer in rows("summation", n, seed):
            values = [number(v) for v in split(inputs, PLUS)]
            assert len(values) == n and all(1 <= v <= 9 for v in values)
            assert answer == [D0 + sum(values) % 10]
        for inputs, answer in rows("parity", n, seed):
            bits = [t - D0 for t in inputs]
            assert len(bits) == n and set(bits) <= {0, 1}
            assert answer == [D0 + bits.count(1) % 2]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8, 9, 16, 26])
def test_lego_follows_the_chain(n: int) -> None:
    queried: set[int] = set()
    for seed in SEEDS:
        for inputs, answer in rows("lego", n, seed):
            assert inputs[-2] == S.QUERY
            clauses = split(inputs[:-2], S.COMMA)
            assert len(clauses) == n and all(len(c) == 4 and c[1] == S.EQUALS for c in clauses)
            value: dict[int, int] = {}
            for i, (var, _, sign, operand) in enumerate(clauses):
                assert var not in value and S.X < var < vocab_size("lego")
                factor = {PLUS: 1, S.MINUS: -1}[sign]
                if i == 0:
                    assert operand == D0 + 1
                    value[var] = factor
                else:
                    assert operand == clauses[i - 1][0]  # the chain, in order
                    value[var] = factor * value[operand]
            query = inputs[-1]
            order = [c[0] for c in clauses]
            queried.add(order.index(query))
            assert answer == [PLUS if value[query] > 0 else S.MINUS, D0 + 1]
    # the reference queries the later half: index n//2 (n even) or n//2 + 1 (n odd) .. n - 1
    first = 0 if n == 1 else (n // 2 if n % 2 == 0 else n // 2 + 1)
    assert queried == set(range(first, n))


@pytest.mark.parametrize("n", [1, 2, 8, 16])
def test_sort_multidigit(n: int) -> None:
    for seed in SEEDS:
        for inputs, answer in rows("sort-multidigit", n, seed):
            values = [number(v) for v in split(inputs, S.COMMA)]
            assert len(values) == n and all(10 <= v <= 9999 for v in values)
            assert [number(v) for v in split(answer, S.COMMA)] == sorted(values)


@pytest.mark.parametrize("n", [1, 2, 8, 9, 16])
def test_polynomial_value(n: int) -> None:
    xs: set[int] = set()
    for seed in SEEDS:
        for inputs, answer in rows("polynomial", n, seed):
            head, terms = inputs[: inputs.index(S.COMMA)], inputs[inputs.index(S.COMMA) + 1 :]
            assert head[:2] == [S.X, S.EQUALS]
            x = signed(head[2:])
            assert -2 <= x <= 2
            xs.add(x)
            total = 0
            parsed = split(terms, PLUS)
            assert len(parsed) == n
            for term in parsed:
                assert term[-4:-1] == [S.TIMES, S.X, S.POW]
                coefficient, degree = signed(term[:-4]), number(term[-1:])
                assert -3 <= coefficient <= 3 and 0 <= degree <= 3
                total += coefficient * x**degree
            assert answer == [D0 + total % 10]  # Python's % is the reference's: 0 .. 9
    assert xs == {-2, -1, 0, 1, 2}


# ------------------------------------------------------------------------------ SCAN

WORDS = {S.SCAN_WORDS.index(w) + 23: w for w in S.SCAN_WORDS}
ACTIONS = {i + 23 + len(S.SCAN_WORDS): a for i, a in enumerate(S.SCAN_ACTIONS)}


def interpret(command: list[str]) -> list[str]:
    """SCAN's interpretation function (Lake & Baroni 2018, table 1), recursively."""
    for conjunction in ("and", "after"):
        if conjunction in command:
            i = command.index(conjunction)
            x1, x2 = interpret(command[:i]), interpret(command[i + 1 :])
            return x1 + x2 if conjunction == "and" else x2 + x1
    if command[-1] in ("twice", "thrice"):
        return interpret(command[:-1]) * (2 if command[-1] == "twice" else 3)
    action = [] if command[0] == "turn" else [command[0].upper()]
    if len(command) == 1:
        return action
    turn = ["LTURN" if command[-1] == "left" else "RTURN"]
    if command[1] == "opposite":
        return turn + turn + action
    if command[1] == "around":
        return (turn + action) * 4
    return turn + action


def test_scan_interpretation_of_the_papers_examples() -> None:
    examples = {
        "jump": "JUMP",
        "jump left": "LTURN JUMP",
        "jump around right": "RTURN JUMP RTURN JUMP RTURN JUMP RTURN JUMP",
        "turn left twice": "LTURN LTURN",
        "jump thrice": "JUMP JUMP JUMP",
        "jump opposite left and walk thrice": "LTURN LTURN JUMP WALK WALK WALK",
        "jump opposite left after walk around left": (
            "LTURN WALK LTURN WALK LTURN WALK LTURN WALK LTURN LTURN JUMP"
        ),
    }
    everything = {
        " ".join(c): " ".join(a) for group in S.scan_commands().values() for c, a in group
    }
    for command, actions in examples.items():
        assert interpret(command.split()) == actions.split()
        assert everything[command] == actions


def test_scan_commands_are_scans() -> None:
    grouped = S.scan_commands()
    commands = [c for group in grouped.values() for c, _ in group]
    assert len(commands) == len(set(commands)) == 20_910  # SCAN's size
    # SCAN's length split: 16,990 commands of at most 22 actions train, 3,920 longer test
    assert sum(len(g) for k, g in grouped.items() if k <= 22) == 16_990
    assert sum(len(g) for k, g in grouped.items() if k > 22) == 3_920
    assert tuple(grouped) == S.SCAN_LENGTHS and max(S.SCAN_LENGTHS) == 48
    assert max(len(c) for c in commands) == 9
    for k, group in grouped.items():
        for command, actions in group:
            assert len(actions) == k and interpret(list(command)) == list(actions)


@pytest.mark.parametrize("n", [1, 2, 7, 22, 24, 25, 26, 36, 48])
def test_scan_batches(n: int) -> None:
    seen: set[tuple[str, ...]] = set()
    for seed in SEEDS:
        for inputs, answer in rows("scan", n, seed):
            command = [WORDS[t] for t in inputs]
            assert [ACTIONS[t] for t in answer] == interpret(command)
            assert len(answer) == n
            seen.add(tuple(command))
    assert len(seen) >= min(len(S.scan_commands()[n]), 40)  # drawn from the whole group


def test_lengths_and_the_trainer() -> None:
    assert lengths("scan", 30) == [*range(1, 23), 24, 25, 26, 27, 28, 30]
    assert lengths("copy", 5) == lengths("lego", 5) == [1, 2, 3, 4, 5]
    config = LabConfig(task="scan", encodings=("nope",), train_len=25, test_len=48, steps=1)
    data = _Data(config, 0, None)
    drawn = {data.next().length for _ in range(200)}
    assert drawn <= set(S.SCAN_LENGTHS) and 23 not in drawn and len(drawn) > 15
    assert config.max_positions == sequence_length("scan", 48) == 48 + 12
    assert sequence_length("scan", 23) == 35  # a bound, though no command has 23 actions


# ------------------------------------------------------------------------------ table, vocab


def test_suite_table() -> None:
    assert S.SUITE is names.SUITE and set(names.SUITE_TASKS) <= set(TASKS)
    by_task = {t.task: t for t in S.SUITE}
    assert len(by_task) == len(S.SUITE) == 16
    assert set(by_task) == {"copy", "reverse", "sort", *names.SUITE_TASKS}
    for entry in S.SUITE:
        lengths_ = (entry.train_len, entry.test_len)
        if entry.task.startswith(("copy", "reverse")):
            assert lengths_ == (20, 40)
        elif entry.task == "scan":
            assert lengths_ == (25, 48)
        else:
            assert lengths_ == (8, 16)
        for n in (entry.train_min, entry.train_len, entry.train_len + 1, entry.test_len):
            assert make_batch(entry.task, n, 2, gen(0)).tokens.shape[1] == sequence_length(
                entry.task, n
            )
        assert f"tr{entry.train_len}" in entry.split[1]


def test_vocabulary() -> None:
    assert [vocab_size(t) for t in ("copy", "reverse", "sort", "recall", "addition", "text")] == [
        14, 14, 14, 78, 15, 260,
    ]  # fmt: skip
    expected = {
        "copy-repeat": 14, "copy-replace": 14, "copy-repeat-2x": 14, "copy-2x": 22,
        "reverse-2x": 22, "reverse-copy": 22, "addition-msd": 15, "summation": 15,
        "parity": 14, "lego": 49, "sort-multidigit": 21, "polynomial": 21, "scan": 42,
    }  # fmt: skip
    assert {t: vocab_size(t) for t in names.SUITE_TASKS} == expected


@pytest.mark.parametrize("task", names.SUITE_TASKS)
def test_deterministic_for_a_seed(task: str) -> None:
    n = 8
    a, b = make_batch(task, n, 16, gen(3)), make_batch(task, n, 16, gen(3))
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.targets, b.targets)
    c = make_batch(task, n, 16, gen(4))
    if task not in ("copy-repeat", "copy-repeat-2x"):  # 10 rows apiece: may coincide
        assert not torch.equal(a.tokens, c.tokens)


# ------------------------------------------------------------------------------ errors


@pytest.mark.parametrize("task", names.SUITE_TASKS)
def test_bad_lengths_are_refused(task: str) -> None:
    with pytest.raises(ValueError, match="n must be an int >= 1; got 0"):
        make_batch(task, 0, 2, gen(0))
    with pytest.raises(TypeError, match="n must be an int >= 1; got float"):
        make_batch(task, wrong(2.5), 2, gen(0))
    with pytest.raises(ValueError, match="batch_size"):
        make_batch(task, 2, 0, gen(0))
    with pytest.raises(TypeError, match="generator"):
        make_batch(task, 2, 2, wrong(0))


def test_lengths_a_task_cannot_make() -> None:
    with pytest.raises(ValueError, match="n must be <= 26 for lego"):
        make_batch("lego", 27, 2, gen(0))
    with pytest.raises(ValueError, match="action-sequence length that SCAN has"):
        make_batch("scan", 23, 2, gen(0))
    with pytest.raises(ValueError, match="n must be an action-sequence length"):
        make_batch("scan", 49, 2, gen(0))
    with pytest.raises(ValueError, match="batch_size \\* sequence_length"):
        make_batch("copy-2x", 1 << 20, 1 << 12, gen(0))
    with pytest.raises(ValueError, match="answers covers the tasks"):
        answers("scan", torch.zeros(1, 15, dtype=torch.int64))
    with pytest.raises(ValueError, match="task must be one of"):
        S.make_batch("copy", 2, 2, gen(0))


def test_the_trainer_draws_the_lab_tasks_as_before() -> None:
    # _Data drew n = randint(1, train_len + 1) before it drew from lengths(); same batches
    config = LabConfig(task="copy", encodings=("nope",), train_len=16, batch_size=4, steps=1)
    data = _Data(config, 2, None)
    old = torch.Generator().manual_seed(1_000_003 * 3)
    for _ in range(20):
        n = int(torch.randint(1, 17, (1,), generator=old))
        assert torch.equal(data.next().tokens, make_batch("copy", n, 4, old).tokens)
