"""Verdicts: Holm over a family, TOST, and one outcome per ordering from the two tests together, with the interval
the outcome used and the words that say what was shown (docs/statistics.md, "Six outcomes" and "Outcome words").

`Rules` names the choices that changed between FINDINGS v3 and v4, so that analysis/rule_changes.py can
replay v3's rules one change at a time on the committed results; every caller uses V4.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats as st

from .aggregates import prob_improvement
from .crossed import crossed_pair, crossed_seeds
from .paired import ALPHA, EXACT_MAX, EXACT_MAX_V3, MAX_SEEDS, holm, holm_levels, two_sample
from .power import mde, mde_se, seeds_for_equivalence, seeds_to_detect, tost


@dataclass(frozen=True)
class Rules:
    """The verdict rules that FINDINGS v4 changed (each field: v4's value by default, v3's in V3)."""
    crossed_floor: bool = True     # 1: the seeds x problems test keeps the seed term (MS floored at MS_resid)
    claim_family: bool = True      # 2: "holds on some tasks" Holm-corrected across the claim's tasks
    plateau_effect: bool = True    # 3: a plateau judged against min(final |delta|, margin), not the margin
    margins: str = "v4"            # 4: task margins from one odds ratio; relative KL margins on the log scale
    size_words: bool = True        # 5: "holds, size unclear" where the interval does not clear the margin
    exact_max: int = EXACT_MAX     # 6: every sign pattern up to this many pairs
    mechanism: bool = True         # 7: an ordering whose declared diagnostic stays under its threshold is not judged


V4 = Rules()
V3 = Rules(False, False, False, "v3", False, EXACT_MAX_V3, False)
OUTCOMES = ("holds", "holds, size unclear", "holds, negligible", "equivalent", "reversed, negligible",
            "reversed, size unclear", "reversed", "undecided")
UNCLEAR = ", size unclear"
NOT_TESTABLE = "not testable"


def compare_pairs(groups: dict[str, pd.Series | np.ndarray], pairs: list[tuple[str, str, str | None]],
                  margin: float | None, alpha: float = ALPHA,
                  tables: dict[tuple[str, str], np.ndarray] | None = None, rules: Rules = V4) -> list[dict]:
    """Every pair (a, b, claim) tested, Holm-corrected over the list, each with its MDE, TOST and verdict.

    claim: ">" (the claim says a beats b), "=" (no difference) or None (a plain pair of an ablation).
    groups: per-seed values by variant; Series indexed by seed pair up where the seeds match.
    A paired comparison whose every difference is exactly 0 (the two variants ran the same numbers) is
    not testable: its row says so (`verdict` "not testable", `why`) and it stays out of Holm's m.
    tables: (a, b) -> the (seeds, problems) table of a's outcomes minus b's, where the pair's values are
    held-out accuracies kept problem by problem: the pair is then tested on it (crossed_pair), for new
    problems as well as new seeds.
    Returns one dict per pair, in the list's order (see `two_sample`, `judge` and `interval` for the keys).
    """
    rows = []
    for a, b, claim in pairs:
        r = two_sample(groups[a], groups[b], rules.exact_max) | {"a": a, "b": b, "claim": claim, "margin": margin, "why": None,
                                                "poi": prob_improvement(np.asarray(groups[a], float),
                                                                        np.asarray(groups[b], float))}
        if tables and (a, b) in tables and r["paired"]:
            crossed_pair(r, tables[(a, b)], rules.crossed_floor)
        if r["paired"] and r["diff"] == 0 and r["sd"] == 0:
            r["why"] = f"every paired difference is exactly 0 ({r['n']} seeds): the two ran the same numbers"
        rows.append(r)
    decide([r for r in rows if r["why"] is None], alpha, rules)
    for r in rows:
        if r["why"] is not None:
            r |= {"p_holm": math.nan, "level": math.nan, "significant": False, "p_tost": math.nan,
                  "p_tost_holm": math.nan, "equivalent": False, "mde": math.nan, "outcome": NOT_TESTABLE,
                  "verdict": NOT_TESTABLE, "seeds_needed": None, "seeds_basis": None,
                  "ci": (r["diff"], r["diff"], math.nan, "no interval: nothing varies")}
    return rows


def decide(rows: list[dict], alpha: float = ALPHA, rules: Rules = V4) -> list[dict]:
    """Holm over `rows` (one family: the difference tests, and the TOSTs, each row within its own r["margin"]),
    then each row's outcome, interval and words. Called on a task's orderings (compare_pairs), and again on
    copies of a claim's orderings across its tasks (findings: "holds on some tasks")."""
    ps = [r["p"] for r in rows]
    tosts = [tost(r["diff"], r["se"], r["df"], r["margin"]) if r["margin"] else 1.0 for r in rows]
    for r, ph, level, pt, pth in zip(rows, holm(ps), holm_levels(ps, alpha), tosts, holm(tosts)):
        r |= {"p_holm": ph, "level": level, "significant": ph < alpha, "p_tost": pt,
              "p_tost_holm": pth, "equivalent": bool(r["margin"]) and pth < alpha, "m": len(rows)}
        judge(r)
        interval(r, alpha, len(rows))
        if rules.size_words:
            size_unclear(r)
    return rows


