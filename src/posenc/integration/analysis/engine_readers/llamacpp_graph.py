"""libllama's own step from GGUF keys to ggml's rope arguments, for the llama.cpp reader.

Runs under llama.cpp's Python (see
:mod:`~posenc.analysis.engine_readers.llamacpp_reader`), never posenc. libllama
derives the arguments of ``ggml_rope_ext`` / ``ggml_rope_multi`` in its loader
(``load_hparams``), its context (``yarn_attn_factor``, ``n_ctx_orig_yarn``) and its
model graph (per-layer base, scale and frequency factors), all C++ without an API that
returns them. They are read from the graph itself:

1. a tiny checkpoint of the config: its transformers class built from it (seed 0),
   saved as safetensors, with a stand-in tokenizer (``tokenizer.json`` of
   ``vocab_size`` tokens) and the stand-ins of :func:`stand_ins` (sizes no RoPE reads
   that a tiny model cannot be built with);
2. the converter's full conversion of it (the model class's ``prepare_tensors`` and
   ``ModelBase.prepare_metadata``, as ``write()`` runs them; only ``set_vocab`` is
   replaced by a stand-in SentencePiece-style vocabulary of ``vocab_size`` tokens, since
   the tiny checkpoint has no real tokenizer);
3. ``llama-rope-args``, a small C program the build script compiles against libllama:
   it loads the GGUF, creates a context of ``n_ctx`` tokens with default parameters,
   decodes one token, and prints the parameters of every ``ROPE`` node of the graph
   (``op_params``: n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
   attn_factor, beta_fast, beta_slow, sections) and the name of its frequency-factor
   tensor, from ggml's eval callback.

A crash of libllama (a ``GGML_ASSERT``) ends only that child process: the reader then
falls back to its restated step and says so.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

#: The environment's root: the virtual environment this Python runs in.
ENV = Path(sys.prefix)
#: The C driver that prints the arguments llama.cpp passes to ``ggml_rope_ext``.
DRIVER = ENV / "ggml" / "llama-rope-args"
#: Seconds one ``llama-rope-args`` run may take.
TIMEOUT_S = 120.0
#: The most parameters a "tiny" checkpoint may have (a real model's config is not tiny:
#: its step is restated instead).
MAX_PARAMETERS = 64_000_000
#: The largest context libllama is given; a longer window gets this one when it is on
#: the same side of ``n_ctx_orig_yarn`` (all the context size decides in llama.cpp's rope).
MAX_CONTEXT = 32768


def available() -> bool:
    """Whether the build included libllama and the driver."""
    return DRIVER.exists()


#: A one-block vision tower per Qwen-VL model type (its output width is the text model's).
TINY_VISION: dict[str, dict[str, Any]] = {
    "qwen2_vl": {"depth": 1, "embed_dim": 32, "num_heads": 2, "mlp_ratio": 1,
                 "text_hidden_key": "hidden_size"},
    "qwen2_5_vl": {"depth": 1, "hidden_size": 32, "intermediate_size": 32, "num_heads": 2,
                   "fullatt_block_indexes": [0], "text_hidden_key": "out_hidden_size"},
    "qwen3_vl": {"depth": 1, "hidden_size": 32, "intermediate_size": 32, "num_heads": 2,
                 "deepstack_visual_indexes": [], "text_hidden_key": "out_hidden_size"},
}  # fmt: skip


def stand_ins(config: dict[str, Any]) -> dict[str, Any]:
    """Keys a tiny random model cannot be built with, and the values it is built with.

    Only sizes no RoPE reads: a ``pad_token_id`` past the tiny vocabulary (transformers'
    default for Phi-3), DeepSeek's expert groups (``n_group``, ``topk_group``, whose
    defaults exceed a tiny config's experts), and a one-block vision tower for the Qwen-VL
    classes (the converter's text model drops the tower's tensors).
    """
    out: dict[str, Any] = {}
    model_type = str(config.get("model_type", ""))
    text_hidden = config.get("hidden_size") or config.get("text_config", {}).get("hidden_size")
    if model_type in TINY_VISION and isinstance(text_hidden, int):
        tiny = dict(TINY_VISION[model_type])
        tiny[tiny.pop("text_hidden_key")] = text_hidden
        out["vision_config"] = {**config.get("vision_config", {}), **tiny}
    vocab = config.get("vocab_size")
    pad = config.get("pad_token_id", 32000 if config.get("model_type") == "phi3" else None)
    if isinstance(vocab, int) and isinstance(pad, int) and pad >= vocab:
        out["pad_token_id"] = None
    experts = config.get("n_routed_experts")
    if isinstance(experts, int) and config.get("model_type", "").startswith("deepseek"):
        if int(config.get("n_group") or 8) >= experts or int(config.get("topk_group") or 4) > 1:
            out.update(n_group=1, topk_group=1)
    return out


def _checkpoint(config: dict[str, Any], model_dir: Path) -> None:
    """A tiny random checkpoint of ``config`` (transformers' class from ``architectures``)."""
    import torch
    import transformers

    arch = config["architectures"][0]
    cls = getattr(transformers, arch, None)
    if cls is None:
        raise NotImplementedError(f"transformers has no class {arch}")
    hf_config = transformers.AutoConfig.from_pretrained(model_dir)
    text = getattr(hf_config, "text_config", None) or hf_config
    hidden = int(getattr(text, "hidden_size", 0) or 0)
    ffn = int(getattr(text, "intermediate_size", 0) or 0)
    experts = int(getattr(text, "n_routed_experts", 0) or getattr(text, "num_experts", 0) or 1)
    estimate = (
        int(getattr(text, "num_hidden_layers", 1) or 1)
        * (4 * hidden * hidden + 3 * hidden * ffn * experts)
        + 2 * int(getattr(text, "vocab_size", 0) or 0) * hidden
    )
    if estimate > MAX_PARAMETERS:
        raise NotImplementedError(f"the config's sizes make no tiny checkpoint (about "
                                  f"{estimate / 1e6:.0f}M parameters)")  # fmt: skip
    if getattr(hf_config, "vision_config", None) is not None and (
        config.get("model_type") not in TINY_VISION
    ):
        raise NotImplementedError(f"{arch} builds a vision tower: no tiny checkpoint")
    torch.manual_seed(0)
    model = cls(hf_config)
    model.save_pretrained(model_dir, safe_serialization=True)
    # save_pretrained rewrites config.json: the converter reads the config as given
    (model_dir / "config.json").write_text(json.dumps(config))
    text = getattr(hf_config, "text_config", None) or hf_config
    n_vocab = int(text.vocab_size)
    tokenizer = {"model": {"vocab": {f"t{i}": i for i in range(n_vocab)}}, "added_tokens": []}
    (model_dir / "tokenizer.json").write_text(json.dumps(tokenizer))


def full_gguf(config: dict[str, Any], workdir: Path) -> Path:
    """The converter's full conversion of a tiny checkpoint of ``config`` (stand-in vocab)."""
    model_dir = workdir / "checkpoint"
    model_dir.mkdir(parents=True, exist_ok=True)
    config = {**config, **stand_ins(config)}
    (model_dir / "config.json").write_text(json.dumps(config))
    _checkpoint(config, model_dir)
    return convert_checkpoint(model_dir, workdir / "full.gguf")


def convert_checkpoint(model_dir: Path, out: Path) -> Path:
    """The converter's full conversion of the checkpoint in ``model_dir`` to ``out``, float32.

    The model class is the one ``convert_hf_to_gguf.py`` picks (``get_model_class`` of the
    config's architecture); its tensors and metadata are written as ``write()`` writes
    them, but its ``set_vocab`` is replaced by a stand-in SentencePiece-style vocabulary
    of ``vocab_size`` tokens (token ids map to themselves).
    """
    import gguf
    from conversion import ModelBase, ModelType, get_model_architecture, get_model_class

    hparams = ModelBase.load_hparams(model_dir, False)
    cls = get_model_class(get_model_architecture(hparams, ModelType.TEXT))
    model = cls(model_dir, gguf.LlamaFileType.ALL_F32, out, hparams=hparams)
    model.prepare_tensors()
    ModelBase.prepare_metadata(model, vocab_only=False)  # the class's set_vocab is skipped
    writer = model.gguf_writer
    n_vocab = int(hparams.get("vocab_size") or hparams.get("text_config", {})["vocab_size"])
    writer.add_tokenizer_model("llama")
    writer.add_token_list([f"t{i}".encode() for i in range(n_vocab)])
    writer.add_token_scores([0.0] * n_vocab)
    writer.add_token_types([1] * n_vocab)
    writer.add_bos_token_id(min(1, n_vocab - 1))
    writer.add_eos_token_id(min(2, n_vocab - 1))
    writer.add_unk_token_id(0)
    writer.write_header_to_file(path=out)
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def rope_nodes(path: Path, n_ctx: int) -> dict[str, Any]:
    """libllama's graph for ``path`` in a context of ``n_ctx`` tokens: its ROPE nodes.

    Returns ``{"rope_type", "freq_scale_train", "nodes": [{"node", "n_dims", "mode",
    "n_ctx_orig", "freq_base", ..., "sections", "freq_factors"}], "softmax_scale"}``, the
    last being the scale of the graph's first ``SOFT_MAX`` / ``FLASH_ATTN_EXT`` node.

    Raises:
        RuntimeError: libllama refused the file or aborted (its last message).
    """
    proc = subprocess.run([str(DRIVER), str(path), str(int(n_ctx))], capture_output=True,
                          text=True, timeout=TIMEOUT_S)  # fmt: skip
    if proc.returncode != 0 or not proc.stdout.strip():
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and "gdb" not in ln]
        message = next((ln for ln in lines if "error" in ln.lower() or "ASSERT" in ln),
                       lines[-1] if lines else f"exit {proc.returncode}")  # fmt: skip
        raise RuntimeError(f"libllama: {message.strip()[:300]}")
    return json.loads(proc.stdout)


