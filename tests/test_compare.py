"""`compare` at its edges, each found by a mutant of analysis/compare.py that the suite let through: what a results
directory must hold, which runs and variants a side keeps and in what order, Kendall's tau at two shared variants,
the caption's words, the panels' names, and where COMPARE.md goes."""
import json
import math

import numpy as np
import pandas as pd
import pytest

from grpo_bench.analysis import compare as C
from grpo_bench.errors import ConfigError


def results(path, values: dict, column="final/reward", variants=None, status=None):
    """A results directory with summary.csv and ablation.json only (what compare reads): values {variant: [per
    seed]}, seeds 0.. in order; ablation.json plans exactly these runs, its variants `variants` (default: values')."""
    path.mkdir(parents=True, exist_ok=True)
    rows = [{"run": f"{v}-s{s}", "variant": v, "seed": s, "status": (status or {}).get((v, s), "ok"), column: x}
            for v, xs in values.items() for s, x in enumerate(xs)]
    meta = {"name": path.name, "source": f"ablations/{path.name}.yaml", "variants": list(variants or values),
            "runs": [r["run"] for r in rows],
            "seeds": sorted({r["seed"] for r in rows}), "description": f"What {path.name} asks."}
    (path / "ablation.json").write_text(json.dumps(meta))
    pd.DataFrame(rows, columns=["run", "variant", "seed", "status", column]).to_csv(path / "summary.csv", index=False)
    return path


def test_means_are_means_over_unequal_seeds():
    side = C.Side(None, "x", "final/reward", 3, {"a": np.array([1.0, 2.0, 3.0]), "b": np.array([4.0])})
    assert side.means.to_dict() == {"a": 2.0, "b": 4.0}


def test_a_directory_needs_both_files(tmp_path):
    for gone in ("ablation.json", "summary.csv"):
        d = results(tmp_path / gone, {"a": [0.1, 0.2]})
        (d / gone).unlink()
        with pytest.raises(ConfigError, match=r"not a results directory \(needs ablation.json and summary.csv\)"):
            C.load_side(d, None)


def test_a_directory_missing_a_planned_run_is_refused_not_read_short(tmp_path):
    d = results(tmp_path / "r", {"a": [0.1, 0.2, 0.3], "b": [0.4, 0.5, 0.6]})
    s = pd.read_csv(d / "summary.csv")
    s.iloc[:-1].to_csv(d / "summary.csv", index=False)   # b's last seed deleted: a paired test would lose it silently
    with pytest.raises(ConfigError, match=r"has 5 of the 6 runs ablation.json plans \(e.g. no b-s2\)"):
        C.load_side(d, None)


def test_a_sweep_with_no_run_or_no_value_is_named(tmp_path):
    d = results(tmp_path / "empty", {})
    with pytest.raises(ConfigError, match="holds no runs: its sweep has not finished one"):
        C.load_side(d, "final/reward")
    d = results(tmp_path / "novalue", {"a": [0.3, np.nan]}, status={("a", 0): "failed"})  # a failed run's leftover
    with pytest.raises(ConfigError, match="no finished run has a value") as e:
        C.load_side(d, "final/reward")
    assert e.value.key == "final/reward"


def test_variants_keep_the_ablations_order_then_the_rest_in_the_tables(tmp_path):
    """ablation.json's order first, less a variant with no finished value; then one the file does not list."""
    d = results(tmp_path / "r", {"z": [0.1, 0.2], "x": [0.3, 0.4], "extra": [0.5, 0.6], "gone": [0.7, 0.8]},
                variants=["x", "gone", "z"], status={("gone", 0): "failed", ("gone", 1): "failed"})
    assert list(C.load_side(d, None).values) == ["x", "z", "extra"]


def test_kendall_w_where_every_task_ties_every_variant_is_undefined():
    tied = pd.Series([0.5, 0.5, 0.5], index=list("abc"))
    w, p, m, n = C.kendall_w([tied, tied])
    assert math.isnan(w) and math.isnan(p) and (m, n) == (2, 3)


def test_kendall_at_two_shared_variants():
    a, b = pd.Series({"p": 1.0, "q": 2.0, "r": 0.0}), pd.Series({"q": 1.0, "p": 2.0})
    tau, p, n = C.kendall(a, b)
    assert (tau, n) == (-1.0, 2) and p == pytest.approx(1.0)
    assert math.isnan(C.kendall(a, pd.Series({"p": 1.0}))[0])


