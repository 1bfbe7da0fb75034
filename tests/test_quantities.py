"""What FINDINGS reads its verdicts from (grpo_bench/analysis/quantities.py), on hand-made curves whose
values are worked out here: where a point sits in samples drawn, the value and area at a budget, and when
a mean curve, a plateau or a logged value exists at all. Each test names the one-line change it catches."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from grpo_bench.analysis import quantities as Q


def _metrics(path, rows):
    path.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows, columns=["run", "variant", "seed", "step", "metric", "value"]).to_parquet(path / "metrics.parquet")
    return path


def test_a_point_logged_before_the_first_samples_reading_sits_on_the_line_from_no_samples_before_step_0(tmp_path):
    """samples/total is cumulative after each step's rollout (100 a step here: 400 after step 3, 800 after 7),
    so before step 0 nothing was drawn: a training metric at step 1 sits at 200 samples, step 5 at 600.
    (-1, 0) moved to (-2, 0) gives 240; to (-1, 1) gives 200.5."""
    d = _metrics(tmp_path / "r", [("a-s0", "a", 0, 3, "samples/total", 400.0), ("a-s0", "a", 0, 7, "samples/total", 800.0),
                                  ("a-s0", "a", 0, 1, "clip/frac", 0.1), ("a-s0", "a", 0, 5, "clip/frac", 0.3)])
    x, y, steps = Q.run_curves(d, "clip/frac")[("a", 0)]
    assert x.tolist() == [200.0, 600.0] and y.tolist() == [0.1, 0.3] and steps.tolist() == [1, 5]


def test_a_run_that_never_logged_the_metric_has_no_curve_rather_than_an_empty_one(tmp_path):
    """b logs samples but not clip/frac (a loss without a clip): no entry for b, not an empty curve that a mean
    over seeds would then fail on (`continue` removed, or `or` -> `and`)."""
    d = _metrics(tmp_path / "r", [("a-s0", "a", 0, 0, "samples/total", 64.0), ("a-s0", "a", 0, 0, "clip/frac", 0.1),
                                  ("b-s0", "b", 0, 0, "samples/total", 64.0),
                                  ("c-s0", "c", 0, 0, "clip/frac", 0.2)])
    assert set(Q.run_curves(d, "clip/frac")) == {("a", 0)}


def test_at_budget_on_a_single_point_reads_that_point_for_both_value_and_area():
    """No width to average over: the area is the value (`width > 0` -> `>=` divides 0 by 0)."""
    assert Q.at_budget(np.array([5.0]), np.array([0.3]), 5.0) == (0.3, 0.3)
    assert Q.at_budget(np.array([5.0]), np.array([0.3]), 9.0) == (0.3, 0.3)


def test_at_budget_interpolates_inside_a_segment_and_averages_the_trapezoids_before_it():
    """y = 0, 1, 1 at x = 0, 2, 4: at x = 1 the value is 0.5 and the mean over [0, 1] 0.25; at x = 3, 1 and
    (1 + 1) / 3 = 2/3; past the end the last point and the whole curve's mean (1 + 2) / 4."""
    x, y = np.array([0.0, 2.0, 4.0]), np.array([0.0, 1.0, 1.0])
    assert Q.at_budget(x, y, 1.0) == (0.5, 0.25)
    assert Q.at_budget(x, y, 3.0) == pytest.approx((1.0, 2 / 3))
    assert Q.at_budget(x, y, 7.0) == (1.0, 0.75)


def test_a_logged_area_of_zero_has_no_log_not_minus_infinity():
    """A ratio margin judges logs; a value of 0 has none: NaN, which the verdict reports, not -inf, which a mean
    would carry silently (`out > 0` -> `>=`)."""
    curves = {("a", 0): (np.array([0.0, 1.0]), np.array([0.0, 0.0]), np.array([0, 1])),
              ("a", 1): (np.array([0.0, 1.0]), np.array([1.0, 1.0]), np.array([0, 1]))}
    finals = pd.Series([0.0, 1.0], index=[0, 1])
    v = Q._values(finals, "a", "area", None, curves, log=True)
    assert np.isnan(v[0]) and v[1] == 0.0


def _curves(*ys, x=(0.0, 1.0, 2.0, 3.0)):
    return {("a", s): (np.array(x[:len(y)]), np.array(y, float), np.arange(len(y))) for s, y in enumerate(ys)}


