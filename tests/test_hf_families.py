"""posenc.hf.patch_model on a tiny model of every transformers family with a rotary module.

tests/hf_families.py builds each family small from its own config class (nothing is
downloaded) and compares the model's output before and after patching. A family
must come out ``same`` (the output moved by no more than posenc's table error can
move it) or ``refused`` (``patch_model`` raised ``ValueError``), and every refusal
must be one a human has reviewed: listed in ``ALLOWED_REFUSALS`` with the reason, and
its refused module's config must be refused by ``rope_spec`` too (no config is read into
frequencies its model does not use).
A family whose output is chaotic (routing, halting) is judged by parts: the new
modules' outputs against HF's, call by call, and the patched model fed HF's outputs.
A silent difference, a crash, or a family the harness cannot build fails, except the
families listed in ``NOT_CHECKED`` with why the harness cannot judge them yet (each entry
must still be unjudged: a family the harness learns to check leaves the list).

The families run in two worker processes (tests/hf_families.py ``run``), once for
the module; the per-family tests read the results, and the counts README.md states
for the transformers it names (same, refused, in all) are checked against them.
Each family's check may use a fixed budget of CPU time (``hf_families.CPU_LIMIT``),
not of wall time: a loaded machine slows it down without failing it.

transformers' own torch code is what the families run: with a package named ``fla``
importable, transformers sends the linear attention of Qwen3-Next, OLMo-hybrid,
GLM-5-next and others to flash-linear-attention's Triton kernels, which fail without
a GPU driver. tests/test_fla.py needs fla-core's dense references only, so ``make
test`` installs fla-core into ``$(VENV)/fla-core``, on no import path, and that test
loads the two files by path; ``test_fla_is_not_importable`` holds the line.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from conftest import anchor

anchor("torch")
anchor("transformers")

import hf_families  # noqa: E402  (after the anchors: it imports both)

# family: why patch_model refuses it (reviewed). "genuine": the module does something
# else than position x frequency tables posenc can reproduce (another calling contract,
# or frequencies of its own); "not yet" would mark one posenc should learn (none now).
ALLOWED_REFUSALS: dict[str, str] = {
    "musicflamingo": "genuine: forward(timestamps, seq_len), angles modulated by time",
    "pixtral": "genuine: 2-D frequencies built from one interleaved sequence, not base^(-2k/d)",
    "mistral_large4": "genuine: its vision tower is Pixtral's rotary (see pixtral)",
    "ernie4_5_vl_moe": "genuine: frequencies pre-permuted by the model (inv_freq of another "
    "shape than rotary_dim / 2)",
    "efficientloftr": "genuine: forward(x) of a feature map returns a row/column table over "
    "the whole hidden size; no position_ids",
    "esmfold2": "genuine: forward(ref_pos, ref_space_uid, dtype): 3-D atom coordinates and "
    "a per-atom id as positions",
    "eomt_dinov3": "genuine: DINOv3's forward(pixel_values): patch centres in [-1, 1] times "
    "2 pi times its own inv_freq (head_dim / 4 of them)",
}

# family: why the harness cannot judge it yet (no probe input for its modality, a package
# it needs is not installed, transformers' own default config does not build, or the
# output does not depend on the rotary tables at all)
NOT_CHECKED: dict[str, str] = {}

FAMILIES = hf_families.families()


@pytest.fixture(scope="module")
def outcomes() -> dict[str, hf_families.Outcome]:
    # the survey the suite started in the background once it collected these tests
    # (tests/background.py)
    found = {o.family: o for o in hf_families.surveyed()}
    assert sorted(found) == sorted(FAMILIES)
    return found


def test_families_found() -> None:
    assert len(FAMILIES) >= 100, FAMILIES


def test_fla_is_not_importable() -> None:
    # see the module docstring: fla importable would route some families' layers to
    # Triton kernels this CPU run cannot execute
    import importlib.util

    assert importlib.util.find_spec("fla") is None, (
        "a package named fla is importable: transformers would route linear attention "
        "to its Triton kernels; install fla-core as the Makefile does (FLA_CORE)"
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_family(family: str, outcomes: dict[str, hf_families.Outcome]) -> None:
    outcome = outcomes[family]
    if family in NOT_CHECKED:
        # listed as not checked: must still be so (a family the harness now judges leaves)
        assert outcome.status == "build-failed", f"now {outcome.status}: remove from NOT_CHECKED"
        return
    assert outcome.status != "build-failed", f"harness could not build it: {outcome.detail}"
    assert outcome.status != "different", f"patched silently differently: {outcome.detail}"
    assert outcome.status != "crash", outcome.detail
    if outcome.status == "refused":
        assert family in ALLOWED_REFUSALS, f"refused, and not in ALLOWED_REFUSALS: {outcome.detail}"
        # its config must be refused too: read, it gives frequencies the model does not use
        assert not outcome.read_config, f"refused, but rope_spec reads {outcome.read_config}"
    else:
        assert outcome.status == "same", outcome
        assert family not in ALLOWED_REFUSALS, f"listed in ALLOWED_REFUSALS but patched: {outcome}"


def test_every_family_is_judged_or_listed(outcomes: dict[str, hf_families.Outcome]) -> None:
    # every family of the installed transformers with a rotary module, new ones included:
    # the same after patching, a reviewed refusal, or listed as not checked; nothing else
    assert set(outcomes) == set(FAMILIES)
    unjudged = {
        f: f"{o.status}: {o.detail}"
        for f, o in outcomes.items()
        if not (
            o.status == "same"
            or (o.status == "refused" and f in ALLOWED_REFUSALS and not o.read_config)
            or (o.status == "build-failed" and f in NOT_CHECKED)
        )
    }
    assert not unjudged, unjudged


README = Path(__file__).parents[1] / "README.md"
#: the pages that state the counts: the README's headline and the patching guide
STATING = (README, README.parent / "docs" / "guides" / "patching.md")
# the family line: "every transformers 5.24 family with a rotary module (199) ...
# **192 the same, 7 refused, 0 silent differences, 0 crashes**"
README_FAMILIES = re.compile(
    r"every transformers\s+(\d+\.\d+)\s+family with a rotary module\s+\((\d+)\)"
)
README_COUNTS = re.compile(
    r"\*\*(\d+) the same, (\d+) refused, 0 silent\s+differences, 0 crashes\*\*"
)


@pytest.mark.parametrize("page", STATING, ids=lambda p: p.name)
def test_the_docs_state_the_measured_counts(
    outcomes: dict[str, hf_families.Outcome], page: Path
) -> None:
    import transformers

    text = page.read_text(encoding="utf-8")
    families, counts = README_FAMILIES.search(text), README_COUNTS.search(text)
    assert families and counts, f"{page.name} no longer states the family counts"
    version = families.group(1)
    # the counts are those of the pinned transformers (a new pin needs new counts)
    constraints = (README.parent / "constraints-dev.txt").read_text(encoding="utf-8")
    pinned = re.search(r"^transformers==(\S+)$", constraints, re.M)
    assert pinned and pinned.group(1).startswith(version + "."), (version, pinned)
    installed = transformers.__version__
    if not installed.startswith(version + "."):
        pytest.skip(
            f"{page.name} states the family counts of transformers {version}; "
            f"{installed} is installed"
        )
    measured = Counter(o.status for o in outcomes.values())
    stated = {
        "families": int(families.group(2)),
        "same": int(counts.group(1)),
        "refused": int(counts.group(2)),
    }
    assert {
        "families": len(outcomes),
        "same": measured["same"],
        "refused": measured["refused"],
    } == stated
    assert measured["refused"] == len(ALLOWED_REFUSALS)


def test_allowed_refusals_are_families() -> None:
    assert set(ALLOWED_REFUSALS) <= set(FAMILIES)
    assert set(NOT_CHECKED) <= set(FAMILIES)
    assert not set(ALLOWED_REFUSALS) & set(NOT_CHECKED)


@pytest.mark.parametrize("family", ["llama", "granitemoe"])
def test_check_sees_a_slightly_wrong_table(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # a control for the harness itself: a replacement whose sines are 0.1% off must come
    # out "different", both where the output shows the tables end to end (Llama) and in a
    # model whose routing makes the output chaotic, judged by parts (GraniteMoE)
    import warnings

    import torch

    from posenc import hf

    patch = hf.patch_model

    def wrong(model: torch.nn.Module) -> torch.nn.Module:
        patched = patch(model)
        for name in hf_families._rotary_names(patched):
            patched.get_submodule(name).register_forward_hook(
                lambda _m, _a, out: (out[0], out[1] * 1.001)
            )
        return patched

    monkeypatch.setattr(hf, "patch_model", wrong)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outcome = hf_families.check(family)
    assert outcome.status == "different", outcome
    assert outcome.detail.startswith("by parts: tables max|diff| 0.001"), outcome.detail
