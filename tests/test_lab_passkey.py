"""The lab's passkey task (Mohtashami & Jaggi 2023): its layout, needle, targets and a run.

Rows are decoded here independently of :mod:`posenc.lab.passkey`'s construction: by
looking for the markers and reading the bytes back.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc import lab
from posenc.faces.lab import names, passkey, tasks
from posenc.faces.lab.passkey import ASK, FILLER, KEY
from posenc.faces.lab.tasks import BOS, EOS, IGNORE, make_batch

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: Tokens other than the filler: BOS, KEY and 5 digits, ASK and 5 digits, EOS.
OVERHEAD = 14
#: Byte tokens of the digits '0' .. '9'.
DIGIT_TOKENS = [ord(c) + 4 for c in "0123456789"]


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def decode(row: list[int]) -> tuple[str, int, bytes]:
    """``(the key as read after KEY, KEY's column, the filler bytes in order)`` of a row.

    Asserts the layout on the way: BOS first, EOS last, one KEY and one ASK, five digit
    bytes after each, the same after both.
    """
    assert row[0] == BOS and row[-1] == EOS
    assert row.count(KEY) == 1 and row.count(ASK) == 1
    key_at, ask_at = row.index(KEY), row.index(ASK)
    assert key_at < ask_at == len(row) - 7
    hidden, asked = row[key_at + 1 : key_at + 6], row[ask_at + 1 : ask_at + 6]
    assert hidden == asked and all(t in DIGIT_TOKENS for t in hidden)
    rest = row[1:key_at] + row[key_at + 6 : ask_at]
    assert all(4 <= t < 4 + 256 for t in rest)
    key = "".join(chr(t - 4) for t in hidden)
    return key, key_at, bytes(t - 4 for t in rest)


def phase_of(filler: bytes) -> int | None:
    """The offset into :data:`FILLER` at which ``filler`` reads as its cyclic continuation."""
    for phase in range(len(FILLER)):
        if all(filler[i] == FILLER[(phase + i) % len(FILLER)] for i in range(len(filler))):
            return phase
    return None


@settings(max_examples=30, deadline=None)
@given(n=st.integers(14, 200), batch_size=st.integers(1, 6), seed=st.integers(0, 2**32 - 1))
def test_rows_decode_to_a_hidden_and_asked_key_in_cyclic_filler(n, batch_size, seed):
    batch = make_batch("passkey", n, batch_size, gen(seed))
    tokens, targets = batch.tokens, batch.targets
    assert batch.length == n and tokens.dtype == targets.dtype == torch.int64
    assert tokens.shape == targets.shape == (batch_size, n)
    assert bool((tokens >= 0).all() and (tokens < tasks.vocab_size("passkey")).all())
    for row in tokens.tolist():
        key, _, filler = decode(row)
        assert len(key) == 5 and key.isdigit()
        assert len(filler) == n - OVERHEAD
        assert phase_of(filler) is not None, filler
    # the answer, and only it, is scored: ASK's column through the last digit's
    scored = targets != IGNORE
    columns = scored.any(dim=0).nonzero().flatten().tolist()
    assert columns == list(range(n - 7, n - 1))
    assert bool((scored == scored[:1]).all())  # the same columns in every row
    assert torch.equal(targets[:, n - 7 : n - 1], tokens[:, n - 6 :])
    assert bool((targets[:, n - 2] == EOS).all())
    assert batch.scored == (n - 7, n - 1)


@pytest.mark.parametrize("n", [14, 15, 16, 47, 64, 200])
@pytest.mark.parametrize("depth", [0.0, 0.25, 0.5, 0.73, 1.0, 0, 1])
def test_the_needle_sits_at_the_asked_depth(n, depth):
    batch = passkey.make_batch(n, 8, gen(n), depth=depth)
    fill = n - OVERHEAD
    at = {decode(row)[1] for row in batch.tokens.tolist()}
    assert at == {1 + round(depth * fill)}


def test_the_ends_and_a_near_miss():
    n = 64
    fill = n - OVERHEAD
    first = passkey.make_batch(n, 4, gen(0), depth=0.0).tokens
    last = passkey.make_batch(n, 4, gen(0), depth=1.0).tokens
    assert bool((first[:, 1] == KEY).all())  # right after BOS
    assert bool((last[:, n - 13] == KEY).all())  # its key ends right before ASK
    assert bool((last[:, n - 7] == ASK).all())
    middle = {decode(r)[1] for r in passkey.make_batch(n, 4, gen(1), depth=0.5).tokens.tolist()}
    later = passkey.make_batch(n, 4, gen(1), depth=0.5 + 1 / fill).tokens.tolist()
    assert {decode(r)[1] for r in later} == {c + 1 for c in middle}
    # the same draws but the depth: the keys and the filler read the same
    again = passkey.make_batch(n, 4, gen(1), depth=0.5).tokens.tolist()
    for a, b in zip(again, later, strict=True):
        assert decode(a)[0] == decode(b)[0] and decode(a)[2] == decode(b)[2]


def test_drawn_depths_cover_the_span():
    n = 30
    at = [decode(r)[1] for r in make_batch("passkey", n, 400, gen(5)).tokens.tolist()]
    # 17 places (1 .. 17); each end has half the weight of the others (1/32 of 400 rows)
    assert set(at) == set(range(1, n - OVERHEAD + 2))


def test_deterministic_in_generator():
    first, again = make_batch("passkey", 48, 16, gen(3)), make_batch("passkey", 48, 16, gen(3))
    assert torch.equal(first.tokens, again.tokens) and torch.equal(first.targets, again.targets)
    other = make_batch("passkey", 48, 16, gen(4))
    keys = [[decode(r)[0] for r in b.tokens.tolist()] for b in (first, other)]
    assert keys[0] != keys[1]
    phases = [[phase_of(decode(r)[2]) for r in b.tokens.tolist()] for b in (first, other)]
    assert phases[0] != phases[1]
    g = gen(3)  # the generator advances
    assert not torch.equal(
        make_batch("passkey", 48, 16, g).tokens, make_batch("passkey", 48, 16, g).tokens
    )


def test_every_digit_in_every_place():
    keys = [decode(r)[0] for r in make_batch("passkey", 14, 2000, gen(6)).tokens.tolist()]
    # a digit missing from a place among 2000 uniform draws has probability 10 * 0.9**2000
    for place in range(5):
        assert {k[place] for k in keys} == set("0123456789")
    # many keys, and the phases vary too
    assert len(set(keys)) > 1900
    phases = {
        phase_of(decode(r)[2]) for r in make_batch("passkey", 30, 200, gen(7)).tokens.tolist()
    }
    assert len(phases) > 40


def test_a_registered_task():
    assert "passkey" in names.TASKS and "passkey" in tasks.SYNTHETIC
    assert names.TASKS.index("passkey") == names.TASKS.index("flipflop") + 1
    assert tuple(tasks.SYNTHETIC) == tuple(t for t in names.TASKS if t != "text")
    batch = tasks.make_batch("passkey", 64, 4, gen(0))
    assert batch.tokens.shape == (4, 64)
    assert tasks.vocab_size("passkey") == 262 == passkey.VOCAB
    assert tasks.sequence_length("passkey", 64) == 64
    assert tasks.lengths("passkey", 64) == [16, 32, 48, 64]
    assert tasks.lengths("passkey", 15) == [] and tasks.lengths("passkey", 40) == [16, 32]
    config = lab.LabConfig(
        task="passkey", train_len=64, test_len=128, encodings=("rope",), seeds=1, steps=2
    )
    assert config.max_positions == 128


def test_filler_has_no_digit_and_is_the_reference_sentence():
    assert not any(chr(b).isdigit() for b in FILLER)
    assert FILLER.startswith(b"The grass is green.") and FILLER.endswith(b"back again. ")


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda: make_batch("passkey", 13, 2, gen(0)), ValueError, "n must be an int >= 14"),
        (lambda: tasks.sequence_length("passkey", 13), ValueError, "n must be an int >= 14"),
        (lambda: make_batch("passkey", 16, 0, gen(0)), ValueError, "batch_size"),
        (lambda: make_batch("passkey", 16, 2, None), TypeError, "generator"),
        (lambda: passkey.make_batch(16, 2, gen(0), depth=1.5), ValueError, r"depth.*\[0, 1\]"),
        (lambda: passkey.make_batch(16, 2, gen(0), depth=-0.1), ValueError, r"depth.*\[0, 1\]"),
        (lambda: passkey.make_batch(16, 2, gen(0), depth=float("nan")), ValueError,
         r"depth.*\[0, 1\]"),
        (lambda: passkey.make_batch(16, 2, gen(0), depth=True), TypeError, "depth"),
        (lambda: passkey.make_batch(16, 2, gen(0), depth="0.5"), TypeError, "depth"),
        (lambda: tasks.answers("passkey", torch.zeros(1, 16, dtype=torch.long)), ValueError,
         "make_batch's targets"),
        (lambda: lab.LabConfig(task="passkey", train_len=15, test_len=32), ValueError,
         "shorter than any example"),
    ],
)  # fmt: skip
def test_bad_input(call, error, words):
    with pytest.raises(error, match=words):
        call()


def test_a_tiny_run(tmp_path):
    config = lab.LabConfig(
        task="passkey", encodings=("rope",), train_len=32, test_len=48, seeds=1, steps=3,
        batch_size=8, d_model=32, layers=1, heads=2, eval_examples=4,
    )  # fmt: skip
    outcome = lab.run(config, tmp_path, progress=False, workers=1, probe=False)
    assert sorted(r.length for r in outcome.records) == [16, 32, 48]
    assert all(r.task == "passkey" and r.metric == "accuracy" for r in outcome.records)
    assert all(0.0 <= r.value <= 1.0 for r in outcome.records)
