"""A group-sequential decision for seeds run in batches: O'Brien-Fleming-type alpha spending (Lan-DeMets), for
`run --seeds auto:N` (docs/statistics.md, "Seeds on demand")."""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from scipy import optimize
from scipy import stats as st

from .paired import ALPHA, split_ordering

def spend(t: float, alpha: float) -> float:
    """Lan-DeMets O'Brien-Fleming-type spending of a one-sided level alpha by information fraction t."""
    return 0.0 if t <= 0 else float(2 * st.norm.sf(st.norm.isf(alpha / 2) / math.sqrt(min(t, 1.0))))


@lru_cache(maxsize=512)
def obf_bounds(fractions: tuple[float, ...], alpha: float, two_sided: bool, grid: int = 801) -> tuple:
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
            c = float(st.norm.isf(target))  # inf where nothing is spent
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
        # strict: a look that spends nothing has an infinite boundary, which even the infinite z of differences
        # with no spread must not cross (ties at a finite boundary have probability 0)
        sig = open_ & (np.abs(z) > eff[k])
        inside = (zl > eqv[k]) & (zu > eqv[k])
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