def clears(r: dict) -> bool:
    """The row's interval lies beyond the margin on the side of its Δ (beyond 0 where there is no margin)."""
    lo, hi = r["ci"][:2]
    m = r["margin"] or 0.0
    return lo > m if r["diff"] > 0 else hi < -m


def size_unclear(r: dict) -> dict:
    """v4's words: a significant difference not shown within ±δ whose interval still reaches inside ±δ is real
    but of unclear size: *holds, size unclear* (not *holds*, which now says the interval clears δ); an "a = b"
    it refutes *fails, size unclear*."""
    if r["outcome"] in ("holds", "reversed") and not clears(r):
        r["outcome"] += UNCLEAR
        if r["verdict"] in ("holds", "reversed", "fails"):
            r["verdict"] += UNCLEAR
    return r


def judge(r: dict) -> dict:
    """The outcome of one tested pair from its Holm-adjusted difference test and TOST together:

        significant, not equivalent within ±δ   holds (a − b > 0) / reversed (a − b < 0)
        significant and equivalent               holds, negligible / reversed, negligible
        equivalent, not significant              equivalent
        neither                                  undecided (with the seeds that would decide it)

    r["outcome"] is one of OUTCOMES, read along "a > b" (", size unclear" is added by size_unclear once the
    interval is known). r["verdict"] is what the row says of its claim: the outcome itself for "a > b" and for
    a plain pair (claim None); for "a = b": holds (equivalent, or a negligible difference either way), fails (a
    difference not shown to be within ±δ) or undecided."""
    paired, level = r["paired"], r["level"]
    crossed = r.get("crossed")
    r["mde"] = mde_se(r["se"], r["df"], level) if crossed else mde(r["sd"], r["n"], level, paired)
    sig, eq = r["significant"], r["equivalent"]
    if sig:
        outcome = ("holds" if r["diff"] > 0 else "reversed") + (", negligible" if eq else "")
    else:
        outcome = "equivalent" if eq else "undecided"
    r["outcome"] = outcome
    if r["claim"] == "=":
        r["verdict"] = "holds" if eq else "fails" if sig else "undecided"
    else:
        r["verdict"] = outcome
    r["seeds_needed"], r["seeds_basis"] = None, None
    if outcome == "undecided" and crossed:
        r["seeds_needed"], r["seeds_basis"] = crossed_seeds(r, level)
    elif outcome == "undecided":
        # the cheaper of the two ways it can be decided, if the observed difference were the true one
        n_sig = seeds_to_detect(r["diff"], r["sd"], level, paired)
        n_eq = seeds_for_equivalence(r["diff"], r["sd"], r["margin"], level, paired) if r["margin"] else MAX_SEEDS + 1
        r["seeds_needed"], r["seeds_basis"] = (n_sig, "observed") if n_sig <= n_eq else (n_eq, "margin")
    return r



def _adjusted(alpha: float, p: float, p_holm: float, fallback: float) -> float:
    """The unadjusted level at which this p passes exactly when its Holm-adjusted p passes alpha:
    alpha p / p_holm (Holm's p is this p times a factor >= 1, capped at 1)."""
    return alpha * p / p_holm if p_holm > 0 and p > 0 else fallback


def interval(r: dict, alpha: float = ALPHA, m: int = 1) -> dict:
    """The interval the row's outcome was decided by, r["ci"] = (low, high, confidence, label):

    - an equivalent row: TOST's, diff ± t(1 − a) se at a = alpha p_tost / p_tost_holm, the (1 − 2a)
      interval (90% when Holm adjusts nothing); it lies inside ±δ exactly when TOST's Holm p < alpha;
    - every other row: the difference test's, diff ± t(1 − a/2) se at a = alpha p / p_holm, the (1 − a)
      interval; for a t-test row it excludes 0 exactly when its Holm p < alpha (a sign-flip row's p is the
      permutation test's, so at the edge the t interval and that test can disagree).
    m: the number of rows Holm adjusted together; the label says "Holm-adjusted" when it is above 1."""
    se, df, diff = r["se"], r["df"], r["diff"]
    if r["outcome"] == "equivalent":
        a = _adjusted(alpha, r["p_tost"], r["p_tost_holm"], alpha)
        half = float(st.t.ppf(1 - a, df)) * se if se > 0 else 0.0
        conf, kind = 1 - 2 * a, "TOST" + (", Holm-adjusted" if m > 1 else "")
    else:
        a = _adjusted(alpha, r["p"], r["p_holm"], r["level"])
        half = float(st.t.ppf(1 - a / 2, df)) * se if se > 0 else 0.0
        conf, kind = 1 - a, "Holm-adjusted" if m > 1 else ""
    r["ci"] = (diff - half, diff + half, conf, f"{kind} {_percent(conf)} CI".strip())
    return r


