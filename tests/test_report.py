"""Figures, REPORT.md, `compare` and the gallery, on results directories written by hand.

No training: each test writes ablation.json, summary.csv and metrics.parquet directly, so
the data (and what a figure must show of it) is known exactly. Figures are checked
through matplotlib's objects (Line2D data, band polygons, axis scales) where that is
more precise than pixels, and through the written PNGs where only pixels tell.
"""
import itertools
import json
import math
import re
import warnings
import zlib

import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PathCollection, PolyCollection
from PIL import Image
from scipy import stats

from grpo_bench.analysis import compare as C
from grpo_bench.analysis import figures as F
from grpo_bench.analysis import plotting as P
from grpo_bench.analysis import report as R
from grpo_bench.config.ablation import ablation_record, load_ablation
from grpo_bench.__main__ import main
from helpers import ROOT, cli


def run_main(capsys, *args):
    """The CLI in this process (a subprocess costs seconds of imports): (exit code, stdout, stderr)."""
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def write_results(path, variants, seeds, curve, finals, steps=range(0, 200, 10), eval_steps=(0, 100, 199),
                  name="synth", axes=("variant_name",), failed=()):
    """A results directory as the runner writes it.

    curve(metric, i, seed, step) -> value or None, for the metrics in curve.metrics;
    finals: {summary column: f(i, seed)}; variant i's runs in `failed` have status failed.
    """
    path.mkdir(parents=True, exist_ok=True)
    runs, rows, summary = [], [], []
    for i, v in enumerate(variants):
        for s in seeds:
            run = f"{v}-s{s}"
            runs.append(run)
            for metric in curve.metrics:
                for step in (eval_steps if metric.startswith("eval/") else steps):
                    value = curve(metric, i, s, step)
                    if value is not None:
                        rows.append((run, v, s, step, metric, value))
            ok = (v, s) not in failed
            summary.append({"run": run, "variant": v, "seed": s, "status": "ok" if ok else "failed",
                            "error": "" if ok else "NonFiniteLoss: boom", "wall_s": 1.0,
                            **({c: f(i, s) for c, f in finals.items()} if ok else {})})
    meta = {"name": name, "source": f"ablations/{name}.yaml", "description": f"What {name} asks. More detail.",
            "axes": list(axes), "variants": list(variants), "seeds": list(seeds), "runs": runs}
    (path / "ablation.json").write_text(json.dumps(meta))
    pd.DataFrame(summary).to_csv(path / "summary.csv", index=False)
    pd.DataFrame(rows, columns=["run", "variant", "seed", "step", "metric", "value"]).to_parquet(
        path / "metrics.parquet", index=False)
    return path


class SortLike:
    """A sorting-toy-shaped ablation: rollout reward, eval every 100 steps, heavy-tailed diagnostics."""

    metrics = ["reward/mean", "eval/reward", "eval/accuracy", "clip/frac", "kl/old", "ratio/max", "grad/norm",
               "entropy", "kl/value"]

    def __call__(self, metric, i, seed, step):
        rng = np.random.default_rng(zlib.crc32(f"{metric}|{i}|{seed}|{step}".encode()))
        t = step / 200
        if metric in ("reward/mean", "eval/reward"):
            return 0.1 + 0.3 * t * (i + 1) / 3 + 0.02 * rng.standard_normal()
        if metric == "eval/accuracy":  # near 0 with one seed far off: a t-band would go below 0
            return 0.3 if seed == 0 else 0.0
        if metric == "clip/frac":
            return float(np.clip(0.5 - t + 0.4 * rng.standard_normal(), 0, 1))
        if metric in ("kl/old", "grad/norm"):  # log-normal with rare huge outliers; sometimes exactly 0
            return 0.0 if (i == 0 and step % 30 == 0) else float(np.exp(3 * rng.standard_normal()))
        if metric == "ratio/max":
            return float(1 + np.exp(4 * rng.standard_normal()))
        if metric == "entropy":
            return 2 * (1 - t) + 0.05 * rng.random()
        if metric == "kl/value":  # k1 can be negative: no declared range
            return 0.05 * rng.standard_normal()


SORT_FINALS = {"final/reward": lambda i, s: 0.2 + 0.1 * i + 0.01 * s, "final/eval/accuracy": lambda i, s: 0.01 * s,
               "final/eval/reward": lambda i, s: 0.25 + 0.1 * i - 0.01 * s}


@pytest.fixture(scope="module")
def sort_dir(tmp_path_factory):
    d = write_results(tmp_path_factory.mktemp("sortlike") / "sortlike", ["loss=naive", "loss=unclipped",
                      "loss=clipped"], range(5), SortLike(), SORT_FINALS, axes=("loss",))
    R.make_report(d)
    return d


@pytest.fixture(scope="module")
def few_seeds_dir(tmp_path_factory):
    return write_results(tmp_path_factory.mktemp("few") / "few", ["a", "b"], range(3), SortLike(), SORT_FINALS)


@pytest.fixture(autouse=True)
def close_figures():
    yield
    import matplotlib.pyplot as plt
    plt.close("all")


def all_figures(d):
    return {stem: fig for stem, fig, _ in F.build_figures(d)}


# ------------------------------------------------------------------------- file names


def test_no_two_figures_share_a_file_name(sort_dir):
    figures = F.build_figures(sort_dir)
    stems = [s for s, _, _ in figures]
    assert len(stems) == len(set(stems))
    # eval/reward and reward/mean both end in "reward": the old report drew both into reward_curve.png
    assert "headline" in stems and "curve_eval_reward" in stems and "curve_eval_accuracy" not in stems
    written = sorted(p.name for p in sort_dir.glob("*.png"))
    assert written == sorted(f"{s}.png" for s in stems)
    report = (sort_dir / "REPORT.md").read_text()
    for s in stems:
        assert report.count(f"]({s}.png)") == 1


def test_slugs_of_distinct_metrics_differ():
    names = ["reward/mean", "eval/reward", "eval/pass@k", "eval/accuracy", "eval/accuracy_gain", "eval_train/accuracy"]
    assert len({P.slug(n) for n in names}) == len(names)


def test_single_point_metrics_draw_no_curve(tmp_path):
    # eval only at the end (no eval cadence): its final value is a dot, never a one-point "curve"
    d = write_results(tmp_path / "d", ["a", "b"], range(2), SortLike(), SORT_FINALS, eval_steps=(199,))
    stems = [s for s, _, _ in F.build_figures(d)]
    assert not [s for s in stems if "eval" in s]
    head = all_figures(d)["headline"]
    assert [ax.get_ylabel() for ax in head.axes if ax.get_ylabel()] == ["rollout reward"]


# -------------------------------------------------------------------------- lines, bands


def drawn_lines(fig):
    return [(ax, ln) for ax in fig.axes for ln in ax.get_lines()]


@pytest.mark.parametrize("which", ["sort_dir", "few_seeds_dir"])
def test_every_drawn_line_has_two_points(which, request):
    for stem, fig in all_figures(request.getfixturevalue(which)).items():
        lines = drawn_lines(fig)
        if stem != "final_values":
            assert lines, stem
        for ax, ln in lines:
            assert len(ln.get_xdata()) >= 2, (stem, ax.get_title(), ln.get_gid())
            if ln.get_gid() is not None:  # a variant's curve: a visible line, not markers or nothing
                assert ln.get_linestyle() not in ("None", "", " ") and ln.get_linewidth() > 0, (stem, ln.get_gid())
                assert (ln.get_alpha() is None or ln.get_alpha() > 0) and ln.get_visible(), (stem, ln.get_gid())


def test_a_variant_with_one_point_draws_no_line(tmp_path):
    class OneLate(SortLike):  # variant 1 was evaluated only at the end
        def __call__(self, metric, i, seed, step):
            if metric.startswith("eval/") and i == 1 and step != 199:
                return None
            return super().__call__(metric, i, seed, step)

    for seeds in (range(2), range(5)):  # seeds as lines, and a band
        d = write_results(tmp_path / f"d{len(seeds)}", ["a", "late", "c"], seeds, OneLate(), SORT_FINALS)
        held_out = all_figures(d)["headline"].axes[1]
        assert held_out.get_ylabel() == "held-out accuracy"
        assert {ln.get_gid() for ln in held_out.get_lines()} == {"a", "c"}
        assert all(len(ln.get_xdata()) == 3 for ln in held_out.get_lines())


def band_ys(ax):
    return [p.vertices[:, 1] for c in ax.collections if isinstance(c, PolyCollection) for p in c.get_paths()]


@pytest.mark.parametrize("which", ["sort_dir", "few_seeds_dir"])
def test_no_line_or_band_leaves_the_metric_range(which, request):
    figs = all_figures(request.getfixturevalue(which))
    metric_of = {ax: ax.get_title().split(",")[0] for ax in figs["diagnostics"].axes}
    metric_of |= {ax: m for ax, m in zip([a for a in figs["headline"].axes if a.get_ylabel()],
                                         ["reward/mean", "eval/accuracy"])}
    metric_of |= {ax: "eval/reward" for ax in figs["curve_eval_reward"].axes if ax.get_ylabel()}
    checked = 0
    for ax, metric in metric_of.items():
        r = P.metric_range(metric)
        ys = [ln.get_ydata() for ln in ax.get_lines()] + band_ys(ax)
        for y in ys:
            assert np.all(np.asarray(y) >= r.lo - 1e-12) and np.all(np.asarray(y) <= r.hi + 1e-12), metric
            checked += 1
    assert checked > 10
    # the near-zero accuracy with one seed at 0.3: a mean +- t * sd / sqrt(n) band would reach below 0
    acc = next(ax for ax, m in metric_of.items() if m == "eval/accuracy")
    assert min(np.min(y) for y in [ln.get_ydata() for ln in acc.get_lines()] + band_ys(acc)) == 0.0


def test_bands_follow_the_seed_count(sort_dir, few_seeds_dir):
    five = all_figures(sort_dir)["headline"].axes[0]
    three = all_figures(few_seeds_dir)["headline"].axes[0]
    assert len(band_ys(five)) == 3 and len(five.get_lines()) == 3  # a band and a mean per variant
    assert len(band_ys(three)) == 0 and len(three.get_lines()) == 2 * (3 + 1)  # each seed, then the mean


def test_heavy_tailed_diagnostics_are_on_a_log_scale(sort_dir):
    diag = all_figures(sort_dir)["diagnostics"]
    scales = {ax.get_title().split(",")[0]: ax.get_yscale() for ax in diag.axes if ax.get_title()}
    assert scales["ratio/max"] == "log"
    assert scales["kl/old"] == scales["grad/norm"] == "symlog"  # they hold exact zeros
    assert scales["entropy"] == scales["clip/frac"] == scales["kl/value"] == "linear"


def test_bootstrap_ci_by_hand():
    # two seeds {0, 1}: resampled means are 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4
    lo, hi = P.bootstrap_mean_ci(np.array([[0.0, 1.0], [2.0, 2.0]]), n_boot=4000)
    assert (lo[0], hi[0]) == (0.0, 1.0) and (lo[1], hi[1]) == (2.0, 2.0)
    # a missing seed (NaN) is left out, not counted as zero
    lo, hi = P.bootstrap_mean_ci(np.array([[3.0, np.nan, 3.0]]))
    assert (lo[0], hi[0]) == (3.0, 3.0)


def test_metric_range_table():
    r = P.metric_range
    assert (r("eval/accuracy").lo, r("eval/accuracy").hi) == (0, 1)
    assert (r("final/eval/accuracy_gain").lo, r("eval/accuracy_gain").hi) == (-1, 1)
    for frac in ["clip/frac", "clip/low_frac", "clip/high_frac", "reward/zero_std_frac", "filter/kept_frac",
                 "eval/pass@k", "eval_train/accuracy"]:
        assert (r(frac).lo, r(frac).hi, r(frac).heavy) == (0, 1, False), frac
    for heavy in ["ratio/max", "ratio/min", "grad/norm", "kl/old"]:
        assert r(heavy).lo == 0 and r(heavy).heavy, heavy
    assert r("entropy").lo == 0 and not r("entropy").heavy
    assert r("kl/value") == r("reward/mean") == r("loss/policy") == P.Range()
    # every row of the table: what each metric the trainer and tasks log can be
    for m in ["reward/format", "reward/solved", "response/finished", "eval/accuracy", "eval/pass@k"]:
        assert (r(m).lo, r(m).hi, r(m).heavy) == (0, 1, False), m
    for m in ["entropy", "reward/std", "delta/abs_mean", "response/length"]:
        assert (r(m).lo, r(m).hi, r(m).heavy) == (0, math.inf, False), m
    for m in ["time/step_s", "ratio/min", "grad/norm"]:
        assert (r(m).lo, r(m).hi, r(m).heavy) == (0, math.inf, True), m
    assert (r("eval/accuracy_gain").lo, r("eval/accuracy_gain").hi, r("eval/accuracy_gain").heavy) == (-1, 1, False)


def test_diagnostics_pick_up_new_metric_names():
    found = F.diagnostics_in(["reward/mean", "clip/low_frac", "clip/high_frac", "reward/zero_std_frac",
                              "filter/kept_frac", "entropy", "time/step_s"])
    assert found == ["clip/high_frac", "clip/low_frac", "entropy", "reward/zero_std_frac", "filter/kept_frac"]


# ------------------------------------------------------------------------ paper-ready


def test_headline_is_the_tasks_main_metric(sort_dir, tmp_path):
    head = all_figures(sort_dir)["headline"]
    assert [ax.get_ylabel() for ax in head.axes if ax.get_ylabel()] == ["rollout reward", "held-out accuracy"]
    assert "3 variants of loss, 5 seeds" in head._suptitle.get_text()

    class LMLike(SortLike):
        metrics = ["reward/mean", "eval/accuracy", "eval/accuracy_gain", "eval/pass@k"]

        def __call__(self, metric, i, seed, step):
            return step / 1000 + 0.1 * i if metric in ("eval/accuracy_gain", "eval/pass@k") \
                else super().__call__(metric, i, seed, step)

    finals = {"final/reward": lambda i, s: 0.3, "final/eval/accuracy": lambda i, s: 0.1 * i,
              "final/eval/accuracy_gain": lambda i, s: 0.1 * i - 0.2, "final/eval/pass@k": lambda i, s: 0.5}
    d = write_results(tmp_path / "lm", ["a", "b", "c"], range(3), LMLike(), finals)
    head = all_figures(d)["headline"]
    assert [ax.get_ylabel() for ax in head.axes if ax.get_ylabel()] == ["held-out accuracy", "rollout reward"]
    assert R.main_column(pd.read_csv(d / "summary.csv")) == "final/eval/accuracy"


def test_same_variant_same_colour_in_every_figure(sort_dir):
    colours: dict = {}
    for stem, fig in all_figures(sort_dir).items():
        for ax in fig.axes:
            artists = ax.get_lines() + [c for c in ax.collections if c.get_gid()]
            for a in artists:
                if a.get_gid() is None:
                    continue
                c = a.get_color() if hasattr(a, "get_xdata") else a.get_facecolor()[0][:3]
                colours.setdefault(a.get_gid(), set()).add(tuple(np.round(matplotlib_rgb(c), 3)))
    assert set(colours) == {"loss=naive", "loss=unclipped", "loss=clipped"}
    assert all(len(c) == 1 for c in colours.values()), colours
    assert len({next(iter(c)) for c in colours.values()}) == 3


