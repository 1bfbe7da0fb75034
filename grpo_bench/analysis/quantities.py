"""What FINDINGS judges, read from a results directory's curves and per-problem outcomes: a quantity per seed
(the final value, the area under the curve, either at a common budget of samples), each problem's share of it
(the seeds x problems table the crossed test takes), and whether two curves have levelled off (a plateau).
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import ConfigError
from ..store.rundir import load_outcomes, metrics_path, read_metrics_file

# a curve that moves less than PLATEAU_SHARE of the effect judged (min(|final Δ|, δ)) over the second half of the
# budget has levelled off at that scale: its final value is where it levels off, and how fast it got there (the
# area) is a question the final value no longer answers. PLATEAU: v3's rule (within ±δ from half the budget on).
PLATEAU_SHARE = 0.5
PLATEAU = 0.5

_read: dict | None = None   # what reading_once() has read, None outside it


@contextmanager
def reading_once():
    """Within it, each results directory's curves, per-problem outcomes and diagnostics are read once:
    analysis/rule_changes.py judges the same results under ten sets of rules, and reading them again for each
    took most of its time. Outside it every call reads the files, so that nothing goes stale."""
    global _read
    outer, _read = _read, ({} if _read is None else _read)
    try:
        yield
    finally:
        _read = outer


def once(key: tuple, read):
    """read(), or what it returned for `key` before within reading_once()."""
    if _read is None:
        return read()
    if key not in _read:
        _read[key] = read()
    return _read[key]


def run_curves(directory: Path, metric: str) -> dict[tuple[str, int], tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(variant, seed) -> (samples drawn at each point, the metric there, the point's step) of every run, from
    the results' metrics table. A point's samples: samples/total at its step, interpolated between logged steps;
    a held-out evaluation at step 0 ran before the first rollout (0 samples). Read-only arrays, shared within
    reading_once()."""
    return once(("curves", str(directory), metric), lambda: _run_curves(directory, metric))


def _run_curves(directory: Path, metric: str) -> dict:
    path = metrics_path(directory)
    if path is None:
        return {}
    try:
        table = read_metrics_file(path)
    except ValueError as e:
        raise ConfigError(str(path), "<file>", f"{e}: damaged; rerun the sweep to rewrite it") from None
    if "seed" not in table:
        return {}
    if metric.startswith("eval/"):
        table = same_problems(table[table.metric.isin([metric, "samples/total", "eval/problems"])],
                              load_outcomes(directory))
    table = table[table.metric.isin([metric, "samples/total"])]
    # one sort of the whole table, then a split per (variant, seed, metric): a filter, drop_duplicates and sort
    # per run took most of `findings`' reading time. A step logged twice keeps its last row, as the file has it.
    # runs in groupby's order (a categorical's categories, else sorted), which callers iterate in
    variant = table.variant
    order = (variant.cat.codes.to_numpy() if isinstance(variant.dtype, pd.CategoricalDtype)
             else pd.factorize(variant, sort=True)[0])
    t = pd.DataFrame({"order": order, "variant": labels(variant),
                      "seed": table.seed.to_numpy(int), "is_y": (table.metric == metric).to_numpy(),
                      "step": table.step.to_numpy(int), "value": table.value.to_numpy(float)})
    t = t.drop_duplicates(["order", "seed", "is_y", "step"], keep="last")
    t = t.sort_values(["order", "seed", "is_y", "step"], kind="stable")
    keys = list(zip(t.variant, t.seed, t.is_y))
    cut = [0] + [i for i in range(1, len(keys)) if keys[i] != keys[i - 1]] + [len(keys)]
    steps, values = t.step.to_numpy(), t.value.to_numpy()
    parts = {keys[a]: (steps[a:b], values[a:b]) for a, b in zip(cut, cut[1:]) if b > a}
    out = {}
    for (variant, seed, is_y), (step, value) in parts.items():
        if not is_y or (variant, seed, False) not in parts:
            continue
        s_step, s_value = parts[(variant, seed, False)]
        x = np.interp(step.astype(float), np.r_[-1.0, s_step.astype(float)], np.r_[0.0, s_value])
        if metric.startswith("eval/"):
            x[step == 0] = 0.0
        arrays = (x, value.copy(), step.astype(int))
        for a in arrays:
            a.flags.writeable = False
        out[(str(variant), int(seed))] = arrays
    return out


