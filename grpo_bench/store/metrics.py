"""Every metric declared once, and what a task says about itself to the reports.

A metric is a name in the namespace the trainer and the tasks log (`reward/mean`, `kl/seq`,
`eval/accuracy`). Its declaration holds what the figures, REPORT.md, FINDINGS.md, `compare`,
the trainer's summary and the statistics' default margins read of it, as lm-evaluation-harness
declares a metric once with its aggregation and direction:

    label             its name on a figure's axis ("held-out accuracy")
    summary           its name as a column of REPORT.md's results table ("eval accuracy"); a
                      metric with one is a headline column wherever its final value has values
    range             (lo, hi): what it can be; every line and band drawn of it is clipped to it
    scale             "linear"; "log": a log axis over the mean and its CI; "heavy": heavy-tailed,
                      median and quartiles on a log axis
    higher_is_better  which way "best" reads (None: neither, a length say)
    tail              the trainer writes final/<name>: its mean over the last tenth of the rollouts
                      that logged it (reward/mean's is final/reward, written by the trainer itself)
    margin            an equivalence margin of its own for verdicts on its final value (none of the
                      core's metrics has one: a task's verdict metric takes the task's margin, below)
    final             its summary column where that is not final/<name>
    offset_of         another metric it is minus a constant (the same for every run): its curve,
                      final values and differences are that metric's again, drawn once

The core declarations below are the trainer's metrics and families of names (`*accuracy`,
`*reward*`, `ratio/*`); a task declares the metrics it logs in its class attribute `metrics`
(grpo_bench/tasks/arithmetic.py). A name takes each property from the first declaration that
matches it (fnmatch) and sets it, the tasks' before the core's: an exact declaration says what
it knows and a family fills in what it leaves unset. A name means one thing in every task: two
tasks that declare one name differently are an error.

A task also declares, as class attributes, what results of it are judged on: `label` ("arithmetic
LM"), `short` ("LM"), `main_metric` (a summary column, "final/eval/accuracy"), `curves` (the
headline figure's panels: the main metric's curve, then those beside it), and for verdicts
(FINDINGS.md, `--seeds auto`): `verdict_metric` (the held-out summary column claims are judged on
unless they name another), `headroom` (what the default recipe moves it over the task's budget:
start, end, and where that was measured; the default margin is odds_margin at its end, one rule for
every task), and `inert` (axis -> (parts, why): parts that do the same on this task,
so an ordering that only swaps them is not testable here). The runner records them in
ablation.json as "task"; results written before it did are known by a metric only their task
logs (LEGACY); the judging keys come from the task's declaration where it is registered.
"""
from __future__ import annotations

import fnmatch
import math
import re
from typing import TYPE_CHECKING
from dataclasses import dataclass, field, fields, replace
from functools import lru_cache

from .. import registry
from ..errors import ConfigError

if TYPE_CHECKING:
    import pandas as pd

INF = math.inf
SCALES = ("linear", "log", "heavy")


@dataclass(frozen=True)
class Metric:
    """One declaration: a name (or an fnmatch pattern) and the properties it sets; None = not set here."""

    name: str
    label: str | None = None
    summary: str | None = None
    range: tuple[float, float] | None = None
    scale: str | None = None
    higher_is_better: bool | None = None
    tail: bool | None = None
    margin: float | None = None
    final: str | None = None
    offset_of: str | None = None

    def __post_init__(self):
        if self.scale is not None and self.scale not in SCALES:
            raise ValueError(f"metric {self.name!r}: scale {self.scale!r}; valid: {', '.join(SCALES)}")
        if self.range is not None and not self.range[0] < self.range[1]:
            raise ValueError(f"metric {self.name!r}: range {self.range} is empty")

    @property
    def lo(self) -> float:
        return -INF if self.range is None else self.range[0]

    @property
    def hi(self) -> float:
        return INF if self.range is None else self.range[1]

    @property
    def heavy(self) -> bool:
        return self.scale == "heavy"

    @property
    def column(self) -> str:
        """Its summary column in summary.csv."""
        return self.final or f"final/{self.name}"


