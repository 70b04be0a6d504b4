"""Build a config's ONNX model with ONNX Runtime GenAI's model builder and read its RoPE.

Runs under ONNX Runtime GenAI's own Python (``posenc engines build onnxruntime-genai``'s
environment: onnxruntime-genai, onnxruntime, onnx, and what the model builder needs,
transformers and torch among them), never posenc's.

ONNX Runtime GenAI has no RoPE code of its own at run time: its model builder
(``onnxruntime_genai/models/builder.py``: ``create_model``, the module ``python -m
onnxruntime_genai.models.builder`` runs) turns an HF checkpoint into an ONNX graph and
writes the rotary tables into it, as ``cos_cache`` / ``sin_cache`` tensors of
``max_position_embeddings`` rows and ``rotary_dim / 2`` columns
(``builders/base.py``: ``Model.make_rotary_embedding_caches_from_scratch``, with the
model file's ``make_rope_init`` choosing the scaling); ONNX Runtime's attention
(``GroupQueryAttention`` with ``do_rotary``, or a ``RotaryEmbedding`` node) reads row
``p`` at position ``p``. So for each request the reader

1. saves a tiny random-weight checkpoint of the config (``AutoModelForCausalLM.from_config``,
   float32, the RoPE settings, head size and layers kept, the vocabulary and MLP shrunk)
   with a small word-level tokenizer (the builder loads one with ``AutoTokenizer``);
2. runs the builder on it in this process, as its ``__main__`` does
   (``parse_extra_options``, ``create_model``; ``-p fp32 -e cpu``), into a temporary
   folder; a model type or RoPE type the builder rejects is a refusal with its own error;
3. loads the ONNX graph and, for the window's layer (``layer``, else 0), finds the
   attention node (``/model/layers.L/attn/...``) and the caches it reads. Where the
   caches are the outputs of another node (LongRoPE's ``If`` choosing the short or long
   set), the graph that computes them is cut out of the model and run with ONNX Runtime
   on an ``attention_mask`` of ``seq_len`` ones (what the runtime feeds in a prefill of
   ``seq_len`` tokens): the graph itself picks the set;
4. answers the rows at the asked positions: cos/sin per pair, the layout from the
   node's ``rotary_interleaved`` / ``interleaved`` attribute, the attention scaling as
   the norm of the row at position 0 (the ``mscale`` multiplied into the caches), the
   softmax scale from the attention node's ``scale``, and ``rotates`` from the layer's
   attention (``do_rotary`` or a rotary node on q).

A ``logits`` request converts the given checkpoint with the same builder and runs one
prefill with ONNX Runtime on the built ``model.onnx`` (see :func:`logits_answer`).

The protocol (request, batch, answer) is :mod:`protocol`'s.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.metadata
import json
import math
import os
import re
import shutil
import sys
import tempfile
from typing import Any

#: The vocabulary and MLP size of the tiny checkpoint the tables are read from. No MLP
#: projection may have TINY_VOCAB outputs: the builder takes any nn.Linear with
#: vocab_size outputs for the LM head (builders/base.py: Model.has_lm_head).
TINY_VOCAB = 32
TINY_INTERMEDIATE = 48
#: Built models kept per process (a batch asks the same config more than once).
_BUILT: dict[str, Any] = {}


def _versions() -> str:
    names = ("onnxruntime-genai", "onnxruntime", "transformers")
    return ", ".join(f"{n} {importlib.metadata.version(n)}" for n in names)


# --------------------------------------------------------------------------------------
# The checkpoint and the build.


def _shrink(config: dict[str, Any]) -> dict[str, Any]:
    """The config with a small vocabulary and MLP (RoPE, heads and layers untouched)."""
    out = copy.deepcopy(config)
    for part in (out, out.get("text_config")):
        if not isinstance(part, dict):
            continue
        if "vocab_size" in part:
            part["vocab_size"] = TINY_VOCAB
        for key in ("intermediate_size", "moe_intermediate_size"):
            if isinstance(part.get(key), int):
                part[key] = min(part[key], TINY_INTERMEDIATE)
        if "pad_token_id" in part or part is out:
            part["pad_token_id"] = 0  # inside the shrunk vocabulary (an embedding's padding_idx)
    out["torch_dtype"] = "float32"
    return out


def _tokenizer(directory: str) -> None:
    """A word-level tokenizer of 3 tokens (the builder loads one; the tables need none)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({"<unk>": 0, "<s>": 1, "</s>": 2}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>")  # fmt: skip
    fast.save_pretrained(directory)


def _checkpoint(config: dict[str, Any], root: str) -> str:
    """Save a random-weight float32 model of ``config`` as transformers saves one.

    The model class is the config's ``architectures[0]`` where transformers has it (the
    class a released checkpoint is saved by, which the builder dispatches on), else
    ``AutoModelForCausalLM``'s, else (a vision-language config)
    ``AutoModelForImageTextToText``'s. The folder is named after the saved class (the
    builder's refusal of an architecture names the folder).
    """
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    data = _shrink(config)
    model_type = data.pop("model_type")
    architectures = data.get("architectures") or []
    hf_config = AutoConfig.for_model(model_type, **data)
    torch.manual_seed(0)
    cls = getattr(transformers, str(architectures[0]), None) if architectures else None
    if cls is not None and hasattr(cls, "_from_config"):
        model = cls._from_config(hf_config, dtype=torch.float32)
    else:
        try:
            model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
        except ValueError:
            model = AutoModelForImageTextToText.from_config(hf_config, dtype=torch.float32)
    directory = os.path.join(root, type(model).__name__)
    model.save_pretrained(directory, safe_serialization=True)
    _tokenizer(directory)
    return directory


def _builder() -> Any:
    import onnxruntime_genai.models  # noqa: F401  (puts the builder's folder on sys.path)
    from onnxruntime_genai.models import builder

    return builder


def _build(checkpoint: str, output: str) -> None:
    """``python -m onnxruntime_genai.models.builder -i CHECKPOINT -o OUTPUT -p fp32 -e cpu``,
    in this process (builder.py's ``__main__``: ``parse_extra_options``, ``create_model``)."""
    builder = _builder()
    cache = os.path.join(output, "..", "builder_cache")
    with contextlib.redirect_stdout(sys.stderr):
        options = builder.parse_extra_options(None, checkpoint, output, "fp32", "cpu", cache, [])
        builder.create_model(None, checkpoint, output, "fp32", "cpu", cache, **options)


class Built:
    """A built ONNX model: its graph (with the caches' values) and where it came from."""

    def __init__(self, config: dict[str, Any]) -> None:
        import onnx

        root = tempfile.mkdtemp(prefix="posenc-ortgenai-")
        try:
            out = os.path.join(root, "onnx")
            ckpt = _checkpoint(config, root)
            self.saved = json.loads(open(os.path.join(ckpt, "config.json")).read())
            _build(ckpt, out)
            self.model = onnx.load(os.path.join(out, "model.onnx"), load_external_data=True)
            self.genai = json.loads(open(os.path.join(out, "genai_config.json")).read())
        finally:
            shutil.rmtree(root, ignore_errors=True)
        self.graph = self.model.graph
        self.producer = {o: n for n in self.graph.node for o in n.output}
        self.inits = {i.name: i for i in self.graph.initializer}
        self._tables: dict[tuple[str, str, int], Any] = {}

    def run_prefill(self, seq_len: int) -> Any:
        """Run the built model on ``seq_len`` tokens (ONNX Runtime, CPU): its logits."""
        import onnxruntime as ort

        session = ort.InferenceSession(self.model.SerializeToString(),
                                       providers=["CPUExecutionProvider"])  # fmt: skip
        tokens = [1] * seq_len
        return session.run(["logits"], _feed(session, tokens, self.genai))[0]

    def attention(self, layer: int) -> tuple[Any, list[Any]]:
        """Layer ``layer``'s attention node and its rotary nodes on q/k (if separate)."""
        prefix = f"/model/layers.{layer}/attn/"
        attn, rotary = None, []
        for n in self.graph.node:
            if not n.name.startswith(prefix):
                continue
            if n.op_type in ("RotaryEmbedding", "MRotaryEmbedding"):
                rotary.append(n)
            elif n.op_type in ("GroupQueryAttention", "MultiHeadAttention", "Attention",
                               "PagedAttention", "SparseAttention"):  # fmt: skip
                attn = n
        if attn is None:
            layers = sorted({int(m.group(1)) for n in self.graph.node
                             if (m := re.match(r"/model/layers\.(\d+)/", n.name))})  # fmt: skip
            raise ValueError(f"no attention node under {prefix} (layers in the graph: {layers})")
        return attn, rotary

    def tables(self, cos_name: str, sin_name: str, seq_len: int) -> tuple[Any, Any, str]:
        """The cos/sin caches named, as the graph gives them in a prefill of ``seq_len``."""
        from onnx import numpy_helper

        key = (cos_name, sin_name, seq_len)
        if key not in self._tables:
            if cos_name in self.inits and sin_name in self.inits:
                cos = numpy_helper.to_array(self.inits[cos_name])
                sin = numpy_helper.to_array(self.inits[sin_name])
                how = f"initializers {cos_name}/{sin_name}"
            else:
                cos, sin = self._run_subgraph([cos_name, sin_name], seq_len)
                how = (f"{cos_name}/{sin_name} as the graph computes them for an attention "
                       f"mask of {seq_len}: the set of {cos.shape[0]} rows")  # fmt: skip
            self._tables[key] = (cos, sin, how)
        return self._tables[key]

    def _run_subgraph(self, names: list[str], seq_len: int) -> Any:
        """Run the part of the graph that computes ``names`` from ``attention_mask``."""
        import numpy as np
        import onnx
        import onnxruntime as ort

        needed: list[Any] = []
        seen: set[str] = set()
        inputs: set[str] = set()
        graph_inputs = {i.name: i for i in self.graph.input}
        stack = list(names)
        while stack:
            value = stack.pop()
            if value in seen or not value:
                continue
            seen.add(value)
            if value in graph_inputs:
                inputs.add(value)
                continue
            node = self.producer.get(value)
            if node is None:
                continue
            if node not in needed:
                needed.append(node)
            stack.extend(node.input)
        order = [n for n in self.graph.node if n in needed]
        unsupported = inputs - {"attention_mask"}
        if unsupported:
            raise ValueError(f"the caches depend on graph inputs {sorted(unsupported)}")
        inits = [self.inits[v] for v in seen if v in self.inits]
        outputs = [onnx.helper.make_tensor_value_info(v, onnx.TensorProto.FLOAT, None)
                   for v in names]  # fmt: skip
        graph = onnx.helper.make_graph(order, "rope_caches", [graph_inputs[v] for v in inputs],
                                       outputs, initializer=inits)  # fmt: skip
        model = onnx.helper.make_model(graph, opset_imports=self.model.opset_import,
                                       ir_version=self.model.ir_version)  # fmt: skip
        session = ort.InferenceSession(model.SerializeToString(),
                                       providers=["CPUExecutionProvider"])  # fmt: skip
        feed = {"attention_mask": np.ones((1, seq_len), dtype=np.int64)} if inputs else {}
        return session.run(names, feed)

    def constant(self, value: str) -> Any:
        """The value of an initializer or a ``Constant`` node's output (else None)."""
        import onnx
        from onnx import numpy_helper

        if value in self.inits:
            return numpy_helper.to_array(self.inits[value]).tolist()
        node = self.producer.get(value)
        if node is not None and node.op_type == "Constant":
            for a in node.attribute:
                if a.name == "value":
                    return numpy_helper.to_array(onnx.helper.get_attribute_value(a)).tolist()
        return None

    def switching(self) -> str | None:
        """The rule of the ``If`` node that picks a cache set, read from the graph."""
        for n in self.graph.node:
            if n.op_type != "If" or "rope" not in n.name:
                continue
            cond = self.producer.get(n.input[0])
            if cond is None:
                return f"per forward pass: {n.name} on {n.input[0]}"
            parts = [self._describe(v) for v in cond.input]
            sign = {"Greater": ">", "GreaterOrEqual": ">=", "Less": "<"}.get(cond.op_type, "?")
            return (f"per forward pass, from the sequence length: the graph's {n.name} takes "
                    f"the long caches when {parts[0]} {sign} {parts[1]}, else the short ones "
                    "(builders/base.py: Model.make_rotary_embedding_multi_cache, which "
                    "compares with original_max_position_embeddings)")  # fmt: skip
        return None

    def _describe(self, value: str) -> str:
        const = self.constant(value)
        if const is not None:
            return str(const)
        node = self.producer.get(value)
        if node is None:
            return value
        if node.op_type == "Cast":
            return self._describe(node.input[0])
        if node.op_type == "Gather":
            shape = self.producer.get(node.input[0])
            axis = self.constant(node.input[1])
            if shape is not None and shape.op_type == "Shape":
                if shape.input[0] == "attention_mask" and axis == 1:
                    return "the attention mask's length (past + new tokens)"
                return f"dim {axis} of {shape.input[0]}"
        return f"{node.op_type}({', '.join(self._describe(v) for v in node.input)})"


def _attr(node: Any, name: str, default: Any = None) -> Any:
    import onnx

    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


# --------------------------------------------------------------------------------------
# The answer to a tables request.


def _built(config: dict[str, Any]) -> Built:
    key = json.dumps(config, sort_keys=True)
    if key not in _BUILT:
        if len(_BUILT) > 2:
            _BUILT.clear()
        _BUILT[key] = Built(config)
    return _BUILT[key]


def _window(built: Built, w: dict[str, Any], head_size: int) -> dict[str, Any]:
    layer = int(w.get("layer") or 0)
    seq_len = int(w["seq_len"])
    positions = [int(p) for p in w["positions"]]
    attn, rotary = built.attention(layer)
    out: dict[str, Any] = {"seq_len": seq_len, "positions": positions,
                           "layer_type": w.get("layer_type"), "layer": layer,
                           "module": attn.name}  # fmt: skip
    if attn.op_type == "GroupQueryAttention" and _attr(attn, "do_rotary", 0):
        cos_name, sin_name = attn.input[7], attn.input[8]
        interleaved = bool(_attr(attn, "rotary_interleaved", 0))
        rotary_dim = 0
        where = f"{attn.op_type} do_rotary (fused in attention)"
    elif rotary:
        node = rotary[0]
        cos_name, sin_name = node.input[2], node.input[3]
        interleaved = bool(_attr(node, "interleaved", 0))
        rotary_dim = int(_attr(node, "rotary_embedding_dim", 0) or 0)
        where = f"{node.op_type} node {node.name}"
        if node.op_type == "MRotaryEmbedding":
            out["mrope_section"] = _attr(node, "mrope_section")
            out["mrope_layout"] = _attr(node, "mrope_layout")
    else:
        out.update(rotates=False, layout="half", interleaved=False)
        pairs = head_size // 2
        out["cos"] = [[1.0] * pairs for _ in positions]
        out["sin"] = [[0.0] * pairs for _ in positions]
        out["mode"] = (
            f"layer {layer} has no rotary embedding in the built graph "
            f"({attn.op_type} without do_rotary, no rotary node): rows of 1/0"
        )
        return out
    cos, sin, how = built.tables(cos_name, sin_name, seq_len)
    rows = int(cos.shape[0])
    if max(positions) >= rows:
        built.run_prefill(seq_len)  # ONNX Runtime's own error, where it raises one
        raise ValueError(
            f"position {max(positions)} past the {rows} rows of the built {cos_name} "
            f"(layer {layer}): ONNX Runtime's {attn.op_type} rejects a sequence longer "
            "than its cos_cache (the builder writes max_position_embeddings rows: "
            "builders/base.py: Model.make_rotary_embedding_caches_from_scratch)"
        )
    pairs = int(cos.shape[1])
    if rotary_dim and rotary_dim // 2 != pairs:
        raise ValueError(f"rotary_embedding_dim {rotary_dim} and a cache of {pairs} columns")
    out.update(rotates=True, interleaved=interleaved,
               layout="interleaved" if interleaved else "half", rotary_dim=2 * pairs)  # fmt: skip
    ids = w.get("position_ids")
    if rotary:
        # the graph's own rotary node, run by ONNX Runtime on unit vectors
        cos_rows, sin_rows = _run_rotary(built, rotary[0], cos, sin, positions, ids, interleaved)
        mode = (f"{rotary[0].op_type} (the built graph's node, its attributes and caches: "
                f"{how}) run by ONNX Runtime on unit vectors at the asked positions")  # fmt: skip
        if ids is not None:
            mode += (
                " with the multi-axis position_ids"
                if rotary[0].op_type == "MRotaryEmbedding"
                else "; at the token index (the node takes one position per token)"
            )
    else:
        cos_rows = [[float(x) for x in cos[p]] for p in positions]
        sin_rows = [[float(x) for x in sin[p]] for p in positions]
        mode = f"rows of the built graph's caches ({how}), read by {where} at row = position"
        if ids is not None:
            mode += "; at the token index (the built graph takes one position per token)"
    out["cos"], out["sin"] = cos_rows, sin_rows
    out["mode"] = mode
    c0, s0 = float(cos[0][0]), float(sin[0][0])
    out["attention_scaling"] = math.hypot(c0, s0)
    scale = _attr(attn, "scale")
    out["softmax_scale"] = float(scale) if scale else None
    return out


def _run_rotary(built: Built, node: Any, cos: Any, sin: Any, positions: list[int],
                ids: list[list[int]] | None, interleaved: bool) -> tuple[Any, Any]:  # fmt: skip
    """Run ``node`` (RotaryEmbedding / MRotaryEmbedding, the graph's attributes, one head)
    on unit vectors: 1 in the first channel of each rotated pair, so the output holds
    ``(m cos, m sin)`` in the pair's two channels."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    head = int(_attr(node, "rotary_embedding_dim", 0) or 0) or 2 * int(cos.shape[1])
    full = _head_size(built.saved)
    pairs = int(cos.shape[1])
    unit = np.zeros(full, dtype=np.float32)
    if interleaved:
        unit[0 : 2 * pairs : 2] = 1.0
    else:
        unit[:pairs] = 1.0
    n = len(positions)
    x = np.broadcast_to(unit, (1, n, full)).copy()
    if node.op_type == "MRotaryEmbedding":
        axes = ids if ids is not None else [positions, positions, positions]
        pos = np.asarray(axes, dtype=np.int64).reshape(3, 1, n)
    else:
        pos = np.asarray([positions], dtype=np.int64)
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    attrs["num_heads"] = 1
    one = onnx.helper.make_node(node.op_type, ["x", "pos", "cos", "sin"], ["y"],
                                domain=node.domain, **attrs)  # fmt: skip
    f32 = onnx.TensorProto.FLOAT
    graph = onnx.helper.make_graph(
        [one], "rotary",
        [onnx.helper.make_tensor_value_info("x", f32, list(x.shape)),
         onnx.helper.make_tensor_value_info("pos", onnx.TensorProto.INT64, list(pos.shape))],
        [onnx.helper.make_tensor_value_info("y", f32, None)],
        initializer=[onnx.numpy_helper.from_array(np.asarray(cos, dtype=np.float32), "cos"),
                     onnx.numpy_helper.from_array(np.asarray(sin, dtype=np.float32), "sin")],
    )  # fmt: skip
    model = onnx.helper.make_model(graph, opset_imports=built.model.opset_import,
                                   ir_version=built.model.ir_version)  # fmt: skip
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])  # fmt: skip
    y = session.run(["y"], {"x": x, "pos": pos})[0].reshape(n, full)
    if head != 2 * pairs:
        raise ValueError(f"rotary_embedding_dim {head} and caches of {pairs} columns")
    if interleaved:
        c, s = y[:, 0 : 2 * pairs : 2], y[:, 1 : 2 * pairs : 2]
    else:
        c, s = y[:, :pairs], y[:, pairs : 2 * pairs]
    return c.astype(float).tolist(), s.astype(float).tolist()


def _head_size(saved: dict[str, Any]) -> int:
    nested = saved.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else saved
    head = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
    return int(head)


def _brief(value: Any) -> str:
    """``value`` as JSON, lists longer than 4 items shown by their length."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_brief(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list) and len(value) > 4:
        return f"[{len(value)} values]"
    return json.dumps(value)


def tables_answer(request: dict[str, Any]) -> dict[str, Any]:
    """The tables the built ONNX graph applies, for each asked window."""
    config = dict(request["config"])
    built = _built(config)
    head = _head_size(built.saved)
    windows = [_window(built, dict(w), head) for w in request["windows"]]
    notes = ["a tiny random-weight checkpoint of the config (vocabulary and MLP shrunk) "
             "saved by transformers and built by the model builder (fp32, cpu)"]  # fmt: skip
    if built.saved.get("rope_parameters") != config.get("rope_parameters"):
        notes.append(
            "the builder read the config as transformers "
            f"{importlib.metadata.version('transformers')} saves it "
            f"(rope_parameters {_brief(built.saved.get('rope_parameters'))})"
        )
    rotating = [w for w in windows if w["rotates"]]
    first = rotating[0] if rotating else windows[0]
    switching = built.switching()
    return {
        "version": _versions(),
        "source": "installed",
        "module": "onnxruntime_genai/models/builder.py: create_model (genai_config model "
        f"type {built.genai.get('model', {}).get('type')}); {first.get('module')}",
        "layout": first.get("layout", "half"),
        "rotary_dim": int(first.get("rotary_dim") or head),
        "dtype": "float32",
        "attention_scaling": first.get("attention_scaling", 1.0),
        "softmax_scale": first.get("softmax_scale"),
        "switching": switching,
        "windows": windows,
        "note": "; ".join(notes),
    }


# --------------------------------------------------------------------------------------
# The logits request.


def logits_answer(request: dict[str, Any]) -> dict[str, Any]:
    """Build ``checkpoint`` with the model builder (fp32, cpu) and run one prefill.

    onnxruntime-genai's ``Generator`` hands back the logits of the last position only
    (``get_output("logits")`` after ``append_tokens`` holds the prompt's last row in
    this version's CPU runtime; checked and said in ``mode``), so the prefill is run by
    ONNX Runtime on the built ``model.onnx`` itself, with the inputs the runtime feeds
    (``input_ids``, an ``attention_mask`` of ones, ``position_ids`` where the graph takes
    them, empty ``past_key_values``): every row of one forward pass.
    """
    import numpy as np
    import onnxruntime as ort

    spec = request["logits"]
    tokens = [int(t) for t in spec["tokens"]]
    rows = [int(r) for r in spec["rows"]]
    root = tempfile.mkdtemp(prefix="posenc-ortgenai-logits-")
    notes = []
    try:
        out = os.path.join(root, "onnx")
        _build(str(spec["checkpoint"]), out)
        session = ort.InferenceSession(os.path.join(out, "model.onnx"),
                                       providers=["CPUExecutionProvider"])  # fmt: skip
        genai = json.loads(open(os.path.join(out, "genai_config.json")).read())
        logits = session.run(["logits"], _feed(session, tokens, genai))[0][0]
        try:
            last = _genai_last(out, tokens)
        except Exception as exc:  # the check below is a side note, not the answer
            last = None
            notes.append(f"onnxruntime_genai's Generator did not run: {type(exc).__name__}: "
                         f"{str(exc)[:200]}")  # fmt: skip
        if last is not None:
            diff = float(np.max(np.abs(last - logits[-1])))
            notes.append(f"onnxruntime_genai's Generator (og.Model, append_tokens, "
                         f"get_output('logits')) gave {last.shape[0]} value(s) per vocabulary "
                         f"row for the last position only; it differs from ONNX Runtime's "
                         f"last row by {diff:.3g}")  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {
        "version": _versions(),
        "converter": "onnxruntime_genai/models/builder.py: create_model (-p fp32 -e cpu)",
        "runtime": f"onnxruntime {ort.__version__} InferenceSession (CPUExecutionProvider) "
        "on the built model.onnx",
        "dtype": "float32",
        "mode": "one prefill of all tokens by ONNX Runtime on the built model.onnx "
        "(input_ids, attention_mask of ones, empty past_key_values); onnxruntime_genai's "
        "Generator returns the last position's logits only",
        "rows": rows,
        "logits": [[float(x) for x in logits[r]] for r in rows],
        "note": "; ".join(notes),
    }


def _feed(session: Any, tokens: list[int], genai: dict[str, Any]) -> dict[str, Any]:
    """A prefill's inputs as onnxruntime-genai's runtime feeds them (batch 1, no past)."""
    import numpy as np

    n = len(tokens)
    head_size = int(genai["model"]["decoder"]["head_size"])
    feed: dict[str, Any] = {}
    for i in session.get_inputs():
        if i.name == "input_ids":
            feed[i.name] = np.asarray([tokens], dtype=np.int64)
        elif i.name == "attention_mask":
            feed[i.name] = np.ones((1, n), dtype=np.int64)
        elif i.name == "position_ids":
            ids = np.arange(n, dtype=np.int64)[None, :]
            feed[i.name] = np.broadcast_to(ids, (3, 1, n)).copy() if len(i.shape) == 3 else ids
        elif i.name.startswith("past_key_values"):
            sizes = {"batch_size": 1, "kv_cache_dim": head_size, "head_size": head_size}
            shape = [sizes.get(d, 0) if isinstance(d, str) else int(d) for d in i.shape]
            feed[i.name] = np.zeros(shape, dtype=np.float32)
        else:
            raise ValueError(f"the built model takes an input posenc does not feed: {i.name}")
    return feed


def _genai_last(folder: str, tokens: list[int]) -> Any:
    """The last position's logits from onnxruntime_genai's own runtime, or None."""
    import numpy as np
    import onnxruntime_genai as og

    model = og.Model(folder)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(tokens) + 1)
    generator = og.Generator(model, params)
    generator.append_tokens(np.asarray(tokens, dtype=np.int32))
    out = np.asarray(generator.get_output("logits"))
    return out.reshape(-1, out.shape[-1])[-1]


def answer(request: dict[str, Any]) -> dict[str, Any]:
    """One request: tables for a config, or a ``logits`` run of a checkpoint."""
    if "logits" in request:
        return logits_answer(request)
    return tables_answer(request)


if __name__ == "__main__":
    from protocol import serve

    sys.exit(serve(answer))
