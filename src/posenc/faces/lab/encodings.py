"""The lab's encodings as data: one frozen :class:`Encoding` per name, in :data:`REGISTRY`.

An :class:`Encoding` says which position pieces the lab's model gets (an
absolute table added to the token embedding, a rotation of queries and keys
in every layer or in all but every k-th, an attention-bias module, a position
module of each layer, the attention kernel, randomized positions) and which
rope scaling it applies at test time. :mod:`posenc.lab.model` builds every
model from these fields alone, and :mod:`posenc.lab.training` keys and evaluates
runs through them, so adding an encoding is adding one entry here.

A per-layer method (FoX's gates, CoPE, DAPE, PaTH's transforms) is one entry of
:data:`PER_LAYER`: its name and the builder of one layer's
:class:`~posenc.lab.layers.PositionModule`, whose inputs the layer's attention
call takes.

Importable without torch (the command line lists the names before torch is
imported): the bias factories and the per-layer builders import their modules
when called.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

from posenc.core import checks
from posenc.families.rotary.schedules import SCHEDULES, STRETCH, stretched

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

    from posenc.faces.lab.layers import PositionModule
    from posenc.faces.lab.sizes import ModelConfig
    from posenc.families.bias.modules import AttentionBias

#: The absolute encodings an :class:`Encoding` may add to the token embeddings.
Absolute = Literal["sinusoidal", "learned"]
#: The rotations an :class:`Encoding` may apply to q and k.
Rotation = Literal["rope", "xpos", "fope"]
#: The attention an :class:`Encoding` runs: softmax (``posenc.attention``), stick-breaking
#: or PaTH.
Kernel = Literal["softmax", "stick-breaking", "path"]

_ABSOLUTE: tuple[Absolute, ...] = ("sinusoidal", "learned")
_ROTATIONS: tuple[Rotation, ...] = ("rope", "xpos", "fope")
_KERNELS: tuple[Kernel, ...] = ("softmax", "stick-breaking", "path")
#: The base of the lab's RoPE (``posenc.Rotary``'s default, Su et al. 2021).
ROPE_BASE = 10000.0


@dataclass(frozen=True)
class Encoding:
    """How one lab encoding builds the model's position pieces and scales at test time.

    Attributes:
        name: the name on the command line and in the results.
        description: one line for people.
        absolute: a table added to the token embedding: ``"sinusoidal"`` (the
            exact table of Vaswani et al. 2017, section 3.5), ``"learned"`` (one
            row per position up to ``max_positions``) or None.
        rotary: queries and keys rotated by position: ``"rope"`` (Su et al.
            2021), ``"xpos"`` (Sun et al. 2022), ``"fope"`` (Hua et al. 2024: a
            Fourier series per frequency, :class:`posenc.FoPE`, its frequencies
            below one turn over the trained length dropped) or None.
        schedule: the HF ``rope_type`` of the RoPE frequencies in training and
            at test time (``"resonance"``: Resonance RoPE's integer
            wavelengths), or None for RoPE's own.
        bias: ``bias(heads, head_dim)`` builds the attention-bias module the
            layers share, or None.
        random_positions: positions are a sorted random subset of
            ``0 .. max_positions - 1``, drawn anew for every batch in training
            and evaluation (Ruoss et al. 2023,
            :func:`posenc.families.arithmetic.randomized_positions`), read by the
            encoding's rotation or absolute table; an encoding without either
            reads no position, so it has nothing to randomize.
        ids: the name in :data:`POSITION_IDS` of the ids the absolute table reads
            instead of the positions, computed from the task's layout of its
            numbers (``"abacus"``: McLeish et al. 2024; ``"coupled"``: Cho et al.
            2024), with a random offset in training; needs a learned table.
        nope_every: every ``nope_every``-th layer (layers ``nope_every - 1``,
            ``2 nope_every - 1``, ... counted from 0) has no positional encoding
            at all and the others rotate (:meth:`rotates`), as HF's Llama 4 and
            SmolLM3 configs lay out ``no_rope_layers`` from their
            ``no_rope_layer_interval`` (4 in both); None: every layer rotates.
            An int >= 2, with a ``rotary``.
        kernel: ``"softmax"`` attention, ``"stick-breaking"`` (Tan et al.
            2024: the nearest keys take their sigmoid's share first,
            :func:`posenc.stick_breaking_attention`, the remainder given to the
            query's own value), or ``"path"`` (Yang et al. 2025: softmax
            attention through the product of the Householder transforms between
            key and query, :func:`posenc.path_attention`; its transforms come
            from a ``"path"`` or ``"path-fox"`` position module).
        per_layer: the name in :data:`PER_LAYER` of each layer's position module,
            whose :meth:`~posenc.lab.layers.PositionModule.attend_inputs` of the
            layer's input go to its attention call: ``"forget-gate"`` (FoX, Lin
            et al. 2025: :class:`posenc.ForgetGate`'s gates as a score term),
            ``"cope"`` (Golovneva et al. 2024: :class:`posenc.CoPE`), ``"dape"``
            (Zheng et al. 2024: :class:`posenc.DAPE` over ALiBi), ``"path"`` and
            ``"path-fox"`` (PaTH's transforms, with FoX's gates for the second);
            or None.
        temperature: the layers without RoPE scale their queries by Llama 4's
            temperature :func:`posenc.attn_temperature` (its ``floor_scale``
            the ``chunk``).
        chunk: the RoPE layers attend within chunks of this many positions
            (Llama 4's ``attention_chunk_size``, 8192 there), or None.
        trains_as: the encoding whose trained model this one evaluates (None:
            its own).
        test_scaling: the ``rope_type`` applied at test time beyond the
            trained length, set by :func:`posenc.rotary.schedules.stretched` for
            ``factor`` = tested / trained length (None: no scaling).
        test_params: parameters that replace the stretched schedule's own
            (``(("attention_factor", 1.0),)``: YaRN without its temperature).
    """

    name: str
    description: str
    absolute: Absolute | None = None
    rotary: Rotation | None = None
    bias: Callable[[int, int], AttentionBias] | None = None
    random_positions: bool = False
    ids: str | None = None
    nope_every: int | None = None
    schedule: str | None = None
    kernel: Kernel = "softmax"
    per_layer: str | None = None
    temperature: bool = False
    chunk: int | None = None
    trains_as: str | None = None
    test_scaling: str | None = None
    test_params: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if self.absolute is not None:
            checks.check_choice(self.absolute, "absolute", _ABSOLUTE)
        if self.rotary is not None:
            checks.check_choice(self.rotary, "rotary", _ROTATIONS)
        if self.random_positions and self.rotary != "rope" and self.absolute is None:
            raise ValueError(
                f"{self.name}: random_positions needs rotary='rope' or an absolute table to "
                "read them (without one, no position is read: randomizing leaves the model "
                "as it is)"
            )
        if self.ids is not None:
            checks.check_choice(self.ids, "ids", tuple(POSITION_IDS))
            if self.absolute != "learned" or self.random_positions:
                raise ValueError(
                    f"{self.name}: ids ({self.ids}) index a learned table (absolute='learned'), "
                    "in place of the positions (not with random_positions)"
                )
        checks.check_choice(self.kernel, "kernel", _KERNELS)
        if self.per_layer is not None:
            checks.check_choice(self.per_layer, "per_layer", tuple(PER_LAYER))
        if (self.kernel == "path") != (self.per_layer in _PATH):
            raise ValueError(
                f"{self.name}: the path kernel and the per-layer modules {_PATH} go together "
                "(PaTH's transforms come from the layer's input)"
            )
        if self.kernel == "path" and (self.rotary or self.bias or self.absolute):
            raise ValueError(f"{self.name}: PaTH's transforms are its positional encoding")
        if self.schedule is not None and self.rotary != "rope":
            raise ValueError(f"{self.name}: schedule needs rotary='rope'")
        if self.chunk is not None:
            checks.check_int(self.chunk, "chunk", minimum=1)
        if (self.temperature or self.chunk is not None) and self.nope_every is None:
            raise ValueError(f"{self.name}: temperature and chunk need nope_every (Llama 4)")
        if self.nope_every is not None:
            # 1 would leave no layer rotating: that is "nope", not a hybrid
            checks.check_int(self.nope_every, "nope_every", minimum=2)
            if self.rotary is None:
                raise ValueError(f"{self.name}: nope_every needs a rotary encoding to skip")

    def rotates(self, layer: int) -> bool:
        """Whether layer ``layer`` (counted from 0) rotates its queries and keys.

        Every layer of a rotary encoding without ``nope_every``; with it, HF's
        ``no_rope_layers[layer] = int((layer + 1) % no_rope_layer_interval != 0)``
        (Llama 4, SmolLM3: 1 where the layer uses RoPE), the interval being
        ``nope_every``. False for every layer of an encoding without rotation.

        Raises:
            TypeError, ValueError: ``layer`` not an int >= 0.
        """
        layer = checks.check_int(layer, "layer", minimum=0)
        if self.rotary is None:
            return False
        return self.nope_every is None or (layer + 1) % self.nope_every != 0

    @property
    def context_parallel(self) -> bool:
        """Whether ring attention can train it: a rotation and/or a bias, softmax.

        Llama 4's chunks and temperature, FoPE, stick-breaking, PaTH, the per-layer
        modules (FoX's gates, CoPE, DAPE, PaTH's transforms) and the ids of the
        numbers' layout (Abacus, coupling) have no ring-attention form here.
        """
        return (
            self.kernel == "softmax" and self.per_layer is None and self.chunk is None
            and not self.temperature and self.rotary != "fope" and self.ids is None
        )  # fmt: skip

    @property
    def limited(self) -> bool:
        """Whether a sequence must fit ``max_positions`` (a learned table read at positions,
        random positions); a table read at :attr:`ids` limits the numbers' width instead."""
        return (self.absolute == "learned" and self.ids is None) or self.random_positions

    def scaling(self, length: int, trained: int, *, rotary_dim: int) -> dict[str, Any] | None:
        """The ``rope_scaling`` this encoding applies at ``length`` tokens, trained at ``trained``.

        None without a test-time scaling and within the trained length; beyond it,
        :func:`posenc.rotary.schedules.stretched` at factor ``length / trained``
        rounded up to hundredths (for ``rotary_dim`` channels at :data:`ROPE_BASE`),
        with :attr:`test_params` in place of its own.
        """
        if self.test_scaling is None or length <= trained:
            return None
        factor = math.ceil(100 * length / trained) / 100
        scaling = stretched(self.test_scaling, factor, trained, rotary_dim=rotary_dim,
                            base=ROPE_BASE)  # fmt: skip
        scaling.update(self.test_params)
        return scaling


# ------------------------------------------------------------------ bias factories


def _alibi(heads: int, head_dim: int) -> AttentionBias:
    from posenc.families.bias.modules import ALiBi

    return ALiBi(heads)


def _t5(heads: int, head_dim: int) -> AttentionBias:
    from posenc.families.bias.modules import T5Bias

    return T5Bias(heads, bidirectional=False)


def _kerple(heads: int, head_dim: int) -> AttentionBias:
    from posenc.families.bias.modules import KERPLE

    return KERPLE(heads)


def _fire(heads: int, head_dim: int) -> AttentionBias:
    from posenc.families.bias.modules import FIRE

    return FIRE(heads)


def _sandwich(heads: int, head_dim: int) -> AttentionBias:
    from posenc.families.bias.modules import Sandwich

    return Sandwich(heads, dim=head_dim)


# ------------------------------------------------------------------ per-layer modules


def _forget_gate(config: ModelConfig) -> PositionModule:
    from posenc.faces.lab.layers import ForgetGates

    return ForgetGates(config.d_model, config.heads)


def _cope(config: ModelConfig) -> PositionModule:
    from posenc.faces.lab.layers import CoPETerm

    return CoPETerm(config.head_dim, config.max_positions)


def _dape(config: ModelConfig) -> PositionModule:
    from posenc.faces.lab.layers import DAPETerm
    from posenc.families.bias.modules import ALiBi

    return DAPETerm(ALiBi(config.heads))


def _path(config: ModelConfig) -> PositionModule:
    from posenc.faces.lab.layers import Householder

    return Householder(config.d_model, config.heads)


def _path_fox(config: ModelConfig) -> PositionModule:
    from posenc.faces.lab.layers import Householder

    return Householder(config.d_model, config.heads, forget_gate=True)


def _dual_chunk(config: ModelConfig) -> PositionModule:
    from posenc.faces.lab.layers import DualChunk

    trained = config.trained_positions or config.max_positions
    size = max(2, trained)
    return DualChunk(config.head_dim, chunk_size=size, local_size=size // 4)


def _pope(config: ModelConfig) -> PositionModule:
    from posenc.faces.lab.layers import PolarPositions

    return PolarPositions(config.head_dim, heads=config.heads)


#: Every per-layer position module by name (read-only): ``PER_LAYER[name](config)``
#: builds one layer's :class:`~posenc.lab.layers.PositionModule` for a model of
#: :class:`~posenc.lab.model.ModelConfig` ``config``. A new per-layer method is one
#: entry here (and an :class:`Encoding` whose ``per_layer`` names it).
PER_LAYER: Mapping[str, Callable[[ModelConfig], PositionModule]] = MappingProxyType({
    "forget-gate": _forget_gate,
    "cope": _cope,
    "dape": _dape,
    "path": _path,
    "path-fox": _path_fox,
    "dual-chunk": _dual_chunk,
    "pope": _pope,
})  # fmt: skip
# the per-layer modules whose inputs only the path kernel takes
_PATH = ("path", "path-fox")


# ------------------------------------------------------------------ ids from the numbers


def _offset(high: int, scheme: str, generator: torch.Generator, rows: int | None = None) -> Any:
    from posenc.families.arithmetic import random_offsets

    if high < 0:
        raise ValueError(
            f"{scheme}: the training numbers need more ids than max_positions gives; "
            "test longer numbers, or train shorter ones (the table has a row for each column "
            "of the widest test number)"
        )
    return random_offsets(high, generator, rows)


def _abacus_ids(
    significance: torch.Tensor, max_positions: int, generator: torch.Generator | None
) -> torch.Tensor:
    from posenc.families.arithmetic import abacus_positions

    offset = 0
    if generator is not None:  # training: one offset per batch, the ids still in the table
        longest = int(abacus_positions(significance).max())
        offset = _offset(max_positions - 1 - longest, "abacus", generator)
    return abacus_positions(significance, offset, max_positions=max_positions)


def _coupled_ids(
    significance: torch.Tensor, max_positions: int, generator: torch.Generator | None
) -> torch.Tensor:
    from posenc.families.arithmetic import coupled_positions

    start: Any = 1
    if generator is not None:  # training: one start per example, the ids still in the table
        width = int(significance.max()) + 1  # the after-number token takes start + width
        rows = significance.shape[0]
        start = 1 + _offset(max_positions - 2 - width, "coupled", generator, rows)
    return coupled_positions(significance, start, max_positions=max_positions)


#: Position-id schemes that read a task's layout of its numbers (read-only):
#: ``POSITION_IDS[name](significance, max_positions, generator)`` gives the ids
#: ``(batch, seq)`` a learned table of ``max_positions`` rows reads (the lab's
#: :attr:`~posenc.lab.sizes.ModelConfig.id_rows`, sized as both papers size their
#: ranges: the widest test number's columns, plus the after-number id and row 0); ``generator`` is
#: training's randomness (its random offsets), None at evaluation (the fixed start).
#: A new scheme is one entry here (and an :class:`Encoding` whose ``ids`` names it).
POSITION_IDS: Mapping[str, Callable[..., torch.Tensor]] = MappingProxyType({
    "abacus": _abacus_ids,
    "coupled": _coupled_ids,
})  # fmt: skip


# ------------------------------------------------------------------ the registry

_ROPE = Encoding("rope", "queries and keys rotated by position (Su et al. 2021)", rotary="rope")


def _at_test_time(rope_type: str, trained: Encoding = _ROPE, **fields: Any) -> Encoding:
    """The ``trained`` model (``rope``'s by default) evaluated with ``rope_type`` beyond its
    length, named ``rope-<rope_type>`` (``rope-yarn``, ``rope-resonance-yarn``), described
    by the schedule's own docstring."""
    doc = (SCHEDULES[rope_type].__doc__ or rope_type).strip().split("\n\n")[0]
    what = " ".join(doc.replace("``", "").split())
    return replace(
        trained,
        name=f"rope-{rope_type.replace('_', '-')}",
        description=f"{trained.name} at test time: {what}",
        trains_as=trained.name,
        test_scaling=rope_type,
        **fields,
    )


_RESONANCE = replace(
    _ROPE,
    name="rope-resonance",
    description="rope with every wavelength rounded to an integer (Wang et al. 2024)",
    schedule="resonance",
)


def test_time_variants() -> tuple[Encoding, ...]:
    """Every context-extension schedule of :data:`posenc.rotary.schedules.STRETCH` at test
    time, on the model it was made for (Resonance YaRN on Resonance RoPE's), then YaRN
    without its attention temperature: as the registry holds them (a schedule registered
    since is here too)."""
    return (
        *(_at_test_time(t, _RESONANCE if t.startswith("resonance") else _ROPE) for t in STRETCH),
        replace(_at_test_time("yarn", test_params=(("attention_factor", 1.0),)),
                name="rope-yarn-flat",
                description="rope at test time: YaRN's frequencies without its attention "
                "temperature (attention_factor 1)"),
    )  # fmt: skip


_STRETCHED = test_time_variants()


_IN_ORDER = (
    Encoding("nope", "no positional encoding: the causal mask alone (Kazemnejad et al. 2023)"),
    replace(
        _ROPE,
        name="hybrid-nope",
        description="rope in every layer but every 2nd, which has no positional encoding "
        "(Llama 4 and SmolLM3 skip every 4th; Cohere 2 has 3 rope layers to 1 without)",
        nope_every=2,
    ),
    Encoding(
        "sinusoidal",
        "the exact sinusoidal table added to the token embedding (Vaswani et al. 2017)",
        absolute="sinusoidal",
    ),
    Encoding(
        "learned",
        "a learned table of max_positions rows added to the token embedding",
        absolute="learned",
    ),
    _ROPE,
    *[e for e in _STRETCHED if e.trains_as == _ROPE.name],
    Encoding("xpos", "rope with a decay over distance (Sun et al. 2022)", rotary="xpos"),
    Encoding("alibi", "a linear distance penalty per head (Press et al. 2022)", bias=_alibi),
    Encoding("t5", "learned biases of causal distance buckets (Raffel et al. 2020)", bias=_t5),
    Encoding("kerple", "a learned logarithmic kernel bias (Chi et al. 2022)", bias=_kerple),
    Encoding("fire", "a learned function of normalised distance (Li et al. 2023)", bias=_fire),
    Encoding(
        "sandwich",
        "the sinusoidal embeddings' inner product as a bias (Chi et al. 2022b)",
        bias=_sandwich,
    ),
    replace(
        _ROPE,
        name="randomized",
        description="rope at sorted random positions below max_positions (Ruoss et al. 2023)",
        random_positions=True,
    ),
    Encoding(
        "randomized-learned",
        "a learned table read at sorted random positions below max_positions (Ruoss et al. 2023)",
        absolute="learned",
        random_positions=True,
    ),
    Encoding(
        "randomized-sinusoidal",
        "the sinusoidal table read at sorted random positions below max_positions "
        "(Ruoss et al. 2023)",
        absolute="sinusoidal",
        random_positions=True,
    ),
    Encoding(
        "abacus",
        "a learned table read at each digit's place in its number, offset at random in "
        "training (McLeish et al. 2024)",
        absolute="learned",
        ids="abacus",
    ),
    Encoding(
        "abacus-fire",
        "Abacus embeddings with FIRE's bias in every layer (McLeish et al. 2024)",
        absolute="learned",
        ids="abacus",
        bias=_fire,
    ),
    Encoding(
        "coupled",
        "a learned table read at ids shared by the digits of one significance, from a "
        "random start in training (Cho et al. 2024)",
        absolute="learned",
        ids="coupled",
    ),
    Encoding(
        "fox",
        "forget gates summed between key and query, added to the scores (Lin et al. 2025)",
        per_layer="forget-gate",
    ),
    Encoding(
        "stick-breaking",
        "stick-breaking attention: the nearest keys take their share first (Tan et al. 2024)",
        kernel="stick-breaking",
    ),
    Encoding(
        "cope", "positions counted by content gates (Golovneva et al. 2024)", per_layer="cope"
    ),
    Encoding(
        "dape",
        "an MLP adapting ALiBi's bias to the scores, per layer (Zheng et al. 2024)",
        per_layer="dape",
    ),
    Encoding(
        "irope",
        "Llama 4: every 2nd layer without RoPE with the query temperature, the others "
        "within chunks of 16 (every 4th and 8192 in Llama 4)",
        rotary="rope",
        nope_every=2,
        temperature=True,
        chunk=16,
    ),
    _RESONANCE,
    *[e for e in _STRETCHED if e.trains_as == _RESONANCE.name],
    Encoding(
        "fope",
        "a Fourier series per RoPE frequency, the untrained ones dropped (Hua et al. 2024)",
        rotary="fope",
    ),
    Encoding(
        "dual-chunk",
        "RoPE within chunks of 3/4 of the trained length; queries rotated at fixed positions "
        "for earlier chunks (Dual Chunk Attention, An et al. 2024)",
        per_layer="dual-chunk",
    ),
    Encoding(
        "pope",
        "PoPE: magnitudes from the content, phases from the position, a learned phase "
        "bias per head (Gopalakrishnan et al. 2025)",
        per_layer="pope",
    ),
    Encoding(
        "path",
        "PaTH: keys transformed by the product of data-dependent Householder "
        "transforms between key and query (Yang et al. 2025)",
        kernel="path",
        per_layer="path",
    ),
    Encoding(
        "path-fox",
        "PaTH with FoX's forget gates added to the scores (Yang et al. 2025)",
        kernel="path",
        per_layer="path-fox",
    ),
)

#: Every encoding of the lab by name, in the order the command line lists them (read-only).
REGISTRY: Mapping[str, Encoding] = MappingProxyType({e.name: e for e in _IN_ORDER})

#: The encodings the lab trains, by the names ``posenc lab run --encodings`` takes, in order.
ENCODINGS = tuple(REGISTRY)


def lookup(name: str) -> Encoding:
    """The registered :class:`Encoding` called ``name``.

    Raises:
        ValueError: a name not in :data:`ENCODINGS`.
    """
    checks.check_choice(name, "encoding", ENCODINGS)
    return REGISTRY[name]


def training_encoding(name: str) -> str:
    """The encoding a model is trained with (test-time scaling variants train as ``rope``).

    Raises:
        ValueError: a name not in :data:`ENCODINGS`.
    """
    encoding = lookup(name)
    return encoding.trains_as or encoding.name


def scaling_for(name: str, length: int, trained: int, *, rotary_dim: int) -> dict[str, Any] | None:
    """The ``rope_scaling`` of encoding ``name`` at ``length`` tokens: :meth:`Encoding.scaling`.

    None for names without a test-time scaling, unknown names included.
    """
    encoding = REGISTRY.get(name)
    return None if encoding is None else encoding.scaling(length, trained, rotary_dim=rotary_dim)