def test_a_mean_curve_needs_every_seeds_curve_on_one_grid_with_three_points_and_a_budget():
    c = _curves([0.0, 1.0, 2.0], [2.0, 3.0, 4.0])
    x, y = Q._mean_curve(c, "a", [0, 1])
    assert x.tolist() == [0.0, 1.0, 2.0] and y.tolist() == [1.0, 2.0, 3.0]
    assert Q._mean_curve(c, "a", [0, 1, 2]) is None                              # seed 2 has no curve (any -> all)
    assert Q._mean_curve(_curves([0.0, 1.0]), "a", [0]) is None                   # two points: no second half to read
    assert Q._mean_curve(_curves([0.0, 1.0, 2.0]), "a", [0]) is not None          # three are enough (>= 3 -> > 3)
    flat = {("a", 0): (np.array([1.0, 1.0, 1.0]), np.array([0.0, 1.0, 2.0]), np.arange(3))}
    assert Q._mean_curve(flat, "a", [0]) is None                                  # no samples between first and last
    assert Q._mean_curve({}, "a", []) is None


def test_v3s_plateau_is_none_when_a_curve_still_moves_past_half_its_budget():
    """v3: both variants within ±δ of their end from half the budget on. a settles at x = 5 of 4..8 (share 0.25);
    b is within 0.1 of its end from x = 7 on (share 0.75 > PLATEAU 0.5): no plateau. PLATEAU 0.5 -> 1.5 would call it one."""
    x = (4.0, 5.0, 6.0, 7.0, 8.0)   # a first point after some samples: shares count from it (x[i] - x[0])
    curves = {("a", 0): (np.array(x), np.array([0.0, 1.0, 1.0, 1.0, 1.0]), np.arange(5)),
              ("b", 0): (np.array(x), np.array([0.0, 0.0, 0.0, 0.95, 1.0]), np.arange(5))}
    by_seed = {"a": pd.Series([1.0], index=[0]), "b": pd.Series([1.0], index=[0])}
    assert Q.plateau_from(curves, "a", [0], 0.1) == 0.25 and Q.plateau_from(curves, "b", [0], 0.1) == 0.75
    assert Q.plateau(curves, {"a": "a", "b": "a"}, by_seed, 0.1, 0.0, effect=False) == 0.25
    assert Q.plateau(curves, {"a": "a", "b": "b"}, by_seed, 0.1, 0.0, effect=False) is None


def test_v3s_plateau_counts_a_point_exactly_at_the_margin_as_within_it():
    """|0.75 - 1| = 0.25 = δ: within (<=), so the curve is settled from x = 1 (share 0.25), not x = 2."""
    c = {("a", 0): (np.array([0.0, 1.0, 2.0, 3.0, 4.0]), np.array([0.0, 0.75, 1.0, 1.0, 1.0]), np.arange(5))}
    assert Q.plateau_from(c, "a", [0], 0.25) == 0.25
    assert Q.plateau_from(c, "a", [0], None) is None


def test_a_mean_curve_whose_last_points_share_a_budget_still_has_one():
    """x = 0, 2, 2 or 0, 0, 2 (two evaluations at one sample count): the budget runs from x[0] to x[-1]."""
    c = {("a", 0): (np.array([0.0, 2.0, 2.0]), np.array([0.0, 1.0, 1.0]), np.arange(3))}
    assert Q._mean_curve(c, "a", [0]) is not None
    c = {("a", 0): (np.array([0.0, 0.0, 2.0]), np.array([0.0, 1.0, 1.0]), np.arange(3))}   # nor to x[-2]
    assert Q._mean_curve(c, "a", [0]) is not None


def test_the_second_half_starts_halfway_between_the_first_and_last_samples():
    """x = 4..8: the second half starts at 6, where the curve is 1, and rises to 3: a move of 2 (half the
    budget measured from 0, or past the end, would read 0 or 2 from other points)."""
    c = {("a", 0): (np.array([4.0, 5.0, 6.0, 7.0, 8.0]), np.array([0.0, 0.0, 1.0, 1.0, 3.0]), np.arange(5)),
         ("a", 1): (np.array([4.0, 5.0, 6.0, 7.0, 8.0]), np.array([0.0, 2.0, 1.0, 1.0, 3.0]), np.arange(5))}
    assert Q.second_half_move(c, "a", [0]) == 2.0
    assert Q.second_half_move(c, "a", [0, 1]) == 2.0 and Q.second_half_move(c, "a", [0, 2]) is None


