"""results/FINDINGS.md: the field's published claims, each tested by an ablation that carries a `claim`.

An ablation file states its claim (text, source, the paper's setting, and `expect`: the
orderings the paper reports, as "a > b" between variant labels, or "a = b" for a claimed
absence of effect; optionally `metric`, the summary column judged, `margin`, the equivalence
margin, and `judge`: final or area) and usually runs on two `settings`, the sorting toy and the
arithmetic LM. Every ordering on every setting is judged on one quantity of one metric:

    metric    the claim's `metric`, else the task's declared verdict metric (held-out greedy
              reward on the toy, held-out greedy accuracy on the LM; grpo_bench/tasks/*.py)
    quantity  final: its value at the end of the budget; area: the mean of its curve over the
              budget against samples drawn. Both are computed for every ordering; the claim's
              `judge` (final unless it says area) decides. Where the two variants draw different
              numbers of samples (dynamic sampling), both are read at the smaller budget.

From the per-seed values of each quantity, with grpo_bench.store.stats: the difference of means a − b
(paired on per-seed differences where the variants share seeds, Welch's t where not), Holm's
correction over the claim's testable orderings on that setting, the minimum detectable effect,
TOST within the margin (the claim's, else the task's: a stated fraction of what its default
recipe moves), and one of six outcomes (stats.judge): holds, holds but negligible, equivalent,
reversed but negligible, reversed, undecided. A claimed "a = b" holds when equivalent or
negligible. An ordering is *not testable here*, and counted nowhere, when the two variants
differ only in parts the task declares inert (`inert`), when every paired difference is
exactly 0, or when its two variants ran the same numbers as an earlier ordering's. A result
whose seeds `run --seeds auto` chose is judged with the boundaries that chose them, where the
metric is the one they were chosen on.

Kendall's W over the settings' orderings of the variants they all ran asks whether the tasks agree
(each pair's tau in the claim's section says which disagrees with which). Everything is recomputed from the results directories: `python -m grpo_bench findings`
rebuilds the file without training.
"""
from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from ..store import metrics, stats
from .compare import kendall, kendall_w, load_side
from ..errors import ConfigError
from ..config.ablation import check_orderings, load_ablation, parse_ordering
from ..config.run import run_dict
from ..store.metrics import final_names
from ..store.rundir import OUTCOMES_FILE, load_outcomes, metrics_path, read_meta, read_table
from .report import label_column
from ..store.rundir import read_metrics_file

# Results written before ablation.json recorded its task and its file's settings: the shipped files'
# settings, in their order, and the task each trains. A setting added since never needs a line here.
LEGACY_SETTINGS = {"sort": "sort", "lm": "arithmetic"}
QUANTITIES = ("final", "area")
EQUAL_BUDGET = 1.01  # budgets further apart than this ratio are compared at the smaller one
# a curve flat within the margin over its last half has levelled off: its final value is where it levels off,
# and how fast it got there (the area) is a question the final value no longer answers
PLATEAU = 0.5


# ------------------------------------------------------------------ what a results directory holds


def variant_configs(meta: dict, root: Path | None) -> dict:
    """label -> each variant's resolved config: as ablation.json recorded it (a run_dict, without the seed),
    else from the ablation file the results name (tried as given and beside root); {} where that file is gone
    or no longer loads."""
    if isinstance(meta.get("configs"), dict):
        return meta["configs"]
    source, setting = meta.get("source") or "", meta.get("setting")
    for path in [Path(source)] + ([root.parent / source] if root else []):
        if path.is_file():
            try:
                abl = load_ablation(path, setting=setting)
            except (ConfigError, OSError, ValueError):
                return {}
            return {label: cfg for (label, _, _), cfg in zip(abl.variants, abl.configs)}
    return {}


def inert_reason(task: metrics.TaskInfo | None, a, b) -> str | None:
    """Why an ordering between run configs a and b cannot be tested on this task, or None: every key they
    differ in is an axis whose parts the task declares inert, and the parts swapped are among those."""
    if task is None or not task.inert or a is None or b is None:
        return None
    da, db = (c if isinstance(c, dict) else run_dict(c) for c in (a, b))
    keys = [k for k in da if k != "seed" and da[k] != db.get(k)]
    reasons = []
    for k in keys:
        if k not in task.inert:
            return None
        names, why = task.inert[k]
        if isinstance(da[k], list):  # a list axis (filters): the parts one has and the other not
            only = [p for p in da[k] if p not in db[k]] + [p for p in db[k] if p not in da[k]]
        else:
            only = [da[k], db[k]]
        if not all((p.get("name") if isinstance(p, dict) else p) in names for p in only):
            return None
        reasons.append(why)
    return "; ".join(dict.fromkeys(reasons)) or None


