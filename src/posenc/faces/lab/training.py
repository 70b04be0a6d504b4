"""``posenc lab run``: train one model per encoding and seed, evaluate it at every length.

A *run* is one (task, encoding, seed) under a :class:`LabConfig`. Training is
keyed by everything it depends on (the test-time scaling variants share the
RoPE model of their seed); a finished training is stored under
``out/runs/<key>.pt``, its evaluation under ``out/runs/<key>-<encoding>-<test>.json``
and its position probes (:mod:`posenc.lab.probes`, once per trained model) with
its attention-bias parameters under ``out/runs/<key>-probes-<settings>.json``,
so a rerun, or a run with an added encoding, computes only what is new (a run
evaluated before probes existed loads its trained models and probes them).
While training, a checkpoint is written every ``checkpoint_every`` steps, and
a run killed midway resumes from it; files are written to a temporary name
and renamed, so no finished result is ever half-written.

Distributed: under ``torchrun --nproc_per_node N`` (``WORLD_SIZE`` set) the same
command trains with DistributedDataParallel (gloo on CPU, nccl on GPUs). Every
rank draws the same global batch from the same generator and trains on its
contiguous share; DDP averages the gradients, so the update equals one
process's on the whole batch. Rank 0 alone writes files and shows progress.

Context parallelism: with ``context_parallel=N`` (``--context-parallel N``) the
``W`` processes form a 2-D mesh, ``W / N`` data-parallel ranks by ``N``
context-parallel ones, process ``r`` at ``(r // N, r % N)``; ``N`` must divide
``W``, and ``N = 1`` is the plain DDP above. The processes of one data-parallel
rank (one process group each, made with ``torch.distributed.new_group``) share
its contiguous share of the batch: each holds its ``"zigzag"`` shard of every
sequence (right-padded to ``2 N`` chunks with ignored targets) and attends with
ring attention over its group. One DDP spans all ``W`` processes, so its
gradient average covers both axes: each process's loss is the sum of its tokens'
losses over the global batch's scored tokens, times ``W``, and the average is the
gradient of one process's mean loss over the whole batch (the position-bias
parameters' per-process shares included, which ring attention leaves to be summed).
Evaluation runs whole sequences, the same on every process.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from posenc.core import checks
from posenc.core.files import atomic_write
from posenc.faces.lab import tasks as T
from posenc.faces.lab.encodings import ENCODINGS, lookup, training_encoding
from posenc.faces.lab.model import ContextParallel, LabModel, ModelConfig
from posenc.faces.lab.probes import Probe, bias_parameters, probe_model
from posenc.faces.lab.probes import settings as probe_settings

VERSION = 3  # part of every key: bump when training or evaluation changes (rounding included)
#: The encodings ``posenc lab run`` trains when ``--encodings`` is not given.
DEFAULT_ENCODINGS = ("alibi", "t5", "rope", "sinusoidal", "learned", "nope", "hybrid-nope")


@dataclass(frozen=True)
class LabConfig:
    """One lab run: a task, encodings, lengths, seeds, and how to train.

    Attributes:
        task: one of :data:`posenc.lab.tasks.TASKS`.
        encodings: from :data:`posenc.lab.encodings.ENCODINGS`.
        train_len: synthetic tasks train on lengths ``1 .. train_len`` (drawn
            uniformly per batch); text on windows of ``train_len`` bytes.
        test_len: evaluation reaches this length.
        seeds: seeds ``0 .. seeds - 1``.
        steps: optimiser steps per model.
        batch_size: the global batch (split over processes under torchrun).
        lr: peak AdamW learning rate (warm-up, then cosine decay to a tenth).
        d_model: the model's width.
        layers: its transformer blocks.
        heads: its attention heads per block.
        eval_examples: examples per length (tasks) or windows per length (text).
        text_bytes: bytes read for the text task (of the standard library, or of ``data``).
        checkpoint_every: steps between resumable checkpoints.
        data: the text task's own text, a file or a directory
            (:meth:`posenc.lab.tasks.TextCorpus.from_data`); None: the standard library.
            Trained models are keyed by the digest of the bytes read, not by this path.

    Examples:
        >>> import posenc.lab
        >>> config = posenc.lab.LabConfig(encodings=("rope", "alibi"), seeds=1, steps=200)
        >>> config.task, config.train_len, config.test_len
        ('copy', 16, 32)
        >>> config.max_positions  # tokens of a copy example of length 32
        67
        >>> posenc.lab.LabConfig(train_len=32, test_len=16)
        Traceback (most recent call last):
        ValueError: test_len (16) must be >= train_len (32)
    """

    task: str = "copy"
    encodings: tuple[str, ...] = DEFAULT_ENCODINGS
    train_len: int = 16
    test_len: int = 32
    seeds: int = 3
    steps: int = 1500
    batch_size: int = 64
    lr: float = 1e-3
    d_model: int = 64
    layers: int = 2
    heads: int = 4
    eval_examples: int = 128
    text_bytes: int = 8 << 20
    checkpoint_every: int = 250
    data: str | None = None

    def __post_init__(self) -> None:
        checks.check_choice(self.task, "task", T.TASKS)
        if self.data is not None:
            if not isinstance(self.data, (str, os.PathLike)):
                kind = type(self.data).__name__
                raise TypeError(f"data must be a str, a path or None; got {kind}")
            # a str, so that the config stays JSON (results.json) and hashable
            object.__setattr__(self, "data", os.fspath(self.data))
            if self.task != "text":
                raise ValueError(
                    f"data (--data) is read by the text task only; got task {self.task!r}"
                )
        if not self.encodings:
            raise ValueError("encodings must name at least one encoding")
        for e in self.encodings:
            checks.check_choice(e, "encoding", ENCODINGS)
        for name in ("train_len", "test_len", "seeds", "steps", "batch_size", "eval_examples"):
            checks.check_int(getattr(self, name), name, minimum=1)
        if self.test_len < self.train_len:
            raise ValueError(f"test_len ({self.test_len}) must be >= train_len ({self.train_len})")
        if self.task != "text" and not T.lengths(self.task, self.train_len):
            # flipflop's examples have 2 instructions at least: a write and a read
            raise ValueError(
                f"train_len ({self.train_len}) is shorter than any example of {self.task!r}"
            )
        checks.check_number(self.lr, "lr", positive=True)
        ModelConfig(T.vocab_size(self.task), self.d_model, self.layers, self.heads)

    @property
    def max_positions(self) -> int:
        """The longest sequence the run evaluates (its test length, in tokens)."""
        return T.sequence_length(self.task, self.test_len)

    @property
    def model(self) -> ModelConfig:
        """The model every encoding of the run trains: vocabulary, sizes and lengths."""
        columns = None if self.task == "text" else T.SYNTHETIC[self.task].columns
        return ModelConfig(
            T.vocab_size(self.task), self.d_model, self.layers, self.heads, self.max_positions,
            T.sequence_length(self.task, self.train_len),
            None if columns is None else columns(self.test_len) + 2,
        )  # fmt: skip

    def training_key(self, encoding: str, seed: int) -> str:
        """What a trained model depends on, hashed: shared by test-time scaling variants."""
        parts = asdict(self)
        for unused in ("encodings", "seeds", "test_len", "eval_examples", "checkpoint_every"):
            parts.pop(unused)
        parts.pop("data")  # the path: its bytes enter as their digest, below
        if self.task != "text":
            parts.pop("text_bytes")
        elif self.data is not None:
            # the digest says which bytes the model saw: text_bytes enters only through it
            parts.pop("text_bytes")
            parts["corpus"] = self.corpus_digest
        parts.update(encoding=training_encoding(encoding), seed=seed, version=VERSION)
        parts["max_positions"] = self.max_positions
        if self.model.max_ids is not None:  # the arithmetic tasks' id table (Abacus, coupling)
            parts["max_ids"] = self.model.max_ids
        return _digest(parts)

    @functools.cached_property
    def corpus_digest(self) -> str | None:
        """The text task's corpus's :attr:`~posenc.lab.tasks.TextCorpus.digest` (None: tasks).

        Read once per config object (and carried to worker processes with it), so every
        key of a run names the same bytes; :func:`text_corpus` checks the bytes it trains on.
        """
        if self.task != "text":
            return None
        corpus = _read_corpus(self)
        _CORPUS[self.data, self.text_bytes] = corpus
        return corpus.digest

    def eval_key(self, encoding: str, seed: int) -> str:
        """The trained model's key and the evaluation's settings: one per evaluation."""
        extra = {"encoding": encoding, "test_len": self.test_len, "n": self.eval_examples}
        return f"{self.training_key(encoding, seed)}-{_digest(extra)}"

    def probe_key(self, encoding: str, seed: int) -> str:
        """The trained model's key and the probes' settings: one per trained model."""
        return f"{self.training_key(encoding, seed)}-probes-{_digest(probe_settings())}"


def _digest(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


# the text corpora this process has read, by (data, text_bytes)
_CORPUS: dict[tuple[str | None, int], T.TextCorpus] = {}


def _read_corpus(config: LabConfig) -> T.TextCorpus:
    if config.data is None:
        return T.TextCorpus(max_bytes=config.text_bytes)
    return T.TextCorpus.from_data(config.data, max_bytes=config.text_bytes)


def text_corpus(config: LabConfig) -> T.TextCorpus | None:
    """The text task's corpus, read once per process (None for the synthetic tasks).

    The bytes are those :attr:`LabConfig.corpus_digest` names, which the keys hold:
    nothing rank- or process-specific enters them.

    Raises:
        ValueError: ``data`` changed since ``config`` first read it (make the config
            again), or the corpus is too short for one window of ``train_len`` (train
            split) or ``test_len`` (test split) bytes plus the byte after it.
    """
    if config.task != "text":
        return None
    digest = config.corpus_digest
    corpus = _CORPUS.get((config.data, config.text_bytes))
    if corpus is None or corpus.digest != digest:
        corpus = _read_corpus(config)
        if corpus.digest != digest:
            raise ValueError(
                f"data changed since this LabConfig read it ({config.data!r}): make the "
                "config again (dataclasses.replace(config) reads it anew)"
            )
        _CORPUS[config.data, config.text_bytes] = corpus
    name = "text_bytes" if config.data is None else "data (--data)"
    for split, option in (("train", "train_len"), ("test", "test_len")):
        try:
            corpus.windows(split, getattr(config, option), 1)
        except ValueError as exc:
            raise ValueError(
                f"{name} gives too little text for {option}: {exc}; give more text or a "
                f"smaller {option}"
            ) from None
    return corpus


@dataclass(frozen=True)
class Record:
    """One measurement: tidy, one value per (task, encoding, seed, length, metric)."""

    task: str
    encoding: str
    seed: int
    length: int
    metric: str
    value: float


@dataclass
class Outcome:
    """What :func:`run` produced.

    ``probes``: every trained model's position probes (:class:`~posenc.lab.probes.Probe`);
    ``bias_parameters``: per trained model with an attention-bias module,
    ``{"encoding", "seed", "parameters"}`` (the module's state dict as nested lists,
    :func:`posenc.lab.probes.bias_parameters`); both in the order of ``records``.
    """

    records: list[Record]
    trained: list[str] = field(default_factory=list)  # training keys trained in this call
    reused: list[str] = field(default_factory=list)  # evaluation keys read from the cache
    losses: dict[str, list[float]] = field(default_factory=dict)
    probes: list[Probe] = field(default_factory=list)
    bias_parameters: list[dict[str, Any]] = field(default_factory=list)
    probed: list[str] = field(default_factory=list)  # probe keys computed in this call


# ------------------------------------------------------------------ distributed


@dataclass(frozen=True)
class _World:
    """This process in the mesh: ``size`` processes, ``cp`` of them per context-parallel group."""

    rank: int = 0
    size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    cp: int = 1
    cp_group: Any = None  # this process's context-parallel group when cp > 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def dp_size(self) -> int:
        return self.size // self.cp

    @property
    def dp_rank(self) -> int:
        return self.rank // self.cp

    def context(self) -> ContextParallel | None:
        """The model's view of this process's context-parallel group (None without one)."""
        if self.cp == 1:
            return None
        return ContextParallel(self.cp_group, self.cp, self.rank % self.cp)


def lab_device(device: Any = None) -> torch.device:
    """The device the lab trains on: ``"cuda"`` where a GPU exists unless told otherwise.

    Raises:
        ValueError: a device that is neither CPU nor CUDA, or CUDA where none exists
            (named as ``device``, the ``--device`` option).
    """
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        chosen = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device (--device) must be 'cpu' or 'cuda'; got {device!r}") from None
    if chosen.type not in ("cpu", "cuda"):
        raise ValueError(f"device (--device) must be 'cpu' or 'cuda'; got {device!r}")
    if chosen.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device (--device) is 'cuda', but torch sees no CUDA device here")
    return chosen


def _world(context_parallel: int = 1, device: Any = None) -> _World:
    """This process's place: from torchrun's environment, in a mesh of ``context_parallel``."""
    cp = checks.check_int(context_parallel, "context_parallel", minimum=1)
    where = lab_device(device)
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size % cp:
        raise ValueError(
            f"context_parallel (--context-parallel) = {cp} must divide the number of "
            f"processes, {size}: run under torchrun --nproc_per_node a multiple of {cp} "
            "(1 is plain data parallelism)"
        )
    if size <= 1:
        return _World(device=where)
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("nccl" if where.type == "cuda" else "gloo")
    rank = dist.get_rank()
    if where.type == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        where = torch.device("cuda", local)
    size = dist.get_world_size()
    group = None
    if cp > 1:
        # every process makes every group, in one order, as new_group requires
        groups = [dist.new_group(list(range(first, first + cp))) for first in range(0, size, cp)]
        group = groups[rank // cp]
    return _World(rank, size, where, cp, group)


def _same_on_every_rank(digest: str, world: _World) -> bool:
    """Whether every process holds the same hex ``digest`` (its first 60 bits compared)."""
    if world.size == 1:
        return True
    import torch.distributed as dist

    value = torch.tensor([int(digest[:15], 16)], dtype=torch.int64, device=world.device)
    low, high = value.clone(), value.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    return bool(low == high)


def _barrier(world: _World) -> None:
    if world.size > 1:
        import torch.distributed as dist

        dist.barrier()


# ------------------------------------------------------------------ training


def _save(obj: Any, path: Path) -> None:
    if path.suffix == ".json":
        with atomic_write(path, "w") as f:
            f.write(json.dumps(obj, indent=1))
    else:
        with atomic_write(path) as f:
            torch.save(obj, f)


def _lr_at(step: int, config: LabConfig) -> float:
    return warmup_cosine(step, config.steps)


def warmup_cosine(step: int, steps: int) -> float:
    """The lab's learning-rate factor at ``step`` of ``steps``: a linear warm-up over a
    tenth of the steps (at most 100), then a cosine from 1 down to 0.1.

    The ``LambdaLR`` factor of every lab training (:func:`training_state`), and of the
    studies that train their own models (``posenc lab grid``).
    """
    warm = max(1, min(100, steps // 10))
    if step < warm:
        return (step + 1) / warm
    progress = (step - warm) / max(1, steps - warm)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


def param_groups(model: LabModel, lr: float) -> list[dict[str, Any]]:
    """AdamW's parameter groups: the position-bias parameters at a step relative to their scale.

    Adam moves every parameter by about ``lr`` per step whatever its scale, so a
    parameter drawn at scale ``s`` changes by ``lr / s`` of itself per step. The
    attention projections start at ``s ~ 1 / sqrt(3 d_model)`` (``nn.Linear``'s
    uniform draw) and a T5 bias table at ``s = 1`` (``nn.Embedding``'s normal
    draw): at one ``lr`` the table would learn 14 times slower, relatively, than
    the queries and keys it is added to, and over the schedule could move no more
    than about half a logit from its random start. Each bias parameter therefore
    gets ``lr`` times its initial RMS over the projections' (never less than
    ``lr``): equal relative steps, as Adafactor's parameter-scale updates gave T5
    (Shazeer & Stern 2018, section 8). Every other parameter keeps ``lr``.
    """
    own = [] if model.bias is None else list(model.bias.parameters())
    rest = [p for p in model.parameters() if all(p is not q for q in own)]
    groups: list[dict[str, Any]] = [{"params": rest}]
    if own:
        reference = _rms(model.get_parameter("blocks.0.qkv.weight"))
        groups += [{"params": [p], "lr": lr * max(1.0, _rms(p) / reference)} for p in own]
    return groups


def _rms(p: torch.Tensor) -> float:
    return float(p.detach().double().pow(2).mean().sqrt())


def training_state(
    model: LabModel, config: LabConfig, seed: int, device: torch.device, corpus: Any
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR, _Data, torch.Generator]:
    """The optimiser, schedule, batches and position generator of a fresh training.

    :func:`train` starts every run from these, and ``posenc lab profile`` times
    the same steps from them.

    Args:
        model: the model to train (its parameters, grouped by :func:`param_groups`).
        config: the run: its learning rate, steps, task and batch size.
        seed: the training's seed (of its batches and its randomized positions).
        device: where the model is (AdamW is fused on CPU and CUDA).
        corpus: the text task's corpus (:func:`text_corpus`), or None.

    Returns:
        ``(optimiser, schedule, data, positions)``: AdamW over :func:`param_groups`,
        its warm-up and cosine schedule, the training's global batches (``data.next()``)
        and the generator of its randomized positions.
    """
    # fused: one pass over every parameter instead of a dozen ops per tensor (same update)
    fused = device.type in ("cpu", "cuda")
    opt = torch.optim.AdamW(
        param_groups(model, config.lr), lr=config.lr, betas=(0.9, 0.98), weight_decay=0.01,
        fused=fused,
    )  # fmt: skip
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_at(s, config))
    return opt, sched, _Data(config, seed, corpus), torch.Generator().manual_seed(7 * seed + 3)


def update(
    model: nn.Module, opt: torch.optim.Optimizer, sched: torch.optim.lr_scheduler.LRScheduler
) -> None:
    """One optimiser step: the gradients' norm clipped to 1, then AdamW and the schedule.

    Args:
        model: the trained model, its gradients computed.
        opt: its optimiser (from :func:`training_state`).
        sched: the optimiser's learning-rate schedule, advanced by one step.
    """
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()


class _Data:
    """The global batches of one training run, identical on every rank."""

    def __init__(self, config: LabConfig, seed: int, corpus: Any) -> None:
        self.config, self.corpus = config, corpus
        self.gen = torch.Generator().manual_seed(1_000_003 * (seed + 1))

    def next(self) -> T.Batch:
        c = self.config
        if c.task == "text":
            return self.corpus.batch("train", c.train_len, c.batch_size, self.gen)
        train = T.SYNTHETIC[c.task].train
        if train is not None:  # the task draws its own lengths (every operand's)
            return train(c.train_len, c.batch_size, self.gen)
        # randint(0, k) + 1 draws what randint(1, k + 1) did, so the lab's tasks are unchanged
        ns = T.lengths(c.task, c.train_len)
        n = ns[int(torch.randint(0, len(ns), (1,), generator=self.gen))]
        return T.make_batch(c.task, n, c.batch_size, self.gen)


def _share(batch: T.Batch, world: _World) -> T.Batch:
    """This process's data-parallel rank's contiguous share of the global ``batch``."""
    size = batch.tokens.shape[0] // world.dp_size
    rows = slice(world.dp_rank * size, (world.dp_rank + 1) * size)
    return batch.rows(rows).to(world.device)


def batch_loss(
    model: nn.Module,
    batch: T.Batch,
    positions: torch.Generator,
    *,
    scaling: dict[str, Any] | None = None,
) -> torch.Tensor:
    """The mean cross-entropy over a batch's scored targets (the loss without context parallelism).

    Args:
        model: the lab model.
        batch: its tokens and targets; the loss covers ``batch.scored``, less its
            ``IGNORE`` targets.
        positions: the generator of the model's randomized positions.
        scaling: the ``rope_scaling`` a RoPE model trains with (``posenc lab
            extend``'s fine-tuning), or None.

    Returns:
        The scalar loss, with its graph for ``backward``.
    """
    # the logits of the scored positions alone: the loss of the whole pass (its other
    # targets are ignored) at a fraction of its work
    start, stop = batch.scored
    logits = model(
        batch.tokens, scaling=scaling, generator=positions, span=(start, stop),
        significance=batch.significance,
    )  # fmt: skip
    targets = batch.targets[:, start:stop]
    return nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=T.IGNORE
    )


def _sharded_loss(
    model: nn.Module, batch: T.Batch, positions: torch.Generator, world: _World, scored: int
) -> torch.Tensor:
    """This process's loss under context parallelism, scaled for DDP's average.

    The sum of the losses of its shard of ``batch`` (its data-parallel share)
    over ``scored``, the scored tokens of the global batch, times the processes:
    DDP divides the sum of the gradients by those, leaving the gradient of the
    mean loss over the global batch. Each process holds pieces of the start and
    the end of every sequence, so its whole shard is computed (no scored span);
    the padding's targets are ignored.
    """
    context = world.context()
    assert context is not None
    logits = model(batch.tokens, generator=positions, context=context)
    targets = context.local(batch.targets, T.IGNORE)
    total = nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
        ignore_index=T.IGNORE, reduction="sum",
    )  # fmt: skip
    return total * (world.size / max(1, scored))


def train(
    config: LabConfig,
    encoding: str,
    seed: int,
    *,
    directory: Path,
    world: _World,
    corpus: Any = None,
    on_step: Callable[[int], None] | None = None,
    until: int | None = None,
) -> tuple[LabModel, list[float]]:
    """Train (or resume, or load) the model of ``encoding`` and ``seed``; return it and its losses.

    The losses are those of the global batch (averaged over ranks; under context
    parallelism, ``world.cp > 1``, as the module docstring says). With
    ``until`` below ``config.steps``, training stops after that many steps at a
    resumable checkpoint (the model and losses returned are those so far): a
    later call resumes there, exactly as if it had never stopped.
    """
    key = config.training_key(encoding, seed)
    directory.mkdir(parents=True, exist_ok=True)
    final, partial = directory / f"{key}.pt", directory / f"{key}.partial.pt"
    torch.manual_seed(seed)
    model = LabModel(config.model, encoding).to(world.device)
    if final.exists():
        saved = torch.load(final, map_location=world.device, weights_only=False)
        model.load_state_dict(saved["model"])
        return model, saved["losses"]
    opt, sched, data, positions = training_state(model, config, seed, world.device, corpus)
    losses: list[float] = []
    start = 0
    if partial.exists():
        saved = torch.load(partial, map_location=world.device, weights_only=False)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        sched.load_state_dict(saved["sched"])
        data.gen.set_state(saved["data"])
        positions.set_state(saved["positions"])
        losses, start = saved["losses"], saved["step"]
    stop = config.steps if until is None else min(checks.check_int(until, "until"), config.steps)

    def checkpoint(done: int) -> None:
        _save(
            {
                "model": model.state_dict(), "opt": opt.state_dict(),
                "sched": sched.state_dict(), "data": data.gen.get_state(),
                "positions": positions.get_state(), "losses": losses, "step": done,
            },
            partial,
        )  # fmt: skip

    net: nn.Module = model
    if world.size > 1:
        net = nn.parallel.DistributedDataParallel(model)
    model.train()
    for step in range(start, stop):
        batch = data.next()
        local = _share(batch, world)
        if world.cp == 1:
            loss = batch_loss(net, local, positions)
        else:
            scored = int((batch.targets != T.IGNORE).sum())
            loss = _sharded_loss(net, local, positions, world, scored)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        update(model, opt, sched)
        value = loss.detach()
        if world.size > 1:
            import torch.distributed as dist

            dist.all_reduce(value)
            value /= world.size
        losses.append(float(value))
        if on_step is not None:
            on_step(step + 1)
        done = step + 1
        if world.main and done < stop and done % config.checkpoint_every == 0:
            checkpoint(done)
    if world.main and stop > start:
        if stop < config.steps:
            checkpoint(stop)
        else:
            _save({"model": model.state_dict(), "losses": losses}, final)
            partial.unlink(missing_ok=True)
    _barrier(world)
    return model, losses


def trained_model(config: LabConfig, encoding: str, seed: int, out: str | Path) -> LabModel:
    """The model :func:`run` trained for ``encoding`` and ``seed`` into ``out``, on the CPU.

    Raises:
        ValueError: ``run(config, out)`` has not finished that training.
    """
    path = Path(out) / "runs" / f"{config.training_key(encoding, seed)}.pt"
    if not path.exists():
        raise ValueError(f"no trained model of {encoding!r}, seed {seed} in {str(out)!r}: "
                         "run(config, out) trains it")  # fmt: skip
    torch.manual_seed(seed)
    model = LabModel(config.model, encoding)
    model.load_state_dict(torch.load(path, map_location="cpu", weights_only=False)["model"])
    return model


# ------------------------------------------------------------------ evaluation


def text_lengths(config: LabConfig) -> list[int]:
    """The window lengths the text task is measured at: quarters of the training length."""
    step = max(1, config.train_len // 4)
    lengths = list(range(step, config.test_len + 1, step))
    return lengths if lengths[-1] == config.test_len else [*lengths, config.test_len]


def scored_logits(
    model: LabModel,
    batch: T.Batch,
    *,
    scaling: dict[str, Any] | None = None,
    positions: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits and targets of a batch's scored span (what the whole pass would score).

    Args:
        model: the lab model (on its device; the batch is moved there).
        batch: tokens and targets; :attr:`~posenc.lab.tasks.Batch.scored` is computed.
        scaling: the ``rope_scaling`` the pass applies (a RoPE model's), or None.
        positions: the generator of randomized positions, or None.
    """
    device = next(model.parameters()).device
    start, stop = batch.scored
    logits = model(
        batch.tokens.to(device), scaling=scaling, generator=positions, span=(start, stop),
        significance=None if batch.significance is None else batch.significance.to(device),
    )  # fmt: skip
    return logits, batch.targets[:, start:stop].to(device)


def perplexity(logits: torch.Tensor, targets: torch.Tensor) -> float:
    """``exp`` of the mean cross-entropy over the targets that are not ``IGNORE``."""
    loss = nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=T.IGNORE
    )
    return math.exp(loss)


