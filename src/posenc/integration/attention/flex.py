"""FlexAttention: the softmax engine's compiled path for GPUs.

``torch.nn.attention.flex_attention`` with one score mod, ``score * scale`` plus
every term's FlexAttention form (:attr:`posenc.families.terms.TermForm.flex`), and
a block mask of the causal mask, key padding and documents. Block masks are made
once per shapes and masks and reused across calls and layers (:data:`BLOCK_MASKS`),
and a call at shapes already seen compiles nothing (a decode step neither, once
torch has made the key length dynamic); float16/bfloat16 inputs go in as they are.
On this CPU compiled flex measured 6x slower than SDPA and has no backward, so
``"auto"`` takes the compiled loop (or blockwise) there.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import torch

from posenc.integration.attention.layout import Mask, Plan

ScoreMod = Callable[[Any, Any, Any, Any, Any], Any]
MaskMod = Callable[[Any, Any, Any, Any], Any]


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: Plan, tensors: Sequence[torch.Tensor]
) -> torch.Tensor:
    """Compiled FlexAttention of prepared inputs, in their own dtype.

    Every number the score and mask mods read (offset, scale, table base) is a
    0-d tensor on the device: compiled code guards on captured Python numbers,
    recompiling for each new value (a float at every one; an int at its first
    change), while a tensor is an input whose value it does not guard on.

    Raises:
        ValueError: a term without a FlexAttention form; several query variants
            (FlexAttention scores one query per pair).
    """
    from torch.nn.attention.flex_attention import flex_attention

    if plan.choose is not None:
        raise ValueError(
            f"backend='flex' scores one query per pair; this rotation gives {plan.variants} query "
            "variants (use backend='auto' or 'blockwise')"
        )

    b, h, lq, _ = q.shape
    lk = k.shape[2]
    compiling = torch.compiler.is_compiling()
    adds = []
    for n, (form, own) in enumerate(zip(plan.forms, plan.split(tensors), strict=True)):
        if form.block is None and form.read is None:
            continue
        if form.flex is None:
            raise ValueError(
                f"backend='flex' needs every term's FlexAttention form; term {n} has none "
                "(use backend='auto' or 'blockwise')"
            )
        adds.append(form.flex(own))
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    scale = torch.full((), plan.scale, dtype=dtype, device=q.device)

    def score_mod(score: Any, bi: Any, hi: Any, qi: Any, ki: Any) -> Any:
        out = score * scale
        for add in adds:
            out = out + add(bi, hi, qi, ki)
        return out

    block_mask = _block_mask(plan.mask, b, lq, lk, q.device, compiling)
    run = flex_attention if compiling else compiled(flex_attention)
    # scale=1.0: the score mod applies the scale, a tensor (flex's scale is a float)
    out: torch.Tensor = run(
        q, k, v, score_mod=score_mod, block_mask=block_mask, scale=1.0,
        enable_gqa=h != k.shape[1],
    )  # fmt: skip
    return out


def _mask_mod(
    causal: bool, offset: torch.Tensor, key_mask: torch.Tensor | None, docs: torch.Tensor | None
) -> MaskMod:
    """FlexAttention's mask mod; ``offset`` (0-d) is query 0's key position and
    ``docs`` each key's document, ``(k_len,)`` for every row or ``(batch, k_len)``."""

    def mask_mod(bi: Any, hi: Any, qi: Any, ki: Any) -> Any:
        at = qi + offset
        keep = ki <= at if causal else ki >= 0
        if key_mask is not None:
            keep = keep & key_mask[bi, ki]
        if docs is not None:
            same = docs[ki] == docs[at] if docs.ndim == 1 else docs[bi, ki] == docs[bi, at]
            keep = keep & same
        return keep

    return mask_mod