def at_budget(x: np.ndarray, y: np.ndarray, budget: float) -> tuple[float, float]:
    """(the curve's value at `budget`, its mean over [x[0], budget]) of y(x), linear between points; x
    increasing. A budget past the last point reads the last point."""
    budget = min(budget, float(x[-1]))
    keep = x <= budget
    xs, ys = x[keep], y[keep]
    if xs[-1] < budget:
        xs, ys = np.r_[xs, budget], np.r_[ys, np.interp(budget, x, y)]
    value = float(ys[-1])
    width = xs[-1] - xs[0]
    area = float(np.sum((ys[1:] + ys[:-1]) / 2 * np.diff(xs)) / width) if width > 0 else value
    return value, area


def outcome_runs(directory: Path, ok: pd.DataFrame) -> dict[tuple[str, int], pd.DataFrame]:
    """(variant, seed) -> that finished run's greedy outcomes, problems by evaluation step (NaN where a mid-run
    evaluation scored a subset); {} where the results kept no per-problem outcomes."""
    runs = tuple(sorted(set(ok.run.astype(str))))
    return once(("outcomes", str(directory), runs), lambda: _outcome_runs(directory, set(runs)))


def _outcome_runs(directory: Path, runs: set) -> dict:
    o = load_outcomes(directory)
    if o is None or o.empty:
        return {}
    o = o[per_label(o.run, runs.__contains__)]
    who = o[["run", "variant", "seed"]].drop_duplicates("run")
    key = dict(zip(who.run.astype(str), zip(who.variant.astype(str), who.seed.astype(int))))
    return {key[run]: table for run, table in by_run(o).items()}


def labels(column: pd.Series) -> np.ndarray:
    """column.astype(str) as an object array; a categorical's categories converted once, not each of its rows
    (astype(str) on the 210,000 rows of a directory's outcomes took a tenth of `findings`' time)."""
    if isinstance(column.dtype, pd.CategoricalDtype) and not column.isna().any():
        return np.asarray([str(c) for c in column.cat.categories], dtype=object)[column.cat.codes.to_numpy()]
    return column.astype(str).to_numpy(object)


def per_label(column: pd.Series, f) -> np.ndarray:
    """f(str(value)) for each row, as a bool array (False where a value is missing, as isin and .str.startswith
    give); on a categorical, once per category."""
    if isinstance(column.dtype, pd.CategoricalDtype) and not column.isna().any():
        return np.asarray([bool(f(str(c))) for c in column.cat.categories], dtype=bool)[column.cat.codes.to_numpy()]
    return np.asarray([isinstance(v, str) and bool(f(v)) for v in column.astype(str)], dtype=bool)


