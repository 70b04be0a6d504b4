"""The engines' user cache: where each build lives, when it is reused, what a failure leaves.

A fake engine stands in for the real ones: its recipe makes ``bin/python`` a link to
this Python and counts its runs in a file outside the cache, so the tests see how many
times a build really ran. The real recipes are checked for what the cache reads of
them (they exist, bash parses them, their key names the files they depend on).
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from posenc.faces.cli import main
from posenc.integration.analysis import engine_cache, engines
from posenc.integration.analysis.engines import ENGINES, Engine

RECIPE = """#!/usr/bin/env bash
# a fake engine: its Python is a link to the suite's
set -euo pipefail
dest=$1
rm -rf "$dest"
echo run >> "{runs}"
sleep "{sleep}"
[ "{fail}" = 0 ] || {{ echo "pip: no matching distribution for fake==1"; exit 3; }}
mkdir -p "$dest/bin"
ln -s "$PYTHON" "$dest/bin/python"
"""


def fake(tmp_path: Path, *, fail: int = 0, sleep: float = 0, pins: str = "fake==1\n") -> Engine:
    """An engine whose recipe lives in ``tmp_path/recipes``, counting its runs in ``runs``."""
    recipes = tmp_path / "recipes"
    recipes.mkdir(exist_ok=True)
    runs = tmp_path / "runs"
    (recipes / "fake.sh").write_text(RECIPE.format(runs=runs, sleep=sleep, fail=fail))
    (recipes / "fake.txt").write_text(pins)
    return Engine("fake", Path(sys.executable), recipes=recipes)


def runs(tmp_path: Path) -> int:
    path = tmp_path / "runs"
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("POSENC_ENGINES", str(root))
    return root


# --------------------------------------------------------------------------------------
# where


def test_the_cache_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("POSENC_ENGINES", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert engine_cache.cache_root() == tmp_path / "home" / ".cache" / "posenc" / "engines"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert engine_cache.cache_root() == tmp_path / "xdg" / "posenc" / "engines"
    # the XDG base directory spec: a relative path is invalid and ignored
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    assert engine_cache.cache_root() == tmp_path / "home" / ".cache" / "posenc" / "engines"
    monkeypatch.setenv("POSENC_ENGINES", str(tmp_path / "mine"))
    assert engine_cache.cache_root() == tmp_path / "mine"


def test_posenc_rope_looks_in_the_cache(cache: Path) -> None:
    for name, engine in ENGINES.items():
        python = engines.engine_python(name)
        assert python == cache / f"{name}-{engine_cache.key(engine)}" / "bin" / "python"
    assert engines.engine_python("mlx", {"mlx": "/my/python"}) == Path("/my/python")


# --------------------------------------------------------------------------------------
# the key


def test_the_key_follows_the_pins_not_the_comments(tmp_path: Path) -> None:
    engine = fake(tmp_path)
    first = engine_cache.key(engine)
    assert len(first) == 12 and int(first, 16) >= 0
    # a comment, a blank line or trailing spaces change nothing
    engine.pins.write_text("# the fake engine's pins\n\nfake==1   \n")
    recipe = engine.recipe.read_text()
    engine.recipe.write_text(recipe.replace("# a fake engine", "# a fake engine, reworded"))
    assert engine_cache.key(engine) == first
    # near misses: one pin, one command, one compiled source
    engine.pins.write_text("fake==2\n")
    assert engine_cache.key(engine) != first
    engine.pins.write_text("fake==1\n")
    engine.recipe.write_text(recipe.replace("mkdir -p", "mkdir -pv"))
    assert engine_cache.key(engine) != first
    engine.recipe.write_text(recipe)
    assert engine_cache.key(engine) == first
    source = tmp_path / "driver.c"
    source.write_text("int main(void) { return 0; }\n")
    with_source = Engine("fake", engine.reader, recipes=engine.recipes, sources=(source,))
    keyed = engine_cache.key(with_source)
    assert keyed != first
    source.write_text("int main(void) { return 1; }\n")
    assert engine_cache.key(with_source) != keyed


# --------------------------------------------------------------------------------------
# building


def test_a_build_is_reused(tmp_path: Path, cache: Path) -> None:
    engine = fake(tmp_path)
    built = engine_cache.build(engine)
    assert built.built_now and runs(tmp_path) == 1
    assert built.path == engine_cache.directory(engine) and built.path.parent == cache
    assert (built.path / "bin" / "python").resolve() == Path(sys.executable).resolve()
    record = engine_cache.record(engine)
    assert record is not None and record["key"] == engine_cache.key(engine)
    again = engine_cache.build(engine)
    assert not again.built_now and runs(tmp_path) == 1 and again.path == built.path
    forced = engine_cache.build(engine, force=True)
    assert forced.built_now and runs(tmp_path) == 2
    # a new pin is a new directory, built anew; the old one stays until cleaned
    engine.pins.write_text("fake==2\n")
    newer = engine_cache.build(engine)
    assert newer.built_now and runs(tmp_path) == 3 and newer.path != built.path
    assert built.path.is_dir()


def test_a_failed_build_says_why_and_leaves_nothing_built(tmp_path: Path, cache: Path) -> None:
    engine = fake(tmp_path, fail=1)
    with pytest.raises(engine_cache.BuildError) as caught:
        engine_cache.build(engine)
    message = str(caught.value)
    assert message.startswith("fake: fake.sh exited with status 3")
    assert "no matching distribution for fake==1" in message  # the log's tail
    assert not engine_cache.directory(engine).exists() and engine_cache.record(engine) is None
    # the recipe fixed, the next build starts over and succeeds
    fixed = fake(tmp_path)
    assert engine_cache.build(fixed).built_now and runs(tmp_path) == 2


def test_a_stopped_build_is_not_taken_for_a_built_one(tmp_path: Path, cache: Path) -> None:
    engine = fake(tmp_path)
    dest = engine_cache.directory(engine)
    stopped = dest.with_name(dest.name + ".tmp")
    (stopped / "bin").mkdir(parents=True)
    (stopped / "bin" / "python").symlink_to(sys.executable)  # all but the end
    assert engine_cache.record(engine) is None and not engine_cache.python(engine).exists()
    assert engine_cache.build(engine).built_now and not stopped.exists()


def test_two_builds_of_one_engine_wait_for_each_other(tmp_path: Path, cache: Path) -> None:
    engine = fake(tmp_path, sleep=0.5)
    results = []
    threads = [threading.Thread(target=lambda: results.append(engine_cache.build(engine)))
               for _ in range(2)]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert runs(tmp_path) == 1
    assert sorted(r.built_now for r in results) == [False, True]


def test_clean_removes_what_no_pin_names(tmp_path: Path, cache: Path) -> None:
    engine = fake(tmp_path)
    old = engine_cache.build(engine).path
    engine.pins.write_text("fake==2\n")
    current = engine_cache.build(engine).path
    (cache / "notes.txt").write_text("mine")  # not the cache's: left alone
    leftover = cache / "fake-0123456789ab.tmp"
    leftover.mkdir()
    stale = engine_cache.stale([engine])
    assert set(stale) == {old, old.with_name(old.name + ".log"),
                          old.with_name(f".{old.name}.lock"), leftover}  # fmt: skip
    assert engine_cache.remove(stale) > 0
    assert current.is_dir() and not old.exists() and (cache / "notes.txt").exists()
    assert engine_cache.stale([engine]) == []
    # --all: every build
    assert current in engine_cache.stale([])


# --------------------------------------------------------------------------------------
# posenc engines


def test_the_command(tmp_path: Path, cache: Path, monkeypatch, capsys) -> None:
    engine = fake(tmp_path)
    monkeypatch.setitem(ENGINES, "fake", engine)
    assert main(["engines"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"cache: {cache}\n")
    width = max(map(len, ENGINES))  # the names' column: as wide as the longest name
    assert f"  {'fake':<{width}}  not built  {engine_cache.directory(engine)}" in out
    assert main(["engines", "build", "fake"]) == 0
    assert "  fake: built in " in capsys.readouterr().out and runs(tmp_path) == 1
    assert main(["engines", "build", "fake"]) == 0
    assert "  fake: already built, " in capsys.readouterr().out and runs(tmp_path) == 1
    assert main(["engines", "list"]) == 0
    listed = f"  {'fake':<{width}}  built      {engine_cache.directory(engine)}"
    assert listed in capsys.readouterr().out
    engine.pins.write_text("fake==2\n")
    assert main(["engines", "build", "fake"]) == 0 and runs(tmp_path) == 2
    capsys.readouterr()
    assert main(["engines"]) == 0
    assert "3 older builds, logs or locks" in capsys.readouterr().out
    assert main(["engines", "clean"]) == 0
    assert capsys.readouterr().out.count("  removed ") == 3
    assert main(["engines", "clean", "--all"]) == 0
    assert not engine_cache.directory(engine).exists()


def test_the_command_refuses_and_fails_clearly(tmp_path: Path, cache: Path, monkeypatch, capsys):
    assert main(["engines", "build", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("posenc: error: NAMES 'nope': unknown engine 'nope' (accepted: vllm")
    monkeypatch.setitem(ENGINES, "fake", fake(tmp_path, fail=1))
    assert main(["engines", "build", "fake"]) == 1
    err = capsys.readouterr().err
    assert "fake.sh exited with status 3" in err and "no matching distribution" in err


# --------------------------------------------------------------------------------------
# the real recipes


@pytest.mark.parametrize("name", list(ENGINES))
def test_each_engine_has_its_recipe(name: str) -> None:
    engine = ENGINES[name]
    assert engine.recipe.is_file() and engine.pins.is_file()
    assert subprocess.run(["bash", "-n", str(engine.recipe)]).returncode == 0
    for source in engine.sources:
        assert source.name in engine.recipe.read_text()  # what the recipe compiles is keyed
    assert engine.install == f"posenc engines build {name}"
