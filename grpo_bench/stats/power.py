"""Power, minimum detectable effects and equivalence (TOST): how small a difference the seeds can see or rule out.

Checked against statsmodels' TTestPower / TTestIndPower / ttost_* in tests/test_stats.py.
"""
from __future__ import annotations

import functools
import math

from scipy import optimize
from scipy import stats as st

from .paired import MAX_SEEDS, POWER

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
    return float(_mde_d(n, alpha, paired, target) * sd)


# FINDINGS asks for the same few (n, level) hundreds of times, and each root takes a dozen noncentral-t tails
@functools.lru_cache(maxsize=4096)
def _mde_d(n: int, alpha: float, paired: bool, target: float) -> float:
    """mde in units of sd: the standardised effect at which the test's power is `target`."""
    f = lambda e: power(e, n, alpha, paired) - target  # noqa: E731
    if f(1e3) < 0:  # two seeds at a tiny level: nothing short of a huge effect
        return math.inf
    return optimize.brentq(f, 1e-9, 1e3, xtol=1e-12)


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
    return float(_mde_se_units(df, alpha, target) * se)


@functools.lru_cache(maxsize=4096)
def _mde_se_units(df: float, alpha: float, target: float) -> float:
    """mde_se in units of se (the power depends on effect / se alone)."""
    f = lambda x: _power_se(x, 1.0, df, alpha) - target  # noqa: E731
    if f(1e3) < 0:
        return math.inf
    return optimize.brentq(f, 1e-12, 1e3, xtol=1e-12)


def _tost_power_se(diff: float, se: float, df: float, margin: float, alpha: float) -> float:
    crit = st.t.isf(alpha, df)
    return max(0.0, _nct_sf(crit, df, (diff + margin) / se) + _nct_sf(crit, df, (margin - diff) / se) - 1)