def test_a_flat_curve_is_settled_from_its_first_point():
    """share 0: the loop stops at the first point (`i > 0` -> `>= 0` walks off the front, `> 1` stops one short)."""
    c = {("a", 0): (np.array([4.0, 5.0, 6.0, 7.0, 8.0]), np.full(5, 0.5), np.arange(5))}
    assert Q.plateau_from(c, "a", [0], 0.01) == 0.0


def _two(ya, yb, x=(4.0, 5.0, 6.0, 7.0, 8.0)):
    curves = {("a", 0): (np.array(x), np.array(ya, float), np.arange(len(x))),
              ("b", 0): (np.array(x), np.array(yb, float), np.arange(len(x)))}
    return curves, {"a": "a", "b": "b"}, {"a": pd.Series([1.0], index=[0]), "b": pd.Series([1.0], index=[0])}


def test_v3s_plateau_is_the_later_of_the_two_shares_and_holds_at_exactly_half():
    curves, r, by_seed = _two([0.0, 1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 1.0, 1.0, 1.0])   # shares 0.25 and 0.5
    assert Q.plateau(curves, r, by_seed, 0.1, 0.0, effect=False) == 0.5


def test_the_effect_plateau_needs_both_curves_to_move_strictly_less_than_half_the_effect():
    """a moves 0.5 over its second half (0 at x = 6 to 0.5); judged at Δ 1 with no margin the bound is 0.5:
    not under it, no plateau; at Δ 1.5 (bound 0.75) there is one, and it reports a's move, the larger."""
    curves, r, by_seed = _two([0.0, 0.0, 0.0, 0.25, 0.5], [0.0, 0.0, 0.1, 0.1, 0.1])
    assert Q.plateau(curves, r, by_seed, None, 1.0) is None
    assert Q.plateau(curves, r, by_seed, None, -1.5) == {"moved": 0.5, "bound": 0.75}
    assert Q.plateau(curves, r, by_seed, 0.4, -1.5) is None   # δ 0.4 caps the bound at 0.2


def _eval_table(counts, acc):
    """One run's eval/problems and eval/accuracy at steps 0, 5, 10."""
    rows = [("r", "a", 0, s, "eval/problems", float(n)) for s, n in zip((0, 5, 10), counts)]
    rows += [("r", "a", 0, s, "eval/accuracy", v) for s, v in zip((0, 5, 10), acc)]
    rows += [("r", "a", 0, s, "samples/total", 64.0 * (s + 1)) for s in (0, 5, 10)]
    return pd.DataFrame(rows, columns=["run", "variant", "seed", "step", "metric", "value"])


def _outcomes(steps_problems):
    return pd.DataFrame([{"run": "r", "variant": "a", "seed": 0, "step": s, "problem": p, "greedy": g, "k_correct": 0}
                         for s, outcomes in steps_problems.items() for p, g in enumerate(outcomes)])


def test_a_run_whose_evaluations_all_scored_every_problem_keeps_its_logged_curve():
    """Nothing to rebuild: the logged accuracies stay, even where outcomes would give other means
    (`min < max` -> `<=` would rebuild every run), and the table keeps its own columns (no index column)."""
    t = _eval_table((4, 4, 4), (0.3, 0.6, 0.9))
    o = _outcomes({0: [1, 0, 0, 0], 5: [1, 1, 0, 0], 10: [1, 1, 1, 1]})
    out = Q.same_problems(t, o)
    assert list(out.columns) == list(t.columns)
    assert out[out.metric == "eval/accuracy"].value.tolist() == [0.3, 0.6, 0.9]


