"""Read a config's RoPE the way llama.cpp does, and print its cos/sin tables.

Runs under llama.cpp's own Python (its environment in the user cache, built by
``posenc engines build llama.cpp`` from ``engine_recipes/llama.cpp.sh``): standard
library, numpy, torch and transformers (what llama.cpp's converter imports), never posenc.
The environment holds, from the llama.cpp source vendored in the ``llama-cpp-python``
sdist, the converter
(``llama.cpp/convert_hf_to_gguf.py``, its ``conversion/`` package and its own
``gguf-py``), and built from that source, CPU only, under ``ggml/``: ggml's libraries,
libllama, and ``llama-rope-args``
(:mod:`~posenc.analysis.engine_readers.llamacpp_graph`); ``llama.cpp/BUILD_INFO.json``
names the commit and build.

llama.cpp reads an HF config in three steps, and the reader runs them:

1. **The converter** (its code, unchanged): the config is written as ``config.json`` in
   a scratch model directory, read by ``ModelBase.load_hparams`` (transformers'
   ``AutoConfig`` and ``to_dict``, as the converter reads every config), the model class
   is picked by ``get_model_class`` from the config's ``architectures`` (when the config
   has none, from its ``model_type``: :data:`ARCHITECTURES`, and the note says so), and
   the class's ``set_gguf_parameters`` and ``generate_extra_tensors`` write the GGUF
   keys and the ``rope_freqs`` / ``rope_factors_long`` / ``rope_factors_short``
   tensors, written to a GGUF file with gguf-py's writer and read back with its reader.
2. **libllama** turns those keys into the arguments of ``ggml_rope_ext`` /
   ``ggml_rope_multi`` (loader, context, model graph):
   :mod:`~posenc.analysis.engine_readers.llamacpp_graph` converts a
   tiny random checkpoint of the config, loads it in libllama with a context of
   ``seq_len`` tokens and reads the arguments off the graph's ``ROPE`` nodes (the first
   node of the window's ``layer``, else layer 0). Where no tiny checkpoint can be built
   (transformers refuses the config, a vision tower) or libllama aborts, the step is
   **restated** in :func:`rope_arguments` (and :func:`is_swa_layer`), the answer's
   ``source`` says so, and the note says why; where libllama ran, the restated step is
   computed too and the note says whether it agrees (a check of the restatement).
3. **ggml** computes the tables: the op is built on a small graph of unit vectors (1 in
   the first channel of every pair, 0 in the second; one token per asked position,
   since ggml's rope is per token and a prefill computes the same rows) and computed by
   ggml's CPU backend through ctypes; the rotated pair holds ``(m cos, m sin)``, ``m``
   being the scale ggml multiplies in (YaRN's ``attn_factor`` times its own ``1 + 0.1
   ln(1 / freq_scale)``).

Whether a layer rotates (each window's ``rotates``) is libllama's graph's word: a layer
with no ``ROPE`` node where the graph ran is not rotated (``models/smollm3.cpp``'s fixed
``n_no_rope_layer_step`` 4, ``models/cohere2.cpp``'s full-attention layers) and gets
rows of cos 1 and sin 0; where libllama did not run, :func:`restated_rotates` restates
those two rules. Where the restated step lacks the architecture (``rope_arguments``
raises ``NotImplementedError``) but libllama ran, the graph alone gives the arguments
and the note says so. ``switching`` (:func:`switching`) is LongRoPE's choice of factors
by the context size, or "never" for a LongRoPE or dynamic config with nothing to switch.

llama.cpp has no dynamic NTK: ``seq_len`` changes nothing but LongRoPE's choice of
factors, which llama.cpp makes from the context size (``n_ctx_seq >
n_ctx_orig_yarn``), not from the tokens seen; the reader states a context of
``seq_len`` tokens. M-RoPE windows with ``position_ids`` go through
``ggml_rope_multi`` with those positions and a 4th axis of 0 (a text window gets every
axis at the token index and the 4th at 0, as llama.cpp's graph input does).

The protocol (request, batch, answer) is :mod:`~posenc.analysis.engine_readers.protocol`'s.
"""

from __future__ import annotations

import ctypes
import json
import logging
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

#: The environment's root: the virtual environment this Python runs in.
ENV = Path(sys.prefix)
#: llama.cpp's converter and gguf-py, copied from the vendored source.
SOURCE = ENV / "llama.cpp"

#: The converter picks its class from ``architectures[0]``; a config without it gets the
#: HF class of its ``model_type`` (what ``save_pretrained`` would have written).
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "qwen2_vl": "Qwen2VLForConditionalGeneration",
    "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
    "qwen3_vl": "Qwen3VLForConditionalGeneration",
    "gemma3_text": "Gemma3ForCausalLM",
    "gemma3": "Gemma3ForConditionalGeneration",
    "gemma2": "Gemma2ForCausalLM",
    "deepseek_v2": "DeepseekV2ForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "phi": "PhiForCausalLM",
    "stablelm": "StableLmForCausalLM",
    "gpt_neox": "GPTNeoXForCausalLM",
    "olmo2": "Olmo2ForCausalLM",
    "granite": "GraniteForCausalLM",
}

