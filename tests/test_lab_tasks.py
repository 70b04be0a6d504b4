"""posenc.lab.tasks: layout, targets and answers of the synthetic tasks, and the text corpus."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.faces.lab.tasks import (
    BOS,
    EOS,
    IGNORE,
    PAD,
    PLUS,
    SEP,
    TASKS,
    Batch,
    TextCorpus,
    answers,
    make_batch,
    sequence_length,
    vocab_size,
)

# the lab's own synthetic tasks (the suite's tasks: tests/test_lab_suite_tasks.py)
SYNTHETIC = ["copy", "reverse", "sort", "recall", "addition"]
LENGTHS = [1, 2, 7, 16, 33]
INPUT_LENGTH = {"copy": 1, "reverse": 1, "sort": 1, "recall": 2, "addition": 2}  # per n
ANSWER_LENGTH = {"copy": 1, "reverse": 1, "sort": 1, "recall": 0, "addition": 1}  # per n


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def sep_column(task: str, n: int) -> int:
    """Where SEP sits: after BOS and the input (recall's query and addition's PLUS add 1)."""
    return 1 + INPUT_LENGTH[task] * n + (task in ("recall", "addition"))


def wrong(value: Any) -> Any:
    """``value`` typed as Any: the error tests pass deliberately wrong types."""
    return value


def digits_to_int(tokens: list[int]) -> int:
    """A least-significant-first row of digit tokens as a Python int."""
    return sum((t - 4) * 10**i for i, t in enumerate(tokens))


# ------------------------------------------------------------------------------ shapes


def test_constants():
    assert (PAD, BOS, SEP, EOS, IGNORE, PLUS) == (0, 1, 2, 3, -100, 14)
    assert TASKS[:6] == ("copy", "reverse", "sort", "recall", "addition", "text")


@pytest.mark.parametrize(
    ("task", "size"),
    [("copy", 14), ("reverse", 14), ("sort", 14), ("recall", 78), ("addition", 15), ("text", 260)],
)
def test_vocab_size(task, size):
    assert vocab_size(task) == size


@pytest.mark.parametrize("n", LENGTHS)
def test_sequence_length(n):
    assert sequence_length("copy", n) == 2 * n + 3
    assert sequence_length("reverse", n) == 2 * n + 3
    assert sequence_length("sort", n) == 2 * n + 3
    assert sequence_length("recall", n) == 2 * n + 5
    assert sequence_length("addition", n) == 3 * n + 5
    assert sequence_length("text", n) == n


# ------------------------------------------------------------------------------ synthetic


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("task", SYNTHETIC)
def test_layout_targets_and_answers(task, n):
    batch = make_batch(task, n, 8, gen(n))
    seq = sequence_length(task, n)
    assert isinstance(batch, Batch) and batch.length == n
    assert batch.tokens.shape == batch.targets.shape == (8, seq)
    assert batch.tokens.dtype == batch.targets.dtype == torch.int64

    tokens, targets = batch.tokens, batch.targets
    sep = sep_column(task, n)
    assert (tokens[:, 0] == BOS).all() and (tokens[:, sep] == SEP).all()
    assert (tokens[:, -1] == EOS).all()
    # specials appear only at their places; no padding in synthetic batches
    body = torch.cat([tokens[:, 1:sep], tokens[:, sep + 1 : -1]], dim=1)
    assert (body >= 4).all()
    assert (tokens >= 0).all() and (tokens < vocab_size(task)).all()

    # scored: from SEP to the token before EOS, each target the next token
    scored = targets != IGNORE
    expected = torch.zeros(seq, dtype=torch.bool)
    expected[sep : seq - 1] = True
    assert torch.equal(scored, expected.expand(8, seq))
    assert torch.equal(targets[:, sep:-1], tokens[:, sep + 1 :])
    assert (targets[:, -2] == EOS).all()
    assert batch.scored == (sep, seq - 1)

    answer = tokens[:, sep + 1 : -1]
    assert answer.shape[1] == ANSWER_LENGTH[task] * n + (task in ("recall", "addition"))
    assert torch.equal(answer, answers(task, tokens))


def test_scored_columns_span_every_scored_target():
    targets = torch.full((3, 9), IGNORE)
    assert Batch(targets.clone(), targets, 3).scored == (0, 9)  # nothing scored: every column
    targets[1, 2], targets[0, 6] = 5, 7  # rows may differ: the span covers them all
    assert Batch(targets.clone(), targets, 3).scored == (2, 7)


@pytest.mark.parametrize("task", SYNTHETIC)
def test_deterministic_in_generator(task):
    first = make_batch(task, 7, 16, gen(3))
    again = make_batch(task, 7, 16, gen(3))
    other = make_batch(task, 7, 16, gen(4))
    assert torch.equal(first.tokens, again.tokens) and torch.equal(first.targets, again.targets)
    assert not torch.equal(first.tokens, other.tokens)
    # the generator advances: two draws from one generator differ
    g = gen(3)
    assert not torch.equal(make_batch(task, 7, 16, g).tokens, make_batch(task, 7, 16, g).tokens)


RULES: dict[str, Callable[[list[int]], list[int]]] = {
    "copy": list,
    "reverse": lambda row: row[::-1],
    "sort": sorted,
}


@pytest.mark.parametrize("task", sorted(RULES))
def test_copy_reverse_sort_rules(task):
    tokens = make_batch(task, 16, 8, gen(0)).tokens.tolist()
    for row in tokens:
        assert row[18:34] == RULES[task](row[1:17])
        assert all(4 <= t < 14 for t in row[1:17])


@pytest.mark.parametrize("n", [1, 2, 7, 33, 64])
def test_recall_keys_distinct_and_query_among_them(n):
    tokens = make_batch("recall", n, 32, gen(n)).tokens.tolist()
    for row in tokens:
        keys, values, query = row[1 : 2 * n + 1 : 2], row[2 : 2 * n + 2 : 2], row[2 * n + 1]
        assert len(set(keys)) == n
        assert all(14 <= k < 78 for k in keys) and all(4 <= v < 14 for v in values)
        assert query in keys
        assert row[2 * n + 3] == values[keys.index(query)]


def test_recall_queries_cover_positions():
    # the query is drawn uniformly among the n keys: every slot gets asked about
    n = 4
    tokens = make_batch("recall", n, 400, gen(0)).tokens
    keys = tokens[:, 1 : 2 * n + 1 : 2]
    slot = (keys == tokens[:, 2 * n + 1, None]).int().argmax(dim=1)
    counts = torch.bincount(slot, minlength=n)
    assert (counts > 60).all(), counts


@pytest.mark.parametrize("n", LENGTHS)
def test_addition_against_python_ints(n):
    tokens = make_batch("addition", n, 32, gen(n)).tokens.tolist()
    carries = set()
    for row in tokens:
        a, b = digits_to_int(row[1 : n + 1]), digits_to_int(row[n + 2 : 2 * n + 2])
        assert row[n + 1] == PLUS
        answer = row[2 * n + 3 : 3 * n + 4]
        assert len(answer) == n + 1
        assert digits_to_int(answer) == a + b
        assert a < 10**n and b < 10**n
        carries.add(answer[-1] - 4)
    assert carries <= {0, 1}
    if n > 1:
        assert carries == {0, 1}  # both cases occur in 32 random sums


def test_addition_literal():
    # 95 + 7 = 102, written least-significant first: 5 9 + 7 0 = 2 0 1
    d = [4 + k for k in range(10)]
    tokens = torch.tensor([[BOS, d[5], d[9], PLUS, d[7], d[0], SEP, d[2], d[0], d[1], EOS]])
    assert answers("addition", tokens).tolist() == [[d[2], d[0], d[1]]]


@settings(max_examples=40, deadline=None)
@given(
    task=st.sampled_from(SYNTHETIC),
    n=st.integers(1, 40),
    batch_size=st.integers(1, 5),
    seed=st.integers(0, 2**32 - 1),
)
def test_answers_match_property(task, n, batch_size, seed):
    batch = make_batch(task, n, batch_size, gen(seed))
    sep = sep_column(task, n)
    assert torch.equal(batch.tokens[:, sep + 1 : -1], answers(task, batch.tokens))
    assert batch.tokens.max() < vocab_size(task)


def test_answers_reads_only_the_prompt():
    # answers reads only the prompt: corrupting the answer part does not change it
    batch = make_batch("sort", 5, 4, gen(1))
    corrupted = batch.tokens.clone()
    corrupted[:, 7:-1] = 4
    assert torch.equal(answers("sort", corrupted), answers("sort", batch.tokens))


# ------------------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: make_batch("copyy", 3, 2, gen(0)), ValueError, "task must be one of"),
        (lambda: make_batch("text", 3, 2, gen(0)), ValueError, "TextCorpus"),
        (lambda: make_batch(wrong(3), 3, 2, gen(0)), TypeError, "task"),
        (lambda: make_batch("copy", 0, 2, gen(0)), ValueError, "n must be an int >= 1; got 0"),
        (lambda: make_batch("copy", wrong(3.0), 2, gen(0)), TypeError, "n must"),
        (lambda: make_batch("copy", True, 2, gen(0)), TypeError, "n must be an int >= 1; got bool"),
        (lambda: make_batch("copy", 3, 0, gen(0)), ValueError, "batch_size must be an int >= 1"),
        (lambda: make_batch("copy", 3, False, gen(0)), TypeError, "batch_size must be an int"),
        (lambda: make_batch("copy", 3, 2, wrong(0)), TypeError, "generator"),
        (lambda: make_batch("recall", 65, 2, gen(0)), ValueError, "n must be <= 64"),
        (lambda: sequence_length("recall", 65), ValueError, "n must"),
        (lambda: sequence_length("text", 0), ValueError, "n must"),
        (lambda: vocab_size("nope"), ValueError, "task must be one of"),
        (lambda: answers("text", torch.zeros(2, 5, dtype=torch.int64)), ValueError, "task"),
        (lambda: answers("copy", wrong(np.zeros((2, 5), dtype=np.int64))), TypeError, "tokens"),
        (lambda: answers("copy", torch.zeros(2, 5)), TypeError, "tokens"),
        (lambda: answers("copy", torch.zeros(5, dtype=torch.int64)), ValueError, "tokens"),
        (lambda: answers("copy", torch.zeros(2, 6, dtype=torch.int64)), ValueError, "tokens"),
        (lambda: answers("copy", torch.zeros(2, 5, dtype=torch.int64)), ValueError, "tokens"),
    ],
)
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_answers_rejects_unanswerable_prompts():
    recall = make_batch("recall", 3, 2, gen(0)).tokens.clone()
    recall[:, 1:7:2] = torch.tensor([14, 15, 16])
    recall[:, 7] = 20  # a query no key has
    with pytest.raises(ValueError, match="tokens of recall"):
        answers("recall", recall)
    addition = make_batch("addition", 2, 2, gen(0)).tokens.clone()
    addition[0, 1] = 20
    with pytest.raises(ValueError, match="tokens of addition"):
        answers("addition", addition)


# ------------------------------------------------------------------------------ text


@pytest.fixture
def source_tree(tmp_path):
    """25 small .py files in three directories, plus files the corpus must skip."""
    contents = {}
    for i in range(25):
        # nested directories to exercise the sorted walk: sorted by path components
        rel = f"pkg{i // 10}/mod{i % 10:02d}.py"
        contents[rel] = f"# module {i}\nVALUE_{i} = {i * i}  # é\n".encode()
        (tmp_path / rel).parent.mkdir(exist_ok=True)
        (tmp_path / rel).write_bytes(contents[rel])
    (tmp_path / "site-packages").mkdir()
    (tmp_path / "site-packages" / "third.py").write_bytes(b"THIRD_PARTY = 1\n")
    (tmp_path / "pkg0" / "notes.txt").write_bytes(b"not python\n")
    return tmp_path, [contents[rel] for rel in sorted(contents)]


def whole_split(corpus: TextCorpus, split: str) -> bytes:
    """A split's bytes, through the public API: one window spanning it."""
    size = corpus.train_bytes if split == "train" else corpus.test_bytes
    window = corpus.windows(split, size - 1, 1)
    row = torch.cat([window.tokens[0], window.targets[0, -1:]]) - 4
    return bytes(row.tolist())