def matplotlib_rgb(c):
    from matplotlib.colors import to_rgb
    return to_rgb(c)


def test_twelve_variants_stay_legible_and_bounded(tmp_path):
    names = [f"kl=k{i % 3 + 1},ref_refresh={10 * i},lr=0.00{i}" for i in range(12)]
    d = write_results(tmp_path / "wide", names, range(5), SortLike(), SORT_FINALS)
    for stem, fig in all_figures(d).items():
        w, h = fig.get_size_inches() * 200
        assert w <= 1400 and h <= 1800, (stem, w, h)
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        box = fig.bbox
        for ax in fig.axes:
            lo, hi = sorted(ax.get_ylim())
            labels = [t for t in ax.get_yticklabels() if t.get_text() and t.get_visible() and lo <= t.get_position()[1] <= hi]
            boxes = [t.get_window_extent(renderer) for t in labels]
            assert all(b.x0 >= box.x0 - 1 and b.x1 <= box.x1 + 1 for b in boxes), stem  # not cut off
            ys = sorted((b.y0, b.y1) for b in boxes)
            assert all(y1 <= y0_next + 0.5 for (_, y1), (y0_next, _) in zip(ys, ys[1:])), stem  # no overlap
        legends = fig.legends
        if legends:
            lb = legends[0].get_window_extent(renderer)
            assert lb.x0 >= box.x0 - 1 and lb.x1 <= box.x1 + 1 and lb.y0 >= box.y0 - 1, stem
        if fig._suptitle is not None:  # a title that runs off the edges is cut in the PNG
            tb = fig._suptitle.get_window_extent(renderer)
            assert tb.x0 >= box.x0 - 1 and tb.x1 <= box.x1 + 1, (stem, fig._suptitle.get_text())
    # every variant gets its own (colour, dash) pair
    styles = P.variant_styles(names)
    assert len({(s["color"], s["ls"]) for s in styles.values()}) == 12


def coloured_share(png) -> tuple[float, float]:
    a = np.asarray(Image.open(png).convert("RGB"), dtype=float)
    chroma = a.max(-1) - a.min(-1)
    return float(a.std()), float((chroma > 60).mean())


def test_written_images_are_not_blank(sort_dir, tmp_path):
    pngs = sorted(sort_dir.glob("*.png"))
    assert len(pngs) >= 4
    for png in pngs:
        std, share = coloured_share(png)
        assert std > 10 and share > 0.001, (png.name, std, share)
    # the measure itself: axes with nothing drawn in them (the old blank headline) fail it
    import matplotlib.pyplot as plt
    with P.style():
        fig, ax = plt.subplots(figsize=(P.COLUMN_IN, 2.5))
        ax.set(xlim=(1420, 1580), title="blank", xlabel="gradient step")
        P.save(fig, tmp_path, "blank", "png")
    assert coloured_share(tmp_path / "blank.png")[1] < 0.001


@pytest.mark.parametrize("fmt", ["pdf", "svg"])
def test_other_formats(tmp_path, few_seeds_dir, fmt, capsys):
    import shutil
    d = shutil.copytree(few_seeds_dir, tmp_path / "d")
    code, _, err = run_main(capsys, "plot", d, "--format", fmt)
    assert code == 0, err
    made = sorted(p.name for p in d.glob(f"*.{fmt}"))
    assert "headline." + fmt in made and not list(d.glob("*.png"))
    head = (d / f"headline.{fmt}").read_bytes()
    assert head.startswith(b"%PDF") if fmt == "pdf" else b"<svg" in head[:2000]
    assert f"](headline.{fmt})" in (d / "REPORT.md").read_text()


def test_bad_plot_format_is_one_line_exit_2(few_seeds_dir, tmp_path, capsys):
    code, _, err = run_main(capsys, "plot", few_seeds_dir, "--format", "jpg")
    assert code == 2 and err.count("\n") == 1 and "'jpg'" in err and "png, pdf, svg" in err
    (tmp_path / "ablation.json").write_text("{}")
    code, _, err = run_main(capsys, "plot", tmp_path)
    assert code == 2 and err.count("\n") == 1 and "no summary.csv" in err


# ----------------------------------------------------------------------------- report


def test_report_is_rebuilt_identically_from_files_alone(tmp_path):
    d = write_results(tmp_path / "d", ["a", "b"], range(3), SortLike(), SORT_FINALS, failed={("b", 2)})
    R.make_report(d)
    first = {p.name: p.read_bytes() for p in d.iterdir() if p.suffix in (".md", ".png")}
    for name in first:
        (d / name).unlink()
    res = cli("plot", d)
    assert res.returncode == 0, res.stderr
    again = {p.name: p.read_bytes() for p in d.iterdir() if p.suffix in (".md", ".png")}
    assert again == first  # the same bytes: no dates, a fixed bootstrap seed and jitter
    text = first["REPORT.md"].decode()
    assert "Failed runs" in text and "b-s2" in text and "5 runs finished, 1 failed" in text


def test_significance_is_reported_when_variants_really_differ():
    s = pd.DataFrame({"variant": ["a"] * 5 + ["b"] * 5 + ["c"] * 5, "status": "ok",
                      "final/reward": [0.50, 0.52, 0.49, 0.51, 0.50, 0.80, 0.79, 0.82, 0.81, 0.80,
                                       0.51, 0.49, 0.52, 0.50, 0.50]})
    tests = {(t["a"], t["b"]): t for t in R.pairwise(s, "final/reward", ["a", "b", "c"])}
    assert tests[("a", "b")]["significant"] and tests[("b", "c")]["significant"]
    assert not tests[("a", "c")]["significant"]
    assert all(t["p_holm"] >= t["p"] for t in tests.values())
    assert R.answer(s, "final/reward", ["a", "b", "c"]) == (
        "`b` is best (final reward 0.804 ± 0.011, 5 seeds), beyond seed noise above both others; "
        "2 of 3 pairs differ beyond seed noise (`b` > `a`, `b` > `c`).")


def test_answer_when_the_best_is_within_noise():
    s = pd.DataFrame({"variant": ["a"] * 3 + ["b"] * 3, "status": "ok",
                      "final/reward": [0.1, 0.5, 0.3, 0.35, 0.2, 0.4]})
    assert R.answer(s, "final/reward", ["a", "b"]).startswith(
        "`b` is best (final reward 0.317 ± 0.104, 3 seeds), but not beyond seed noise above the other; 0 of 1")


# ---------------------------------------------------------------------------- compare


def dir_with_means(path, name, means: dict, column="final/reward", seeds=3):
    """Per-seed values mean +- 0.01, so each variant's mean is exactly means[v]."""
    finals = {column: lambda i, s, m=list(means.values()): m[i] + 0.01 * (s - 1)}
    return write_results(path / name, list(means), range(seeds), SortLike(), finals, name=name)


def test_compare_table_and_kendall_tau_by_hand(tmp_path):
    a = dir_with_means(tmp_path, "toy", {"w": 0.1, "x": 0.2, "y": 0.3, "z": 0.4, "only_toy": 0.9})
    b = dir_with_means(tmp_path, "lm", {"x": 0.3, "w": 0.1, "y": 0.2, "z": 0.4, "only_lm": 0.0},
                       column="final/eval/accuracy")
    res = cli("compare", a, b, "--out", tmp_path / "cmp")
    assert res.returncode == 0, res.stderr
    text = (tmp_path / "cmp" / "COMPARE.md").read_text()
    # 4 shared variants, one pair (x, y) swapped: 5 concordant, 1 discordant -> tau = 4/6;
    # exact two-sided p = 2 * P(at most 1 inversion among 4! orders) = 2 * (1 + 3) / 24
    assert "| toy: final reward | lm: eval accuracy | 4 | +0.667 | 0.333 |" in text
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:4]]
            for line in text.splitlines() if line.startswith("| `") and " vs " not in line}
    # seeds m - 0.01, m, m + 0.01: sd 0.01, t CI m -+ t(0.975, 2) 0.01 / sqrt(3) = m -+ 0.0248; IQM of 3 = the mean
    assert rows["`y`"] == ["0.300 [0.275, 0.325], IQM 0.300 (3)", "0.200 [0.175, 0.225], IQM 0.200 (3)"]
    assert rows["`only_toy`"] == ["0.900 [0.875, 0.925], IQM 0.900 (1)", "—"]
    assert rows["`only_lm`"] == ["—", "0.000 [-0.025, 0.025], IQM 0.000 (5)"]
    assert list(rows) == ["`w`", "`x`", "`y`", "`z`", "`only_toy`", "`only_lm`"]
    # every pair of the four shared variants, tested in each directory: the same seed offsets in every
    # variant make each difference constant across seeds, so every pair is decided (paired, no noise)
    pairs = {line.split(" | ")[0][2:]: line.split(" | ")[1:] for line in text.splitlines() if " vs `" in line}
    assert list(pairs) == [f"`{a}` vs `{b}`" for a, b in itertools.combinations("wxyz", 2)]
    toy, lm, agree = pairs["`x` vs `y`"]
    assert toy.startswith("`y` > `x`; Δ -0.100; paired t, ρ +1.00; p_holm 0; ") and lm.startswith("`x` > `y`; Δ +0.100")
    assert agree == "opposite |" and pairs["`w` vs `z`"][2] == "the same |"
    # both directories record a toy task, whose verdict metric (held-out reward) neither column is: no margin
    assert "- toy: final reward: 6 pairs Holm-corrected together; equivalence margin none (no margin declared" in text
    assert "- lm: eval accuracy: 6 pairs Holm-corrected together; equivalence margin none (no margin declared" in text
    assert (tmp_path / "cmp" / "compare.png").stat().st_size > 0
    assert coloured_share(tmp_path / "cmp" / "compare.png")[1] > 0.001
    tau, p, n = C.kendall(C.load_side(a, None).means, C.load_side(b, None).means)
    assert n == 4 and math.isclose(tau, 2 / 3) and math.isclose(p, 1 / 3)


def test_compare_calls_no_negligible_difference_a_disagreement(tmp_path):
    # x - y is +0.010 on one task and -0.010 on the other, each exact across seeds (significant) and inside the
    # claim's margin of 0.05: negligible both ways, so no task decided an order and none disagrees;
    # w - y is +0.100 and -0.100, beyond the margin: opposite
    a = dir_with_means(tmp_path, "one", {"w": 0.61, "x": 0.52, "y": 0.51})
    b = dir_with_means(tmp_path, "two", {"w": 0.41, "x": 0.50, "y": 0.51})
    for d in (a, b):
        meta = json.loads((d / "ablation.json").read_text())
        (d / "ablation.json").write_text(json.dumps(meta | {"claim": {"margin": 0.05}}))
    res = cli("compare", a, b, "--out", tmp_path / "cmp")
    assert res.returncode == 0, res.stderr
    rows = {line.split(" | ")[0][2:]: line for line in (tmp_path / "cmp" / "COMPARE.md").read_text().splitlines()
            if " vs `" in line}
    assert "negligible" in rows["`x` vs `y`"] and rows["`x` vs `y`"].endswith("| — |")
    assert rows["`w` vs `y`"].endswith("| opposite |")


def test_kendall_w_by_hand_and_by_spearman():
    S = lambda vals, names="abcd": pd.Series(vals, index=list(names))  # noqa: E731
    # three tasks, four variants: rank sums 4, 7, 8, 11 (mean 7.5), S = 12.25 + 0.25 + 0.25 + 12.25 = 25;
    # W = 12 S / (m^2 (n^3 - n)) = 300 / (9 * 60) = 5/9
    w, p, m, n = C.kendall_w([S([1, 2, 3, 4]), S([2, 1, 3, 4]), S([1, 4, 2, 3])])
    assert (m, n) == (3, 4) and math.isclose(w, 5 / 9)
    # the same order on three tasks: W = 1, and only the 4! orders of each of the other two tasks that match
    # the first reach it: p = 1/24^2, to within the 20,000 draws' resolution
    w, p, _, _ = C.kendall_w([S([1, 2, 3, 4])] * 3)
    assert w == 1 and abs(p - 1 / 576) < 0.001
    # two tasks: W = (Spearman's rho + 1) / 2, ties included (scipy's rho, corrected here by hand in W)
    a, b = S([0.1, 0.3, 0.3, 0.9, 0.5], "abcde"), S([0.2, 0.1, 0.4, 0.4, 0.8], "abcde")
    w, p, _, n = C.kendall_w([a, b])
    assert n == 5 and math.isclose(w, (stats.spearmanr(a, b).statistic + 1) / 2)
    # reversed on two tasks: no agreement at all; p = 1 (every shuffle agrees at least that much)
    w, p, _, _ = C.kendall_w([S([1, 2, 3, 4]), S([4, 3, 2, 1])])
    assert w == 0 and p == 1
    # only the variants every task ran; fewer than three shared, or one task: no W
    w, _, _, n = C.kendall_w([S([1, 2, 3, 4]), S([1, 2, 3], "abc"), S([3, 2, 1, 0], "dcba")])
    assert n == 3 and w == 1
    assert math.isnan(C.kendall_w([S([1, 2], "ab"), S([1, 2], "ab")])[0])
    assert math.isnan(C.kendall_w([S([1, 2, 3, 4])])[0])


def test_compare_figure_rows_line_up(tmp_path):
    a = dir_with_means(tmp_path, "a", {"p": 0.1, "q": 0.2})
    b = dir_with_means(tmp_path, "b", {"q": 0.5, "r": 0.1})
    with P.style():
        fig = C.figure([C.load_side(a, None), C.load_side(b, None)])
    ys = {}
    for ax in fig.axes:
        for c in ax.collections:
            if isinstance(c, PathCollection) and c.get_gid():
                ys.setdefault(c.get_gid(), set()).update(np.round(c.get_offsets()[:, 1]).astype(int).tolist())
    assert ys == {"p": {0}, "q": {1}, "r": {2}}  # q sits on the same row in both panels
    assert "Kendall τ" not in fig._suptitle.get_text()  # one shared variant: no order to correlate


def test_compare_panels_of_one_metric_share_their_x_axis(tmp_path):
    # two starts 0.09 apart once drew on their own axes, each filling its panel: the shift was invisible
    a = dir_with_means(tmp_path, "a", {"p": 0.8, "q": 0.82})
    b = dir_with_means(tmp_path, "b", {"p": 0.70, "q": 0.72})
    c = dir_with_means(tmp_path, "c", {"p": 0.1, "q": 0.2}, column="final/eval/reward")
    with P.style():
        same = C.figure([C.load_side(a, None), C.load_side(b, None)])
        other = C.figure([C.load_side(a, None), C.load_side(c, None)])
    lims = [ax.get_xlim() for ax in same.axes]
    assert lims[0] == lims[1] and lims[0][0] < 0.72 and lims[0][1] > 0.8
    assert other.axes[0].get_xlim() != other.axes[1].get_xlim()  # different metrics keep their own scales


