"""posenc lab suite: the mean reciprocal rank of Kazemnejad et al. (2023) and the suite's files."""

from __future__ import annotations

import json
from dataclasses import replace
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.faces.cli import main
from posenc.faces.lab import suite as S
from posenc.faces.lab.suite import (
    PAPER_MRR,
    STUDY,
    SuiteConfig,
    SuiteSplit,
    mean_reciprocal_rank,
    reciprocal_ranks,
    run_suite,
)

#: torch on one thread here (conftest.one_torch_thread): the lab's ops are tiny, and on
#: cores shared with other processes two OpenMP threads made them several times slower
pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY = SuiteConfig(
    tasks=(SuiteSplit("copy", 2, 4), SuiteSplit("addition", 1, 2)), seeds=2, steps=2,
    batch_size=4, d_model=8, layers=1, heads=2, eval_examples=2,
)  # fmt: skip


def _reference_rank(values: list[float], i: int, ties: str) -> Fraction:
    """The rank of entry ``i`` written from its definition: 1 + the entries above it, plus,
    among equal entries, those listed before it ("first", pandas' order of appearance) or
    half of the others ("average", the mean of the ranks the tied group spans)."""
    above = sum(v > values[i] for v in values)
    if ties == "first":
        return Fraction(1 + above + sum(v == values[i] for v in values[:i]))
    equal = sum(v == values[i] for v in values)
    return Fraction(1 + above) + Fraction(equal - 1, 2)


# ------------------------------------------------------------------ reciprocal ranks


def test_distinct_accuracies_rank_best_first():
    assert reciprocal_ranks({"a": 0.9, "b": 0.1, "c": 0.5}) == {"a": 1.0, "b": 1 / 3, "c": 0.5}


def test_ties_go_to_the_encoding_listed_first_as_the_notebook_does():
    # pandas: Series([1, 2, 3, 1]).rank(method="first", ascending=False) is [3, 2, 1, 4]
    column = {"w": 1.0, "x": 2.0, "y": 3.0, "z": 1.0}
    assert reciprocal_ranks(column) == {"w": 1 / 3, "x": 1 / 2, "y": 1.0, "z": 1 / 4}
    # the order given, not the column's, breaks the tie
    order = ["z", "y", "x", "w"]
    assert reciprocal_ranks(column, order) == {"z": 1 / 3, "y": 1.0, "x": 1 / 2, "w": 1 / 4}
    # every encoding at zero (nothing generalises): ranks 1 .. n in the listed order
    zeros = dict.fromkeys(STUDY, 0.0)
    assert list(reciprocal_ranks(zeros).values()) == [1, 1 / 2, 1 / 3, 1 / 4, 1 / 5]


def test_averaged_ties_share_their_mean_rank():
    # pandas' method="average": [3.5, 2, 1, 3.5]
    column = {"w": 1.0, "x": 2.0, "y": 3.0, "z": 1.0}
    assert reciprocal_ranks(column, ties="average") == {"w": 1 / 3.5, "x": 0.5, "y": 1.0,
                                                        "z": 1 / 3.5}  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0]), min_size=1, max_size=7),
    st.sampled_from(["first", "average"]),
)
def test_ranks_match_their_definition(values, ties):
    names = [f"e{i}" for i in range(len(values))]
    got = reciprocal_ranks(dict(zip(names, values, strict=True)), ties=ties)
    for i, name in enumerate(names):
        # 1/rank of a rank that is an integer or a half: float division is correctly rounded
        assert got[name] == 1 / float(_reference_rank(values, i, ties))
    if ties == "first":  # a permutation of 1 .. n
        assert sorted(round(1 / v) for v in got.values()) == list(range(1, len(values) + 1))


def test_mean_reciprocal_rank_by_hand():
    columns = {
        "copy/0": {"nope": 1.0, "t5": 0.5, "alibi": 0.0},  # 1, 1/2, 1/3
        "copy/1": {"nope": 0.0, "t5": 0.5, "alibi": 0.0},  # t5 1; nope 1/2 (first); alibi 1/3
        "sort/0": {"nope": 0.2, "t5": 0.2, "alibi": 0.9},  # alibi 1; nope 1/2; t5 1/3
    }  # fmt: skip
    got = mean_reciprocal_rank(columns)
    expected = {"nope": (1 + 1 / 2 + 1 / 2) / 3, "t5": (1 / 2 + 1 + 1 / 3) / 3,
                "alibi": (1 / 3 + 1 / 3 + 1) / 3}  # fmt: skip
    assert got == pytest.approx(expected, rel=1e-15, abs=0)  # sums of three terms: a few ulps
    assert list(got) == ["nope", "t5", "alibi"]
    # listing alibi first hands it the ties of the second and third columns
    again = mean_reciprocal_rank(columns, ["alibi", "t5", "nope"])
    assert again["alibi"] == pytest.approx((1 / 3 + 1 / 2 + 1) / 3, rel=1e-15)
    averaged = mean_reciprocal_rank(columns, ties="average")
    assert averaged["nope"] == pytest.approx((1 + 1 / 2.5 + 1 / 2.5) / 3, rel=1e-15)


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda: reciprocal_ranks({"a": 1.0}, ties="min"), "ties"),
        (lambda: reciprocal_ranks({}), "at least one"),
        (lambda: reciprocal_ranks({"a": float("nan")}), "finite"),
        (lambda: reciprocal_ranks({"a": "high"}), "real number"),
        (lambda: reciprocal_ranks({"a": 1.0, "b": 0.0}, ["a"]), "each encoding"),
        (lambda: mean_reciprocal_rank({}), "at least one column"),
        (lambda: mean_reciprocal_rank({"c": {"a": 1.0}, "d": {"b": 1.0}}), "column 'd'"),
    ],
)
def test_bad_scores_are_named(call, words):
    with pytest.raises((ValueError, TypeError), match=words):
        call()


