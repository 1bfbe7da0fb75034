"""Judging the field's published claims, each tested by an ablation that carries a `claim` (FINDINGS.md is
written from these by findings_text.py).

An ablation file states its claim (text, source, the paper's setting, `expect`: "a > b" or "a = b" between
variant labels; optionally `metric`, `margin` and `judge`: final or area) and runs on one or more `settings`.
Every ordering on every setting is judged on one quantity of one metric (the claim's, else the task's
verdict metric; final, else area; at the smaller budget where the variants drew different numbers of
samples), from per-seed values (quantities.py) with grpo_bench.stats: paired or Welch tests, the seeds x
problems test where per-problem outcomes were kept, Holm over the claim's testable orderings on the task,
TOST within the margin, one outcome per ordering; then the same rows once more in the claim's family across
its tasks (family()), which "holds on some tasks" rests on. An ordering is *not testable here*, and counted
nowhere, when its variants differ only in parts the task declares inert, when every paired difference is 0,
or when they ran the same numbers as an earlier ordering's; *not exercised*, and counted nowhere either, when the
diagnostic its claim declares for the part's mechanism stays under its threshold (mechanism.py). Seeds that `run --seeds auto` chose are judged
with the boundaries that chose them, on the metric they were chosen on.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from .. import stats
from ..store import metrics
from . import mechanism as mech
from .compare import load_side
from ..errors import ConfigError
from ..config.ablation import check_orderings, load_ablation, parse_ordering
from ..config.run import run_dict
from ..store.metrics import final_names
from ..store.rundir import OUTCOMES_FILE, read_meta, read_table
from .quantities import (_difference, _logged, _values, at_budget, once, outcome_runs, plateau,  # noqa: F401
                         plateau_from, problem_table, run_curves, second_half_move)

# Results written before ablation.json recorded its task and its file's settings: the shipped files'
# settings, in their order, and the task each trains. A setting added since never needs a line here.
LEGACY_SETTINGS = {"sort": "sort", "lm": "arithmetic"}
QUANTITIES = ("final", "area")
EQUAL_BUDGET = 1.01  # budgets further apart than this ratio are compared at the smaller one


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


# ------------------------------------------------------------------------------------ judging


def margin_v4(claim: dict, setting: str | None, column: str, task, means: pd.Series) -> tuple:
    """(margin, where it comes from, judged on the log scale): the claim's, the task's or the metric's, every
    one fixed before the runs (metrics.claim_margin); a ratio margin ("5%") judges the log of the metric."""
    m, source = metrics.claim_margin(claim, setting, column, task, log_scale=True)
    own = (claim or {}).get("margin")
    return m, source, metrics.ratio_margin(own.get(setting) if isinstance(own, dict) else own) is not None


def judge_setting(directory: Path, claim: dict, setting: str | None = None, root: Path | None = None,
                  rules: stats.Rules = stats.V4, margin_of=margin_v4) -> dict:
    """Every expected ordering of a claim judged on one results directory: on both quantities, Holm over
    the testable orderings of each (the task's family), the claim's `judge` deciding the verdict.
    rules, margin_of: v4's, or the earlier rules analysis/rule_changes.py replays."""
    meta = read_meta(directory)
    summary = read_table(directory / "summary.csv", ["run", "variant", "status"])
    task = metrics.task_of(meta, final_names(summary))
    asked = claim.get("metric") or (task.verdict_metric if task else None)
    side = once(("side", str(directory), asked), lambda: load_side(directory, asked))
    column = side.column
    margin, source, log = margin_of(claim, setting, column, task, side.means)
    side, no_log = _logged(side) if log else (side, {})
    judge_on = claim.get("judge", "final")
    configs = variant_configs(meta, root)
    where = f"{directory / 'ablation.json'}: claim of {meta.get('name', directory.name)}"
    if rules.margins == "v4":  # v3's recorded claims asked for margins v4 refuses
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
            row["why"] = no_log.get(a) or no_log.get(b) or inert_reason(task, configs.get(a), configs.get(b))
            canon = frozenset((ident.get(a, a), ident.get(b, b)))
            if row["why"] is None and len(canon) == 2 and canon in seen:
                twins = [f"`{v}` ran the same numbers as `{ident[v]}`" for v in (a, b) if ident.get(v, v) != v]
                row["why"] = f"the same runs as `{seen[canon]}` ({'; '.join(twins)})"
            seen.setdefault(canon, e)
            row["budget"] = _budget(budgets, a, b)
        rows.append(row)
    # a part with nothing to act on (its diagnostic under the claim's threshold): no verdict, in no count
    declared = claim.get("mechanism") if rules.mechanism else None
    table = mech.metrics_table(directory) if declared else None
    for row in rows:
        row["mechanism"] = row["unexercised"] = None
        if declared and not row["missing"] and row["why"] is None:
            row["mechanism"] = mech.judge(table, declared, row["pair"], row["a"], row["b"])
            if row["mechanism"] and row["mechanism"]["acts"] is False:
                row["unexercised"] = mech.text(row["mechanism"], row["a"], row["b"])

    tested = [r for r in rows if not r["missing"] and r["why"] is None and r["unexercised"] is None]
    by_quantity = {}
    for q in QUANTITIES:
        groups, pairs, tables = {}, [], {}
        for i, r in enumerate(tested):
            ga, gb = (f"{i}:a", f"{i}:b")
            groups[ga] = _values(side.by_seed[r["a"]], r["a"], q, r["budget"], curves, log)
            groups[gb] = _values(side.by_seed[r["b"]], r["b"], q, r["budget"], curves, log)
            if groups[ga] is None or groups[gb] is None:
                groups.pop(ga), groups.pop(gb)
                continue
            pairs.append((ga, gb, r["claim"]))
            if problems:
                # the same under every set of rules: rule_changes.py's ten passes build it once
                key = ("difference", str(directory), column, r["a"], r["b"], tuple(groups[ga].index),
                       tuple(groups[gb].index), q, r["budget"])
                d = once(key, lambda: _pair_table(problems, curves, r, groups[ga].index, groups[gb].index, q))
                if d is not None:
                    tables[(ga, gb)] = d
        results = stats.compare_pairs(groups, pairs, margin, tables=tables, rules=rules)
        by_quantity[q] = {int(t["a"].split(":")[0]): t for t in results}
    sequential = _sequential(meta, directory, column, margin, judge_on)
    for i, r in enumerate(tested):
        r["quantities"] = {}
        for q in QUANTITIES:
            t = by_quantity[q].get(i)
            if t is not None:
                r["quantities"][q] = t | {"a": r["a"], "b": r["b"], "pair": r["pair"]}
        if sequential and judge_on in r["quantities"]:
            _apply_sequential(r["quantities"][judge_on], sequential, side.by_seed, rules)
        final = r["quantities"].get("final")
        r["plateau"] = (None if judge_on != "final" or r["budget"] is not None or final is None
                        else plateau(curves, r, side.by_seed, margin, final["diff"], rules.plateau_effect))
    sweep = directory / "sweep.json"
    try:
        timing = json.loads(sweep.read_text()) if sweep.is_file() else None
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(str(sweep), "<file>", f"not valid JSON: {str(e).splitlines()[0]}") from None
    return {"dir": directory, "side": side, "rows": rows, "column": column, "margin": margin, "margin_source": source,
            "log": log,
            "judge": judge_on, "sweep": timing, "task": task, "sequential": sequential,
            "sampled": _means(ok, "final/reward") if column != "final/reward" else None}


def _pair_table(problems: dict, curves: dict, row: dict, seeds_a, seeds_b, q: str) -> np.ndarray | None:
    """a − b of a row's variants, seeds by problems, or None where either has no problem table."""
    ta = problem_table(problems, curves, row["a"], seeds_a, q, row["budget"])
    tb = problem_table(problems, curves, row["b"], seeds_b, q, row["budget"])
    return None if ta is None or tb is None else _difference(ta, tb)


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


def _apply_sequential(t: dict, seq: dict, by_seed: dict, rules: stats.Rules = stats.V4) -> None:
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
    if rules.size_words:
        stats.size_unclear(t)


# ------------------------------------------------------------------ a claim across its tasks


def judge_claim(entry: dict, root: Path | None = None, rules: stats.Rules = stats.V4, margin_of=margin_v4) -> dict:
    """setting -> judge_setting's result for every task a claim ran on, each tested row of the claim's quantity
    also decided in the claim's family (family()): what "holds on some tasks" rests on."""
    results = {s: judge_setting(d, entry["claim"], s, root, rules, margin_of) for s, d in entry["settings"].items()}
    family(results, rules)
    return results


def family(results: dict, rules: stats.Rules = stats.V4) -> int:
    """Holm over every testable ordering of a claim on every task, on each task's own quantity: each such row's
    t["family"] holds a copy decided in that family (its p_holm, outcome, verdict and m). A statement that an
    ordering holds on *some* of the tasks is a union over the tasks, so its error is the family's: with one
    task per family a claim tried on five null tasks would find one 1 - 0.95^5 = 23% of the time. "Holds on
    every task" is an intersection and needs no correction (each task at its own level). v3 (rules.claim_family
    off): the family is the task's, as for a task's cell. Returns the family's size m."""
    rows = [t for r in results.values() for row in r["rows"]
            if (t := _tested(row, r["judge"])) is not None and not t.get("sequential")]
    if not rules.claim_family:
        for t in rows:
            t["family"] = {k: t[k] for k in ("p_holm", "outcome", "verdict", "m")}
        return 0
    copies = stats.decide([{k: v for k, v in t.items() if k != "family"} for t in rows], rules=rules)
    for t, c in zip(rows, copies):
        t["family"] = {k: c[k] for k in ("p_holm", "outcome", "verdict", "m")}
    return len(rows)


def _tested(row: dict, quantity: str) -> dict | None:
    """The row's decided test on `quantity`, None where missing, not testable or not exercised."""
    t = (None if row["missing"] or row["why"] is not None or row.get("unexercised") is not None
         else row["quantities"].get(quantity))
    return None if t is None or t["verdict"] == stats.NOT_TESTABLE else t


# ------------------------------------------------------------------ the claims under a results root


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
        mechanism = mech.declared(meta, root)
        claim = {**claim, "mechanism": mechanism} if mechanism else claim
        task = metrics.task_of(meta, () if meta.get("task") else final_names(read_table(d / "summary.csv", ["run"])))
        family = meta["name"].removesuffix(f"_{setting}") if setting else meta["name"]
        setting = setting or (task.name if task else d.name)  # a file without settings: its task's name
        entry = families.setdefault(family, {"claim": claim, "source": meta.get("source", ""), "settings": {},
                                             "others": {}})
        # a setting added later records its margin in its own run's claim, fixed before that run; the family's
        # claim is the first directory's, recorded before the setting existed
        own, first = claim.get("margin"), entry["claim"].get("margin")
        if isinstance(own, dict) and setting in own and (first is None or isinstance(first, dict)):
            entry["claim"] = {**entry["claim"], "margin": {**(first or {}), setting: own[setting]}}
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


def _completeness(d: Path) -> tuple[bool, bool, bool, int]:
    """(every planned run finished, per-problem outcomes kept, every evaluation on the full problem set, seeds):
    which of two results directories of one claim and task to judge. Outcomes before seeds: a test on seeds alone
    leaves out how much the verdict depends on which held-out problems were drawn (most of the variance on the LM
    tasks), so more seeds without them are a narrower interval for a narrower question. Full evaluations before
    seeds too: a rerun without eval_subset reads its curves and equal-sample points on one problem set."""
    meta = read_meta(d)
    summary = read_table(d / "summary.csv", ["run", "status"])
    done = set(summary.loc[summary.status == "ok", "run"])
    tasks = [c.get("task") or {} for c in (meta.get("configs") or {}).values()]
    full = all(t.get("eval_subset", 0) in (0, t.get("eval_size", 0)) for t in tasks if isinstance(t, dict))
    return set(meta["runs"]) <= done, (d / OUTCOMES_FILE).is_file(), full, len(meta["seeds"])