def test_compare_title_fits_the_figure(tmp_path):
    # the real policy_losses_sort vs policy_losses_lm title once ran off both edges
    names = ("policy_losses_sort", "policy_losses_lm")
    dirs = [dir_with_means(tmp_path, n, {v: 0.1 * i for i, v in enumerate(["dapo", "gspo", "cispo", "sapo", "gmpo"])})
            for n in names]
    with P.style():
        fig = C.figure([C.load_side(d, None) for d in dirs])
        fig.canvas.draw()
        box = fig._suptitle.get_window_extent()
    assert "Kendall τ" in fig._suptitle.get_text()
    assert box.x0 >= 0 and box.x1 <= fig.bbox.width


def test_compare_panel_titles_stay_apart(tmp_path):
    # three starts' panels titled sampler_mismatch_lm_seed<N> ran into each other
    names = ("sampler_mismatch_lm", "sampler_mismatch_lm_seed1", "sampler_mismatch_lm_seed2")
    dirs = [dir_with_means(tmp_path, n, {"fresh": 0.8, "none_k16": 0.4}) for n in names]
    with P.style():
        fig = C.figure([C.load_side(d, None) for d in dirs])
        fig.canvas.draw()
        boxes = [ax.title.get_window_extent() for ax in fig.axes]
        default_size = fig.axes[0].title.get_fontsize()
    import matplotlib as mpl
    with P.style():
        assert default_size == mpl.font_manager.FontProperties(size=mpl.rcParams["axes.titlesize"]).get_size_in_points()
    assert [ax.get_title() for ax in fig.axes] == ["lm (3 seeds)", "lm_seed1 (3 seeds)", "lm_seed2 (3 seeds)"]
    assert all(a.x1 <= b.x0 for a, b in zip(boxes, boxes[1:]))
    assert all(n in fig._suptitle.get_text() for n in names)   # the title still names each in full
    # names that share no word keep theirs, and a title too wide for its panel shrinks until it fits
    for n in (14, 40):  # 14: fits half a point under the default; 40: at the 6-point floor, on two lines
        long = [dir_with_means(tmp_path, "x" * n + str(i), {"fresh": 0.8}) for i in range(3)]
        with P.style(), warnings.catch_warnings():
            # 40 once squeezed a four-line title block into the 1.12 inches of one variant's figure:
            # constrained_layout gave up, the titles ran into each other and the x labels fell off the page
            warnings.simplefilter("error")
            fig = C.figure([C.load_side(d, None) for d in long])
            r = fig.canvas.get_renderer()
            for ax in fig.axes:  # shrunk in half points, no further than it must (as laid out when it shrank)
                size = ax.title.get_fontsize()
                assert 6 <= size < default_size
                if size > 6:
                    ax.title.set_fontsize(size + 0.5)
                    assert ax.title.get_window_extent(r).width > ax.get_window_extent(r).width
                    ax.title.set_fontsize(size)
            fig.canvas.draw()
        assert [ax.get_title().count("\n") for ax in fig.axes] == [int(n == 40)] * 3
        # one variant's 0.9 + 0.22 inches hold two title lines over one-line panel titles; at 40 the title takes a
        # third line of 8.5 points (matplotlib's wrap) and the panel titles a second of 6, each 1.2 lines high
        assert fig.get_figheight() == pytest.approx(1.12 + (n == 40) * 1.2 * (8.5 + 6) / 72, abs=1e-12)
        assert all(ax.get_title().replace("\n", "").startswith("x" * n) for ax in fig.axes)
        top = fig._suptitle.get_window_extent()
        assert top.y1 <= fig.bbox.y1 + 1 and top.x0 >= -1 and top.x1 <= fig.bbox.x1 + 1
        for ax in fig.axes:
            t, box = ax.title.get_window_extent(), ax.get_window_extent()
            assert box.x0 <= t.x0 and t.x1 <= box.x1 and box.y1 <= t.y0 and t.y1 <= top.y0   # its panel's, under the title
            assert box.height > 10 and ax.xaxis.label.get_window_extent().y0 >= -1   # room to plot; the label on the page


def test_wrap_breaks_at_spaces_then_underscores_then_anywhere():
    from grpo_bench.analysis import plotting as P
    wide = lambda s: len(s) > 10   # noqa: E731: ten characters a line, by hand
    assert P.wrap("ab cd efg hij", wide) == "ab cd efg\nhij"          # greedy: as many words as fit
    assert P.wrap("ab policy_losses_countdown x", wide) == "ab\npolicy_\nlosses_\ncountdown\nx"
    assert P.wrap("abcdefghijklmnopqrstuvwxyz", wide) == "abcdefghij\nklmnopqrst\nuvwxyz"   # no underscore: anywhere
    assert P.wrap("aaaaaaaaaaaa_b c", wide) == "aaaaaaaaaa\naa_b c"      # a piece too wide alone is cut, the rest fills on
    assert P.wrap("one two three\nfour", wide) == "one two\nthree\nfour"   # its own lines kept
    assert P.wrap("fits here", wide) == "fits here" and P.wrap("", wide) == ""


def test_a_text_exactly_as_wide_as_its_room_fits():
    import matplotlib.pyplot as plt
    from matplotlib.font_manager import FontProperties

    from grpo_bench.analysis import plotting as P
    fig = plt.figure(dpi=100)
    width = fig.canvas.get_renderer().get_text_width_height_descent("policy_losses", FontProperties(size=8),
                                                                     ismath=False)[0]
    assert not P.text_wider_than(fig, 8, width)("policy_losses")
    assert P.text_wider_than(fig, 8, width - 0.01)("policy_losses")
    assert P.text_wider_than(fig, 9, width)("policy_losses")   # the size it was given, not the figure's default


def test_variants_at_exactly_zero_are_no_size_to_stretch_the_axis_from():
    """A variant 50x the typical one puts the axis on symlog, linear up to the typical size. Variants without KL
    log exactly 0: they are no size (a median of 0 would ask symlog for a linear range of 0, which it refuses)."""
    import matplotlib.pyplot as plt

    def yscale(scale):
        rows = [(f"{v}-s{s}", v, st, "kl/seq", x * (1 + st)) for v, x in scale.items() for s in range(2) for st in range(3)]
        fig, ax = plt.subplots()
        P.draw_curves(ax, curves_from(rows), "kl/seq", list(scale), P.variant_styles(list(scale)))
        return ax.get_yscale(), getattr(ax.yaxis.get_transform(), "linthresh", None)

    # sizes (largest |mean| over steps 0-2, x 3): 1.5, 3, 6, 900; 900 > 50 x the upper median, 6, its linear range
    assert yscale({"a": 300.0, "b": 1.0, "c": 2.0, "d": 0.5}) == ("symlog", 6.0)
    assert yscale({"a": 300.0, "b": 1.0, "c": 0.0, "d": 0.0, "e": 0.0}) == ("linear", None)


def test_compare_metric_per_directory(tmp_path, capsys):
    a = dir_with_means(tmp_path, "a", {"p": 0.1, "q": 0.2, "r": 0.3})
    b = dir_with_means(tmp_path, "b", {"p": 0.3, "q": 0.2, "r": 0.1}, column="final/eval/reward")
    code, out, err = run_main(capsys, "compare", a, b, "--metric", "reward", "--metric", "eval/reward",
                              "--out", tmp_path / "o")
    assert code == 0, err
    assert "| a: final reward | b: eval reward | 3 | -1.000 |" in out


@pytest.mark.parametrize("args,words", [
    (["{a}"], ["<dirs>", "two or more", "got 1"]),
    (["{a}", "{tmp}/nope"], ["nope", "not a results directory", "ablation.json"]),
    (["{a}", "{b}", "--metric", "accuracy"], ["summary.csv", "--metric", "'accuracy'", "valid: final/reward"]),
    (["{a}", "{b}", "--metric", "reward", "--metric", "reward", "--metric", "reward"], ["--metric", "one per"]),
    (["{a}", "{b}", "--format", "gif"], ["--format", "'gif'", "png, pdf, svg"]),
])
def test_compare_bad_input_is_one_line_exit_2(tmp_path, args, words, capsys):
    a = dir_with_means(tmp_path, "a", {"p": 0.1, "q": 0.2})
    b = dir_with_means(tmp_path, "b", {"p": 0.1, "q": 0.2})
    code, out, err = run_main(capsys, "compare", *[x.format(a=a, b=b, tmp=tmp_path) for x in args],
                              "--out", tmp_path / "o")
    assert code == 2, out + err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for w in words:
        assert w in err, (w, err)
    assert not (tmp_path / "o").exists()  # nothing half-written


# ---------------------------------------------------------------------------- gallery


def test_gallery_from_files(tmp_path, capsys):
    dir_with_means(tmp_path, "second", {"p": 0.1, "q": 0.5})
    first = write_results(tmp_path / "first", ["a", "b"], range(5), SortLike(), SORT_FINALS, name="first")
    (first / "headline.png").write_bytes(b"png")
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "benchmarks.md").write_text("x")
    code, _, err = run_main(capsys, "gallery", tmp_path)
    assert code == 0, err
    text = (tmp_path / "README.md").read_text()
    assert text.index("## [first](first/REPORT.md)") < text.index("## [second](second/REPORT.md)")
    assert "**Question.** What first asks." in text and "More detail" not in text
    assert "![first headline](first/headline.png)" in text and "second/headline" not in text
    assert ("**Answer** (final reward): `b` is best (final reward 0.320 ± 0.016, 5 seeds), beyond seed noise "
            "above the other; 1 of 1 pairs differ beyond seed noise.") in text
    assert "(kernels/benchmarks.md)" in text and "FINDINGS.md" not in text
    (tmp_path / "FINDINGS.md").write_text("x")
    assert "- [FINDINGS.md](FINDINGS.md)" in C.gallery_text(tmp_path)
    # a second run of one ablation file (another lr, say) is its own entry, titled by its folder
    write_results(tmp_path / "first_lr1e-4", ["a", "b"], range(5), SortLike(), SORT_FINALS, name="first")
    text = C.gallery_text(tmp_path)
    assert "## [first](first/REPORT.md)" in text and "## [first_lr1e-4](first_lr1e-4/REPORT.md)" in text


def test_committed_gallery_is_current():
    # results/README.md is generated: a result changed without `gallery` re-run fails here
    assert C.gallery_text(ROOT / "results") == (ROOT / "results" / "README.md").read_text()


def test_gallery_of_a_folder_without_results_is_exit_2(tmp_path, capsys):
    code, _, err = run_main(capsys, "gallery", tmp_path)
    assert code == 2 and "holds no results directory" in err and err.count("\n") == 1


def test_gallery_question_is_the_first_sentence():
    assert C.question("Dr. GRPO vs. GSPO, e.g. on a toy. Then more.") == "Dr. GRPO vs. GSPO, e.g. on a toy."
    assert C.question("K = 10 inner steps. nanochat is on-policy.") == "K = 10 inner steps."


def test_main_column_ignores_empty_and_non_final_columns():
    s = pd.DataFrame({"variant": ["a"], "status": ["ok"], "final/reward": [0.3],
                      "final/eval/accuracy_gain": [float("nan")], "eval/accuracy_gain": [0.2]})
    assert R.main_column(s) == "final/reward"   # an all-NaN final column is not a task's metric
    assert R.main_column(s.drop(columns=["final/reward"])) is None


def test_percentiles_per_row_with_missing_values():
    x = np.array([[1.0, 2.0, 3.0], [4.0, np.nan, 6.0], [np.nan, np.nan, np.nan]])
    with np.errstate(all="ignore"):
        assert P._percentiles(x, 50)[:2].tolist() == [2.0, 5.0] and np.isnan(P._percentiles(x, 50)[2])


def test_curves_are_smoothed_over_a_twentieth_of_the_run():
    rows = [("r", "a", 0, step, "reward/mean", float(step % 2)) for step in range(40)]
    curves = P.by_metric(pd.DataFrame(rows, columns=["run", "variant", "seed", "step", "metric", "value"]))
    table = P.run_matrices(curves, "reward/mean", ["a"])["a"]
    # 40 steps: a rolling mean over 2, so the alternating 0, 1 becomes 0, 0.5, 0.5, ...
    assert table["r"].tolist() == [0.0] + [0.5] * 39
    short = P.by_metric(pd.DataFrame(rows[:39], columns=["run", "variant", "seed", "step", "metric", "value"]))
    assert P.run_matrices(short, "reward/mean", ["a"])["a"]["r"].tolist() == [float(s % 2) for s in range(39)]


def test_band_captions_switch_at_five_seeds():
    # BAND_SEEDS = 5: four seeds are drawn one by one, five get a band (as the figures do)
    assert P.describe_band("reward/mean", 4) == "thin lines: each of 4 seeds; bold: their mean"
    assert P.describe_band("reward/mean", 5) == "mean over 5 seeds, band: 95% bootstrap CI of the mean"
    assert P.describe_band("ratio/max", 4) == "thin lines: each of 4 seeds; bold: their median"
    assert P.describe_band("ratio/max", 5) == "median and quartiles over seeds, log scale"


def test_main_column_reads_only_final_columns_with_values():
    # a per-step column named like the main metric is not a summary of the run
    s = pd.DataFrame({"variant": ["a"], "eval/accuracy_gain": [0.1], "eval/accuracy": [0.5],
                      "final/eval/accuracy": [float("nan")]})
    assert R.main_column(s) is None