def test_kendall_w_reads_twenty_thousand_draws_by_default():
    """Its permutation p is fixed by its generator and its number of draws: FINDINGS' W column prints the p of
    20,000 (findings_text calls the default), and another count is another p."""
    o = [pd.Series([1.0, 2, 3, 4], index=list("abcd")), pd.Series([2.0, 1, 3, 4], index=list("abcd")),
         pd.Series([1.0, 3, 2, 4], index=list("abcd"))]
    assert C.kendall_w(o) == C.kendall_w(o, draws=20_000) != C.kendall_w(o, draws=20_001)


def test_the_caption_says_lower_is_better_where_one_side_reads_so(tmp_path):
    a = C.load_side(results(tmp_path / "a", {"x": [0.1, 0.2], "y": [0.3, 0.4]}), None)
    b = C.load_side(results(tmp_path / "b", {"x": [0.1, 0.2], "y": [0.3, 0.4]}, column="final/reward"), None)
    assert "(rank by mean, 1 = highest)" in C.markdown([a, b])
    k3 = C.load_side(results(tmp_path / "k3", {"x": [0.1, 0.2], "y": [0.3, 0.4]}, column="final/mismatch/k3"), None)
    assert "1 = best: the highest, or the lowest where lower is better" in C.markdown([a, k3])


def test_no_spread_anywhere_has_no_share_to_give(tmp_path):
    """Every seed in every directory the same number: the variance components are 0 and 0, the share undefined."""
    sides = [C.load_side(results(tmp_path / n, {"x": [0.5, 0.5], "y": [0.5, 0.5]}), None) for n in ("a", "b")]
    row = next(x for x in C.between(sides) if x.startswith("| `x` |"))
    assert row == "| `x` | 2 | 0.0000 | 0.0000 | nan% | 1 |"


def test_a_directory_where_a_variant_has_one_seed_leaves_it_out_of_the_orderings(tmp_path):
    """A pair is tested where both variants have two seeds or more: `c` has one seed in two directories (no pair
    with it), and `b` one seed in the third (that directory's cell for a-b is '—', not a test on one seed)."""
    sides = [C.load_side(results(tmp_path / n, vals), None) for n, vals in [
        ("one", {"a": [0.1, 0.2, 0.3], "b": [0.5, 0.6, 0.8], "c": [0.9]}),
        ("two", {"a": [0.1, 0.2, 0.3], "b": [0.5, 0.7, 0.8], "c": [0.9]}),
        ("three", {"a": [0.1, 0.2, 0.3], "b": [0.5], "c": [0.9, 0.8]})]]
    lines = C.orderings(sides)
    rows = [x for x in lines if x.startswith("| `")]
    assert [r.split(" | ")[0] for r in rows] == ["| `a` vs `b`"]
    cells = rows[0].split(" | ")
    assert cells[1].startswith("`b` > `a`") and cells[2].startswith("`b` > `a`") and cells[3] == "—"
    assert cells[4] == "the same |"
    assert "- three: final reward: 0 pairs Holm-corrected together" in "\n".join(lines)
    # the one-seed variant first in the table's order: its pairs are left out all the same
    first = [C.load_side(results(tmp_path / f"first_{n}", {"c": [0.9], "a": [0.1, 0.2], "b": [0.5, 0.6]}), None)
             for n in ("one", "two")]
    assert [x.split(" | ")[0] for x in C.orderings(first) if x.startswith("| `")] == ["| `a` vs `b`"]
    # and where no pair has two seeds in two directories, the section says there is nothing to test
    alone = [C.load_side(results(tmp_path / f"alone_{n}", {"a": [0.1], "b": [0.5, 0.6]}), None) for n in ("one", "two")]
    assert C.orderings(alone) == ["## Orderings in each directory", "",
                                  "No pair of variants has two seeds or more in two directories: nothing to test.", ""]


def test_a_pair_no_test_can_read_is_one_cell_and_orders_nothing(tmp_path):
    """Both directories ran the same numbers for a and b (every paired difference 0): not testable, one cell each,
    and the orderings column says no directory decided it."""
    sides = [C.load_side(results(tmp_path / n, {"a": [0.1, 0.2, 0.3], "b": [0.1, 0.2, 0.3]}), None)
             for n in ("one", "two")]
    row = next(x for x in C.orderings(sides) if x.startswith("| `a` vs `b`"))
    assert row.count("not testable") == 2 and row.count(" | ") == 3 and row.endswith("| — |")


def panel_titles(fig) -> list[str]:
    return [ax.get_title() for ax in fig.axes if ax.get_title()]


