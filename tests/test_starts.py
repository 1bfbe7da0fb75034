"""Replication across starts (issue 41): the variance a result owes to its start, and on how many starts an
ordering holds."""
import json

import numpy as np
import pytest
from scipy.stats import f_oneway

from grpo_bench.analysis import compare
from grpo_bench.analysis.findings_text import across, starts


def test_variance_components_by_hand_and_against_scipys_anova():
    # balanced: means 2 and 5 (grand 3.5), MSB = 3 x (1.5² + 1.5²) = 13.5, MSW = (2 + 2) / 4 = 1, n0 = 3
    vb, vw, p = compare.variance_components([np.array([1.0, 2, 3]), np.array([4.0, 5, 6])])
    assert (vb, vw) == pytest.approx(((13.5 - 1) / 3, 1.0))
    assert p == pytest.approx(f_oneway([1, 2, 3], [4, 5, 6]).pvalue)
    # unequal sizes: n0 = (N - sum n_i^2 / N) / (k - 1), the between part floored at 0
    g = [np.array([0.80, 0.82]), np.array([0.79, 0.83, 0.81]), np.array([0.81, 0.80, 0.82, 0.79])]
    vb, vw, p = compare.variance_components(g)
    n, sizes = 9, np.array([2, 3, 4])
    grand = np.concatenate(g).mean()
    msb = sum(len(x) * (x.mean() - grand) ** 2 for x in g) / 2
    msw = sum(((x - x.mean()) ** 2).sum() for x in g) / (n - 3)
    assert vw == pytest.approx(msw) and vb == max(0.0, (msb - msw) / ((n - (sizes ** 2).sum() / n) / 2))
    assert vb == 0.0 and p == pytest.approx(f_oneway(*g).pvalue)   # these starts differ less than seeds do


def _side(tmp_path, name, source, values):
    meta = {"configs": {v: {"task": {"model": {"source": source}}} for v in values}}
    return compare.Side(tmp_path / name, name, "final/eval/accuracy", 3,
                        {v: np.array(x, float) for v, x in values.items()}, {}, meta)


def test_compare_gives_the_variance_due_to_the_start(tmp_path):
    sides = [_side(tmp_path, f"s{i}", f"shipped:a_seed{i}", {"grpo": [0.8 + 0.1 * i, 0.81 + 0.1 * i, 0.79 + 0.1 * i],
                                                             "other": [0.5, 0.6, 0.7]}) for i in range(3)]
    lines = compare.between(sides)
    assert lines[0].startswith("Variance due to the start:")
    grpo = next(x for x in lines if x.startswith("| `grpo` |")).split(" | ")
    # means 0.8, 0.9, 1.0 over three seeds each: MSB = 3 x 0.02 / 2 = 0.03, MSW = 1e-4, σ² = (0.03 - 1e-4) / 3
    assert grpo[1] == "3" and float(grpo[2]) == pytest.approx(np.sqrt((0.03 - 1e-4) / 3), abs=1e-4)
    assert float(grpo[3]) == pytest.approx(0.01) and grpo[4] == "99%"
    other = next(x for x in lines if x.startswith("| `other` |")).split(" | ")
    assert float(other[2]) == 0 and other[4] == "0%" and float(other[5].rstrip(" |")) == pytest.approx(1.0)
    # one start under two directories: not a start's variance, the directory's
    sides[1].meta = sides[0].meta
    assert compare.between(sides)[0].startswith("Variance due to the directory:")
    sides[1].column = "final/reward"   # different metrics: no common scale to split
    assert compare.between(sides) == []



def test_variance_components_where_seeds_agree_exactly():
    """No spread within any directory: the F test has no denominator, so p is 0 where the directories differ and 1
    where they do not (every value the same)."""
    assert compare.variance_components([np.array([1.0, 1.0]), np.array([2.0, 2.0])])[1:] == (0.0, 0.0)
    assert compare.variance_components([np.array([1.0, 1.0]), np.array([1.0, 1.0])]) == (0.0, 0.0, 1.0)


