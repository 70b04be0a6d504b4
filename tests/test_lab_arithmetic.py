"""The lab's arithmetic: task formats, the Abacus / coupled / randomized encodings, the study."""

from __future__ import annotations

import copy
import json
import pickle
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.faces.lab import arithmetic, names
from posenc.faces.lab import tasks as T
from posenc.faces.lab.arithmetic_tasks import (
    FORMATS,
    HINT0,
    HINTS,
    TIMES,
    ArithmeticFormat,
    example_tokens,
)
from posenc.faces.lab.encodings import Encoding, lookup
from posenc.faces.lab.model import LabModel

DIGIT0 = 4


def _number(digits: list[int], reverse: bool) -> int:
    return int("".join(map(str, digits[::-1] if reverse else digits)) or "0")


def _decode(fmt: ArithmeticFormat, tokens: list[int]) -> tuple[list[int], int]:
    """The operands and the answer written in ``tokens`` (hints dropped), read back."""
    body = [t for t in tokens if t < HINT0 or t >= HINT0 + HINTS]
    body = [t for t in body if not HINT0 <= t < HINT0 + HINTS]
    assert body[0] == T.BOS and body[-1] == T.EOS
    sep = body.index(T.SEP)
    operands, current = [], []
    for t in body[1:sep]:
        if t in (T.PLUS, TIMES):
            operands.append(_number(current, fmt.reverse_operands))
            current = []
        else:
            current.append(t - DIGIT0)
    operands.append(_number(current, fmt.reverse_operands))
    answer = _number([t - DIGIT0 for t in body[sep + 1 : -1]], fmt.reverse_answer)
    return operands, answer


@pytest.mark.parametrize("name", names.ARITHMETIC_TASKS)
def test_every_format_writes_correct_sums_and_products(name: str) -> None:
    fmt = FORMATS[name]
    gen = torch.Generator().manual_seed(5)
    for batch in (T.make_batch(name, 7, 16, gen), T.SYNTHETIC[name].train(7, 16, gen)):
        for row in range(16):
            tokens = [t for t in batch.tokens[row].tolist() if t != T.PAD]
            operands, answer = _decode(fmt, tokens)
            want = operands[0] * operands[1] if fmt.operation == "multiply" else sum(operands)
            assert answer == want
            assert len(operands) == fmt.operands
            # the scored targets are exactly the answer (with its hints) and EOS
            sep = tokens.index(T.SEP)
            scored = batch.targets[row][batch.targets[row] != T.IGNORE].tolist()
            assert scored == tokens[sep + 1 :]


def test_evaluation_gives_every_operand_n_digits_and_training_draws_lengths() -> None:
    gen = torch.Generator().manual_seed(0)
    fmt = FORMATS["add-unpadded"]
    batch = T.make_batch("add-unpadded", 6, 32, gen)
    for row in batch.tokens.tolist():
        operands, _ = _decode(fmt, [t for t in row if t != T.PAD])
        assert all(len(str(v)) == 6 for v in operands)
    drawn = T.SYNTHETIC["add-unpadded"].train(6, 256, gen)
    lengths = set()
    for row in drawn.tokens.tolist():
        operands, _ = _decode(fmt, [t for t in row if t != T.PAD])
        lengths |= {len(str(v)) for v in operands}
    assert lengths == set(range(1, 7))  # each operand's length drawn from 1 .. n


def test_the_formats_write_as_their_papers() -> None:
    # Cho et al.: 653 + 49 -> "6 5 3 + 0 4 9 = 2 0 7 0"
    tokens, places, sep = example_tokens(FORMATS["add-answer-reversed"], (653, 49))
    shown = [t - DIGIT0 if DIGIT0 <= t < DIGIT0 + 10 else t for t in tokens]
    assert shown == [T.BOS, 6, 5, 3, T.PLUS, 0, 4, 9, T.SEP, 2, 0, 7, 0, T.EOS]
    assert places == [-2, 2, 1, 0, -1, 2, 1, 0, -1, 0, 1, 2, 3, -2] and sep == 8
    # McLeish et al.: every number reversed, its own length: 123 + 4 -> "3 2 1 + 4 = 7 2 1"
    tokens, places, _ = example_tokens(FORMATS["add-unpadded"], (123, 4))
    assert [t - DIGIT0 for t in tokens[1:-1] if t >= DIGIT0 and t < DIGIT0 + 10] == [
        3, 2, 1, 4, 7, 2, 1,
    ]  # fmt: skip
    # index hints: the same hint before the digits of one significance
    tokens, _, _ = example_tokens(FORMATS["add-reversed-hints"], (42, 39), hint_start=3)
    hints = [t - HINT0 for t in tokens if t >= HINT0]
    assert hints == [3, 4, 3, 4, 3, 4, 5]
    # N x 2: the answer zero-padded to n + 2 digits and reversed
    tokens, _, _ = example_tokens(FORMATS["multiply-nx2"], (12, 34))
    assert tokens[-5:-1] == [DIGIT0 + d for d in (8, 0, 4, 0)]


