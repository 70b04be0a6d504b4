"""The compiled loop's side of the softmax engine: its operands, forward and backward.

``posenc.core`` compiles a flash-attention loop for float32 on the CPU
(``core/csrc/attend.c``: ``attend`` and ``attend_backward``). It reads a call's
terms as three kinds of operand (:data:`posenc.families.terms.OPERANDS`), never
as the modules that made them:

- ``"table"``: a ``(heads, q_len + k_len - 1)`` table over ``key - query``; tables
  of several terms are summed into the one the loop reads, and each gets the
  table's gradient (the score gradient summed per head along each diagonal);
- ``"pieces"``: a scaled form's table, scale, knots (at most 63), slopes and
  intercepts, evaluated per score by a binary search over the knots; its
  gradients reach all four;
- ``"gate"``: ``c`` ``(batch, heads, k_len)``, a score gaining ``c[query] -
  c[key]``; its gradient is each position's row sum of the score gradient as a
  query minus its column sum as a key.

A call whose terms the loop cannot read (a term evaluated per block, two scaled
forms, a table beside a scaled form, two gates) takes the blockwise path: both
functions here then return None.

A term that reads the scores themselves (its form has ``read``) has a loop of its
own where its operand kind has one: :data:`READERS` maps the kind (``"counted"``,
``"mlp"``) to a :class:`Reader`, the module that calls that loop. :func:`reads`
says whether a call's reader will run both passes; :func:`forward` and
:func:`backward` then hand the call to it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import torch

from posenc.core.kernels import compiled, threads_for
from posenc.integration.attention.layout import Plan, loop_documents, loop_keys

#: The compiled loops keep a scaled form's knots in four vectors of 16, one a +inf pad.
MAX_KNOTS = 63


@dataclass(frozen=True)
class Operands:
    """The terms, key mask and documents as both compiled loops read them."""

    table: torch.Tensor | None  # (heads, n) or, pieces, (n,): reversed
    mask: torch.Tensor | None  # (batch, k_len) uint8
    pieces: tuple[torch.Tensor, ...] = ()  # scale, knots (64), slopes, intercepts
    levels: int = 0  # pieces: binary search steps over the knots
    docs: tuple[torch.Tensor, torch.Tensor] | None = None  # int32 (batch, q_len), (batch, k_len)
    gate: torch.Tensor | None = None  # c (batch, heads, k_len), contiguous
    tables: tuple[int, ...] = ()  # the indices (in the call's tensors) of the summed tables
    scaled: tuple[int, ...] = ()  # the indices of the pieces' table, scale, slopes, intercepts
    gate_at: int = -1  # the index of c, or -1

    def documents(self) -> tuple[int, int] | None:
        """The documents' argument: the addresses of the queries' and keys', or None."""
        return None if self.docs is None else (self.docs[0].data_ptr(), self.docs[1].data_ptr())

    def form(self, grads: Sequence[torch.Tensor] | None = None) -> tuple[int, ...] | None:
        """The scaled form's argument, or None; for the backward (``grads`` given) with
        the addresses of the scale's, slopes' and intercepts' gradients (0s: none)."""
        if not self.pieces:
            return None
        out = (*(t.data_ptr() for t in self.pieces), self.levels)
        if grads is None:
            return out
        return (*out, *(g.data_ptr() for g in grads)) if grads else (*out, 0, 0, 0)


