"""``posenc lab run --task text --data PATH``: your own text, its split, its key, its errors."""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pytest
import torch

from posenc.faces.cli import main
from posenc.faces.lab.tasks import TextCorpus
from posenc.faces.lab.training import LabConfig, config_from, run, text_corpus

#: torch on one thread here (conftest.one_torch_thread): the lab's ops are tiny, and on
#: cores shared with other processes two OpenMP threads made them several times slower
pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY = LabConfig(
    task="text", encodings=("alibi",), train_len=8, test_len=16, seeds=1, steps=2,
    batch_size=4, d_model=16, layers=1, heads=2, eval_examples=2,
)  # fmt: skip

ARGV = [
    "lab", "run", "--task", "text", "--encodings", "alibi", "--train-len", "8",
    "--test-len", "16", "--seeds", "1", "--steps", "2", "--batch-size", "4",
    "--d-model", "16", "--layers", "1", "--heads", "2", "--eval-examples", "2",
    "--no-progress", "--workers", "1", "--device", "cpu",
]  # fmt: skip


def wrong(value: Any) -> Any:
    """``value`` typed as Any: the error tests pass deliberately wrong types."""
    return value


@pytest.fixture
def text_tree(tmp_path: Path) -> tuple[Path, list[bytes]]:
    """12 text files in two directories, and the files a directory read skips."""
    root = tmp_path / "corpus"
    contents = {}
    for i in range(12):
        rel = f"part{i // 6}/doc{i % 6}.txt" if i < 11 else "zz-notes"  # any name counts
        contents[rel] = f"Document {i}: some words, ünïcode too.\n".encode() * (i + 1)
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(contents[rel])
    # skipped: hidden files and directories, empty files, binary-looking files
    (root / ".hidden.txt").write_bytes(b"hidden text\n")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_bytes(b"ref: refs/heads/main\n")
    (root / "part0" / "empty.txt").write_bytes(b"")
    (root / "part0" / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    (root / "part1" / "late-nul.txt").write_bytes(b"x" * 8000 + b"\0 after git's 8000 bytes")
    contents["part1/late-nul.txt"] = b"x" * 8000 + b"\0 after git's 8000 bytes"
    return root, [contents[rel] for rel in sorted(contents, key=lambda r: Path(r).parts)]


def whole_split(corpus: TextCorpus, split: str) -> bytes:
    """A split's bytes, through the public API: one window spanning it."""
    size = corpus.train_bytes if split == "train" else corpus.test_bytes
    window = corpus.windows(split, size - 1, 1)
    return bytes((torch.cat([window.tokens[0], window.targets[0, -1:]]) - 4).tolist())


def test_a_directory_splits_by_file(text_tree):
    root, files = text_tree
    assert len(files) == 13
    corpus = TextCorpus.from_data(root, max_bytes=None)
    # every 10th text file, in sorted path order, is the test split; the rest train
    assert whole_split(corpus, "train") == b"\n".join(f for i, f in enumerate(files) if i != 9)
    assert whole_split(corpus, "test") == files[9]
    assert "train: 12 files" in repr(corpus) and "test: 1 files" in repr(corpus)
    assert repr(corpus).startswith(f"TextCorpus(data={str(root)!r}")
    # the same from a str, and the first max_bytes bytes as TextCorpus keeps them
    assert TextCorpus.from_data(str(root), max_bytes=None).digest == corpus.digest
    cut = TextCorpus.from_data(root, max_bytes=100)
    assert cut.train_bytes + cut.test_bytes == 100 and cut.test_bytes == 0
    assert whole_split(corpus, "train").startswith(whole_split(cut, "train"))


def test_a_file_splits_by_position(tmp_path):
    text = bytes(range(32, 127)) * 3  # 285 bytes
    path = tmp_path / "book.txt"
    path.write_bytes(text)
    corpus = TextCorpus.from_data(path, max_bytes=None)
    # the first nine tenths (rounded down) train, the rest test
    assert whole_split(corpus, "train") == text[:256] and whole_split(corpus, "test") == text[256:]
    cut = TextCorpus.from_data(path, max_bytes=100)  # cut first, then split
    assert whole_split(cut, "train") == text[:90] and whole_split(cut, "test") == text[90:100]
    with pytest.raises(ValueError, match="the last tenth of the file"):
        cut.windows("test", 10, 1)


def old_training_key(config: LabConfig, encoding: str, seed: int) -> str:
    """The training key before ``data`` existed (version 3), as its code computed it."""
    parts = asdict(config)
    for unused in ("encodings", "seeds", "test_len", "eval_examples", "checkpoint_every"):
        parts.pop(unused)
    parts.pop("data")
    if config.task != "text":
        parts.pop("text_bytes")
    parts.update(encoding=encoding, seed=seed, version=3, max_positions=config.max_positions)
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


@pytest.mark.parametrize("config", [LabConfig(), config_from("text"), replace(TINY, data=None)])
def test_keys_without_data_are_those_of_before(config):
    # cached runs of the synthetic tasks and of the standard library stay valid
    for encoding, seed in (("rope", 0), ("alibi", 2)):
        assert config.training_key(encoding, seed) == old_training_key(config, encoding, seed)


def test_the_key_follows_the_bytes_not_the_path(text_tree, tmp_path):
    root, _ = text_tree
    config = replace(TINY, data=str(root))
    key = config.training_key("alibi", 0)
    assert key != replace(TINY, data=None).training_key("alibi", 0)  # not the stdlib's
    assert config.corpus_digest == TextCorpus.from_data(root, max_bytes=TINY.text_bytes).digest
    # moved: the same bytes, the same key (and so the cached model)
    moved = tmp_path / "elsewhere" / "moved"
    shutil.copytree(root, moved)
    assert replace(TINY, data=str(moved)).training_key("alibi", 0) == key
    # text_bytes beyond the corpus reads the same bytes: the same key
    assert replace(config, text_bytes=1 << 30).training_key("alibi", 0) == key
    # one byte edited, a file renamed to another place in the split order, fewer bytes read
    edited = tmp_path / "edited"
    shutil.copytree(root, edited)
    doc = edited / "part0" / "doc0.txt"
    doc.write_bytes(doc.read_bytes().replace(b"words", b"Words", 1))
    renamed = tmp_path / "renamed"
    shutil.copytree(root, renamed)
    (renamed / "part0" / "doc0.txt").rename(renamed / "part1" / "doc9.txt")
    others = {
        replace(TINY, data=str(edited)).training_key("alibi", 0),
        replace(TINY, data=str(renamed)).training_key("alibi", 0),
        replace(config, text_bytes=200).training_key("alibi", 0),
    }
    assert len(others) == 3 and key not in others


def test_the_digest_travels_with_the_config(text_tree):
    root, _ = text_tree
    config = replace(TINY, data=str(root))
    digest = config.corpus_digest
    doc = root / "part0" / "doc0.txt"
    doc.write_bytes(b"changed after the config read it\n" * 3)
    # a worker process gets the config pickled: the digest the parent's keys hold
    assert pickle.loads(pickle.dumps(config)).corpus_digest == digest
    # a config made anew reads the new bytes
    assert replace(config).corpus_digest != digest


def test_a_config_checks_its_data(tmp_path):
    assert replace(TINY, data=tmp_path).data == str(tmp_path)  # a path is kept as its str
    with pytest.raises(ValueError, match=r"data \(--data\) is read by the text task only"):
        LabConfig(task="copy", data=str(tmp_path))
    with pytest.raises(TypeError, match="data must be a str, a path or None; got int"):
        replace(TINY, data=wrong(3))


def test_bad_data_is_named(text_tree, tmp_path):
    root, _ = text_tree
    with pytest.raises(ValueError, match=r"data \(--data\) must be a text file .* no such file"):
        TextCorpus.from_data(tmp_path / "missing")
    with pytest.raises(ValueError, match=r"data \(--data\) must name"):
        TextCorpus.from_data("")
    with pytest.raises(
        ValueError, match=r"data \(--data\) must be a readable, non-empty text file"
    ):
        TextCorpus.from_data(root / "part0" / "image.png")
    with pytest.raises(
        ValueError, match=r"data \(--data\) must be a readable, non-empty text file"
    ):
        TextCorpus.from_data(root / "part0" / "empty.txt")
    nothing = tmp_path / "nothing"
    nothing.mkdir()
    (nothing / ".hidden").write_bytes(b"text")
    (nothing / "blob.bin").write_bytes(b"\0\1\2")
    with pytest.raises(ValueError, match=r"data \(--data\) holds no text files"):
        TextCorpus.from_data(nothing)
    with pytest.raises(TypeError, match="data must be a str or a path; got int"):
        TextCorpus.from_data(wrong(3))
    with pytest.raises(ValueError, match="max_bytes must be an int >= 1; got 0"):
        TextCorpus.from_data(root, max_bytes=0)


def test_too_little_text_fails_before_any_work(text_tree, tmp_path):
    root, files = text_tree
    config = replace(TINY, data=str(root), test_len=len(files[9]))  # test split: one file
    with pytest.raises(ValueError, match=r"data \(--data\) gives too little text for test_len"):
        text_corpus(config)
    with pytest.raises(ValueError, match=r"every 10th file"):
        run(config, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()
    few = tmp_path / "few"
    few.mkdir()
    (few / "a.txt").write_bytes(b"only one file: no test split\n" * 10)
    with pytest.raises(ValueError, match="test_len"):
        text_corpus(replace(TINY, data=str(few)))


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--data", "{missing}"], "--data"),
        (["--data", "{root}", "--task", "copy"], "--data"),
        (["--data", "{root}", "--test-len", "4000"], "--data"),
    ],
)
def test_bad_data_ends_with_one_line(text_tree, tmp_path, capsys, extra, words):
    root, _ = text_tree
    extra = [e.format(root=root, missing=tmp_path / "missing") for e in extra]
    assert main([*ARGV, *extra, "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and words in err and "Traceback" not in err


def test_lab_run_on_a_directory(text_tree, tmp_path, capsys):
    root, _ = text_tree
    out = tmp_path / "out"
    assert main([*ARGV, "--data", str(root), "--out", str(out)]) == 0
    assert "trained 1, reused 0" in capsys.readouterr().out
    doc = json.loads((out / "results.json").read_text())
    assert doc["config"]["data"] == str(root)
    assert {r["metric"] for r in doc["records"]} == {"perplexity"}
    assert all(1 < r["value"] < 1000 for r in doc["records"])
    # the directory moved: the cached run is found by its bytes
    moved = tmp_path / "moved"
    root.rename(moved)
    assert main([*ARGV, "--data", str(moved), "--out", str(out)]) == 0
    assert "trained 0, reused 1" in capsys.readouterr().out
    # the standard library is another corpus: trained anew, beside it
    outcome = run(replace(TINY, text_bytes=1 << 16), out, progress=False, device="cpu")
    assert len(outcome.trained) == 1
    assert len(list((out / "runs").glob("*.pt"))) == 2


def test_two_gloo_processes_read_the_same_data(text_tree, tmp_path, capsys, torchrun_gloo):
    root, _ = text_tree
    argv = [*ARGV, "--data", str(root)]
    one, two = tmp_path / "one", tmp_path / "two"
    # the one process is this one, on one thread (one_torch_thread) as each gloo process
    assert torch.get_num_threads() == 1
    assert main([*argv, "--out", str(one)]) == 0, capsys.readouterr().err
    torchrun_gloo([*argv, "--out", str(two)])  # 2 gloo processes, a free port of their own

    def saved(out: Path) -> tuple[str, list[float]]:
        (final,) = [p for p in (out / "runs").iterdir() if p.suffix == ".pt"]
        return final.stem, torch.load(final, weights_only=False)["losses"]

    (key_a, a), (key_b, b) = saved(one), saved(two)
    assert key_a == key_b and len(a) == len(b) == 2
    # the same updates; only the order of float32 sums differs (a few ulps per step)
    torch.testing.assert_close(torch.tensor(b), torch.tensor(a), rtol=1e-4, atol=1e-6)