def test_report_markdown_by_hand():
    import statistics
    finals = {"a": [0.50, 0.52, 0.49, 0.51, 0.50], "b": [0.80, 0.79, 0.82, 0.81, 0.80],
              "c": [0.51, 0.49, 0.52, 0.50, 0.50]}
    rows = [{"run": f"{v}-s{s}", "variant": v, "seed": s, "status": "ok", "error": "", "wall_s": 2.0,
             "final/reward": x} for v, xs in finals.items() for s, x in enumerate(xs)]
    rows.append({"run": "c-s5", "variant": "c", "seed": 5, "status": "failed", "error": "boom | bang", "wall_s": 1.0})
    summary = pd.DataFrame(rows)
    meta = {"name": "t", "description": "Does b beat a?", "source": "t.yaml", "seeds": list(range(6)),
            "runs": list(summary.run) + ["never-ran"]}
    md = R._markdown(meta, summary, summary[summary.status == "ok"], [("final/reward", "final reward", "reward/mean")],
                     ["a", "b", "c"], [("curves.png", "the curves", "<!-- data -->")]).splitlines()
    assert md[:4] == ["# Ablation: t", "", "Does b beat a?", ""]
    assert md[4].startswith("Source `t.yaml`; seeds [0, 1, 2, 3, 4, 5]; 15 runs finished, 1 failed, 1 not run.")
    cell = {v: f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs):.3f}" for v, xs in finals.items()}
    assert f"| `a` | 5/5 | {cell['a']} | 2.0 |" in md and f"| `c` | 5/6 | {cell['c']} | 2.0 |" in md
    # b against a and c is beyond noise, a against c is not: paired on seeds 0-4 (c's failed seed 5 drops out)
    assert "3 pairs, Holm-corrected together; equivalence margin none (no margin declared for this metric): no " \
        "equivalence test." in md
    pairs = {line.split(" | ")[0][2:]: line.split(" | ")[1:] for line in md if " vs `" in line}
    x = {v: np.array(xs) for v, xs in finals.items()}
    p = [stats.ttest_rel(x["a"], x["b"]).pvalue, stats.ttest_rel(x["a"], x["c"]).pvalue,
         stats.ttest_rel(x["b"], x["c"]).pvalue]
    from statsmodels.stats.multitest import multipletests
    holm = multipletests(p, method="holm")[1]
    # the interval is the one the verdict used: the t interval at the level Holm adjusted this p to
    conf = 1 - 0.05 * p[0] / holm[0]
    ci = stats.ttest_rel(x["a"], x["b"]).confidence_interval(conf)
    assert pairs["`a` vs `b`"][:3] == [f"paired t, ρ {np.corrcoef(x['a'], x['b'])[0, 1]:+.2f}",
                                       f"-0.300 [{ci.low:+.3f}, {ci.high:+.3f}] (Holm-adjusted {100 * conf:.1f}% CI)",
                                       f"{holm[0]:.2g}"]
    assert pairs["`a` vs `b`"][-1] == "`b` > `a` |" and pairs["`b` vs `c`"][-1] == "`b` > `c` |"
    assert pairs["`a` vs `c`"][2] == f"{holm[1]:.2g}" == "1" and pairs["`a` vs `c`"][-1].startswith("undecided (")
    u = stats.mannwhitneyu(x["a"], x["c"]).statistic
    assert pairs["`a` vs `c`"][4].startswith(f"{u / 25:.3f} [")
    assert "Beyond seed noise: 2 of 3; equivalent within the margin: 0; undecided: 1." in md
    means = [line for line in md if line.startswith("| `a` | 5 | ")]
    ci = stats.ttest_1samp(x["a"], 0).confidence_interval(0.95)
    assert means[0].startswith(f"| `a` | 5 | {x['a'].mean():.3f} [{ci.low:.3f}, {ci.high:.3f}] | "
                               f"{stats.trim_mean(x['a'], 0.25):.3f} [")
    assert md[md.index("## Failed runs"):] == ["## Failed runs", "", "| run | error |", "|---|---|",
                                               "| `c-s5` | boom / bang |", "",
                                               "## Plots", "", "![the curves](curves.png)", "<!-- data -->", "", "*the curves*"]


def test_pairwise_and_answer_at_their_edges():
    two = pd.DataFrame({"variant": ["a", "a", "b", "b"], "status": "ok", "final/reward": [0.1, 0.2, 0.5, 0.6]})
    assert len(R.pairwise(two, "final/reward", ["a", "b"])) == 1          # two seeds each are enough
    # no seed noise at all: different means differ for sure, equal ones not at all
    flat = pd.DataFrame({"variant": ["a", "a", "b", "b", "c", "c"], "status": "ok",
                         "final/reward": [0.5, 0.5, 0.7, 0.7, 0.5, 0.5]})
    p = {(t["a"], t["b"]): t["p"] for t in R.pairwise(flat, "final/reward", ["a", "b", "c"])}
    assert p == {("a", "b"): 0.0, ("b", "c"): 0.0, ("a", "c"): 1.0}
    one = pd.DataFrame({"variant": ["a", "b"], "status": "ok", "final/reward": [0.1, 0.3]})
    assert R.answer(one, "final/reward", ["a", "b"]) == \
        "`b` is best (final reward 0.300 ± 0.000, 1 seeds); too few seeds to test differences."
    assert R.answer(one, "final/eval/accuracy", ["a", "b"]) == "no finished runs."    # a column it never logged
    # one variant over five seeds: nothing to compare, not "too few seeds" (the gym default-recipe runs said so)
    alone = pd.DataFrame({"variant": ["g"] * 5, "status": "ok", "final/reward": [0.1, 0.2, 0.3, 0.4, 0.5]})
    assert R.answer(alone, "final/reward", ["g"]) == \
        "`g` alone (final reward 0.300 ± 0.158, 5 seeds): one variant, nothing to compare."


# ------------------------------------------------------------ what each figure shows


def curves_from(rows):
    """(run, variant, step, metric, value) rows as load() reads them: categorical run, variant, metric."""
    df = pd.DataFrame([(r, v, 0, s, m, x) for r, v, s, m, x in rows],
                      columns=["run", "variant", "seed", "step", "metric", "value"])
    return P.by_metric(df.astype({"run": "category", "variant": "category", "metric": "category"}))


def test_figures_carry_axis_labels_legends_and_captions(sort_dir, few_seeds_dir):
    figures = {stem: (fig, caption) for stem, fig, caption in F.build_figures(sort_dir)}
    variants = ["loss=naive", "loss=unclipped", "loss=clipped"]
    for stem in ("headline", "curve_eval_reward", "diagnostics"):
        fig = figures[stem][0]
        assert [t.get_text() for t in fig.legends[0].get_texts()] == variants, stem
    head = figures["headline"][0]
    assert head.axes[-1].get_xlabel() == "gradient step"
    # six diagnostics on a page-wide figure: a row of four, then two; each column's lowest panel labelled
    diag = figures["diagnostics"][0]
    assert len(diag.axes) == 8 and diag.axes[0].get_gridspec().ncols == 4
    assert [ax.get_xlabel() for ax in diag.axes] == [""] * 2 + ["gradient step"] * 4 + [""] * 2
    assert [ax.axison for ax in diag.axes] == [True] * 6 + [False] * 2
    # five seeds: the caption promises the CI line; three seeds draw none and must not say so
    assert figures["final_values"][1].endswith("and its 95% bootstrap CI (line)")
    few = {stem: caption for stem, _, caption in F.build_figures(few_seeds_dir)}
    assert few["final_values"] == "final values per seed (dots) with their mean (bar)"


def test_final_values_panels_read_like_a_table(sort_dir):
    fig = all_figures(sort_dir)["final_values"]
    # the main metrics first (rollout reward, the held-out accuracy beside it), then the rest
    assert [ax.get_xlabel() for ax in fig.axes] == ["final reward", "eval accuracy", "eval reward"]
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["loss=naive", "loss=unclipped", "loss=clipped"]
    assert ax.get_ylim() == (2.5, -0.5)  # first variant on top, each row a unit band around its index
    for ax in fig.axes:  # rows are categories: horizontal grid lines would only cut through the dots
        assert not any(g.get_visible() for g in ax.yaxis.get_gridlines())


def test_dot_panel_per_variant(tmp_path):
    a = [0.1, 0.2, 0.3, 0.4, 0.5]          # five seeds: dots, a mean bar and a CI line
    data = {"a": a, "b": [0.6, 0.7, 0.8, 0.9], "c": []}   # c never finished: nothing on its row
    with P.style():
        fig = F.dot_panels(["a", "b", "c"], [("final/eval/accuracy", "eval accuracy", "", data)],
                           P.variant_styles(["a", "b", "c"]), "t")
    ax = fig.axes[0]
    assert ax.get_xlabel() == "eval accuracy"
    # one panel of short names fits one column of a paper
    assert fig.get_size_inches()[0] <= P.COLUMN_IN
    dots = [c for c in ax.collections if isinstance(c, PathCollection)]
    assert sorted(c.get_gid() for c in dots if c.get_gid()) == ["a", "b"]
    bars = [c for c in dots if not c.get_gid()]
    assert sorted(np.round(c.get_offsets()[0], 6).tolist() for c in bars) == [[0.3, 0.0], [0.75, 1.0]]
    (line,) = ax.get_lines()  # only a has five seeds
    lo, hi = line.get_xdata()
    assert line.get_ydata().tolist() == [0, 0] and 0.1 <= lo < 0.3 < hi <= 0.5


def test_final_values_title_gives_the_seed_range():
    summary = pd.DataFrame({"variant": ["a"] * 5 + ["b"] * 4, "status": "ok", "final/reward": np.linspace(0, 1, 9)})
    with P.style():
        fig = F.final_values_figure({"name": "t", "variants": ["a", "b"]}, summary, [("final/reward", "final reward")],
                                    P.variant_styles(["a", "b"]))
    assert fig._suptitle.get_text().startswith("t: final values, 2 variants x 4-5 seeds\n")


def test_diagnostics_with_an_incomplete_last_row_label_every_columns_lowest_panel(tmp_path):
    class FiveDiag(SortLike):
        metrics = [m for m in SortLike.metrics if m != "kl/value"]

    d = write_results(tmp_path / "d", ["a", "b"], range(2), FiveDiag(), SORT_FINALS)
    fig = all_figures(d)["diagnostics"]
    fig.canvas.draw()
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert len(panels) == 5
    # the third column has one panel, in the first row: sharex would hide its step labels
    lowest = [panels[3], panels[4], panels[2]]
    for ax in lowest:
        assert ax.get_xlabel() == "gradient step"
        assert any(t.get_visible() and t.get_text() for t in ax.get_xticklabels()), ax.get_title()


def test_bootstrap_ci_is_the_central_95_percent_of_the_resampled_means():
    # 60 seeds: the resampled mean is close to normal with sd = std(x) / sqrt(n), so the CI is
    # mean -+ 1.96 sd (a 3.5th percentile would sit at -1.81 sd); 20000 resamples pin it to ~0.02 sd
    x = np.arange(60, dtype=float)
    lo, hi = P.bootstrap_mean_ci(x[None, :], n_boot=20000)
    sd = x.std() / math.sqrt(len(x))
    assert (x.mean() - lo[0]) / sd == pytest.approx(1.96, abs=0.06)
    assert (hi[0] - x.mean()) / sd == pytest.approx(1.96, abs=0.06)


def test_run_matrices_keep_a_run_with_gaps_and_drop_other_variants_runs():
    rows = [("r1", "a", s, "reward/mean", 1.0) for s in range(10)]
    rows += [("r2", "a", s, "reward/mean", 2.0) for s in range(0, 10, 2)]  # logged every other step
    rows += [("r3", "b", s, "reward/mean", 3.0) for s in range(10)]
    tables = P.run_matrices(curves_from(rows), "reward/mean", ["a", "b"])
    assert list(tables["a"].columns) == ["r1", "r2"] and list(tables["b"].columns) == ["r3"]
    assert tables["a"]["r2"].notna().sum() == 5


@pytest.mark.parametrize("seeds", [3, 5])
def test_two_points_are_a_line(seeds):
    import matplotlib.pyplot as plt
    rows = [(f"r{s}", "a", step, "reward/mean", s + step / 10) for s in range(seeds) for step in (0, 10)]
    fig, ax = plt.subplots()
    P.draw_curves(ax, curves_from(rows), "reward/mean", ["a"], P.variant_styles(["a"]))
    if seeds < P.BAND_SEEDS:  # each seed, then the mean
        assert len(ax.get_lines()) == seeds + 1 and not band_ys(ax)
    else:
        assert len(ax.get_lines()) == 1 and len(band_ys(ax)) == 1


def test_heavy_tailed_band_is_the_quartiles():
    import matplotlib.pyplot as plt
    rng = np.random.default_rng(3)
    M = np.exp(rng.standard_normal((10, 5)))  # 10 steps (no smoothing), 5 seeds
    rows = [(f"r{s}", "a", step, "ratio/max", M[step, s]) for s in range(5) for step in range(10)]
    fig, ax = plt.subplots()
    P.draw_curves(ax, curves_from(rows), "ratio/max", ["a"], P.variant_styles(["a"]))
    (ys,) = band_ys(ax)
    quartiles = np.concatenate([np.percentile(M, 25, axis=1), np.percentile(M, 75, axis=1)])
    assert np.allclose(np.sort(np.unique(ys)), np.sort(quartiles))
    assert np.allclose(ax.get_lines()[0].get_ydata(), np.median(M, axis=1))


def log_axis(values, ylim=None):
    import matplotlib.pyplot as plt
    rows = [("r0", "a", step, "ratio/max", v) for step, v in enumerate(values)]
    fig, ax = plt.subplots()
    if ylim:
        ax.set_ylim(*ylim)
    P.draw_curves(ax, curves_from(rows), "ratio/max", ["a"], P.variant_styles(["a"]))
    fig.canvas.draw()
    lo, hi = ax.get_ylim()
    shown = [t for t in ax.get_yticklabels() if lo <= t.get_position()[1] <= hi]
    return ax, [t.get_position()[1] for t in shown], [t.get_text() for t in shown]


def test_log_axis_ticks_are_plain_round_numbers():
    # under one decade: 1, 1.5, 2, 3, 5, 7 x 10^k, written as plain numbers, not 2 x 10^0
    ax, ticks, texts = log_axis([2.0, 3.0, 4.0, 5.0])
    assert ax.get_yscale() == "log" and ticks == [2.0, 3.0, 5.0] and texts == ["2", "3", "5"]
    # a decade and a half: 1, 2, 5 x 10^k
    ax, ticks, texts = log_axis([1.5, 10.0, 40.0])
    assert ticks == [2.0, 5.0, 10.0, 20.0] and texts == ["2", "5", "10", "20"]
    # exactly one decade is no longer "under one"; exactly 2.5 decades is past 1-2-5's range
    assert log_axis([2.0, 8.0], ylim=(1, 10))[1] == [1.0, 2.0, 5.0, 10.0]
    assert log_axis([2.0, 200.0], ylim=(1, 10 ** 2.5))[1] == [1.0, 10.0, 100.0]


def test_unit_interval_metric_axis_stops_just_past_0_and_1():
    import matplotlib.pyplot as plt
    rows = [(f"r{s}", "a", step, "clip/frac", float(step % 2)) for s in range(2) for step in range(10)]
    fig, ax = plt.subplots()
    P.draw_curves(ax, curves_from(rows), "clip/frac", ["a"], P.variant_styles(["a"]))
    assert ax.get_ylim() == (-0.02, 1.02)  # matplotlib's 5% margin would show values a fraction cannot take


def test_headline_metric_with_two_evals_gets_its_curve(tmp_path):
    d = write_results(tmp_path / "d", ["a", "b"], range(2), SortLike(), SORT_FINALS, eval_steps=(100, 199))
    assert "curve_eval_reward" in all_figures(d)


def test_a_reward_equal_to_the_accuracy_is_drawn_and_tabled_once(tmp_path):
    """A 0/1 reward's mean is the accuracy: its curve, its final-value panel and its Differences tables
    would repeat the accuracy's. A reward that differs anywhere keeps all three (sort_dir's)."""
    class ZeroOne(SortLike):
        def __call__(self, metric, i, seed, step):
            return super().__call__("eval/accuracy" if metric == "eval/reward" else metric, i, seed, step)

    finals = {**SORT_FINALS, "final/eval/reward": SORT_FINALS["final/eval/accuracy"]}
    d = write_results(tmp_path / "d", ["a", "b"], range(5), ZeroOne(), finals)
    R.make_report(d)
    figures = all_figures(d)
    assert "curve_eval_reward" not in figures and not (d / "curve_eval_reward.png").exists()
    assert [ax.get_xlabel() for ax in figures["final_values"].axes] == ["final reward", "eval accuracy"]
    text = (d / "REPORT.md").read_text()
    section = text.split("## Differences in eval reward\n", 1)[1].split("\n## ", 1)[0]
    assert section.strip() == "Equal to eval accuracy on every run: the same differences."
    assert "| `a` vs `b` |" in text.split("## Differences in eval accuracy\n", 1)[1].split("\n## ", 1)[0]
    # one run apart: both kept
    finals["final/eval/reward"] = lambda i, s: 0.01 * s + (0.5 if (i, s) == (1, 4) else 0)
    d = write_results(tmp_path / "e", ["a", "b"], range(5), SortLike(), finals)
    assert "## Differences in eval reward\n\nEqual" not in R.render(d)[0]
    assert "curve_eval_reward" in all_figures(d)


