"""posenc.modules against the modules users run (HF transformers, diffusers), and its guarantees.

Anchors are built from tiny configs with random weights (nothing is downloaded).
Learned tables are compared exactly after copying the anchor's weights.

Tolerance against anchors that compute the sinusoid in float32 (M2M100, diffusers),
per element, derived as in tests/test_sinusoidal.py: the anchor rounds
``x_k = -k c`` (``|x_k| 2**-23``), ``omega_k = exp(x_k)`` and ``theta = p omega_k``
(``2**-22`` relative together), so its angle errs by up to
``|theta| (|x_k| 2**-23 + 2**-22)``; sin/cos and the final rounding add < 1e-6.
posenc is exact to float32 rounding, so it must also be no further from the float64
truth than the anchor is.
"""

from __future__ import annotations

import copy
import inspect
import math
import pickle
import threading

import numpy as np
import pytest
import torch
from torch import nn

import posenc
from posenc.core.positions import fairseq_positions, opt_positions
from posenc.families.absolute.modules import LearnedPositionalEmbedding, SinusoidalEmbedding
from posenc.families.absolute.sinusoidal import resolve

HALF_ULP = 2.0**-25  # float32 rounding of values in [-1, 1]


def table(n, dim, **kwargs):
    return torch.from_numpy(posenc.sinusoidal(n, dim, **kwargs))


def assert_matches_float32_anchor(ours, anchor, positions, dim, preset, **overrides):
    """Within the derived per-element bound of the anchor; no further from the truth."""
    ours = np.asarray(ours, dtype=np.float64).reshape(-1, dim)
    anchor = np.asarray(anchor, dtype=np.float64).reshape(-1, dim)
    p = np.asarray(positions, dtype=np.float64).reshape(-1)
    spec = resolve(preset, **overrides)
    slots = spec.slots(dim)
    omega = spec.inv_freq(dim)
    theta = np.abs(p[:, None] * omega[None])
    tol = theta * (np.abs(np.log(omega / spec.scale)) * 2.0**-23 + 2.0**-22) + 1e-6
    exact = posenc.sinusoidal(p, dim, preset=spec, dtype="float64")
    pads = np.all(anchor == 0, axis=1)  # fairseq pad rows are zero in both
    assert (ours[pads] == 0).all()
    for cols, n in ((slots.first, slots.n_first), (slots.second, slots.n_second)):
        err = np.abs(ours[~pads][:, cols] - anchor[~pads][:, cols])
        assert (err <= tol[~pads][:, :n]).all(), err.max()
    ours_err = np.abs(ours[~pads] - exact[~pads]).max(initial=0)
    assert ours_err <= max(np.abs(anchor[~pads] - exact[~pads]).max(initial=0), HALF_ULP)


