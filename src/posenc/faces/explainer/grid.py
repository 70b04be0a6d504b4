"""2-D grids: the positions of image patches (MAE's encoding)."""

from __future__ import annotations

import numpy as np

from posenc.faces.explainer.shared import Inputs, Section, plotted


def build(inputs: Inputs) -> Section:
    import posenc

    g = posenc.grid((14, 14), 64, preset="mae", dtype="float64")
    tiles = g.reshape(14, 14, 64)
    return Section(
        "grid",
        "2-D grids: positions of image patches",
        "A vision transformer's patches sit on a grid. MAE's encoding (He et al. 2021) "
        "gives half the channels a 1-D sinusoidal encoding of the patch's row and half "
        "of its column. Shown: a 14 x 14 grid with 64 channels, one tile per channel; "
        "the first half vary along one axis, the second half along the other.",
        [
            ("grid positions x channels", f"{g.shape[0]} x {g.shape[1]}"),
            (
                "channels that vary along one axis only: rows / columns",
                f"{int((np.ptp(tiles, axis=1).max(0) < 1e-12).sum())} / "
                f"{int((np.ptp(tiles, axis=0).max(0) < 1e-12).sum())}",
            ),
        ],
        ["grid"],
        [],
        "import posenc\ng = posenc.grid((14, 14), 64, preset='mae')  # (196, 64)",
        draw={"grid": plotted("grid")},
    )