# The trainer's metrics and the families of names every task shares. Order matters only within
# one property: the first declaration that sets it wins.
CORE = (
    Metric("reward/mean", label="rollout reward", summary="final reward", final="final/reward", higher_is_better=True),
    Metric("kl/seq", tail=True),
    Metric("response/length", tail=True),
    # how far a dialled sampler is from the trainer on what it sampled (a claim is judged on it)
    Metric("mismatch/k3", tail=True, range=(0, INF), scale="log", label="sampler-trainer k3 KL",
           summary="sampler mismatch (k3)", higher_is_better=False),
    Metric("mismatch/kl", tail=True, label="sampler-trainer KL (k1)"),
    Metric("mismatch/ratio_*", range=(0, INF), scale="heavy"),
    # what a value can be, by family
    Metric("*accuracy_gain", range=(-1, 1)),
    Metric("*accuracy", range=(0, 1)), Metric("*pass@k", range=(0, 1)), Metric("*/format", range=(0, 1)),
    Metric("*frac*", range=(0, 1)),
    Metric("ratio/*", range=(0, INF), scale="heavy"), Metric("grad/norm", range=(0, INF), scale="heavy"),
    Metric("kl/old", range=(0, INF), scale="heavy"), Metric("time/*", range=(0, INF), scale="heavy"),
    Metric("entropy", range=(0, INF)), Metric("*/std", range=(0, INF)), Metric("*abs*", range=(0, INF)),
    Metric("response/length*", range=(0, INF)), Metric("*_cv", range=(0, INF)),
    # no margins here: a task's margin comes from what its default recipe moves (TaskInfo.margin)
)

# Results from before ablation.json recorded its task: the task is known by a metric only it logs,
# the first that matches. A task added since always records itself, so this never grows.
LEGACY = (("eval/accuracy_gain", "arithmetic"), ("reward/mean", "sort"))

DEFAULT = Metric("", range=(-INF, INF), scale="linear", tail=False)


# The task modules import torch; plot, compare and findings must not need it. Where they cannot be imported,
# a task is known by what its results directories' ablation.json recorded of it (remember()); where they can,
# the registered declaration wins and a record only adds a task not registered here (a user's, not included).
HEAVY = ("torch", "transformers", "peft", "triton")
_RECORDED: dict[str, tuple[tuple[Metric, ...], dict]] = {}
_NO_TASKS: list[bool] = []   # set once the task modules failed to import for want of a heavy package


def _classes() -> dict[str, type] | None:
    """name -> class of every registered task; None where the task modules cannot be imported (no torch)."""
    if _NO_TASKS:
        return None
    try:
        return {n: registry.get("task", n) for n in registry.names("task")}
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in HEAVY:
            raise
        _NO_TASKS.append(True)
        return None


def task_names() -> list[str]:
    """The tasks known here: the registered ones, then those known only from a results directory's record."""
    known = list(_classes() or {})
    return known + [n for n in _RECORDED if n not in known]


def _own(name: str) -> tuple[Metric, ...]:
    """A task's own metric declarations: its class's, else its record's."""
    cls = (_classes() or {}).get(name)
    return tuple(getattr(cls, "metrics", ())) if cls is not None else _RECORDED.get(name, ((), {}))[0]


def _encode(m: Metric) -> dict:
    d = {f.name: getattr(m, f.name) for f in fields(Metric) if getattr(m, f.name) is not None}
    if "range" in d:  # JSON has no infinity: an open end is null
        d["range"] = [None if math.isinf(x) else x for x in d["range"]]
    return d


def _decode(d: dict) -> Metric:
    d = dict(d)
    if d.get("range") is not None:
        lo, hi = d["range"]
        d["range"] = (-INF if lo is None else lo, INF if hi is None else hi)
    return Metric(**d)


def remember(meta: dict | None) -> None:
    """Learn a task from ablation.json's record of it (its declaration and metrics), for where it is not
    registered; a record that does not parse is left out (read_meta reports bad records)."""
    t = (meta or {}).get("task")
    if not isinstance(t, dict) or not isinstance(t.get("name"), str) or not isinstance(t.get("metrics"), list):
        return
    try:
        own = tuple(_decode(m) for m in t["metrics"])
    except (TypeError, ValueError):
        return
    _RECORDED.setdefault(t["name"], (own, t))


@lru_cache(maxsize=8)
def _table(tasks: tuple[tuple[str, tuple[Metric, ...]], ...]) -> tuple[Metric, ...]:
    """Every declaration in lookup order: each task's (in registry order), then the core's."""
    seen: dict[str, tuple[str, Metric]] = {}
    out = []
    for name, own in tasks:
        for m in own:
            if m.name in seen:
                first, other = seen[m.name]
                if other != m:
                    raise ValueError(f"metric {m.name!r} is declared differently by tasks {first!r} and {name!r}: "
                                     f"{other} vs {m}")
                continue
            seen[m.name] = (name, m)
            out.append(m)
    return tuple(out) + CORE


def declarations() -> tuple[Metric, ...]:
    return _table(tuple((n, _own(n)) for n in task_names()))


