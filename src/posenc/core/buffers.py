"""Derived buffers: non-persistent tensors rebuilt from their definition, never state.

Every posenc module keeps a few tensors that follow from its constructor arguments:
the float32 ``inv_freq`` of the rotary modules (HF's attribute), ALiBi's slopes, T5's
bucket boundaries, Sandwich's frequencies. :class:`DerivedBuffers` is the one
mechanism that owns them:

- they are non-persistent buffers (not in the state dict: a checkpoint cannot bring
  them back, and need not);
- ``reset_parameters()`` (torch's name for "initialise this module's own tensors",
  which FSDP's deferred initialisation calls after ``to_empty()``) draws the module's
  own learned parameters as the constructor does and rebuilds the buffers;
- every move or cast (``.to``, ``.half()``, ``to_empty``) rebuilds them exact on
  their new device, so ``model.to(torch.bfloat16)`` never rounds them (transformers
  #25681, #30709) and a module built under ``torch.device("meta")`` holds its exact
  values after ``to_empty(device=...)`` instead of uninitialised memory;
- like any module's tensors they are first created on the default device (``with
  torch.device(...)``).

This module imports torch; ``import posenc`` does not import it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from posenc.core.tables import LOCK


class DerivedBuffers(nn.Module):
    """Base of the modules whose non-persistent buffers follow from their definition.

    Subclasses define ``_derived_buffers`` (name -> exact CPU tensor in the
    buffer's own dtype) and, if they own learned parameters, ``_init_parameters``;
    their constructor calls :meth:`reset_parameters` once its attributes are set.
    """

    def _derived_buffers(self) -> dict[str, torch.Tensor]:
        """The value of every derived buffer, by name: CPU tensors of their own dtype."""
        return {}

    def _init_parameters(self) -> None:
        """Draw the module's own learned parameters (not its submodules') as at construction."""

    def reset_parameters(self) -> None:
        """Initialise the module's own parameters and rebuild its derived buffers.

        ``nn.Linear``'s convention, which torchtune's modules and FSDP's deferred
        initialisation follow: after ``to_empty()`` every submodule can be initialised
        again in place.
        """
        with torch.no_grad():
            self._init_parameters()
        self._place_derived_buffers()

    def _place_derived_buffers(self) -> None:
        """(Re)build every derived buffer on the device it is on (the default one if new)."""
        with LOCK:
            default = torch.empty(0).device
            for name, value in self._derived_buffers().items():
                old = self._buffers.get(name)
                device = default if old is None else old.device
                self.register_buffer(name, value.to(device), persistent=False)

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> Any:
        # a cast would round the derived values and to_empty() would leave garbage:
        # whatever the move did, they are rebuilt exact on their new device
        with LOCK:
            super()._apply(fn, recurse)
            self._place_derived_buffers()
        return self