def _percent(x: float) -> str:
    """0.9 -> '90%', 0.98333 -> '98.3%', 0.99958 -> '99.96%' (never '100%')."""
    text = f"{100 * x:.1f}".removesuffix(".0")
    return (f"{100 * x:.2f}" if text == "100" else text) + "%"


def interval_text(r: dict) -> str:
    """'+0.012 [−0.003, +0.027] (Holm-adjusted 98.3% CI)' — the row's Δ and the interval its outcome used."""
    lo, hi, _, label = r["ci"]
    if r["verdict"] == NOT_TESTABLE:
        return f"{r['diff']:+.3f} ({label})"
    return f"{r['diff']:+.3f} [{lo:+.3f}, {hi:+.3f}] ({label})"


def verdict_text(r: dict) -> str:
    """The row's verdict in words: the outcomes for "a > b", holds / fails for "a = b", an order for a plain
    pair; an undecided row with the seeds that would decide it; a not testable one with why."""
    v, o, a, b = r["verdict"], r.get("outcome"), r["a"], r["b"]
    if v == NOT_TESTABLE:
        return f"not testable here: {r['why']}"
    if o == "undecided":
        if not (math.isfinite(r["diff"]) and math.isfinite(r.get("sd", 0.0))):
            return "undecided (some values are not finite)"
        n = r["seeds_needed"]
        side = "pairs" if r["paired"] else "seeds per side"
        if n > MAX_SEEDS and r["seeds_basis"] == "problems":
            return ("undecided (no number of seeds would decide it: how a − b varies across problems, which a "
                    f"new held-out set of {r['crossed']['problems']:,} would redraw, is as large as Δ)")
        if n > MAX_SEEDS:
            return f"undecided (more than {MAX_SEEDS} {side} would be needed)"
        why = "to detect the observed Δ" if r["seeds_basis"] == "observed" else f"to show it within ±{r['margin']:g}"
        return f"undecided (about {n} {side} {why})"
    within = f"within ±{r['margin']:g}" if r["margin"] else ""
    first, second = (a, b) if r["diff"] > 0 else (b, a)
    order = f"`{first}` > `{second}`"
    if r["claim"] == "=":
        if v == "holds":
            return (f"holds: equivalent {within}" if o == "equivalent"
                    else f"holds: {order} by a negligible Δ ({within})")
        if v.endswith(UNCLEAR):
            return f"fails, size unclear: {order}, not shown {within}, nor beyond it"
        return f"fails: {order}, beyond ±{r['margin']:g}" if r["margin"] else f"fails: {order}"
    unclear = f" (its interval reaches inside ±{r['margin']:g})" if r["margin"] else ""
    if r["claim"] is None:
        if o == "equivalent":
            return f"equivalent {within}"
        return order + (f", negligible ({within})" if o.endswith("negligible") else
                        f", size unclear{unclear}" if o.endswith(UNCLEAR) else "")
    if o == "equivalent":
        return f"equivalent {within}"
    return o + (f" ({within})" if o.endswith("negligible") else unclear if o.endswith(UNCLEAR) else "")


def which_test(r: dict) -> str:
    """What the row's p comes from, with ρ where paired: 'paired t, ρ +0.86', 'Welch t'; ρ — where a
    variant has no spread or there are fewer than three pairs."""
    if not r["paired"]:
        return r["test"]
    return r["test"] + (", ρ —" if math.isnan(r["rho"]) else f", ρ {r['rho']:+.2f}")


def power_text(r: dict) -> str:
    """The detectable effect at the row's Holm level, or the margin an equivalence was shown within."""
    if r["verdict"] == NOT_TESTABLE:
        return "—"
    if r["equivalent"]:
        return f"±{r['margin']:g} (TOST p_holm {r['p_tost_holm']:.2g})"
    return f"MDE {r['mde']:.3f} (α {r['level']:.3g})"