# ggml's rope modes (ggml.h's GGML_ROPE_TYPE_*)
NORM, NEOX, MROPE, IMROPE = 0, 2, 8, 40
#: ggml's names of its rope modes, by mode number.
MODE_NAMES = {NORM: "NORMAL", NEOX: "NEOX", MROPE: "MROPE", IMROPE: "IMROPE"}
GGML_TYPE_F32, GGML_TYPE_I32 = 0, 26

_LOG = logging.getLogger("llamacpp_reader")


# --------------------------------------------------------------------------------------
# Step 1: the converter (llama.cpp's own Python).


def _converter() -> Any:
    """Import the converter's ``conversion`` package and its gguf-py, as the script does."""
    for path in (SOURCE / "gguf-py", SOURCE):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    import conversion

    return conversion


def convert(config: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """Run the converter's model class on ``config``; the GGUF it writes, read back.

    Returns ``{"arch", "hf_arch", "class", "keys", "tensors", "notes"}``: ``keys`` maps
    each GGUF key (``llama.rope.freq_base``, ...) to its value, ``tensors`` each tensor
    the class generated (the rope factors) to its values.
    """
    conversion = _converter()
    import gguf

    notes = []
    config = dict(config)
    if not config.get("architectures"):
        model_type = str(config.get("model_type", ""))
        arch = ARCHITECTURES.get(model_type)
        if arch is None:
            arch = "LlamaForCausalLM"
            notes.append(f"model_type {model_type!r} has no known HF class: converted as "
                         f"{arch}")  # fmt: skip
        else:
            notes.append(f"the config has no architectures: {arch} (its model_type's class)")
        config["architectures"] = [arch]
    model_dir = workdir / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(config))
    base = conversion.ModelBase
    hparams = base.load_hparams(model_dir, False)
    hf_arch = conversion.get_model_architecture(hparams, conversion.ModelType.TEXT)
    cls = conversion.get_model_class(hf_arch)
    out = workdir / "rope.gguf"
    model = cls(model_dir, gguf.LlamaFileType.ALL_F32, out, hparams=hparams)
    model.set_gguf_parameters()
    extra = [(n, t) for n, t in model.generate_extra_tensors() if n.startswith("rope_")]
    writer = model.gguf_writer
    for name, tensor in extra:
        writer.add_tensor(name, tensor.float().numpy())
    writer.write_header_to_file(path=out)
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    reader = gguf.GGUFReader(out)
    keys = {}
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        value = field.contents()
        keys[name] = value
    tensors = {t.name: [float(x) for x in t.data.reshape(-1)] for t in reader.tensors}
    return {"arch": keys["general.architecture"], "hf_arch": hf_arch, "class": cls.__name__,
            "keys": keys, "tensors": tensors, "notes": notes, "module": cls.__module__,
            "permutes_qk": bool(getattr(cls, "undo_permute", False)),
            "config": config}  # fmt: skip


# --------------------------------------------------------------------------------------
# Step 2, RESTATED (not llama.cpp's code): GGUF keys -> ggml_rope_ext's arguments, the
# fallback where libllama cannot run, and the check of what it gives where it does.

#: ``llama_model_rope_type``: the rope mode of each llama.cpp architecture read here.
#: (llama-model.cpp, llama-cpp-python 0.3.36's vendored llama.cpp; GGUF names from
#: llama-arch.cpp LLM_ARCH_NAMES: gpt-oss is LLM_ARCH_OPENAI_MOE.)
ROPE_TYPES = {
    "llama": NORM, "deepseek2": NORM, "granite": NORM, "olmo": NORM, "mistral3": NORM,
    "qwen2": NEOX, "qwen3": NEOX, "qwen2moe": NEOX, "qwen3moe": NEOX, "phi2": NEOX,
    "phi3": NEOX, "stablelm": NEOX, "gemma": NEOX, "gemma2": NEOX, "gemma3": NEOX,
    "gptneox": NEOX, "olmo2": NEOX, "qwen2vl": MROPE, "qwen3vl": IMROPE,
    "qwen3vlmoe": IMROPE,
    "smollm3": NORM, "cohere2": NORM, "command-r": NORM, "deepseek": NORM, "llama4": NORM,
    "granitemoe": NORM, "internlm2": NORM, "minicpm": NORM,
    "gpt-oss": NEOX, "phimoe": NEOX, "minicpm3": NEOX, "olmoe": NEOX, "exaone": NEOX,
    "exaone4": NEOX, "gemma3n": NEOX, "qwen3next": NEOX, "starcoder2": NEOX,
    "qwen35": IMROPE, "qwen35moe": IMROPE,
}  # fmt: skip
#: Architectures whose ``load_arch_hparams`` reads ``rope.freq_base_swa``.
READS_FREQ_BASE_SWA = {"gemma2", "gemma3", "gemma3n", "cohere2", "cohere2moe", "exaone4",
                       "exaone-moe", "afmoe", "gpt-oss", "llama4"}  # fmt: skip
#: Architectures whose ``load_arch_hparams`` reads ``rope.dimension_sections``.
READS_SECTIONS = {"qwen2vl", "qwen3vl", "qwen3vlmoe", "glm4", "glm4moe", "ernie4_5"}
#: Architectures whose ``load_arch_hparams`` reads the YaRN keys themselves.
READS_YARN_KEYS = {"grok"}
#: Architectures whose ``load_arch_hparams`` reads ``rope.scaling.yarn_log_multiplier``.
READS_YARN_LOG_MUL = {"deepseek2", "deepseek32"}


