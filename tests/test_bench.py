"""The benchmark harness: structure, interleaving, skipping; never timing values."""

from __future__ import annotations

import importlib.util
import io
import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch

import posenc
import posenc.families.absolute.sinusoidal
from conftest import missing_anchor, unavailable
from posenc import bench

FIELDS = {"case", "impl", "role", "note", "size", "status", "reason", "runs"}
FIELDS |= {"median_s", "min_s", "ratio", "peak_bytes", "memory_ratio", "device", "reference_ratio"}


def test_sinusoidal_table_case_structure():
    rows = bench.run_case(bench.CASES["sinusoidal-table"], size={"length": 16, "dim": 8}, repeat=2)
    names = [t.impl for t in rows]
    assert names[:3] == ["np.empty().fill", "np.full", "torch.empty().fill_"]
    assert {"posenc numpy", "posenc torch"} <= set(names)
    assert {"numpy tutorial (float64)", "numpy tutorial (float32)"} <= set(names)
    assert {"annotated diffusion (torch)", "positional-encodings", "HF DistilBERT"} <= set(names)
    assert [t.role for t in rows[:3]] == ["baseline"] * 3
    assert rows[0].ratio == 1.0
    for t in rows:
        assert t.case == "sinusoidal-table"
        assert t.size == {"length": 16, "dim": 8}
        assert t.status in ("ok", "skipped"), t.reason
        if t.status == "ok":
            assert t.runs == 2
            assert t.median_s is not None and t.min_s is not None and t.ratio is not None
            assert 0 < t.min_s <= t.median_s
            assert math.isclose(t.ratio, t.median_s / rows[0].median_s)
    doc = json.loads(bench.to_json(rows))
    assert set(doc["environment"]) >= {"posenc", "numpy", "cpus"}
    assert len(doc["results"]) == len(rows)
    for r in doc["results"]:
        assert set(r) == FIELDS


def test_quick_and_full_sizes():
    case = bench.CASES["sinusoidal-table"]
    assert dict(case.full) == {"length": 8192, "dim": 1024}
    # the ratio to a fill means something only for a table larger than the caches
    assert case.quick["length"] * case.quick["dim"] * 4 >= 32 * 2**20
    assert case.quick_repeat < 15


def calls_case(log):
    def make(name):
        def build():
            log.append(("make", name))
            return lambda: log.append(("call", name))

        return build

    def build(n):
        return [
            bench.Impl("base", make("base"), "baseline"),
            bench.Impl("a", make("a"), "ours"),
            bench.Impl("b", make("b"), "peer"),
        ]

    return bench.Case("calls", "", build, {"n": 1}, {"n": 1})


def test_interleaved_round_robin_after_warmup():
    log = []
    rows = bench.run_case(calls_case(log), repeat=3, warmup=2)
    assert [t.runs for t in rows] == [3, 3, 3]
    calls = [name for kind, name in log if kind == "call"]
    warm, timed = calls[:6], calls[6:]
    assert warm == ["base", "base", "a", "a", "b", "b"]
    rounds = [timed[i : i + 3] for i in range(0, 9, 3)]
    assert all(sorted(r) == ["a", "b", "base"] for r in rounds)  # each once per round
    assert len({tuple(r) for r in rounds}) == 3  # the order rotates


def test_missing_peer_is_skipped_and_failing_peer_is_an_error():
    def missing():
        import posenc_peer_that_is_not_installed  # noqa: F401

        return lambda: None

    def broken():
        raise RuntimeError("peer API changed")

    def build(n):
        return [
            bench.Impl("base", lambda: lambda: None, "baseline"),
            bench.Impl("missing", missing, "peer"),
            bench.Impl("broken", broken, "peer"),
        ]

    rows = bench.run_case(bench.Case("p", "", build, {"n": 1}, {"n": 1}), repeat=1)
    status = {t.impl: (t.status, t.reason) for t in rows}
    assert status["base"][0] == "ok"
    assert status["missing"][0] == "skipped"
    assert "not installed" in status["missing"][1]
    assert "posenc_peer_that_is_not_installed" in status["missing"][1]
    assert status["broken"] == ("error", "RuntimeError: peer API changed")
    assert rows[1].median_s is None and rows[1].ratio is None
    text = bench.format_table(rows, use_rich=False)
    assert "skipped" in text and "not installed" in text


