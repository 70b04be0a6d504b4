"""The lab's image-grid study: the task, the 2-D encodings' registry, training, the command."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from posenc.faces.lab import grid
from posenc.faces.lab.grid_tasks import (
    DIRECTIONS,
    DISTRACTORS,
    FIRST,
    SECOND,
    VOCAB,
    directions,
    distances,
    make_grids,
)

#: torch on one thread here (conftest.one_torch_thread): the models are tiny, and on
#: shared cores a second OpenMP thread makes every op wait at its barrier
pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).resolve().parents[1]
# a model small enough for a test: head_dim 16 (RoPE-Mixed and DINOv3 need a multiple of 4)
TINY = grid.GridConfig(
    encodings=("none", "axial"), train_grid=4, test_grids=(4, 6), seeds=2, steps=2,
    batch_size=4, d_model=32, layers=1, heads=2, eval_examples=8,
)  # fmt: skip


def _grid(height: int, width: int, first: tuple[int, int], second: tuple[int, int]) -> torch.Tensor:
    cells = torch.zeros(height, width, dtype=torch.long)
    cells[first], cells[second] = FIRST, SECOND
    return cells.flatten()


# ------------------------------------------------------------------ the task


@pytest.mark.parametrize(
    ("first", "second", "direction"),
    [((2, 1), (2, 4), "right"), ((0, 4), (0, 0), "left"), ((1, 3), (4, 3), "below"),
     ((3, 0), (2, 0), "above")],
)  # fmt: skip
def test_hand_made_grids_have_their_direction(first, second, direction) -> None:  # type: ignore[no-untyped-def]
    tokens = _grid(5, 5, first, second)[None]
    assert DIRECTIONS[int(directions(tokens, 5, 5)[0])] == direction


def test_hand_made_grids_that_break_the_rule_are_refused() -> None:
    with pytest.raises(ValueError, match="row or a column"):
        directions(_grid(3, 3, (0, 0), (1, 1))[None], 3, 3)
    with pytest.raises(ValueError, match="exactly one"):
        directions(torch.zeros(1, 9, dtype=torch.long), 3, 3)
    with pytest.raises(ValueError, match="tokens"):
        directions(torch.zeros(1, 8, dtype=torch.long), 3, 3)


@pytest.mark.parametrize(("height", "width"), [(8, 8), (12, 12), (16, 16), (2, 5), (7, 3)])
def test_generated_grids_are_labelled_by_the_rule(height: int, width: int) -> None:
    tokens, labels = make_grids(height, width, 200, torch.Generator().manual_seed(height))
    assert tokens.shape == (200, height * width) and tokens.dtype == torch.long
    assert int(tokens.min()) >= 0 and int(tokens.max()) < VOCAB
    assert ((tokens == FIRST).sum(1) == 1).all() and ((tokens == SECOND).sum(1) == 1).all()
    assert ((tokens < DISTRACTORS).sum(1) == height * width - 2).all()
    assert torch.equal(directions(tokens, height, width), labels)


def test_the_draws_are_seeded_balanced_and_reach_every_distance() -> None:
    a = make_grids(8, 8, 64, torch.Generator().manual_seed(3))
    b = make_grids(8, 8, 64, torch.Generator().manual_seed(3))
    c = make_grids(8, 8, 64, torch.Generator().manual_seed(4))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[0], c[0])
    tokens, labels = make_grids(16, 16, 4000, torch.Generator().manual_seed(0))
    shares = torch.bincount(labels, minlength=4) / 4000
    assert (shares - 0.25).abs().max() < 0.03  # 4000 draws: a share's std is 0.007
    # every distance up to the side, beyond the 7 an 8 x 8 grid holds
    assert set(distances(tokens, 16).tolist()) == set(range(1, 16))


def test_distances_of_hand_made_grids() -> None:
    tokens = torch.stack([_grid(5, 6, (2, 1), (2, 5)), _grid(5, 6, (4, 3), (0, 3)),
                          _grid(5, 6, (0, 0), (0, 1))])  # fmt: skip
    assert distances(tokens, 6).tolist() == [4, 4, 1]


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="height"):
        make_grids(1, 8, 4, torch.Generator())
    with pytest.raises(ValueError, match="batch"):
        make_grids(8, 8, 0, torch.Generator())


# ------------------------------------------------------------------ the encodings


@pytest.mark.parametrize("name", list(grid.ENCODINGS))
def test_every_encoding_builds_and_runs_at_two_grid_sizes(name: str) -> None:
    torch.manual_seed(0)
    net = grid.model(name, replace(TINY, encodings=(name,), layers=2))
    for side in (4, 7):
        tokens, labels = make_grids(side, side, 3, torch.Generator().manual_seed(side))
        net.train()
        loss = torch.nn.functional.cross_entropy(net(tokens, side, side), labels)
        loss.backward()
        assert torch.isfinite(loss)
        net.eval()
        logits = net(tokens, side, side)
        assert logits.shape == (3, len(DIRECTIONS)) and torch.isfinite(logits).all()
    # each layer has its own rotation module (its own parameters where it learns any)
    assert net.blocks[0].rotation is not net.blocks[1].rotation


def test_only_the_rotation_tells_the_cells_apart() -> None:
    # none: permuting the cells leaves the logits (the encoder is permutation-invariant);
    # axial: it does not
    tokens, _ = make_grids(5, 5, 2, torch.Generator().manual_seed(1))
    order = torch.randperm(25, generator=torch.Generator().manual_seed(2))
    for name, invariant in (("none", True), ("axial", False)):
        torch.manual_seed(0)
        net = grid.model(name, TINY).eval()
        with torch.no_grad():
            same = torch.allclose(net(tokens, 5, 5), net(tokens[:, order], 5, 5), atol=1e-5)
        assert same is invariant, name


def test_the_registry_and_the_config_refuse_unknown_names() -> None:
    with pytest.raises(ValueError, match="encoding"):
        grid.GridConfig(encodings=("polar",))
    with pytest.raises(ValueError, match="encoding"):
        grid.model("polar", TINY)
    with pytest.raises(ValueError, match="repeat"):
        grid.GridConfig(encodings=("axial", "axial"))
    with pytest.raises(ValueError, match="test_grids"):
        grid.GridConfig(test_grids=(8, 1))
    with pytest.raises(ValueError, match="d_model"):
        grid.GridConfig(d_model=30, heads=4)
    with pytest.raises(TypeError, match="GridConfig"):
        grid.run_grid({"steps": 1})  # type: ignore[arg-type]
    assert replace(grid.QUICK, seeds=3) == grid.GridConfig()


# ------------------------------------------------------------------ training and the study


def test_training_is_deterministic_per_seed_and_leaves_the_global_rng() -> None:
    state = torch.random.get_rng_state()
    _, a = grid.train("axial", 0, TINY)
    _, b = grid.train("axial", 0, TINY)
    _, c = grid.train("axial", 1, TINY)
    assert a == b and a != c and len(a) == TINY.steps
    assert torch.equal(torch.random.get_rng_state(), state)


def test_the_study_runs_writes_and_reads_back(tmp_path: Path) -> None:
    doc = grid.run_grid(TINY, tmp_path, workers=1, progress=False)
    saved = json.loads((tmp_path / "grid.json").read_text())
    assert saved["accuracy"] == doc["accuracy"]
    assert set(doc["accuracy"]) == {"none", "axial"} and doc["test_grids"] == [4, 6]
    for by_side in doc["accuracy"].values():
        assert set(by_side) == {"4", "6"}
        for v in by_side.values():
            assert len(v["values"]) == 2
            assert 0 <= v["min"] <= v["mean"] <= v["max"] <= 1
            assert v["mean"] == pytest.approx(sum(v["values"]) / 2)
    assert doc["trained"] == 4 and doc["seeds"] == 2 and doc["chance"] == 0.25
    for field in ("final_loss", "cpu_seconds"):
        assert [len(doc[field][e]) for e in ("none", "axial")] == [2, 2]
    # on the 4 x 4 grid every pair is near (under 4 cells apart); on 6 x 6 some are not
    assert doc["by_distance"]["axial"]["4"]["far"] is None
    far = doc["by_distance"]["axial"]["6"]["far"]
    assert far is not None and len(far["values"]) == 2
    assert (tmp_path / "grid.svg").read_bytes().startswith(b"<?xml")
    again = grid.run_grid(TINY, tmp_path, workers=1, progress=False)
    assert again["trained"] == 0 and again["accuracy"] == doc["accuracy"]
    table = grid.markdown(doc)
    assert table.splitlines()[0] == "| encoding | 4x4 | 6x6 |" and "| axial |" in table
    assert "| encoding | 6x6, < 4 apart | 6x6, >= 4 apart |" in table


def test_the_command_runs_and_refuses_unknown_encodings(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    from posenc.faces.cli import main

    tiny = ["--steps", "1", "--seeds", "1", "--batch-size", "2", "--d-model", "16",
            "--layers", "1", "--heads", "1", "--eval-examples", "2", "--workers", "1",
            "--no-progress", "--out", str(tmp_path)]  # fmt: skip
    assert main(["lab", "grid", "--quick", "--encodings", "none", *tiny]) == 0
    out = capsys.readouterr().out
    assert "none" in out and "16x16" in out and "axial" not in out
    doc = json.loads((tmp_path / "grid.json").read_text())
    assert doc["seeds"] == 1 and doc["settings"]["steps"] == 1
    assert main(["lab", "grid", "--encodings", "polar", *tiny]) == 2
    assert "polar" in capsys.readouterr().err


# ------------------------------------------------------------------ the bundled run


def test_the_bundled_study_has_every_encoding_and_grid_and_the_guide_shows_it() -> None:
    doc = grid.bundled()
    assert doc is not None, "posenc/faces/data/lab-grid.json is bundled"
    assert list(doc["accuracy"]) == list(grid.ENCODINGS)
    assert doc["seeds"] == 3 and doc["train_grid"] == 8 and doc["test_grids"] == [8, 12, 16]
    for by_side in doc["accuracy"].values():
        assert set(by_side) == {"8", "12", "16"}
        assert all(len(v["values"]) == 3 for v in by_side.values())
    guide = (ROOT / grid.GUIDE).read_text()
    assert grid.markdown(doc) in guide.split(grid.MARKER)[1]
    assert (ROOT / "docs" / "lab-grid.png").is_file()
    with pytest.raises(ValueError, match="grid table"):
        grid.readme("no markers here", doc)