def test_the_clipped_fraction_is_not_drawn_beside_the_parts_it_sums(tmp_path):
    class Regions(SortLike):
        metrics = ["reward/mean", "clip/frac", "clip/low_frac", "clip/high_frac", "entropy"]
        gap, nan_at = 0.0, None

        def __call__(self, metric, i, seed, step):
            low, high = 0.01 * (step % 7), 0.02 * (seed + 1)
            parts = {"clip/frac": low + high + (self.gap if step == 190 else 0), "clip/low_frac": low,
                     "clip/high_frac": high}
            if metric in parts and step == self.nan_at:
                return math.nan
            return parts[metric] if metric in parts else super().__call__(metric, i, seed, step)

    d = write_results(tmp_path / "d", ["a", "b"], range(2), Regions(), SORT_FINALS)
    titles = [ax.get_title() for ax in all_figures(d)["diagnostics"].axes]
    assert "clip/frac" not in titles and {"clip/low_frac", "clip/high_frac"} <= set(titles)
    Regions.gap = 0.01  # one step where the regions overlap or another one clips: the total says something
    d = write_results(tmp_path / "e", ["a", "b"], range(2), Regions(), SORT_FINALS)
    assert "clip/frac" in [ax.get_title() for ax in all_figures(d)["diagnostics"].axes]
    # a step where none of the three has a value (NaN: no token to count) cannot show the total is their sum
    Regions.gap, Regions.nan_at = 0.0, 190
    d = write_results(tmp_path / "f", ["a", "b"], range(2), Regions(), SORT_FINALS)
    assert "clip/frac" in [ax.get_title() for ax in all_figures(d)["diagnostics"].axes]


def test_no_final_columns_no_final_values_figure(tmp_path):
    d = write_results(tmp_path / "d", ["a", "b"], range(2), SortLike(), {})
    stems = [s for s, _, _ in F.build_figures(d)]
    assert "final_values" not in stems and "headline" in stems


def test_final_values_drop_the_gain_beside_accuracy(tmp_path):
    class LM(SortLike):
        metrics = ["reward/mean", "eval/accuracy"]

    finals = {"final/reward": lambda i, s: 0.3, "final/eval/accuracy": lambda i, s: 0.1 * i + 0.01 * s,
              "final/eval/accuracy_gain": lambda i, s: 0.1 * i - 0.2, "final/eval/pass@k": lambda i, s: 0.5 + s / 100}
    d = write_results(tmp_path / "lm", ["a", "b"], range(2), LM(), finals)
    fig = all_figures(d)["final_values"]
    # the main metric (rollout reward here) first; the gain is accuracy minus a constant, so
    # pass@k takes the third panel instead
    assert [ax.get_xlabel() for ax in fig.axes] == ["final reward", "eval accuracy", "eval pass@k"]


def test_report_markdown_with_no_runs_yet():
    empty = pd.DataFrame(columns=["run", "variant", "seed", "status", "error", "wall_s"])  # as load() gives it
    meta = {"name": "t", "source": "t.yaml", "seeds": [0], "runs": ["a-s0", "b-s0"]}
    md = R._markdown(meta, empty, empty, [], ["a", "b"], []).splitlines()
    assert "| `a` | 0/0 | — |" in md and "| `b` | 0/0 | — |" in md
    assert "0 runs finished, 0 failed, 2 not run." in md[2]


# ------------------------------------------------- edges found by the 1-in-2 mutation pass


def test_bootstrap_band_is_1000_resamples_from_seed_0():
    # a redraw must give the same band: the default is 1000 resamples drawn from default_rng(0),
    # one multinomial count vector (how often each seed is picked) per resample
    M = np.array([[0.1, 0.5, 0.2, 0.9, 0.4, 0.3], [1.0, 2.0, 4.0, 3.0, 0.0, 5.0]])
    rng = np.random.default_rng(0)
    means = np.array([M @ rng.multinomial(6, [1 / 6] * 6) / 6 for _ in range(1000)]).T  # (steps, resamples)
    lo, hi = P.bootstrap_mean_ci(M)
    assert np.allclose(lo, np.percentile(means, 2.5, axis=1)) and np.allclose(hi, np.percentile(means, 97.5, axis=1))


def test_legend_columns_fit_the_longest_name():
    # per entry: 0.45 in + 0.055 in per character of the longest name; 10 characters take 1.0 in
    names = ["a", "bb", "ccc", "dddd", "eeeee", "ffffffffff"]
    assert P.legend_cols(names, P.COLUMN_IN) == 3 and P.legend_rows(names, P.COLUMN_IN) == 2
    assert P.legend_cols(names, P.PAGE_IN) == 6
    assert P.legend_cols(["x" * 200, "y"], P.PAGE_IN) == 1  # wider than the page: still one column


def test_draw_curves_says_what_it_drew_for_the_fewest_seeds():
    import matplotlib.pyplot as plt
    rows = [(f"a{s}", "a", step, "reward/mean", s + step) for s in range(5) for step in range(3)]
    fig, ax = plt.subplots()
    assert P.draw_curves(ax, curves_from(rows), "reward/mean", ["a"], P.variant_styles(["a"])) == \
        "mean over 5 seeds, band: 95% bootstrap CI of the mean"
    rows += [(f"b{s}", "b", step, "reward/mean", s + step) for s in range(3) for step in range(3)]
    fig, ax = plt.subplots()  # b has only 3 seeds: drawn seed by seed, and the caption must say so
    assert P.draw_curves(ax, curves_from(rows), "reward/mean", ["a", "b"], P.variant_styles(["a", "b"])) == \
        "thin lines: each of 3 seeds; bold: their mean"


def test_heavy_band_skips_a_step_whose_upper_quartile_is_undefined():
    import matplotlib.pyplot as plt
    # step 2: two seeds logged inf, so the 75th percentile is inf - inf = NaN; the band must go round it
    M = np.array([[1, 2, 3, 4, 5], [2, 3, 4, 5, 6], [1, 2, 3, np.inf, np.inf], [3, 4, 5, 6, 7]], float)
    rows = [(f"r{s}", "a", step, "ratio/max", M[step, s]) for s in range(5) for step in range(4)]
    fig, ax = plt.subplots()
    P.draw_curves(ax, curves_from(rows), "ratio/max", ["a"], P.variant_styles(["a"]))
    paths = [p for c in ax.collections if isinstance(c, PolyCollection) for p in c.get_paths()]
    assert len(paths) == 1 and np.all(np.isfinite(paths[0].vertices))
    assert sorted(set(paths[0].vertices[:, 0])) == [0.0, 1.0, 3.0]


def test_heavy_metric_below_one_is_still_on_a_log_scale():
    ax, _, _ = log_axis([0.01, 0.02, 0.05, 0.1])
    assert ax.get_yscale() == "log"
    ax, _, _ = log_axis([0.0, 0.01, 0.02, 0.05, 0.1])  # an exact zero: symlog, linear below 10^-2
    assert ax.get_yscale() == "symlog" and ax.yaxis.get_transform().linthresh == pytest.approx(1e-2)


def test_symlog_spans_at_most_six_decades_below_the_top():
    # positives from 1e-10 to 1e3 and a zero: the top decade is 10^3, so the linear stretch starts at 10^-3
    ax, _, _ = log_axis([0.0] + [10.0 ** k for k in range(-10, 4)])
    assert ax.get_yscale() == "symlog" and ax.yaxis.get_transform().linthresh == pytest.approx(1e-3)


def test_dot_panel_jitter_and_titles():
    data = {"a": [0.1, 0.2, 0.3], "b": [0.6, 0.7]}
    with P.style():
        fig = F.dot_panels(["a", "b"], [("final/reward", "final reward", "left", data),
                                         ("final/eval/reward", "eval reward", "right", data)],
                           P.variant_styles(["a", "b"]), "t")
    assert [ax.get_title() for ax in fig.axes] == ["left", "right"]
    # the jitter: uniform draws in (-0.15, 0.15) from default_rng(0), in drawing order, added to the row
    draws = np.random.default_rng(0).uniform(-0.15, 0.15, 10)
    ys = [c.get_offsets()[:, 1] for ax in fig.axes for c in ax.collections if c.get_gid()]
    assert np.allclose(np.concatenate(ys), [0, 0, 0, 1, 1] * 2 + draws)


def test_final_values_title_promises_a_ci_line_only_if_every_variant_has_one():
    summary = pd.DataFrame({"variant": ["a"] * 5 + ["b"] * 4, "status": "ok", "final/reward": np.linspace(0, 1, 9)})
    with P.style():
        fig = F.final_values_figure({"name": "t", "variants": ["a", "b"]}, summary, [("final/reward", "final reward")],
                                    P.variant_styles(["a", "b"]))
    assert fig._suptitle.get_text() == "t: final values, 2 variants x 4-5 seeds\ndots: seeds; bar: mean"


def test_diagnostics_share_the_step_axis(sort_dir):
    axes = all_figures(sort_dir)["diagnostics"].axes
    shared = axes[0].get_shared_x_axes()
    assert all(shared.joined(axes[0], ax) for ax in axes[1:])


def test_load_reads_the_runners_summary_of_no_runs(tmp_path):
    from grpo_bench.sweep import runner
    d = tmp_path / "d"
    d.mkdir()
    (d / "ablation.json").write_text(json.dumps({"name": "t", "source": "t.yaml", "axes": ["variant_name"],
                                                  "variants": ["a"], "seeds": [0], "runs": ["a-s0"]}))
    runner.collect(d)  # nothing ran yet: summary.csv is the single byte "\n"
    assert (d / "summary.csv").read_bytes() == b"\n"
    meta, summary, metrics = R.load(d)
    assert list(summary.columns) == ["run", "variant", "seed", "status", "error", "wall_s"] and summary.empty
    assert "0 runs finished, 0 failed, 1 not run." in R.make_report(d).read_text()


def test_two_steps_per_run_make_a_headline_and_diagnostics(tmp_path):
    d = write_results(tmp_path / "d", ["a", "b"], range(2), SortLike(), SORT_FINALS, steps=(0, 10), eval_steps=(0, 199))
    figs = all_figures(d)
    assert [ax.get_ylabel() for ax in figs["headline"].axes] == ["rollout reward", "held-out accuracy"]
    assert "diagnostics" in figs


def test_accuracy_gain_is_no_second_curve_beside_accuracy(tmp_path):
    class LM(SortLike):
        metrics = ["reward/mean", "eval/accuracy", "eval/accuracy_gain"]

        def __call__(self, metric, i, seed, step):
            return 0.1 * i + step / 1000 if metric.startswith("eval/") else super().__call__(metric, i, seed, step)

    finals = {"final/reward": lambda i, s: 0.3, "final/eval/accuracy": lambda i, s: 0.1 * i + 0.01 * s,
              "final/eval/accuracy_gain": lambda i, s: 0.1 * i - 0.2}
    d = write_results(tmp_path / "lm", ["a", "b"], range(2), LM(), finals)
    stems = [s for s, _, _ in F.build_figures(d)]
    assert stems == ["headline", "final_values"]  # headline: held-out accuracy and rollout reward


def test_final_values_keep_the_gain_without_accuracy(tmp_path):
    finals = {"final/reward": lambda i, s: 0.3 + 0.01 * s, "final/eval/accuracy_gain": lambda i, s: 0.1 * i - 0.2}
    d = write_results(tmp_path / "d", ["a", "b"], range(2), SortLike(), finals)
    assert [ax.get_xlabel() for ax in all_figures(d)["final_values"].axes] == ["final reward", "eval accuracy gain"]


def test_a_p_value_exactly_at_alpha_is_not_beyond_noise(monkeypatch):
    from grpo_bench.stats import paired as S  # where the pairwise test looks it up
    monkeypatch.setattr(S, "t_from_summary", lambda diff, se, df: (0.05, diff - 1, diff + 1))
    two = pd.DataFrame({"variant": ["a", "a", "b", "b"], "status": "ok", "final/reward": [0.1, 0.2, 0.5, 0.6]})
    (t,) = R.pairwise(two, "final/reward", ["a", "b"])
    assert t["p_holm"] == 0.05 and not t["significant"]


def test_answer_skips_runs_without_the_column():
    # a finished run may lack an eval metric (NaN): the others still answer
    s = pd.DataFrame({"variant": ["a", "a", "b"], "status": "ok", "final/reward": [0.1, np.nan, 0.3]})
    assert R.answer(s, "final/reward", ["a", "b"]) == \
        "`b` is best (final reward 0.300 ± 0.000, 1 seeds); too few seeds to test differences."


def test_report_markdown_sections_when_nothing_differs_or_too_few_seeds():
    summary = pd.DataFrame({"run": ["a-s0", "a-s1", "b-s0", "b-s1"], "variant": ["a", "a", "b", "b"],
                            "seed": [0, 1, 0, 1], "status": "ok", "error": "", "wall_s": 1.0,
                            "final/reward": [0.1, 0.3, 0.4, 0.2], "final/eval/accuracy": [0.5, np.nan, 0.6, np.nan]})
    meta = {"name": "t", "source": "t.yaml", "seeds": [0, 1], "runs": list(summary.run)}
    headline = [("final/reward", "final reward", "reward/mean"), ("final/eval/accuracy", "eval accuracy", "eval/accuracy")]
    md = R._markdown(meta, summary, summary, headline, ["a", "b"], []).split("\n")
    # by hand: d = a - b = -0.3, +0.1 on seeds 0, 1: mean -0.1, se 0.2, t = -0.5 on 1 df, p = 1 - 2 atan(0.5) / pi;
    # CI -0.1 +- 12.706 * 0.2; MDE 11.55 sd (80% power, two pairs, alpha 0.05); P(a > b): only 0.3 > 0.2 of four;
    # means 0.2 +- 12.706 * 0.1; IQM of two values: their mean, resampled: 0.1 to 0.3
    p = 1 - 2 * math.atan(0.5) / math.pi
    assert p == pytest.approx(0.7048, abs=1e-4)
    assert md[md.index("## Results"):md.index("## How variants are compared")] == [
        "## Results", "",
        "| variant | runs ok | final reward | eval accuracy | wall s / run |", "|---|---|---|---|---|",
        "| `a` | 2/2 | 0.200 ± 0.141 | 0.500 ± 0.000 | 1.0 |", "| `b` | 2/2 | 0.300 ± 0.141 | 0.600 ± 0.000 | 1.0 |", ""]
    assert md[md.index("## Differences in final reward"):] == [
        "## Differences in final reward", "",
        "1 pair, Holm-corrected together; equivalence margin none (no margin declared for this metric): no "
        "equivalence test.", "",
        "| variant | seeds | mean [95% CI] | IQM [95% CI] |", "|---|---:|---|---|",
        "| `a` | 2 | 0.200 [-1.071, 1.471] | 0.200 [0.100, 0.300] |",
        "| `b` | 2 | 0.300 [-0.971, 1.571] | 0.300 [0.200, 0.400] |", "",
        "| pair | test | Δ = a − b [the interval its verdict used] | p_holm | detectable / margin | P(a > b) [95% CI] "
        "| verdict |", "|---|---|---|---:|---|---|---|",
        f"| `a` vs `b` | paired t, ρ — | -0.100 [-2.641, +2.441] (95% CI) | {p:.2g} | MDE {11.5499 * 0.2 * math.sqrt(2):.3f} "
        "(α 0.05) | 0.250 [0.000, 1.000] | undecided (about 65 pairs to detect the observed Δ) |", "",
        "Beyond seed noise: 0 of 1; equivalent within the margin: 0; undecided: 1.", "",
        "## Differences in eval accuracy", "",
        "Not enough finished runs (two seeds per variant) to compare.", ""]