def _broken_case():
    def broken():
        raise RuntimeError("bug in posenc")

    def build(n):
        return [
            bench.Impl("base", lambda: lambda: None, "baseline"),
            bench.Impl("us", broken, "ours"),
        ]

    return bench.Case("o", "", build, {"n": 1}, {"n": 1})


def test_our_failure_raises():
    with pytest.raises(RuntimeError, match="bug in posenc"):
        bench.run_case(_broken_case(), repeat=1)


def test_over_budget_is_timed_from_the_warmup_call():
    log = []
    rows = bench.run_case(calls_case(log), repeat=4, budget_s=0.0)
    assert [t.runs for t in rows] == [1, 1, 1]
    assert len([1 for kind, _ in log if kind == "call"]) == 3  # warm-up calls only


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"repeat": 0}, ValueError, "repeat must be an int >= 1; got 0"),
        ({"warmup": 0}, ValueError, "warmup must be an int >= 1; got 0"),
        ({"repeat": 1.5}, TypeError, "repeat must be an int >= 1"),
        ({"warmup": True}, TypeError, "warmup must be an int >= 1"),
        ({"size": {"rows": 3}}, ValueError, "size"),
    ],
)
def test_bad_harness_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        bench.run_case(calls_case([]), **kwargs)


def test_registry():
    case = calls_case([])
    bench.register(case)
    try:
        with pytest.raises(ValueError, match="already registered"):
            bench.register(case)
        with pytest.raises(ValueError, match="unknown bench case"):
            bench.run(["nope"])
        rows = bench.run(["calls"], repeat=1)
        assert [t.case for t in rows] == ["calls"] * 3
    finally:
        del bench.CASES["calls"]


def test_package_names_and_case_order():
    import posenc.faces.bench

    assert bench is posenc.faces.bench
    names = [
        "CASES",
        "Case",
        "DEVICES",
        "Impl",
        "Timing",
        "format_table",
        "peak_memory",
        "register",
        "run",
        "run_case",
        "to_json",
    ]
    assert all(hasattr(bench, name) for name in names)  # the harness, re-exported
    assert bench.CASES is bench.harness.CASES
    # the order ``posenc bench`` runs and prints them
    assert list(bench.CASES) == [
        "sinusoidal-table",
        "rotary-float32",
        "rotary-float32-backward",
        "rotary-bfloat16",
        "rotary-bfloat16-backward",
        "rope-mixed",
        "rope-mixed-backward",
        "pope",
        "pope-backward",
        "attention-bias",
        "attention-bias-train",
        "attention-context-train",
        "decode",
        "decode-bfloat16",
    ]
    families = (
        bench.sinusoidal, bench.rotary, bench.image_rotary, bench.polar, bench.attention,
        bench.decode,
    )  # fmt: skip
    assert [c.name for f in families for c in f.CASES] == list(bench.CASES)


def test_tables_name_every_row():
    rows = bench.run_case(calls_case([]), repeat=2)
    for use_rich in (False, True):
        text = bench.format_table(rows, use_rich=use_rich)
        for name in ("base", "a", "b", "median ms", "x baseline", "1.00x"):
            assert name in text


# ------------------------------- the recipes written out compute what they publish


def float32_angle_bound(positions, dim, preset):
    """How far a float32 formula's values may be from the exact ones (as in test_sinusoidal).

    ``x_k = -k c`` is off by ``|x_k| 2**-23``, ``exp`` adds 2**-23 relative and
    ``p * omega`` 2**-24, so the angle errs by ``|theta| (|x_k| 2**-23 + 2**-22)``;
    sin/cos and the float32 result add < 1e-6.
    """
    spec = posenc.absolute.sinusoidal.resolve(preset)
    omega = spec.inv_freq(dim)
    theta = np.asarray(positions, dtype=np.float64)[:, None] * omega
    per_pair = np.abs(theta) * (np.abs(np.log(omega)) * 2.0**-23 + 2.0**-22) + 1e-6
    out = np.empty((len(positions), dim))
    slots = spec.slots(dim)
    out[:, slots.first] = per_pair[:, : slots.n_first]
    out[:, slots.second] = per_pair[:, : slots.n_second]
    return out


