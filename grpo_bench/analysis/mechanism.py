"""Whether a claim's mechanism acted: each ordering's diagnostic read from a results directory's metrics table.

A claim's ablation file declares, under `claim.mechanism`, what each ordering's part acts on and the per-step
metric that shows it (e.g. DAPO's clip-higher acts only on tokens the 0.2 upper clip stops: clip/high_frac of
the variant without it). An ordering whose diagnostic stays under its `min` on a task is *not exercised* there:
FINDINGS prints the value beside the threshold instead of a verdict and counts the row nowhere, as it does a
row that is not testable. A verdict on a part that had nothing to act on says nothing about the part.

The declaration is read from the ablation file the results name (the rule of today, set after the runs like
the margins of v4), else from the claim ablation.json recorded. One diagnostic is reduced as: per run, the
mean over its logged steps of the value (reduce: mean) or of its size (abs_mean), or the value's coefficient of
variation over them (cv: a per-step scale that Adam's running averages absorb when it is constant); then the
mean over the runs of the variant read (`variant`: a, b or a variant's name). A list of diagnostics acts when
any of them does.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..config.ablation import _claim
from ..config.strict_yaml import read_yaml
from ..errors import ConfigError
from ..store.rundir import read_metrics_file
from ..store.rundir import metrics_path
from .quantities import once, per_label


def declared(meta: dict, root: Path | None) -> dict | None:
    """The claim's mechanism: its ablation file's today (tried as given and beside root), else the recorded one."""
    source = meta.get("source") or ""
    for path in [Path(source)] + ([root.parent / source] if root else []):
        if source and path.is_file():
            try:
                claim = (read_yaml(path) or {}).get("claim")
                mechanism = claim.get("mechanism") if isinstance(claim, dict) else None
                if mechanism is not None:
                    _claim(claim, str(path))  # a bad declaration is an error naming the file, not a silent skip
                    return mechanism
            except OSError:
                pass
            break
    return (meta.get("claim") or {}).get("mechanism")


def diagnostics(mechanism: dict | None, ordering: str) -> list[dict]:
    """The ordering's own diagnostics, else the claim's default; [] where the claim declares none."""
    entry = (mechanism or {}).get(ordering, (mechanism or {}).get("default"))
    return [] if entry is None else entry if isinstance(entry, list) else [entry]


def read(table: pd.DataFrame | None, d: dict, a: str, b: str) -> float | None:
    """One diagnostic's value (module docstring), None where it is not logged for the variant it reads."""
    if table is None or d["metric"] == "none":
        return None
    variant = {"a": a, "b": b}.get(d.get("variant", "a"), d.get("variant"))
    # compared as they are (categories): a string copy of every row's name took most of `findings`' reading
    rows = table[(table.metric == d["metric"]) & (table.variant == variant)].dropna(subset=["value"])
    if rows.empty:
        return None
    reduce = d.get("reduce", "mean")
    values = rows.value.abs() if reduce == "abs_mean" else rows.value
    by_run = values.groupby(rows.run.astype(str))
    if reduce == "cv":
        return float((by_run.std(ddof=0) / by_run.mean().abs()).mean())
    return float(by_run.mean().mean())


def judge(table: pd.DataFrame | None, mechanism: dict | None, ordering: str, a: str, b: str) -> dict | None:
    """{"readings": [(diagnostic, value or None)], "acts": True / False / None (not measured)}, None where the
    claim declares no mechanism for the ordering. The part acts when any diagnostic reaches its min (>=)."""
    ds = diagnostics(mechanism, ordering)
    if not ds:
        return None
    readings = [(d, read(table, d, a, b)) for d in ds]
    measured = [(d, v) for d, v in readings if v is not None]
    acts = None if not measured else any(v >= d["min"] for d, v in measured)
    return {"readings": readings, "acts": acts}


def metrics_table(directory: Path) -> pd.DataFrame | None:
    """The results' long metrics table (run, variant, metric, value), None where there is none."""
    return once(("diagnostics", str(directory)), lambda: _metrics_table(directory))