# ------------------------------------------------- full mutation run of report.py: the rest


class LMFull(SortLike):
    """An LM-task-shaped ablation (it logs eval/accuracy_gain) with every headline column."""

    metrics = ["reward/mean", "eval/accuracy", "eval/accuracy_gain", "eval/reward", "eval/pass@k", "entropy", "kl/old"]

    def __call__(self, metric, i, seed, step):
        if metric in ("eval/accuracy_gain", "eval/pass@k"):
            return step / 1000 + 0.1 * i
        return super().__call__(metric, i, seed, step)


LM_FINALS = {"final/reward": lambda i, s: 0.3 + 0.01 * s, "final/eval/accuracy": lambda i, s: 0.1 * i + 0.01 * s,
             "final/eval/accuracy_gain": lambda i, s: 0.1 * i - 0.2, "final/eval/reward": lambda i, s: 0.2 + 0.01 * s,
             "final/eval/pass@k": lambda i, s: 0.5 + 0.01 * s}


def test_ranges_are_immutable_shared_values():
    # one Range object serves every metric matching its pattern: a write to it would change them all
    import dataclasses
    r = P.metric_range("eval/accuracy")
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.lo = -5.0
    assert hash(r) == hash(P.Range(0, 1))


def test_a_failed_run_does_not_hide_a_column(tmp_path):
    # a failed run has no final values: the column still has values for every other run
    d = write_results(tmp_path / "lm", ["a", "b"], range(2), LMFull(), LM_FINALS, failed=(("a", 0),))
    s = pd.read_csv(d / "summary.csv")
    assert s["final/reward"].isna().sum() == 1
    assert [h[0] for h in R.headline_columns(s)] == ["final/reward", "final/eval/accuracy",
                                                       "final/eval/accuracy_gain", "final/eval/reward",
                                                       "final/eval/pass@k"]
    assert R.main_column(s) == "final/eval/accuracy"  # the LM task's main metric, not the first headline column


def test_final_values_put_the_main_metric_first_and_show_three(tmp_path):
    d = write_results(tmp_path / "lm", ["a", "b"], range(2), LMFull(), LM_FINALS)
    fig = all_figures(d)["final_values"]
    # main metrics in the task's order (accuracy, then reward), the gain dropped, then the rest: three panels
    assert [ax.get_xlabel() for ax in fig.axes] == ["eval accuracy", "final reward", "eval reward"]


def test_saving_closes_every_figure(tmp_path):
    import matplotlib.pyplot as plt
    plt.close("all")
    d = write_results(tmp_path / "d", ["a", "b"], range(2), SortLike(), SORT_FINALS)
    R.make_report(d)
    assert plt.get_fignums() == []


def test_all_nan_steps_warn_nothing():
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = P._percentiles(np.array([[np.nan, np.nan], [np.nan, 1.0], [1.0, 3.0]]), 50)
    np.testing.assert_array_equal(out, [np.nan, 1.0, 2.0])


def test_a_variant_that_never_logged_a_metric_has_no_table_or_seeds():
    rows = [(f"a-s{s}", "a", st, "m", float(st + s)) for s in range(5) for st in range(4)]
    rows += [("b-s0", "b", st, "other", 1.0) for st in range(4)]
    curves = curves_from(rows)
    assert list(P.run_matrices(curves, "m", ["a", "b"])) == ["a"]
    import matplotlib.pyplot as plt
    _, ax = plt.subplots()
    styles = P.variant_styles(["a", "b"])
    assert P.draw_curves(ax, curves, "m", ["a", "b"], styles) == "mean over 5 seeds, band: 95% bootstrap CI of the mean"
    # no variant drawn at all: no seeds behind the (empty) panel
    assert P.draw_curves(ax, curves, "never", ["a", "b"], styles) == "thin lines: each of 0 seeds; bold: their mean"
    # a subset of the table: a metric with no rows left is not a metric of it
    assert set(P.by_metric(pd.concat(curves.values())[lambda df: df.metric == "m"])) == {"m"}
    assert P.points_per_run(curves, "never") == 0 and P.points_per_run(curves, "m") == 4


def heavy_axis(values):
    """draw_curves on kl/old (heavy-tailed) with values[run][step], one variant; its Axes."""
    import matplotlib.pyplot as plt
    rows = [(f"a-s{r}", "a", st, "kl/old", float(x)) for r, run in enumerate(values) for st, x in enumerate(run)]
    _, ax = plt.subplots()
    P.draw_curves(ax, curves_from(rows), "kl/old", ["a"], P.variant_styles(["a"]))
    return ax


def test_symlog_stretch_starts_at_the_first_percentile_decade():
    # 5 runs x 21 steps (no smoothing below 40 steps); step 0 is exactly 0 everywhere, so symlog
    vals = [[0.0] + [1 + (r * 20 + s) % 10 for s in range(1, 21)] for r in range(5)]
    vals[0][1] = vals[0][2] = 1e-3  # the two smallest of 100 positives
    pos = np.array([x for run in vals for x in run if x > 0])
    assert math.floor(math.log10(np.percentile(pos, 1))) == -3 != math.floor(math.log10(np.percentile(pos, 2)))
    ax = heavy_axis(vals)
    assert ax.get_yscale() == "symlog"
    assert ax.yaxis.get_transform().linthresh == pytest.approx(1e-3)


def test_log_axis_within_a_decade_has_plain_major_and_no_minor_labels():
    vals = [[1.2 + 7.0 * ((r * 7 + s) % 11) / 10 for s in range(10)] for r in range(5)]  # 1.2 .. 8.2
    ax = heavy_axis(vals)
    assert ax.get_yscale() == "log"
    lo, hi = ax.get_ylim()
    assert math.log10(hi / lo) < 1
    ax.figure.canvas.draw()
    majors = [t for t in ax.yaxis.get_majorticklocs() if lo <= t <= hi]
    assert majors == pytest.approx([x for x in (1.0, 1.5, 2.0, 3.0, 5.0, 7.0) if lo <= x <= hi])
    assert 7.0 in majors
    assert [t.get_text() for t in ax.yaxis.get_minorticklabels()] and \
        all(t.get_text() == "" for t in ax.yaxis.get_minorticklabels())


def test_panels_share_their_step_or_variant_axis(sort_dir):
    figs = all_figures(sort_dir)
    a, b = [ax for ax in figs["headline"].axes if ax.get_ylabel()]
    assert a.get_shared_x_axes().joined(a, b)
    p, q, r = figs["final_values"].axes
    assert p.get_shared_y_axes().joined(p, q) and p.get_shared_y_axes().joined(p, r)
    d = figs["diagnostics"].axes
    assert all(d[0].get_shared_x_axes().joined(d[0], x) for x in d[1:])
    # exactly BAND_SEEDS seeds: the CI line is drawn, and the title says so
    assert figs["final_values"].get_suptitle().endswith("dots: seeds; bar: mean; line: 95% bootstrap CI of the mean")


def test_dot_panel_width_by_hand():
    rows = ["a", "twenty_characters_xy"]
    assert len(rows[1]) == 20
    one = F.dot_panels(rows, [("final/reward", "x", "", {"a": [1.0], rows[1]: [2.0]})], P.variant_styles(rows), "t")
    assert tuple(one.get_size_inches()) == pytest.approx((1.1 + 0.05 * 20 + 2.0, 0.9 + 0.22 * 2))
    three = F.dot_panels(rows, [("final/reward", "x", "", {})] * 3, P.variant_styles(rows), "t")
    assert three.get_size_inches()[0] == pytest.approx(7.0)  # 1.1 + 1 + 6 is past the page


def test_diagnostics_with_two_and_four_panels(tmp_path):
    class Two(SortLike):
        metrics = ["reward/mean", "entropy", "kl/value"]

    class Four(SortLike):
        metrics = ["reward/mean", "entropy", "kl/value", "ratio/max", "grad/norm"]

    d = write_results(tmp_path / "two", ["a", "b"], range(2), Two(), SORT_FINALS, name="two")
    fig = all_figures(d)["diagnostics"]  # one row of two panels
    assert [ax.get_title() for ax in fig.axes] == ["kl/value", "entropy"]
    assert [ax.get_xlabel() for ax in fig.axes] == ["gradient step"] * 2
    assert fig.get_suptitle() == "two: training diagnostics, 2 variants, 2 seeds"
    # a sweep stopped part way: b never ran, and the title says so instead of counting the plan
    summary = pd.read_csv(d / "summary.csv")
    summary[summary.variant == "a"].to_csv(d / "summary.csv", index=False)
    assert all_figures(d)["diagnostics"].get_suptitle() == "two: training diagnostics, 1 of 2 variants, 2 seeds"
    meta = {"seeds": [0, 1], "variants": ["a", "b"], "axes": ["loss"]}   # every run failed, or none is in yet
    assert F._what(meta, summary.assign(status="failed")) == F._what(meta, summary.iloc[:0]) \
        == F._what(meta, pd.DataFrame()) == "0 of 2 variants of loss, 2 seeds"
    d = write_results(tmp_path / "four", ["a", "b"], range(2), Four(), SORT_FINALS, name="four")
    fig = all_figures(d)["diagnostics"]  # one row of four
    assert [ax.get_title() for ax in fig.axes] == ["kl/value", "entropy", "ratio/max, log", "grad/norm, log"]
    assert [ax.get_xlabel() for ax in fig.axes] == ["gradient step"] * 4


def test_holm_adjusted_p_is_capped_at_one():
    x = {"a": [0.1, 0.5, 0.9], "b": [0.2, 0.6, 0.8], "c": [0.15, 0.55, 0.85]}
    s = pd.DataFrame([{"variant": v, "status": "ok", "final/reward": y} for v, ys in x.items() for y in ys])
    tests = R.pairwise(s, "final/reward", ["a", "b", "c"])
    assert min(t["p"] for t in tests) * 3 > 1  # every raw p is large
    assert [t["p_holm"] for t in tests] == [1.0, 1.0, 1.0]


def test_four_significant_pairs_are_counted_not_named():
    x = {"a": [0.0, 0.1, 0.2], "b": [0.05, 0.15, 0.25], "c": [10.0, 10.1, 10.2], "d": [10.05, 10.15, 10.25]}
    s = pd.DataFrame([{"variant": v, "status": "ok", "final/reward": y} for v, ys in x.items() for y in ys])
    line = R.answer(s, "final/reward", list(x))
    assert line.endswith("; 4 of 6 pairs differ beyond seed noise."), line


# ------------------------------------------------------------ statistics of issue 20 in the report


class Saturating(SortLike):
    """Rollout reward on ScaleRL's curve against samples drawn: variant 0 rises to 0.4, variant 1 to
    0.6 (same B and C_mid), variant 2 stays flat; per_step[i] samples per gradient step."""

    metrics = ["reward/mean", "samples/total"]

    def __init__(self, per_step=(16, 16, 16)):
        self.per_step = per_step

    def __call__(self, metric, i, seed, step):
        samples = self.per_step[i] * (step + 1)
        if metric == "samples/total":
            return float(samples)
        noise = 0.01 * np.random.default_rng(zlib.crc32(f"{i}|{seed}|{step}".encode())).standard_normal()
        if i == 2:
            return 0.3 + noise
        from grpo_bench.stats import saturating
        return float(saturating(samples, 0.05, 0.4 + 0.2 * i, 1.5, 2000.0)) + noise


SAT_STEPS = range(9, 800, 10)


def stats_min_points():
    from grpo_bench.stats import fits
    return fits.MIN_POINTS


def test_curves_against_compute_in_the_report(tmp_path):
    d = write_results(tmp_path / "sat", ["a", "b", "flat"], range(5), Saturating(), SORT_FINALS, steps=SAT_STEPS)
    meta, summary, metrics = R.load(d)
    fits = F.curve_fits(meta, P.by_metric(metrics))
    assert fits["metric"] == "reward/mean" and fits["per_step"] == 16 and list(fits["axes"]) == ["samples"]
    a, b, flat = (fits["axes"]["samples"][v] for v in ("a", "b", "flat"))
    # a flat curve is declined: its "rise" is the first point's noise, and a step fits the noise best
    assert a["ok"] and b["ok"] and not flat["ok"]
    assert flat["reason"].startswith(("flat: the rise", "not identifiable: the best fit lies on the edge"))
    assert a["A"] == pytest.approx(0.4, abs=0.02) and b["A"] == pytest.approx(0.6, abs=0.02)
    assert a["B"] == pytest.approx(1.5, abs=0.2) and a["C_mid"] == pytest.approx(2000, rel=0.1)
    assert a["C"][0] == 160 and a["C"][-1] == 16 * 800   # samples/total at each logged step
    text = R.make_report(d).read_text()
    section = text[text.index("## Curves against compute"):text.index("## Plots")]
    assert "Samples drawn are proportional to gradient steps here (16 per step)" in section
    assert "Against gradient steps" not in section
    row = next(line for line in section.splitlines() if line.startswith("| `a` |"))
    ci = a["ci"]
    assert row.startswith(f"| `a` | {a['r0']:.3f} | {a['A']:.3f} [{ci['A'][0]:.3f}, {ci['A'][1]:.3f}] | {a['B']:.2f} [")
    assert row.endswith(f"| {a['half']['mae']:.3f} ({a['half']['flat_mae']:.3f}) |")
    assert next(line for line in section.splitlines() if line.startswith("| `flat` |")).startswith(
        f"| `flat` | {flat['r0']:.3f} | {flat['reason']} | | |")
    # b's final values beat a's, and the fits place the difference in the asymptote alone
    assert "- `a` vs `b`: final value `b` > `a`; ΔA -0.2" in section and "lies in the asymptote A." in section
    fig = all_figures(d)["fit"]
    (ax,) = fig.axes
    assert ax.get_xscale() == "log" and ax.get_xlabel() == "samples drawn" and ax.get_ylabel() == "rollout reward"
    assert sorted(ln.get_gid() for ln in ax.get_lines() if ln.get_gid()) == ["a", "b"]   # no line for the flat one
    assert sorted(c.get_gid() for c in ax.collections if c.get_gid()) == ["a", "b", "flat"]
    half = [ln for ln in ax.get_lines() if ln.get_gid() is None]
    assert len(half) == 1 and half[0].get_xdata()[0] == 16 * 800 / 2
    assert "(1 declined)" in fig.get_suptitle() and "![" in text and "](fit.png)" in text
    # only the major ticks carry labels: over one or two decades matplotlib labels minor ticks too,
    # and they overlapped the major ones (results/gpu/policy_losses_lm/fit.png, 128 to 3,840 samples)
    ax.set_xlim(128, 3840)
    fig.canvas.draw()
    assert [t.get_text() for t in ax.get_xticklabels(minor=True) if t.get_text()] == []


