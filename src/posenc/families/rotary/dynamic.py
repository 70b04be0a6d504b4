"""Schedules whose frequencies depend on the sequence length: one policy, HF's.

transformers' ``dynamic_rope_update`` decorator decides which frequencies a
rotary module uses for a call whose positions reach ``seq_len = max(position_ids)
+ 1``; :class:`LengthPolicy` is that decision, shared by :class:`posenc.Rotary`
and the patched HF module (:mod:`posenc.hf`):

- ``dynamic`` (NTK, ``dynamic_frequency_update``): the module remembers the
  longest length it has grown to, initially ``max_position_embeddings``. A call
  longer than that recomputes the frequencies for its length and remembers it; a
  call shorter than ``max_position_embeddings`` after growing restores the
  original frequencies. Between the two, the grown frequencies stay (the same
  positions can get other frequencies after a longer call, as in HF).
- ``longrope`` (``longrope_frequency_update``): the long factors for a call
  longer than ``original_max_position_embeddings`` (strictly), the short ones
  otherwise; a function of the call alone.
- every other schedule: fixed frequencies.

Keys already in a KV cache keep the frequencies they were rotated with
(transformers #25104); :meth:`posenc.Rotary.rerotate` and
:func:`posenc.hf.rerotate_cache` move them to the new ones.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from posenc.families.rotary.schedules import RopeFrequencies

#: rope types whose frequencies depend on the length of the call
LENGTH_DEPENDENT = ("dynamic", "longrope")

# guards the state of every policy; one module-level lock keeps them picklable
_LOCK = threading.Lock()


class LengthPolicy:
    """The frequencies a module uses for each call, following HF's ``dynamic_rope_update``.

    Args:
        rope_type: the schedule's name.
        compute: ``compute(seq_len)`` gives the schedule's frequencies for a
            sequence of ``seq_len`` positions (``None``: the original ones).
        max_position_embeddings: the length ``dynamic`` starts from.
        original_max_position_embeddings: where ``longrope`` switches.

    Attributes:
        current: the frequencies in use.
        length: HF's ``max_seq_len_cached``: the length ``current`` was made for.
    """

    def __init__(
        self,
        rope_type: str,
        compute: Callable[[int | None], RopeFrequencies],
        *,
        max_position_embeddings: int | None = None,
        original_max_position_embeddings: int | None = None,
    ) -> None:
        self.rope_type = rope_type
        self.compute = compute
        self.original = compute(None)
        self.current = self.original
        self.max_position_embeddings = max_position_embeddings
        self.original_max_position_embeddings = original_max_position_embeddings
        self.length = max_position_embeddings or 0
        self._long: RopeFrequencies | None = None

    def update(self, seq_len: int) -> bool:
        """Choose the frequencies for a call reaching ``seq_len``; True if they changed."""
        if self.rope_type == "dynamic" and self.max_position_embeddings is not None:
            with _LOCK:
                before = self.current
                if seq_len > self.length:
                    self.current, self.length = self.compute(seq_len), seq_len
                if seq_len < self.max_position_embeddings < self.length:
                    self.current, self.length = self.original, self.max_position_embeddings
                return self.current is not before
        if self.rope_type == "longrope" and self.original_max_position_embeddings is not None:
            original = self.original_max_position_embeddings
            with _LOCK:
                before = self.current
                if seq_len > original:
                    if self._long is None:
                        self._long = self.compute(original + 1)
                    self.current = self._long
                else:
                    self.current = self.original
                return self.current is not before
        return False