# ------------------------------------------------------------------ settings


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda: SuiteSplit("text", 8, 16), "task"),
        (lambda: SuiteSplit("copy", 8, 8), "test_len"),
        (lambda: SuiteConfig(tasks=()), "tasks"),
        (lambda: SuiteConfig(tasks=(SuiteSplit("copy", 2, 4),) * 2), "repeat"),
        (lambda: SuiteConfig(extra=("bogus",)), "encoding"),
        (lambda: SuiteConfig(seeds=0), "seeds"),
        (lambda: SuiteConfig(tasks=(("copy", 2),)), "SuiteSplit"),
        (lambda: run_suite(TINY, quick=True), "quick"),
    ],
)
def test_bad_options_are_named(make, words):
    with pytest.raises((ValueError, TypeError), match=words):
        make()


def test_the_five_come_first_and_extras_follow_once():
    config = SuiteConfig(tasks=TINY.tasks, extra=("fox", "rope", "fox"))
    assert config.encodings == (*STUDY, "fox")
    assert set(PAPER_MRR) == set(STUDY)
    quick = S.quick_config()
    assert quick.encodings == STUDY and len(quick.tasks) < len(SuiteConfig().tasks)


def test_tasks_are_chosen_by_name_in_the_suites_order():
    assert [t.key for t in S.select_tasks(["sort", "copy", "sort"])] == [
        "copy_tr20_ts40", "sort_tr8_ts16",
    ]  # fmt: skip
    assert S.quick_config().tasks == S.select_tasks(["copy", "sort"])
    # the quick run's models are the full suite's: same settings apart from tasks and seeds
    assert replace(S.quick_config(), tasks=SuiteConfig().tasks, seeds=3) == SuiteConfig()
    with pytest.raises(ValueError, match="at least one"):
        S.select_tasks([])
    with pytest.raises(TypeError, match="sequence of task names"):
        S.select_tasks("copy")


def test_the_suite_is_the_labs_table(monkeypatch):
    from types import SimpleNamespace

    from posenc.faces.lab import names

    assert S.suite_tasks() == tuple(
        SuiteSplit(t.task, t.train_len, t.test_len) for t in names.SUITE
    )
    entry = SimpleNamespace(task="reverse", label="Reverse", train_len=3, test_len=6)
    monkeypatch.setattr(names, "SUITE", (entry,))
    assert S.suite_tasks() == (SuiteSplit("reverse", 3, 6),)
    config = SuiteConfig(tasks=[entry, ("copy", 2, 4)])
    assert config.tasks == (SuiteSplit("reverse", 3, 6), SuiteSplit("copy", 2, 4))


# ------------------------------------------------------------------ the suite end to end