def context_for(seq_len: int, n_ctx_orig: int) -> int:
    """The context libllama is given for a window of ``seq_len`` tokens (see MAX_CONTEXT)."""
    if seq_len <= MAX_CONTEXT:
        return seq_len
    shorter = max(MAX_CONTEXT, n_ctx_orig + 1) if seq_len > n_ctx_orig else seq_len
    return min(seq_len, shorter)


def node_for(nodes: list[dict[str, Any]], layer: int) -> dict[str, Any] | None:
    """The first ROPE node of layer ``layer`` (names end in ``-<layer>``: ``Qcur-3``)."""
    for node in nodes:
        if str(node["node"]).rsplit("-", 1)[-1] == str(layer):
            return node
    return None


#: The driver, compiled by the build script against the vendored llama.h and ggml.h.
DRIVER_SOURCE = r"""
// llama-rope-args MODEL.gguf N_CTX: the ROPE nodes libllama's graph builds, as JSON.
#include "llama.h"
#include "ggml.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int printed = 0;
static float kq_scale = 0.0f;

static bool on_node(struct ggml_tensor * t, bool ask, void * user_data) {
    (void) user_data;
    if (ask && kq_scale == 0.0f &&
        (t->op == GGML_OP_SOFT_MAX || t->op == GGML_OP_FLASH_ATTN_EXT)) {
        memcpy(&kq_scale, t->op_params, sizeof kq_scale);  // the first attention's scale
    }
    if (t->op != GGML_OP_ROPE || !ask) {
        return !ask;
    }
    const int32_t * p = t->op_params;
    float f[6];
    memcpy(f, p + 5, sizeof f);
    printf("%s{\"node\": \"%s\", \"n_dims\": %d, \"mode\": %d, \"n_ctx_orig\": %d, "
           "\"freq_base\": %.9g, \"freq_scale\": %.9g, \"ext_factor\": %.9g, "
           "\"attn_factor\": %.9g, \"beta_fast\": %.9g, \"beta_slow\": %.9g, "
           "\"sections\": [%d, %d, %d, %d], \"freq_factors\": \"%s\"}",
           printed++ ? ", " : "", t->name, p[1], p[2], p[4], f[0], f[1], f[2], f[3], f[4],
           f[5], p[11], p[12], p[13], p[14], t->src[2] ? t->src[2]->name : "");
    return false;
}

static void on_log(enum ggml_log_level level, const char * text, void * user_data) {
    (void) user_data;
    if (level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN) {
        fputs(text, stderr);
    }
}

int main(int argc, char ** argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s MODEL.gguf N_CTX\n", argv[0]);
        return 2;
    }
    llama_log_set(on_log, NULL);
    llama_backend_init();
    struct llama_model * model = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (!model) {
        fprintf(stderr, "error: llama_model_load_from_file failed\n");
        return 1;
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t) atoi(argv[2]);
    cp.n_batch = 1;
    cp.n_ubatch = 1;
    cp.n_seq_max = 1;
    cp.n_threads = 1;
    cp.n_threads_batch = 1;
    cp.cb_eval = on_node;
    cp.cb_eval_user_data = NULL;
    struct llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "error: llama_init_from_model failed\n");
        return 1;
    }
    llama_token token = 0;
    printf("{\"rope_type\": %d, \"freq_scale_train\": %.9g, \"nodes\": [",
           (int) llama_model_rope_type(model), llama_model_rope_freq_scale_train(model));
    int rc = llama_decode(ctx, llama_batch_get_one(&token, 1));
    printf("], \"softmax_scale\": %.9g, \"decode\": %d}\n", kq_scale, rc);
    llama_free(ctx);
    llama_model_free(model);
    return rc == 0 ? 0 : 1;
}
"""