def by_run(o: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """run -> its greedy outcomes, problems by evaluation step (NaN where an evaluation did not score the
    problem): one reshape for every run of a directory, where a pivot per run took most of `findings`' time."""
    o = o.drop_duplicates(["run", "problem", "step"])   # as pivot_table(aggfunc="first") would keep
    wide = (o.assign(run=labels(o.run), greedy=o.greedy.astype(float))
            .set_index(["run", "problem", "step"]).greedy.unstack("step").sort_index(axis=0).sort_index(axis=1))
    return {str(run): g.droplevel(0) for run, g in wide.groupby(level=0, sort=False)}


def problem_table(runs: dict, curves: dict, variant: str, seeds, quantity: str,
                  budget: float | None) -> pd.DataFrame | None:
    """Seeds by problems: each problem's share of the quantity a seed's value is, so that a row's mean over the
    problems is that value. The final value (no budget) is the last evaluation's outcomes, on every problem. Read
    from the curve (the area, or a value at a common budget) it is linear in the curve's points, sum_t w_t acc_t
    (at_budget's weights), acc_t the mean over the problems every evaluation scored (same_problems): problem p's
    share is sum_t w_t outcome(p, t) on those problems. None where a run has no outcomes or its curve has a point
    its outcomes lack."""
    rows = {}
    for seed in seeds:
        o = runs.get((variant, int(seed)))
        if o is None or o.empty:
            return None
        if quantity == "final" and budget is None:
            rows[seed] = o[o.columns.max()]
            continue
        c = curves.get((variant, int(seed)))
        if c is None:
            return None
        x, _, steps = c
        vals = o.to_numpy(float)
        keep = ~np.isnan(vals).any(axis=1)   # the curve's points are on the problems every evaluation scored
        column = {step: i for i, step in enumerate(o.columns)}
        eye = np.eye(len(x))
        w = np.array([at_budget(x, eye[t], x[-1] if budget is None else budget)[quantity == "area"]
                      for t in range(len(x))])
        share = np.zeros(int(keep.sum()))
        for t in np.flatnonzero(w):
            if steps[t] not in column:
                return None
            share += w[t] * vals[keep, column[steps[t]]]
        rows[seed] = pd.Series(share, index=o.index[keep])
    return pd.DataFrame(rows).T


def _difference(a: pd.DataFrame, b: pd.DataFrame) -> np.ndarray:
    """a − b on the seeds and problems both were scored on (seeds by problems)."""
    seeds, cols = a.index.intersection(b.index), a.columns.intersection(b.columns)
    d = a.loc[seeds, cols] - b.loc[seeds, cols]
    return d.dropna(axis=1).to_numpy(float)


def _values(finals: pd.Series, variant: str, quantity: str, budget: float | None, curves: dict,
            log: bool = False) -> pd.Series | None:
    """Per-seed values of one quantity: the final values themselves, or read from each run's curve (the area,
    or any quantity at a common budget); None where a run has no curve. log: finals are already logged
    (_logged), a value read from a curve is logged here (the log of the area, not the area of the log)."""
    if quantity == "final" and budget is None:
        return finals
    out = {}
    for seed in finals.index:
        c = curves.get((variant, int(seed)))
        if c is None:
            return None
        x, y, _ = c
        value, area = at_budget(x, y, x[-1] if budget is None else budget)
        out[seed] = value if quantity == "final" else area
    out = pd.Series(out, dtype=float)
    return np.log(out.where(out > 0)) if log else out


def _logged(side) -> tuple:
    """(the side with its per-seed values logged, for a ratio margin; variant -> why it cannot be: a value that is
    not positive has no log, and an ordering with that variant is not testable on this scale)."""
    bad = {v: f"`{v}` has a value <= 0 ({float(np.min(x)):.3g}), which a ratio margin (judged on the log of the "
              "metric) cannot take" for v, x in side.by_seed.items() if (np.asarray(x, float) <= 0).any()}
    by_seed = {v: (x if v in bad else np.log(x)) for v, x in side.by_seed.items()}
    return type(side)(side.dir, side.name, side.column, side.seeds, {v: np.asarray(x, float) for v, x in by_seed.items()},
                      by_seed, side.meta), bad


def _mean_curve(curves: dict, variant: str, seeds) -> tuple[np.ndarray, np.ndarray] | None:
    """(x, the mean over seeds) of a variant's curves, None without curves on one grid for every seed."""
    cs = [curves.get((variant, int(s))) for s in seeds]
    if not cs or any(c is None for c in cs) or len({tuple(c[0]) for c in cs}) != 1:
        return None
    x, y = np.asarray(cs[0][0], float), np.mean([c[1] for c in cs], axis=0)
    return (x, y) if len(x) >= 3 and x[-1] > x[0] else None


def plateau_from(curves: dict, variant: str, seeds, margin: float | None) -> float | None:
    """v3's plateau: the share of the budget from which the variant's mean curve over its seeds stays within
    ±margin of its final value (0: flat from the first point; 1: still moving at the last); None without a
    margin or without curves on one grid for every seed."""
    c = _mean_curve(curves, variant, seeds)
    if not margin or c is None:
        return None
    x, y = c
    i = len(y) - 1
    while i > 0 and abs(y[i - 1] - y[-1]) <= margin:
        i -= 1
    return float((x[i] - x[0]) / (x[-1] - x[0]))


def second_half_move(curves: dict, variant: str, seeds) -> float | None:
    """How far the variant's mean curve moves over the second half of its budget: max - min of its points
    from half the budget on (the curve's value at half the budget included, linear between points)."""
    c = _mean_curve(curves, variant, seeds)
    if c is None:
        return None
    x, y = c
    half = x[0] + (x[-1] - x[0]) / 2
    tail = np.r_[np.interp(half, x, y), y[x > half]]
    return float(tail.max() - tail.min())


def plateau(curves: dict, r: dict, by_seed: dict, margin: float | None, diff: float, effect: bool = True):
    """A final row's plateau, or None. v4 (effect): both mean curves move less than PLATEAU_SHARE of
    min(|final Δ|, δ) over the second half of the budget, so the final value is where they level off at the
    scale of the effect being judged: {"moved", "bound"}. v3: both within ±δ of their end from half the budget
    on or earlier: the share of the budget it starts from."""
    seeds = {v: by_seed[v].index for v in (r["a"], r["b"])}
    if not effect:
        shares = [plateau_from(curves, v, seeds[v], margin) for v in seeds]
        return max(shares) if None not in shares and max(shares) <= PLATEAU else None
    moves = [second_half_move(curves, v, seeds[v]) for v in seeds]
    if None in moves:
        return None
    bound = PLATEAU_SHARE * min(abs(diff), margin if margin else math.inf)
    return {"moved": max(moves), "bound": bound} if max(moves) < bound else None


def same_problems(table: pd.DataFrame, outcomes: pd.DataFrame | None) -> pd.DataFrame:
    """The metrics table with each run's held-out curves on one problem set. Where a run's mid-run evaluations
    scored a subset of its held-out problems (eval_subset: the settings issue 41 left to rerun), its accuracy and
    accuracy gain are recomputed at every evaluation from the per-problem outcomes on the problems all of them
    scored, the ends included (the gain against its step-0 value there, the start's accuracy on those problems),
    and its other eval/ metrics, logged only as means, keep only the points on that subset. Otherwise a curve
    joins a subset's points to ends on every problem, and the change of problem set reads as learning. Final
    values, and the verdicts read from them, stay summary.csv's, on every problem."""
    metric = table.metric.astype(str)
    counts = table[metric == "eval/problems"]
    if counts.empty:
        return table
    spread = counts.groupby(counts.run.astype(str)).value.agg(["min", "max"])
    mixed = spread[spread["min"] < spread["max"]]
    if mixed.empty:
        return table
    common = {}
    if outcomes is not None and not outcomes.empty:
        o = outcomes[outcomes.run.astype(str).isin(set(mixed.index))]
        common = {run: table.dropna() for run, table in by_run(o).items()} if len(o) else {}
    runs, steps = table.run.astype(str), table.step
    value, drop = table.value.to_numpy(float).copy(), np.zeros(len(table), bool)
    held = metric.str.startswith("eval/") & (metric != "eval/problems")
    for run, (subset, _) in mixed.iterrows():
        mine = (runs == run).to_numpy()
        c = counts[counts.run.astype(str) == run]
        full = mine & held.to_numpy() & steps.isin(set(c.step[c.value > subset])).to_numpy()
        rebuilt = {}
        if run in common and len(common[run]) == subset:   # the subset is the first problems, scored every time
            acc = common[run].mean()
            rebuilt = {"eval/accuracy": acc, "eval/accuracy_gain": acc - acc[acc.index.min()]}
        for name, curve in rebuilt.items():
            rows = mine & (metric == name).to_numpy()
            at = steps[rows].map(curve).to_numpy(float)
            value[rows] = at
            drop[np.flatnonzero(rows)[np.isnan(at)]] = True
        drop |= full & ~metric.isin(list(rebuilt)).to_numpy()
    return table.assign(value=value)[~drop].reset_index(drop=True)