def _metrics_table(directory: Path) -> pd.DataFrame | None:
    path = metrics_path(directory)
    if path is None:
        return None
    try:
        return read_metrics_file(path)[lambda t: ~per_label(t.metric, lambda m: m.startswith("eval/"))]
    except ValueError as e:
        raise ConfigError(str(path), "<file>", f"{e}: damaged; rerun the sweep to rewrite it") from None


def text(result: dict, a: str, b: str) -> str:
    """'clip/high_frac on `overlong_filter` 0.00016 < 0.001 (the upper clip binds)', one per diagnostic."""
    parts = []
    for d, v in result["readings"]:
        variant = {"a": a, "b": b}.get(d.get("variant", "a"), d.get("variant"))
        size = _named(d["metric"], d.get("reduce", "mean"))
        if d["metric"] == "none":  # declared, with the reason nothing logged shows it
            parts.append(f"no diagnostic logged ({d['acts']})")
            continue
        value = "not logged" if v is None else f"{v:.3g} {'<' if v < d['min'] else '≥'} {d['min']:g}"
        parts.append(f"{size} on `{variant}` {value} ({d['acts']})")
    return "; ".join(parts)


def orderings(meta: dict, root: Path | None) -> list[tuple[str, str, str, dict | None]]:
    """(ordering, a, b, judge's result or None) for each ordering of the results' claim that declares a diagnostic."""
    from ..stats import split_ordering

    claim = meta.get("claim") or {}
    mech = declared(meta, root)
    if not mech:
        return []
    table = metrics_table(root) if root is not None else None
    out = []
    for o in claim.get("expect") or []:
        a, b, _ = split_ordering(o)
        if diagnostics(mech, o):
            out.append((o, a, b, judge(table, mech, o, a, b)))
    return out


def report_section(meta: dict, root: Path) -> list[str]:
    """REPORT.md's "Did the mechanism act?" table: each ordering's diagnostic, the variant it is read on, its
    value here beside the threshold the claim declares, and whether FINDINGS may give the row a verdict."""
    rows = orderings(meta, root)
    if not rows:
        return []
    lines = ["## Did the mechanism act?", "",
             "Each ordering's part acts on something (its claim's `mechanism`, in the ablation file): the per-step "
             "metric that shows it, averaged over each run's logged steps and then over the seeds of the variant "
             "read, against the threshold the source's argument needs. Under it the ordering is *not exercised* "
             "here: FINDINGS gives it no verdict. Over training: mechanism.png.", "",
             "| ordering | diagnostic (variant read): value vs threshold | acts |", "|---|---|---|"]
    # a setting's `only:` leaves some of the claim's variants out: their orderings were not run here, which
    # is not the same as run without the diagnostic logged ("not measured")
    ran = set(meta.get("variants") or [])
    absent = [o for o, a, b, _ in rows if ran and not {a, b} <= ran]
    for o, a, b, result in rows:
        if o in absent:
            continue
        acts = {True: "yes", False: "**no: not exercised**", None: "not measured"}[result["acts"]]
        lines.append(f"| `{o}` | {text(result, a, b).replace('|', '&#124;')} | {acts} |")
    if absent:
        if len(absent) == len(rows):   # no table: its header and the blank line before it go
            lines = lines[:-3]
        names = ", ".join(f"`{o}`" for o in absent)
        lines += ["", f"Not run in this setting (a variant of each is outside its `only:`): {names}."]
    return lines + [""]


def _named(metric: str, reduce: str) -> str:
    return {"abs_mean": f"|{metric}|", "cv": f"cv over steps of {metric}"}.get(reduce, metric)


def panels(meta: dict, root: Path | None) -> list[tuple[str, float, str]]:
    """(metric, threshold, reduce) of every declared diagnostic, each metric once: mechanism.png's panels."""
    seen: dict[str, tuple[str, float, str]] = {}
    for o in (meta.get("claim") or {}).get("expect") or []:
        for d in diagnostics(declared(meta, root), o):
            if d["metric"] != "none" and d["metric"] not in seen:
                seen[d["metric"]] = (d["metric"], float(d["min"]), d.get("reduce", "mean"))
    return list(seen.values())
