"""ScaleRL's saturating curve R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) fitted to a mean curve against compute,
with bootstrap CIs over seeds and a half-budget extrapolation check (docs/statistics.md, "Curves against compute")."""
from __future__ import annotations

import math
import warnings

import numpy as np

MIN_POINTS = 8        # three parameters need a few more points than that
N_BOOT_FIT = 200      # refits on seeds resampled with replacement
B_RANGE = (0.1, 10.0)  # the search box of the exponent B
DECADE = math.log(10)  # C_mid is searched from a tenth of the first point to ten times the budget
GRID = (48, 64)        # the first search of (log B, log C_mid), then ZOOMS finer ones of ZOOM_POINTS^2 around the best
ZOOMS, ZOOM_POINTS = 4, 11
ROWS = 8               # curves per block of a zoom's search


def saturating(C, r0: float, A: float, B: float, C_mid: float):
    """ScaleRL's R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B); R(0) = R0."""
    C = np.asarray(C, float)
    with np.errstate(divide="ignore", over="ignore"):
        return r0 + (A - r0) / (1 + (C_mid / C) ** B)


def _sigmoid_fit(x: np.ndarray, y: np.ndarray, w: np.ndarray, r0: np.ndarray, m_box: tuple[float, float]):
    """Least squares of y ~ r0 + (A - r0) * sigmoid(B (x - m)), x = log C, for R curves at once.

    A enters linearly, so for each (B, m) it has a closed form (variable projection) and only
    (B, m) is searched: a GRID, then ZOOMS zooms of ZOOM_POINTS^2 spanning a cell of the last on each side
    of each curve's best. y, w: (R, P) values and 0/1 weights; r0: (R,). Returns A, B, C_mid, and whether
    (B, m) ended on the edge of the box, each (R,).
    """
    r = (y - r0[:, None]) * w

    def sums(B, m, r, w):  # B, m: (R or 1, G) -> r's and w's sums against the sigmoid at each grid point, (R, G)
        s = 1 / (1 + np.exp(-B[..., None] * (x - m[..., None])))  # (R or 1, G, P)
        return (np.einsum("rp,rgp->rg", r, np.broadcast_to(s, (len(r),) + s.shape[1:])),
                np.einsum("rp,rgp->rg", w, np.broadcast_to(s ** 2, (len(r),) + s.shape[1:])))

    def best(B, m):  # B, m: (R or 1, G); every curve's best grid point and its A
        if len(B) == 1:
            num, den = sums(B, m, r, w)
        else:
            # a few curves at a time: the whole (R, G, P) sigmoid is megabytes of fresh pages each zoom, which
            # took 10x the arithmetic; each curve's sums are the same bits either way
            num, den = np.empty(B.shape), np.empty(B.shape)
            for i in range(0, len(B), ROWS):
                num[i:i + ROWS], den[i:i + ROWS] = sums(B[i:i + ROWS], m[i:i + ROWS], r[i:i + ROWS], w[i:i + ROWS])
        # the squared error less the data's own sum of squares, a constant per curve that moves no argmin
        sse = -num ** 2 / np.maximum(den, 1e-300)
        i = np.argmin(sse, axis=1)
        take = lambda a: np.take_along_axis(np.broadcast_to(a, sse.shape), i[:, None], 1)[:, 0]  # noqa: E731
        return take(B), take(m), r0 + take(num) / np.maximum(take(den), 1e-300)

    lb = np.log(B_RANGE)
    gb, gm = np.meshgrid(np.linspace(*lb, GRID[0]), np.linspace(*m_box, GRID[1]))
    b, m, A = best(np.exp(gb.ravel())[None], gm.ravel()[None])
    step_b, step_m = (lb[1] - lb[0]) / (GRID[0] - 1), (m_box[1] - m_box[0]) / (GRID[1] - 1)
    u = np.linspace(-1, 1, ZOOM_POINTS)
    shrink = (ZOOM_POINTS - 1) / 2   # a zoom's spacing against the last: 5 at 11 points
    for _ in range(ZOOMS):
        lb_ = np.clip(np.log(b)[:, None, None] + step_b * u[:, None], *lb)
        lm_ = np.clip(m[:, None, None] + step_m * u[None, :], *m_box)
        lb_, lm_ = np.broadcast_arrays(lb_, lm_)
        b, m, A = best(np.exp(lb_.reshape(len(b), -1)), lm_.reshape(len(b), -1))
        step_b, step_m = step_b / shrink, step_m / shrink
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
    boot (n_boot, 3) of A, B, C_mid, noise (the sd of the mean curve around the fit, which a rise must exceed
    twice), half {ok, reason, A, B, C_mid, noise, mae, flat_mae}, and C, y (the fitted mean curve).
    """
    C, Y = np.asarray(C, float), np.asarray(Y, float).reshape(len(C), -1)
    with warnings.catch_warnings():   # a point no seed logged is NaN, and dropped below
        warnings.simplefilter("ignore", RuntimeWarning)
        y = np.nanmean(Y, axis=1)
    keep = np.isfinite(y) & np.isfinite(C)
    C, Y, y = C[keep], Y[keep], y[keep]
    out = {"ok": False, "reason": None, "C": C, "y": y, "r0": float(y[0]) if len(y) else math.nan,
           "A": math.nan, "B": math.nan, "C_mid": math.nan, "noise": math.nan, "ci": {}, "boot": None,
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
    if (half & fit_at).sum() >= MIN_POINTS:   # the last point always lies past the half budget
        h = _sigmoid_fit(x, y[None], (half & fit_at)[None].astype(float), y[:1], m_box)
        hA, hB, hC, hedge = (v[0] for v in h)
        on = half & fit_at
        noise = float(np.std(y[on] - saturating(C[on], y[0], hA, hB, hC)))
        reason = _check(hA, hC, hedge, y[0], noise, first, last / 2, lo, hi, "the half budget")
        tail = y[half & (C >= 0.8 * last / 2)]
        if not len(tail):   # log-spaced points may leave the half's last fifth empty: the level it ended at
            tail = y[half][-1:]
        out["half"] = {"ok": reason is None, "reason": reason, "A": float(hA), "B": float(hB), "C_mid": float(hC),
                       "noise": noise,
                       "mae": float(np.mean(np.abs(saturating(C[~half], y[0], hA, hB, hC) - y[~half]))),
                       "flat_mae": float(np.mean(np.abs(tail.mean() - y[~half])))}
    else:
        out["half"]["reason"] = "too few points in the first half"
    noise = float(np.std(y[fit_at] - saturating(C[fit_at], y[0], A, B, C_mid)))
    out["noise"] = noise
    reason = _check(A, C_mid, edge, y[0], noise, first, last, lo, hi)
    S = Y.shape[1]
    if reason is None and S < 2:
        reason = "one seed: no bootstrap CI"
    if reason is None:
        idx = np.random.default_rng(seed).integers(0, S, (n_boot, S)) if idx is None else idx
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            yb = np.nanmean(Y[:, idx], axis=2).T  # (n_boot, P): the mean curve of each resample
        wb = (np.isfinite(yb) & fit_at[None]).astype(float)
        r0b = yb[:, 0]
        r0b = np.where(np.isfinite(r0b), r0b, y[0])   # resampled seeds that did not log the first point: the mean's
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