def test_panels_drop_the_directories_common_prefix_unless_a_name_would_vanish(tmp_path):
    seeds = {"x": [0.1, 0.2], "y": [0.3, 0.4]}
    named = lambda *ns: [C.load_side(results(tmp_path / n, seeds), None) for n in ns]  # noqa: E731
    titles = panel_titles(C.figure(named("sweep_lm_seed1", "sweep_lm_seed2")))
    assert titles == ["seed1 (2 seeds)", "seed2 (2 seeds)"]
    titles = panel_titles(C.figure(named("sweep_", "sweep_lm")))   # cut at "sweep_" would leave one name empty
    assert titles == ["sweep_ (2 seeds)", "sweep_lm (2 seeds)"]
    assert panel_titles(C.figure(named("one_lm"))) == ["one_lm (2 seeds)"]   # one panel: nothing to tell apart


def test_the_band_is_named_where_any_variant_has_seeds_for_it(tmp_path):
    from grpo_bench.analysis import plotting
    many = list(np.linspace(0.1, 0.2, plotting.BAND_SEEDS))
    sides = [C.load_side(results(tmp_path / n, {"x": many, "y": [0.3, 0.4]}), None) for n in ("a", "b")]
    assert "95% bootstrap CI of the mean" in C.figure(sides)._suptitle.get_text()
    sides = [C.load_side(results(tmp_path / n, {"x": [0.1, 0.2], "y": [0.3, 0.4]}), None) for n in ("c", "d")]
    assert "bootstrap" not in C.figure(sides)._suptitle.get_text()


def test_compare_writes_beside_the_first_directory_by_default_and_again_in_place(tmp_path):
    a = results(tmp_path / "runs" / "a", {"x": [0.1, 0.2], "y": [0.3, 0.4]})
    b = results(tmp_path / "other" / "b", {"x": [0.1, 0.2], "y": [0.3, 0.4]})
    path, _ = C.compare([a, b])
    assert path == tmp_path / "runs" / "compare_a_vs_b" / "COMPARE.md" and path.is_file()
    path2, _ = C.compare([a, b])   # a second comparison replaces the first
    assert path2 == path
    path, _ = C.compare([a, b], out=tmp_path / "new" / "deep")   # --out need not exist, nor its parent
    assert path.is_file()


def test_the_gallery_skips_a_sweep_still_running(tmp_path):
    """A directory with ablation.json and no summary.csv yet (a sweep that has finished no run) is not an entry."""
    results(tmp_path / "done", {"x": [0.1, 0.2], "y": [0.3, 0.4]})
    (results(tmp_path / "running", {"x": [0.1]}) / "summary.csv").unlink()
    text = C.gallery_text(tmp_path)
    assert "## [done](done/REPORT.md)" in text and "running" not in text


def test_kendall_ws_p_is_the_exact_permutation_p_to_monte_carlo_error():
    """Two tasks, five variants: the exact p enumerates the second task's 120 orders against the first (ranks are
    relabelled freely, so fixing one task loses nothing); W = 0.9 here (Spearman's 0.8), and the next W down, 0.85,
    is a step a mis-scaled null (or a strict >) would cross."""
    import itertools
    a, b = pd.Series([1.0, 2, 3, 4, 5], index=list("abcde")), pd.Series([2.0, 1, 4, 3, 5], index=list("abcde"))
    w, p, m, n = C.kendall_w([a, b])
    assert (m, n) == (2, 5) and w == pytest.approx(0.9)

    def w_of(r):
        sums = np.array([1, 2, 3, 4, 5]) + np.array(r)
        return 12 * ((sums - sums.mean()) ** 2).sum() / (4 * (125 - 5))
    exact = sum(w_of(r) >= 0.9 - 1e-12 for r in itertools.permutations(range(1, 6))) / 120
    assert exact == pytest.approx(8 / 120)     # rho 1, 0.9 (4 adjacent swaps) and 0.8 (3 pairs of them)
    assert abs(p - exact) < 5 * np.sqrt(exact * (1 - exact) / 20_000)
    # and it is the same p on every machine: numpy's generator seeded 0, each task's ranks shuffled independently
    ranks = np.stack([np.arange(1.0, 6), np.array([2.0, 1, 4, 3, 5])])
    shuffled = np.take_along_axis(np.broadcast_to(ranks, (20_000, 2, 5)),
                                  np.random.default_rng(0).random((20_000, 2, 5)).argsort(-1), -1)
    sums = shuffled.sum(-2)
    null = 12 * ((sums - sums.mean(-1, keepdims=True)) ** 2).sum(-1) / (4 * 120)
    assert p == (1 + int(np.sum(null >= 0.9 - 1e-12))) / 20_001