def test_hints_beyond_the_vocabulary_are_refused() -> None:
    with pytest.raises(ValueError, match="hint"):
        example_tokens(FORMATS["add-reversed-hints"], (10**5, 1), hint_start=HINTS - 2)
    with pytest.raises(ValueError, match="index hints"):
        T.make_batch("add-reversed-hints", HINTS, 1, torch.Generator())


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"operation": "divide"}, "operation"),
        ({"operation": "multiply", "operands": 3}, "operands"),
        ({"operands": 1}, "operands"),
        ({"sampling": "sorted"}, "sampling"),
        ({"pad": "yes"}, "pad"),
    ],
)
def test_bad_formats_are_refused(options: dict, match: str) -> None:
    with pytest.raises((TypeError, ValueError), match=match):
        ArithmeticFormat("bad", **options)


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(names.ARITHMETIC_TASKS), st.integers(1, 12))
def test_sequence_length_is_the_longest_example(name: str, n: int) -> None:
    batch = T.make_batch(name, n, 4, torch.Generator().manual_seed(n))
    assert batch.tokens.shape[1] <= T.sequence_length(name, n)
    if FORMATS[name].pad:
        assert batch.tokens.shape[1] == T.sequence_length(name, n)


# ------------------------------------------------------------------ encodings


def _model(encoding: str, task: str = "add-reversed", test_len: int = 12) -> LabModel:
    from posenc.faces.lab.training import LabConfig

    cfg = LabConfig(task=task, encodings=(encoding,), train_len=4, test_len=test_len,
                    d_model=16, layers=1, heads=2)  # fmt: skip
    torch.manual_seed(0)
    return LabModel(cfg.model, encoding)


@pytest.mark.parametrize("encoding", ["abacus", "abacus-fire", "coupled", "randomized-learned"])
def test_the_new_encodings_train_and_evaluate(encoding: str) -> None:
    model = _model(encoding)
    gen = torch.Generator().manual_seed(1)
    batch = T.SYNTHETIC["add-reversed"].train(4, 8, gen)
    logits = model(batch.tokens, significance=batch.significance, generator=gen)
    assert logits.shape == (*batch.tokens.shape, model.config.vocab)
    assert bool(torch.isfinite(logits).all())
    logits.sum().backward()
    model.eval()
    test = T.make_batch("add-reversed", 12, 4, gen)
    with torch.no_grad():
        a = model(test.tokens, significance=test.significance, generator=gen)
        start, stop = test.scored
        b = model(test.tokens, significance=test.significance, generator=gen, span=(start, stop))
    if encoding != "randomized-learned":  # evaluation's ids are fixed: the span is those rows
        torch.testing.assert_close(a[:, start:stop], b)


def test_ids_are_random_in_training_and_fixed_at_evaluation() -> None:
    model = _model("coupled")
    batch = T.make_batch("add-reversed", 4, 8, torch.Generator().manual_seed(0))
    model.eval()
    with torch.no_grad():
        first = model(batch.tokens, significance=batch.significance)
        again = model(batch.tokens, significance=batch.significance)
    torch.testing.assert_close(first, again, rtol=0, atol=0)
    model.train()
    with torch.no_grad():
        one = model(batch.tokens, significance=batch.significance,
                    generator=torch.Generator().manual_seed(3))  # fmt: skip
        same = model(batch.tokens, significance=batch.significance,
                     generator=torch.Generator().manual_seed(3))  # fmt: skip
        other = model(batch.tokens, significance=batch.significance,
                      generator=torch.Generator().manual_seed(4))  # fmt: skip
    torch.testing.assert_close(one, same, rtol=0, atol=0)  # seeded
    assert not torch.equal(one, other)