def padded_ids(seed, batch, seq, padding_idx, *, left=False):
    rng = np.random.default_rng(seed)
    ids = rng.integers(padding_idx + 1, padding_idx + 40, size=(batch, seq))
    for b in range(batch):
        n = int(rng.integers(0, seq // 2))
        if left:
            ids[b, :n] = padding_idx
        else:
            ids[b, seq - n :] = padding_idx
    return torch.from_numpy(ids)


# ------------------------------------------------------------------ anchors: sinusoidal


def tiny_m2m100(dim, max_positions):
    from transformers import M2M100Config, M2M100Model

    config = M2M100Config(
        vocab_size=60,
        d_model=dim,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=1,
        decoder_attention_heads=1,
        encoder_ffn_dim=8,
        decoder_ffn_dim=8,
        max_position_embeddings=max_positions,
        scale_embedding=True,
    )
    return M2M100Model(config).eval(), config


@pytest.mark.parametrize("dim", [8, 9, 64])
def test_fairseq_sinusoidal_is_m2m100(dim):
    model, config = tiny_m2m100(dim, max_positions=20)
    anchor = model.encoder.embed_positions
    pad = config.pad_token_id
    ours = SinusoidalEmbedding(dim, preset="fairseq", padding_idx=pad, max_len=22)
    ids = padded_ids(dim, 3, 12, pad)
    # transformers 5.24 renamed past_key_values_length to cache_length
    params = inspect.signature(anchor.forward).parameters
    cached = "cache_length" if "cache_length" in params else "past_key_values_length"
    # the last past length pushes both tables past their initial 22 rows
    for past in (0, 5, 40):
        expected = anchor(input_ids=ids, **{cached: past})
        positions = fairseq_positions(ids, pad, past)
        got = ours.encode(positions)
        assert got.shape == expected.shape and got.dtype == torch.float32
        assert_matches_float32_anchor(got, expected, positions, dim, "fairseq")
        # pads: all zeros in both
        assert (got[ids == pad] == 0).all()

        # M2M100's inputs_embeds path numbers positions padding_idx + 1 + past ..
        x = torch.zeros(3, 12, dim)
        expected = anchor(inputs_embeds=x, **{cached: past})
        got = ours(x, offset=pad + 1 + past)
        first = pad + 1 + past
        assert_matches_float32_anchor(
            got.expand(3, -1, -1),
            expected,
            np.tile(np.arange(first, first + 12), 3),
            dim,
            "fairseq",
        )
    assert ours.table.shape[0] >= pad + 1 + 12 + 40


def test_fairseq_scaled_embedding_is_m2m100_encoder_input():
    """x * embed_scale + pe, as the M2M100 encoder forms its first hidden state."""
    dim = 16
    model, config = tiny_m2m100(dim, max_positions=20)
    ids = padded_ids(3, 2, 7, config.pad_token_id)
    with torch.no_grad():
        tokens = model.encoder.embed_tokens(ids)  # already times embed_scale = sqrt(dim)
        expected = tokens + model.encoder.embed_positions(ids)
        raw = tokens / model.encoder.embed_tokens.embed_scale
    ours = SinusoidalEmbedding(
        dim, preset="fairseq", padding_idx=config.pad_token_id, input_scale=math.sqrt(dim)
    )
    got = ours(raw, positions=fairseq_positions(ids, config.pad_token_id))
    # the sums agree to the anchor's float32 angle error plus one rounding of the sum
    torch.testing.assert_close(got, expected, rtol=2**-22, atol=2e-6)


DIFFUSERS = [("ddpm", False, 1), ("ldm", True, 0)]


@pytest.mark.parametrize("dim", [4, 5, 32, 320])
@pytest.mark.parametrize(("preset", "flip", "shift"), DIFFUSERS)
def test_float_timesteps_are_diffusers_timesteps(preset, flip, shift, dim):
    from diffusers.models.embeddings import Timesteps

    rng = np.random.default_rng(dim)
    t = np.concatenate([[0.0, 1.0, 0.5, 999.0], rng.uniform(0, 1000, 60)]).astype(np.float32)
    anchor = Timesteps(dim, flip_sin_to_cos=flip, downscale_freq_shift=shift)
    expected = anchor(torch.from_numpy(t))
    got = SinusoidalEmbedding(dim, preset=preset).encode(torch.from_numpy(t))
    assert got.shape == expected.shape and got.dtype == torch.float32
    assert_matches_float32_anchor(got, expected, t, dim, preset)


@pytest.mark.parametrize(("preset", "flip", "shift"), DIFFUSERS)
def test_integer_timesteps_use_the_table(preset, flip, shift):
    from diffusers.models.embeddings import Timesteps

    t = torch.tensor([0, 3, 999, 500])
    expected = Timesteps(64, flip_sin_to_cos=flip, downscale_freq_shift=shift)(t)
    ours = SinusoidalEmbedding(64, preset=preset, max_len=1000)
    got = ours.encode(t)
    assert torch.equal(got, table(1000, 64, preset=preset)[t])
    assert_matches_float32_anchor(got, expected, t.numpy(), 64, preset)


# ------------------------------------------------------------------ anchors: learned


def copy_into_ours(anchor, ours):
    ours.load_state_dict(anchor.state_dict())  # same key, same shape: checkpoints load as is
    return ours


def test_learned_offset_2_is_bart():
    from transformers import BartConfig, BartModel

    config = BartConfig(
        vocab_size=50,
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=40,
    )
    anchor = BartModel(config).decoder.embed_positions
    ours = copy_into_ours(anchor, LearnedPositionalEmbedding(40, 16, offset=2))
    ids = torch.zeros(3, 7, dtype=torch.long)
    for past in (0, 4, 33):
        assert torch.equal(ours(shape=ids.shape, past_length=past), anchor(ids, past))
    position_ids = torch.tensor([5, 0, 39])
    assert torch.equal(ours(position_ids[None]), anchor(ids, position_ids=position_ids))
    with pytest.raises(ValueError, match=r"positions must lie in \[-2, 39\]"):
        ours(shape=ids.shape, past_length=34)


@pytest.mark.parametrize("past", [0, 2, 6])
def test_learned_offset_2_is_opt(past):
    from transformers import OPTConfig, OPTModel

    config = OPTConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=1,
        ffn_dim=32,
        num_attention_heads=2,
        max_position_embeddings=40,
        word_embed_proj_dim=16,
    )
    anchor = OPTModel(config).decoder.embed_positions
    ours = copy_into_ours(anchor, LearnedPositionalEmbedding(40, 16, offset=2))
    mask = (padded_ids(past, 4, 9, 0, left=True) != 0).long()  # OPT pads on the left
    for m in (mask, mask.float()):
        assert torch.equal(ours(opt_positions(m, past)), anchor(m, past))


def test_learned_padding_idx_is_roberta():
    """fairseq's learned convention, as RoBERTa keeps it: rows max_positions + pad + 1."""
    from transformers import RobertaConfig
    from transformers.models.roberta.modeling_roberta import RobertaEmbeddings

    config = RobertaConfig(
        vocab_size=50, hidden_size=16, max_position_embeddings=22, pad_token_id=1
    )
    anchor = RobertaEmbeddings(config).position_embeddings
    ours = copy_into_ours(anchor, LearnedPositionalEmbedding(20, 16, padding_idx=1))
    ids = padded_ids(0, 3, 20, 1)
    hf_ids = RobertaEmbeddings.create_position_ids_from_input_ids(ids, 1)
    assert torch.equal(ours(fairseq_positions(ids, 1)), anchor(hf_ids))
    assert torch.equal(ours(shape=(3, 20)), anchor(torch.arange(2, 22).expand(3, 20)))
    with pytest.raises(ValueError, match=r"positions must lie in \[0, 21\]"):
        ours(shape=(3, 21))


def test_gradient_reaches_learned_rows_and_not_the_pad_row():
    emb = LearnedPositionalEmbedding(10, 4, padding_idx=1)
    assert emb.weight.shape == (12, 4)
    assert (emb.weight[1] == 0).all()
    positions = fairseq_positions(torch.tensor([[7, 8, 1], [1, 9, 9]]), 1)
    emb(positions).square().sum().backward()
    grad = emb.weight.grad
    used = {2, 3}  # positions [[2, 3, 1], [1, 2, 3]]
    for row in range(12):
        assert bool(grad[row].abs().sum() > 0) == (row in used), row

    emb = LearnedPositionalEmbedding(10, 4, offset=2)
    emb(shape=(2, 3), past_length=4).sum().backward()
    counts = torch.zeros(12)
    counts[6:9] = 2  # positions 4, 5, 6 of two rows read rows 6, 7, 8
    assert torch.equal(emb.weight.grad, counts[:, None].expand(12, 4))


# ------------------------------------------------------------------ module behaviour


def test_table_is_a_cache_not_state():
    m = SinusoidalEmbedding(8, max_len=16)
    assert dict(m.named_buffers()) == {}  # nothing for a cast or to_empty() to round or drop
    assert m.state_dict() == {}
    m.load_state_dict({})  # strict: nothing missing
    assert torch.equal(m.table, table(16, 8))


@pytest.mark.parametrize(
    "cast", ["bfloat16", "half", "double", "to_empty", "meta_then_to_empty", "sequential"]
)
def test_casting_the_model_keeps_the_table_exact(cast):
    n, dim = 300, 64
    m = SinusoidalEmbedding(dim, max_len=n)
    if cast == "bfloat16":
        m.to(torch.bfloat16)
    elif cast == "half":
        m.half()
    elif cast == "double":
        m.double()
    elif cast == "to_empty":
        m.to_empty(device="cpu")
    elif cast == "meta_then_to_empty":  # deferred initialisation: values rebuilt, not garbage
        with torch.device("meta"):
            m = SinusoidalEmbedding(dim, max_len=n)
        m.to("meta")
        m.to_empty(device="cpu")
    else:
        nn.Sequential(nn.Linear(dim, dim), m).to(dtype=torch.bfloat16)
    assert m.table.dtype == torch.float32
    assert torch.equal(m.table, table(n, dim))
    truth = posenc.sinusoidal(n, dim, dtype="float64")
    assert np.abs(m.table.numpy().astype(np.float64) - truth).max() <= HALF_ULP


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_output_dtype_follows_x(dtype):
    m = SinusoidalEmbedding(16, max_len=32)
    x = torch.randn(2, 5, 16).to(dtype)
    out = m(x, offset=3)
    assert out.dtype == dtype
    if dtype == torch.float64:  # float64 gets float64-exact encodings, not the float32 table
        pe = posenc.sinusoidal(torch.arange(3, 8), 16, dtype=torch.float64)
    else:
        pe = table(32, 16)[3:8].to(dtype)
    assert torch.equal(out, x + pe)


def test_cast_cache_is_keyed_on_dtype_and_follows_growth():
    m = SinusoidalEmbedding(16, max_len=8)
    x = torch.randn(1, 6, 16)
    # the positional-encodings bug: a cache keyed on shape returns the first dtype again
    for dtype in (torch.bfloat16, torch.float16, torch.bfloat16, torch.float32):
        out = m(x.to(dtype))
        assert out.dtype == dtype
        assert torch.equal(out, x.to(dtype) + table(8, 16)[:6].to(dtype))
    cpu = torch.device("cpu")
    assert set(m._tables) == {(cpu, torch.float32), (cpu, torch.bfloat16), (cpu, torch.float16)}
    m(x.to(torch.bfloat16), offset=20)  # grows: the bfloat16 cast must follow
    assert torch.equal(m._tables[(cpu, torch.bfloat16)][0], m.table.bfloat16())
    out = m(x.to(torch.bfloat16), offset=10)
    assert torch.equal(out, x.bfloat16() + table(32, 16)[10:16].bfloat16())


def test_growth_doubles_once_and_matches_a_fresh_table(monkeypatch):
    m = SinusoidalEmbedding(12, preset="fairseq", padding_idx=1, max_len=8)
    builds = []
    build = m._build
    monkeypatch.setattr(
        m, "_build", lambda n, device, dtype: builds.append(n) or build(n, device, dtype)
    )
    got = m.encode(torch.arange(100))
    assert builds == [128]  # 8 -> 128 in one build, not one row or one call at a time
    fresh = SinusoidalEmbedding(12, preset="fairseq", padding_idx=1, max_len=128)
    assert torch.equal(m.table, fresh.table)
    assert torch.equal(got, fresh.table[:100])
    assert (got[1] == 0).all()
    before = m.table
    for length in (5, 50, 128):
        m(torch.zeros(1, length, 12))
    assert m.table is before and builds == [128]  # never refilled per call


def test_huge_positions_are_computed_directly(monkeypatch):
    monkeypatch.setattr(SinusoidalEmbedding, "max_table_elements", 64 * 16)
    m = SinusoidalEmbedding(16, max_len=8)
    positions = torch.tensor([0, 5, 10**6, 2**31 - 1])
    got = m.encode(positions)
    assert m.table.shape[0] == 8  # not grown to a million rows
    assert torch.equal(got, posenc.sinusoidal(positions, 16))
    out = m(torch.zeros(1, 3, 16), offset=10**9)
    assert torch.equal(out[0], posenc.sinusoidal(torch.arange(10**9, 10**9 + 3), 16))


def test_concurrent_forwards_with_growing_lengths():
    dim, longest = 8, 700
    m = SinusoidalEmbedding(dim, max_len=1)
    truth = table(longest, dim)
    workers = 8
    barrier = threading.Barrier(workers)
    failures = []

    def work(i):
        dtype = torch.bfloat16 if i % 2 else torch.float32
        barrier.wait()
        for length in range(1 + i, longest, 29):
            out = m(torch.zeros(1, length, dim, dtype=dtype))
            if not torch.equal(out[0], truth[:length].to(dtype)):
                failures.append((i, length))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures
    assert m.table.shape[0] == 1024
    assert torch.equal(m.table, table(1024, dim))


def test_padding_rows_are_zero():
    m = SinusoidalEmbedding(6, preset="fairseq", padding_idx=1, input_scale=3.0)
    ids = torch.tensor([[5, 6, 1, 7], [1, 1, 5, 6]])
    positions = fairseq_positions(ids, 1)
    x = torch.randn(2, 4, 6)
    out = m(x, positions=positions)
    pads = ids == 1
    assert torch.equal(out[pads], 3.0 * x[pads])
    assert torch.equal(out[~pads], 3.0 * x[~pads] + m.table[positions[~pads]])
    # float positions equal to padding_idx are zero too
    assert (m.encode(torch.tensor([1.0, 2.0]))[0] == 0).all()


def test_offset_is_the_kv_cache_start():
    m = SinusoidalEmbedding(16, max_len=4)
    x = torch.randn(2, 9, 16)
    full = m(x)
    # decoding one token at a time with the cache offset reproduces the full pass
    # (rotary-embedding-torch #11: without the offset every step is position 0)
    steps = torch.cat([m(x[:, t : t + 1], offset=t) for t in range(9)], dim=1)
    assert torch.equal(steps, full)
    assert torch.equal(m(x[:, 3:], offset=3), full[:, 3:])
    assert torch.equal(m(x[:, 3:], offset=torch.tensor(3)), full[:, 3:])
    assert torch.equal(m(x[:, 3:], positions=torch.arange(3, 9)), full[:, 3:])
    assert torch.equal(m(x[:, 3:], positions=torch.arange(3, 9).expand(2, 6)), full[:, 3:])
    assert torch.equal(m(x[0]), full[0])  # unbatched (seq, dim)
    # negative positions are valid offsets, computed directly
    neg = m(torch.zeros(1, 3, 16), offset=-2)
    assert torch.equal(neg[0], posenc.sinusoidal(torch.arange(-2, 1), 16))


def test_input_scale_and_dropout():
    m = SinusoidalEmbedding(16, input_scale=4.0, dropout=0.5)
    x = torch.randn(3, 10, 16)
    expected = x * 4.0 + table(10, 16)
    m.eval()
    assert torch.equal(m(x), expected)
    assert torch.equal(m(x), m(x))
    m.train()
    torch.manual_seed(0)
    out = m(x)
    kept = out != 0
    assert 0.3 < kept.float().mean() < 0.7
    torch.testing.assert_close(out[kept], 2.0 * expected[kept])


def test_encode_float_positions_are_exact():
    m = SinusoidalEmbedding(10, preset="ldm")
    t = torch.tensor([[0.25, 17.5], [999.0, 1e6 + 0.5]], dtype=torch.float64)
    got = m.encode(t)
    assert got.shape == (2, 2, 10)
    assert torch.equal(got.reshape(4, 10), posenc.sinusoidal(t.reshape(4), 10, preset="ldm"))
    assert m.encode(t, dtype=torch.bfloat16).dtype == torch.bfloat16
    assert m.encode(torch.zeros(0, dtype=torch.long)).shape == (0, 10)


def test_copy_and_pickle():
    m = SinusoidalEmbedding(8, max_len=4)
    m(torch.zeros(1, 3, 8, dtype=torch.bfloat16))  # fills the cast cache
    for clone in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        assert torch.equal(clone.table, m.table)
        clone(torch.zeros(1, 10, 8))  # grows the clone only
        assert clone.table.shape[0] == 16 and m.table.shape[0] == 4


def test_repr():
    m = SinusoidalEmbedding(8, preset="fairseq", padding_idx=1, input_scale=2.0)
    assert "8, preset='fairseq', max_len=2048, padding_idx=1, input_scale=2" in repr(m)
    assert "40, 16, offset=2" in repr(LearnedPositionalEmbedding(40, 16, offset=2))


# inductor's first import decorates with torch.jit.script_method, deprecated in torch 2.13
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_torch_compile_fullgraph():
    m = SinusoidalEmbedding(16, max_len=64, input_scale=2.0).eval()
    x = torch.randn(2, 5, 16)
    compiled = torch.compile(m, fullgraph=True)  # inductor: one real compiled call
    assert torch.equal(compiled(x, offset=3), m(x, offset=3))

    # the other traced paths, checked for graph breaks with the fast backend
    traced = torch.compile(m, fullgraph=True, backend="aot_eager")
    positions = torch.arange(7, 12).expand(2, 5)
    assert torch.equal(traced(x, positions=positions), m(x, positions=positions))
    assert torch.equal(traced(x, offset=torch.tensor(4)), m(x, offset=4))
    # a table too short cannot grow inside the graph: it says so instead of broadcasting
    with pytest.raises(RuntimeError, match=r"cannot grow inside torch\.compile"):
        traced(x, offset=62)


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"dim": 0}, ValueError, "dim must be an int >= 1"),
        ({"dim": 2.5}, TypeError, "dim must be an int"),
        ({"dim": "8"}, TypeError, "dim must be an int"),
        ({"dim": 8, "max_len": 0}, ValueError, "max_len must be an int >= 1"),
        ({"dim": 8, "max_len": 1.5}, TypeError, "max_len"),
        ({"dim": 8, "padding_idx": -1}, ValueError, "padding_idx"),
        ({"dim": 8, "padding_idx": True}, TypeError, "padding_idx"),
        ({"dim": 8, "dropout": 1.5}, ValueError, "dropout must lie in"),
        ({"dim": 8, "dropout": "a"}, TypeError, "dropout"),
        ({"dim": 8, "input_scale": "x"}, TypeError, "input_scale"),
        ({"dim": 8, "preset": "nope"}, ValueError, "unknown preset"),
        ({"dim": 8, "max_periodd": 3}, ValueError, "unknown override"),
        ({"dim": 7, "preset": "whisper"}, ValueError, "dim must be even"),
    ],
)
def test_bad_constructor_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        SinusoidalEmbedding(**kwargs)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda m: m(np.zeros((1, 2, 8))), TypeError, "x must be a float tensor"),
        (lambda m: m(torch.zeros(1, 2, 8, dtype=torch.long)), TypeError, "x must be a float"),
        (lambda m: m(torch.zeros(1, 2, 7)), ValueError, "dim=8"),
        (lambda m: m(torch.zeros(1, 1, 2, 8)), ValueError, r"x must be \(batch, seq, dim\)"),
        (lambda m: m(torch.zeros(1, 2, 8), positions=np.arange(2)), TypeError, "torch tensor"),
        (
            lambda m: m(torch.zeros(1, 2, 8), positions=torch.zeros(1, 1, 2)),
            ValueError,
            "positions",
        ),
        (lambda m: m(torch.zeros(1, 2, 8), positions=torch.arange(3)), ValueError, "positions"),
        (lambda m: m(torch.zeros(2, 2, 8), positions=torch.zeros(3, 2)), ValueError, "positions"),
        (lambda m: m(torch.zeros(2, 8), positions=torch.zeros(1, 2)), ValueError, "positions"),
        (
            lambda m: m(torch.zeros(1, 2, 8), positions=torch.ones(2, dtype=torch.bool)),
            TypeError,
            "positions must hold int or float",
        ),
        (
            lambda m: m(torch.zeros(1, 2, 8), positions=torch.arange(2), offset=1),
            ValueError,
            "not both",
        ),
        (lambda m: m(torch.zeros(1, 2, 8), offset=1.5), TypeError, "offset"),
        (lambda m: m(torch.zeros(1, 2, 8), offset=torch.tensor([1])), TypeError, "offset"),
        (lambda m: m.encode(torch.tensor(3)), ValueError, "positions must be"),
        (lambda m: m.encode(torch.tensor([float("nan")])), ValueError, "finite"),
        (lambda m: m.encode(torch.tensor([2.0**31])), ValueError, "2\\*\\*31"),
    ],
)
def test_bad_forward_input(call, error, match):
    with pytest.raises(error, match=match):
        call(SinusoidalEmbedding(8, max_len=4))


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: LearnedPositionalEmbedding(0, 4), ValueError, "num_positions"),
        (lambda: LearnedPositionalEmbedding(4, 0), ValueError, "dim"),
        (lambda: LearnedPositionalEmbedding(4, 4, offset=-1), ValueError, "offset"),
        (lambda: LearnedPositionalEmbedding(4, 4, offset=2.0), TypeError, "offset"),
        (lambda: LearnedPositionalEmbedding(4, 4, offset=2, padding_idx=1), ValueError, "not both"),
        (lambda: LearnedPositionalEmbedding(4, 4)(), ValueError, "exactly one"),
        (
            lambda: LearnedPositionalEmbedding(4, 4)(torch.arange(2), shape=2),
            ValueError,
            "exactly one",
        ),
        (lambda: LearnedPositionalEmbedding(4, 4)(torch.zeros(2)), TypeError, "int values"),
        (
            lambda: LearnedPositionalEmbedding(4, 4)(torch.zeros(1, 1, 2).long()),
            ValueError,
            "positions must be",
        ),
        (lambda: LearnedPositionalEmbedding(4, 4)(torch.tensor([4])), ValueError, r"\[0, 3\]"),
        (lambda: LearnedPositionalEmbedding(4, 4)(torch.tensor([-1])), ValueError, r"\[0, 3\]"),
        (lambda: LearnedPositionalEmbedding(4, 4)(shape=5), ValueError, r"\[0, 3\]"),
        (
            lambda: LearnedPositionalEmbedding(4, 4)(torch.tensor([2**63 + 3], dtype=torch.uint64)),
            ValueError,
            r"positions must lie in \[0, 3\] .* got values in \[9223372036854775808, ",
        ),
        (
            lambda: LearnedPositionalEmbedding(126, 4, offset=2)(
                torch.tensor([127], dtype=torch.int8)
            ),
            ValueError,
            r"positions must lie in \[-2, 125\] .* got values in \[127, 127\]",
        ),
        (lambda: LearnedPositionalEmbedding(4, 4)(shape=(1, 2, 3)), ValueError, "shape"),
        (lambda: LearnedPositionalEmbedding(4, 4)(shape=2, past_length=-1), ValueError, "past"),
        (
            lambda: LearnedPositionalEmbedding(4, 4)(torch.arange(2), past_length=1),
            ValueError,
            "past_length applies to shape only",
        ),
    ],
)
def test_bad_learned_input(make, error, match):
    with pytest.raises(error, match=match):
        make()