class SampledLate(Saturating):
    """samples/total first logged at the second step: the first point has drawn nothing yet (0 samples)."""

    def __call__(self, metric, i, seed, step):
        return None if metric == "samples/total" and step == SAT_STEPS[0] else super().__call__(metric, i, seed, step)


def test_a_point_before_any_sample_is_left_off_the_log_axis_and_the_ratio(tmp_path):
    name = "sampler_mismatch_spell_backward_slow_seed2"  # the longest name a setting has, and more
    d = write_results(tmp_path / "late", ["a", "b", "flat"], range(3), SampledLate(), SORT_FINALS, steps=SAT_STEPS,
                      name=name)
    meta, _, metrics = R.load(d)
    fits = F.curve_fits(meta, P.by_metric(metrics))
    assert fits["per_step"] == 16 and fits["axes"]["samples"]["a"]["C"][0] == 0
    fig = all_figures(d)["fit"]
    xs = np.concatenate([c.get_offsets()[:, 0] for c in fig.axes[0].collections if c.get_gid()])
    assert len(xs) and xs.min() > 0
    fig.canvas.draw()
    box = fig._suptitle.get_window_extent(fig.canvas.get_renderer())
    assert name in fig._suptitle.get_text() and box.x0 >= -1 and box.x1 <= fig.bbox.x1 + 1


@pytest.mark.parametrize("points", [stats_min_points() - 1, stats_min_points()])
def test_a_curve_is_fitted_from_min_points_on(tmp_path, points):
    d = write_results(tmp_path / "sat", ["a", "b", "flat"], range(3), Saturating(), SORT_FINALS,
                      steps=SAT_STEPS[:points])
    meta, _, metrics = R.load(d)
    assert (F.curve_fits(meta, P.by_metric(metrics)) is None) == (points < stats_min_points())


def test_curves_against_steps_where_samples_per_step_differ(tmp_path):
    d = write_results(tmp_path / "sat", ["a", "b", "flat"], range(3), Saturating((16, 32, 16)), SORT_FINALS,
                      steps=SAT_STEPS)
    meta, _, metrics = R.load(d)
    fits = F.curve_fits(meta, P.by_metric(metrics))
    assert fits["per_step"] is None and list(fits["axes"]) == ["samples", "steps"]
    # b draws twice the samples per step: its midpoint in samples stays, in steps it halves
    b_s, b_t = fits["axes"]["samples"]["b"], fits["axes"]["steps"]["b"]
    assert b_s["C_mid"] == pytest.approx(2000, rel=0.1) and b_t["C_mid"] == pytest.approx(2000 / 32, rel=0.1)
    fig = all_figures(d)["fit"]
    assert [ax.get_xlabel() for ax in fig.axes if ax.get_xlabel()] == ["samples drawn", "gradient steps"]
    # the budgets in samples differ: no half-budget line there; in steps they are the same
    halves = [[ln for ln in ax.get_lines() if ln.get_gid() is None] for ax in fig.axes[:2]]
    assert [len(h) for h in halves] == [0, 1]
    assert "Against gradient steps:" in R.make_report(d).read_text()


def test_every_fit_declined_no_fit_figure(tmp_path):
    """Dots alone against compute are the headline's curves again: the figure needs one fitted line."""
    d = write_results(tmp_path / "sat", ["a", "b", "flat"], range(3), Saturating(), SORT_FINALS, steps=SAT_STEPS)
    meta, _, metrics = R.load(d)
    fits = F.curve_fits(meta, P.by_metric(metrics))
    assert "fit" in [stem for stem, _, _ in F.build_figures(d, fits)]
    for axis in fits["axes"].values():
        for f in axis.values():
            f["ok"] = False
    assert "fit" not in [stem for stem, _, _ in F.build_figures(d, fits)]


def test_no_samples_total_no_fit(sort_dir):
    assert "fit" not in all_figures(sort_dir) and "## Curves against compute" not in (sort_dir / "REPORT.md").read_text()


def test_report_uses_the_claims_margin_and_welch_where_seeds_differ():
    rows = [{"variant": "a", "seed": s, "status": "ok", "final/reward": x} for s, x in enumerate([0.50, 0.52, 0.49])]
    rows += [{"variant": "b", "seed": s + 3, "status": "ok", "final/reward": x}
             for s, x in enumerate([0.50, 0.51, 0.50])]
    summary = pd.DataFrame(rows)
    (t,) = R.pairwise(summary, "final/reward", ["a", "b"], {"claim": {"margin": {"lm": 0.05}}, "setting": "lm"})
    assert t["test"] == "Welch t" and not t["paired"] and t["margin"] == 0.05
    assert t["p"] == pytest.approx(stats.ttest_ind([0.50, 0.52, 0.49], [0.50, 0.51, 0.50], equal_var=False).pvalue)
    lines = R.differences_section(summary, "final/reward", "final reward", ["a", "b"],
                                  {"claim": {"margin": 0.05}, "setting": None})
    assert "1 pair, Holm-corrected together; equivalence margin ±0.05 (the claim's margin)." in lines
    assert any(line.startswith("| `a` vs `b` | Welch t | ") for line in lines)


def test_accuracy_gain_has_no_differences_section_beside_accuracy(tmp_path):
    d = write_results(tmp_path / "lm", ["a", "b"], range(3), LMFull(), LM_FINALS)
    text = R.make_report(d).read_text()
    assert "## Differences in eval accuracy\n" in text and "## Differences in eval accuracy gain" not in text


class WithSamples(SortLike):
    """Variant 1 draws twice the responses per step (dynamic sampling's redraws), the rest as many."""

    metrics = SortLike.metrics + ["samples/total"]

    def __call__(self, metric, i, seed, step):
        if metric == "samples/total":
            return 32.0 * (step + 1) * (2 if i == 1 else 1)
        return super().__call__(metric, i, seed, step)


def test_curves_against_samples_when_variants_draw_differently(tmp_path):
    names = ["a_rather_long_variant_name_for_the_title", "dynamic_sampling", "c"]
    long = "sampler_mismatch_spell_backward_slow_seed2"  # the longest name a setting has, and more
    d = write_results(tmp_path / "long", names, range(5), WithSamples(), SORT_FINALS, name=long)
    figs = all_figures(d)
    assert "diagnostics" in figs, sorted(figs)
    fig = figs["headline_samples"]
    ax = fig.axes[0]
    assert ax.get_xlabel() == "" and fig.axes[-1].get_xlabel() == "responses sampled"
    ends = {line.get_gid(): max(line.get_xdata()) for line in ax.get_lines() if line.get_linewidth() > 1}
    # the same steps, twice the samples: its curve reaches twice as far along the x axis
    assert ends["dynamic_sampling"] == pytest.approx(2 * ends["c"]) and ends["c"] == pytest.approx(32 * 191)
    fig.canvas.draw()
    tb = fig._suptitle.get_window_extent(fig.canvas.get_renderer())
    assert tb.x0 >= -1 and tb.x1 <= fig.bbox.x1 + 1, fig._suptitle.get_text()   # the title fits
    for stem, other in figs.items():  # every figure's title fits, the long name wrapped
        other.canvas.draw()
        box = other._suptitle.get_window_extent(other.canvas.get_renderer())
        assert box.x0 >= -1 and box.x1 <= other.bbox.x1 + 1, stem
    # variants that draw alike: the step axis already says it all, no second figure
    plain = write_results(tmp_path / "plain", ["a", "c"], range(5), SortLike(), SORT_FINALS)
    assert "headline_samples" not in all_figures(plain)


def test_small_means_keep_their_digits():
    # a bf16 sampler's mismatch (~5e-5) and an fp16 one's (~1e-6) must not both read 0.000
    from grpo_bench.analysis.report import _fmt
    assert _fmt(5.071e-05, 1.2e-05) == "5.07e-05 ± 1.2e-05"
    assert _fmt(8.2e-07, 3e-07) != _fmt(5.071e-05, 1.2e-05)
    assert _fmt(0.0, 0.0) == "0.000 ± 0.000" and _fmt(0.0183, 0.008) == "0.018 ± 0.008"
    assert _fmt(float("nan"), 0.1) == "—"
    assert _fmt(5e-4, 0.0) == f"{5e-4:.3f} ± 0.000" and _fmt(-4.9e-4, 0.0) == "-4.90e-04 ± 0.0e+00"  # from 5e-4 up: fixed
    # and the seeds' table beside it (fp32_head_lm's mismatch/k3 read 0.000 [0.000, 0.000] for both variants)
    from grpo_bench.analysis.report import _ci
    assert _ci(9.6e-06, 4.1e-06, 1.5e-05) == "9.60e-06 [4.10e-06, 1.50e-05]"
    assert _ci(-2e-6, -3e-6, 1e-6, signed=True) == "-2.00e-06 [-3.00e-06, +1.00e-06]"
    assert _ci(0.0, 0.0, 0.0) == "0.000 [0.000, 0.000]" and _ci(0.8213, 0.81, 0.83) == "0.821 [0.810, 0.830]"
    # fp32_head_smollm2's gap (4.5e-4 [1.9e-4, 7.1e-4] read 0.000 [0.000, 0.001]): a value that would read 0.000
    # keeps its digits; one that reads as itself stays in the accuracies' fixed decimals, and so does a difference:
    # its interval says what -0.000 leaves out
    assert _ci(4.51e-4, 1.9e-4, 7.1e-4) == "4.51e-04 [1.90e-04, 7.10e-04]"
    assert _ci(-4.9e-4, -0.002, 0.001, signed=True) == "-0.000 [-0.002, +0.001]"
    assert _ci(0.004, 0.001, 0.007, signed=True) == "+0.004 [+0.001, +0.007]" and _ci(5e-4, 0.0, 0.001) == "0.001 [0.000, 0.001]"


def test_a_redraw_removes_the_figures_its_report_no_longer_draws(tmp_path):
    d = write_results(tmp_path / "r", ["a", "b"], range(2), SortLike(), SORT_FINALS)
    R.make_report(d)
    drawn = sorted(p.name for p in d.glob("*.png"))
    # the last report drew a figure this one does not (a curve no longer declared); a file of the user's stays
    (d / "curve_eval_old.png").write_bytes((d / "headline.png").read_bytes())
    (d / "notes.png").write_bytes(b"mine")
    report = d / "REPORT.md"
    report.write_text(report.read_text() + "\n![old](curve_eval_old.png)\n")
    R.make_report(d)
    assert sorted(p.name for p in d.glob("*.png")) == sorted(drawn + ["notes.png"])


def test_committed_results_match_the_code():
    """Every committed results directory's ablation.json is what its ablation file makes today (description,
    task, declared curves and metrics, run ids: no retraining needed to check). Run ids are planned with the sweep's own --set (results/gpu ran with device=cuda)."""
    import shlex

    from grpo_bench.sweep.runner import plan

    archived = {"headroom_search_start"}  # made by the code of 2026-11-23 (2,309 s of training); ids predate it
    checked = 0
    for meta_path in sorted((ROOT / "results").glob("**/ablation.json")):
        d = meta_path.parent
        if d.name in archived:
            continue
        meta = json.loads(meta_path.read_text())
        sweep = json.loads((d / "sweep.json").read_text()) if (d / "sweep.json").exists() else {}
        words = shlex.split(sweep.get("command", ""))
        sets = [words[i + 1] for i, w in enumerate(words) if w == "--set"]
        if d.parent.name == "gpu" and not sets:  # a sweep stopped at its budget wrote no sweep.json
            sets = ["device=cuda", "backend=torch"]
        if d.parent.name == "gpu" and meta.get("setting") == "lm":
            # the H100 ran the LM settings as they were before the rerun with seven evaluations (commit 16f30c5)
            sets += ["eval_every=10", "task.eval_subset=0"]
        subset = {(c.get("task") or {}).get("eval_subset", 0) for c in meta["configs"].values()}
        if d.parent.name == "gpu" and meta.get("setting") != "lm" and subset != {0}:
            # a GPU's countdown sweeps scored 250 problems mid-run; the CPU reruns that replace them score all
            sets += [f"task.eval_subset={max(subset)}"]
        abl = load_ablation(ROOT / meta["source"], seeds=len(meta["seeds"]), setting=meta.get("setting"), sets=sets)
        record = ablation_record(abl)
        assert {k: meta.get(k) for k in record} == record, d
        assert meta["description"] == abl.description, d
        assert [s.run_id for s in plan(abl, meta["seeds"])] == meta["runs"], d
        checked += 1
    assert checked >= 25


