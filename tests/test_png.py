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


@pytest.fixture
def fresh_palettes():
    png.palette.cache_clear()   # a test that changes GREYS must not leave its tables cached for the next
    yield
    png.palette.cache_clear()


def test_the_palette_of_two_colours_by_hand(fresh_palettes):
    """Red and blue: each at the nine levels over white (255 (1 - t) in the other channels, rounded half to even:
    0, 38.25, 76.5 (a hair over, in binary), 114.75, 153, 178.5, 209.1, 229.5, 242.25), the blue band over the red
    one (0.18 blue-band + 0.82 red-band = (246.7, 209.1, 217.4)), and 24 greys 255 k / 23."""
    tints = [0, 38, 77, 115, 153, 178, 209, 230, 242]
    greys = [0, 11, 22, 33, 44, 55, 67, 78, 89, 100, 111, 122, 133, 144, 155, 166, 177, 188, 200, 211, 222, 233, 244,
             255]
    want = ({(255, v, v) for v in tints} | {(v, v, 255) for v in tints} | {(247, 209, 217)}
            | {(g, g, g) for g in greys})
    table = png.palette(("#ff0000", "#0000ff"))
    assert table.dtype == np.uint8 and table.shape == (43, 3) and {tuple(c) for c in table.tolist()} == want


def _colours(n):
    return tuple(f"#{(40 + 13 * i) % 256:02x}{(200 - 29 * i) % 256:02x}{(90 + 71 * i) % 256:02x}" for i in range(n))


def test_a_palette_of_exactly_256_entries_is_allowed_and_one_more_is_not(monkeypatch, fresh_palettes):
    """14 colours make 14 x 9 tints and 91 overlapping pairs of bands, 217 entries, all distinct here; 39 greys bring
    them to 256, the most a PNG palette holds, and 40 to 257."""
    monkeypatch.setattr(png, "GREYS", 39)
    assert len(png.palette(_colours(14))) == 256
    png.palette.cache_clear()
    monkeypatch.setattr(png, "GREYS", 40)
    with pytest.raises(ValueError, match="14 colours need 257 palette entries, more than 256"):
        png.palette(_colours(14))


def _image(tmp_path, colour, count, size=100):
    """A white size x size figure with `count` pixels of `colour`, saved as an RGB PNG."""
    a = np.full((size * size, 3), 255, np.uint8)
    a[:count] = colour
    path = tmp_path / "f.png"
    Image.fromarray(a.reshape(size, size, 3), "RGB").save(path)
    return path


def _at_distance(table, lo, hi):
    """A colour whose nearest palette entry is between lo (excluded) and hi away, and that distance."""
    c = np.random.RandomState(0).randint(0, 256, (10000, 3)).astype(np.uint8)
    _, gap = png._nearest(c, table)
    i = np.flatnonzero((gap > lo) & (gap <= hi))[0]
    return c[i], gap[i]


def test_more_than_half_a_percent_of_pixels_far_from_the_palette_is_a_figure_of_its_own_colours(tmp_path,
                                                                                                   fresh_palettes):
    """A pixel further than FAR (60) from every entry was not drawn from the palette; up to MAX_FAR_SHARE (0.5%) of
    them keep the fixed palette, one pixel more takes the adaptive one. A pixel exactly FAR away is not far."""
    table = png.palette(tuple(PALETTE))
    far, gap = _at_distance(table, 60, 60.5)
    near, _ = _at_distance(table, 59.5, 60)
    assert png.shrink(_image(tmp_path, far, 50), PALETTE) == "fixed"           # 50 of 10,000: 0.5%
    assert png.shrink(_image(tmp_path, far, 51), PALETTE) == "adaptive"
    assert png.shrink(_image(tmp_path, near, 51), PALETTE) == "fixed"
    with pytest.MonkeyPatch.context() as m:
        m.setattr(png, "FAR", float(gap))
        assert png.shrink(_image(tmp_path, far, 51), PALETTE) == "fixed"


def test_a_colour_more_than_near_from_every_entry_gets_its_own_and_a_closer_one_the_nearest(tmp_path, fresh_palettes):
    """Pixels further than NEAR (12) from every entry (bands over each other, a line across a band) get entries from
    the slots the palette leaves, so they decode exactly; closer ones decode as their nearest entry. With no slot
    left (256 entries) they take the nearest too."""
    table = png.palette(tuple(PALETTE))
    own, gap = _at_distance(table, 12, 12.5)
    close, _ = _at_distance(table, 11.5, 12)
    for colour, exact in ((own, True), (close, False)):
        path = _image(tmp_path, colour, 30)
        assert png.shrink(path, PALETTE) == "fixed"
        got = _decoded(path)[0, 0]
        nearest = table[png._nearest(colour[None], table)[0][0]]
        assert (got == colour).all() if exact else ((got == nearest).all() and not (got == colour).all())
    with pytest.MonkeyPatch.context() as m:
        m.setattr(png, "NEAR", float(gap))
        path = _image(tmp_path, own, 30)
        png.shrink(path, PALETTE)
        assert not (_decoded(path)[0, 0] == own).all()
    with pytest.MonkeyPatch.context() as m:   # a full palette: nothing spare
        m.setattr(png, "GREYS", 39)
        png.palette.cache_clear()
        full = png.palette(_colours(14))
        colour, _ = _at_distance(full, 12, 30)
        path = _image(tmp_path, colour, 30)
        assert png.shrink(path, list(_colours(14))) == "fixed"
        assert (_decoded(path)[0, 0] == full[png._nearest(colour[None], full)[0][0]]).all()