# ------------------------------------------------------------------ small int positions

SMALL_INTS = [torch.int8, torch.int16, torch.int32, torch.uint8, torch.uint16, torch.uint32]


@pytest.mark.parametrize("dtype", [*SMALL_INTS, torch.uint64])
def test_sinusoidal_reads_every_int_dtype(dtype):
    # int8, int16 and the unsigned dtypes passed validation, then failed in F.embedding
    m = SinusoidalEmbedding(8, max_len=16, padding_idx=3)
    p = torch.tensor([[0, 3, 5, 100], [1, 2, 127, 4]])  # 100 and 127 grow the table
    expected = m.encode(p)
    assert torch.equal(m.encode(p.to(dtype)), expected)
    x = torch.randn(2, 4, 8)
    assert torch.equal(m(x, positions=p.to(dtype)), m(x, positions=p))
    assert torch.equal(m.encode(p.to(dtype), dtype=torch.float64), m.encode(p, dtype=torch.float64))


@pytest.mark.parametrize("dtype", [*SMALL_INTS, torch.uint64])
def test_learned_reads_every_int_dtype(dtype):
    emb = LearnedPositionalEmbedding(126, 4, offset=2)
    p = torch.tensor([[0, 5, 125], [1, 2, 3]])  # 125 + 2 leaves int8
    assert torch.equal(emb(p.to(dtype)), emb.weight[p + 2])
    fairseq = LearnedPositionalEmbedding(100, 4, padding_idx=1)
    assert torch.equal(fairseq(p.clamp(max=100).to(dtype)), fairseq(p.clamp(max=100)))