def test_corpus_splits_by_file(source_tree):
    root, files = source_tree
    corpus = TextCorpus(root, max_bytes=None)
    train = [f for i, f in enumerate(files) if i % 10 != 9]
    test = [f for i, f in enumerate(files) if i % 10 == 9]
    assert len(test) == 2
    assert whole_split(corpus, "train") == b"\n".join(train)
    assert whole_split(corpus, "test") == b"\n".join(test)
    assert corpus.train_bytes == len(b"\n".join(train))
    assert corpus.test_bytes == len(b"\n".join(test))
    assert b"THIRD_PARTY" not in whole_split(corpus, "train")
    assert "train: 23 files" in repr(corpus) and "test: 2 files" in repr(corpus)


def test_corpus_batch(source_tree):
    root, files = source_tree
    corpus = TextCorpus(str(root), max_bytes=None)
    text = b"\n".join(f for i, f in enumerate(files) if i % 10 != 9)
    batch = corpus.batch("train", 12, 32, gen(0))
    assert batch.length == 12
    assert batch.tokens.shape == batch.targets.shape == (32, 12)
    assert batch.tokens.dtype == batch.targets.dtype == torch.int64
    assert torch.equal(batch.targets[:, :-1], batch.tokens[:, 1:])  # every position scored
    assert batch.scored == (0, 12)
    assert (batch.tokens >= 4).all() and (batch.tokens < vocab_size("text")).all()
    for tokens, targets in zip(batch.tokens.tolist(), batch.targets.tolist(), strict=True):
        window = bytes(t - 4 for t in [*tokens, targets[-1]])  # byte b is token b + 4
        assert window in text
    again = corpus.batch("train", 12, 32, gen(0))
    assert torch.equal(batch.tokens, again.tokens)
    assert not torch.equal(batch.tokens, corpus.batch("train", 12, 32, gen(1)).tokens)
    # a window may take the whole split
    full = corpus.batch("test", corpus.test_bytes - 1, 2, gen(0))
    assert full.tokens.shape == (2, corpus.test_bytes - 1)


