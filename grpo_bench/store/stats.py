"""Statistics behind REPORT.md, `compare` and FINDINGS.md: pure functions on numbers, no plotting.

What a comparison of two variants on per-seed final values does (docs/statistics.md says why):
- paired when the two share their seeds (common random numbers make their runs correlated):
  per-seed differences, paired t below N_PERM pairs, an exact sign-flip permutation test
  from N_PERM up (Monte Carlo past EXACT_MAX); Welch's t when the seeds differ;
- Holm's correction over the orderings asked; each ordering's minimum detectable effect
  (MDE) at 80% power at the level Holm compared its p with; TOST equivalence within a
  margin; one of six outcomes from the two tests together (`judge`): holds, holds but
  negligible (inside the margin), equivalent, reversed but negligible, reversed, undecided
  (with the seeds per side that would decide it); an ordering whose every paired difference
  is exactly 0 is not testable and stays out of Holm; the interval printed is the one the
  outcome used (`interval`);
- robust aggregates as rliable defines them (Agarwal et al. 2021): the interquartile mean
  with a stratified bootstrap CI and the probability of improvement P(X > Y);
- ScaleRL's saturating curve R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) fitted to a mean
  curve against compute, with bootstrap CIs over seeds and a half-budget extrapolation check;
- a group-sequential decision for seeds run in batches: O'Brien-Fleming-type alpha
  spending (Lan-DeMets), `sequential_decision`, for `run --seeds auto:N`;
- the variance of a variant's mean held-out accuracy split between seeds and problems (a crossed
  random-effects decomposition of the per-problem outcomes, `crossed_variance`) and the interval that
  counts both.
Powers, MDEs and TOST are computed here and checked against statsmodels in the tests.
"""
from __future__ import annotations

import math
import re
from functools import lru_cache

import numpy as np
import pandas as pd
from scipy import optimize
from scipy import stats as st

from . import metrics

ALPHA = 0.05
POWER = 0.8
N_PERM = 10      # from this many pairs up the sign-flip test drives the verdict (its smallest p is 2 / 2^n)
EXACT_MAX = 16   # up to this many pairs the sign flips are enumerated (2^16 = 65,536)
N_MC = 20_000    # sign flips drawn past EXACT_MAX, from a fixed seed
N_BOOT = 2000    # bootstrap resamples for IQM and P(X > Y)
MAX_SEEDS = 1000  # "about N seeds" is not worth computing past this

def default_margin(column: str) -> float | None:
    """The equivalence margin a metric declares for itself (grpo_bench/store/metrics.py; none of the core's do),
    used where neither the claim nor the task says; None where none is declared."""
    return metrics.get(column).margin


RELATIVE_MARGIN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s+of\s+(\S+)\s*$")


def relative_margin(m) -> tuple[float, str] | None:
    """(share, variant) of a margin written "P% of VARIANT" (P% of that variant's mean on the judged metric,
    for a metric whose scale only a run can tell: a KL drift), else None."""
    g = RELATIVE_MARGIN.match(m) if isinstance(m, str) else None
    return (float(g[1]) / 100, g[2]) if g else None


def claim_margin(claim: dict | None, setting: str | None, column: str,
                 task: "metrics.TaskInfo | None" = None, means: pd.Series | None = None) -> tuple[float | None, str]:
    """(margin, where it comes from): the claim's `margin` (one number, one per setting, or "P% of VARIANT":
    that share of the variant's mean in `means`), else the task's own margin when the column is the task's
    verdict metric (or that less a constant), else the metric's."""
    m = (claim or {}).get("margin")
    if isinstance(m, dict):
        m = m.get(setting)
    if m is not None:
        rel = relative_margin(m)
        if rel is None:
            return float(m), "the claim's margin"
        share, ref = rel
        ref_mean = float(means[ref]) if means is not None and ref in means.index else math.nan
        if not math.isfinite(ref_mean) or ref_mean == 0:
            return None, f"the claim's margin, {m.strip()}, with no mean of `{ref}` to take it from"
        # three significant digits, as a task's margin is rounded: the number printed is the number used
        return float(f"{share * abs(ref_mean):.3g}"), f"the claim's margin: {m.strip()}, whose mean here is {abs(ref_mean):.3g}"
    offset = metrics.get(column).offset_of  # accuracy gain is accuracy less a constant: the same differences
    if task is not None and task.margin is not None and task.verdict_metric in (
            column, offset and metrics.final_column(offset)):
        return task.margin, f"the task's: {task.margin_rule}"
    m = default_margin(column)
    return m, ("the metric's declared margin" if m is not None else "no margin declared for this metric")


# ------------------------------------------------------------------ two-sample tests


def schedule_note(summary: pd.DataFrame) -> str:
    """'' when a summary's finished runs ran on one device at one thread count, else a sentence (REPORT.md's,
    and collect's on stderr) counting the runs of each: their numbers are not bitwise those of one schedule, so
    two variants that would tie exactly (not testable) can differ in the last bits. The population size and
    the executor never change a number (runner.SCHEDULE)."""
    cols = [c for c in ("device", "threads") if c in summary.columns]
    if not cols or "status" not in summary.columns:
        return ""
    ok = summary[(summary.status == "ok") & summary[cols].notna().all(axis=1)]
    counts = ok.groupby(cols, sort=True).size()
    if len(counts) < 2:
        return ""

    def kind(key) -> str:
        key = dict(zip(cols, key if isinstance(key, tuple) else (key,)))
        n = int(key["threads"]) if "threads" in key else None
        return ", ".join([str(key["device"])] * ("device" in key) + [f"{n} thread{'s' * (n != 1)}"] * (n is not None))

    kinds = "; ".join(f"{kind(k)}: {n} run{'s' * (n != 1)}" for k, n in counts.items())
    return (f"the finished runs here ran on different devices or thread counts ({kinds}); their numbers may differ "
            "in the last bits from one schedule's: variants that would tie exactly can differ by that much "
            "(population size and executor never change a number)")


