"""What a figure shows, as a short digest: the data and words it draws, not its pixels.

REPORT.md and COMPARE.md write each figure's digest beside its link, so a test can hold a committed figure
to what today's code draws from the directory's files without rasterizing anything: comparing PNG bytes
would hold the figures to one matplotlib, one FreeType and one libpng as well, and would cost a redraw of
every figure. The digest covers, per axes, the title, labels, scales, limits that were set (not autoscaled
ones, which matplotlib's margins decide), fixed tick labels (variant names), every line's, collection's
(bands, dots) and patch's (bars) data and colour, and texts; of the figure, its title and legends. Numbers
are rounded to 6 significant digits, so a last-bit difference in a mean does not count.
"""
from __future__ import annotations

import hashlib

import numpy as np
from matplotlib import ticker
from matplotlib.collections import Collection
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle

DIGITS = 6


def _numbers(values) -> str:
    a = np.asarray(values, dtype=float).ravel()
    return ",".join(f"{v:.{DIGITS}g}" for v in a)


def _artist(a) -> list[str]:
    if isinstance(a, Line2D):
        return ["line", str(a.get_label()), str(a.get_color()), str(a.get_linestyle()), str(a.get_marker()),
                _numbers(a.get_xydata())]
    if isinstance(a, Collection):
        out = [type(a).__name__, _numbers(a.get_offsets()), _numbers(a.get_facecolor())]
        return out + [_numbers(p.vertices) for p in a.get_paths()]
    if isinstance(a, Rectangle):
        return ["rect", _numbers([*a.get_xy(), a.get_width(), a.get_height()]), _numbers(a.get_facecolor())]
    return [type(a).__name__]


def _axes(ax) -> list[str]:
    out = [ax.get_title(), ax.get_xlabel(), ax.get_ylabel(), ax.get_xscale(), ax.get_yscale()]
    if not ax.get_autoscalex_on():
        out.append("xlim " + _numbers(ax.get_xlim()))
    if not ax.get_autoscaley_on():
        out.append("ylim " + _numbers(ax.get_ylim()))
    for axis in (ax.xaxis, ax.yaxis):
        fmt, locs = axis.get_major_formatter(), axis.get_ticklocs()
        if isinstance(fmt, ticker.FixedFormatter):  # names set as ticks (variants down an axis)
            out.append("ticks " + "|".join(map(str, fmt.seq)) + " at " + _numbers(locs))
        elif isinstance(fmt, ticker.FuncFormatter) and isinstance(axis.get_major_locator(), ticker.FixedLocator):
            # how matplotlib >= 3.5 keeps names given with their positions (set_yticks(locs, names)): the
            # digest missed every forest plot's variant names until 2026-12 for want of this branch
            out.append("ticks " + "|".join(str(fmt(x, i)) for i, x in enumerate(locs)) + " at " + _numbers(locs))
    for a in [*ax.lines, *ax.collections, *ax.patches]:
        out += _artist(a)
    out += [t.get_text() for t in ax.texts]
    if ax.get_legend() is not None:
        out += [t.get_text() for t in ax.get_legend().get_texts()]
    return out


def digest(fig) -> str:
    """12 hex digits of sha256 over what the figure draws (see the module's docstring)."""
    parts = [fig._suptitle.get_text() if fig._suptitle is not None else ""]
    parts += [t.get_text() for t in fig.texts]
    for legend in fig.legends:
        parts += [t.get_text() for t in legend.get_texts()]
    for ax in fig.axes:
        parts += ["axes", *_axes(ax)]
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:12]


def note(name: str, fig) -> str:
    """The line a report writes after a figure's link: an HTML comment, invisible where the markdown is shown."""
    return f"<!-- {name}: figure data {digest(fig)} -->"