def test_the_id_table_covers_the_widest_test_number() -> None:
    model = _model("abacus", test_len=12)
    assert model.config.max_ids == 13 + 2  # 13 answer columns, row 0, the after-number id
    assert model.learned.weight.shape[0] == model.config.max_ids
    # a longer number than the table covers: a clear error, before any work
    model.eval()
    long = T.make_batch("add-reversed", 20, 1, torch.Generator())
    with pytest.raises(ValueError, match="covers"):
        model(long.tokens, significance=long.significance)


def test_ids_need_the_layout() -> None:
    model = _model("coupled")
    batch = T.make_batch("add-reversed", 3, 2, torch.Generator())
    with pytest.raises(ValueError, match="significance"):
        model(batch.tokens)
    with pytest.raises(ValueError, match="columns"):
        model(batch.tokens, significance=batch.significance[:, :-1])


def test_encodings_refuse_what_they_cannot_read() -> None:
    with pytest.raises(ValueError, match="no position is read"):
        Encoding("randomized-nope", "", random_positions=True)
    with pytest.raises(ValueError, match="learned table"):
        Encoding("x", "", ids="abacus")
    with pytest.raises(ValueError, match="ids"):
        Encoding("x", "", absolute="learned", ids="roman")
    assert not lookup("abacus").context_parallel


def test_models_with_ids_survive_copies_and_the_meta_device(tmp_path) -> None:  # type: ignore[no-untyped-def]
    model = _model("coupled")
    batch = T.make_batch("add-reversed", 3, 2, torch.Generator())
    model.eval()
    with torch.no_grad():
        want = model(batch.tokens, significance=batch.significance)
        for other in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
            other.eval()
            torch.testing.assert_close(other(batch.tokens, significance=batch.significance), want)
    torch.save(model.state_dict(), tmp_path / "m.pt")
    with torch.device("meta"):
        meta = LabModel(model.config, "coupled")
    assert meta.learned.weight.is_meta


# ------------------------------------------------------------------ the study


def test_the_study_runs_and_writes_its_outputs(tmp_path) -> None:  # type: ignore[no-untyped-def]
    config = arithmetic.ArithmeticConfig(
        entries=("coupled", "abacus", "nope"), train_len=3, test_len=8, seeds=2, steps=3,
        batch_size=4, d_model=16, layers=1, heads=2, eval_examples=4,
    )  # fmt: skip
    doc = arithmetic.run_arithmetic(config, tmp_path, workers=1, progress=False)
    saved = json.loads((tmp_path / "arithmetic.json").read_text())
    assert saved["accuracy"] == doc["accuracy"]
    assert set(doc["accuracy"]) == {"coupled", "abacus", "nope"}
    assert sorted(int(n) for n in doc["accuracy"]["nope"]) == list(range(1, 9))
    for by_len in doc["accuracy"].values():
        for v in by_len.values():
            assert 0 <= v["min"] <= v["mean"] <= v["max"] <= 1
    assert doc["trained_max"] == 3 and doc["seeds"] == 2 and doc["trained"] == 6
    assert (tmp_path / "arithmetic.svg").read_bytes().startswith(b"<?xml")
    page = (tmp_path / "index.html").read_text()
    assert "lab-arithmetic" in page and "653 + 49" in page
    # a rerun trains nothing
    again = arithmetic.run_arithmetic(config, tmp_path, workers=1, progress=False)
    assert again["trained"] == 0 and again["accuracy"] == doc["accuracy"]
    table = arithmetic.markdown(doc)
    assert table.splitlines()[0].startswith("| encoding |") and "coupled" in table


def test_summaries_are_means_over_seeds_with_their_spread() -> None:
    from posenc.faces.lab.training import Record

    config = arithmetic.ArithmeticConfig(entries=("rope",), train_len=2, test_len=5, seeds=2)
    records = {"add-reversed": [
        Record("add-reversed", "rope", s, n, "accuracy", v)
        for s, values in enumerate(([1, 1, 0.9, 0.5, 0.0], [1, 0.8, 1.0, 0.7, 0.2]))
        for n, v in zip(range(1, 6), values, strict=True)
    ]}  # fmt: skip
    doc = arithmetic.summarize(records, config)
    assert doc["accuracy"]["rope"]["2"] == {"mean": 0.9, "min": 0.8, "max": 1.0}
    assert doc["reach"]["rope"] == 3  # lengths 1-3 at 0.9 or more, 4 not
    assert doc["goal"]["length"] == 5 and doc["goal"]["reached_by"] == []