def test_corpus_windows(source_tree):
    root, files = source_tree
    corpus = TextCorpus(root, max_bytes=None)
    text = b"\n".join(f for i, f in enumerate(files) if i % 10 != 9)
    windows = corpus.windows("train", 9, 5)
    assert windows.tokens.shape == windows.targets.shape == (5, 9) and windows.length == 9
    assert torch.equal(windows.targets[:, :-1], windows.tokens[:, 1:])
    for i in range(5):  # non-overlapping windows of length + 1 bytes from the start
        chunk = text[i * 10 : (i + 1) * 10]
        assert windows.tokens[i].tolist() == [b + 4 for b in chunk[:9]]
        assert windows.targets[i].tolist() == [b + 4 for b in chunk[1:]]
    # fewer when the split is short; deterministic
    many = corpus.windows("test", 9, 10_000)
    assert many.tokens.shape[0] == corpus.test_bytes // 10
    assert torch.equal(many.tokens, corpus.windows("test", 9, 10_000).tokens)


@pytest.mark.parametrize("max_bytes", [1, 10, 100, 700, 1000])
def test_corpus_max_bytes(source_tree, max_bytes):
    root, files = source_tree
    corpus = TextCorpus(root, max_bytes=max_bytes)
    total = corpus.train_bytes + corpus.test_bytes
    assert total == min(max_bytes, len(b"\n".join(files)) - 1)
    # files are read in order and the last one cut: each split is a prefix of its full text
    unlimited = TextCorpus(root, max_bytes=None)
    for split in ("train", "test"):
        size = corpus.train_bytes if split == "train" else corpus.test_bytes
        if size > 1:  # whole_split needs room for one window
            assert whole_split(unlimited, split).startswith(whole_split(corpus, split))
    if max_bytes < len(b"\n".join(files[:9])):
        assert corpus.test_bytes == 0  # the 10th file (first test file) was never reached


