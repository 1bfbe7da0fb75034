"""Figures in a fixed palette: exact where the figure was drawn from it, faithful where it was not."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from PIL import Image  # noqa: E402

from grpo_bench.analysis import png  # noqa: E402
from grpo_bench.analysis.plotting import PALETTE  # noqa: E402


def _draw(path, draw, dpi=110):
    fig, ax = plt.subplots(figsize=(3, 2))
    draw(ax)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB")).astype(int)


def _decoded(path):
    with Image.open(path) as im:
        assert im.mode == "P"
        return np.asarray(im.convert("RGB")).astype(int)


def _lines_and_bands(ax):
    x = np.linspace(0, 1, 50)
    for i, c in enumerate(PALETTE[:6]):
        ax.fill_between(x, i / 6 - 0.2, i / 6 + 0.2, color=c, alpha=0.18, lw=0)  # bands overlap by three
        ax.plot(x, i / 6 + 0.05 * np.sin(9 * x), color=c, lw=1.4)


def test_palette_holds_every_colour_and_white_exactly():
    table = {tuple(c) for c in png.palette(tuple(PALETTE)).tolist()}
    assert len(table) <= 256
    assert (255, 255, 255) in table
    for c in PALETTE:
        assert tuple(int(c[i:i + 2], 16) for i in (1, 3, 5)) in table


def test_a_figure_of_the_palette_is_kept_to_within_a_shade(tmp_path):
    path = tmp_path / "f.png"
    before = _draw(path, _lines_and_bands)
    assert png.shrink(path, PALETTE) == "fixed"
    after = _decoded(path)
    gap = np.sqrt(((after - before) ** 2).sum(-1))
    # white stays white (PIL's own palette mapping tinted the whole background pink)
    white = (before == 255).all(-1)
    assert (after[white] == 255).all()
    # the line colours themselves are exact; three bands over each other get spare entries, not a grey
    for c in PALETTE[:6]:
        rgb = np.array([int(c[i:i + 2], 16) for i in (1, 3, 5)])
        solid = (before == rgb).all(-1)
        assert solid.sum() > 20 and (after[solid] == rgb).all(), c
    assert np.percentile(gap, 99.9) <= 18 and gap.max() <= 60


def test_a_figure_with_colours_of_its_own_gets_an_adaptive_palette(tmp_path):
    path = tmp_path / "f.png"
    before = _draw(path, lambda ax: ax.imshow(np.linspace(0, 1, 400).reshape(20, 20), cmap="viridis"))
    assert png.shrink(path, PALETTE) == "adaptive"
    gap = np.sqrt(((_decoded(path) - before) ** 2).sum(-1))
    assert np.percentile(gap, 99) < 12


def test_it_is_smaller_than_the_adaptive_palette_and_a_redraw_is_the_same_bytes(tmp_path):
    a, b = tmp_path / "a.png", tmp_path / "b.png"
    _draw(a, _lines_and_bands)
    _draw(b, _lines_and_bands)
    with Image.open(a) as im:
        im.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT,
                                   dither=Image.Dither.NONE).save(tmp_path / "adaptive.png", optimize=True)
    png.shrink(a, PALETTE)
    png.shrink(b, PALETTE)
    assert a.read_bytes() == b.read_bytes()
    assert a.stat().st_size < 0.9 * (tmp_path / "adaptive.png").stat().st_size


def test_too_many_colours_for_one_palette_is_an_error():
    with pytest.raises(ValueError, match="more than 256"):
        png.palette(tuple(f"#{i * 37 % 256:02x}{i * 91 % 256:02x}{i * 53 % 256:02x}" for i in range(30)))