def test_numpy_tutorial_table_is_the_vaswani_formula():
    ours = posenc.sinusoidal(50, 512, dtype="float64")
    np.testing.assert_allclose(bench.sinusoidal.numpy_tutorial_table(50, 512), ours, atol=1e-13)
    f32 = bench.sinusoidal.numpy_tutorial_table(50, 512, np.float32)
    assert f32.dtype == np.float32
    assert (np.abs(f32 - ours) <= float32_angle_bound(np.arange(50), 512, "vaswani")).all()


def test_annotated_diffusion_embedding_is_its_formula():
    out = bench.sinusoidal.annotated_diffusion_embedding(torch.arange(50), 64)
    assert out.dtype == torch.float32 and out.shape == (50, 64)
    ours = posenc.sinusoidal(50, 64, preset="annotated-diffusion", dtype="float64")
    bound = float32_angle_bound(np.arange(50), 64, "annotated-diffusion")
    assert (np.abs(out.numpy() - ours) <= bound).all()


def test_progress_only_after_a_second():
    stream = io.StringIO()
    say = bench.harness._Progress(stream, interval=3600.0)  # the thread stays idle: flush by hand
    say("early")
    say.flush()  # under a second: silent
    assert stream.getvalue() == ""
    say.start -= 2.0
    say("late")
    say.flush()
    say.flush()  # nothing new
    say.done()
    assert stream.getvalue() == "late\n"  # not a terminal: one line per message