#: ``load_swa_pattern``'s default period per architecture (when no pattern key is written).
SWA_PERIODS = {"gemma3": 6, "gemma2": 2, "cohere2": 4, "gpt-oss": 2}
#: Architectures whose ``load_arch_hparams`` starts the SWA layers' base and scale from the
#: full layers' (``rope_freq_base_train_swa = rope_freq_base_train``, the same for the
#: scale: models/gemma2.cpp, cohere2.cpp, openai-moe.cpp, ...); elsewhere the defaults of
#: llama-hparams.h (base 10000, scale 1).
SWA_INHERITS = {"gemma2", "cohere2", "cohere2moe", "gpt-oss", "exaone4", "exaone-moe",
                "afmoe", "llama4"}  # fmt: skip


def is_swa_layer(
    arch: str, keys: dict[str, Any], layer: int | None, layer_type: str | None
) -> tuple[bool, str]:
    """RESTATED: whether llama.cpp treats layer ``layer`` as sliding-window, and how.

    ``load_arch_hparams`` (Gemma 2/3) calls ``load_swa_pattern`` when
    ``attention.sliding_window`` is written and positive: the pattern key as an array (one
    flag per layer) or a period ``n`` (layer ``il`` is SWA when ``il % n < n - 1``), else
    the architecture's default period. Without a layer index, or for an architecture not
    restated here, the window's ``layer_type`` decides.
    """
    by_type = layer_type == "sliding_attention"
    window = keys.get(f"{arch}.attention.sliding_window")
    if layer is None or arch not in SWA_PERIODS:
        return by_type, "by the window's layer_type"
    if not window:
        return False, "no attention.sliding_window written: no SWA layer"
    pattern = keys.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, list):
        return bool(pattern[layer]), f"layer {layer} by the written sliding_window_pattern"
    n = int(pattern) if pattern is not None else SWA_PERIODS[arch]
    how = "written" if pattern is not None else "load_swa_pattern's default"
    return n == 0 or layer % n < n - 1, f"layer {layer} by period {n} ({how})"


def _f32(x: float) -> float:
    """``x`` rounded to float32 (the C code's ``float``)."""
    import numpy as np

    return float(np.float32(x))


def rope_arguments(
    arch: str,
    keys: dict[str, Any],
    tensors: dict[str, list[float]],
    n_ctx: int,
    swa: bool,
) -> dict[str, Any]:
    """RESTATED from llama.cpp (C++ in libllama, not run here): the rope op's arguments.

    ``keys`` are the GGUF's keys, ``n_ctx`` the context size (a context created with
    ``n_ctx`` tokens and default parameters), ``swa`` whether the layer is a sliding-window
    one. Restates ``llama-model.cpp``'s ``load_hparams`` (the generic rope keys and their
    defaults), the architecture's ``load_arch_hparams`` (which of ``freq_base_swa``,
    ``dimension_sections``, ``yarn_log_multiplier`` and the YaRN keys it reads),
    ``llama_model_rope_type``, ``llama-context.cpp``'s derivation of ``yarn_ext_factor``
    and ``yarn_attn_factor``, and the graph's per-layer ``get_rope_freq_base``,
    ``get_rope_freq_scale`` and ``get_rope_factors``. Float arithmetic is float32, as in C.
    """

    def key(name: str, default: Any = None) -> Any:
        return keys.get(f"{arch}.{name}", default)

    def first(value: Any) -> Any:
        return value[0] if isinstance(value, list) else value

    # load_hparams: generic keys and their defaults
    n_ctx_train = int(key("context_length"))
    n_ctx_orig = int(key("rope.scaling.original_context_length", n_ctx_train))
    freq_base = _f32(key("rope.freq_base", 10000.0))
    scaling_type = str(key("rope.scaling.type", "linear"))
    factor = key("rope.scaling.factor")
    if factor is None:
        factor = key("rope.scale_linear", 0.0)
    freq_scale = 1.0 if factor == 0 else _f32(1.0 / _f32(factor))
    freq_scale_swa = freq_scale if arch in SWA_INHERITS else 1.0  # hparams', not the context's
    rope_attn_factor = _f32(key("rope.scaling.attn_factor", 1.0))
    n_head = int(first(key("attention.head_count")))
    head_k = int(key("attention.key_length", int(key("embedding_length")) // n_head))
    n_rot = int(key("rope.dimension_count", head_k))
    # load_arch_hparams
    swa_default = freq_base if arch in SWA_INHERITS else 10000.0
    freq_base_swa = _f32(key("rope.freq_base_swa", swa_default)) \
        if arch in READS_FREQ_BASE_SWA else swa_default  # fmt: skip
    sections = [0, 0, 0, 0]
    if arch in READS_SECTIONS and key("rope.dimension_sections") is not None:
        sections = [int(s) for s in key("rope.dimension_sections")][:4]
    yarn_ext, yarn_attn, beta_fast, beta_slow = -1.0, 1.0, 32.0, 1.0
    if arch in READS_YARN_KEYS:
        yarn_ext = _f32(key("rope.scaling.yarn_ext_factor", yarn_ext))
        yarn_attn = _f32(key("rope.scaling.yarn_attn_factor", yarn_attn))
        beta_fast = _f32(key("rope.scaling.yarn_beta_fast", beta_fast))
        beta_slow = _f32(key("rope.scaling.yarn_beta_slow", beta_slow))
    log_mul = 0.0
    if arch in READS_YARN_LOG_MUL and key("rope.scaling.yarn_log_multiplier") is not None:
        log_mul = _f32(_f32(key("rope.scaling.yarn_log_multiplier")) / _f32(0.1))
    if arch not in ROPE_TYPES:
        raise NotImplementedError(f"llama_model_rope_type for architecture {arch!r} is not "
                                  "restated in this reader")  # fmt: skip
    mode = ROPE_TYPES[arch]
    # the context (default llama_context_params: every rope/yarn override unset)
    if scaling_type == "none":
        freq_scale = 1.0
    ext_factor = yarn_ext if yarn_ext >= 0 else (1.0 if scaling_type == "yarn" else 0.0)
    attn_factor = yarn_attn
    if ext_factor != 0:
        f = _f32(1.0 / freq_scale)

        def mscale(s: float, m: float) -> float:
            return 1.0 if s <= 1 else _f32(0.1 * m * math.log(s) + 1.0)

        if log_mul != 0:
            m = log_mul if arch == "deepseek2" and log_mul != 1 else 1.0
            attn_factor = _f32(mscale(f, m) / mscale(f, log_mul))
        else:
            attn_factor = mscale(f, 1.0)
        attn_factor = _f32(attn_factor * _f32(1.0 / _f32(1.0 + 0.1 * math.log(f))))
    attn_factor = _f32(attn_factor * rope_attn_factor)
    # the graph, per layer
    factors = tensors.get("rope_freqs.weight")
    factors_name = "rope_freqs.weight" if factors is not None else None
    if factors is None and "rope_factors_long.weight" in tensors:
        factors_name = "rope_factors_long.weight" if n_ctx > n_ctx_orig \
            else "rope_factors_short.weight"  # fmt: skip
        factors = tensors[factors_name]
    # deepseek2's graph moves YaRN's magnitude into the softmax scale (kq_scale)
    softmax_scale = None
    if arch == "deepseek2":
        org = _f32(attn_factor * (1.0 + 0.1 * math.log(1.0 / freq_scale)))
        m = _f32(org * (1.0 + 0.1 * log_mul * math.log(1.0 / freq_scale)))
        head_mla = int(key("attention.key_length_mla", head_k))
        softmax_scale = _f32(m * m / math.sqrt(head_mla))
    return {
        "n_dims": n_rot,
        "mode": mode,
        "n_ctx_orig": n_ctx_orig,
        "freq_base": freq_base_swa if swa else freq_base,
        "freq_scale": freq_scale_swa if swa else freq_scale,
        "ext_factor": ext_factor,
        "attn_factor": attn_factor,
        "beta_fast": beta_fast,
        "beta_slow": beta_slow,
        "freq_factors": factors,
        "freq_factors_name": factors_name,
        "sections": sections,
        "softmax_scale": softmax_scale,
        "scaling_type": scaling_type,
    }


# --------------------------------------------------------------------------------------
# Step 3: ggml's rope (its C, through ctypes).


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p),
                ("no_alloc", ctypes.c_bool)]  # fmt: skip


