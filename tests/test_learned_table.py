"""The explainer's learned table: bundled, equal to a fresh training, trained only when asked."""

from __future__ import annotations

import inspect
import json
from importlib import resources

import numpy as np
import pytest

from posenc.faces import learned_table, report
from posenc.integration import analysis


def test_the_regenerate_command_writes_the_bundled_file_byte_for_byte(tmp_path, capsys):
    # `python -m posenc.faces.learned_table OUT` trains the run now (seed 0, on this CPU):
    # training is deterministic, so its file is the bundled one, and so is its table
    out = tmp_path / "learned-table.json"
    assert learned_table.main([str(out)]) == 0
    assert str(out) in capsys.readouterr().out
    bundled_file = resources.files("posenc.faces") / "data" / learned_table.BUNDLED
    assert out.read_text() == bundled_file.read_text()
    fresh, bundled = learned_table.read(json.loads(out.read_text())), learned_table.bundled()
    assert np.array_equal(fresh.table, bundled.table) and fresh.accuracy == bundled.accuracy
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # no temporary file left


def test_the_bundled_run_is_train_learned_at_its_defaults():
    defaults = {
        name: p.default for name, p in inspect.signature(analysis.train_learned).parameters.items()
    }
    assert dict(learned_table.SETTINGS) == defaults
    run = learned_table.bundled()
    assert run.table.shape == (32, 32) and run.table.dtype == np.float64
    assert np.isfinite(run.table).all() and run.steps == 300 and run.seconds == 0.0
    assert run.accuracy > 0.9  # it learned the task: copying needs the positions
    # the entries are float32 values, written and read back exactly
    assert np.array_equal(run.table.astype(np.float32).astype(np.float64), run.table)


def test_trained_reads_the_bundled_run_at_its_settings_and_trains_others(monkeypatch):
    calls = []

    def train(**settings):
        calls.append(settings)
        return learned_table.bundled()

    monkeypatch.setattr(learned_table, "train_learned", train)
    assert learned_table.trained().seconds == 0.0
    assert learned_table.trained(steps=300, length=32, dim=32) is not None
    assert calls == []
    learned_table.trained(steps=5)
    learned_table.trained(length=8, dim=16)
    assert calls == [
        {**learned_table.SETTINGS, "steps": 5},
        {**learned_table.SETTINGS, "length": 8, "dim": 16},
    ]
    with pytest.raises(TypeError, match="unknown settings: width"):
        learned_table.trained(width=3)


def test_read_refuses_a_document_that_is_not_a_run():
    doc = learned_table.document(learned_table.bundled(), learned_table.SETTINGS)
    assert np.array_equal(learned_table.read(doc).table, learned_table.bundled().table)
    with pytest.raises(ValueError, match="'table'"):
        learned_table.read({k: v for k, v in doc.items() if k != "table"})
    with pytest.raises(ValueError, match="not length x dim"):
        learned_table.read({**doc, "table": doc["table"][:3]})


@pytest.mark.parametrize(("steps", "trains"), [(None, False), (300, False), (7, True)])
def test_report_trains_only_for_other_steps(tmp_path, monkeypatch, steps, trains):
    # the sections and figures are not what is checked here: none is built
    seen, calls = [], []
    monkeypatch.setattr(report, "_sections", lambda inputs: seen.append(inputs) or [])

    def train(steps):
        calls.append(steps)
        return learned_table.bundled()

    monkeypatch.setattr(report.analysis, "train_learned", train)
    messages = []
    options = {} if steps is None else {"train_steps": steps}
    report.build(tmp_path / "r", dim=8, length=4, progress=messages.append, **options)
    assert calls == ([steps] if trains else [])
    assert seen[0].learned_bundled is not trains
    said = "training a learned table" if trains else "reading the bundled learned table"
    assert said in messages