def test_compare_takes_a_variant_with_two_seeds_and_leaves_one_with_one(tmp_path):
    """Two seeds are the fewest a spread (between) or a paired test (orderings) needs: a variant with exactly two in
    each directory is split and tested, one with a single seed in a directory is not grouped there."""
    import pandas as pd
    sides = [_side(tmp_path, f"s{i}", f"shipped:a_seed{i}", {"a": [0.5 + i, 0.6 + i], "b": [0.1, 0.2 + i],
                                                             "c": [0.3]}) for i in range(2)]
    sides.append(_side(tmp_path, "s2", "shipped:a_seed2", {"a": [0.7], "b": [0.1, 0.3]}))
    for s in sides:
        s.by_seed = {v: pd.Series(x, index=range(len(x))) for v, x in s.values.items()}
    rows = [x for x in compare.between(sides) if x.startswith("| `")]
    assert [r.split(" | ")[:2] for r in rows] == [["| `a`", "2"], ["| `b`", "3"]]
    table = compare.orderings(sides)
    (pair,) = [x for x in table if x.startswith("| `a` vs `b`")]
    assert pair.count("Δ +") == 2 and pair.split(" | ")[3] == "—" and not any(x.startswith("| `a` vs `c`") for x in table)


def _setting(outcome):
    q = {"outcome": outcome, "verdict": outcome}
    return {"judge": "final", "rows": [{"missing": outcome is None, "claim": ">", "why": None, "unexercised": None,
                                         "quantities": {"final": q}}]}


def test_an_ordering_says_on_how_many_starts_it_holds():
    results = {"lm": _setting("holds"), "lm_seed1": _setting("undecided"), "lm_seed2": _setting("holds"),
               "lm_acts": _setting("holds"), "countdown": _setting("holds")}
    assert starts(results, 0) == {"lm": (2, 3)}       # lm_acts is another regime, not another start
    assert across(results, 0) == (1, 2)               # the arithmetic task holds only where every setting does
    results["lm_seed1"] = _setting(None)              # not run there: two starts
    assert starts(results, 0) == {"lm": (2, 2)}
    results["lm_seed2"] = _setting(None)
    assert starts(results, 0) == {}                   # one start: nothing to replicate across
    # a setting name that holds "_seed" twice: its start is the last suffix's, its base the rest
    odd = {"lm_seed_x": _setting("holds"), "lm_seed_x_seed1": _setting("holds")}
    assert starts(odd, 0) == {"lm_seed_x": (2, 2)}


def test_a_claimed_equivalence_holds_on_a_start_where_its_verdict_holds():
    """"a = b" holds where the verdict (equivalent or negligible) holds, whatever the outcome's words; "a > b"
    where the outcome is *holds*."""
    def eq(verdict, outcome):
        return {"judge": "final", "rows": [{"missing": False, "claim": "=", "why": None, "unexercised": None,
                                             "quantities": {"final": {"outcome": outcome, "verdict": verdict}}}]}
    results = {"lm": eq("holds", "equivalent"), "lm_seed1": eq("holds", "reversed, negligible"),
               "lm_seed2": eq("fails", "undecided")}
    assert starts(results, 0) == {"lm": (2, 3)}


def test_compare_says_whether_the_directories_that_decided_an_order_agree(tmp_path):
    """The orderings column: two directories that both order a before b agree ("the same"), opposite orders say so,
    and where only one directory decided it (the other's difference is noise) there is nothing to agree on."""
    import pandas as pd
    up, down = [0.80, 0.82, 0.81, 0.83, 0.80, 0.82], [0.40, 0.43, 0.41, 0.42, 0.40, 0.44]
    noise = [0.80, 0.41, 0.83, 0.40, 0.44, 0.81]

    def agree(*pairs):
        sides = [_side(tmp_path, f"s{i}", f"shipped:a_seed{i}", {"a": a, "b": b}) for i, (a, b) in enumerate(pairs)]
        for s in sides:
            s.by_seed = {v: pd.Series(x, index=range(len(x))) for v, x in s.values.items()}
        (row,) = [x for x in compare.orderings(sides) if x.startswith("| `a` vs `b`")]
        return row.rsplit(" | ", 1)[1].rstrip(" |")
    assert agree((up, down), (up, down)) == "the same"
    assert agree((up, down), (down, up)) == "opposite"
    assert agree((up, down), (noise, noise[::-1])) == "—"
