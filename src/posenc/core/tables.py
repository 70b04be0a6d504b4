"""The exact-table cache of the torch modules: one mechanism for every encoding module.

:class:`ExactTables` is the base of ``SinusoidalEmbedding`` and ``Rotary``: it keeps
tables of the exact values at positions ``0 .. n - 1`` per (device, dtype) and answers
any positions from them:

- a table is built whole by the module's ``_build`` and then published, so concurrent
  callers see the old table or the new one, never a partial one (fairseq #5555); it
  grows by doubling under one lock, never refilled per call;
- the cache is keyed on device *and* dtype (positional-encodings cached on shape and
  returned the first dtype again);
- positions past a size cap, negative or float positions, and dtypes the
  module keeps off tables are computed directly by the module's ``_direct``;
- under ``torch.compile`` nothing grows and no value is inspected: the table must
  already cover the positions, else a constant error says so;
- tables are a cache, not state: never in the state dict, dropped by pickling, so
  ``deepcopy``, ``pickle``, ``torch.save`` and meta-device initialisation have nothing
  to round or lose.

This module imports torch; ``import posenc`` does not import it.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from posenc.core import checks

#: Guards growth and swaps of every module's tables. Rare events; one module-level lock
#: (re-entrant: a table may be derived from another) keeps the modules picklable.
LOCK = threading.RLock()

Tables = tuple[torch.Tensor, ...]


def _index(positions: torch.Tensor) -> torch.Tensor:
    """Int positions as an index ``F.embedding`` takes (int32 or int64); floats unchanged.

    int8, int16 and the unsigned dtypes become int64: embedding refuses them, and
    sums such as ``int8 + offset`` would wrap in them.
    """
    if positions.is_floating_point() or positions.dtype in (torch.int32, torch.int64):
        return positions
    return positions.to(torch.int64)


class ExactTables(nn.Module):
    """Base of the torch modules that serve exact values of positions from cached tables.

    Subclasses set :attr:`width` (channels per position, the parameter
    :attr:`width_name`), :attr:`initial_length` and
    :attr:`max_table_elements` (beyond it positions are computed directly), and define
    ``_build(n, device, dtype)`` (the tables of positions ``0 .. n - 1``) and
    ``_direct(positions, dtype)`` (the values at any positions); both return a tuple of
    ``positions.shape + (width,)`` tensors (``(pe,)``, ``(cos, sin)``).
    ``_prepare(needed)`` runs before an eager lookup of positions below ``needed``
    (rotary schedules that change with the length hook in there).
    """

    width: int
    width_name: str = "width"
    initial_length: int
    max_table_elements: int = 1 << 24  # per table: 64 MiB of float32

    def __init__(self) -> None:
        super().__init__()
        self._tables: dict[tuple[torch.device, torch.dtype], Tables] = {}

    # ------------------------------------------------------------------ to define

    def _build(self, n: int, device: torch.device, dtype: torch.dtype) -> Tables:
        raise NotImplementedError

    def _direct(self, positions: torch.Tensor, dtype: torch.dtype) -> Tables:
        raise NotImplementedError

    def _tabled(self, dtype: torch.dtype) -> bool:
        """Whether values of ``dtype`` come from tables (else always computed directly)."""
        return True

    def _prepare(self, needed: int) -> None:
        """Called before an eager lookup of positions up to ``needed - 1``."""

    # ------------------------------------------------------------------ the cache

    def clear_tables(self) -> None:
        """Forget every table (after the values they hold changed)."""
        with LOCK:
            self._tables = {}

    def _table_for(self, length: int, device: torch.device, dtype: torch.dtype) -> Tables | None:
        """Tables of at least ``length`` positions, grown if needed; None if too large."""
        key = (device, dtype)
        table = self._tables.get(key)
        if table is not None and table[0].shape[0] >= length:
            return table
        if length * self.width > self.max_table_elements:
            return None
        with LOCK:
            tables = self._tables
            table = tables.get(key)  # another thread may have grown it meanwhile
            if table is None or table[0].shape[0] < length:
                n = self.initial_length if table is None else table[0].shape[0]
                while n < length:
                    n *= 2
                n = max(length, min(n, self.max_table_elements // self.width))
                # built whole before it is published: readers see the old or the new table
                table = self._build(n, device, dtype)
                tables[key] = table
            return table

    def _lookup(self, positions: torch.Tensor, device: torch.device, dtype: torch.dtype) -> Tables:
        """The values at any int or float ``positions``, ``positions.shape + (width,)``.

        Positions of every int dtype (int8 to uint64) are read: their range is
        checked first (no uint64 value wraps), then they index as int64.

        Raises:
            ValueError: a result of more than :data:`posenc.core.checks.MAX_ELEMENTS`
                values (refused before any work, from the shape alone), positions
                beyond ``2**31``.
        """
        if torch.compiler.is_compiling():
            positions = positions.to(device)
            if positions.is_floating_point():
                return self._direct(positions, dtype)
            compiled = self._compiled_table(device, dtype)
            return tuple(F.embedding(_index(positions), t) for t in compiled)
        count = positions.numel() * self.width
        if count > checks.MAX_ELEMENTS:  # the message only when needed: a decode step's path
            checks.check_elements(
                count,
                f"the values at positions (shape {tuple(positions.shape)}) x "
                f"{self.width_name}={self.width}",
            )
        positions = positions.to(device)
        if positions.numel() == 0:
            return self._direct(_index(positions), dtype)
        lo, hi = checks.check_range(positions, 0.0, "positions")
        if not positions.is_floating_point():
            positions = _index(positions)  # in range now: no uint64 value wraps
        self._prepare(int(hi) + 1)
        table = None
        if not positions.is_floating_point() and lo >= 0 and self._tabled(dtype):
            table = self._table_for(int(hi) + 1, device, dtype)
        if table is None:
            return self._direct(positions, dtype)
        return tuple(F.embedding(positions, t) for t in table)

    def _range(self, offset: Any, seq: int, device: torch.device, dtype: torch.dtype) -> Tables:
        """The values at ``offset .. offset + seq - 1``, ``(seq, width)``.

        ``offset`` is an int (the KV cache's length) or a 0-d int tensor.
        """
        if not checks.is_int_offset(offset):
            return self._lookup(torch.arange(seq, device=device) + offset.to(device), device, dtype)
        end = offset + seq
        if torch.compiler.is_compiling():
            compiled = self._compiled_table(device, dtype)
            if offset < 0 or end > compiled[0].shape[0]:
                # a constant message: offset may be symbolic, and dynamo cannot format it
                raise ValueError(
                    "offset .. offset + seq - 1 lies outside the table, which cannot grow "
                    "inside torch.compile; run one eager call with the longest length first"
                )
            return tuple(t[offset:end] for t in compiled)
        offset, end = int(offset), int(end)
        checks.check_exact(offset, end - 1, "offset .. offset + seq - 1")
        self._prepare(end)
        table = None
        if offset >= 0 and self._tabled(dtype):
            table = self._table_for(end, device, dtype)
        if table is None:
            return self._direct(torch.arange(offset, end, device=device), dtype)
        return tuple(t[offset:end] for t in table)

    def _compiled_table(self, device: torch.device, dtype: torch.dtype) -> Tables:
        """The table a traced call reads: it must exist already (nothing is built in a graph)."""
        table = self._tables.get((device, dtype))
        if table is None:
            raise ValueError(
                "no table for this device and dtype yet, and none can be built inside "
                "torch.compile: run one eager call first"
            )
        return table

    def __getstate__(self) -> dict[str, Any]:
        state = dict(super().__getstate__())
        state["_tables"] = {}  # a cache: rebuilt on demand
        return state