def _block_mask(mask: Mask, b: int, lq: int, lk: int, device: torch.device, compiling: bool) -> Any:
    """The block mask of the causal mask, key padding and documents (None without any):
    made once per everything it depends on and reused (:data:`BLOCK_MASKS`)."""
    from torch.nn.attention.flex_attention import create_block_mask

    key_mask, docs = mask.key_mask, mask.docs
    if not (mask.causal or key_mask is not None or docs is not None):
        return None
    if docs is not None and docs.shape[0] == 1:
        docs = docs[0]  # the same documents in every row: a mask for the whole batch
    batch = b if key_mask is not None or (docs is not None and docs.ndim == 2) else None

    def build(key_mask: torch.Tensor | None, docs: torch.Tensor | None) -> Any:
        offset = torch.full((), mask.offset, device=device)
        mask_mod = _mask_mod(mask.causal, offset, key_mask, docs)
        # eager create_block_mask materialises the dense (B, H, q_len, k_len) mask
        # first; compiled, it evaluates mask_mod block by block
        make = create_block_mask if compiling else compiled(create_block_mask)
        return make(mask_mod, batch, None, lq, lk, device=device)

    if compiling:  # traced into the caller's graph, which holds it
        return build(key_mask, docs)
    key = (device, batch, lq, lk, mask.causal, mask.offset, _layout(key_mask), _layout(docs))
    return BLOCK_MASKS.get(key, (key_mask, docs), build)


def _layout(t: torch.Tensor | None) -> tuple[Any, ...] | None:
    return None if t is None else (tuple(t.shape), t.dtype)


class BlockMasks:
    """FlexAttention block masks by what they depend on: a bounded LRU, thread-safe.

    A key holds the device, the batch (None: one mask for every row), the
    lengths, ``causal`` and the offset, and the shape and dtype of the key
    padding mask and of the documents. Those two are tensors, so a hit also
    compares them whole with the clones its entry keeps (``torch.equal``): a
    tensor's address is reused by a new tensor once it is freed, and its version
    counter misses writes through ``.data``, numpy or other libraries' kernels
    (and inference tensors have none), while the comparison is sound at the cost
    of reading ``(batch, k_len)`` values (on CUDA, a wait for the device:
    ``torch.equal`` returns a Python bool). The entry's mask mod reads the
    clones, so a caller's later in-place change alters no cached mask. A
    mismatch replaces the entry: one mask per key.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[Any, ...], tuple[tuple[Any, ...], Any]] = OrderedDict()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def clear(self) -> None:
        """Forget every cached block mask."""
        with self._lock:
            self._entries.clear()

    def get(
        self,
        key: tuple[Any, ...],
        tensors: tuple[torch.Tensor | None, ...],
        build: Callable[..., Any],
    ) -> Any:
        """The mask of ``key`` and ``tensors``; on a miss ``build(*clones of tensors)``."""
        with self._lock:
            entry = self._entries.get(key)
        # compared outside the lock: on CUDA torch.equal waits for the device
        if entry is not None and all(
            a is None if b is None else a is not None and torch.equal(a, b)
            for a, b in zip(entry[0], tensors, strict=True)
        ):
            with self._lock:
                if key in self._entries:
                    self._entries.move_to_end(key)
            return entry[1]
        clones = tuple(None if t is None else t.detach().clone() for t in tensors)
        mask = build(*clones)  # outside the lock: a first build compiles (seconds)
        with self._lock:
            self._entries[key] = (clones, mask)
            self._entries.move_to_end(key)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
        return mask


#: a few dozen: every layer of a model shares one mask; a decode loop makes one per step
BLOCK_MASKS = BlockMasks(32)

_COMPILED: dict[Any, Any] = {}


def compiled(fn: Any) -> Any:
    """``torch.compile(fn)``, made once per process (FlexAttention runs compiled only)."""
    made = _COMPILED.get(fn)
    if made is None:  # two threads may both wrap it; setdefault keeps the first wrapper
        made = _COMPILED.setdefault(fn, torch.compile(fn))
    return made
