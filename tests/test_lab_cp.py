"""posenc lab under context parallelism: gloo processes against one process.

2 processes (data parallel 1 x context parallel 2) and 4 (2 x 2) are forked as in
tests/test_ring_attention.py. Each holds the zigzag shard of its data-parallel
share of the batch and attends with ring attention; the gradients of one step
(every encoding the lab trains, on padded and unpadded batches) and the parameters
and losses of a few steps of ``train`` equal those of one process, to float32
rounding: the same sums in another order.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from gloo_ranks import run_forked
from posenc.faces.cli import main
from posenc.faces.lab import tasks as T
from posenc.faces.lab.encodings import ENCODINGS, REGISTRY, training_encoding
from posenc.faces.lab.model import ContextParallel, LabModel
from posenc.faces.lab.training import (
    LabConfig,
    _sharded_loss,
    _share,
    _World,
    _world,
    batch_loss,
    run,
    train,
)
from posenc.integration.context_parallel import unshard

CONFIG = LabConfig(
    task="copy", encodings=("alibi",), train_len=6, test_len=8, seeds=1, steps=4,
    batch_size=8, lr=1e-3, d_model=32, layers=2, heads=2, checkpoint_every=1000,
)  # fmt: skip
CP = 2
# the trained encodings ring attention can train (Encoding.context_parallel)
EVERY = tuple(
    dict.fromkeys(training_encoding(e) for e in ENCODINGS if REGISTRY[e].context_parallel)
)
# FIRE's last bias is added to every logit of a row, which softmax ignores: its true
# gradient is 0, so Adam turns its rounding noise into steps of lr (in one process
# too); its gradients are compared below
TRAINED = ("alibi", "rope", "sinusoidal", "t5", "xpos", "learned", "randomized", "hybrid-nope")
EPS32 = torch.finfo(torch.float32).eps


def _batches() -> dict[str, T.Batch]:
    gen = torch.Generator().manual_seed(5)
    tokens = torch.randint(4, T.vocab_size("copy"), (CONFIG.batch_size, 17), generator=gen)
    return {
        "copy 6": T.make_batch("copy", 6, CONFIG.batch_size, gen),  # 15 tokens + 1 padding
        "copy 1": T.make_batch("copy", 1, CONFIG.batch_size, gen),  # 5 + 3: a chunk of padding
        "text": T.Batch(tokens[:, :-1], tokens[:, 1:], 16),  # every target scored, no padding
    }


def _gradients(encoding: str, batch: T.Batch, world: _World | None) -> dict[str, torch.Tensor]:
    """The gradients of one step's loss: one process's, or this process's under the mesh."""
    torch.manual_seed(0)
    model = LabModel(CONFIG.model, encoding)
    positions = torch.Generator().manual_seed(3)
    if world is None:
        loss = batch_loss(model, batch, positions)
    else:
        net = nn.parallel.DistributedDataParallel(model)
        scored = int((batch.targets != T.IGNORE).sum())
        loss = _sharded_loss(net, _share(batch, world), positions, world, scored)
    loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def _rank_main(rank: int, world_size: int, workdir: str) -> None:
    torch.set_num_threads(1)
    os.environ["WORLD_SIZE"] = str(world_size)
    dist.init_process_group(
        "gloo", init_method=f"file://{workdir}/rendezvous", rank=rank, world_size=world_size
    )
    try:
        world = _world(CP)
        context = world.context()
        assert context is not None and (world.dp_rank, context.rank) == (rank // CP, rank % CP)
        grads = {
            (e, name): _gradients(e, batch, world)
            for e in EVERY
            for name, batch in _batches().items()
        }
        trained = {}
        for e in TRAINED:
            model, losses = train(CONFIG, e, 0, directory=Path(workdir, "runs"), world=world)
            trained[e] = (model.state_dict(), losses)
        if rank == 0:
            torch.save({"grads": grads, "trained": trained}, Path(workdir, "results.pt"))
        Path(workdir, f"rank{rank}.ok").write_text("ok")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module", params=[2, 4], ids=["dp1xcp2", "dp2xcp2"])
def ranks(request, tmp_path_factory):
    world_size = request.param
    workdir = tmp_path_factory.mktemp(f"cp{world_size}")
    run_forked(_rank_main, world_size, workdir, seconds=120)
    assert len(list(workdir.glob("*.ok"))) == world_size
    return torch.load(workdir / "results.pt", weights_only=False)


@pytest.fixture(autouse=True)
def _one_thread():
    # the references in this process: one thread, as the ranks, on cores shared with them
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_gradients_equal_one_process(ranks):
    for (encoding, name), got in ranks["grads"].items():
        batch = _batches()[name]
        want = _gradients(encoding, batch, None)
        assert got.keys() == want.keys()
        # every gradient is a sum over the batch's scored tokens, here in another order
        # (zigzag shards, ring blocks merged by their log-sum-exp, DDP's sum over
        # processes, the loss's sum scaled once): at most one rounding of eps32 per
        # token, relative to the magnitudes flowing through the model, of which the
        # largest gradient is the measure (a per-tensor one is not: a gradient that
        # cancels to 0, as FIRE's last bias does, keeps the noise of the rest)
        scored = int((batch.targets != T.IGNORE).sum())
        bound = scored * EPS32 * max(float(g.abs().max()) for g in want.values())
        for key in want:
            err = float((got[key] - want[key]).abs().max())
            assert err <= bound, f"{encoding} {name} {key}: {err:.3g} > {bound:.3g}"


def test_training_equals_one_process(ranks, tmp_path):
    for encoding in TRAINED:
        model, losses = train(CONFIG, encoding, 0, directory=tmp_path, world=_World())
        state, got = ranks["trained"][encoding]
        # AdamW steps each parameter by lr times m / sqrt(v): the relative error of a
        # gradient (float32 rounding, test above) carries into its step relatively, and
        # 1 % covers parameters whose gradient is only a hundred times its rounding
        # noise; a step is at most about lr, so the steps together move by lr * steps
        bound = CONFIG.lr * CONFIG.steps * 1e-2
        for key, want in model.state_dict().items():
            err = float((state[key] - want).abs().max())
            assert err <= bound, f"{encoding} {key}: {err:.3g} > {bound:.3g}"
        # means over the batch in another order, of parameters within the bound above
        torch.testing.assert_close(torch.tensor(got), torch.tensor(losses), rtol=1e-5, atol=0)


def test_shards_are_zigzag_with_padding_at_the_end():
    x = torch.arange(15)
    shards = [ContextParallel(None, 2, r).local(x, -1) for r in range(2)]
    assert shards[0].tolist() == [0, 1, 2, 3, 12, 13, 14, -1]
    assert unshard(shards, -1, "zigzag").tolist() == [*range(15), -1]


def test_a_span_is_refused_under_context_parallelism():
    model = LabModel(CONFIG.model, "alibi")
    tokens = torch.zeros(1, 8, dtype=torch.int64)
    with pytest.raises(ValueError, match="span"):
        model(tokens, span=(2, 6), context=ContextParallel(None, 2, 0))


@pytest.mark.parametrize("cp", [2, 3])
def test_context_parallel_must_divide_the_processes(tmp_path, cp):
    with pytest.raises(ValueError, match="--context-parallel"):
        run(replace(CONFIG, steps=1), tmp_path, progress=False, context_parallel=cp)


def test_the_command_names_the_option(tmp_path, capsys):
    argv = ["lab", "run", "--context-parallel", "2", "--out", str(tmp_path), "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--context-parallel" in err and "torchrun" in err
    assert main(["lab", "run", "--context-parallel", "0", "--out", str(tmp_path)]) == 2


@pytest.mark.parametrize("encoding", [e for e in ENCODINGS if not REGISTRY[e].context_parallel])
def test_encodings_without_a_ring_form_refuse_context_parallelism(encoding):
    from posenc.faces.lab.model import ContextParallel

    model = LabModel(CONFIG.model, encoding)
    tokens = torch.randint(4, T.vocab_size("copy"), (2, 8))
    with pytest.raises(ValueError, match="no ring-attention form"):
        model(tokens, context=ContextParallel(None, 2, 0))