_GGML: Any = None


def ggml() -> Any:
    """ggml's base and CPU libraries, with the signatures the reader calls."""
    global _GGML
    if _GGML is not None:
        return _GGML
    lib = ENV / "ggml"
    base = ctypes.CDLL(str(lib / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(str(lib / "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
    p, i, i64, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
    sig = {
        (base, "ggml_init"): (p, [_InitParams]),
        (base, "ggml_free"): (None, [p]),
        (base, "ggml_new_tensor_1d"): (p, [p, i, i64]),
        (base, "ggml_new_tensor_3d"): (p, [p, i, i64, i64, i64]),
        (base, "ggml_get_data"): (p, [p]),
        (base, "ggml_rope_ext"): (p, [p, p, p, p, i, i, i, f, f, f, f, f, f]),
        (base, "ggml_rope_multi"): (
            p,
            [p, p, p, p, i, ctypes.POINTER(i), i, i, f, f, f, f, f, f],
        ),
        (base, "ggml_new_graph"): (p, [p]),
        (base, "ggml_build_forward_expand"): (None, [p, p]),
        (cpu, "ggml_graph_compute_with_ctx"): (i, [p, p, i]),
    }
    for (library, name), (restype, argtypes) in sig.items():
        fn = getattr(library, name)
        fn.restype, fn.argtypes = restype, argtypes
    _GGML = (base, cpu)
    return _GGML


def ggml_rope(
    args: dict[str, Any], positions: list[int], position_ids: list[list[int]] | None = None
) -> tuple[list[list[float]], list[list[float]], str]:
    """ggml's rotated unit vectors at ``positions``: ``(cos, sin)`` per pair, and the op.

    ``args`` are :func:`rope_arguments`' (or any set of ggml's arguments). NORM mode pairs
    channels ``(2k, 2k + 1)``; NEOX and the M-RoPE modes pair ``(k, k + n_dims / 2)``.
    ``position_ids`` (M-RoPE): temporal, height and width positions per row.
    """
    import numpy as np

    base, cpu = ggml()
    n_dims, mode, n = int(args["n_dims"]), int(args["mode"]), len(positions)
    pairs = n_dims // 2
    multi = mode in (MROPE, IMROPE)
    ctx = base.ggml_init(_InitParams(64 * 1024 * 1024, None, False))
    if not ctx:
        raise MemoryError("ggml_init failed")
    try:
        a = base.ggml_new_tensor_3d(ctx, GGML_TYPE_F32, n_dims, 1, n)
        unit = np.zeros((n, n_dims), dtype=np.float32)
        if mode == NORM:
            unit[:, 0::2] = 1.0
        else:
            unit[:, :pairs] = 1.0
        ctypes.memmove(base.ggml_get_data(a), unit.ctypes.data, unit.nbytes)
        if multi:
            axes = position_ids if position_ids is not None else [positions] * 3
            pos = np.zeros((4, n), dtype=np.int32)
            for k in range(3):
                pos[k] = axes[k]
        else:
            pos = np.asarray(positions, dtype=np.int32)
        b = base.ggml_new_tensor_1d(ctx, GGML_TYPE_I32, pos.size)
        ctypes.memmove(base.ggml_get_data(b), np.ascontiguousarray(pos).ctypes.data, pos.nbytes)
        c = None
        if args.get("freq_factors") is not None:
            ff = np.asarray(args["freq_factors"], dtype=np.float32)
            c = base.ggml_new_tensor_1d(ctx, GGML_TYPE_F32, ff.size)
            ctypes.memmove(base.ggml_get_data(c), ff.ctypes.data, ff.nbytes)
        floats = [float(args[k]) for k in ("freq_base", "freq_scale", "ext_factor",
                                          "attn_factor", "beta_fast", "beta_slow")]  # fmt: skip
        if multi:
            sections = (ctypes.c_int * 4)(*[int(s) for s in args["sections"]])
            out = base.ggml_rope_multi(ctx, a, b, c, n_dims, sections, mode,
                                       int(args["n_ctx_orig"]), *floats)  # fmt: skip
            op = f"ggml_rope_multi (mode {MODE_NAMES[mode]}, sections {list(args['sections'])})"
        else:
            out = base.ggml_rope_ext(ctx, a, b, c, n_dims, mode, int(args["n_ctx_orig"]),
                                     *floats)  # fmt: skip
            op = f"ggml_rope_ext (mode {MODE_NAMES[mode]})"
        graph = base.ggml_new_graph(ctx)
        base.ggml_build_forward_expand(graph, out)
        status = cpu.ggml_graph_compute_with_ctx(ctx, graph, 1)
        if status != 0:
            raise RuntimeError(f"ggml_graph_compute_with_ctx returned {status}")
        result = np.empty((n, n_dims), dtype=np.float32)
        ctypes.memmove(result.ctypes.data, base.ggml_get_data(out), result.nbytes)
    finally:
        base.ggml_free(ctx)
    if mode == NORM:
        cos, sin = result[:, 0::2], result[:, 1::2]
    else:
        cos, sin = result[:, :pairs], result[:, pairs:]
    return cos.tolist(), sin.tolist(), op


# --------------------------------------------------------------------------------------
# The answer.


def build_info() -> dict[str, Any]:
    """The vendored llama.cpp's commit and the versions the build script recorded."""
    path = SOURCE / "BUILD_INFO.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _version() -> str:
    info = build_info()
    commit = info.get("commit", "?")
    build = info.get("build")
    head = f"llama.cpp b{build} ({commit})" if build else f"llama.cpp {commit}"
    return (f"{head}, vendored by llama-cpp-python {info.get('llama_cpp_python', '?')}; "
            f"gguf-py {info.get('gguf', '?')} (the converter's own); "
            f"transformers {_dist_version('transformers')}")  # fmt: skip


def _dist_version(name: str) -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def _written(conv: dict[str, Any]) -> str:
    """The rope keys the converter wrote, as ``key=value``."""
    arch = conv["arch"]
    parts = []
    for name, value in conv["keys"].items():
        if name.startswith(f"{arch}.rope.") or name in (
            f"{arch}.context_length",
            f"{arch}.attention.key_length",
            f"{arch}.attention.sliding_window",
        ):
            short = name[len(arch) + 1 :]
            shown = value if not isinstance(value, list) or len(value) <= 8 \
                else f"[{len(value)} values]"  # fmt: skip
            parts.append(f"{short}={shown}")
    parts += [f"{n}[{len(v)}]" for n, v in conv["tensors"].items()]
    return ", ".join(parts)


#: The arguments compared between libllama's graph and the restated step.
_COMPARED = ("n_dims", "mode", "n_ctx_orig", "freq_base", "freq_scale", "ext_factor",
             "attn_factor", "beta_fast", "beta_slow")  # fmt: skip


def _graph(conv: dict[str, Any], workdir: Path, contexts: set[int]) -> tuple[Any, str]:
    """libllama's ROPE nodes per window length, or ``None`` and why not."""
    import llamacpp_graph

    if not llamacpp_graph.available():
        return None, "this environment has no libllama (llama-rope-args)"
    keys, arch = conv["keys"], conv["arch"]
    n_orig = int(keys.get(f"{arch}.rope.scaling.original_context_length",
                          keys.get(f"{arch}.context_length", 0)))  # fmt: skip
    try:
        path = llamacpp_graph.full_gguf(conv["config"], workdir)
        out = {}
        for n in sorted(contexts):
            out[n] = llamacpp_graph.rope_nodes(path, llamacpp_graph.context_for(n, n_orig))
            out[n]["n_ctx"] = llamacpp_graph.context_for(n, n_orig)
        return out, ""
    except Exception as exc:  # any failure: fall back to the restated step, saying why
        text = str(exc).strip().splitlines()
        return None, f"{type(exc).__name__}: {text[0][:300] if text else ''}"


def _from_node(node: dict[str, Any], tensors: dict[str, list[float]]) -> dict[str, Any]:
    """ggml's arguments as libllama's graph node holds them."""
    args = {k: node[k] for k in _COMPARED}
    args["sections"] = list(node["sections"])
    name = node.get("freq_factors") or None
    args["freq_factors_name"] = name
    args["freq_factors"] = tensors.get(name) if name else None
    if name and args["freq_factors"] is None:
        raise ValueError(f"libllama's node reads {name}, which the converter did not write")
    return args


def _disagreements(graph_args: dict[str, Any], restated: dict[str, Any]) -> list[str]:
    """Where the restated step differs from libllama's node (a check of the restatement)."""
    out = []
    for k in _COMPARED:
        a, b = float(graph_args[k]), float(restated[k])
        if abs(a - b) > 1e-6 * max(1.0, abs(a)):
            out.append(f"{k} {b:.9g} (libllama {a:.9g})")
    if (graph_args["freq_factors_name"] or None) != (restated["freq_factors_name"] or None):
        out.append(f"freq_factors {restated['freq_factors_name']} "
                   f"(libllama {graph_args['freq_factors_name']})")  # fmt: skip
    if graph_args["mode"] in (MROPE, IMROPE) and graph_args["sections"] != restated["sections"]:
        out.append(f"sections {restated['sections']} (libllama {graph_args['sections']})")
    return out


def logits(request: dict[str, Any]) -> dict[str, Any]:
    """The ``"logits"`` request: the converter turns the checkpoint into a float32 GGUF
    (``llamacpp_graph.convert_checkpoint``: the class ``convert_hf_to_gguf.py`` picks,
    with a stand-in vocabulary) and libllama decodes the prompt as one batch
    (``llama-logits``: float32 K/V caches, no flash attention, a context of the prompt's
    length, which is also the context LongRoPE's choice of factors reads)."""
    import llamacpp_graph

    ask = request["logits"]
    if not llamacpp_graph.LOGITS_DRIVER.exists():
        raise FileNotFoundError(f"{llamacpp_graph.LOGITS_DRIVER}: rebuild the environment "
                                "(posenc engines build llama.cpp --force)")  # fmt: skip
    rows = [int(r) for r in ask["rows"]]
    tokens = [int(t) for t in ask["tokens"]]
    _converter()
    with tempfile.TemporaryDirectory(prefix="llamacpp-logits-") as tmp:
        path = llamacpp_graph.convert_checkpoint(Path(ask["checkpoint"]), Path(tmp) / "model.gguf")
        values = llamacpp_graph.run_logits(path, tokens, rows)
    return {
        "version": _version(),
        "converter": "convert_hf_to_gguf.py: get_model_class(...).prepare_tensors and "
        "prepare_metadata, float32 (stand-in vocabulary)",
        "runtime": f"libllama {build_info().get('commit', '?')}: llama_decode on the CPU",
        "dtype": "float32",
        "mode": f"one batch of {len(tokens)} tokens in a context of {len(tokens)} (float32 "
        "K/V caches, flash attention off)",
        "rows": rows,
        "logits": values,
        "note": "",
    }


def answer(request: dict[str, Any]) -> dict[str, Any]:
    """Build the answer to one request: the converter's keys, libllama's args, ggml's tables."""
    if "logits" in request:
        return logits(request)
    contexts = {int(w["seq_len"]) for w in request["windows"]}
    with tempfile.TemporaryDirectory(prefix="llamacpp-reader-") as tmp:
        conv = convert(dict(request["config"]), Path(tmp))
        graph, why_not = _graph(conv, Path(tmp), contexts)
    arch = conv["arch"]
    notes = list(conv["notes"])
    notes.append(f"converter {conv['module']}.{conv['class']} ({conv['hf_arch']}) wrote "
                 f"{_written(conv)}")  # fmt: skip
    windows, used, checks = [], [], []
    missing = ""  # why the restated step is not available, where it is not
    for w in request["windows"]:
        layer_type = w.get("layer_type")
        layer = None if w.get("layer") is None else int(w["layer"])
        seq_len = int(w["seq_len"])
        swa, swa_how = is_swa_layer(arch, conv["keys"], layer, layer_type)
        restated: dict[str, Any] | None
        try:
            restated = rope_arguments(arch, conv["keys"], conv["tensors"], seq_len, swa)
        except NotImplementedError as exc:
            restated, missing = None, str(exc)
        node = None
        nodes: list[dict[str, Any]] | None = None
        graph_layer = layer
        if graph_layer is None and layer_type is None:
            graph_layer = 0
        elif graph_layer is None:
            # the first layer of that type in the config's layer_types (else: restated)
            types = conv["config"].get("layer_types")
            if isinstance(types, list) and layer_type in types:
                graph_layer = types.index(layer_type)
        if graph is not None and graph_layer is not None:
            nodes = graph[seq_len]["nodes"]
            node = llamacpp_graph_node(nodes, graph_layer)
            if node is not None and graph[seq_len]["n_ctx"] != seq_len:
                notes.append(f"libllama's context for the window of {seq_len} tokens: "
                             f"{graph[seq_len]['n_ctx']} (the same side of n_ctx_orig_yarn; "
                             "the context size decides nothing else in its rope)")  # fmt: skip
        rotates, how = True, ""
        args: dict[str, Any] | None
        if node is not None:
            args = _from_node(node, conv["tensors"])
            where = f"libllama's graph node {node['node']}"
            if restated is not None:
                for d in _disagreements(args, restated):
                    checks.append(f"{where}: restated {d}")
        elif nodes is not None:
            # libllama ran the graph: no ROPE node in this layer, it does not rotate it
            args, where, rotates = None, "libllama's graph", False
            how = (f"libllama's graph has no ROPE node in layer {graph_layer} (ROPE nodes in "
                   f"layers {_node_layers(nodes) or 'none'})")  # fmt: skip
        else:
            if restated is None:
                raise NotImplementedError(f"{missing}, and libllama did not run "
                                          f"({why_not or 'no layer to read'})")  # fmt: skip
            args = restated
            where = "the restated step"
            if layer_type is not None and swa != (layer_type == "sliding_attention"):
                notes.append(f"llama.cpp reads layer {layer} ({layer_type}) as "
                             f"{'sliding' if swa else 'full'} attention: {swa_how}")  # fmt: skip
            rotates, how = restated_rotates(arch, layer, swa)
            if not rotates:
                how = f"restated: {how}"
        positions = [int(p) for p in w["positions"]]
        ids = w.get("position_ids")
        if args is not None and rotates:
            mode_note = ""
            if ids is not None and args["mode"] not in (MROPE, IMROPE):
                mode_note = ("; at the token index (llama.cpp's graph for this architecture "
                             "takes one position per token)")  # fmt: skip
                ids = None
            c, s, op = ggml_rope(args, positions, ids)
            shown = {k: args[k] for k in _COMPARED if k != "mode"}
            shown["freq_factors"] = args["freq_factors_name"]
            mode = (f"{op} at the asked positions, one token each, in a context of {seq_len} "
                    f"tokens; arguments from {where}: {json.dumps(shown)}{mode_note}")  # fmt: skip
        else:
            pairs = _pair_count(conv, restated, nodes)
            c = [[1.0] * pairs for _ in positions]
            s = [[0.0] * pairs for _ in positions]
            op = "none"
            mode = (f"no rotation in layer {graph_layer}: {how}; cos 1 and sin 0 rows of "
                    f"{pairs} pairs")  # fmt: skip
        windows.append({"seq_len": seq_len, "positions": positions, "cos": c, "sin": s,
                        "mode": mode, "layer_type": layer_type, "rotates": rotates,
                        "position_ids": w.get("position_ids")})  # fmt: skip
        used.append((args if rotates else None, op, restated, where))
    rotating = [u for u in used if u[0] is not None]
    args0, op0, _, _ = rotating[0] if rotating else used[0]
    restated0 = next((r for _, _, r, _ in used if r is not None), None)
    ran = graph is not None and all(where != "the restated step" for _, _, _, where in used)
    mode0 = int(args0["mode"]) if args0 is not None else _graph_mode(graph, restated0)
    # the layout of the checkpoint's channels: a class that permutes q_proj/k_proj rows
    # (LlamaModel.permute) turns HF's half-split pairs into the adjacent pairs NORM rotates
    layout = "interleaved" if mode0 == NORM and not conv["permutes_qk"] else "half"
    if mode0 == NORM and conv["permutes_qk"]:
        notes.append(f"layout: ggml's NORMAL mode rotates adjacent channels of q/k rows "
                     f"that {conv['class']}.modify_tensors permuted (LlamaModel.permute), "
                     "so the checkpoint's channels pair as (k, k + r/2): half")  # fmt: skip
    if any(a and a["freq_factors_name"] and "factors_" in a["freq_factors_name"]
           for a, _, _, _ in used):  # fmt: skip
        notes.append("LongRoPE factors as llama_model::get_rope_factors picks them, by the "
                     "context size (n_ctx_seq > n_ctx_orig_yarn): a context of seq_len "
                     "tokens")  # fmt: skip
    notes.append("llama.cpp has no dynamic NTK: seq_len changes no angle (only LongRoPE's "
                 "choice of factors)")  # fmt: skip
    info = build_info()
    commit = info.get("commit", "?")
    if ran:
        source = ("converter, libllama (loader, context, graph) and ggml run; llama.cpp "
                  f"{commit}")  # fmt: skip
        import llamacpp_graph

        swapped = llamacpp_graph.stand_ins(conv["config"])
        notes.append("arguments read from the ROPE nodes of libllama's graph for a tiny "
                     "random checkpoint of the config (its transformers class), converted "
                     "by the converter with a stand-in vocabulary"
                     + (f" and stand-ins {swapped}" if swapped else ""))  # fmt: skip
        if restated0 is None:
            notes.append(f"the restated step is not available ({missing}): libllama's "
                         "graph alone gives the arguments")  # fmt: skip
        elif checks:
            notes.append("the restated step disagrees: " + "; ".join(checks))
        else:
            notes.append("the restated step (rope_arguments) gives the same arguments")
    else:
        source = ("converter and ggml run; key-to-argument step restated from llama.cpp "
                  f"{commit}")  # fmt: skip
        notes.append(f"libllama did not run ({why_not or 'no graph node for the layer'}): "
                     "restated, not run, the step from GGUF keys to the op's arguments "
                     "(load_hparams, load_arch_hparams, llama_model_rope_type, the "
                     "context's yarn_attn_factor, the graph's per-layer base, scale and "
                     "factors)")  # fmt: skip
    softmax_scale = restated0["softmax_scale"] if restated0 is not None else None
    if ran and softmax_scale is not None:
        # DeepSeek's YaRN magnitude is in kq_scale: the graph's first attention scale
        graph_scale = float(graph[int(request["windows"][0]["seq_len"])]["softmax_scale"])
        if abs(graph_scale - softmax_scale) > 1e-6 * abs(graph_scale):
            notes.append(f"the restated kq_scale {softmax_scale:.9g} disagrees with "
                         f"libllama's graph ({graph_scale:.9g})")  # fmt: skip
        softmax_scale = graph_scale
    shown_windows = [w for w in windows if w["rotates"]] or windows
    c0, s0 = shown_windows[0]["cos"][0][0], shown_windows[0]["sin"][0][0]
    rotary_dim = int(args0["n_dims"]) if args0 is not None \
        else 2 * _pair_count(conv, restated0, None)  # fmt: skip
    return {
        "version": _version(),
        "source": source,
        "module": op0,
        "layout": layout,
        "rotary_dim": rotary_dim,
        "dtype": "float32",
        "attention_scaling": (c0 * c0 + s0 * s0) ** 0.5,
        "softmax_scale": softmax_scale,
        "switching": switching(conv),
        "windows": windows,
        "note": "; ".join(notes),
    }


def _node_layers(nodes: list[dict[str, Any]]) -> list[int]:
    """The layers libllama's graph has ROPE nodes in (from the names: ``Qcur-3``)."""
    out = set()
    for node in nodes:
        tail = str(node["node"]).rsplit("-", 1)[-1]
        if tail.isdecimal():
            out.add(int(tail))
    return sorted(out)


def _pair_count(
    conv: dict[str, Any], restated: dict[str, Any] | None, nodes: list[dict[str, Any]] | None
) -> int:
    """The RoPE's pair count: the restated n_rot, else a graph node's, else the keys'."""
    if restated is not None:
        return int(restated["n_dims"]) // 2
    if nodes:
        return int(nodes[0]["n_dims"]) // 2
    arch, keys = conv["arch"], conv["keys"]
    n_rot = keys.get(f"{arch}.rope.dimension_count") or keys.get(f"{arch}.attention.key_length")
    return int(n_rot or 0) // 2


def _graph_mode(graph: Any, restated: dict[str, Any] | None) -> int:
    """The rope mode when no window rotates: libllama's ``llama_model_rope_type``."""
    if graph:
        return int(next(iter(graph.values()))["rope_type"])
    return int(restated["mode"]) if restated is not None else NEOX


def restated_rotates(arch: str, layer: int | None, swa: bool) -> tuple[bool, str]:
    """RESTATED: whether llama.cpp's graph rotates layer ``layer`` (where libllama did not
    run), for the architectures whose graph leaves layers without RoPE."""
    if arch == "smollm3" and layer is not None:
        how = "models/smollm3.cpp: n_no_rope_layer_step = 4, use_rope = (il + 1) % 4 != 0"
        return (layer + 1) % 4 != 0, how
    if arch == "cohere2":
        return swa, "models/cohere2.cpp: ggml_rope_ext on the sliding-window layers only"
    return True, ""


def _rope_type(config: dict[str, Any]) -> str | None:
    """The config's rope type (rope_scaling, else rope_parameters; text_config's if any)."""
    part = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    for name in ("rope_scaling", "rope_parameters"):
        value = part.get(name) if isinstance(part, dict) else None
        if isinstance(value, dict):
            kind = value.get("rope_type") or value.get("type")
            if kind is not None:
                return str(kind)
    return None


def switching(conv: dict[str, Any]) -> str | None:
    """llama.cpp's switching rule for a LongRoPE or dynamic NTK config (else ``None``)."""
    kind = _rope_type(conv["config"])
    if "rope_factors_long.weight" in conv["tensors"]:
        return ("once per context, from its size: the long factors when n_ctx_seq > "
                "n_ctx_orig_yarn, else the short ones, whatever the tokens seen "
                "(llama-model.cpp: llama_model::get_rope_factors, called by the graph of "
                "every layer)")  # fmt: skip
    if kind in ("longrope", "su"):
        return (f"never: {conv['class']} wrote no LongRoPE factors, so none is applied at "
                "any context (llama-model.cpp: llama_model::get_rope_factors finds no "
                "rope_long / rope_short)")  # fmt: skip
    if kind == "dynamic":
        return ("never: llama.cpp has no dynamic NTK; the base is rope.freq_base at every "
                "length (llama-model.cpp: load_hparams; the converter writes no dynamic "
                "scaling: conversion/base.py TextModel.set_gguf_parameters)")  # fmt: skip
    return None


def llamacpp_graph_node(nodes: list[dict[str, Any]], layer: int) -> dict[str, Any] | None:
    """The first ROPE node of layer ``layer`` in libllama's graph."""
    import llamacpp_graph

    return llamacpp_graph.node_for(nodes, layer)


if __name__ == "__main__":
    from protocol import serve

    logging.disable(logging.WARNING)
    sys.exit(serve(answer))