def test_a_tiny_suite_writes_its_score_and_page_and_reruns_from_the_cache(tmp_path):
    result = run_suite(TINY, tmp_path, workers=1, progress=False)
    assert result.trained == len(TINY.tasks) * TINY.seeds * len(STUDY)
    doc = json.loads((tmp_path / "suite.json").read_text())
    assert set(doc) == {
        "settings", "ties", "mrr", "mrr_by_seed", "mrr_spread", "mrr_study",
        "mrr_ties_averaged", "paper", "columns", "within", "accuracy", "seconds", "trained",
    }  # fmt: skip
    assert list(doc["mrr"]) == list(STUDY) and doc["ties"] == "first"
    assert doc["settings"]["tasks"][0] == {"task": "copy", "train_len": 2, "test_len": 4}
    # every accuracy: per split, encoding, seed and length 1 .. test_len
    keys = {(a["split"], a["encoding"], a["seed"], a["length"]) for a in doc["accuracy"]}
    assert keys == {
        (t.key, e, s, n) for t in TINY.tasks for e in STUDY for s in range(2)
        for n in range(1, t.test_len + 1)
    }  # fmt: skip
    # a column per (task, split, seed), scored on the lengths beyond training
    assert [(c["split"], c["seed"]) for c in doc["columns"]] == [
        (t.key, s) for t in TINY.tasks for s in range(2)
    ]
    first = doc["columns"][0]
    tested = [a["accuracy"] for a in doc["accuracy"] if a["split"] == "copy_tr2_ts4"
              and a["encoding"] == "nope" and a["seed"] == 0 and a["length"] > 2]  # fmt: skip
    assert first["accuracy"]["nope"] == pytest.approx(sum(tested) / len(tested), rel=1e-15)
    assert first["reciprocal_rank"] == reciprocal_ranks(first["accuracy"], STUDY)
    # and, apart from the ranking, how well each model learned the trained lengths
    trained = [a["accuracy"] for a in doc["accuracy"] if a["split"] == "copy_tr2_ts4"
               and a["encoding"] == "t5" and a["seed"] == 1 and a["length"] <= 2]  # fmt: skip
    second = doc["columns"][1]
    assert second["within"]["t5"] == pytest.approx(sum(trained) / len(trained), rel=1e-15)
    assert doc["within"]["copy_tr2_ts4"]["t5"] == pytest.approx(
        (first["within"]["t5"] + second["within"]["t5"]) / 2, rel=1e-15
    )
    table = {f"{c['split']}/{c['seed']}": c["accuracy"] for c in doc["columns"]}
    assert doc["mrr"] == mean_reciprocal_rank(table, STUDY)
    assert doc["mrr_study"] == doc["mrr"]
    # the per-seed MRRs average to the MRR (each seed has as many columns)
    for e in STUDY:
        assert sum(doc["mrr_by_seed"][e]) / 2 == pytest.approx(doc["mrr"][e], rel=1e-14)
        assert doc["mrr_spread"][e]["min"] <= doc["mrr"][e] <= doc["mrr_spread"][e]["max"]
    page = (tmp_path / "index.html").read_text()
    assert "data:image/svg+xml;base64," in page and "0.687" in page and "nope" in page
    assert "Did each model learn its task?" in page
    zero = sum(max(c["accuracy"].values()) == 0 for c in doc["columns"])
    assert (f"In {zero} of the 4 columns every encoding scores 0" in page) == (zero > 0)
    for t in TINY.tasks:
        assert (tmp_path / t.key / "results.json").exists()

    again = run_suite(TINY, tmp_path, workers=1, progress=False)
    assert again.trained == 0
    redo = json.loads((tmp_path / "suite.json").read_text())
    for key in ("mrr", "columns", "accuracy"):
        assert redo[key] == doc[key]


def test_one_seed_has_no_spread_and_extras_are_ranked_apart(tmp_path):
    config = SuiteConfig(tasks=TINY.tasks[:1], extra=("learned",), seeds=1, steps=1,
                         batch_size=2, d_model=8, layers=1, heads=2, eval_examples=1)  # fmt: skip
    doc = run_suite(config, tmp_path, workers=1, progress=False).doc
    assert doc["mrr_spread"] is None
    assert list(doc["mrr"]) == [*STUDY, "learned"] and list(doc["mrr_study"]) == list(STUDY)
    column = doc["columns"][0]["accuracy"]
    assert doc["mrr_study"] == reciprocal_ranks({e: column[e] for e in STUDY}, STUDY)


# ------------------------------------------------------------------ the command


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--seeds", "0"], "--seeds"),
        (["--encodings", "nope,bogus"], "encoding"),
        (["--device", "tpu"], "--device"),
        (["--workers", "0"], "--workers"),
        (["--steps", "0"], "--steps"),
        (["--tasks", "copy,bogus"], "tasks"),
        (["--tasks", "text"], "tasks"),
    ],
)
def test_bad_options_end_with_one_line(tmp_path, capsys, argv, words):
    assert main(["lab", "suite", *argv, "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and words in err and "Traceback" not in err
    assert not (tmp_path / "x" / "suite.json").exists()


def test_the_command_prints_the_score_beside_the_papers(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(S, "quick_config", lambda: replace(TINY, tasks=TINY.tasks[:1], seeds=1))
    assert main(["lab", "suite", "--quick", "--workers", "1", "--no-progress",
                 "--out", str(tmp_path)]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    assert "0.687" in printed and "page:" in printed and (tmp_path / "index.html").exists()


def test_the_command_takes_the_tasks_and_sizes(tmp_path, capsys):
    argv = ["lab", "suite", "--tasks", "copy", "--seeds", "1", "--steps", "1", "--batch-size",
            "2", "--d-model", "8", "--layers", "1", "--heads", "2", "--eval-examples", "1",
            "--lr", "0.01", "--workers", "1", "--no-progress", "--out", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    settings = json.loads((tmp_path / "suite.json").read_text())["settings"]
    assert [t["task"] for t in settings["tasks"]] == ["copy"]
    given = {
        "seeds": 1, "steps": 1, "batch_size": 2, "d_model": 8, "layers": 1, "heads": 2,
        "eval_examples": 1, "lr": 0.01,
    }  # fmt: skip
    assert {k: settings[k] for k in given} == given
