"""The lab's flip-flop task (Liu et al. 2023): its strings, targets, registry entry and a run."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.faces.lab import flipflop, names, tasks
from posenc.faces.lab.flipflop import BIT0, READ, SKIP, WRITE
from posenc.faces.lab.tasks import BOS, IGNORE, make_batch
from posenc.faces.lab.training import LabConfig, run

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def reference_targets(row: list[int]) -> list[int]:
    """A row's targets recomputed by running the flip-flop: a read returns the last write."""
    targets = [IGNORE] * len(row)
    memory = None
    for t in range(1, len(row), 2):
        op, bit = row[t], row[t + 1]
        if op == WRITE:
            memory = bit
        elif op == READ:
            targets[t] = memory  # None before any write: never equal to a token
    return targets


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 40), batch_size=st.integers(1, 9), seed=st.integers(0, 2**32 - 1))
def test_reads_return_the_last_written_bit(n, batch_size, seed):
    batch = make_batch("flipflop", n, batch_size, gen(seed))
    tokens, targets = batch.tokens, batch.targets
    assert batch.length == n and tokens.dtype == targets.dtype == torch.int64
    assert tokens.shape == targets.shape == (batch_size, tasks.sequence_length("flipflop", n))
    assert tokens.shape[1] == 2 * n + 1
    assert bool((tokens[:, 0] == BOS).all())
    ops, bits = tokens[:, 1::2], tokens[:, 2::2]
    assert bool(torch.isin(ops, torch.tensor([WRITE, READ, SKIP])).all())
    assert bool(((bits == BIT0) | (bits == BIT0 + 1)).all())
    assert bool((tokens < tasks.vocab_size("flipflop")).all() and (tokens >= 0).all())
    # the first instruction writes, the last reads
    assert bool((ops[:, 0] == WRITE).all() and (ops[:, -1] == READ).all())
    for row, got in zip(tokens.tolist(), targets.tolist(), strict=True):
        assert got == reference_targets(row)
    # every scored target is the next token (teacher forcing holds the right bits)
    scored = targets != IGNORE
    assert torch.equal(targets[:, :-1][scored[:, :-1]], tokens[:, 1:][scored[:, :-1]])
    assert not bool(scored[:, -1].any())
    # the scored span ends at the last read, the column before the last token
    assert batch.scored[1] == 2 * n


def test_the_default_language_is_ffl_0_8():
    ops = make_batch("flipflop", 202, 100, gen(0)).tokens[:, 3:-2:2]  # the 200 drawn ones
    share = {op: float((ops == op).float().mean()) for op in (WRITE, READ, SKIP)}
    # 20000 draws: the standard error of each share is below 0.003
    assert share[SKIP] == pytest.approx(0.8, abs=0.015)
    assert share[WRITE] == pytest.approx(0.1, abs=0.015)
    assert share[READ] == pytest.approx(0.1, abs=0.015)
    bits = make_batch("flipflop", 202, 100, gen(1)).tokens[:, 2::2]
    assert float((bits - BIT0).float().mean()) == pytest.approx(0.5, abs=0.02)


@pytest.mark.parametrize(("p_ignore", "absent"), [(1.0, (WRITE, READ)), (0.0, (SKIP,))])
def test_p_ignore_sets_the_language(p_ignore, absent):
    ops = flipflop.make_batch(30, 40, gen(2), p_ignore=p_ignore).tokens[:, 3:-2:2]
    assert not bool(torch.isin(ops, torch.tensor(absent)).any())
    if p_ignore == 0.0:  # writes and reads alike
        assert abs(float((ops == WRITE).float().mean()) - 0.5) < 0.05


def test_deterministic_in_generator():
    first, again = make_batch("flipflop", 12, 16, gen(3)), make_batch("flipflop", 12, 16, gen(3))
    assert torch.equal(first.tokens, again.tokens) and torch.equal(first.targets, again.targets)
    assert not torch.equal(first.tokens, make_batch("flipflop", 12, 16, gen(4)).tokens)
    g = gen(3)  # the generator advances
    assert not torch.equal(
        make_batch("flipflop", 12, 16, g).tokens, make_batch("flipflop", 12, 16, g).tokens
    )


def test_a_registered_task():
    assert "flipflop" in names.TASKS and "flipflop" in tasks.SYNTHETIC
    assert tuple(tasks.SYNTHETIC) == tuple(t for t in names.TASKS if t != "text")
    assert tasks.vocab_size("flipflop") == 9
    assert [tasks.sequence_length("flipflop", n) for n in (2, 3, 16)] == [5, 7, 33]
    assert tasks.lengths("flipflop", 5) == [2, 3, 4, 5] and tasks.lengths("flipflop", 1) == []


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda: make_batch("flipflop", 1, 2, gen(0)), ValueError, "n must be an int >= 2"),
        (lambda: tasks.sequence_length("flipflop", 1), ValueError, "n must be an int >= 2"),
        (lambda: make_batch("flipflop", 4, 0, gen(0)), ValueError, "batch_size"),
        (lambda: make_batch("flipflop", 4, 2, 0), TypeError, "generator"),
        (lambda: flipflop.make_batch(4, 2, gen(0), p_ignore=1.5), ValueError, "p_ignore"),
        (lambda: tasks.answers("flipflop", torch.zeros(1, 5, dtype=torch.long)), ValueError,
         "make_batch's targets"),
        (lambda: LabConfig(task="flipflop", train_len=1, test_len=4), ValueError,
         "shorter than any example"),
    ],
)  # fmt: skip
def test_bad_input(call, error, words):
    with pytest.raises(error, match=words):
        call()


def test_a_tiny_run_learns_the_shortest_strings(tmp_path):
    # n = 2 is "w b r b": the answer is the bit two tokens back, which 200 steps teach
    config = LabConfig(
        task="flipflop", encodings=("nope", "rope"), train_len=3, test_len=5, seeds=1,
        steps=200, batch_size=32, lr=3e-3, d_model=32, layers=1, heads=2, eval_examples=64,
        checkpoint_every=100,
    )  # fmt: skip
    outcome = run(config, tmp_path, progress=False, workers=1)
    assert {(r.encoding, r.length) for r in outcome.records} == {
        (e, n) for e in ("nope", "rope") for n in (2, 3, 4, 5)
    }
    assert all(r.task == "flipflop" and r.metric == "accuracy" for r in outcome.records)
    shortest = {r.encoding: r.value for r in outcome.records if r.length == 2}
    # chance is 1/2 per read; each string of length 2 has one read
    assert min(shortest.values()) > 0.9, shortest
    again = run(replace(config, eval_examples=64), tmp_path, progress=False, workers=1)
    assert not again.trained and again.records == outcome.records  # cached


def test_the_bundled_run_is_shown_with_the_others():
    from posenc.faces.lab import results

    runs = {run.config.task: run for run in results.bundled()}
    assert list(runs) == ["copy", "text", "flipflop"]
    run = runs["flipflop"]
    assert run.config.encodings == ("path", "path-fox", "fox", "rope", "nope")
    assert {(r.encoding, r.seed, r.length) for r in run.records} == {
        (e, s, n) for e in run.config.encodings for s in range(3) for n in range(2, 33)
    }
    page = results.section(run.records, run.config, svg=b"<svg/>")
    assert 'id="lab-flipflop"' in page and "accuracy, lengths 2-16" in page
