"""A figure's digest (grpo_bench/analysis/figdata.py) holds what the figure draws: each thing a reader sees
changes it, a last-bit difference in a number does not, nor do the limits matplotlib picks by itself."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from grpo_bench.analysis import figdata  # noqa: E402


def _figure(**change):
    """A figure with one of everything the digest reads; `change` alters one of them."""
    c = {"suptitle": "loss modes", "fig_text": "3 seeds", "title": "reward", "xlabel": "step", "ylabel": "mean",
         "yscale": "linear", "ylim": None, "ticks": ["a", "b"], "line": [0.5, 0.25], "line_colour": "C0",
         "line_style": "-", "marker": "", "label": "grpo", "dots": [[1.0, 2.0]], "dot_colour": "C1",
         "band": [0.1, 0.2], "bar": 0.75, "bar_colour": "C2", "text": "p = 0.03", "legend": True,
         "fig_legend": None, **change}
    fig, ax = plt.subplots()
    if c["suptitle"] is not None:
        fig.suptitle(c["suptitle"])
    fig.text(0.01, 0.01, c["fig_text"])
    ax.set_title(c["title"])
    ax.set_xlabel(c["xlabel"])
    ax.set_ylabel(c["ylabel"])
    ax.set_yscale(c["yscale"])
    ax.plot([0, 1], c["line"], color=c["line_colour"], linestyle=c["line_style"], marker=c["marker"],
            label=c["label"])
    ax.scatter(*zip(*c["dots"]), color=c["dot_colour"])
    ax.fill_between([0, 1], c["band"], [1.0, 1.0], color="C3")
    ax.bar([2], [c["bar"]], color=c["bar_colour"])
    ax.set_xticks([0, 1], c["ticks"])
    ax.text(0.5, 0.5, c["text"])
    if c["ylim"] is not None:
        ax.set_ylim(*c["ylim"])
    if c["legend"]:
        ax.legend()
    if c["fig_legend"] is not None:
        fig.legend([c["fig_legend"]])
    return fig


def _digest(**change) -> str:
    fig = _figure(**change)
    try:
        return figdata.digest(fig)
    finally:
        plt.close(fig)


CHANGES = {"suptitle": None, "fig_text": "5 seeds", "title": "loss", "xlabel": "epoch", "ylabel": "median",
           "yscale": "log", "ylim": (0.1, 2.0), "ticks": ["a", "c"], "line": [0.5, 0.26], "line_colour": "C4",
           "line_style": "--", "marker": "o", "label": "dr_grpo", "dots": [[1.0, 2.5]], "dot_colour": "C5",
           "band": [0.1, 0.3], "bar": 0.5, "bar_colour": "C6", "text": "p = 0.3", "legend": False,
           "fig_legend": "seeds"}


def test_the_digest_is_twelve_hex_digits_and_the_same_for_the_same_drawing():
    d = _digest()
    assert len(d) == 12 and int(d, 16) >= 0 and _digest() == d


@pytest.mark.parametrize("key", list(CHANGES))
def test_each_thing_a_figure_shows_changes_its_digest(key):
    assert _digest(**{key: CHANGES[key]}) != _digest()


def test_names_down_an_axis_count_however_they_were_set():
    """Variant names as ticks: given with their positions (matplotlib keeps them in a FuncFormatter over a
    FixedLocator), set after them, or as a FixedFormatter; numbers an axis picks itself (a log axis's formatter)
    do not count."""
    def names(set_them):
        fig, ax = plt.subplots()
        ax.plot([0, 1], [1, 10])
        set_them(ax)
        out = [x for x in figdata._axes(ax) if x.startswith("ticks")]
        plt.close(fig)
        return out

    assert names(lambda ax: ax.set_yticks([0, 1], ["grpo", "dr_grpo"])) == ["ticks grpo|dr_grpo at 0,1"]
    assert names(lambda ax: (ax.set_yticks([0, 2]), ax.set_yticklabels(["a", "b"]))) == ["ticks a|b at 0,2"]
    assert names(lambda ax: (ax.yaxis.set_major_locator(matplotlib.ticker.FixedLocator([0, 1])),
                             ax.yaxis.set_major_formatter(matplotlib.ticker.FixedFormatter(["x", "y"])))) \
        == ["ticks x|y at 0,1"]
    assert names(lambda ax: ax.set_yscale("log")) == []
    # a function of the value on ticks the axis picks (plotting.py's log axes), numbers at fixed places
    assert names(lambda ax: ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda y, _: f"{y:g}"))) \
        == []
    assert names(lambda ax: ax.set_yticks([0, 5])) == []


def test_numbers_count_to_six_significant_digits():
    """0.5 and 0.5 + 4e-7 print alike to 6 digits (a last-bit difference between two CPUs' means); 0.500001 does
    not, nor does a change in the sixth digit of a large number."""
    assert figdata._numbers([0.5 + 4e-7, 123456.4]) == "0.5,123456"
    assert _digest(line=[0.5 + 4e-7, 0.25]) == _digest()
    assert _digest(line=[0.500001, 0.25]) != _digest()
    assert _digest(bar=0.75 * (1 + 1e-9)) == _digest()


def test_limits_count_only_where_the_code_set_them():
    """An autoscaled limit is matplotlib's choice (its margins): data that moves it changes the digest through
    the data alone; a limit the code sets is part of the drawing."""
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    auto = figdata._axes(ax)
    assert not any(x.startswith(("xlim", "ylim")) for x in auto)
    ax.set_xlim(0, 2)
    assert "xlim 0,2" in figdata._axes(ax) and not any(x.startswith("ylim") for x in figdata._axes(ax))
    plt.close(fig)


def test_an_artist_it_does_not_know_counts_by_its_kind_and_the_note_is_an_html_comment():
    from matplotlib.patches import Circle
    assert figdata._artist(Circle((0, 0), 1)) == ["Circle"]
    fig = _figure()
    assert figdata.note("curves.png", fig) == f"<!-- curves.png: figure data {figdata.digest(fig)} -->"
    plt.close(fig)