def test_report_splits_the_final_accuracy_between_seeds_and_problems(tmp_path):
    """An LM-shaped ablation with outcomes.parquet: REPORT.md's seeds-and-problems table is stats.crossed_variance
    of each variant's last evaluation (not a mid-run one on fewer problems), over its finished runs only (a
    failed run's outcomes stay out); its seeds-only interval is the per-seed one; the subset is said."""
    from grpo_bench.store import rundir as ST
    from grpo_bench import stats as S

    rng = np.random.default_rng(4)
    seeds, J, steps = range(5), 40, {0: 40, 50: 10, 99: 40}   # step -> problems scored (mid-run: the first 10)
    difficulty = rng.uniform(-0.3, 0.3, J)
    outcome = {(i, s, t): (rng.random(J) < 0.4 + 0.2 * i + 0.05 * (s - 2) + difficulty).astype(int)
               for i in range(2) for s in seeds for t in steps}

    class Curves:
        metrics = ["reward/mean", "eval/accuracy", "eval/problems"]

        def __call__(self, metric, i, s, t):
            if metric == "reward/mean":
                return 0.1 * i
            if t not in steps:
                return None
            return float(steps[t]) if metric == "eval/problems" else outcome[i, s, t][:steps[t]].mean()

    d = write_results(tmp_path / "lm", ["a", "b"], seeds, Curves(), {
        "final/eval/accuracy": lambda i, s: outcome[i, s, 99].mean(), "final/reward": lambda i, s: 0.1 * i},
        steps=range(0, 100, 10), eval_steps=tuple(steps), failed={("b", 4)})
    rows = [(f"{v}-s{s}", v, s, t, j, outcome[i, s, t][j], None)
            for i, v in enumerate("ab") for s in seeds for t, n in steps.items() for j in range(n)]
    ST._write_outcomes(pd.DataFrame(rows, columns=["run", "variant", "seed", *ST.OUTCOME_COLUMNS]),
                       d / ST.OUTCOMES_FILE)
    text = R.make_report(d).read_text()
    assert "Mid-run evaluations score the first 10 of the 40 held-out problems" in text
    section = text.split("## Seeds and problems")[1].split("\n## ")[0]
    for i, v, ok_seeds in [(0, "a", seeds), (1, "b", range(4))]:
        Y = np.array([outcome[i, s, 99] for s in ok_seeds])
        r = S.crossed_variance(Y)
        row = next(line for line in section.splitlines() if line.startswith(f"| `{v}` |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1:4] == [str(len(ok_seeds)), "40", f"{Y.mean():.3f}"]
        assert cells[4:7] == [f"{r['share'][k]:.0%}" for k in ("seeds", "problems", "residual")]
        # the seeds-only interval is the t interval of the per-seed accuracies (the per-seed tables' one)
        _, lo, hi = S.mean_ci(Y.mean(1))
        assert cells[7] == f"[{lo:.3f}, {hi:.3f}]"
        assert cells[8] == f"[{r['ci'][0]:.3f}, {r['ci'][1]:.3f}] ({r['df']:.0f} df)"
    # without outcomes.parquet (a toy, or results from before it) the section is absent
    (d / ST.OUTCOMES_FILE).unlink()
    assert "## Seeds and problems" not in R.make_report(d).read_text()


def _committed_dirs() -> list:
    """Every directory under results/ that holds a report, a comparison or an ablation's files."""
    marks = ("REPORT.md", "COMPARE.md", "ablation.json")
    return sorted({p.parent for m in marks for p in (ROOT / "results").glob(f"**/{m}")})


@pytest.mark.parametrize("d", _committed_dirs(), ids=lambda d: str(d.relative_to(ROOT / "results")))
def test_committed_report_figures_and_compare_are_what_the_code_writes(d, tmp_path, capsys, monkeypatch):
    """Each committed REPORT.md (or COMPARE.md) is, character for character, what `plot` (or the `compare`
    command it names) writes from the directory's files today, and its figure files are the ones that
    writes. A figure is held by its data, not its pixels: the text carries each figure's digest of what it
    draws (grpo_bench/analysis/figdata.py), so a change to a figure's code or data changes the text.
    results/headroom_search_start's REPORT.md once lagged the interval wording and margins by versions."""
    import shlex

    figures = {p.name for p in d.iterdir() if p.suffix in (".png", ".pdf", ".svg")}
    if (d / "COMPARE.md").exists():
        committed = (d / "COMPARE.md").read_text()
        rebuild = re.search(r"Rebuild with `python -m grpo_bench (compare [^`]*)`", committed).group(1)
        words = shlex.split(rebuild)
        words[words.index("--out") + 1] = str(tmp_path)
        monkeypatch.chdir(ROOT)
        code, _, err = run_main(capsys, *words)
        assert code == 0, err
        assert (tmp_path / "COMPARE.md").read_text().replace(str(tmp_path), str(d.relative_to(ROOT))) == committed
        assert figures == {p.name for p in tmp_path.iterdir() if p.suffix in (".png", ".pdf", ".svg")}, d
        return
    assert (d / "REPORT.md").is_file() and (d / "ablation.json").is_file(), f"{d}: a report without its files"
    text, drawn = R.render(d)
    for _, fig in drawn:
        P.plt.close(fig)
    assert text == (d / "REPORT.md").read_text(), f"{d}: run `python -m grpo_bench plot {d.relative_to(ROOT)}`"
    assert figures == {name for name, _ in drawn}, d


def _long(rows):
    return pd.DataFrame(rows, columns=["variant", "seed", "step", "value"])


def test_twins_are_read_on_what_trains_and_a_variant_without_curves_twins_nothing():
    """b logs a's numbers on every metric but the clock and the objective's value: b is a's twin; c differs in
    one value; d logged nothing (all its runs failed) and is nobody's twin."""
    same = [(v, s, t, 0.1 * s + t) for v in "abc" for s in (0, 1) for t in (0, 1)]
    reward = _long([(v, s, t, x + (0.5 if (v, s, t) == ("c", 1, 1) else 0)) for v, s, t, x in same])
    clock = _long([(v, s, t, {"a": 1.0, "b": 2.0, "c": 3.0}[v]) for v, s, t, _ in same])
    curves = {"reward": reward, "time/step_s": clock, "loss/total": clock, "kl/value": clock}
    assert P.twin_variants(curves, ["a", "b", "c", "d"]) == {"b": "a"}


def test_tables_split_by_metric_and_variant_name_only_what_they_hold():
    """A metric or variant column kept categorical after a filter still lists the dropped names as categories:
    they are no metric to draw and no variant on the samples axis."""
    t = _long([("a", 0, 0, 1.0), ("b", 0, 0, 2.0)]).assign(metric="samples/total")
    t = pd.concat([t, t.assign(metric="reward")])
    t["metric"] = t.metric.astype("category")
    t["variant"] = t.variant.astype(pd.CategoricalDtype(["a", "b", "gone"]))
    kept = t[t.metric == "samples/total"]
    assert list(P.by_metric(kept)) == ["samples/total"]
    kept = kept.assign(value=[1.0, 2.0])                                  # b draws twice a's samples
    axis = P.samples_axis({"samples/total": kept}, ["a", "b", "gone"])
    assert sorted(axis) == ["a", "b"]


def test_a_saved_png_is_palette_coded(tmp_path):
    """Committed figures are quantised to the palette (png.shrink): a few KB each, not an RGBA render."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1], color=P.PALETTE[0])
    name = P.save(fig, tmp_path, "f", "png")
    assert name == "f.png" and Image.open(tmp_path / name).mode == "P"


def test_samples_at_other_steps_are_another_samples_axis():
    """Two variants with the same sample counts logged at other steps (one redraws and logs every other
    step) do not share the step axis."""
    t = pd.concat([_long([("a", 0, s, float(s + 1)) for s in range(3)]),
                   _long([("b", 0, 2 * s, float(s + 1)) for s in range(3)])]).assign(metric="samples/total")
    axis = P.samples_axis({"samples/total": t}, ["a", "b"])
    assert axis is not None and list(axis["b"].index) == [0, 2, 4]
    same = pd.concat([t[t.variant == "a"], t[t.variant == "a"].assign(variant="b")])
    assert P.samples_axis({"samples/total": same}, ["a", "b"]) is None


@pytest.mark.parametrize("sizes, linthresh", [((1, 1, 100), 1), ((1, 2, 3, 1000), 3), ((1, 1, 40), None)])
def test_a_variant_fifty_times_the_typical_one_puts_the_axis_on_symlog(sizes, linthresh):
    """A KL that runs away would flatten the other variants into the axis: linear up to the typical (median)
    variant's size, logarithmic beyond. The largest variant has a step it did not log, and is still counted."""
    import matplotlib.pyplot as plt
    names = [f"v{k}" for k in range(len(sizes))]
    rows = [(f"{v}-s0", v, st, "m", float(size)) for v, size in zip(names, sizes) for st in range(10)]
    rows[-1] = (*rows[-1][:4], float("nan"))
    _, ax = plt.subplots()
    P.draw_curves(ax, curves_from(rows), "m", names, P.variant_styles(names))
    if linthresh is None:
        assert ax.get_yscale() == "linear"
    else:
        assert ax.get_yscale() == "symlog" and ax.yaxis.get_transform().linthresh == pytest.approx(linthresh)


@pytest.mark.parametrize("long", ["x" * 100, "_".join(["sampler_mismatch"] * 6)])
def test_every_figures_title_keeps_a_long_name_inside_it(tmp_path, long):
    """matplotlib wraps at spaces only, and a name is one word: a 100-character name (or six joined by
    underscores) is broken inside every figure's edges, the one-column headline's included, after an
    underscore where one falls in the line, and keeps every character."""
    d = write_results(tmp_path / "long", ["a", "b"], range(3), SortLike(), SORT_FINALS, name=long)
    for stem, fig in all_figures(d).items():
        fig.canvas.draw()
        box = fig._suptitle.get_window_extent(fig.canvas.get_renderer())
        text = fig._suptitle.get_text()
        assert long in text.replace("\n", "") and box.x0 >= -1 and box.x1 <= fig.bbox.x1 + 1, (stem, text)
        lines = text[:text.index(":")].split("\n")
        if "_" in long:
            assert len(lines) > 1 and all(line.endswith("_") for line in lines[:-1]), (stem, lines)


def test_fit_data_keeps_a_run_with_gaps_and_leaves_out_a_variant_without_samples():
    """A run that skipped a step is still a seed of the fit (NaN where it did not log); a variant that never
    logged samples/total has no point on the samples axis, while the steps axis keeps it."""
    rows = [("a-s0", "a", st, "m", 0.1 * st) for st in range(4)]
    rows += [("a-s1", "a", st, "m", 0.2 * st) for st in (0, 1, 3)]
    rows += [("b-s0", "b", st, "m", 0.3) for st in range(4)]
    rows += [(r, "a", st, "samples/total", 8.0 * (st + 1)) for r in ("a-s0", "a-s1") for st in range(4)]
    # c's run drew samples and failed before it logged m: a category of m's variant column with no rows of m,
    # which has no curve on either axis (an empty one would hand the bootstrap zero seeds to draw from)
    rows += [("c-s0", "c", st, "samples/total", 8.0 * (st + 1)) for st in range(4)]
    curves = curves_from(rows)
    samples = F.fit_data(curves, "m", ["a", "b", "c"], "samples")
    assert list(samples) == ["a"]
    C, M = samples["a"]
    assert M.shape == (4, 2) and np.isnan(M[2, 1]) and M[3, 1] == pytest.approx(0.6)
    assert C.tolist() == [8.0, 16.0, 24.0, 32.0]
    assert list(F.fit_data(curves, "m", ["a", "b", "c"], "steps")) == ["a", "b"]


def test_binned_means_over_log_spaced_bins_by_hand():
    C, y = np.array([1.0, 2.0, 3.0, 4.0, 5.0]), np.array([10.0, 20.0, 30.0, 40.0, 50.0])
    assert F._binned(C, y, bins=5) == (C, y)   # no more points than bins: every point its own dot
    # 2 bins: one inner edge at log 5 / 2, i.e. C = sqrt(5) = 2.24: {1, 2} and {3, 4, 5}
    assert [x.tolist() for x in F._binned(C, y, bins=2)] == [[1.5, 4.0], [15.0, 40.0]]
    # 3 bins: edges at 5^(1/3) = 1.71 and 5^(2/3) = 2.92: {1}, {2}, {3, 4, 5}
    assert [x.tolist() for x in F._binned(C, y, bins=3)] == [[1.0, 2.0, 4.0], [10.0, 20.0, 40.0]]


def test_the_headline_leads_with_the_judged_metric_from_two_points_on(tmp_path):
    """A claim judged on a metric logged twice a run (a length read at two evaluations) has a curve to show:
    the headline draws it first; logged once, it is no curve."""
    class Judged(SortLike):
        metrics = SortLike.metrics + ["response/length_mean"]

        def __init__(self, points):
            self.points = points

        def __call__(self, metric, i, seed, step):
            if metric == "response/length_mean":
                return 10.0 + i if step in self.points else None
            return super().__call__(metric, i, seed, step)

    for points, first in (((0, 100), "response/length_mean"), ((100,), None)):
        d = write_results(tmp_path / f"j{len(points)}", ["a", "b"], range(2), Judged(points),
                          SORT_FINALS)
        meta = json.loads((d / "ablation.json").read_text())
        (d / "ablation.json").write_text(json.dumps(meta | {"claim": {"metric": "final/response/length_mean"}}))
        head = all_figures(d)["headline"]
        labels = [ax.get_ylabel() for ax in head.axes]
        assert (labels[0] == P.label(first) if first else not any("length" in t for t in labels)), labels


def test_equal_columns_with_the_same_gaps_repeat():
    ok = pd.DataFrame({"x": [1.0, np.nan, 0.5], "y": [1.0, np.nan, 0.5], "z": [1.0, 0.0, 0.5]})
    head = [("x", "X", ""), ("y", "Y", ""), ("z", "Z", "")]
    assert F.repeated_columns(ok, head) == {"y": "X"}


def test_a_variant_with_one_finished_seed_has_no_seeds_and_problems_row():
    """One seed splits nothing between seeds and problems: its row is left out, the others stay."""
    rows = [(f"{v}-s{s}", v, 9, j, float((s + j) % 2)) for v, seeds in (("a", (0, 1)), ("b", (0,)))
            for s in seeds for j in range(4)]
    outcomes = pd.DataFrame(rows, columns=["run", "variant", "step", "problem", "greedy"])
    ok = pd.DataFrame({"run": ["a-s0", "a-s1", "b-s0"]})
    lines = R.seeds_problems_section(outcomes, ok, ["a", "b"])
    assert [line[:7] for line in lines if line.startswith("| `")] == ["| `a` |"]
    assert R.seeds_problems_section(outcomes[outcomes.variant == "b"], ok, ["a", "b"]) == []


def test_bootstrap_band_sums_seeds_in_order_whatever_the_blas():
    """A committed figure's digest holds its band to 6 digits, and bands of accuracies sit on rounding boundaries
    (0.7042975): `values @ counts` let OpenBLAS choose how to sum (its Haswell kernel on a Zen 5, SkylakeX on a
    Zen 4, each with fused multiply-adds), and eight committed REPORT.md digests moved between the two. The band's
    resampled means are the seeds summed one after another, as plain Python floats sum them; on these accuracies
    (k/1000, 10 seeds) `@` gives other bits in about a third of the means and another band in a few steps."""
    M = np.random.default_rng(1).integers(0, 1000, size=(80, 10)) / 1000
    M[1, 3] = np.nan   # a seed that did not log this step: it leaves the mean's count as well as its sum
    n = M.shape[1]
    counts = np.random.default_rng(0).multinomial(n, np.full(n, 1 / n), size=1000)
    means = np.empty((len(M), 1000))
    for i, row in enumerate(M.tolist()):
        for b, c in enumerate(counts.tolist()):
            total = weight = 0.0
            for x, k in zip(row, c):
                if x == x:
                    total += x * k
                    weight += k
            means[i, b] = total / weight
    lo, hi = P.bootstrap_mean_ci(M)
    assert lo.tolist() == np.percentile(means, 2.5, axis=1).tolist()
    assert hi.tolist() == np.percentile(means, 97.5, axis=1).tolist()


def test_the_main_jobs_figures_are_the_bytes_plot_draws(tmp_path, capsys):
    """README: rerunning the main job changes its clock files alone, so loss_modes' committed PNGs must be the
    bytes `plot` draws today, not only the same data to the 6 digits a REPORT digest holds (after the bootstrap
    bands' summation changed in their last bits, every committed band figure still held the old pixels)."""
    import shutil

    src = ROOT / "results/loss_modes"
    shutil.copytree(src, tmp_path / "loss_modes", ignore=shutil.ignore_patterns("*.png"))
    code, _, err = run_main(capsys, "plot", tmp_path / "loss_modes")
    assert code == 0, err
    pngs = sorted(p.name for p in src.glob("*.png"))
    assert pngs and pngs == sorted(p.name for p in (tmp_path / "loss_modes").glob("*.png"))
    for name in pngs:
        assert (tmp_path / "loss_modes" / name).read_bytes() == (src / name).read_bytes(), name
