"""Seeds and problems as crossed random effects: the variance of a mean (or of a difference) held-out accuracy over
new seeds *and* a new held-out set, and the test of a difference on the seeds x problems table (docs/statistics.md,
"Seeds and problems").
"""
from __future__ import annotations

import math

import numpy as np
from scipy import stats as st

from .paired import ALPHA, MAX_SEEDS, POWER, t_from_summary
from .power import _power_se, _tost_power_se


def variance_of_mean(ms_seed, ms_problem, ms_resid, S: int, J: int, floor: bool = True):
    """(variance of the grand mean, Satterthwaite df) of a crossed S x J table from its three mean squares
    (floats or arrays alike): Var = (MS_seed + MS_problem - MS_resid) / (S J) where both components are positive.

    floor (v4): the seed term is never dropped; its mean square is floored at MS_resid and keeps S - 1 df, so
    where the seed estimate is negative the test still counts the seeds' few degrees of freedom (it cannot
    be more precise than S - 1 df say about the seed-to-seed spread). Without floor (v3) a negative seed
    component drops MS_seed and the df jump to the problems' and residual's: among 5-seed rows whose seed
    estimate was truncated that rejected a true null 12% of the time (docs/statistics.md, "Seeds and problems").
    """
    ms_seed, ms_problem, ms_resid = (np.asarray(x, float) for x in (ms_seed, ms_problem, ms_resid))
    cp = (ms_problem > ms_resid).astype(float)
    if floor:
        terms = [(np.maximum(ms_seed, ms_resid), S - 1), (cp * ms_problem, J - 1), (-cp * ms_resid, (S - 1) * (J - 1))]
    else:  # v3: a component set to 0 drops its mean squares from the sum
        cs = (ms_seed > ms_resid).astype(float)
        terms = [(cs * ms_seed, S - 1), (cp * ms_problem, J - 1), ((1 - cs - cp) * ms_resid, (S - 1) * (J - 1))]
    total = sum(t for t, _ in terms)
    with np.errstate(divide="ignore", invalid="ignore"):
        df = np.where(total > 0, total ** 2 / sum(t ** 2 / d for t, d in terms), np.inf)
    var = total / (S * J)
    return (float(var), float(df)) if var.ndim == 0 else (var, df)


def crossed_variance(Y: np.ndarray, alpha: float = ALPHA, floor: bool = True) -> dict:
    """How much of the variance of a variant's mean held-out accuracy comes from its seeds and how much from
    which problems the held-out set happens to hold, and the interval that counts both.

    Y: (seeds, problems) outcomes (0/1, or any number), every seed scored on the same problems: a crossed
    design. Model: y_sj = mu + a_s + b_j + e_sj, independent, zero-mean, variances seed, problem and
    residual (the seed x problem interaction and the coin of each answer). The estimators are the ANOVA
    (method-of-moments) ones of a balanced two-way table without replication, E[MS_seed] = resid + J seed,
    E[MS_problem] = resid + S problem, E[MS_resid] = resid (REML's too where none is negative; a negative
    one is set to 0). The variance of the grand mean, as an estimate of mu over new seeds *and* new problems
    from the same generator, is seed / S + problem / J + resid / (S J); its interval takes Student's t on
    Satterthwaite's degrees of freedom for that sum of mean squares (variance_of_mean: with `floor`, the seed
    term is kept at MS_resid or above on its S - 1 df; without, v3's rule, it is dropped when negative). The seeds-only interval (the mean of
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
    var_mean, df = variance_of_mean(ms_seed, ms_problem, ms_resid, S, J, floor)
    parts = {"seeds": seed / S, "problems": problem / J, "residual": ms_resid / (S * J)}
    half = float(st.t.ppf(1 - alpha / 2, df)) * math.sqrt(var_mean)
    half_seeds = float(st.t.ppf(1 - alpha / 2, S - 1)) * math.sqrt(ms_seed / (S * J))
    return {"mean": mean, "seeds": S, "problems": J, "seed": seed, "problem": problem, "resid": ms_resid,
            "ms": {"seed": ms_seed, "problem": ms_problem, "resid": ms_resid}, "var_mean": var_mean,
            "share": {k: (v / var_mean if var_mean > 0 else math.nan) for k, v in parts.items()}, "df": df,
            "ci": (mean - half, mean + half), "ci_seeds": (mean - half_seeds, mean + half_seeds)}



def crossed_pair(r: dict, D: np.ndarray, floor: bool = True) -> dict:
    """Re-test a paired row on D, the (seeds, problems) table of a's held-out outcomes minus b's on the same
    seeds and problems: its mean is the row's Δ, and crossed_variance splits Δ's variance into seeds, problems
    (how a − b varies across problems, as a new held-out set would draw them) and their interaction; the test
    is t on that standard error with Satterthwaite's degrees of freedom, and TOST, the interval, the MDE and
    the seeds that would decide an undecided row all use it. Left as it was (seeds only) where D does not
    give the row's Δ (other problems, another evaluation) or nothing varies."""
    c = crossed_variance(D, floor=floor)
    if c is None or c["var_mean"] <= 0 or not math.isclose(c["mean"], r["diff"], rel_tol=1e-9, abs_tol=1e-9):
        return r
    se, df = math.sqrt(c["var_mean"]), c["df"]
    p_t, lo, hi = t_from_summary(r["diff"], se, df)
    r |= {"se": se, "df": df, "p": p_t, "p_t": p_t, "lo": lo, "hi": hi, "p_perm": math.nan,
          "test": f"seeds × problems t ({c['problems']:,} problems, {df:.0f} df)",
          "crossed": {k: c[k] for k in ("seeds", "problems", "seed", "problem", "resid", "share")}}
    return r



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

