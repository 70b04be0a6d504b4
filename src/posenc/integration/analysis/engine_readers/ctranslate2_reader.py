"""Read a config's RoPE the way CTranslate2 converts and runs it, and print its cos/sin tables.

Runs under CTranslate2's own Python (``posenc engines build ctranslate2``'s environment:
ctranslate2, transformers, torch): standard library and those packages only, never posenc.

Two steps, as CTranslate2 has them:

1. **The converter's reading (run).** CTranslate2's ``TransformersConverter``
   (``ctranslate2/converters/transformers.py``) loads the config with
   ``AutoConfig.from_pretrained``, picks the loader registered for the config's class
   (``LlamaLoader``, ``Qwen2Loader``, ``Phi3Loader``, ``Gemma3Loader``, ...) and the loader
   writes the model spec's rotary attributes (``rotary_dim``, ``rotary_interleave``,
   ``rotary_base``, ``rotary_scaling_type``, ``rotary_scaling_factor``, the LongRoPE factors,
   ``original_max_position_embeddings``, ``max_position_embeddings``, Llama 3's
   ``rotary_low_freq_factor`` / ``rotary_high_freq_factor``). The reader runs that code on
   the config (``config.json`` written to a temporary directory), with two changes the note
   states: the model is ``from_config`` (random weights of the config's own sizes) instead of
   ``from_pretrained``, and the tokenizer is a word-level ``PreTrainedTokenizerFast`` of the
   config's vocabulary size. The spec is then checked as ``Converter.convert`` checks it
   (``ModelSpec.validate``), and the rotary attributes are read from ``spec.variables()``,
   the variables ``model.bin`` stores, by the names the runtime reads them
   (``decoder/layer_N/self_attention/rotary_*``). Whatever the converter raises
   (``NotImplementedError`` for an unsupported ``rope_type``, ``ValueError`` for a config
   class with no loader, a missing required variable) is the refusal.

2. **The runtime's tables (restated).** The C++ runtime computes the tables in
   ``src/layers/attention_layer.cc`` (``make_rotary_embeddings`` reads the attributes with
   their defaults; ``RotaryEmbeddings::apply`` builds the table at the first forward with
   ``max(offset + length, 2048)`` rows and rebuilds it larger when a sequence runs past it;
   ``RotaryEmbeddings::initialize`` computes it). That code is compiled into the wheel and no
   Python API exposes the table, so :func:`_runtime_tables` restates ``initialize`` (in
   float32, as it computes) and the answer's note says so. End-to-end logits (below) check
   the restatement against the runtime itself.

A ``{"logits": ...}`` request converts the checkpoint with ``TransformersConverter``
(float32, no quantisation) into a temporary directory, loads ``ctranslate2.Generator`` on the
CPU in float32 and runs one prefill with ``Generator.forward_batch`` (which returns the raw
logits of every position: ``return_log_probs=False``).

The protocol (request, batch, answer) is ``protocol.py``'s.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import shutil
import sys
import tempfile
from typing import Any

#: ``RotaryEmbeddings``' first table size (``make_rotary_embeddings``: num_initial_positions).
INITIAL_POSITIONS = 2048
#: ``include/ctranslate2/layers/attention_layer.h``: enum class RotaryScalingType.
SCALING_TYPES = {-1: "none", 0: "linear", 1: "su (LongRoPE)", 2: "llama3"}
RUNTIME = "src/layers/attention_layer.cc: RotaryEmbeddings::initialize"
SWITCHING_SU = (
    "when the table is built, from its size: RotaryEmbeddings::apply builds it at the first "
    f"forward with max(offset + length, {INITIAL_POSITIONS}) rows and rebuilds it (at least "
    f"{INITIAL_POSITIONS} rows longer) when a sequence runs past it; RotaryEmbeddings::initialize "
    "uses the long factors for every row iff that row count > original_max_position_embeddings "
    "(src/layers/attention_layer.cc); the table lives in the layer, kept across requests"
)


def _versions() -> str:
    v = importlib.metadata.version
    return f"ctranslate2 {v('ctranslate2')}, transformers {v('transformers')}"


def _quiet() -> None:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _vocab_size(config: dict[str, Any]) -> int:
    text = config.get("text_config")
    size = config.get("vocab_size") or (text.get("vocab_size") if isinstance(text, dict) else 0)
    return max(int(size or 0), 3)


def _tokenizer(size: int) -> Any:
    """A word-level fast tokenizer of ``size`` tokens (ids 0, 1, 2: unk, bos, eos)."""
    import tokenizers
    import transformers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"t{i}": i for i in range(3, size)}}
    model = tokenizers.models.WordLevel(vocab, unk_token="<unk>")
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizers.Tokenizer(model),
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
    )


def _converter(path: str, vocab: int) -> Any:
    """CTranslate2's ``TransformersConverter`` on ``path``, its model and tokenizer made
    from the config (random weights of its sizes; a word-level vocabulary of ``vocab``)."""
    from ctranslate2.converters import TransformersConverter

    class FromConfig(TransformersConverter):
        def load_model(self, model_class: Any, model_name_or_path: str, **kwargs: Any) -> Any:
            import torch

            config = kwargs["config"]
            make = getattr(model_class, "from_config", None) or model_class._from_config
            dtype = kwargs.get("dtype")
            dtype = dtype if isinstance(dtype, torch.dtype) else torch.float32
            return make(config, dtype=dtype)

        def load_tokenizer(self, tokenizer_class: Any, model_name_or_path: str, **kw: Any) -> Any:
            return _tokenizer(vocab)

    return FromConfig(path)


def _spec_variables(config: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The converted spec's variables (``spec.variables()``) and the loader that wrote them."""
    _quiet()
    import transformers
    from ctranslate2.converters import transformers as ct_transformers

    directory = tempfile.mkdtemp(prefix="posenc-ct2-config-")
    try:
        with open(os.path.join(directory, "config.json"), "w") as f:
            json.dump(config, f)
        converter = _converter(directory, _vocab_size(config))
        spec = converter._load()  # TransformersConverter._load: the loader's get_model_spec
        spec.validate()  # Converter.convert's check (required variables set)
        # the loader _load picked (by the config's class name), named in the answer
        name = type(transformers.AutoConfig.from_pretrained(directory)).__name__
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    loader = type(ct_transformers._MODEL_LOADERS[name]).__name__
    return {k: _value(v) for k, v in spec.variables().items()}, f"{loader} ({name})"


