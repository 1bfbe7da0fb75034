"""Robust aggregates as rliable defines them (Agarwal et al. 2021): the interquartile mean with a stratified
bootstrap CI, the probability of improvement P(X > Y), and a mean's t interval."""
from __future__ import annotations

import math

import numpy as np
from scipy import stats as st

from .paired import N_BOOT

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