def test_corpus_errors(source_tree, tmp_path_factory):
    root, _ = source_tree
    corpus = TextCorpus(root, max_bytes=None)
    empty = tmp_path_factory.mktemp("empty")
    (empty / "readme.txt").write_bytes(b"no python here")
    with pytest.raises(ValueError, match="root"):
        TextCorpus(empty)
    with pytest.raises(ValueError, match="root"):
        TextCorpus(empty / "missing")
    with pytest.raises(TypeError, match="root"):
        TextCorpus(wrong(3))
    with pytest.raises(ValueError, match="max_bytes must be an int >= 1; got 0"):
        TextCorpus(root, max_bytes=0)
    with pytest.raises(ValueError, match="split"):
        corpus.batch("valid", 4, 2, gen(0))
    with pytest.raises(ValueError, match="split"):
        corpus.windows("validation", 4, 2)
    with pytest.raises(ValueError, match="length"):
        corpus.batch("test", corpus.test_bytes, 2, gen(0))
    with pytest.raises(ValueError, match="length"):
        corpus.windows("test", corpus.test_bytes, 1)
    with pytest.raises(ValueError, match="length"):
        corpus.windows("train", 0, 1)
    with pytest.raises(ValueError, match="count must be an int >= 1; got 0"):
        corpus.windows("train", 4, 0)
    with pytest.raises(ValueError, match="batch_size"):
        corpus.batch("train", 4, 0, gen(0))
    with pytest.raises(TypeError, match="generator"):
        corpus.batch("train", 4, 2, wrong(None))
    # a corpus with fewer than 10 files has an empty test split
    small = TextCorpus(root / "pkg2", max_bytes=None)
    assert small.test_bytes == 0 and small.train_bytes > 0
    with pytest.raises(ValueError, match="length"):
        small.windows("test", 1, 1)


def test_stdlib_corpus():
    corpus = TextCorpus(max_bytes=1 << 20)
    assert corpus.train_bytes > 0 and corpus.test_bytes > 0
    assert corpus.train_bytes + corpus.test_bytes <= 1 << 20
    batch = corpus.batch("test", 64, 4, gen(0))
    assert batch.tokens.shape == (4, 64)
    assert (batch.tokens >= 4).all() and (batch.tokens < 260).all()
