"""--seeds auto:N: seeds in batches, a group-sequential decision after each, stop when every ordering is decided."""
from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import pandas as pd

from ..errors import ConfigError
from ..config.ablation import Ablation, ablation_record
from ..store import metrics
from ..store.metrics import resolve_column
from ..store.rundir import _atomic_write, _read_json, collect, meta_text


BATCH = 5  # seeds per look of --seeds auto; fixed, so the looks (and the decisions) do not depend on --population


TIMING = ("wall_s", "runs", "skipped", "where", "threads", "populations", "cpus", "cpu", "cpu_model", "cpu_paths",
          "gpu", "load_avg_end", "command")


def sequential_orderings(abl: Ablation) -> list[str]:
    """What --seeds auto decides: the claim's orderings, or every pair of variants ("a vs b") of a plain ablation."""
    if abl.claim:
        return list(abl.claim["expect"])
    labels = [label for label, _, _ in abl.variants]
    if len(labels) < 2:
        raise ConfigError("--seeds", "auto", f"{abl.source} has one variant: there is no ordering for more seeds "
                          "to decide; give a number of seeds")
    return [f"{a} vs {b}" for i, a in enumerate(labels) for b in labels[i + 1:]]


def decision_task(abl: Ablation) -> metrics.TaskInfo | None:
    """The declaration of the task the ablation's variants train (None when they train several)."""
    record = ablation_record(abl)
    return metrics.recorded_task(record) if record["task"] else None


def decision_column(summary: pd.DataFrame, abl: Ablation) -> str:
    """The summary column --seeds auto decides on: the claim's `metric`, else the task's verdict metric, the
    column FINDINGS.md judges. The one place this choice is made for the runner."""

    task = decision_task(abl)
    return resolve_column(summary, (abl.claim or {}).get("metric") or (task.verdict_metric if task else None),
                          abl.source)


def sequential_look(abl: Ablation, summary: pd.DataFrame, orderings: list[str], batches: list[list[int]]) -> dict:
    """The decision after the last of `batches` (stats.sequential_decision, replaying every earlier look)."""
    from .. import stats

    seeds = [s for b in batches for s in b]
    looks = {"looks": [sum(map(len, batches[:k + 1])) for k in range(len(batches))], "seeds": seeds}
    failed = summary[summary.status != "ok"] if len(summary) else summary
    if len(failed):  # a seed missing from some variants would bias the pairs: fix the runs first
        return {"stopped": "failed", "reason": f"{len(failed)} of {len(summary)} runs failed (errors in summary.csv); "
                "run the same command again to redo them and go on", **looks}
    column = decision_column(summary, abl)
    ok = summary[summary[column].notna()]
    # a ratio margin ("5%") is judged on the log scale, which these looks do not use: no margin for them
    margin, source = metrics.claim_margin(abl.claim, abl.setting, column, decision_task(abl))
    values = {v: dict(zip(map(int, g.seed), map(float, g[column]))) for v, g in ok.groupby("variant")}
    # no margin: equivalence cannot be shown (TOST within +-0 never passes), only an ordering
    decision = stats.sequential_decision(values, orderings, margin or 0.0, len(abl.seeds), batches)
    decided = all(r["decided"] for r in decision["orderings"])
    return {"stopped": ("decided" if decided else "cap") if decision["done"] else None, "reason": decision["reason"],
            "metric": column, "margin": margin, "margin_source": source, "alpha": stats.ALPHA,
            "correction": f"O'Brien-Fleming-type alpha spending (Lan-DeMets) over the looks; each of the "
                          f"{len(orderings)} orderings at alpha / {len(orderings)} (Bonferroni)",
            **looks, "seeds_per_variant": {v: len(x) for v, x in values.items()},
            "orderings": [{k: r[k] for k in ("ordering", "decided", "outcome", "n", "look", "why")}
                          for r in decision["orderings"]]}


def run_sequential(abl: Ablation, out: Path, orderings: list[str], execute) -> None:
    """--seeds auto:N: abl.seeds in batches of BATCH; after each, the sequential decision; stop when it is done.

    Stateless like the decision: every batch is run (finished runs are skipped) and every look replayed
    from the first, so a resumed or re-run sweep makes the same looks and reaches the same decision.
    sweep.json and ablation.json's `sequential` are rewritten after every look."""
    batches = [abl.seeds[i:i + BATCH] for i in range(0, len(abl.seeds), BATCH)]
    setup = {"cap": len(abl.seeds), "batch": BATCH, "orderings": len(orderings)}
    before = _read_json(out / "ablation.json").get("sequential")
    if isinstance(before, dict) and before.get("cap") not in (None, setup["cap"]):
        # the looks already made spent alpha at fractions of the old cap: new fractions would spend it again
        raise ConfigError("--seeds", f"auto:{setup['cap']}", f"{out} was run with --seeds auto:{before['cap']}; "
                          f"resume it with auto:{before['cap']} (a new cap would test the same seeds at a family-wise "
                          "error above 0.05), or start a new --out")
    previous = _read_json(out / "sweep.json")
    timing = {k: previous[k] for k in TIMING if k in previous}  # the last sweep that ran something
    ran: list[dict] = []
    look: dict = {"stopped": None, "looks": [], "seeds": []}

    def record(look: dict) -> None:
        sweep = timing | {"sequential": setup} | look
        _atomic_write(out / "sweep.json", json.dumps(sweep, indent=1))
        meta = json.loads((out / "ablation.json").read_text())
        meta["sequential"] = setup | {k: look.get(k) for k in ("stopped", "reason", "metric")}
        _atomic_write(out / "ablation.json", meta_text(meta))

    try:
        for k in range(1, len(batches) + 1):
            seeds = [s for b in batches[:k] for s in b]
            did = execute(seeds, {"sequential": setup}, sum(r["runs"] for r in ran))
            if did:
                ran.append(did)
                n_ran = sum(r["runs"] for r in ran)
                # skipped: the runs of this look's plan finished before this sweep, each counted once (a sum
                # over the looks counted the first batches' again at every look)
                timing = did | {"wall_s": round(sum(r["wall_s"] for r in ran), 1), "runs": n_ran,
                                "skipped": len(seeds) * len(abl.variants) - n_ran,
                                "populations": [n for r in ran for n in r["populations"]]}
            look = sequential_look(abl, collect(out), orderings, batches[:k])
            record(look)
            print(f"{abl.name}: look {k} at {len(seeds)} seeds: {look['reason']}", file=sys.stderr)
            if look["stopped"]:
                return
    except BaseException as e:  # Ctrl-C, SIGTERM, a lost worker: say so; the next run resumes from the runs kept
        if isinstance(e, ConfigError):  # bad input, said in one line; not a state of the sweep
            raise
        with contextlib.suppress(Exception):
            record(look | {"stopped": "interrupted" if isinstance(e, KeyboardInterrupt) else "error",
                           "reason": f"{type(e).__name__} during batch {len(look['looks']) + 1}"})
        raise