#: The logits driver: ``llama-logits MODEL.gguf ROW...`` reads token ids on stdin, decodes
#: them as one batch (positions 0..n-1, one sequence) in a context of exactly that many
#: tokens with float32 K and V caches and flash attention off, and prints the logits of
#: the asked rows as JSON.
LOGITS_SOURCE = r"""
#include "llama.h"
#include "ggml.h"
#include <stdio.h>
#include <stdlib.h>

static void on_log(enum ggml_log_level level, const char * text, void * user_data) {
    (void) user_data;
    if (level == GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

int main(int argc, char ** argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL.gguf ROW... < TOKENS\n", argv[0]);
        return 2;
    }
    int cap = 1024, n = 0, t;
    llama_token * tokens = malloc(sizeof(llama_token) * cap);
    while (scanf("%d", &t) == 1) {
        if (n == cap) {
            cap *= 2;
            tokens = realloc(tokens, sizeof(llama_token) * cap);
        }
        tokens[n++] = t;
    }
    if (n == 0) {
        fprintf(stderr, "error: no tokens on stdin\n");
        return 2;
    }
    llama_log_set(on_log, NULL);
    llama_backend_init();
    struct llama_model * model = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (!model) {
        fprintf(stderr, "error: llama_model_load_from_file failed\n");
        return 1;
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t) n;
    cp.n_batch = (uint32_t) n;
    cp.n_ubatch = (uint32_t) n;
    cp.n_seq_max = 1;
    cp.n_threads = 1;
    cp.n_threads_batch = 1;
    cp.type_k = GGML_TYPE_F32;
    cp.type_v = GGML_TYPE_F32;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    struct llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "error: llama_init_from_model failed\n");
        return 1;
    }
    struct llama_batch batch = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        batch.token[i] = tokens[i];
        batch.pos[i] = i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = 0;
    }
    for (int a = 2; a < argc; a++) {
        batch.logits[atoi(argv[a])] = 1;
    }
    batch.n_tokens = n;
    int rc = llama_decode(ctx, batch);
    if (rc != 0) {
        fprintf(stderr, "error: llama_decode returned %d\n", rc);
        return 1;
    }
    int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    printf("{\"n_ctx\": %d, \"logits\": [", (int) llama_n_ctx(ctx));
    for (int a = 2; a < argc; a++) {
        const float * row = llama_get_logits_ith(ctx, atoi(argv[a]));
        printf("%s[", a > 2 ? ", " : "");
        for (int v = 0; v < n_vocab; v++) {
            printf("%s%.9g", v ? ", " : "", row[v]);
        }
        printf("]");
    }
    printf("]}\n");
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    free(tokens);
    return 0;
}
"""
#: Where the build puts the logits driver.
LOGITS_DRIVER = ENV / "ggml" / "llama-logits"


def run_logits(path: Path, tokens: list[int], rows: list[int]) -> list[list[float]]:
    """The logits libllama computes for ``tokens`` at ``rows`` (``llama-logits``).

    Raises:
        RuntimeError: libllama refused the file or aborted (its last message).
    """
    proc = subprocess.run([str(LOGITS_DRIVER), str(path), *map(str, rows)],
                          input=" ".join(map(str, tokens)), capture_output=True, text=True,
                          timeout=TIMEOUT_S)  # fmt: skip
    if proc.returncode != 0 or not proc.stdout.strip():
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        raise RuntimeError(f"libllama: {(lines[-1] if lines else f'exit {proc.returncode}')[:300]}")
    return list(json.loads(proc.stdout)["logits"])


if __name__ == "__main__":
    # the build script writes the drivers' sources with: python llamacpp_graph.py [logits]
    sys.stdout.write(LOGITS_SOURCE if sys.argv[1:] == ["logits"] else DRIVER_SOURCE)