def test_faces_import_no_torch_or_rich():
    code = (
        "import sys, posenc.analysis, posenc.bench, posenc.cli; "
        "print(sorted(m for m in ('torch', 'rich', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


TINY_ROTARY = {"batch": 1, "heads": 2, "seq": 8, "head_dim": 8}


@pytest.mark.parametrize(
    "name", ["rotary-float32", "rotary-float32-backward", "rotary-bfloat16-backward"]
)
def test_rotary_cases_run_every_row(name):
    rows = bench.run_case(bench.CASES[name], size=TINY_ROTARY, repeat=1)
    assert rows[0].role == "baseline"
    assert {t.role for t in rows[1:]} <= {"ours", "peer"}
    assert [t.status for t in rows] == ["ok"] * len(rows), [t.reason for t in rows]
    assert dict(bench.CASES[name].full) == {"batch": 1, "heads": 32, "seq": 2048, "head_dim": 128}


def test_rotary_rows_compute_the_same_rotation():
    """Each layout's rows agree: the bench times equal work.

    Positions below 8 and float32 angles in the peers: the angle error is below
    ``8 * 2**-24``, and the products of values of size ~4 add a few ulps.
    """
    impls = {i.name: i for i in bench.rotary.impls(**TINY_ROTARY, dtype="float32", backward=False)}
    out = {name: impl.make()() for name, impl in impls.items() if "compile" not in name}
    groups = (
        ["posenc half", "HF apply_rotary_pos_emb"],
        ["posenc interleaved", "rotary-embedding-torch", "complex multiply"],
    )
    for group in groups:
        ref = out[group[0]]
        for name in group[1:]:
            for a, b in zip(ref, out[name], strict=True):
                torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    # and the rotation is not the identity
    assert not torch.allclose(out["posenc half"][0], out["q.clone(), k.clone()"][0])


@pytest.mark.parametrize("name", ["rope-mixed", "rope-mixed-backward"])
def test_rope_mixed_cases_run_every_row(name):
    if importlib.util.find_spec("timm") is None:  # loaded without torchvision where absent
        missing_anchor("timm", "is not installed")
    tiny = {"batch": 1, "heads": 2, "grid": 3, "head_dim": 8}
    rows = bench.run_case(bench.CASES[name], size=tiny, repeat=1)
    assert [t.role for t in rows] == ["baseline", "ours", "peer", "ours"]
    assert [t.status for t in rows] == ["ok"] * len(rows), [t.reason for t in rows]
    impls = bench.image_rotary.impls(**tiny, backward=False)
    shapes = {tuple(impl.make()()[0].shape) for impl in impls}
    assert shapes == {(1, 2, 10, 8)}  # the class token and 3 x 3 patches, in every row


@pytest.mark.parametrize("name", ["pope", "pope-backward"])
def test_pope_cases_run_every_row(name):
    if importlib.util.find_spec("PoPE_pytorch") is None:
        missing_anchor("PoPE_pytorch", "is not installed")
    tiny = {"batch": 1, "heads": 2, "seq": 12, "head_dim": 8}
    rows = bench.run_case(bench.CASES[name], size=tiny, repeat=1)
    assert [t.role for t in rows] == ["baseline", "ours", "peer", "peer", "ours"]
    assert [t.status for t in rows] == ["ok"] * len(rows), [t.reason for t in rows]


def test_pope_rows_compute_the_same_scores():
    """The polar rows give the same scores ``q' . k'`` (their layouts differ) with the
    same phase bias: the bench times equal work. Positions below 12, float32 angles in
    the peers: each channel within ``(12 * 5 + 2 pi + 16) * 2**-24`` relative of exact
    (tests/test_pope.py derives it), a score of 8 channel pairs of softplus values
    ``mu`` within ``2 * 8 * mu**2 * 2 *`` that."""
    tiny = {"batch": 1, "heads": 2, "seq": 12, "head_dim": 8}
    rows = {i.name: i for i in bench.polar.impls(**tiny, backward=False)}
    out = {name: rows[name].make()() for name in ("posenc PoPE", "pope-pytorch", "x-transformers")}
    mu = float(torch.nn.functional.softplus(rows["q.clone(), k.clone()"].make()()[0]).max())
    tol = 2 * 8 * max(mu, 1.0) ** 2 * 2 * (12 * 5 + 2 * math.pi + 16) * 2.0**-24
    want = out["posenc PoPE"][0] @ out["posenc PoPE"][1].mT
    for name in ("pope-pytorch", "x-transformers"):
        q, k = out[name]
        assert q.shape == (1, 2, 12, 16)
        assert (q @ k.mT - want).abs().max() <= tol, name
    plain = rows["q.clone(), k.clone()"].make()()
    assert not torch.allclose(want, plain[0] @ plain[1].mT, atol=1e-2)


TINY_ATTENTION = {"batch": 1, "heads": 2, "seq": 40, "head_dim": 16}


def test_attention_case_runs_every_row_and_measures_memory():
    case = bench.CASES["attention-bias"]
    assert case.memory
    assert dict(case.full) == {"batch": 1, "heads": 8, "seq": 8192, "head_dim": 64}
    rows = bench.run_case(case, size=TINY_ATTENTION, repeat=1)
    assert rows[0].impl == "SDPA, no bias" and rows[0].role == "baseline"
    assert [t.status for t in rows] == ["ok"] * len(rows), [t.reason for t in rows]
    if rows[0].peak_bytes is not None:  # Linux: every row has a peak, ratios to the first
        assert all(t.peak_bytes is not None for t in rows)
        text = bench.format_table(rows, use_rich=False)
        assert "peak MiB" in text


def test_attention_rows_compute_the_same_attention():
    """The bench's rows with the same bias agree: the ratios compare equal work."""
    impls = {i.name: i for i in bench.attention.impls(**TINY_ATTENTION)}
    out = {name: impl.make()() for name, impl in impls.items()}
    # float32 attention of values ~1 over 40 keys: a few ulps apart
    torch.testing.assert_close(out["posenc, no bias"], out["SDPA, no bias"], rtol=0, atol=1e-5)
    torch.testing.assert_close(out["posenc ALiBi"], out["x-transformers ALiBi"], rtol=0, atol=1e-5)
    torch.testing.assert_close(out["posenc ALiBi"], out["flex_attention ALiBi"], rtol=0, atol=1e-5)
    assert not torch.allclose(out["posenc ALiBi"], out["posenc, no bias"])


def test_attention_train_case_runs_every_row_or_says_why_not():
    case = bench.CASES["attention-bias-train"]
    assert case.memory
    assert dict(case.full) == {"batch": 1, "heads": 8, "seq": 2048, "head_dim": 64}
    rows = bench.run_case(case, size=TINY_ATTENTION, repeat=1)
    assert rows[0].impl == "SDPA causal" and rows[0].role == "baseline"
    status = {t.impl: (t.status, t.reason) for t in rows}
    flex = status.pop("flex_attention ALiBi")
    # torch's CPU FlexAttention has no backward: the row carries torch's refusal, no time
    assert flex[0] == "ok" or (flex[0] == "skipped" and "backward" in flex[1]), flex
    assert all(s == "ok" for s, _ in status.values()), status


def test_attention_train_rows_compute_the_same_gradients():
    """Rows with the same bias give the same gradients; bias parameters get theirs."""
    impls = {i.name: i for i in bench.attention.train_impls(**TINY_ATTENTION)}
    grads = {name: impl.make()() for name, impl in impls.items() if "flex" not in name}
    # float32 gradients of attention over 40 keys with values ~1: a few ulps apart
    pairs = (("SDPA causal", "posenc, no bias"), ("posenc ALiBi", "x-transformers ALiBi"))
    for a, b in pairs:
        assert len(grads[a]) == len(grads[b]) == 3  # q, k, v only: ALiBi has no parameters
        for x, y in zip(grads[a], grads[b], strict=True):
            torch.testing.assert_close(x, y, rtol=0, atol=1e-5)
    assert not torch.allclose(grads["posenc ALiBi"][0], grads["posenc, no bias"][0])
    for name in ("posenc T5", "posenc FIRE", "posenc FIRE, L=seq", "posenc FoX"):
        params = grads[name][3:]
        assert params and all(g is not None and g.abs().sum() > 0 for g in params), name


def test_context_train_case_runs_every_row_and_trains_every_parameter():
    """Every row of the context-reading methods runs, and its gradients reach q, k, v and
    each parameter it has (PaTH's w, beta and gates; CoPE's embeddings; DAPE's MLP)."""
    case = bench.CASES["attention-context-train"]
    assert case.memory and case.devices == ("cpu",)
    assert dict(case.full) == {"batch": 1, "heads": 8, "seq": 2048, "head_dim": 64}
    rows = bench.run_case(case, size=TINY_ATTENTION, repeat=1)
    assert rows[0].impl == "SDPA causal" and rows[0].role == "baseline"
    assert all(t.status == "ok" for t in rows), [(t.impl, t.reason) for t in rows]
    impls = {i.name: i for i in bench.attention.context_impls(**TINY_ATTENTION)}
    grads = {name: impl.make()() for name, impl in impls.items()}
    counts = {"posenc PaTH": 5, "posenc PaTH-FoX": 6, "posenc CoPE": 4, "posenc DAPE": 7}
    for name, found in grads.items():
        assert len(found) == counts.get(name, 4 if name == "posenc FoX" else 3), name
        assert all(g is not None and g.abs().sum() > 0 for g in found), name


def test_peak_memory_sees_an_allocation():
    peak = bench.peak_memory(lambda: np.ones(64 << 20, dtype=np.uint8))
    if peak is None:
        unavailable(
            "no peak-memory counter on this platform (/proc/self/clear_refs and "
            "malloc_trim on Linux)",
            provided_by="CI runs on Linux",
        )
    # 64 MiB touched; the counter is in KiB pages, plus what the call itself needs
    assert 64 << 20 <= peak < 80 << 20
    assert bench.peak_memory(lambda: None) < 8 << 20


# ------------------------------------------------------------------------- devices


def device_case(log, devices=("cpu", "cuda"), **kw):
    """A case of plain callables on the given devices; its log records builds and calls."""

    def make(name):
        def build():
            return lambda: log.append(("call", name))

        return build

    def build(n, device):
        log.append(("build", device))
        return [
            bench.Impl("base", make("base"), "baseline"),
            bench.Impl("ref", make("ref"), "peer", reference=True),
            bench.Impl("us", make("us"), "ours"),
        ]

    return bench.Case("dev", "a test case", build, {"n": 1}, {"n": 1}, devices=devices, **kw)


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda as a GPU machine shows it, recording synchronize calls into the list."""
    log = []
    allocated = {"now": 1000}
    fake = {
        "is_available": lambda: True,
        "synchronize": lambda: log.append(("sync", None)),
        "empty_cache": lambda: None,
        "memory_allocated": lambda: allocated["now"],
        "reset_peak_memory_stats": lambda: log.append(("reset", None)),
        "max_memory_allocated": lambda: allocated["now"] + 4096,
        "get_device_name": lambda *a: "Fake GPU",
        "get_device_capability": lambda *a: (9, 0),
        "current_device": lambda: 0,
        "get_device_properties": lambda *a: type("P", (), {"total_memory": 80 * 2**30})(),
    }
    for name, value in fake.items():
        monkeypatch.setattr(torch.cuda, name, value)
    return log


def test_cuda_timing_synchronizes_after_every_call(fake_cuda):
    log = fake_cuda
    case = device_case(log, memory=True, inner=2)
    rows = bench.run_case(case, device="cuda", repeat=3, warmup=1)
    assert ("build", "cuda") in log
    events = [kind for kind, _ in log if kind in ("call", "sync")]
    calls = events.count("call")
    # 3 warm-up runs and 3 rounds of 3 rows, each of 2 calls; 3 memory calls
    assert calls == 6 + 18 + 3
    # each call is followed by its synchronize (the memory probe also syncs before one)
    assert all(events[i + 1] == "sync" for i, kind in enumerate(events) if kind == "call")
    assert log.count(("reset", None)) == 3  # the peak is reset before each memory call
    for t in rows:
        assert t.device == "cuda" and t.status == "ok" and t.runs == 3
        assert t.peak_bytes == 4096  # the allocator's peak above what was allocated before
        assert t.memory_ratio == 1.0
    assert rows[1].reference_ratio == 1.0
    assert rows[0].reference_ratio == rows[0].median_s / rows[1].median_s
    env = json.loads(bench.to_json(rows))["environment"]
    assert env["device"] == "cuda"
    assert env["gpu"] == "Fake GPU" and env["gpu_capability"] == "9.0"
    assert {"cuda", "triton", "gpu_memory_gib"} <= set(env)
    text = bench.format_table(rows, use_rich=False)
    assert "dev on cuda (1)" in text and "x ref: ratio to ref" in text


def test_cpu_timing_does_not_synchronize_and_builds_for_the_cpu():
    log = []
    rows = bench.run_case(device_case(log), repeat=2)
    assert ("build", "cpu") in log and not any(kind == "sync" for kind, _ in log)
    assert [t.device for t in rows] == ["cpu"] * 3
    assert [t.impl for t in rows if t.reference_ratio == 1.0] == ["ref"]
    # a case on the CPU alone is built from its size alone (calls_case's build takes n)
    assert bench.run_case(calls_case([]), repeat=1)[0].device == "cpu"


def test_cuda_without_a_gpu_is_refused():
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(ValueError, match="device='cuda' needs a CUDA device"):
        bench.run_case(device_case([]), device="cuda")
    with pytest.raises(ValueError, match="device='cuda' needs a CUDA device"):
        bench.run(["decode"], device="cuda")


@pytest.mark.parametrize(
    ("device", "error", "match"),
    [("gpu", ValueError, "device must be one of cpu, cuda; got 'gpu'"), (0, TypeError, "device")],
)
def test_bad_device(device, error, match):
    with pytest.raises(error, match=match):
        bench.run_case(device_case([]), device=device)


def test_case_on_other_devices_is_refused_by_name_and_left_out_of_all(monkeypatch):
    gpu_only = device_case([], devices=("cuda",))
    with pytest.raises(ValueError, match="does not run on device='cpu'; it runs on cuda"):
        bench.run_case(gpu_only)
    monkeypatch.setattr(bench.harness, "CASES", {"calls": calls_case([]), "dev": gpu_only})
    with pytest.raises(ValueError, match="'dev' does not run on device='cpu'"):
        bench.run(["dev"], repeat=1)
    stream = io.StringIO()
    rows = bench.run(repeat=1, progress=stream)
    assert {t.case for t in rows} == {"calls"}
    assert "dev left out: it runs on cuda, not cpu" in stream.getvalue()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"devices": ()}, "devices must be some of cpu, cuda"),
        ({"devices": ("tpu",)}, "devices must be some of cpu, cuda"),
        ({"cuda_full": {"m": 2}}, "cuda_full must have the keys of full"),
        ({"inner": 0}, "inner must be an int >= 1"),
    ],
)
def test_register_checks_devices_and_sizes(kwargs, match):
    with pytest.raises(ValueError, match=match):
        bench.register(bench.Case("bad", "", lambda n: [], {"n": 1}, {"n": 1}, **kwargs))
    assert "bad" not in bench.CASES


def test_sizes_per_device():
    rotary = bench.CASES["rotary-float32"]
    assert rotary.devices == ("cpu", "cuda")
    assert rotary.size("cpu") == {"batch": 1, "heads": 32, "seq": 2048, "head_dim": 128}
    # 512 MiB per float32 tensor on a GPU: bound by memory, not by launching kernels
    assert rotary.size("cuda") == {"batch": 8, "heads": 32, "seq": 4096, "head_dim": 128}
    assert rotary.size("cuda", quick=True) == rotary.size("cuda")
    for name in ("attention-bias", "attention-bias-train"):
        case = bench.CASES[name]
        assert case.size("cuda") == {"batch": 1, "heads": 16, "seq": 8192, "head_dim": 128}
        assert case.size("cpu") == dict(case.full)
    assert bench.CASES["sinusoidal-table"].devices == ("cpu",)
    assert bench.CASES["decode"].devices == ("cpu", "cuda")
    assert bench.CASES["decode-bfloat16"].devices == ("cuda",)


def test_keep_going_reports_our_failure_as_a_row():
    rows = bench.run_case(_broken_case(), repeat=1, strict=False)
    assert (rows[1].status, rows[1].reason) == ("error", "RuntimeError: bug in posenc")
    assert rows[0].status == "ok"


def test_cuda_rotary_rows():
    """On CUDA every dtype and pass has torch.compile of HF's formula and Liger's kernel."""
    for dtype in ("float32", "bfloat16"):
        for backward in (False, True):
            rows = bench.rotary.impls(**TINY_ROTARY, dtype=dtype, backward=backward, device="cuda")
            names = [i.name for i in rows]
            assert names[0] == "q.clone(), k.clone()" and rows[0].role == "baseline"
            assert {"posenc half", "posenc interleaved", "HF apply_rotary_pos_emb"} <= set(names)
            assert {"torch.compile(HF)", "Liger-Kernel"} <= set(names)
            cpu = [
                i.name for i in bench.rotary.impls(**TINY_ROTARY, dtype=dtype, backward=backward)
            ]
            assert "Liger-Kernel" not in cpu
            assert ("torch.compile(HF)" in cpu) == (dtype == "float32" and not backward)


def test_cuda_attention_rows():
    for build in (bench.attention.impls, bench.attention.train_impls):
        rows = build(**TINY_ATTENTION, device="cuda")
        assert rows[0].name == "v.clone()" and rows[0].role == "baseline"
        assert [i.name for i in rows if i.reference] == ["SDPA causal"]
        names = {i.name for i in rows}
        assert {"posenc ALiBi", "posenc T5", "posenc FIRE"} <= names
        assert {"flex_attention ALiBi", "x-transformers ALiBi"} <= names
    # the CPU cases are as they were: SDPA is their baseline, with no reference row
    rows = bench.attention.impls(**TINY_ATTENTION)
    assert rows[0].name == "SDPA, no bias" and not any(i.reference for i in rows)


# ------------------------------------------------------------------------- decode


def test_decode_case_runs_every_row_on_the_cpu():
    case = bench.CASES["decode"]
    assert dict(case.full) == {"batch": 1, "heads": 32, "kv_heads": 8, "head_dim": 128,
                               "offset": 2047}  # fmt: skip
    rows = bench.run_case(case, quick=True, repeat=2)
    assert [t.impl for t in rows] == [
        "q.clone(), k.clone()",
        "posenc Rotary",
        "HF module + apply_rotary_pos_emb",
        "HF module",
        "posenc patched + apply_rotary_pos_emb",
        "posenc patched module",
    ]
    assert [t.status for t in rows] == ["ok"] * len(rows), [t.reason for t in rows]
    assert all(t.runs == 2 for t in rows)
    text = bench.format_table(rows, use_rich=False)
    assert f"runs of {bench.decode.INNER} calls" in text


def test_decode_rows_compute_the_same_rotation():
    """posenc's step equals HF's, and the patched module returns HF's tables.

    At position 2047 HF's float32 angle ``p * inv_freq`` errs by up to ``2047 * 2**-24``
    (posenc's tables are exact): about 1.2e-4 in cos and sin, and in values ~4 below 1e-3.
    """
    size = {"batch": 1, "heads": 4, "kv_heads": 2, "head_dim": 16, "offset": 2047}
    impls = {i.name: i for i in bench.decode.impls(**size, dtype="float32")}
    out = {name: impl.make()() for name, impl in impls.items()}
    q, k = out["q.clone(), k.clone()"]
    assert q.shape == (1, 4, 1, 16) and k.shape == (1, 2, 1, 16)
    for name in ("HF module + apply_rotary_pos_emb", "posenc patched + apply_rotary_pos_emb"):
        for a, b in zip(out["posenc Rotary"], out[name], strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-3)
    for a, b in zip(out["HF module"], out["posenc patched module"], strict=True):
        assert a.shape == b.shape == (1, 1, 16)
        torch.testing.assert_close(a, b, rtol=0, atol=2e-4)
    assert not torch.allclose(out["posenc Rotary"][0], q)


def test_decode_bfloat16_is_cuda_only(capsys):
    from posenc.cli import main

    with pytest.raises(ValueError, match="does not run on device='cpu'"):
        bench.run(["decode-bfloat16"])
    assert main(["bench", "--case", "decode-bfloat16", "--quick"]) == 2
    err = capsys.readouterr().err
    assert "--case decode-bfloat16 runs on cuda only, not --device cpu" in err


# ------------------------------------------------------------------------- the command


def test_cli_device_cuda_without_a_gpu_exits_2_naming_device(capsys):
    from posenc.cli import main

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert main(["bench", "--device", "cuda", "--case", "decode", "--quick"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("posenc: error: --device cuda:") and "Traceback" not in err
    assert err.count("\n") == 1


def test_cli_device_help_and_bad_value(capsys):
    from posenc.cli import main

    assert main(["bench", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--device" in out and "--keep-going" in out
    assert main(["bench", "--device", "gpu"]) == 2
    assert "--device" in capsys.readouterr().err


def test_cli_decode_quick_json(capsys):
    from posenc.cli import main

    assert main(["bench", "--case", "decode", "--quick", "--repeat", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["environment"]["device"] == "cpu"
    assert [r["status"] for r in doc["results"]] == ["ok"] * 6


def test_cli_keep_going_exits_1_when_ours_fails(monkeypatch, capsys):
    from posenc.cli import main

    monkeypatch.setitem(bench.CASES, "o", _broken_case())
    assert main(["bench", "--case", "o", "--repeat", "1", "--keep-going", "--json"]) == 1
    captured = capsys.readouterr()
    assert [r["status"] for r in json.loads(captured.out)["results"]] == ["ok", "error"]
    assert "o: us failed: RuntimeError: bug in posenc" in captured.err


def test_cuda_attention_rows_run_on_a_cpu_stand_in():
    """The CUDA rows' code, on CPU tensors (bfloat16, causal): each runs and agrees.

    FlexAttention is left out (its CPU compilation takes tens of seconds). bfloat16
    attention over 40 keys: outputs within a few bfloat16 ulps of values ~1.
    """
    for backward in (False, True):
        rows = bench.attention.cuda_impls(**TINY_ATTENTION, backward=backward, device="cpu")
        out = {i.name: i.make()() for i in rows if "flex" not in i.name}
        # the output, or the gradient of q (the copy's is None: it reads v alone)
        first = {name: o[0] if isinstance(o, tuple) else o for name, o in out.items()}
        copy = first.pop("v.clone()")
        assert copy is None if backward else copy.dtype == torch.bfloat16
        assert all(t.dtype == torch.bfloat16 for t in first.values())
        for a, b in (("posenc ALiBi", "x-transformers ALiBi"), ("posenc, no bias", "SDPA causal")):
            torch.testing.assert_close(first[a], first[b], rtol=0, atol=0.03)
        if backward:
            assert len(out["posenc T5"]) > 3 and len(out["posenc ALiBi"]) == 3  # T5's parameters


def test_decode_bfloat16_rows_run_on_a_cpu_stand_in():
    size = {"batch": 1, "heads": 4, "kv_heads": 2, "head_dim": 16, "offset": 2047}
    for impl in bench.decode.impls(**size, dtype="bfloat16"):
        out = impl.make()()
        assert all(t.dtype == torch.bfloat16 for t in out), impl.name
