"""Figures as small PNGs: the committed results are mostly figures, and a checkout should stay light.

A figure here is drawn from a dozen colours on white: lines, their antialiased edges and the bands
behind them are each colour blended toward white, and the text is grey. A fixed palette of exactly those
blends holds such a figure with no visible change, and because every figure maps the same shade to the
same index, deflate finds long runs where an adaptive palette would pick a different near-duplicate shade
per pixel: 0.6x the bytes of a 256-colour median cut. A figure with colours of its own (a colour map) gets
the adaptive palette instead, so nothing is ever drawn in the wrong colour.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

# how far each colour is blended toward white: a line, the antialiased edges of one, a band (alpha 0.18),
# the faint per-seed lines (alpha 0.3), and the light tints between
LEVELS = (1.0, 0.85, 0.7, 0.55, 0.4, 0.3, 0.18, 0.1, 0.05)
GREYS = 24
# a pixel further than this from its palette colour (RGB distance, 0-441) was not drawn from the palette
FAR = 60.0
# a pixel further than this from every entry gets an entry of its own, from the slots the palette leaves
NEAR = 12.0
# more than this share of such pixels: the figure has colours of its own; an adaptive palette holds them
MAX_FAR_SHARE = 0.005


def _rgb(hex_colour: str) -> np.ndarray:
    return np.array([int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)], float)


@lru_cache(maxsize=None)
def palette(colours: tuple[str, ...]) -> np.ndarray:
    """Every colour at every LEVEL over white, two overlapping bands of each pair, and GREYS greys: (n, 3)
    uint8, n <= 256."""
    white = np.full(3, 255.0)
    base = [_rgb(c) for c in colours]
    entries = [t * c + (1 - t) * white for c in base for t in LEVELS]
    band = [0.18 * c + 0.82 * white for c in base]  # two bands overlap: the later one over the earlier
    entries += [0.18 * b + 0.82 * a for i, a in enumerate(band) for b in band[i + 1:]]
    entries += [np.full(3, g) for g in np.linspace(0, 255, GREYS)]
    table = np.unique(np.clip(np.rint(np.array(entries)), 0, 255).astype(np.uint8), axis=0)
    if len(table) > 256:
        raise ValueError(f"{len(colours)} colours need {len(table)} palette entries, more than 256")
    return table


def shrink(path: Path, colours: list[str]) -> str:
    """Rewrite the PNG at path in a palette; return which: "fixed" (the colours' blends) or "adaptive"."""
    from PIL import Image

    table = palette(tuple(colours))
    with Image.open(path) as im:
        rgb = im.convert("RGB")
    pixels = np.asarray(rgb).reshape(-1, 3)
    # each distinct colour to its nearest entry, exactly (PIL's own mapping to a given palette is
    # approximate: it turned white into a tint); a figure has a few thousand distinct colours
    packed = (pixels[:, 0].astype(np.int32) << 16) | (pixels[:, 1].astype(np.int32) << 8) | pixels[:, 2]
    distinct, where = np.unique(packed, return_inverse=True)
    rgb_of = np.stack([distinct >> 16, (distinct >> 8) & 255, distinct & 255], axis=1).astype(np.uint8)
    nearest, gap = _nearest(rgb_of, table)
    if (gap[where] > FAR).mean() > MAX_FAR_SHARE:
        small = rgb.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
        _write(small, path)
        return "adaptive"
    poor = gap > NEAR
    if poor.any() and len(table) < 256:
        # three bands over each other, a line across a band: their own entries, from the spare slots
        mixed = Image.fromarray(pixels[poor[where]][None, :, :], "RGB")
        spare = 256 - len(table)
        extra = np.array(mixed.quantize(colors=spare, method=Image.Quantize.MEDIANCUT).getpalette()[:3 * spare],
                         np.uint8).reshape(-1, 3)
        table = np.concatenate([table, extra])
        nearest, _ = _nearest(rgb_of, table)
    small = Image.fromarray(nearest[where].reshape(rgb.height, rgb.width).astype(np.uint8), "P")
    small.putpalette(table.ravel().tolist())
    _write(small, path)
    return "fixed"


def _write(image, path: Path) -> None:
    """The image as PNG, deflated by libdeflate's top level through oxipng (8% under zlib's best, lossless;
    zopfli would save 1% more at ten times the time)."""
    import oxipng

    image.save(path, "PNG")
    oxipng.optimize(path, level=2, deflate=oxipng.Deflaters.libdeflater(12), strip=oxipng.StripChunks.safe())


def _nearest(colours: np.ndarray, table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Index of each colour's nearest entry in table, and the RGB distance to it."""
    gap = ((colours[:, None, :].astype(float) - table[None, :, :].astype(float)) ** 2).sum(-1)
    return gap.argmin(1), np.sqrt(gap.min(1))