def test_the_id_table_shows_every_scheme() -> None:
    rows = arithmetic.id_table()
    assert rows["token"][:5] == ["BOS", "6", "5", "3", "+"]
    assert rows["coupled"][1:-1] == [2, 3, 4, 5, 2, 3, 4, 5, 4, 3, 2, 1]
    assert len({len(v) for v in rows.values()}) == 1
    with pytest.raises(ValueError, match="task"):
        arithmetic.id_table(task="copy")
    with pytest.raises(ValueError, match="numbers"):
        arithmetic.id_table((1,), "add-reversed")


def test_bad_configs_are_refused() -> None:
    with pytest.raises(ValueError, match="entry"):
        arithmetic.ArithmeticConfig(entries=("roman",))
    with pytest.raises(ValueError, match="test_len"):
        arithmetic.ArithmeticConfig(train_len=10, test_len=10)
    with pytest.raises(TypeError, match="ArithmeticConfig"):
        arithmetic.run_arithmetic({"steps": 1})  # type: ignore[arg-type]
    assert replace(arithmetic.quick_config(), seeds=3, steps=4000) == arithmetic.ArithmeticConfig()


def test_every_study_line_names_a_registered_encoding_and_format() -> None:
    for entry in arithmetic.STUDY:
        lookup(entry.encoding)
        assert entry.task in FORMATS


def test_the_lab_guide_and_the_bundled_study_agree() -> None:
    from pathlib import Path

    doc = arithmetic.bundled()
    assert doc is not None, "posenc/faces/data/lab-arithmetic.json is bundled"
    assert doc["seeds"] == 3 and doc["trained_max"] == 10 and doc["tested_max"] == 40
    readme = (Path(__file__).parents[1] / "docs" / "guides" / "lab.md").read_text()
    block = readme.split("<!-- arithmetic-table -->")[1]
    assert arithmetic.markdown(doc) in block
    assert arithmetic.id_markdown(arithmetic.id_table()) in readme


def test_the_command_runs_and_refuses_unknown_lines(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from posenc.faces.cli import main

    tiny = ["--train-len", "2", "--test-len", "4", "--steps", "2", "--seeds", "1",
            "--batch-size", "4", "--d-model", "16", "--layers", "1", "--heads", "2",
            "--eval-examples", "2", "--workers", "1", "--no-progress",
            "--out", str(tmp_path)]  # fmt: skip
    assert main(["lab", "arithmetic", "--entries", "coupled,nope", *tiny]) == 0
    out = capsys.readouterr().out
    assert "coupled" in out and "nope" in out and "abacus" not in out
    assert json.loads((tmp_path / "arithmetic.json").read_text())["tested_max"] == 4
    assert main(["lab", "arithmetic", "--entries", "roman", *tiny]) == 2
    assert "roman" in capsys.readouterr().err


def test_the_readme_block_is_replaced_between_its_markers() -> None:
    doc = arithmetic.bundled()
    assert doc is not None
    marker = arithmetic.README_MARKER
    text = f"before\n{marker}\nold table\n{marker}\nafter\n"
    new = arithmetic.readme(text, doc)
    assert new.startswith(f"before\n{marker}\n| encoding |")
    assert new.endswith(f"{marker}\nafter\n")
    assert "old table" not in new
    with pytest.raises(ValueError, match="block"):
        arithmetic.readme("no markers", doc)


def test_huge_batches_fail_before_any_work(monkeypatch: pytest.MonkeyPatch) -> None:
    from posenc.core import checks

    monkeypatch.setattr(checks, "MAX_ELEMENTS", 10_000)
    # refused by size (drawing 8 numbers of 100000 digits would be the work)
    with pytest.raises(ValueError, match=r"8 examples at n=2000 would hold"):
        T.make_batch("add-reversed", 2000, 8, torch.Generator())
    with pytest.raises(ValueError, match="at most 4000 digits"):
        T.make_batch("add-reversed", 10**9, 1, torch.Generator())
    # the widest sum, counted without writing it out
    assert FORMATS["add-3"].answer_width((5000, 5000, 5000)) == 5001
    assert FORMATS["add-reversed"].answer_width((3, 1)) == 4