def test_a_subset_run_is_rebuilt_on_the_problems_every_evaluation_scored_and_a_point_they_lack_is_dropped():
    """Step 5 scored problems 0-1, steps 0 and 10 all four: accuracy at 0, 5, 10 on problems 0-1 is 0.5, 1, 1
    (gain 0, 0.5, 0.5); in a second table step 10's outcomes are missing, so its point has no value on the
    subset and leaves the curve rather than staying NaN or keeping its 4-problem value."""
    t = _eval_table((4, 2, 4), (0.25, 1.0, 0.5))
    o = _outcomes({0: [1, 0, 0, 0], 5: [1, 1], 10: [1, 1, 0, 0]})
    out = Q.same_problems(t, o)
    acc = out[out.metric == "eval/accuracy"].sort_values("step")
    assert acc.step.tolist() == [0, 5, 10] and acc.value.tolist() == [0.5, 1.0, 1.0]
    assert list(out.columns) == list(t.columns) and out.index.tolist() == list(range(len(out)))
    lacking = Q.same_problems(t, _outcomes({0: [1, 0, 0, 0], 5: [1, 1]}))
    acc = lacking[lacking.metric == "eval/accuracy"].sort_values("step")
    assert acc.step.tolist() == [0, 5] and acc.value.tolist() == [0.5, 1.0]


def test_reading_once_reads_a_directory_once_inside_and_every_time_outside(tmp_path):
    """rule_changes judges the same results under ten sets of rules inside reading_once(): there a rewritten
    file is not read again (one read per claim), outside it every call reads it (`_read is None` -> a cache that
    never empties would serve stale curves to `findings` after a rerun), and the shared arrays are read-only, so
    that no pass can change what the next one reads."""
    rows = [("a-s0", "a", 0, 0, "samples/total", 64.0), ("a-s0", "a", 0, 0, "clip/frac", 0.1)]
    d = _metrics(tmp_path / "r", rows)
    with Q.reading_once():
        first = Q.run_curves(d, "clip/frac")
        _metrics(d, [rows[0], ("a-s0", "a", 0, 0, "clip/frac", 0.3)])
        assert Q.run_curves(d, "clip/frac") is first and first[("a", 0)][1].tolist() == [0.1]
        with Q.reading_once():              # nested: the outer's reads are kept, and still are after it
            assert Q.run_curves(d, "clip/frac") is first
        assert Q.run_curves(d, "clip/frac") is first
        assert not any(a.flags.writeable for a in first[("a", 0)])
        with pytest.raises(ValueError, match="read-only"):
            first[("a", 0)][0][0] = 0.5     # samples: np.interp's own array, writable unless made read-only
    assert Q.run_curves(d, "clip/frac")[("a", 0)][1].tolist() == [0.3]
    assert Q.run_curves(d, "clip/frac") is not Q.run_curves(d, "clip/frac")


def test_runs_come_in_groupbys_order_whether_the_variant_column_is_categorical_or_not(tmp_path):
    """The curves are split from one sort, not a groupby; callers iterate them in groupby's order, which is a
    categorical's category order and otherwise sorted (`sort=True` -> `False` keeps the file's order)."""
    rows = [(f"{v}-s{s}", v, s, t, m, float(t)) for v in ("b", "c", "a") for s in (1, 0) for t in (0, 1)
            for m in ("samples/total", "clip/frac")]
    plain = _metrics(tmp_path / "plain", rows)
    assert list(Q.run_curves(plain, "clip/frac")) == [(v, s) for v in "abc" for s in (0, 1)]
    table = pd.DataFrame(rows, columns=["run", "variant", "seed", "step", "metric", "value"])
    table["variant"] = pd.Categorical(table.variant, categories=["c", "b", "a"])
    (tmp_path / "cat").mkdir()
    table.to_parquet(tmp_path / "cat" / "metrics.parquet")
    assert list(Q.run_curves(tmp_path / "cat", "clip/frac")) == [(v, s) for v in "cba" for s in (0, 1)]


@pytest.mark.parametrize("how", ["categorical", "categorical with a missing value", "plain"])
def test_labels_and_per_label_read_each_row_as_astype_str_does(how):
    """The fast path reads a categorical's categories once; a missing value (code -1) must not take it, where it
    would read the last category (`not` dropped, or `any` -> `all`: one missing value among others)."""
    values = ["run-b", "run-a", None, "run-b", 7] if how == "categorical with a missing value" else \
        ["run-b", "run-a", "run-b", 7]
    column = pd.Series(pd.Categorical(values) if how != "plain" else values, dtype=None if how != "plain" else object)
    want = [None if pd.isna(w) else w for w in column.astype(str)]   # a missing value stays missing
    got = Q.labels(column)
    assert got.dtype == object and [None if pd.isna(w) else w for w in got] == want
    assert Q.per_label(column, lambda s: s.endswith("b")).tolist() == [w is not None and w.endswith("b") for w in want]