class Reader(Protocol):
    """The compiled loop of an operand kind that reads the scores, as a module gives it."""

    def ready(
        self, plan: Plan, tensors: Sequence[torch.Tensor], q: torch.Tensor, k: torch.Tensor,
        v: torch.Tensor,
    ) -> bool:  # fmt: skip
        """Whether both passes will run for these float32 CPU inputs (AVX-512 checked)."""

    def forward(
        self, plan: Plan, tensors: Sequence[torch.Tensor], q: torch.Tensor, k: torch.Tensor,
        v: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:  # fmt: skip
        """The output and log-sum-exp, as :func:`forward` returns them; None where the
        loop declined (:func:`forward` then raises)."""

    def backward(
        self, plan: Plan, tensors: Sequence[torch.Tensor], wanted: Sequence[bool],
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lse: torch.Tensor,
        dout: torch.Tensor, delta: torch.Tensor,
    ) -> tuple[torch.Tensor | None, ...] | None:  # fmt: skip
        """The gradients, as :func:`backward` returns them; None where the loop declined."""


#: The loops of the operand kinds that read the scores, by kind.
READERS: dict[str, Reader] = {}


def reader(plan: Plan) -> Reader | None:
    """The loop of the call's one term that reads the scores, or None (none, two, or a
    kind without a loop)."""
    reading = [f for f in plan.forms if f.read is not None]
    if len(reading) != 1 or plan.choose is not None or reading[0].operand is None:
        return None
    return READERS.get(reading[0].operand)


def reads(
    plan: Plan, tensors: Sequence[torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> bool:
    """Whether a call with a term that reads the scores runs compiled, forward and backward:
    a reader, float32 CPU inputs on a CPU with AVX-512 (as torch sees it: asking the
    loop itself would hand it fake tensors' addresses under ``torch.compile``'s
    tracing), and the reader's own ``ready``."""
    loop = reader(plan)
    if loop is None or compiled is None or q.device.type != "cpu" or q.dtype != torch.float32:
        return False
    if not torch.backends.cpu.get_cpu_capability().startswith("AVX512"):
        return False
    return loop.ready(plan, tensors, q, k, v)


def _address(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


def operands(
    plan: Plan, tensors: Sequence[torch.Tensor], batch: int, q_len: int
) -> Operands | None:
    """The call's terms, mask and documents as the loops read them; None where they cannot."""
    if plan.choose is not None:
        return None  # the loops score one query per pair
    tables: list[int] = []
    scaled: list[int] = []
    gate_at, knots, start = -1, None, 0
    for form, size in zip(plan.forms, plan.sizes, strict=True):
        if form.read is not None or (form.block is not None and form.operand is None):
            return None
        if form.operand == "table":
            tables.append(start)
        elif form.operand == "pieces":
            if scaled or form.knots is None or form.knots.numel() > MAX_KNOTS:
                return None
            scaled, knots = list(range(start, start + 4)), form.knots
        elif form.operand == "gate":
            if gate_at >= 0:
                return None
            gate_at = start
        start += size
    if scaled and tables:
        return None
    mask = loop_keys(plan.mask.key_mask)
    docs = loop_documents(plan.mask.docs, batch, plan.mask.offset, q_len)
    gate = None if gate_at < 0 else tensors[gate_at].detach().float().contiguous()
    plain = Operands(None, mask, docs=docs, gate=gate, gate_at=gate_at)
    if tables:
        total = sum(tensors[i].detach().float() for i in tables)
        assert isinstance(total, torch.Tensor)
        # reversed, so that a row of keys reads it forwards
        return replace(plain, table=total.flip(-1).contiguous(), tables=tuple(tables))
    if not scaled:
        return plain
    assert knots is not None
    n = knots.numel()
    padded = torch.full((MAX_KNOTS + 1,), math.inf)
    padded[:n] = knots.float()
    table, scale, slopes, intercepts = (tensors[i].detach().float() for i in scaled)
    slopes, intercepts = (
        torch.nn.functional.pad(t, (0, MAX_KNOTS - n)).contiguous() for t in (slopes, intercepts)
    )
    pieces = (scale.contiguous(), padded, slopes, intercepts)
    table = table.flip(-1).contiguous()
    return replace(plain, table=table, pieces=pieces, levels=n.bit_length(), scaled=tuple(scaled))


def forward(
    plan: Plan, tensors: Sequence[torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The compiled forward's output and log-sum-exp, or None where it does not apply."""
    loop = reader(plan)
    if loop is not None:
        # kernel.reads admitted the call: no other path has this term's forward
        done = loop.forward(plan, tensors, q, k, v)
        if done is None:
            raise RuntimeError("the loop of a term that reads the scores declined the call")
        return done
    if compiled is None or not hasattr(compiled, "attend") or q.device.type != "cpu":
        return None
    if q.dtype != torch.float32 or q.shape[0] * q.shape[1] * v.shape[-1] == 0:
        return None  # an empty result: nothing to loop over
    if any(t.stride(-1) != 1 for t in (q, k, v)):
        return None
    b, h, lq, _ = q.shape
    ops = operands(plan, tensors, b, lq)
    if ops is None:
        return None
    hk, lk, dv = k.shape[1], k.shape[2], v.shape[-1]
    out = torch.empty((b, h, lq, dv), dtype=torch.float32)
    lse = torch.empty((b, h, lq), dtype=torch.float32)
    threads = threads_for(b * h * ((lq + 63) // 64))
    extra = () if ops.gate is None else (ops.gate.data_ptr(),)  # an argument only with a gate
    done = compiled.attend(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(),
        _address(ops.table), _address(ops.mask),
        [b, h, hk, lq, lk, q.shape[-1], dv],
        list(q.stride()[:3]), list(k.stride()[:3]), list(v.stride()[:3]),
        plan.mask.causal, plan.scale, threads, ops.form(), plan.mask.offset, ops.documents(),
        *extra,
    )  # fmt: skip
    return (out, lse) if done else None


def backward(
    plan: Plan,
    tensors: Sequence[torch.Tensor],
    wanted: Sequence[bool],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lse: torch.Tensor,
    dout: torch.Tensor,
    delta: torch.Tensor,
) -> tuple[torch.Tensor | None, ...] | None:
    """The compiled backward of a compiled forward: dq, dk, dv and each tracked tensor's
    gradient (None where not ``wanted``); None where it has no loop."""
    loop = reader(plan)
    if loop is not None:
        found = loop.backward(plan, tensors, wanted, q, k, v, lse, dout, delta)
        if found is None:
            raise RuntimeError("the loop of a term that reads the scores declined the backward")
        return found
    if compiled is None or not hasattr(compiled, "attend_backward"):
        return None
    b, h, lq, d = q.shape
    hk, lk, dv_dim = k.shape[1], k.shape[2], v.shape[-1]
    ops = operands(plan, tensors, b, lq)  # as the forward read them
    if ops is None:
        return None
    biased = [*ops.tables, *ops.scaled]
    dtable = None
    if ops.table is not None and any(wanted[i] for i in biased):
        dtable = torch.zeros_like(ops.table)
    dpieces: list[torch.Tensor] = []  # the scale's, slopes' and intercepts': all or none
    if ops.pieces and dtable is not None:
        scale, _, slopes, intercepts = ops.pieces
        dpieces = [torch.zeros_like(t) for t in (scale, slopes, intercepts)]
    dq = torch.zeros((b, h, lq, d), dtype=torch.float32)
    dk = torch.empty((b, hk, lk, d), dtype=torch.float32)
    dv = torch.empty((b, hk, lk, dv_dim), dtype=torch.float32)
    # the loop indexes lse, dout and delta as C-contiguous (ring attention passes rows)
    lse, dout, delta = lse.contiguous(), dout.contiguous(), delta.contiguous()
    threads = threads_for(b * hk * ((lk + 63) // 64))
    extra: tuple[tuple[int, int, int], ...] = ()
    if ops.gate is not None:  # c, and the row sums (per query) and column sums (per key) of dS
        rows, cols = torch.zeros((b, h, lq)), torch.zeros((b, h, lk))
        extra = ((ops.gate.data_ptr(), rows.data_ptr(), cols.data_ptr()),)
    done = compiled.attend_backward(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), lse.data_ptr(), dout.data_ptr(),
        delta.data_ptr(), _address(ops.table), _address(ops.mask),
        dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), _address(dtable),
        [b, h, hk, lq, lk, d, dv_dim],
        list(q.stride()[:3]), list(k.stride()[:3]), list(v.stride()[:3]),
        plan.mask.causal, plan.scale, threads, ops.form(dpieces), plan.mask.offset,
        ops.documents(), *extra,
    )  # fmt: skip
    if not done:
        return None
    grads: list[torch.Tensor | None] = [None] * len(tensors)
    if extra and wanted[ops.gate_at]:
        cols.neg_()[:, :, plan.mask.offset :] += rows
        grads[ops.gate_at] = cols
    if dtable is not None:
        for i in ops.tables:
            grads[i] = dtable.flip(-1)
        if ops.scaled:
            table_at, scale_at, slopes_at, intercepts_at = ops.scaled
            pieces = int(tensors[slopes_at].shape[1])
            grads[table_at] = dtable.flip(-1)
            if dpieces:
                grads[scale_at] = dpieces[0]
                grads[slopes_at] = dpieces[1][:, :pieces]
                grads[intercepts_at] = dpieces[2][:, :pieces]
    return (dq, dk, dv, *(g if w else None for g, w in zip(grads, wanted, strict=True)))