def metric_of(column: str) -> str | None:
    """The metric a summary column holds the final value of (final/reward -> reward/mean); None for
    a column that is no final value."""
    for m in declarations():
        if m.final == column:
            return m.name
    return column.removeprefix("final/") if column.startswith("final/") else None


def get(name: str) -> Metric:
    """Everything declared about a metric (or a summary column's metric), each property from the first
    declaration that matches and sets it; what none sets has DEFAULT's value."""
    name = metric_of(name) or name
    found = {}
    for m in declarations():
        if fnmatch.fnmatchcase(name, m.name):
            for f in fields(Metric):
                if f.name != "name" and f.name not in found and getattr(m, f.name) is not None:
                    found[f.name] = getattr(m, f.name)
    return replace(DEFAULT, name=name, **found)


def final_column(metric: str) -> str:
    return get(metric).column


def tail(task_cls: type) -> tuple[str, ...]:
    """What the trainer summarises over the last tenth of the rollouts for this task: the core's and the
    task's exact declarations with tail set, in declaration order."""
    own = tuple(getattr(task_cls, "metrics", ()))
    return tuple(dict.fromkeys(m.name for m in CORE + own if m.tail and not _pattern(m.name)))


def final_columns(task_cls: type) -> list[str]:
    """The summary columns every run of this task has: the rollout reward's, the tail metrics' and the
    held-out metrics it declares by name (what a claim's `metric` may name)."""
    own = tuple(getattr(task_cls, "metrics", ()))
    evals = [m.name for m in own if m.name.startswith("eval/") and not _pattern(m.name)]
    return list(dict.fromkeys(["final/reward", "final/reward_first", "final/samples",
                               *(final_column(m) for m in tail(task_cls)), *(f"final/{m}" for m in evals)]))


def final_known(task_cls: type, column: str) -> bool:
    """Whether a run of this task writes `column`; a held-out metric the task logs without declaring it
    (eval/format) counts where a declared pattern covers it."""
    if column in final_columns(task_cls):
        return True
    name = column.removeprefix("final/")
    patterns = [m.name for m in CORE + tuple(getattr(task_cls, "metrics", ())) if _pattern(m.name)]
    return name.startswith("eval/") and any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _pattern(name: str) -> bool:
    return any(c in name for c in "*?[")


def headline(task: str | None = None) -> list[Metric]:
    """The headline columns in REPORT.md's order: the core's, then the task's (every task's, in registry
    order, when the task is not known here)."""
    names = [task] if task in task_names() else task_names()
    own = [m for n in names for m in _own(n)]
    out = {}
    for m in [m for m in CORE if m.summary] + [m for m in own if m.summary]:
        out.setdefault(m.name, get(m.name))
    return list(out.values())


# ----------------------------------------------------------------------------- tasks




@dataclass(frozen=True)
class TaskInfo:
    """What results are judged on: a task's declaration, as ablation.json records it under "task"."""

    name: str
    label: str             # its name in FINDINGS.md's columns ("arithmetic LM")
    short: str             # in a column that pairs two tasks ("toy ↔ LM τ")
    main_metric: str       # the summary column REPORT.md's headline and figures lead with
    curves: tuple[str, ...]  # the headline figure's panels: the main metric's curve, then those beside it
    higher_is_better: bool  # the main metric's direction
    verdict_metric: str = ""  # the held-out summary column claims are judged on (main_metric where not declared)
    margin: float | None = None  # the default equivalence margin on the verdict metric
    margin_rule: str = "no margin declared for this task"  # how the margin follows from the headroom
    headroom: tuple | None = None  # (start, end) of the default recipe on the verdict metric, where declared
    inert: dict = field(default_factory=dict)  # axis -> (parts that act the same here, why)

    def __post_init__(self):
        if not self.verdict_metric:
            object.__setattr__(self, "verdict_metric", self.main_metric)

    def record(self) -> dict:
        """ablation.json's "task": with the task's own metric declarations, so that plot, compare and findings
        draw and judge its results where the task cannot be imported."""
        return {"name": self.name, "label": self.label, "short": self.short, "main_metric": self.main_metric,
                "curves": list(self.curves), "higher_is_better": self.higher_is_better,
                "verdict_metric": self.verdict_metric, "margin": self.margin, "margin_rule": self.margin_rule,
                "inert": {k: [list(v[0]), v[1]] for k, v in self.inert.items()},
                "metrics": [_encode(m) for m in _own(self.name)]}


TASK_KEYS = {"name": str, "label": str, "short": str, "main_metric": str, "curves": list, "higher_is_better": bool}
JUDGING = ("verdict_metric", "margin", "margin_rule", "inert", "headroom")  # from the declaration, where the task is registered


