"""Two-sample tests on per-seed values: paired t, the sign-flip permutation test, Welch's t, and Holm's correction.

Pure functions on numbers (docs/statistics.md, "Comparing two variants"); nothing here reads a file.
"""
from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
from scipy import stats as st

ALPHA = 0.05
POWER = 0.8
N_PERM = 10      # from this many pairs up the sign-flip test drives the verdict (its smallest p is 2 / 2^n)
EXACT_MAX = 20   # up to this many pairs every sign pattern is enumerated (2^20 = 1,048,576, as two halves of 2^10)
EXACT_MAX_V3 = 16  # v3 drew N_MC patterns from 17 pairs up (the 20-seed toy rows)
N_MC = 20_000    # sign flips drawn past EXACT_MAX, from a fixed seed
N_BOOT = 2000    # bootstrap resamples for IQM and P(X > Y)
MAX_SEEDS = 1000  # "about N seeds" is not worth computing past this


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


def sign_flip_p(d: np.ndarray, n_mc: int = N_MC, seed: int = 0, exact_max: int = EXACT_MAX) -> tuple[float, bool]:
    """Two-sided p of a sign-flip permutation test on paired differences d (H0: symmetric about 0).

    Statistic |sum(d)|; every one of the 2^n sign patterns up to exact_max pairs (returns exact=True): the
    sums of the first half's patterns plus those of the second half's, (2^h, 1) + (1, 2^(n-h)), so 20 pairs
    take a 1,024 x 1,024 array, not a 2^20 x 20 one. Past exact_max, n_mc random patterns from a fixed seed
    with the (1 + hits) / (1 + n_mc) correction.
    """
    d = np.asarray(d, float)
    n = len(d)
    obs = abs(d.sum())
    if obs == 0:
        return 1.0, n <= exact_max
    if n <= exact_max:
        def signed_sums(x):  # every sign pattern of x: (2^len(x),)
            bits = (np.arange(2 ** len(x))[:, None] >> np.arange(len(x))) & 1
            return (1 - 2 * bits) @ x
        h = n // 2
        sums = np.abs(signed_sums(d[:h])[:, None] + signed_sums(d[h:])[None, :]).ravel()
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


def two_sample(x: pd.Series | np.ndarray, y: pd.Series | np.ndarray, exact_max: int = EXACT_MAX) -> dict:
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
            out["p_perm"], exact = sign_flip_p(d, exact_max=exact_max)
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

