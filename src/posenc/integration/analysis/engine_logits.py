"""End-to-end logits: a tiny random-weight model of a config, run by transformers and by an engine.

The tables of :mod:`~posenc.integration.analysis.engines` say what an engine's RoPE code
computes; this module checks what its users see. :data:`LOGIT_CASES` are tiny models, one
per rope type (2 layers, head size 64, an original context of :data:`CONTEXT` tokens);
:func:`write_checkpoint` saves one with random weights from a seed as transformers saves a
checkpoint (``config.json`` in the layout given, ``model.safetensors`` in float32) with a
small SentencePiece tokenizer (``tokenizer.model``, a Llama tokenizer), so that an engine's
own converter (llama.cpp's ``convert_hf_to_gguf.py``, CTranslate2's
``TransformersConverter``, ONNX Runtime GenAI's model builder) takes it as it takes a
released model. The engine's reader converts it, runs one prompt and answers the
next-token logits at the asked rows (the protocol's ``"logits"`` request,
:mod:`~posenc.integration.analysis.engine_readers.protocol`); :func:`run_logits` judges
them against transformers' in float64 (:func:`tolerance`).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import random
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

#: The tokenizer's vocabulary (SentencePiece BPE, trained on seeded random words).
VOCAB = 256


def _tokenizer_model(seed: int = 0) -> bytes:
    """A SentencePiece BPE model of :data:`VOCAB` pieces (ids 0, 1, 2: unk, bos, eos)."""
    import sentencepiece as spm

    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghijklmnop") for _ in range(rng.randint(2, 6)))
             for _ in range(400)]  # fmt: skip
    lines = [" ".join(rng.choice(words) for _ in range(12)) for _ in range(500)]
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=out, vocab_size=VOCAB, model_type="bpe",
        minloglevel=2, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, num_threads=1,
    )  # fmt: skip
    return out.getvalue()


def write_checkpoint(
    config: Mapping[str, Any], directory: str | Path, *, seed: int = 0, init_std: float = 0.1
) -> Path:
    """Save a random-weight model of ``config`` and a Llama tokenizer in ``directory``.

    ``config`` is a ``config.json`` dict whose sizes are already small (its
    ``vocab_size`` is set to the tokenizer's, :data:`VOCAB`). The weights are drawn with
    ``torch.manual_seed(seed)`` and standard deviation ``init_std`` (``initializer_range``:
    larger than a trained model's 0.02, so that the attention scores, and with them the
    positions, move the logits).

    Returns:
        the directory.
    """
    from posenc.integration.analysis.rope_reading import quiet

    with quiet(), _no_progress():
        return _write_checkpoint(config, Path(directory), seed, init_std)


def _write_checkpoint(config: Mapping[str, Any], path: Path, seed: int, init_std: float) -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaTokenizer

    path.mkdir(parents=True, exist_ok=True)
    data = {**dict(config), "vocab_size": VOCAB, "initializer_range": init_std,
            "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32"}  # fmt: skip
    data.setdefault("pad_token_id", 0)  # a class default may lie outside the vocabulary
    model_type = data.pop("model_type")
    hf_config = AutoConfig.for_model(model_type, **data)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    model.save_pretrained(path, safe_serialization=True)
    # save_pretrained writes its own layout (transformers 5's rope_parameters): an engine
    # reads the config as given, transformers 4's or 5's
    (path / "config.json").write_text(json.dumps({**data, "model_type": model_type}, indent=1))
    (path / "tokenizer.model").write_bytes(_tokenizer_model(seed))
    tokenizer = LlamaTokenizer(vocab_file=str(path / "tokenizer.model"), legacy=False)
    tokenizer.save_pretrained(path)
    return path


def prompt(length: int, *, seed: int = 0) -> list[int]:
    """``length`` token ids, seeded: 1 (bos) and then random ids of the vocabulary."""
    rng = random.Random(seed)
    return [1] + [rng.randrange(3, VOCAB) for _ in range(length - 1)]


def reference_logits(
    directory: str | Path, tokens: list[int], rows: list[int], *, dtype: str = "float64"
) -> Any:
    """transformers' next-token logits at ``rows`` of one prefill of ``tokens`` (numpy).

    The saved model, loaded back, evaluated in ``dtype`` (float64: the reference; float32:
    what a float32 engine's rounding alone may reach) with eager attention.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from posenc.integration.analysis.rope_reading import quiet

    with quiet(), _no_progress():
        model = AutoModelForCausalLM.from_pretrained(
            str(directory), dtype=getattr(torch, dtype), attn_implementation="eager"
        )
        model.eval()
        with torch.no_grad():
            out = model(torch.tensor([tokens])).logits[0, rows]
    return out.double().numpy()


@contextlib.contextmanager
def _no_progress() -> Iterator[None]:
    """transformers' progress bars (loading and writing shards) off."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


#: The original context a shrunk config gets (:func:`shrink`): a prompt of three times it
#: reaches past it in a moment on a CPU.
CONTEXT = 64
#: float32's unit roundoff.
_U32 = 2.0**-24

#: The tiny models' sizes. The MLP's width is no multiple of the vocabulary: ONNX Runtime
#: GenAI's builder takes any linear layer with vocab_size outputs for the head (Phi-3's
#: fused gate_up_proj of 2 x 128 outputs would be one).
_TINY = {"hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 64,
         "num_hidden_layers": 2, "intermediate_size": 96, "rms_norm_eps": 1e-5,
         "tie_word_embeddings": False}  # fmt: skip
_LONG_32 = [1.0 + 0.25 * k for k in range(32)]
_SHORT_32 = [1.0 + 0.01 * k for k in range(32)]


@dataclass(frozen=True)
class LogitsCase:
    """One tiny model of the end-to-end check: its name, what it checks and its config."""

    name: str
    what: str
    config: dict[str, Any]

    def data(self) -> dict[str, Any]:
        """A copy of the config."""
        return copy.deepcopy(self.config)


def _llama(**extra: Any) -> dict[str, Any]:
    return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], **_TINY,
            "max_position_embeddings": 4 * CONTEXT, **extra}  # fmt: skip


def _qwen2(**extra: Any) -> dict[str, Any]:
    return {**_llama(**extra), "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}


#: The tiny models every engine that loads a checkpoint runs: the rope types of the
#: cross-engine table, each with an original context of :data:`CONTEXT` tokens and a
#: prompt of three times it.
LOGIT_CASES: dict[str, LogitsCase] = {c.name: c for c in [
    LogitsCase("default", "Llama, base 10000", _llama(rope_theta=10000.0)),
    LogitsCase("linear", "position interpolation, factor 4",
               _llama(rope_theta=10000.0, rope_scaling={"rope_type": "linear", "factor": 4.0})),
    LogitsCase("dynamic", "dynamic NTK, factor 4, past max_position_embeddings",
               _llama(rope_theta=10000.0, max_position_embeddings=CONTEXT,
                      rope_scaling={"rope_type": "dynamic", "factor": 4.0})),
    LogitsCase("yarn", "YaRN factor 4 (Qwen2)",
               _qwen2(rope_theta=10000.0, rope_scaling={
                   "rope_type": "yarn", "factor": 4.0,
                   "original_max_position_embeddings": CONTEXT})),
    LogitsCase("yarn attention_factor", "YaRN factor 4 with attention_factor 1.2 (Qwen2)",
               _qwen2(rope_theta=10000.0, rope_scaling={
                   "rope_type": "yarn", "factor": 4.0, "attention_factor": 1.2,
                   "original_max_position_embeddings": CONTEXT})),
    LogitsCase("llama3", "Llama 3.1's scaling, factor 4",
               _llama(rope_theta=500000.0, rope_scaling={
                   "rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": CONTEXT})),
    LogitsCase("longrope", "Phi-3's LongRoPE, a prompt past original_max_position_embeddings",
               {**_llama(rope_theta=10000.0), "model_type": "phi3",
                "architectures": ["Phi3ForCausalLM"], "hidden_act": "silu",
                "original_max_position_embeddings": CONTEXT, "pad_token_id": 0,
                "rope_scaling": {"type": "longrope", "short_factor": _SHORT_32,
                                 "long_factor": _LONG_32}}),
]}  # fmt: skip


def prompt_length(config: Mapping[str, Any]) -> int:
    """Three times the original context: positions well past it, in one prefill."""
    return 3 * CONTEXT


def rows(length: int) -> list[int]:
    """The rows compared: the first, the last inside the original context, the first past
    it, and two past it."""
    return sorted({0, CONTEXT - 1, CONTEXT, (CONTEXT + length) // 2, length - 1})


def tolerance(reference: npt.NDArray[np.float64], config: Mapping[str, Any], length: int) -> float:
    """How far a float32 engine's logits may be from the float64 reference.

    Each matrix product with inner dimension ``n`` rounds to at most ``n u |x| |y|``
    (Higham's gamma_n, ``u`` float32's unit roundoff 2**-24); a layer runs about six in a
    row (q/k/v, scores, weights times values, output, the MLP's two), the head one more,
    and the errors add through the residual stream: ``(6 L + 1) n u`` relative to the
    logits' size, ``n`` the largest inner dimension (hidden, MLP or prompt length).
    """
    layers = int(config.get("num_hidden_layers", 2))
    n = max(int(config.get("hidden_size", 128)), int(config.get("intermediate_size", 128)), length)
    largest = float(np.max(np.abs(reference)))
    return (6 * layers + 1) * n * _U32 * max(largest, 1.0)


@dataclass
class LogitsResult:
    """One engine's logits on one tiny model, against transformers' in float64."""

    engine: str
    case: str
    verdict: str
    max_abs_diff: float | None = None
    tolerance: float | None = None
    per_row: list[dict[str, Any]] = field(default_factory=list)
    version: str | None = None
    converter: str | None = None
    runtime: str | None = None
    mode: str | None = None
    note: str = ""
    seconds: float | None = None

    def as_json(self) -> dict[str, Any]:
        """The result as plain JSON values."""
        return {k: getattr(self, k) for k in (
            "engine", "case", "verdict", "max_abs_diff", "tolerance", "per_row", "version",
            "converter", "runtime", "mode", "note", "seconds")}  # fmt: skip


def judge(
    engine: str,
    case: str,
    answer: Mapping[str, Any],
    reference: npt.NDArray[np.float64],
    asked: Sequence[int],
    config: Mapping[str, Any],
    length: int,
) -> LogitsResult:
    """The verdict on one logits answer: "same" within :func:`tolerance`, else "different"
    (per row: the largest difference), "refused" (the engine's error) or "error"."""
    if "refused" in answer:
        where = f" (at {answer['where']})" if answer.get("where") else ""
        return LogitsResult(engine, case, "refused", version=answer.get("version"),
                            note=f"{answer['refused']}{where}")  # fmt: skip
    try:
        theirs = np.asarray(answer["logits"], dtype=np.float64)
        if [int(r) for r in answer.get("rows", asked)] != list(asked):
            raise ValueError(f"rows {answer.get('rows')} answered, {list(asked)} asked")
        if theirs.shape != reference.shape:
            raise ValueError(f"logits of shape {theirs.shape}, expected {reference.shape}")
        if not np.all(np.isfinite(theirs)):
            raise ValueError("logits that are not finite")
    except (KeyError, TypeError, ValueError) as exc:
        return LogitsResult(engine, case, "error", version=answer.get("version"),
                            note=f"the reader's logits cannot be compared: {exc}")  # fmt: skip
    tol = tolerance(reference, config, length)
    diff = np.max(np.abs(theirs - reference), axis=1)
    per_row = [{"row": int(r), "max_abs_diff": float(d), "same": bool(d <= tol)}
               for r, d in zip(asked, diff, strict=True)]  # fmt: skip
    verdict = "same" if all(p["same"] for p in per_row) else "different"
    notes = [str(answer["note"])] if answer.get("note") else []
    if verdict == "different":
        first = next(p for p in per_row if not p["same"])
        notes.insert(0, f"first row past the tolerance: {first['row']} (|diff| "
                        f"{first['max_abs_diff']:.3g} > {tol:.3g})")  # fmt: skip
    return LogitsResult(engine, case, verdict, max_abs_diff=float(np.max(diff)), tolerance=tol,
                        per_row=per_row, version=answer.get("version"),
                        converter=answer.get("converter"), runtime=answer.get("runtime"),
                        mode=answer.get("mode"), note="; ".join(notes))  # fmt: skip


def run_logits(
    name: str,
    cases: Sequence[str] | None = None,
    python: Path | None = None,
    *,
    seconds_per_case: float = 120.0,
) -> list[LogitsResult]:
    """Engine ``name`` on the tiny models of :data:`LOGIT_CASES` (all, or ``cases``), in one
    child process: checkpoints written here, converted and run by the engine's reader.

    Raises:
        ValueError: an unknown case name.
    """
    from posenc.integration.analysis import engines

    chosen = list(LOGIT_CASES) if cases is None else list(cases)
    unknown = [c for c in chosen if c not in LOGIT_CASES]
    if unknown:
        raise ValueError(f"unknown logits case {unknown[0]!r} (accepted: "
                         f"{', '.join(LOGIT_CASES)})")  # fmt: skip
    engine = engines.ENGINES[name]
    python = engines.engine_python(name) if python is None else python
    if not python.exists():
        return [LogitsResult(name, c, "not installed", note=f"no {python}; build it with "
                             f"{engine.install}") for c in chosen]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="posenc-logits-") as tmp:
        requests, references = [], []
        for c in chosen:
            config = LOGIT_CASES[c].data()
            directory = write_checkpoint(config, Path(tmp) / c.replace(" ", "-"))
            length = prompt_length(config)
            tokens, asked = prompt(length), rows(length)
            references.append((reference_logits(directory, tokens, asked), asked, config, length))
            requests.append({"logits": {"checkpoint": str(directory), "tokens": tokens,
                                        "rows": asked}})  # fmt: skip
        started = time.monotonic()
        status, answers = engines.call_batch(
            python, engine, requests, engine.timeout_s + seconds_per_case * len(chosen)
        )
        seconds = (time.monotonic() - started) / max(len(chosen), 1)
    if status != "ok":
        return [LogitsResult(name, c, "error", note=str(answers)) for c in chosen]
    out = []
    for c, one, (ref, asked, config, length) in zip(chosen, answers, references,
                                                     strict=True):  # fmt: skip
        result = judge(name, c, one if isinstance(one, dict) else {}, ref, asked, config, length)
        result.seconds = seconds
        out.append(result)
    return out


def table(results: Sequence[LogitsResult]) -> list[str]:
    """One line per engine and case: verdict, largest difference, tolerance, first row off."""
    width = max([6, *(len(r.engine) for r in results)])
    lines = [f"{'engine':{width}}  {'case':22}  {'verdict':13}  {'max |diff|':10}  tolerance"]
    for r in results:
        diff = "-" if r.max_abs_diff is None else f"{r.max_abs_diff:.3g}"
        tol = "-" if r.tolerance is None else f"{r.tolerance:.3g}"
        lines.append(f"{r.engine:{width}}  {r.case:22}  {r.verdict:13}  {diff:10}  {tol}")
        if r.verdict != "same" and r.note:
            lines.append(f"  note: {r.note[:300]}")
    return lines