# One rule for every task's margin (docs/statistics.md, "The margin δ"): a difference is negligible when it moves
# the odds of a right answer (a position right, on the toy) by less than a factor MARGIN_ODDS either way, at the
# level the task's default recipe ends at, p: δ = p (1 - p) ln(MARGIN_ODDS), the first-order change of p.
MARGIN_ODDS = 1.2


def odds_margin(p: float, odds: float = MARGIN_ODDS) -> float:
    """δ at level p: the change of p when its odds move by a factor `odds`, to first order (3 decimals)."""
    return round(p * (1 - p) * math.log(odds), 3)


def judging(cls: type, section: dict | None = None) -> dict:
    """A task class's verdict metric, margin (odds_margin at the end of its default recipe's headroom), the rule
    in words, its inert parts and the headroom. section: the run's task section, for a class whose headroom
    depends on it (`headroom_of(section)`: a reasoning-gym dataset's)."""
    main = getattr(cls, "main_metric", "final/reward")
    verdict = getattr(cls, "verdict_metric", main)
    headroom = cls.headroom_of(section) if hasattr(cls, "headroom_of") else getattr(cls, "headroom", None)
    margin, rule, ends = None, "no margin declared for this task", None
    if headroom is not None:
        start, end, _where = headroom
        margin, ends = odds_margin(end), (start, end)
        rule = (f"odds of {MARGIN_ODDS:g}x at the {end:.3f} its default recipe ends at on "
                f"{get(verdict).summary or verdict}: {end:.3f} x {1 - end:.3f} x ln {MARGIN_ODDS:g}")
    inert = {k: (tuple(v[0]), v[1]) for k, v in getattr(cls, "inert", {}).items()}
    return {"verdict_metric": verdict, "margin": margin, "margin_rule": rule, "inert": inert, "headroom": ends}


def declared_task(name: str, section: dict | None = None) -> TaskInfo:
    """A task's declaration, registered or recorded (remember()), for the run's task section where its
    judging depends on it. A task that declares nothing is judged on its rollout reward."""
    classes = _classes()
    if (classes is None or name not in classes) and name in _RECORDED:
        return _from_record(_RECORDED[name][1])
    cls = registry.get("task", name)
    main = getattr(cls, "main_metric", "final/reward")
    curves = tuple(getattr(cls, "curves", (metric_of(main) or main,)))
    higher = get(main).higher_is_better
    label = cls.label_of(section) if hasattr(cls, "label_of") else getattr(cls, "label", name)
    return TaskInfo(name, label, getattr(cls, "short", label), main, curves, True if higher is None else higher,
                    **judging(cls, section))


def recorded_task(meta: dict | None) -> TaskInfo | None:
    """ablation.json's "task" (rundir.read_meta checked its keys), or None where it has none. How it is judged
    (JUDGING) is the task's declaration where the task is registered: a rule changed since the runs applies
    to them; else what the record says, else nothing beyond its main metric."""
    t = (meta or {}).get("task")
    if not isinstance(t, dict):
        return None
    remember(meta)
    configs = (meta or {}).get("configs")
    first = next(iter(configs.values()), None) if isinstance(configs, dict) and configs else None
    return _from_record(t, first.get("task") if isinstance(first, dict) else None)


def _from_record(t: dict, section: dict | None = None) -> TaskInfo:
    base = {k: tuple(t[k]) if k == "curves" else t[k] for k in TASK_KEYS}
    cls = (_classes() or {}).get(t["name"])
    if cls is not None and section is not None and hasattr(cls, "label_of"):
        base["label"] = cls.label_of(section)  # a pretrained model's runs: named by the model, as the class names it now
    if cls is not None:
        judged = judging(cls, section)
    else:
        judged = {k: t[k] for k in JUDGING if k in t}
        judged["inert"] = {k: (tuple(v[0]), v[1]) for k, v in (judged.get("inert") or {}).items()}
    return TaskInfo(**base, **judged)


def task_of(meta: dict | None, metric_names) -> TaskInfo | None:
    """The task of a results directory: recorded in its ablation.json, else guessed from the metrics it
    logged (LEGACY); None when neither says."""
    recorded = recorded_task(meta)
    if recorded is not None:
        return recorded
    names, known = set(metric_names), task_names()
    return next((declared_task(task) for marker, task in LEGACY if marker in names and task in known), None)


def final_names(summary: pd.DataFrame) -> set[str]:
    """The metrics whose final value summary.csv holds for some run."""
    return {metric_of(c) for c in summary.columns if c.startswith("final/") and summary[c].notna().any()}