def _value(v: Any) -> Any:
    """A spec variable as a Python value (scalars) or a list (arrays)."""
    import numpy as np

    array = v.numpy() if hasattr(v, "numpy") else np.asarray(v)
    if hasattr(array, "detach"):  # a torch tensor
        array = array.detach().float().numpy()
    array = np.asarray(array)
    return array.item() if array.ndim == 0 else array


def _attention(variables: dict[str, Any], layer: int) -> dict[str, Any]:
    """The rotary attributes of ``decoder/layer_{layer}/self_attention`` as
    ``make_rotary_embeddings`` reads them (with its defaults)."""
    scope = f"decoder/layer_{layer}/self_attention"
    if not any(k.startswith(scope + "/") for k in variables):
        raise ValueError(f"layer {layer}: the converted model has no {scope}")

    def get(name: str, default: Any) -> Any:
        return variables.get(f"{scope}/{name}", default)

    num_heads = int(variables["decoder/num_heads"])
    d_model = int(variables[f"{scope}/linear_1/weight"].shape[0])
    head_dim = int(get("head_dim", d_model // num_heads))
    rotary_dim = int(get("rotary_dim", -1))
    return {
        "scope": scope,
        "rotary_dim": rotary_dim,  # < 0: no RotaryEmbeddings; 0: the whole head
        "dim": head_dim if rotary_dim == 0 else rotary_dim,
        "head_dim": head_dim,
        "interleave": bool(get("rotary_interleave", True)),
        "base": float(get("rotary_base", 10000.0)),
        "scaling_type": int(get("rotary_scaling_type", -1)),
        "scaling_factor": float(get("rotary_scaling_factor", 1.0)),
        "long_factor": get("rotary_scaling_long_factor", None),
        "short_factor": get("rotary_scaling_short_factor", None),
        "original_max_position_embeddings": int(get("original_max_position_embeddings", 0)),
        "max_position_embeddings": int(get("max_position_embeddings", 0)),
        "high_freq_factor": float(get("rotary_high_freq_factor", 4.0)),
        "low_freq_factor": float(get("rotary_low_freq_factor", 1.0)),
        "queries_scale": get("queries_scale", None),
    }


def _mscale(a: dict[str, Any]) -> float:
    """``initialize``'s last step: the factor on sin and cos (1 when it does not apply).

    ``float scale = _max_position_embeddings / _original_max_position_embeddings`` is an
    integer division (both ``dim_t``); ``sqrt(1 + log(scale) / log(original))`` when > 1; for
    every scaling type but Llama3, whenever both attributes are set.
    """
    original, longest = a["original_max_position_embeddings"], a["max_position_embeddings"]
    if original == 0 or longest == 0 or a["scaling_type"] == 2:
        return 1.0
    scale = float(longest // original)
    if scale <= 1:
        return 1.0
    import numpy as np

    log_scale = float(np.log(np.float32(scale)))  # std::log(float)
    return float(np.float32(math.sqrt(1 + log_scale / math.log(original))))


def _runtime_tables(a: dict[str, Any], num_positions: int, positions: list[int]) -> Any:
    """``RotaryEmbeddings::initialize(num_positions, dim)`` restated in float32: the cos and
    sin rows at ``positions`` (one value per pair, pairs in frequency order), and the factor
    set used (LongRoPE)."""
    import numpy as np

    f32 = np.float32
    dim = a["dim"]
    base = f32(a["base"])
    i = np.arange(dim // 2)
    powers = np.power(base, (i * 2).astype(f32) / f32(dim)).astype(f32)  # std::pow(float)
    chosen = None
    if a["scaling_type"] == 1:  # Su: one factor set for the whole table
        chosen = "long" if num_positions > a["original_max_position_embeddings"] else "short"
        factors = a[f"{chosen}_factor"]
        if factors is None:
            raise ValueError(f"no rotary_scaling_{chosen}_factor in the converted model")
        inv_freq = (f32(1) / (np.asarray(factors, dtype=f32)[: dim // 2] * powers)).astype(f32)
    else:
        inv_freq = (f32(1) / powers).astype(f32)
        if a["scaling_type"] == 2:  # Llama3
            factor = f32(a["scaling_factor"])
            low, high = f32(a["low_freq_factor"]), f32(a["high_freq_factor"])
            old = f32(a["original_max_position_embeddings"])
            low_wavelen, high_wavelen = old / low, old / high
            new = inv_freq.copy()
            for k, freq in enumerate(inv_freq):
                wavelen = f32(2.0 * math.pi / float(freq))  # 2.0f * M_PI: a double
                if wavelen < high_wavelen:
                    continue
                if wavelen > low_wavelen:
                    new[k] = freq / factor
                else:
                    smooth = (old / wavelen - low) / (high - low)
                    new[k] = (f32(1) - smooth) * freq / factor + smooth * freq
            inv_freq = new
    t = np.asarray(positions, dtype=f32)
    if a["scaling_type"] == 0:  # Linear: t = i / factor
        t = (t / f32(a["scaling_factor"])).astype(f32)
    freqs = (t[:, None] * inv_freq[None, :]).astype(f32)  # MatMul of (n, 1) by (1, dim / 2)
    m = f32(_mscale(a))
    cos = (np.cos(freqs) * m).astype(f32)
    sin = (np.sin(freqs) * m).astype(f32)
    return cos.tolist(), sin.tolist(), chosen


def _describe(a: dict[str, Any]) -> str:
    kind = SCALING_TYPES.get(a["scaling_type"], str(a["scaling_type"]))
    parts = [f"rotary_dim {a['rotary_dim']} (rotates {a['dim']} of head_dim {a['head_dim']})",
             f"base {a['base']:g}", f"scaling {kind}"]  # fmt: skip
    if a["scaling_type"] == 0:
        parts.append(f"factor {a['scaling_factor']:g}")
    if a["scaling_type"] == 2:
        parts.append(f"factor {a['scaling_factor']:g} (default 1 when the spec has none), "
                     f"low/high {a['low_freq_factor']:g}/{a['high_freq_factor']:g}, "
                     f"original {a['original_max_position_embeddings']}")  # fmt: skip
    if a["original_max_position_embeddings"] or a["max_position_embeddings"]:
        parts.append(f"original/max {a['original_max_position_embeddings']}/"
                     f"{a['max_position_embeddings']}")  # fmt: skip
    return ", ".join(parts)


def _tables_answer(request: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    config = dict(request["config"])
    variables, loader = _spec_variables(config)
    windows, seen = [], {}
    switching = None
    for w in request["windows"]:
        layer = int(w.get("layer") or 0)
        if layer not in seen:
            seen[layer] = _attention(variables, layer)
        a = seen[layer]
        positions = [int(p) for p in w["positions"]]
        seq_len = int(w["seq_len"])
        mode = ""
        if a["rotary_dim"] < 0:
            pairs = a["head_dim"] // 2
            cos = [[1.0] * pairs for _ in positions]
            sin = [[0.0] * pairs for _ in positions]
            rotates = False
            mode = f"{a['scope']} has no rotary_dim: no RotaryEmbeddings, q/k not rotated"
        else:
            num_positions = max(seq_len, INITIAL_POSITIONS)
            cos, sin, chosen = _runtime_tables(a, num_positions, positions)
            rotates = True
            mode = (f"{RUNTIME} restated, the table of a fresh model's first prefill of "
                    f"{seq_len} tokens ({num_positions} rows)")  # fmt: skip
            if chosen:
                mode += f"; {chosen} factors"
                switching = SWITCHING_SU
        if w.get("position_ids") is not None:
            mode += "; at the token index (CTranslate2's RotaryEmbeddings take token offsets)"
        windows.append({"seq_len": seq_len, "positions": positions, "cos": cos, "sin": sin,
                        "mode": mode, "layer_type": w.get("layer_type"), "rotates": rotates,
                        "module": f"{a['scope']} ({_describe(a)})"})  # fmt: skip
    first = seen[min(seen)]
    c0, s0 = windows[0]["cos"][0][0], windows[0]["sin"][0][0]
    qs = first["queries_scale"]
    softmax = float(qs) if isinstance(qs, float) else float(np.float32(1) / np.sqrt(
        np.float32(first["head_dim"])))  # fmt: skip
    return {
        "version": _versions(),
        "source": "installed",
        "module": f"ctranslate2 converters/transformers.py {loader} -> {RUNTIME}",
        "layout": "interleaved" if first["interleave"] else "half",
        "rotary_dim": first["dim"] if first["rotary_dim"] >= 0 else 0,
        "dtype": "float32",
        "attention_scaling": (c0 * c0 + s0 * s0) ** 0.5,
        "softmax_scale": softmax,
        "switching": switching,
        "windows": windows,
        "note": "the converter's loader ran on the config (ctranslate2/converters/"
        "transformers.py: TransformersConverter._load, random weights from_config and a "
        "word-level tokenizer instead of from_pretrained); the rotary attributes are the "
        "spec's variables; the runtime's tables are RESTATED from "
        "src/layers/attention_layer.cc (make_rotary_embeddings, RotaryEmbeddings::apply and "
        "::initialize), not read from the compiled runtime",
    }


def _logits_answer(request: dict[str, Any]) -> dict[str, Any]:
    _quiet()
    import ctranslate2
    import numpy as np
    from ctranslate2.converters import TransformersConverter

    asked = request["logits"]
    tokens = [int(t) for t in asked["tokens"]]
    rows = [int(r) for r in asked["rows"]]
    out = tempfile.mkdtemp(prefix="posenc-ct2-model-")
    try:
        TransformersConverter(asked["checkpoint"]).convert(out, quantization="float32",
                                                            force=True)  # fmt: skip
        generator = ctranslate2.Generator(out, device="cpu", compute_type="float32")
        logits = np.asarray(generator.forward_batch([tokens], return_log_probs=False))[0]
        del generator
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return {
        "version": _versions(),
        "converter": "ctranslate2/converters/transformers.py: TransformersConverter.convert "
        "(quantization float32)",
        "runtime": "ctranslate2.Generator(device='cpu', compute_type='float32').forward_batch",
        "dtype": "float32",
        "mode": f"one prefill of {len(tokens)} tokens (forward_batch, return_log_probs=False: "
        "the logits of every position)",
        "rows": rows,
        "logits": logits[rows].astype(float).tolist(),
        "note": "",
    }


def _refusal(exc: BaseException) -> dict[str, Any]:
    """protocol.refusal's answer, its ``where`` the innermost frame in ctranslate2's own
    code when the error was raised further in (torch's ``Module.__getattr__`` for an
    attribute the converter reads off a transformers module)."""
    import traceback

    from protocol import refusal

    out: dict[str, Any] = refusal(exc)
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if "site-packages/ctranslate2/" in f.filename]  # fmt: skip
    if frames and "ctranslate2/" not in out.get("where", ""):
        f = frames[-1]
        name = "ctranslate2/" + f.filename.rpartition("site-packages/ctranslate2/")[2]
        out["where"] = f"{name}:{f.lineno} in {f.name} (raised at {out.get('where')})"
    out["version"] = _versions()
    return out


def answer(request: dict[str, Any]) -> dict[str, Any]:
    """Build the answer to one request: the tables CTranslate2 applies, or its logits."""
    try:
        if "logits" in request:
            return _logits_answer(request)
        return _tables_answer(request)
    except Exception as exc:  # the converter's (or the runtime's) own error: a refusal
        return _refusal(exc)


if __name__ == "__main__":
    from protocol import serve

    sys.exit(serve(answer))