@pytest.mark.parametrize("dtype", [*SMALL_INTS, torch.uint64])
def test_rotary_reads_every_int_dtype(dtype):
    # Rotary looks positions up through the same exact-table cache
    rope = posenc.Rotary(16)
    p = torch.tensor([0, 7, 100, 3])
    cos, sin = rope.cos_sin(p)
    got = rope.cos_sin(p.to(dtype))
    assert torch.equal(got[0], cos) and torch.equal(got[1], sin)
    q, k = torch.randn(1, 2, 4, 16), torch.randn(1, 2, 4, 16)
    want = rope(q, k, positions=p)
    got = rope(q, k, positions=p.to(dtype))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_uint64_positions_beyond_the_exact_range_are_refused():
    # read whole, not wrapped to negative int64 values
    big = torch.tensor([2**63 + 5], dtype=torch.uint64)
    with pytest.raises(ValueError, match=r"positions must lie in \(-2\*\*31, 2\*\*31\)"):
        SinusoidalEmbedding(8).encode(big)
    with pytest.raises(ValueError, match=r"positions must lie in \(-2\*\*31, 2\*\*31\)"):
        posenc.Rotary(16).cos_sin(big)


# ------------------------------------------------------------------ sizes and aliases


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: SinusoidalEmbedding(2**40), r"dim must be at most 65536 channels"),
        (lambda: SinusoidalEmbedding(70000, max_len=1), r"dim must be at most 65536 channels"),
        (lambda: LearnedPositionalEmbedding(4, 10**6), r"dim must be at most 65536 channels"),
        (lambda: LearnedPositionalEmbedding(10**12, 10**6), r"dim must be at most 65536"),
        (
            lambda: LearnedPositionalEmbedding(10**12, 16, offset=2),
            r"table of 1000000000002 rows \(num_positions plus the rows before the first\) "
            r"x dim=16 would hold",
        ),
        (
            lambda: LearnedPositionalEmbedding(1, 16, padding_idx=10**12),
            r"table of 1000000000002 rows .* would hold",
        ),
    ],
)
def test_huge_sizes_are_refused_before_allocating(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_diffusers_knobs_need_diffusers_layout():
    with pytest.raises(ValueError, match=r"flip_sin_to_cos is diffusers' .*preset='ldm'"):
        SinusoidalEmbedding(64, flip_sin_to_cos=True, downscale_freq_shift=0)
    ldm = SinusoidalEmbedding(64, preset="ddpm", flip_sin_to_cos=True, downscale_freq_shift=0)
    assert torch.equal(ldm.table, SinusoidalEmbedding(64, preset="ldm").table)