def run_curves(directory: Path, metric: str) -> dict[tuple[str, int], tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(variant, seed) -> (samples drawn at each point, the metric there, the point's step) of every run, from
    the results' metrics table. A point's samples: samples/total at its step, interpolated between logged steps;
    a held-out evaluation at step 0 ran before the first rollout (0 samples)."""
    path = metrics_path(directory)
    if path is None:
        return {}
    try:
        table = read_metrics_file(path)
    except ValueError as e:
        raise ConfigError(str(path), "<file>", f"{e}: damaged; rerun the sweep to rewrite it") from None
    if "seed" not in table:
        return {}
    table = table[table.metric.isin([metric, "samples/total"])]
    out = {}
    for (variant, seed), g in table.groupby(["variant", "seed"], observed=True):
        y = g[g.metric == metric].drop_duplicates("step", keep="last").sort_values("step")
        s = g[g.metric == "samples/total"].drop_duplicates("step", keep="last").sort_values("step")
        if y.empty or s.empty:
            continue
        x = np.interp(y.step.to_numpy(float), np.r_[-1.0, s.step.to_numpy(float)], np.r_[0.0, s.value.to_numpy(float)])
        if metric.startswith("eval/"):
            x[y.step.to_numpy() == 0] = 0.0
        out[(str(variant), int(seed))] = (x, y.value.to_numpy(float), y.step.to_numpy(int))
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


# ------------------------------------------------------------------------------------ judging


def judge_setting(directory: Path, claim: dict, setting: str | None = None, root: Path | None = None) -> dict:
    """Every expected ordering of a claim judged on one results directory: on both quantities, Holm over
    the testable orderings of each, the claim's `judge` deciding the verdict."""
    meta = read_meta(directory)
    summary = read_table(directory / "summary.csv", ["run", "variant", "status"])
    task = metrics.task_of(meta, final_names(summary))
    asked = claim.get("metric") or (task.verdict_metric if task else None)
    side = load_side(directory, asked)
    column = side.column
    margin, source = stats.claim_margin(claim, setting, column, task, side.means)
    judge_on = claim.get("judge", "final")
    configs = variant_configs(meta, root)
    where = f"{directory / 'ablation.json'}: claim of {meta.get('name', directory.name)}"
    check_orderings(claim, configs or None, setting, where, task)

    ok = summary[(summary.status == "ok") & summary[column].notna()]
    finals = [c for c in ok.columns if c.startswith("final/")]
    ident = _identities(ok, finals)
    budgets = ({v: g.set_index("seed")["final/samples"] for v, g in ok.groupby("variant")}
               if "final/samples" in ok and "seed" in ok else {})
    metric = metrics.metric_of(column) or column
    curves = run_curves(directory, metric)
    problems = outcome_runs(directory, ok) if metric == "eval/accuracy" else {}

    rows, seen = [], {}
    for e in claim["expect"]:
        a, b, kind = parse_ordering(e)
        row = {"pair": e, "a": a, "b": b, "claim": kind, "why": None, "budget": None}
        x, y = side.by_seed.get(a), side.by_seed.get(b)
        row["missing"] = x is None or y is None or len(x) < 2 or len(y) < 2
        if not row["missing"]:
            row["why"] = inert_reason(task, configs.get(a), configs.get(b))
            canon = frozenset((ident.get(a, a), ident.get(b, b)))
            if row["why"] is None and len(canon) == 2 and canon in seen:
                twins = [f"`{v}` ran the same numbers as `{ident[v]}`" for v in (a, b) if ident.get(v, v) != v]
                row["why"] = f"the same runs as `{seen[canon]}` ({'; '.join(twins)})"
            seen.setdefault(canon, e)
            row["budget"] = _budget(budgets, a, b)
        rows.append(row)

    tested = [r for r in rows if not r["missing"] and r["why"] is None]
    by_quantity = {}
    for q in QUANTITIES:
        groups, pairs, tables = {}, [], {}
        for i, r in enumerate(tested):
            ga, gb = (f"{i}:a", f"{i}:b")
            groups[ga] = _values(side.by_seed[r["a"]], r["a"], q, r["budget"], curves)
            groups[gb] = _values(side.by_seed[r["b"]], r["b"], q, r["budget"], curves)
            if groups[ga] is None or groups[gb] is None:
                groups.pop(ga), groups.pop(gb)
                continue
            pairs.append((ga, gb, r["claim"]))
            ta, tb = (problem_table(problems, curves, v, groups[g].index, q, r["budget"]) if problems else None
                      for v, g in ((r["a"], ga), (r["b"], gb)))
            if ta is not None and tb is not None:
                tables[(ga, gb)] = _difference(ta, tb)
        results = stats.compare_pairs(groups, pairs, margin, tables=tables)
        by_quantity[q] = {int(t["a"].split(":")[0]): t for t in results}
    sequential = _sequential(meta, directory, column, margin, judge_on)
    for i, r in enumerate(tested):
        r["quantities"] = {}
        for q in QUANTITIES:
            t = by_quantity[q].get(i)
            if t is not None:
                r["quantities"][q] = t | {"a": r["a"], "b": r["b"], "pair": r["pair"]}
        if sequential and judge_on in r["quantities"]:
            _apply_sequential(r["quantities"][judge_on], sequential, side.by_seed)
        shares = [plateau_from(curves, v, side.by_seed[v].index, margin) for v in (r["a"], r["b"])]
        r["plateau"] = (max(shares) if judge_on == "final" and r["budget"] is None and None not in shares
                        and max(shares) <= PLATEAU else None)
    sweep = directory / "sweep.json"
    try:
        timing = json.loads(sweep.read_text()) if sweep.is_file() else None
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(str(sweep), "<file>", f"not valid JSON: {str(e).splitlines()[0]}") from None
    return {"dir": directory, "side": side, "rows": rows, "column": column, "margin": margin, "margin_source": source,
            "judge": judge_on, "sweep": timing, "task": task, "sequential": sequential,
            "sampled": _means(ok, "final/reward") if column != "final/reward" else None}


def outcome_runs(directory: Path, ok: pd.DataFrame) -> dict[tuple[str, int], pd.DataFrame]:
    """(variant, seed) -> that finished run's greedy outcomes, problems by evaluation step (NaN where a mid-run
    evaluation scored a subset); {} where the results kept no per-problem outcomes."""
    o = load_outcomes(directory)
    if o is None or o.empty:
        return {}
    o = o[o.run.astype(str).isin(set(ok.run.astype(str)))]
    return {(str(v), int(s)): g.pivot_table(index="problem", columns="step", values="greedy", aggfunc="first",
                                            observed=True)
            for (v, s), g in o.groupby([o.variant.astype(str), "seed"], observed=True)}


def problem_table(runs: dict, curves: dict, variant: str, seeds, quantity: str,
                  budget: float | None) -> pd.DataFrame | None:
    """Seeds by problems: each problem's share of the quantity a seed's value is, so that a row's mean over the
    problems is that value. The final value (no budget) is the last evaluation's outcomes. Read from the curve (the
    area, or a value at a common budget) it is linear in the curve's points, sum_t w_t acc_t (at_budget's weights),
    and acc_t the mean over the problems evaluation t scored: problem p's share is the sum over t of
    w_t * (acc_t + (outcome(p, t) - acc_t) * all problems / problems scored at t), the deviation counted only where
    t scored p. A mid-run subset's deviations thus carry its sampling variance (its mean's, sd^2 / subset size),
    while acc_t itself is every problem's: Horvitz-Thompson on the outcomes themselves would add the variance of
    which problems the subset holds (about 4x the subset's own on a 250-of-1000 subset near 95%). None where a run
    has no outcomes or its curve has a point its outcomes lack."""
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
        eye = np.eye(len(x))
        w = np.array([at_budget(x, eye[t], x[-1] if budget is None else budget)[quantity == "area"]
                      for t in range(len(x))])
        share = pd.Series(0.0, index=o.index)
        for t in np.flatnonzero(w):
            if steps[t] not in o.columns:
                return None
            col = o[steps[t]]
            m = col.mean()
            share += w[t] * (m + (col - m).fillna(0.0) * (len(o) / col.notna().sum()))
        rows[seed] = share
    return pd.DataFrame(rows).T


def _difference(a: pd.DataFrame, b: pd.DataFrame) -> np.ndarray:
    """a − b on the seeds and problems both were scored on (seeds by problems)."""
    seeds, cols = a.index.intersection(b.index), a.columns.intersection(b.columns)
    d = a.loc[seeds, cols] - b.loc[seeds, cols]
    return d.dropna(axis=1).to_numpy(float)


def _identities(ok: pd.DataFrame, finals: list[str]) -> dict[str, str]:
    """variant -> the first variant (in table order) whose every run has the same final values on every
    final/* column: the same runs under another name (a part whose gradient equals another's)."""
    if "seed" not in ok or not finals:
        return {}
    keyed = {v: g.sort_values("seed")[["seed", *finals]].to_numpy() for v, g in ok.groupby("variant", sort=False)}
    out, firsts = {}, []
    for v, arr in keyed.items():
        twin = next((u for u in firsts if keyed[u].shape == arr.shape
                     and np.array_equal(keyed[u], arr, equal_nan=True)), None)
        if twin is None:
            firsts.append(v)
        else:
            out[v] = twin
    return out


def _budget(budgets: dict, a: str, b: str) -> float | None:
    """The samples budget both are read at when their runs drew different numbers (None when equal)."""
    if a not in budgets or b not in budgets:
        return None
    both = pd.concat([budgets[a], budgets[b]]).to_numpy(float)
    if not len(both) or both.min() <= 0 or both.max() / both.min() <= EQUAL_BUDGET:
        return None
    return float(both.min())


def _values(finals: pd.Series, variant: str, quantity: str, budget: float | None, curves: dict) -> pd.Series | None:
    """Per-seed values of one quantity: the final values themselves, or read from each run's curve (the area,
    or any quantity at a common budget); None where a run has no curve."""
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
    return pd.Series(out, dtype=float)


def plateau_from(curves: dict, variant: str, seeds, margin: float | None) -> float | None:
    """The share of the budget from which the variant's mean curve over its seeds stays within ±margin of its
    final value (0: flat from the first point; 1: still moving at the last); None without a margin or without
    curves on one grid for every seed."""
    cs = [curves.get((variant, int(s))) for s in seeds]
    if not margin or not cs or any(c is None for c in cs) or len({tuple(c[0]) for c in cs}) != 1:
        return None
    x, y = np.asarray(cs[0][0], float), np.mean([c[1] for c in cs], axis=0)
    if len(x) < 3 or x[-1] <= x[0]:
        return None
    i = len(y) - 1
    while i > 0 and abs(y[i - 1] - y[-1]) <= margin:
        i -= 1
    return float((x[i] - x[0]) / (x[-1] - x[0]))


def _means(ok: pd.DataFrame, column: str) -> pd.Series | None:
    return ok.groupby("variant", sort=False)[column].mean() if column in ok else None


# ------------------------------------------------------------------ seeds chosen sequentially


def _sequential(meta: dict, directory: Path, column: str, margin: float | None, judge_on: str) -> dict | None:
    """How `run --seeds auto` chose this result's seeds (ablation.json's `sequential`, sweep.json's looks), and
    whether its boundaries apply here: the same metric, judged on its final value."""
    seq = meta.get("sequential")
    if not seq:
        return None
    try:
        sweep = json.loads((directory / "sweep.json").read_text())
    except (OSError, ValueError):
        sweep = {}
    looks, seeds = sweep.get("looks") or [], sweep.get("seeds") or meta.get("seeds", [])
    applies = seq.get("metric") == column and judge_on == "final" and bool(looks)
    margin = sweep.get("margin", margin)  # the margin the looks were decided with
    return {"cap": seq.get("cap"), "metric": seq.get("metric"), "applies": applies, "margin": margin,
            "m": seq.get("orderings") or 1,
            "batches": [seeds[(looks[k - 1] if k else 0):n] for k, n in enumerate(looks)]}


def _apply_sequential(t: dict, seq: dict, by_seed: dict) -> None:
    """Replace a row's fixed-sample outcome by the group-sequential decision that chose its seeds."""
    if not seq["applies"]:
        return
    values = {v: {int(s): float(x) for s, x in by_seed[v].items()} for v in (t["a"], t["b"])}
    m = seq["m"]  # each ordering was decided at alpha / m (Bonferroni over the sweep's orderings)
    d = stats.sequential_decision(values, [f"{t['a']} vs {t['b']}"], seq["margin"] or 0.0, seq["cap"],
                                  seq["batches"], stats.ALPHA / m)["orderings"][0]
    up = d["outcome"] == f"{t['a']} > {t['b']}"
    if d["outcome"] is None:
        outcome = "undecided"
    elif d["outcome"].startswith("equivalent"):
        outcome = "equivalent"
    else:
        outcome = ("holds" if up else "reversed") + (", negligible" if d.get("negligible") else "")
    t["outcome"] = outcome
    t["verdict"] = ({"equivalent": "holds"}.get(outcome, "holds" if "negligible" in outcome else
                                               "undecided" if outcome == "undecided" else "fails")
                    if t["claim"] == "=" else outcome)
    t["sequential"] = d["why"]


# -------------------------------------------------------------------------------- writing


def counts(rows: list[dict], quantity: str) -> dict[str, int]:
    """How many of a claim's orderings on one setting hold, are negligible, equivalent, reversed (for
    "a = b": fail), undecided; not testable ones apart."""
    out = dict.fromkeys(("hold", "negligible", "equivalent", "reversed", "fail", "undecided", "not testable"), 0)
    for r in rows:
        if r["missing"]:
            continue
        t = (r.get("quantities") or {}).get(quantity)
        if r["why"] is not None or t is None or t["verdict"] == stats.NOT_TESTABLE:
            out["not testable"] += 1
        elif r["claim"] == "=":
            out[{"holds": "hold", "fails": "fail"}.get(t["verdict"], "undecided")] += 1
        else:
            o = t["outcome"]
            out["hold" if o == "holds" else "negligible" if o.endswith("negligible") else o] += 1
    return out


def summarise(result: dict | None, reason: str | None, short: bool = False) -> str:
    """A setting's cell in the claims table: a head word and the counts, on the claim's quantity (short: README's,
    without the metric and the reasons, which its column header and FINDINGS.md give)."""
    if result is None:
        return ("not testable" if short else f"not testable: {reason}") if reason else "not run"
    c = counts(result["rows"], result["judge"])
    n = sum(v for k, v in c.items() if k != "not testable")
    if not n and not c["not testable"]:
        return "not run"
    where = f"{label_column(result['column'])}, {result['judge']}"
    if not n:
        return f"not testable here ({where}: {c['not testable']} of {c['not testable']} orderings)"
    against = c["reversed"] + c["fail"]
    head = ("mixed" if against and c["hold"] else "does not hold" if against else "holds" if c["hold"] == n
            else "partly holds" if c["hold"] else "no difference that matters" if c["negligible"] + c["equivalent"] == n
            else "undecided at this scale")
    parts = [f"{c['hold']} of {n} hold"] + [f"{c[k]} {k}" for k in ("negligible", "equivalent", "reversed", "fail",
                                                                     "undecided") if c[k]]
    tail = f"; {c['not testable']} not testable{'' if short else ' here'}" if c["not testable"] else ""
    flat = [r for r in result["rows"] if r.get("plateau") is not None]
    if flat and not short:
        other = next(q for q in QUANTITIES if q != result["judge"])
        moved = sum(1 for r in flat if (r["quantities"].get(other) or {}).get("outcome")
                    != r["quantities"][result["judge"]].get("outcome"))
        tail += (f"; {len(flat)} at a plateau from {max(r['plateau'] for r in flat):.0%} of the budget ("
                 + (f"the {other} agrees" if not moved else f"the {other} differs on {moved}") + ")")
    elif flat:
        tail += f"; {len(flat)} at a plateau"
    return f"{head} ({'' if short else where + ': '}{', '.join(parts)}{tail})"


def collect(root: Path) -> tuple[dict[str, dict], dict[str, metrics.TaskInfo], list[str]]:
    """From the ablation.json files under root: family -> {"claim", "source", "settings": {setting: results
    dir}}, setting -> the task it trains, and every setting in the order the files list them."""
    if not root.is_dir():
        raise ConfigError(str(root), "<dir>", "not a directory" if root.exists() else "no such directory")
    families: dict[str, dict] = {}
    tasks: dict[str, metrics.TaskInfo] = {}
    listed: list[str] = []
    # results/<name>/ and one level down (results/gpu/<name>/: the same claims run on another device)
    for meta_file in sorted([*root.glob("*/ablation.json"), *root.glob("*/*/ablation.json")]):
        d = meta_file.parent
        if not (d / "summary.csv").is_file():  # a sweep still running (or killed before it summed up): nothing to judge yet
            continue
        meta = read_meta(d)
        claim, setting = meta.get("claim"), meta.get("setting")
        if not claim:
            continue
        task = metrics.task_of(meta, () if meta.get("task") else final_names(read_table(d / "summary.csv", ["run"])))
        family = meta["name"].removesuffix(f"_{setting}") if setting else meta["name"]
        setting = setting or (task.name if task else d.name)  # a file without settings: its task's name
        entry = families.setdefault(family, {"claim": claim, "source": meta.get("source", ""), "settings": {},
                                             "others": {}})
        if setting in entry["settings"]:  # two runs of one claim on one task: _completeness
            keep, other = sorted([entry["settings"][setting], d], key=_completeness, reverse=True)
            entry["settings"][setting] = keep
            entry["others"].setdefault(setting, []).append(other)
        else:
            entry["settings"][setting] = d
        listed += [s for s in meta.get("settings") or [] if s not in listed]
        if task is not None:
            tasks.setdefault(setting, task)
    families = dict(sorted(families.items()))  # by name, wherever the directories lie (results/gpu/ too)
    seen = {s for e in families.values() for s in [*e["settings"], *(e["claim"].get("untestable") or {})]}
    known = metrics.task_names()
    for s, task in LEGACY_SETTINGS.items():
        if s in seen and s not in tasks and task in known:
            tasks[s] = metrics.declared_task(task)
    order = list(dict.fromkeys([s for s in listed + list(LEGACY_SETTINGS) if s in seen] + sorted(seen)))
    for entry in families.values():
        entry["settings"] = dict(sorted(entry["settings"].items(), key=lambda kv: order.index(kv[0])))
    return families, tasks, order


def _completeness(d: Path) -> tuple[bool, bool, int]:
    """(every planned run finished, per-problem outcomes kept, seeds): which of two results directories of one
    claim and task to judge. Outcomes before seeds: a test on seeds alone leaves out how much the verdict depends
    on which held-out problems were drawn (most of the variance on the LM tasks), so more seeds without them
    are a narrower interval for a narrower question."""
    meta = read_meta(d)
    summary = read_table(d / "summary.csv", ["run", "status"])
    done = set(summary.loc[summary.status == "ok", "run"])
    return set(meta["runs"]) <= done, (d / OUTCOMES_FILE).is_file(), len(meta["seeds"])


def device(d: Path) -> str:
    """Where a results directory's runs trained, from its sweep.json: the GPU's name, else the CPU's."""
    sweep = d / "sweep.json"
    try:
        s = json.loads(sweep.read_text()) if sweep.is_file() else {}
    except (ValueError, UnicodeDecodeError):
        s = {}
    if s.get("gpu"):
        return s["gpu"]
    if "cuda" in read_meta(d).get("device", "cpu"):  # a sweep stopped at its limit wrote no sweep.json
        return "CUDA"
    return f"CPU ({s['cpu']})" if s.get("cpu") else "CPU"


def names(order: list[str], tasks: dict[str, metrics.TaskInfo]) -> dict[str, tuple[str, str]]:
    """setting -> (its name in a column, its short name beside another): its task's declared label and
    short name, with the setting where two settings train one task; the setting itself where none is known."""
    plain = {s: (tasks[s].label, tasks[s].short) if s in tasks else (s, s) for s in order}
    labels = [n[0] for n in plain.values()]
    return {s: (f"{n[0]} ({s})", f"{n[1]} ({s})") if labels.count(n[0]) > 1 else n for s, n in plain.items()}


def _quantity(result: dict, r: dict, q: str) -> str:
    """'eval reward, final' or 'eval reward, area (equal samples: both at 192,000)'."""
    text = f"{label_column(result['column'])}, {q}"
    if r["budget"] is not None:
        text += f" at equal samples drawn (both read at {r['budget']:,.0f})"
    return text


def _cell(result: dict, r: dict) -> str:
    if r["missing"]:
        return "—"
    if r["why"] is not None:
        return f"**not testable here**: {r['why']}"
    own, parts = result["judge"], []
    for q in (own, *(x for x in QUANTITIES if x != own)):
        t = r["quantities"].get(q)
        if t is None:
            parts.append(f"{_quantity(result, r, q)}: no curve to read")
            continue
        if t["verdict"] == stats.NOT_TESTABLE:
            parts.append(f"{_quantity(result, r, q)}: **{stats.verdict_text(t)}**" if q == own else
                         f"{q}: {stats.verdict_text(t)}")
            continue
        test = (f"{stats.which_test(t)}; sequential: {t['sequential']}" if t.get("sequential") else
                f"{stats.which_test(t)}; p_holm {t['p_holm']:.2g}")
        body = f"Δ {stats.interval_text(t)}; {test}; P(a > b) {t['poi']:.2f}; {stats.power_text(t)}"
        if q == own:
            parts.append(f"{_quantity(result, r, q)}: {body}: **{stats.verdict_text(t)}**")
            if r.get("plateau") is not None:
                parts.append(f"at a plateau: both mean curves stay within ±{result['margin']:g} of their final "
                             f"value from {r['plateau']:.0%} of the budget on, so the final value compares where "
                             "they level off, not how fast they get there (the area's question)")
        else:
            parts.append(f"{q} (beside; not the claim's quantity): Δ {t['diff']:+.3f}, p_holm {t['p_holm']:.2g}: "
                         f"{stats.verdict_text(t)}")
    return "<br>".join(parts)


def across(results: dict, i: int) -> tuple[int, int]:
    """(tasks on which ordering i holds, tasks on which it was tested) on each setting's own quantity: a "a > b"
    holds where its outcome is *holds* (a negligible difference does not count), an "a = b" where it is
    equivalent or negligible; settings where it is missing or not testable are in neither count."""
    k = m = 0
    for r in results.values():
        row = r["rows"][i]
        t = None if row["missing"] or row["why"] is not None else row["quantities"].get(r["judge"])
        if t is None or t["verdict"] == stats.NOT_TESTABLE:
            continue
        m += 1
        k += (t["verdict"] == "holds") if row["claim"] == "=" else (t["outcome"] == "holds")
    return k, m


def _across_cell(results: dict, i: int) -> str:
    k, m = across(results, i)
    return "—" if not m else f"holds on {k} of {m} task{'s' if m > 1 else ''}"


def across_summary(results: dict, n: int) -> str:
    """A claim's orderings across tasks: how many tested on two or more hold on every one, on some, on none."""
    pairs = [across(results, i) for i in range(n)]
    several = [(k, m) for k, m in pairs if m >= 2]
    one = sum(1 for _, m in pairs if m == 1)
    if not several:
        return f"tested on one task only ({one} ordering{'s' if one != 1 else ''})" if one else "—"
    every = sum(1 for k, m in several if k == m)
    some = sum(1 for k, m in several if 0 < k < m)
    text = f"{every} of {len(several)} hold on every task" + (f", {some} on some" if some else "")
    return text + (f"; {one} tested on one task only" if one else "")


def _agreement(results: dict, short: bool = False) -> str:
    """Kendall's W over every task the claim ran on: do the tasks order its variants alike?"""
    w, p, m, n = kendall_w([r["side"].means for r in results.values()])
    if math.isnan(w):
        return "—"
    return f"{w:.2f} (p {p:.2g})" if short else f"W {w:.2f} (p {p:.2g}; {m} tasks, {n} variants)"


def _taus(results: dict, name: dict) -> str:
    """Each pair of tasks' Kendall τ: which task disagrees with which."""
    out = []
    for x, y in itertools.combinations(results, 2):
        tau, p, n = kendall(results[x]["side"].means, results[y]["side"].means)
        if not math.isnan(tau):
            out.append(f"{name[x]} ↔ {name[y]} {tau:+.2f} (p {p:.2g}, {n} variants)")
    return "; ".join(out)


def _ranking(result: dict) -> str:
    side, sampled = result["side"], result["sampled"]
    means = side.means.sort_values(ascending=False)
    def beside(v: str) -> str:
        return f"; sampled reward {sampled[v]:.3f}" if sampled is not None and v in sampled else ""
    return " > ".join(f"`{v}` {m:.3f} (IQM {stats.iqm(side.values[v]):.3f}{beside(v)})" for v, m in means.items())


def _timing(result: dict) -> str:
    s = result["sweep"]
    if not s or "wall_s" not in s:
        return "not recorded"
    return f"{s['wall_s'] / 60:.1f} min for {s['runs']} runs ({s['where']}, {s['cpu']}, load {s['load_avg_end']})"


def _command(d: Path, source: str) -> str:
    """The command that made results directory d: its setting (only a file with settings has one), --seeds
    auto:CAP where its seeds were chosen sequentially, --out where d is not the default results/<name>."""
    meta = read_meta(d)
    sweep = d / "sweep.json"
    try:
        recorded = json.loads(sweep.read_text()).get("command") if sweep.is_file() else None
    except (ValueError, UnicodeDecodeError):
        recorded = None
    if recorded and recorded.startswith("run "):  # the command that made it, as it was typed
        return f"python -m grpo_bench {recorded}"
    cmd = f"python -m grpo_bench run {source}"
    if meta.get("setting"):
        cmd += f" --setting {meta['setting']}"
    sequential = meta.get("sequential")
    if isinstance(sequential, dict) and sequential.get("cap"):
        cmd += f" --seeds auto:{sequential['cap']}"
    if Path(d).resolve() != (Path("results") / meta["name"]).resolve():
        cmd += f" --out {d}"
    return cmd


def _presets(families: dict[str, dict], root: Path) -> dict[str, list[str]]:
    """setting -> the task presets its results trained on, as their ablation files name them (a resolved
    config no longer knows the preset it came from)."""
    import yaml
    found: dict[str, list[str]] = {}
    for entry in families.values():
        for setting, d in entry["settings"].items():
            source = read_meta(d).get("source") or ""
            for path in (Path(source), root.parent / source):
                try:
                    task = (yaml.safe_load(path.read_text()).get("settings") or {}).get(setting, {}).get("task")
                except (OSError, yaml.YAMLError, AttributeError):
                    continue
                task = task.get("name") if isinstance(task, dict) else task
                if isinstance(task, str) and task not in found.setdefault(setting, []):
                    found[setting].append(task)
                break
    return found


def intro(where: str, tasks: dict[str, metrics.TaskInfo], order: list[str], name: dict) -> str:
    judged = "; ".join(f"the {name[s]} on {label_column(tasks[s].verdict_metric)}"
                       + (f", δ ±{tasks[s].margin:g} ({tasks[s].margin_rule})" if tasks[s].margin else "")
                       for s in order if s in tasks)
    return (
        f"Each row is one claim, tested by the shipped ablation of the same name on {where}, everything else held "
        "fixed; the settings and seeds of each are in its section. Each claim is judged on one quantity of one "
        "metric, named in every row: the task's held-out verdict metric unless the claim names another "
        f"({judged}; the sampled training reward is printed beside), and its value at the end of the budget "
        "(*final*) unless the claim says it is about the speed (*area*: the mean of the curve over the budget "
        "against samples drawn); both are printed for every ordering and the claim's own decides. A final value "
        "judged where both variants' mean curves stay within the margin of their end over the last half of the "
        "budget or more is marked *at a plateau*: it compares where they level off, and the area beside is then "
        "the only word on how fast they get there. Two variants "
        "that draw different numbers of samples (dynamic sampling) are both read at the smaller budget, and the "
        "row says so. Each ordering \"a > b\" is tested on per-seed values: seed by seed on a − b where the "
        f"variants ran the same seeds (paired t below {stats.N_PERM} pairs, a sign-flip permutation test from "
        f"{stats.N_PERM}; ρ: their correlation across seeds), Welch's t otherwise, Holm-corrected over the "
        "claim's testable orderings on that task; and by two one-sided tests (TOST, Holm-corrected) within the "
        "margin δ (the claim's `margin`, else the task's). The two tests together give one of six outcomes: "
        "*holds* (significant, not within ±δ), *holds, negligible* (significant, but within ±δ), *equivalent* "
        "(within ±δ, not significant), *reversed, negligible*, *reversed*, or *undecided* (with the MDE — the "
        "smallest difference the test detects with 80% power at its Holm level — and the seeds that would "
        "decide it). A claimed \"a = b\" holds when equivalent or negligible, and fails on a significant "
        "difference not shown within ±δ. The interval printed is the one the outcome used: TOST's (90% where "
        "Holm adjusts nothing) for an equivalent row, the Holm-adjusted one for every other. An ordering is "
        "*not testable here*, and in no count, when its variants differ only in parts the task declares inert, "
        "when every paired difference is exactly 0, or when its variants ran the same numbers as an earlier "
        "ordering's. Where the results kept each held-out problem's outcome (the LM tasks', from this version), a "
        "held-out accuracy row (final, area, or read at equal samples) is tested on the seeds × problems table of "
        "a − b, seeds and problems as "
        "crossed random effects, so its interval holds for a new held-out set as well as new seeds (the test is "
        "named *seeds × problems t*; docs/statistics.md). *Across tasks* says on how many of the tasks an ordering was tested on it holds (a negligible "
        "difference is not holding), and per claim how many orderings tested on two or more tasks hold on every "
        "one; Kendall's W (tie-corrected, with a permutation p) asks whether the tasks order the variants they all "
        "ran alike (1: the same order everywhere; 0: no agreement), and each pair's τ in the claim's section says "
        "which task disagrees with which. "
        "Generated by `python -m grpo_bench findings` from the results directories: every "
        "number is recomputed from them (docs/statistics.md has the rules).")


def render(root: Path) -> str:
    return _render(root)[0]


def readme_table(root: Path) -> str:
    """README.md's claims table: each claim's head and counts per task and across tasks, from FINDINGS.md's rows."""
    return _render(root)[1]


def _render(root: Path) -> tuple[str, str]:
    families, tasks, order = collect(root)
    called = names(order, tasks)
    name = {s: n for s, (n, _) in called.items()}
    presets = _presets(families, root)
    where = " and ".join(f"the {name[s]}" + (f" (`{'`, `'.join(presets[s])}`)" if presets.get(s) else "")
                         for s in order)
    lines = ["# Findings: published claims about GRPO, put to the test", "", intro(where, tasks, order, name), "",
             "| " + " | ".join(["claim", "source", *(name[s] for s in order), "across tasks",
                                "tasks agree (Kendall's W)"]) + " |",
             "|---|---|" + "---|" * (len(order) + 2)]
    details, everywhere, specific = [], [], []
    readme = ["| claim | " + " | ".join(
        f"{name[s]} ({label_column(tasks[s].verdict_metric)}" + (f", ±{tasks[s].margin:g})" if s in tasks and
                                                                tasks[s].margin else ")") if s in tasks else name[s]
        for s in order) + " | across tasks | tasks agree (W) |", "|---|" + "---|" * (len(order) + 2)]
    for family, entry in families.items():
        claim = entry["claim"]
        untestable = claim.get("untestable") or {}
        results = {s: judge_setting(d, claim, s, root) for s, d in entry["settings"].items()}
        cells = [summarise(results.get(s), untestable.get(s))
                 + ("" if s not in results or device(entry["settings"][s]).startswith("CPU")
                    else f"; {results[s]['side'].seeds} seeds on {device(entry['settings'][s])}") for s in order]
        row = [f"[{family}](#{family}): {claim['text']}", claim["source"], *cells,
               across_summary(results, len(claim["expect"])), _agreement(results)]
        for i, e in enumerate(claim["expect"]):
            k, m = across(results, i)
            if m >= 2 and k == m:
                everywhere.append(f"`{e}` ([{family}](#{family}), {m} tasks)")
            elif m >= 2 and k:
                held = [name[s] for s, r in results.items() if across({s: r}, i) == (1, 1)]
                specific.append(f"`{e}` ([{family}](#{family}): the {' and the '.join(held)} only)")
        # a claim's own text may hold a pipe (1/|o|), which would split the table's cell
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |")
        first = next(iter(results.values()), None)
        own = (f" ({label_column(first['column'])}" + (f", ±{first['margin']:g})" if first["margin"] else ")")
               if claim.get("metric") and first else "")
        readme.append(f"| [{family}](results/FINDINGS.md#{family}){own} | " + " | ".join(
            summarise(results.get(s), untestable.get(s), short=True)
            + ("" if s not in results or device(entry["settings"][s]).startswith("CPU")
               else f"; {results[s]['side'].seeds} seeds on {device(entry['settings'][s])}") for s in order)
            + f" | {across_summary(results, len(claim['expect']))} | {_agreement(results, short=True)} |")
        details += [f"## {family}", "", f"**Claim.** {claim['text']}", "", f"**Source.** {claim['source']}", ""]
        if claim.get("setting"):
            details += [f"**Their setting.** {claim['setting']}", ""]
        details += [f"**Judged on** " + "; ".join(
            f"{name[s]}: `{r['column']}`, {r['judge']}" for s, r in results.items())
            + (" (the claim's metric; a training metric's final value is its mean over the last 10% of rollouts)"
               if claim.get("metric") else "") + ".", ""]
        details += [f"**Here.** `{entry['source']}`; " + "; ".join(
            f"{name[s]}: `{_shown(d, root)}` on {device(d)}" for s, d in entry["settings"].items())
            + "".join(f"; not judged: `{_shown(o, root)}` on {device(o)} ({_why_not(o)})"
                      for s, others in entry.get("others", {}).items() for o in others), ""]
        details += ["**Margin δ.** " + "; ".join(f"{name[s]}: " + (f"±{r['margin']:g}" if r["margin"] else "none")
                                                  + f" ({r['margin_source']})" for s, r in results.items()), ""]
        for s, r in results.items():
            if r["sequential"]:
                seq = r["sequential"]
                details += [f"**Seeds chosen sequentially** on the {name[s]} (`--seeds auto:{seq['cap']}`, on "
                            f"`{seq['metric']}`): " + ("its verdicts use the O'Brien–Fleming boundaries that chose "
                                                       "them, not the fixed-sample tests" if seq["applies"] else
                                                       "judged here on another metric or quantity, with "
                                                       "fixed-sample tests that ignore that stopping rule") + ".", ""]
        head = ": quantity: Δ = a − b [interval]; test; P(a > b); detectable effect or margin: verdict"
        details += ["| ordering | " + " | ".join(name[s] + head for s in results) + " | across tasks |",
                    "|---|" + "---|" * (len(results) + 1)]
        for i, e in enumerate(claim["expect"]):
            details.append(f"| `{e}` | " + " | ".join(_cell(r, r["rows"][i]) for r in results.values())
                           + f" | {_across_cell(results, i)} |")
        details.append("")
        for s, r in results.items():
            details.append(f"- {name[s]} ({label_column(r['column'])}, final, {r['side'].seeds} seeds): {_ranking(r)}. "
                           f"Time: {_timing(r)}. Command: `{_command(r['dir'], entry['source'])}`.")
        for s, why in untestable.items():
            details.append(f"- {name[s]}: {'not testable here' if s not in results else 'note'}: {why}")
        if len(results) >= 2:
            details.append(f"- Agreement between tasks (the variants each ran, by their means): {_agreement(results)}"
                           f"; pairwise Kendall τ: {_taus(results, name) or 'none with two shared variants'}.")
        details.append("")
    if not families:
        raise ConfigError(str(root), "<dir>", "no results with a claim here (a <dir>/ablation.json with `claim`, "
                          "written by running an ablation that has one): nothing to judge")
    across_tasks = ["## Across tasks", "",
                    "An ordering holds across tasks when it holds on every task it was tested on, two or more "
                    "(a negligible difference is not holding); it is task-specific when it holds on some of them.", "",
                    "- Holds on every task tested: " + ("; ".join(everywhere) or "none") + ".",
                    "- Task-specific: " + ("; ".join(specific) or "none") + ".", ""]
    # the changes since the last version's verdicts, then commentary written after looking at these results
    extra = [p.read_text() for p in (root / "FINDINGS_changes.md", root / "FINDINGS_notes.md") if p.is_file()]
    return "\n".join(lines + [""] + across_tasks + details + extra), "\n".join(readme)


def _shown(d: Path, root: Path) -> str:
    """results/<...> as a reader finds it from the repository's root."""
    return f"{root.name}/{d.relative_to(root).as_posix()}"


def _why_not(d: Path) -> str:
    complete, outcomes, seeds = _completeness(d)
    return f"{seeds} seeds" + ("" if complete else ", not every planned run finished") + \
        ("" if outcomes else ", no per-problem outcomes")


def write_findings(root: Path, out: Path | None = None) -> Path:
    out = out or root / "FINDINGS.md"
    out.write_text(render(root))
    return out