def t_from_summary(diff: float, se: float, df: float) -> tuple[float, float, float]:
    """(two-sided p, CI low, CI high at 95%) of a t statistic diff / se; se = 0 means no noise at all."""
    if se == 0:
        return (0.0 if diff != 0 else 1.0), diff, diff
    half = float(st.t.ppf(0.975, df)) * se
    return float(2 * st.t.sf(abs(diff) / se, df)), diff - half, diff + half


def welch_se(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(standard error of mean(x) - mean(y), Welch-Satterthwaite degrees of freedom)."""
    vx, vy = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    se = math.sqrt(vx + vy)
    if se == 0:
        return 0.0, float(len(x) + len(y) - 2)
    return se, (vx + vy) ** 2 / (vx ** 2 / (len(x) - 1) + vy ** 2 / (len(y) - 1))


def sign_flip_p(d: np.ndarray, n_mc: int = N_MC, seed: int = 0) -> tuple[float, bool]:
    """Two-sided p of a sign-flip permutation test on paired differences d (H0: symmetric about 0).

    Statistic |sum(d)|; every one of the 2^n sign patterns up to EXACT_MAX pairs (returns exact=True),
    else n_mc random patterns from a fixed seed with the (1 + hits) / (1 + n_mc) correction.
    """
    d = np.asarray(d, float)
    n = len(d)
    obs = abs(d.sum())
    if obs == 0:
        return 1.0, n <= EXACT_MAX
    if n <= EXACT_MAX:
        bits = (np.arange(2 ** n)[:, None] >> np.arange(n)) & 1  # (2^n, n): every sign pattern
        sums = np.abs((1 - 2 * bits) @ d)
        exact = True
    else:
        sums = np.abs(np.random.default_rng(seed).choice([-1.0, 1.0], size=(n_mc, n)) @ d)
        exact = False
    hits = int(np.sum(sums >= obs * (1 - 1e-12)))  # the observed pattern (and its mirror) counts, float-safe
    return (hits / len(sums), True) if exact else ((1 + hits) / (1 + n_mc), False)


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Correlation across seeds, NaN below three pairs or without spread."""
    if len(x) < 3 or x.std() == 0 or y.std() == 0:
        return math.nan
    return float(np.corrcoef(x, y)[0, 1])


def two_sample(x: pd.Series | np.ndarray, y: pd.Series | np.ndarray) -> dict:
    """Compare per-seed values of a (x) with b (y): mean(x) - mean(y), its CI, the test and its p.

    Paired when both are Series indexed by the same set of seeds (two or more): the runs of a
    seed share their starting weights, prompts and sampling noise, so x_s - y_s cancels what the
    seed alone decides. Otherwise (arrays, or seeds that do not match) Welch's unequal-variance t.
    """
    paired = isinstance(x, pd.Series) and isinstance(y, pd.Series) and len(x) >= 2 \
        and x.index.is_unique and y.index.is_unique and set(x.index) == set(y.index)
    if paired:
        y = y.loc[x.index]
    xa, ya = np.asarray(x, float), np.asarray(y, float)
    out = {"n_a": len(xa), "n_b": len(ya), "mean_a": float(xa.mean()), "mean_b": float(ya.mean()),
           "paired": paired, "rho": math.nan, "p_perm": math.nan}
    if paired:
        d = xa - ya  # a - b, seed by seed: the sign every later step reads
        n = len(d)
        sd = float(d.std(ddof=1))
        se, df = sd / math.sqrt(n), n - 1
        diff = float(d.mean())
        p_t, lo, hi = t_from_summary(diff, se, df)
        out |= {"rho": pearson(xa, ya), "sd": sd, "n": n}
        if n >= N_PERM:
            out["p_perm"], exact = sign_flip_p(d)
            out["test"] = "sign-flip, exact" if exact else f"sign-flip, {N_MC:,} draws"
        else:
            out["test"] = "paired t"
        p = out["p_perm"] if n >= N_PERM else p_t
    else:
        diff = out["mean_a"] - out["mean_b"]
        se, df = welch_se(xa, ya)
        p_t, lo, hi = t_from_summary(diff, se, df)
        pooled = ((len(xa) - 1) * xa.var(ddof=1) + (len(ya) - 1) * ya.var(ddof=1)) / (len(xa) + len(ya) - 2)
        out |= {"test": "Welch t", "sd": math.sqrt(pooled), "n": min(len(xa), len(ya))}
        p = p_t
    return out | {"diff": diff, "lo": lo, "hi": hi, "se": se, "df": df, "p_t": p_t, "p": float(p)}


def holm(ps: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values (capped at 1, never decreasing along the sorted p)."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    out, running = [0.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
        out[i] = running
    return out


def holm_levels(ps: list[float], alpha: float = ALPHA) -> list[float]:
    """The level Holm compares each p with: alpha / (m - rank), rank 0 for the smallest p."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    out = [0.0] * len(ps)
    for rank, i in enumerate(order):
        out[i] = alpha / (len(ps) - rank)
    return out


# ---------------------------------------------------------------- power and equivalence


def _nobs_eff(n: float, paired: bool) -> tuple[float, float]:
    """(effective sample size, degrees of freedom) of a paired test on n pairs or a two-sample one, n a side."""
    return (n, n - 1) if paired else (n / 2, 2 * n - 2)


def _nct_sf(x: float, df: float, nc: float) -> float:
    """P(T > x) for a noncentral t; scipy returns NaN far in a tail (e.g. nct.cdf(-3.9, 4, 13.9)),
    where the normal approximation of the noncentral t is ample (the probability is ~0 or ~1)."""
    p = float(st.nct.sf(x, df, nc))
    return p if math.isfinite(p) else float(st.norm.sf((x - nc) / math.sqrt(1 + x * x / (2 * df))))


def power(effect: float, n: float, alpha: float, paired: bool = True) -> float:
    """Power of the two-sided t-test at standardised effect d (mean / sd), n pairs or n per side."""
    nobs, df = _nobs_eff(n, paired)
    nc, crit = effect * math.sqrt(nobs), st.t.isf(alpha / 2, df)
    return _nct_sf(crit, df, nc) + _nct_sf(crit, df, -nc)  # P(T > crit) + P(T < -crit)


def mde(sd: float, n: int, alpha: float, paired: bool = True, target: float = POWER) -> float:
    """Smallest difference the two-sided t-test detects with probability `target` (same units as sd)."""
    if sd == 0:
        return 0.0
    if not math.isfinite(sd):  # an inf or NaN value among the seeds: no difference is detectable
        return math.nan if math.isnan(sd) else math.inf
    f = lambda e: power(e, n, alpha, paired) - target  # noqa: E731
    if f(1e3) < 0:  # two seeds at a tiny level: nothing short of a huge effect
        return math.inf
    d = optimize.brentq(f, 1e-9, 1e3, xtol=1e-12)
    return float(d * sd)


def seeds_to_detect(effect: float, sd: float, alpha: float, paired: bool = True, target: float = POWER) -> int:
    """Pairs (paired) or seeds per side (unpaired) for the t-test to detect `effect` at `target` power;
    MAX_SEEDS + 1 where no number would (an effect or sd that is not finite included)."""
    if not (math.isfinite(effect) and math.isfinite(sd)):
        return MAX_SEEDS + 1
    if sd == 0 or effect == 0:
        return 2 if sd == 0 and effect != 0 else MAX_SEEDS + 1
    f = lambda n: power(abs(effect) / sd, n, alpha, paired) - target  # noqa: E731
    if f(MAX_SEEDS) < 0:
        return MAX_SEEDS + 1
    return 2 if f(2) >= 0 else math.ceil(optimize.brentq(f, 2, MAX_SEEDS, xtol=1e-6))


def tost(diff: float, se: float, df: float, margin: float) -> float:
    """p of two one-sided t-tests that -margin < true difference < margin (equivalence when p < alpha)."""
    if se == 0:
        return 0.0 if abs(diff) < margin else 1.0
    lower = st.t.sf((diff + margin) / se, df)  # H0: difference <= -margin
    upper = st.t.cdf((diff - margin) / se, df)  # H0: difference >= +margin
    return float(max(lower, upper))


def tost_power(diff: float, sd: float, n: float, margin: float, alpha: float, paired: bool = True) -> float:
    """Power of TOST within +-margin at a true difference diff: P(lower) + P(upper) - 1, a lower bound
    (Bonferroni's inequality for the intersection of the two one-sided rejections)."""
    nobs, df = _nobs_eff(n, paired)
    crit, scale = st.t.isf(alpha, df), math.sqrt(nobs) / sd
    p_lower = _nct_sf(crit, df, (diff + margin) * scale)
    p_upper = _nct_sf(crit, df, (margin - diff) * scale)  # P(T < -crit) at nc = (diff - margin) scale
    return float(max(0.0, p_lower + p_upper - 1))


def seeds_for_equivalence(diff: float, sd: float, margin: float, alpha: float, paired: bool = True,
                          target: float = POWER) -> int:
    if not (math.isfinite(diff) and math.isfinite(sd)) or abs(diff) >= margin:
        return MAX_SEEDS + 1
    if sd == 0:
        return 2
    f = lambda n: tost_power(diff, sd, n, margin, alpha, paired) - target  # noqa: E731
    if f(MAX_SEEDS) < 0:
        return MAX_SEEDS + 1
    return 2 if f(2) >= 0 else math.ceil(optimize.brentq(f, 2, MAX_SEEDS, xtol=1e-6))


# -------------------------------------------------------------------------- verdicts


OUTCOMES = ("holds", "holds, negligible", "equivalent", "reversed, negligible", "reversed", "undecided")
NOT_TESTABLE = "not testable"


def compare_pairs(groups: dict[str, pd.Series | np.ndarray], pairs: list[tuple[str, str, str | None]],
                  margin: float | None, alpha: float = ALPHA,
                  tables: dict[tuple[str, str], np.ndarray] | None = None) -> list[dict]:
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
        r = two_sample(groups[a], groups[b]) | {"a": a, "b": b, "claim": claim, "margin": margin, "why": None,
                                                "poi": prob_improvement(np.asarray(groups[a], float),
                                                                        np.asarray(groups[b], float))}
        if tables and (a, b) in tables and r["paired"]:
            crossed_pair(r, tables[(a, b)])
        if r["paired"] and r["diff"] == 0 and r["sd"] == 0:
            r["why"] = f"every paired difference is exactly 0 ({r['n']} seeds): the two ran the same numbers"
        rows.append(r)
    tested = [r for r in rows if r["why"] is None]
    ps = [r["p"] for r in tested]
    tosts = [tost(r["diff"], r["se"], r["df"], margin) if margin else 1.0 for r in tested]
    for r, ph, level, pt, pth in zip(tested, holm(ps), holm_levels(ps, alpha), tosts, holm(tosts)):
        r |= {"p_holm": ph, "level": level, "significant": ph < alpha, "p_tost": pt,
              "p_tost_holm": pth, "equivalent": bool(margin) and pth < alpha}
        judge(r)
        interval(r, alpha, len(tested))
    for r in rows:
        if r["why"] is not None:
            r |= {"p_holm": math.nan, "level": math.nan, "significant": False, "p_tost": math.nan,
                  "p_tost_holm": math.nan, "equivalent": False, "mde": math.nan, "outcome": NOT_TESTABLE,
                  "verdict": NOT_TESTABLE, "seeds_needed": None, "seeds_basis": None,
                  "ci": (r["diff"], r["diff"], math.nan, "no interval: nothing varies")}
    return rows


def judge(r: dict) -> dict:
    """The outcome of one tested pair from its Holm-adjusted difference test and TOST together:

        significant, not equivalent within ±δ   holds (a − b > 0) / reversed (a − b < 0)
        significant and equivalent               holds, negligible / reversed, negligible
        equivalent, not significant              equivalent
        neither                                  undecided (with the seeds that would decide it)

    r["outcome"] is one of OUTCOMES, read along "a > b". r["verdict"] is what the row says of its claim:
    the outcome itself for "a > b" and for a plain pair (claim None); for "a = b": holds (equivalent, or a
    negligible difference either way), fails (a difference not shown to be within ±δ) or undecided."""
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


def crossed_pair(r: dict, D: np.ndarray) -> dict:
    """Re-test a paired row on D, the (seeds, problems) table of a's held-out outcomes minus b's on the same
    seeds and problems: its mean is the row's Δ, and crossed_variance splits Δ's variance into seeds, problems
    (how a − b varies across problems, as a new held-out set would draw them) and their interaction; the test
    is t on that standard error with Satterthwaite's degrees of freedom, and TOST, the interval, the MDE and
    the seeds that would decide an undecided row all use it. Left as it was (seeds only) where D does not
    give the row's Δ (other problems, another evaluation) or nothing varies."""
    c = crossed_variance(D)
    if c is None or c["var_mean"] <= 0 or not math.isclose(c["mean"], r["diff"], rel_tol=1e-9, abs_tol=1e-9):
        return r
    se, df = math.sqrt(c["var_mean"]), c["df"]
    p_t, lo, hi = t_from_summary(r["diff"], se, df)
    r |= {"se": se, "df": df, "p": p_t, "p_t": p_t, "lo": lo, "hi": hi, "p_perm": math.nan,
          "test": f"seeds × problems t ({c['problems']:,} problems, {df:.0f} df)",
          "crossed": {k: c[k] for k in ("seeds", "problems", "seed", "problem", "resid", "share")}}
    return r


def _power_se(effect: float, se: float, df: float, alpha: float) -> float:
    """Power of the two-sided t-test of a difference whose estimate has standard error se, at a true `effect`."""
    nc, crit = abs(effect) / se, st.t.isf(alpha / 2, df)
    return _nct_sf(crit, df, nc) + _nct_sf(crit, df, -nc)


def mde_se(se: float, df: float, alpha: float, target: float = POWER) -> float:
    """mde() for a test given its standard error and degrees of freedom (a crossed row's)."""
    if se == 0:
        return 0.0
    if not math.isfinite(se):
        return math.nan if math.isnan(se) else math.inf
    f = lambda e: _power_se(e, se, df, alpha) - target  # noqa: E731
    hi = 1e3 * se
    if f(hi) < 0:
        return math.inf
    return float(optimize.brentq(f, 1e-12 * se, hi, xtol=1e-12 * se))


def _tost_power_se(diff: float, se: float, df: float, margin: float, alpha: float) -> float:
    crit = st.t.isf(alpha, df)
    return max(0.0, _nct_sf(crit, df, (diff + margin) / se) + _nct_sf(crit, df, (margin - diff) / se) - 1)


def crossed_seeds(r: dict, alpha: float, target: float = POWER) -> tuple[int, str]:
    """(seeds, basis) that would decide an undecided crossed row on the same problems, if its Δ and variance
    components were the true ones: Var(Δ) = (seed + resid / J) / S + problem / J, t on S - 1. More seeds never
    shrink problem / J: where it alone forbids a decision, MAX_SEEDS + 1 with basis "problems"."""
    c, d, m = r["crossed"], r["diff"], r["margin"]
    J = c["problems"]
    per_seed, fixed = c["seed"] + c["resid"] / J, c["problem"] / J

    def decides(n: int) -> str | None:
        se = math.sqrt(per_seed / n + fixed)
        if se == 0 or _power_se(d, se, n - 1, alpha) >= target:
            return "observed"
        if m and abs(d) < m and _tost_power_se(d, se, n - 1, m, alpha) >= target:
            return "margin"
        return None

    if decides(MAX_SEEDS) is None:
        return MAX_SEEDS + 1, "problems" if fixed > 0 and decides(10 ** 9) is None else "observed"
    lo, hi = 2, MAX_SEEDS   # decides() turns on once as n grows: bisect for the first n it does
    if decides(lo):
        return lo, decides(lo)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if decides(mid) else (mid, hi)
    return hi, decides(hi)


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


def split_ordering(o: str) -> tuple[str, str, str]:
    """'a > b', 'a = b' or 'a vs b' -> (a, b, '>' | '=' | 'vs'). With spaces around the sign a label may hold
    '=' itself, as grid labels do ('lr=0.001 > lr=0.002'); without them, one sign and nothing else."""
    m = re.fullmatch(r"\s*(\S.*?)\s+(>|=|vs)\s+(\S.*?)\s*", o)
    if m and not re.search(r"\s(?:>|=|vs)\s", m.group(3)):   # one sign: 'a > b > c' is no ordering
        return m.group(1), m.group(3), m.group(2)
    if not m and o.count(">") + o.count("=") == 1:
        kind = ">" if ">" in o else "="
        a, b = (x.strip() for x in o.split(kind, 1))
        if a and b:
            return a, b, kind
    raise ValueError(f"{o!r}: expected 'a > b' or 'a = b' (a label that holds '=', as grid labels do, "
                     "needs spaces around the sign)")


def verdict_text(r: dict) -> str:
    """The row's verdict in words: six outcomes for "a > b", holds / fails for "a = b", an order for a plain
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
        return f"fails: {order}, not shown {within}" if r["margin"] else f"fails: {order}"
    if r["claim"] is None:
        if o == "equivalent":
            return f"equivalent {within}"
        return order + (f", negligible ({within})" if o.endswith("negligible") else "")
    if o == "equivalent":
        return f"equivalent {within}"
    return o + (f" ({within})" if o.endswith("negligible") else "")


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


# ------------------------------------------------------------------ robust aggregates


def iqm(x: np.ndarray, axis: int = -1) -> np.ndarray | float:
    """Interquartile mean: the mean of the middle half, trimming int(n / 4) values at each end
    (scipy.stats.trim_mean(x, 0.25), the rliable definition)."""
    x = np.sort(np.asarray(x, float), axis=axis)
    n = x.shape[axis]
    k = int(0.25 * n)
    out = np.take(x, np.arange(k, n - k), axis=axis).mean(axis=axis)
    return float(out) if np.ndim(out) == 0 else out


def iqm_ci(scores: np.ndarray, n_boot: int = N_BOOT, seed: int = 0) -> tuple[float, float, float]:
    """(IQM, 95% CI low, high) with rliable's stratified bootstrap: runs are resampled within each task.

    scores: (runs,) for one task, or (runs, tasks); the IQM is over all scores at once.
    """
    x = np.asarray(scores, float).reshape(len(scores), -1)  # (runs, tasks)
    runs, tasks = x.shape
    idx = np.random.default_rng(seed).integers(0, runs, size=(n_boot, runs, tasks))
    boot = iqm(np.take_along_axis(np.broadcast_to(x, (n_boot, runs, tasks)), idx, axis=1).reshape(n_boot, -1))
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return iqm(x.ravel()), float(lo), float(hi)


def prob_improvement(x: np.ndarray, y: np.ndarray) -> float:
    """P(X > Y) of one seed of x against one of y, ties counting half: Mann-Whitney U / (n m)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    return float(((x[..., :, None] > y[..., None, :]) + 0.5 * (x[..., :, None] == y[..., None, :])).mean(axis=(-1, -2)))


def prob_improvement_ci(x: np.ndarray, y: np.ndarray, n_boot: int = N_BOOT, seed: int = 0) -> tuple[float, float, float]:
    """(P(X > Y), 95% CI low, high): x's and y's runs resampled independently, as rliable does."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    rng = np.random.default_rng(seed)
    bx, by = x[rng.integers(0, len(x), (n_boot, len(x)))], y[rng.integers(0, len(y), (n_boot, len(y)))]
    comp = (bx[:, :, None] > by[:, None, :]) + 0.5 * (bx[:, :, None] == by[:, None, :])
    lo, hi = np.percentile(comp.mean(axis=(1, 2)), [2.5, 97.5])
    return prob_improvement(x, y), float(lo), float(hi)


def mean_ci(x: np.ndarray) -> tuple[float, float, float]:
    """(mean, 95% Student-t CI low, high); the CI is the mean itself below two values."""
    x = np.asarray(x, float)
    m = float(x.mean())
    if len(x) < 2:
        return m, m, m
    half = float(st.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return m, m - half, m + half


# ------------------------------------------------- seeds and problems: a crossed design


def crossed_variance(Y: np.ndarray, alpha: float = ALPHA) -> dict:
    """How much of the variance of a variant's mean held-out accuracy comes from its seeds and how much from
    which problems the held-out set happens to hold, and the interval that counts both.

    Y: (seeds, problems) outcomes (0/1, or any number), every seed scored on the same problems: a crossed
    design. Model: y_sj = mu + a_s + b_j + e_sj, independent, zero-mean, variances seed, problem and
    residual (the seed x problem interaction and the coin of each answer). The estimators are the ANOVA
    (method-of-moments) ones of a balanced two-way table without replication, E[MS_seed] = resid + J seed,
    E[MS_problem] = resid + S problem, E[MS_resid] = resid (REML's too where none is negative; a negative
    one is set to 0). The variance of the grand mean, as an estimate of mu over new seeds *and* new problems
    from the same generator, is seed / S + problem / J + resid / (S J); its interval takes Student's t on
    Satterthwaite's degrees of freedom for that sum of mean squares. The seeds-only interval (the mean of
    per-seed means, t on S - 1: what the per-seed tables use) holds the problems fixed: it is the interval
    for this held-out set, and misses problem / J.

    Returns mean, the components, each one's share of the variance of the mean (seeds, problems, residual),
    var_mean, df, ci (both), ci_seeds (seeds only); None below 2 seeds or 2 problems.
    """
    Y = np.asarray(Y, float)
    S, J = Y.shape
    if S < 2 or J < 2:
        return None
    mean = float(Y.mean())
    seed_means, problem_means = Y.mean(1), Y.mean(0)
    ms_seed = J * float(((seed_means - mean) ** 2).sum()) / (S - 1)
    ms_problem = S * float(((problem_means - mean) ** 2).sum()) / (J - 1)
    resid = Y - seed_means[:, None] - problem_means[None, :] + mean
    ms_resid = float((resid ** 2).sum()) / ((S - 1) * (J - 1))
    seed = max(0.0, (ms_seed - ms_resid) / J)
    problem = max(0.0, (ms_problem - ms_resid) / S)
    # var_mean = sum c_i MS_i / (S J): a component set to 0 drops its mean squares from the sum
    c_seed, c_problem = float(seed > 0), float(problem > 0)
    terms = [(c_seed * ms_seed, S - 1), (c_problem * ms_problem, J - 1),
             ((1 - c_seed - c_problem) * ms_resid, (S - 1) * (J - 1))]
    var_mean = sum(t for t, _ in terms) / (S * J)
    parts = {"seeds": seed / S, "problems": problem / J, "residual": ms_resid / (S * J)}
    df = sum(t for t, _ in terms) ** 2 / sum(t ** 2 / d for t, d in terms) if var_mean > 0 else math.inf
    half = float(st.t.ppf(1 - alpha / 2, df)) * math.sqrt(var_mean)
    half_seeds = float(st.t.ppf(1 - alpha / 2, S - 1)) * math.sqrt(ms_seed / (S * J))
    return {"mean": mean, "seeds": S, "problems": J, "seed": seed, "problem": problem, "resid": ms_resid,
            "ms": {"seed": ms_seed, "problem": ms_problem, "resid": ms_resid}, "var_mean": var_mean,
            "share": {k: (v / var_mean if var_mean > 0 else math.nan) for k, v in parts.items()}, "df": df,
            "ci": (mean - half, mean + half), "ci_seeds": (mean - half_seeds, mean + half_seeds)}


# ------------------------------------------------------------- curves against compute

MIN_POINTS = 8        # three parameters need a few more points than that
N_BOOT_FIT = 200      # refits on seeds resampled with replacement
B_RANGE = (0.1, 10.0)  # the search box of the exponent B
DECADE = math.log(10)  # C_mid is searched from a tenth of the first point to ten times the budget


def saturating(C, r0: float, A: float, B: float, C_mid: float):
    """ScaleRL's R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B); R(0) = R0."""
    C = np.asarray(C, float)
    with np.errstate(divide="ignore", over="ignore"):
        return r0 + (A - r0) / (1 + (C_mid / C) ** B)


def _sigmoid_fit(x: np.ndarray, y: np.ndarray, w: np.ndarray, r0: np.ndarray, m_box: tuple[float, float]):
    """Least squares of y ~ r0 + (A - r0) * sigmoid(B (x - m)), x = log C, for R curves at once.

    A enters linearly, so for each (B, m) it has a closed form (variable projection) and only
    (B, m) is searched: a 48 x 64 grid, then four zooms of 11 x 11 around each curve's best, each
    a fifth of the last spacing. y, w: (R, P) values and 0/1 weights; r0: (R,). Returns A, B,
    C_mid, and whether (B, m) ended on the edge of the box, each (R,).
    """
    r = (y - r0[:, None]) * w
    rr = (r ** 2).sum(axis=1)

    def best(B, m):  # B, m: (R or 1, G); every curve's best grid point and its A
        s = 1 / (1 + np.exp(-B[..., None] * (x - m[..., None])))  # (R or 1, G, P)
        num = np.einsum("rp,rgp->rg", r, np.broadcast_to(s, (len(r),) + s.shape[1:]))
        den = np.einsum("rp,rgp->rg", w, np.broadcast_to(s ** 2, (len(r),) + s.shape[1:]))
        sse = rr[:, None] - num ** 2 / np.maximum(den, 1e-300)
        i = np.argmin(sse, axis=1)
        take = lambda a: np.take_along_axis(np.broadcast_to(a, sse.shape), i[:, None], 1)[:, 0]  # noqa: E731
        return take(B), take(m), r0 + take(num) / np.maximum(take(den), 1e-300)

    lb = np.log(B_RANGE)
    gb, gm = np.meshgrid(np.linspace(*lb, 48), np.linspace(*m_box, 64))
    b, m, A = best(np.exp(gb.ravel())[None], gm.ravel()[None])
    step_b, step_m = (lb[1] - lb[0]) / 47, (m_box[1] - m_box[0]) / 63
    u = np.linspace(-1, 1, 11)
    for _ in range(4):
        lb_ = np.clip(np.log(b)[:, None, None] + step_b * u[:, None], *lb)
        lm_ = np.clip(m[:, None, None] + step_m * u[None, :], *m_box)
        lb_, lm_ = np.broadcast_arrays(lb_, lm_)
        b, m, A = best(np.exp(lb_.reshape(len(b), -1)), lm_.reshape(len(b), -1))
        step_b, step_m = step_b / 5, step_m / 5
    edge = (np.isclose(np.log(b), lb[0]) | np.isclose(np.log(b), lb[1])
            | np.isclose(m, m_box[0]) | np.isclose(m, m_box[1]))
    return A, b, np.exp(m), edge


def _check(A, C_mid, edge, r0, noise, x_first, x_last, lo, hi, where="the budget") -> str | None:
    """Why a point estimate cannot be read as an asymptote and an efficiency, or None.
    noise: the sd of the mean curve around the fit; a rise within twice that is no rise."""
    if abs(A - r0) < 2 * noise:
        return f"flat: the rise A - R0 = {A - r0:+.3f} is within the curve's noise (sd {noise:.3f})"
    if edge:
        return "not identifiable: the best fit lies on the edge of the search (B or C_mid at a bound)"
    if C_mid > x_last:
        return f"not identifiable: still rising at the end (the midpoint lies past {where})"
    if C_mid < x_first:
        return "not identifiable: the rise is over before the first point"
    if not lo - 1e-9 <= A <= hi + 1e-9:
        return f"not identifiable: the asymptote {A:.3g} lies outside the metric's range"
    return None


def fit_curve(C: np.ndarray, Y: np.ndarray, lo: float = -math.inf, hi: float = math.inf,
              n_boot: int = N_BOOT_FIT, idx: np.ndarray | None = None, seed: int = 0) -> dict:
    """Fit the saturating curve to the seeds' mean, with bootstrap CIs over seeds and a half-budget check.

    C: (P,) compute at each point (samples drawn or gradient steps), increasing; Y: (P, S) a metric per
    point and seed (NaN = not logged). R0 is the mean at the first point. lo, hi: the metric's range.
    idx: (n_boot, S) seed resamples (pass the same to variants that share seeds: their differences
    are then paired). Returns a dict: ok, reason (why not ok), r0, A, B, C_mid, ci {name: (lo, hi)},
    boot (n_boot, 3) of A, B, C_mid, half {ok, reason, mae, flat_mae}, and C, y (the fitted mean curve).
    """
    C, Y = np.asarray(C, float), np.asarray(Y, float).reshape(len(C), -1)
    with np.errstate(all="ignore"):
        y = np.nanmean(Y, axis=1)
    keep = np.isfinite(y) & np.isfinite(C)
    C, Y, y = C[keep], Y[keep], y[keep]
    out = {"ok": False, "reason": None, "C": C, "y": y, "r0": float(y[0]) if len(y) else math.nan,
           "A": math.nan, "B": math.nan, "C_mid": math.nan, "ci": {}, "boot": None,
           "half": {"ok": False, "reason": "no fit", "mae": math.nan, "flat_mae": math.nan}}
    fit_at = C > 0
    if fit_at.sum() < MIN_POINTS:
        out["reason"] = f"too few points ({int(fit_at.sum())}) for three parameters"
        return out
    x = np.log(np.where(fit_at, C, 1.0))
    first, last = C[fit_at][0], C[-1]
    m_box = (math.log(first) - DECADE, math.log(last) + DECADE)
    ones = fit_at[None].astype(float)
    A, B, C_mid, edge = (v[0] for v in _sigmoid_fit(x, y[None], ones, y[:1], m_box))
    out |= {"A": float(A), "B": float(B), "C_mid": float(C_mid)}
    # the extrapolation check: fit the first half of the budget, predict the second
    half = C <= last / 2
    if (half & fit_at).sum() >= MIN_POINTS and (~half).any():
        h = _sigmoid_fit(x, y[None], (half & fit_at)[None].astype(float), y[:1], m_box)
        hA, hB, hC, hedge = (v[0] for v in h)
        on = half & fit_at
        noise = float(np.std(y[on] - saturating(C[on], y[0], hA, hB, hC)))
        reason = _check(hA, hC, hedge, y[0], noise, first, last / 2, lo, hi, "the half budget")
        tail = y[half & (C >= 0.8 * last / 2)]
        out["half"] = {"ok": reason is None, "reason": reason,
                       "mae": float(np.mean(np.abs(saturating(C[~half], y[0], hA, hB, hC) - y[~half]))),
                       "flat_mae": float(np.mean(np.abs(tail.mean() - y[~half])))}
    else:
        out["half"]["reason"] = "too few points in the first half"
    noise = float(np.std(y[fit_at] - saturating(C[fit_at], y[0], A, B, C_mid)))
    reason = _check(A, C_mid, edge, y[0], noise, first, last, lo, hi)
    S = Y.shape[1]
    if reason is None and S < 2:
        reason = "one seed: no bootstrap CI"
    if reason is None:
        idx = np.random.default_rng(seed).integers(0, S, (n_boot, S)) if idx is None else idx
        with np.errstate(all="ignore"):
            yb = np.nanmean(Y[:, idx], axis=2).T  # (n_boot, P): the mean curve of each resample
        wb = (np.isfinite(yb) & fit_at[None]).astype(float)
        r0b = np.where(np.isfinite(yb[:, 0]), yb[:, 0], y[0])
        bA, bB, bC, _ = _sigmoid_fit(x, np.nan_to_num(yb), wb, r0b, m_box)
        boot = np.stack([bA, bB, bC], axis=1)
        ci = {k: tuple(np.percentile(boot[:, i], [2.5, 97.5])) for i, k in enumerate(("A", "B", "C_mid"))}
        out |= {"boot": boot, "ci": ci}
        if ci["A"][1] - ci["A"][0] > abs(A - y[0]):
            reason = "not identifiable: the CI of A is wider than the rise A - R0"
        elif ci["A"][0] < lo or ci["A"][1] > hi:
            # an asymptote no run can reach (reward above 1): the curve is still rising at the end
            reason = f"not identifiable: the CI of A [{ci['A'][0]:.3g}, {ci['A'][1]:.3g}] leaves the metric's range"
    out |= {"ok": reason is None, "reason": reason}
    return out


def compare_fits(fa: dict, fb: dict) -> dict | None:
    """A and B of two fitted variants: differences a - b with 95% bootstrap CIs (percentile, uncorrected)."""
    if not (fa["ok"] and fb["ok"]):
        return None
    out = {}
    for i, k in enumerate(("A", "B")):
        d = fa["boot"][:, i] - fb["boot"][:, i]
        lo, hi = np.percentile(d, [2.5, 97.5])
        out[k] = (fa[k] - fb[k], float(lo), float(hi), bool(lo > 0 or hi < 0))
    return out


# ------------------------------------------------------------- seeds run in batches


def spend(t: float, alpha: float) -> float:
    """Lan-DeMets O'Brien-Fleming-type spending of a one-sided level alpha by information fraction t."""
    return 0.0 if t <= 0 else float(2 * st.norm.sf(st.norm.isf(alpha / 2) / math.sqrt(min(t, 1.0))))


@lru_cache(maxsize=512)
def obf_bounds(fractions: tuple[float, ...], alpha: float, two_sided: bool = True, grid: int = 801) -> tuple:
    """z boundaries at the looks' information fractions (increasing, the last <= 1) such that a z statistic
    with Brownian increments crosses the upper one at look k with probability spend(t_k) - spend(t_k-1)
    under H0. two_sided: symmetric +-c_k, each side spending alpha / 2. Computed by numerical integration
    of the density of the continuing paths (Armitage, McPherson and Rowe 1969; Jennison and Turnbull ch. 19).
    """
    side = alpha / 2 if two_sided else alpha
    bounds, t_prev, u, f = [], 0.0, None, None  # u: grid of the score S = Z sqrt(t); f: density of paths still going
    for t in fractions:
        target = spend(t, side) - spend(t_prev, side)
        sd = math.sqrt(t - t_prev)
        if f is None:
            c = float(st.norm.isf(target)) if target > 0 else math.inf
        elif target <= 0:
            c = math.inf
        else:
            wf = f * _trapezoid(u)
            exit_ = lambda c: float(wf @ st.norm.sf((c * math.sqrt(t) - u) / sd)) - target  # noqa: E731
            c = float(optimize.brentq(exit_, -10, 40, xtol=1e-10))
        bounds.append(c)
        top = min(c, 9.0) * math.sqrt(t)
        v = np.linspace(-top if two_sided else -9 * math.sqrt(t), top, grid)
        f = (np.exp(-0.5 * (v / math.sqrt(t)) ** 2) / math.sqrt(2 * math.pi * t) if u is None else
             (f * _trapezoid(u)) @ (np.exp(-0.5 * ((v[None] - u[:, None]) / sd) ** 2) / (sd * math.sqrt(2 * math.pi))))
        u, t_prev = v, t
    return tuple(bounds)


def _trapezoid(u: np.ndarray) -> np.ndarray:
    w = np.full(len(u), u[1] - u[0])
    w[[0, -1]] /= 2
    return w


def _z_of_t(t: np.ndarray, df: np.ndarray) -> np.ndarray:
    """The normal deviate with the same tail probability as a t statistic (signed)."""
    with np.errstate(invalid="ignore"):
        return np.sign(t) * st.norm.isf(st.t.sf(np.abs(t), df))


def sequential_paired(D: np.ndarray, looks: list[int], max_seeds: int, margin: float, alpha: float,
                      negligible: bool = False) -> tuple:
    """Group-sequential decisions on paired differences D (..., N), seeds in the order they ran.

    At look k (the first looks[k] seeds) the paired t statistic, turned into z, is compared with
    the two-sided O'Brien-Fleming-type boundary at information fraction n_k / max_seeds (alpha over
    both sides); equivalence within +-margin when both one-sided TOST statistics pass the one-sided
    boundary of level alpha. The first look that decides is final. Returns (outcome, look): outcome
    +1 (mean of D > 0), -1, 0 (equivalent) or NaN (undecided), and the index of the deciding look (-1);
    with `negligible`, a third array: the ordering was decided and at that look equivalence passed too.
    """
    D = np.asarray(D, float)
    looks = [n for n in looks if n >= 3]
    fr = tuple(min(1.0, n / max_seeds) for n in looks)
    eff, eqv = obf_bounds(fr, alpha, True), obf_bounds(fr, alpha, False)
    outcome = np.full(D.shape[:-1], np.nan)
    at = np.full(D.shape[:-1], -1)
    both = np.zeros(D.shape[:-1], bool)
    for k, n in enumerate(looks):
        x = D[..., :n]
        mean, se, df = x.mean(-1), x.std(-1, ddof=1) / math.sqrt(n), n - 1
        with np.errstate(divide="ignore", invalid="ignore"):
            z = _z_of_t(mean / se, df)
            zl, zu = _z_of_t((mean + margin) / se, df), _z_of_t((margin - mean) / se, df)
        open_ = np.isnan(outcome)
        sig = open_ & (np.abs(z) >= eff[k])
        inside = (zl >= eqv[k]) & (zu >= eqv[k])
        equiv = open_ & ~sig & inside
        both = both | (sig & inside)
        outcome = np.where(sig, np.sign(mean), np.where(equiv, 0.0, outcome))
        at = np.where(sig | equiv, k, at)
    return (outcome, at, both) if negligible else (outcome, at)


def sequential_decision(values: dict[str, dict[int, float]], orderings: list[str], margin: float,
                        max_seeds: int, batches: list[list[int]], alpha: float = ALPHA) -> dict:
    """After each batch of seeds: is every ordering decided? For the runner's `--seeds auto:N`.

    values: {variant: {seed: final value}} so far; orderings: "a > b", "a = b" (a claim's expect)
    or "a vs b" (a plain pair); margin: the equivalence margin (claim.margin or default_margin);
    max_seeds: the cap N; batches: the seeds of each batch run so far, in order (each call to
    this function is one look, after the last batch). Pairs are compared on the seeds both
    variants finished; each ordering is tested at alpha / (number of orderings) (Bonferroni),
    with O'Brien-Fleming-type alpha spending over the looks (see sequential_paired).
    Returns {"done", "reason", "orderings": [{ordering, a, b, decided, outcome, negligible, n, look, why}]}:
    negligible, an ordering decided at a look where equivalence within ±margin passed as well.
    """
    rows, m = [], len(orderings)
    for o in orderings:
        a, b, _ = split_ordering(o)
        seen, looks, d = set(), [], []
        for batch in batches:
            for s in batch:
                if s in values.get(a, {}) and s in values.get(b, {}) and s not in seen:
                    seen.add(s)
                    d.append(values[a][s] - values[b][s])
            if not looks or len(d) > looks[-1]:
                looks.append(len(d))
        out, at, both = sequential_paired(np.array(d), looks, max_seeds, margin, alpha / m, negligible=True) \
            if len(d) >= 3 else (np.array(math.nan), np.array(-1), np.array(False))
        n = len(d)
        outcome = {1.0: f"{a} > {b}", -1.0: f"{b} > {a}", 0.0: f"equivalent within ±{margin:g}"}.get(float(out))
        shown = [k for k in looks if k >= 3]
        why = (f"decided at look {int(at) + 1} ({shown[int(at)]} pairs) of {len(shown)}, level {alpha / m:.3g}"
               " with O'Brien-Fleming-type spending" if outcome else
               f"undecided after {n} pairs" + (" (the cap)" if n >= max_seeds else f" of at most {max_seeds}"))
        rows.append({"ordering": o, "a": a, "b": b, "decided": outcome is not None, "outcome": outcome,
                     "negligible": bool(both), "n": n, "look": int(at), "why": why})
    capped = len(set().union(*map(set, batches))) >= max_seeds
    done = all(r["decided"] for r in rows)
    reason = ("every ordering decided" if done else f"cap of {max_seeds} seeds reached" if capped
              else f"{sum(not r['decided'] for r in rows)} of {m} orderings undecided")
    return {"done": done or capped, "reason": reason, "orderings": rows}