def main_metrics(metric_names, meta: dict | None = None) -> list[str]:
    """The headline figure's panels that were logged: the task's main curve, then those beside it."""
    names = set(metric_names)
    task = task_of(meta, names)
    return [m for m in task.curves if m in names] if task else []


def main_column(summary: pd.DataFrame, meta: dict | None = None) -> str | None:
    """The summary column of the task's main metric (final/reward on the toy, final/eval/accuracy on the
    LM), else its main curves' or the first headline column with values; None without any."""
    names = final_names(summary)
    task = task_of(meta, names)
    found = [c for c in [task.main_metric] if metric_of(c) in names] if task else []
    found += [final_column(m) for m in main_metrics(names, meta)] + [h[0] for h in headline_columns(summary, meta)]
    return found[0] if found else None


def higher_is_better(column: str, meta: dict | None = None) -> bool:
    """Which way "best" reads on a summary column: as recorded for the task's main metric, else as declared
    (higher where the declaration says neither)."""
    task = recorded_task(meta)
    if task is not None and task.main_metric == column:
        return task.higher_is_better
    return get(column).higher_is_better is not False


def headline_columns(summary: pd.DataFrame, meta: dict | None = None) -> list[tuple[str, str, str]]:
    """(summary column, its label, its metric) of every headline metric declared for the task with a value."""
    task = task_of(meta, final_names(summary))
    return [(m.column, m.summary, m.name) for m in headline(task.name if task else None)
            if m.column in summary.columns and summary[m.column].notna().any()]


def resolve_column(summary: pd.DataFrame, metric: str | None, source: str, meta: dict | None = None) -> str:
    """A --metric as a user writes it (final/eval/accuracy, eval/accuracy, reward/mean, reward) -> a column;
    none: the main metric of the directory's task."""
    finals = [c for c in summary.columns if c.startswith("final/") and summary[c].notna().any()]
    if metric is None:
        column = main_column(summary, meta)
        if column is None:
            raise ConfigError(source, "--metric", f"no main metric found; valid: {', '.join(finals) or 'none'}")
        return column
    for c in (metric, f"final/{metric}", final_column(metric)):
        if c in finals:
            return c
    raise ConfigError(source, "--metric", f"unknown {metric!r}; valid: {', '.join(finals) or 'none'}")


# ------------------------------------------------------------------------------- a verdict's margin


RATIO_MARGIN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")
FROM_RUNS = re.compile(r"^\s*\d+(?:\.\d+)?\s*%\s+of\s+\S+\s*$")


def ratio_margin(m) -> float | None:
    """The share P / 100 of a margin written "P%": a ratio margin, for a metric whose scale only a run can tell
    (a KL drift): a over b within a factor 1 + P/100 either way, judged on the log of the metric, where it is
    the margin ln(1 + P/100) fixed before any run. None for anything else."""
    g = RATIO_MARGIN.match(m) if isinstance(m, str) else None
    return float(g[1]) / 100 if g else None


def margin_from_runs(m) -> bool:
    """A margin written "P% of VARIANT" (v3's kl_gradients): computed from the runs it judges, refused at load."""
    return isinstance(m, str) and bool(FROM_RUNS.match(m))


def claim_margin(claim: dict | None, setting: str | None, column: str, task: TaskInfo | None = None,
                 log_scale: bool = False) -> tuple[float | None, str]:
    """(margin, where it comes from): the claim's `margin` (one number, or one per setting; "P%" is a ratio,
    ln(1 + P/100) on the log of the metric, given only to a caller that judges on that scale, log_scale), else
    the task's own margin when the column is the task's verdict metric (or that less a constant), else the
    metric's declared one (none of the core's declare one)."""
    m = (claim or {}).get("margin")
    if isinstance(m, dict):
        m = m.get(setting)
    if m is not None:
        share = ratio_margin(m)
        if share is None:
            return float(m), "the claim's margin"
        if not log_scale:
            return None, f"the claim's margin, {m.strip()}, is a ratio: judged on the log scale by findings only"
        return round(math.log1p(share), 4), (f"the claim's margin: {m.strip()} either way, ln(1 + {share:g}) on the "
                                             "log of the metric")
    offset = get(column).offset_of  # accuracy gain is accuracy less a constant: the same differences
    if task is not None and task.margin is not None and task.verdict_metric in (column, offset and final_column(offset)):
        return task.margin, f"the task's: {task.margin_rule}"
    m = get(column).margin
    return m, ("the metric's declared margin" if m is not None else "no margin declared for this metric")