def exact_match(logits: torch.Tensor, targets: torch.Tensor) -> float:
    """The share of rows whose every scored target is the argmax (greedy decoding's answer)."""
    right = (logits.argmax(-1) == targets) | (targets == T.IGNORE)
    return right.all(dim=1).float().mean().item()


@torch.no_grad()
def evaluate(
    model: LabModel, config: LabConfig, encoding: str, seed: int, corpus: Any = None
) -> list[Record]:
    """Exact-match accuracy at every length ``1 .. test_len`` (tasks), perplexity (text).

    Exact match under teacher forcing: every scored token is the model's argmax,
    which is what greedy decoding produces when all earlier answer tokens are
    right. Test-time scaling variants evaluate with their schedule beyond the
    trained length; ``randomized`` with positions drawn from a seeded generator.
    """
    model.eval()
    spec = lookup(encoding)
    trained = T.sequence_length(config.task, config.train_len)
    records: list[Record] = []
    positions = torch.Generator().manual_seed(99_991 + seed)

    def scored(batch: T.Batch, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        scaling = spec.scaling(length, trained, rotary_dim=model.config.head_dim)
        return scored_logits(model, batch, scaling=scaling, positions=positions)

    if config.task == "text":
        for length in text_lengths(config):
            logits, targets = scored(corpus.windows("test", length, config.eval_examples), length)
            value = perplexity(logits, targets)
            records.append(Record("text", encoding, seed, length, "perplexity", value))
        return records
    for n in T.lengths(config.task, config.test_len):
        gen = torch.Generator().manual_seed(424_243 + n)
        batch = T.make_batch(config.task, n, config.eval_examples, gen)
        acc = exact_match(*scored(batch, T.sequence_length(config.task, n)))
        records.append(Record(config.task, encoding, seed, n, "accuracy", acc))
    return records


# ------------------------------------------------------------------ the whole run


def usable_cpus() -> int:
    """The CPUs this process may run on: ``posenc lab run``'s default number of workers."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


def _worker_count(workers: int | None, world: _World, trainings: int) -> int:
    """Processes that train at once: 1 under torchrun or on a GPU, else one per CPU by default."""
    if workers is not None:
        workers = checks.check_int(workers, "workers", minimum=1)
    if world.size > 1 or world.device.type != "cpu" or trainings <= 1:
        return 1
    return min(trainings, workers if workers is not None else usable_cpus())


@dataclass(frozen=True)
class _Training:
    """One trained model's work: train (or load) it, evaluate ``jobs``, probe it if ``probe``."""

    first: tuple[str, int]  # an (encoding, seed) of the model: what trains and names it
    jobs: tuple[tuple[str, int], ...]  # the evaluations not cached (rope and its scalings)
    probe: bool  # its probes are not cached


@dataclass
class _Done:
    """What one training, its evaluations and its probes produced."""

    key: str  # the training's
    records: dict[tuple[str, int], list[Record]]
    losses: list[float]
    fresh: bool
    measured: dict[str, Any] | None = None  # the probe file's content, when probed


def _measure(model: LabModel, config: LabConfig, seed: int, corpus: Any) -> dict[str, Any]:
    """The probe file of a trained model: its probes and its attention-bias parameters."""
    probes = probe_model(model, config, seed, corpus)
    return {"probes": [asdict(p) for p in probes], "bias_parameters": bias_parameters(model)}


def _train_and_evaluate(
    config: LabConfig,
    training: _Training,
    *,
    directory: Path,
    world: _World,
    corpus: Any,
    on_step: Callable[[int], None] | None,
    on_evaluate: Callable[[], None] | None,
) -> _Done:
    """Train the model of ``training`` (one seed, one training key), evaluate each of its
    jobs, then probe it where asked."""
    encoding, seed = training.first
    key = config.training_key(encoding, seed)
    fresh = not (directory / f"{key}.pt").exists()
    model, losses = train(
        config, encoding, seed, directory=directory, world=world, corpus=corpus, on_step=on_step
    )
    if on_evaluate is not None:
        on_evaluate()
    done = _Done(key, {}, losses, fresh)
    for job in training.jobs:
        records = evaluate(model, config, *job, corpus)
        if world.main:
            path = directory / f"{config.eval_key(*job)}.json"
            _save([asdict(r) for r in records], path)
        done.records[job] = records
    if training.probe:
        done.measured = _measure(model, config, seed, corpus)
        if world.main:
            _save(done.measured, directory / f"{config.probe_key(encoding, seed)}.json")
    return done


# a worker process's progress channel
_PROGRESS: Any = None


def _start_worker(threads: int, progress: Any) -> None:
    global _PROGRESS
    # one thread per worker: the lab's matrices are small enough that a second thread
    # on the same op gains little, and OpenMP teams of several processes sharing the
    # cores wait on each other at every op, while separate trainings share nothing
    torch.set_num_threads(threads)
    _PROGRESS = progress


def _worker_job(
    config: LabConfig, training: _Training, directory: Path, until: int
) -> _Done | None:
    """``_train_and_evaluate`` in a worker process, reporting progress on its channel.

    A piece that ends before ``config.steps`` trains up to ``until`` and stops at a
    checkpoint (None); the last piece finishes the training and evaluates.
    """
    corpus = text_corpus(config)
    tag = training.first

    def on_step(done: int) -> None:
        # every 10th step: the bar moves smoothly and the channel stays quiet
        if _PROGRESS is not None and (done % 10 == 0 or done == config.steps):
            _PROGRESS.put((tag, done))

    def on_evaluate() -> None:
        if _PROGRESS is not None:
            _PROGRESS.put((tag, -1))

    if until < config.steps:
        encoding, seed = training.first
        train(
            config, encoding, seed, directory=directory, world=_World(), corpus=corpus,
            on_step=on_step, until=until,
        )  # fmt: skip
        return None
    return _train_and_evaluate(
        config, training, directory=directory, world=_World(), corpus=corpus,
        on_step=on_step, on_evaluate=on_evaluate,
    )  # fmt: skip


def _in_workers(
    config: LabConfig,
    trainings: list[_Training],
    directory: Path,
    workers: int,
    bar: _Bar,
) -> list[_Done]:
    """Every training in a pool of ``workers`` spawned processes, in the order given.

    Each training runs as ``workers`` pieces of its steps, handed from one to the
    next at a checkpoint (so the same updates as in one go). A piece is queued
    when the one before it ends, behind every piece queued earlier: all the
    trainings' first pieces run first, and the queue drains evenly to the end
    instead of leaving workers idle while the last trainings run alone (15
    trainings on 2 workers would otherwise end with one training on one worker).
    """
    import multiprocessing
    import queue
    from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait

    # spawn, not fork: a process forked after torch's OpenMP team ran cannot use it
    context = multiprocessing.get_context("spawn")
    channel = context.Queue()
    threads = max(1, torch.get_num_threads() // workers)
    cuts = sorted({config.steps * (k + 1) // workers for k in range(workers)} - {0})
    results: dict[int, _Done] = {}
    pieces: dict[Future[_Done | None], tuple[int, int]] = {}
    with ProcessPoolExecutor(
        workers, mp_context=context, initializer=_start_worker, initargs=(threads, channel)
    ) as pool:

        def submit(i: int, piece: int) -> None:
            future = pool.submit(_worker_job, config, trainings[i], directory, cuts[piece])
            pieces[future] = (i, piece)

        for i, training in enumerate(trainings):
            trained = (directory / f"{config.training_key(*training.first)}.pt").exists()
            # a trained model is only evaluated and probed
            submit(i, len(cuts) - 1 if trained else 0)
            bar.queued(training.first)
        try:
            while pieces:
                finished, _ = wait(pieces, timeout=0.2, return_when=FIRST_COMPLETED)
                while True:
                    try:
                        tag, done = channel.get_nowait()
                    except queue.Empty:
                        break
                    if done < 0:
                        bar.evaluating(*tag)
                    else:
                        bar.update(tag, done)
                for future in finished:
                    i, piece = pieces.pop(future)
                    outcome = future.result()
                    if outcome is None:
                        submit(i, piece + 1)
                    else:
                        results[i] = outcome
                        bar.finished(trainings[i].first, len(trainings[i].jobs))
        except BaseException:
            for future in pieces:
                future.cancel()
            raise
    return [results[i] for i in range(len(trainings))]


def run(
    config: LabConfig,
    out: str | Path,
    *,
    progress: bool = True,
    workers: int | None = 1,
    context_parallel: int = 1,
    device: Any = None,
    probe: bool = True,
) -> Outcome:
    """Train, evaluate and probe every (encoding, seed) of ``config``; write ``out/results.json``.

    Finished trainings, evaluations and probes are read back from ``out/runs``
    instead of recomputed. Returns every record of the requested encodings and
    seeds, and every trained model's probes and attention-bias parameters
    (probed once per trained model: ``rope-linear`` is ``rope``'s model).

    ``results.json`` holds ``{"config": LabConfig fields, "records": [Record
    fields], "probes": [Probe fields], "bias_parameters": [{"encoding", "seed",
    "parameters"}]}``; :func:`posenc.lab.results.read` reads it back.

    Trainings are independent: on a CPU, ``workers`` processes train at once
    (``None``: one per usable CPU, what ``posenc lab run`` does), each on its share
    of torch's threads, longest first, each training in ``workers`` pieces handed
    over at a checkpoint so that no worker idles while the last ones finish (the
    updates are those of one go). Under torchrun, or with ``workers=1`` (the default here),
    they run one after another in this process. Workers are spawned, so a script
    calling this with more than one must do so under ``if __name__ ==
    "__main__":`` (as :mod:`multiprocessing` requires).

    Under torchrun, ``context_parallel`` processes share each sequence (the module
    docstring's mesh; 1: plain DDP); the models are those of one process, up to the
    order of float32 sums.

    ``device``: ``"cuda"`` or ``"cpu"``; by default CUDA where a GPU exists (one
    training at a time there, each process on its ``LOCAL_RANK``'s GPU under
    torchrun, over nccl), else the CPU.

    ``probe=False`` probes no model (``posenc lab suite`` reads accuracies only):
    the outcome and ``results.json`` hold the probes already on disk, if any.

    Raises:
        ValueError: an output directory that cannot be written; ``workers`` < 1;
            ``context_parallel`` < 1 or not dividing the number of processes;
            a batch that does not split over the data-parallel ranks; a ``device``
            that is not CPU or CUDA, or CUDA where none exists; for the text task, a
            ``data`` that cannot be read or is too short for the lengths
            (:func:`text_corpus`), or a corpus that differs between processes.

    Examples:
        A tiny run: one encoding, one seed, a few steps of a one-layer model.

        >>> import os, tempfile
        >>> import posenc.lab
        >>> config = posenc.lab.LabConfig(encodings=("rope",), seeds=1, steps=3, train_len=4,
        ...     test_len=8, batch_size=8, d_model=16, layers=1, heads=2, eval_examples=4)
        >>> with tempfile.TemporaryDirectory() as out:
        ...     outcome = posenc.lab.run(config, out, progress=False, probe=False)
        ...     written = sorted(os.listdir(out))
        >>> written, len(outcome.trained)
        (['results.json', 'runs'], 1)
        >>> sorted({(r.encoding, r.metric) for r in outcome.records})
        [('rope', 'accuracy')]
        >>> [r.length for r in outcome.records]  # evaluated at every length up to test_len
        [1, 2, 3, 4, 5, 6, 7, 8]
    """
    world = _world(context_parallel, device)
    if config.batch_size % world.dp_size:
        raise ValueError(
            f"batch_size ({config.batch_size}) must split evenly over {world.dp_size} "
            f"data-parallel ranks ({world.size} processes / context_parallel {world.cp})"
        )
    corpus = text_corpus(config)
    if corpus is not None and not _same_on_every_rank(corpus.digest, world):
        raise ValueError(
            "the text corpus differs between processes: every rank must read the same "
            f"bytes (data {config.data!r}, text_bytes {config.text_bytes})"
        )
    out = Path(out)
    directory = out / "runs"
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"cannot write to {str(out)!r}: {exc.strerror}") from None
    outcome = Outcome([])
    jobs = [(e, s) for s in range(config.seeds) for e in config.encodings]
    todo = [(e, s) for e, s in jobs if not (directory / f"{config.eval_key(e, s)}.json").exists()]
    # one trained model per training key (rope and its test-time scalings share one),
    # named by its first job; its evaluations to compute, and whether to probe it
    models: dict[str, tuple[str, int]] = {}
    for e, s in jobs:
        models.setdefault(config.training_key(e, s), (e, s))
    evaluations: dict[str, list[tuple[str, int]]] = {}
    for e, s in todo:
        evaluations.setdefault(config.training_key(e, s), []).append((e, s))
    unprobed = {
        key for key, first in models.items()
        if probe and not (directory / f"{config.probe_key(*first)}.json").exists()
    }  # fmt: skip
    # longest first (a training evaluates each job sharing it: rope and its scalings take
    # several), so the trainings that start last, while others finish, are the shortest
    trainings = sorted(
        (
            _Training(first, tuple(evaluations.get(key, ())), key in unprobed)
            for key, first in models.items()
            if key in evaluations or key in unprobed
        ),
        key=lambda training: len(training.jobs),
        reverse=True,
    )
    count = _worker_count(workers, world, len(trainings))
    _barrier(world)  # every rank decided before any rank writes
    bar = _Bar(config, todo, enabled=progress and world.main)
    with bar:
        if count > 1:
            results = _in_workers(config, trainings, directory, count, bar)
        else:
            results = []
            for training in trainings:
                bar.queued(training.first)
                done = _train_and_evaluate(
                    config, training, directory=directory, world=world, corpus=corpus,
                    on_step=bar.step(training.first),
                    on_evaluate=functools.partial(bar.evaluating, *training.first),
                )  # fmt: skip
                results.append(done)
                bar.finished(training.first, len(training.jobs))
    found: dict[tuple[str, int], list[Record]] = {}
    measured: dict[str, dict[str, Any]] = {}
    for training, done in zip(trainings, results, strict=True):
        found.update(done.records)
        if done.fresh:
            outcome.trained.append(done.key)
        if done.measured is not None:
            measured[done.key] = done.measured
            outcome.probed.append(config.probe_key(*training.first))
        for encoding, seed in training.jobs:
            outcome.losses[f"{encoding}/{seed}"] = done.losses
    for encoding, seed in jobs:
        if (encoding, seed) in found:
            outcome.records += found[encoding, seed]
            continue
        path = directory / f"{config.eval_key(encoding, seed)}.json"
        outcome.reused.append(path.stem)
        outcome.records += [Record(**r) for r in json.loads(path.read_text())]
    for key, (encoding, seed) in models.items():
        if key not in measured:
            path = directory / f"{config.probe_key(encoding, seed)}.json"
            if not probe and not path.exists():
                continue  # never probed, and not asked to
            measured[key] = json.loads(path.read_text())
        outcome.probes += [Probe(**p) for p in measured[key]["probes"]]
        if measured[key]["bias_parameters"] is not None:
            outcome.bias_parameters.append({
                "encoding": training_encoding(encoding), "seed": seed,
                "parameters": measured[key]["bias_parameters"],
            })  # fmt: skip
    if world.main:
        _save(
            {
                "config": asdict(config),
                "records": [asdict(r) for r in outcome.records],
                "probes": [asdict(p) for p in outcome.probes],
                "bias_parameters": outcome.bias_parameters,
            },
            out / "results.json",
        )
    _barrier(world)
    return outcome


class _Bar:
    """Rich progress: one bar per training (steps, then evaluation) and one for the whole lab."""

    def __init__(self, config: LabConfig, todo: Sequence[tuple[str, int]], enabled: bool) -> None:
        self.config, self.enabled = config, enabled
        self.total = len(todo)
        self.progress: Any = None
        self.tasks: dict[tuple[str, int], Any] = {}

    def __enter__(self) -> _Bar:
        if self.enabled and self.total:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )  # fmt: skip

            self.progress = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("eta"), TimeRemainingColumn(), TimeElapsedColumn(),
            )  # fmt: skip
            self.progress.start()
            self.lab = self.progress.add_task(f"lab {self.config.task}", total=self.total)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()

    def queued(self, job: tuple[str, int]) -> None:
        if self.progress is not None:
            encoding, seed = job
            self.tasks[job] = self.progress.add_task(
                f"  {training_encoding(encoding)} seed {seed}", total=self.config.steps
            )  # fmt: skip

    def update(self, job: tuple[str, int], done: int) -> None:
        if self.progress is not None and job in self.tasks:
            self.progress.update(self.tasks[job], completed=done)

    def step(self, job: tuple[str, int]) -> Callable[[int], None]:
        return lambda done: self.update(job, done)

    def evaluating(self, encoding: str, seed: int) -> None:
        job = (encoding, seed)
        if self.progress is not None and job in self.tasks:
            self.progress.update(
                self.tasks[job], description=f"  {training_encoding(encoding)} seed {seed} (eval)"
            )  # fmt: skip

    def finished(self, job: tuple[str, int], evaluations: int) -> None:
        if self.progress is not None:
            if job in self.tasks:
                self.progress.remove_task(self.tasks.pop(job))
            self.progress.advance(self.lab, evaluations)


def defaults_for(task: str) -> dict[str, Any]:
    """Per-task defaults of the command: lengths and training that fit this 2-core machine."""
    if task == "text":
        return {"train_len": 64, "test_len": 320, "steps": 1200, "batch_size": 32,
                "d_model": 96, "layers": 2, "heads": 4, "eval_examples": 16,
                "encodings": ("alibi", "sinusoidal", "rope")}  # fmt: skip
    return {}


def config_from(task: str, **options: Any) -> LabConfig:
    """A :class:`LabConfig` from the task's defaults overridden by ``options`` (None = default)."""
    merged = {**defaults_for(task), **{k: v for k, v in options.items() if v is not None}}
    return replace(LabConfig(task=task), **merged) if merged else LabConfig(task=task)
