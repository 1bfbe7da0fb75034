"""results/FINDINGS_rules.md: what each verdict rule changed between FINDINGS v3 and v4, on the committed results.

    python -m grpo_bench.analysis.rule_changes [RESULTS]

Every claim is judged with v3's rules (stats.V3, margin_v3), then v4's changes are applied one at a time, in
the order of issue 42's list, and every cell (claim x task x ordering, on the claim's quantity) whose verdict,
verdict in the claim's family across tasks, or plateau mark moved is put down to the step that moved it. Then
the sensitivity of v4's verdicts to the margin: each verdict judged again at half and at twice every margin.
No run is retrained; FINDINGS.md appends the file (findings_text.RULES_FILE).
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from .. import stats
from ..store import metrics
from .findings import _tested, collect, judge_claim, margin_v4
from .findings_text import RULES_FILE, names
from .quantities import reading_once

# v3's margin of kl_gradients (ablations/kl_gradients.yaml before v4): numbers set after the runs by 5% of the
# KL-free run's drift, and "5% of none" taken from the judged runs themselves
V3_CLAIM_MARGIN = {"kl_gradients": {"sort": 0.6, "lm": 0.08, "countdown": "5% of none", "spell_backward": "5% of none"}}
V3_FRACTION = 0.05  # v3's task margin: this share of what the default recipe moves the verdict metric

STEPS = [
    ("crossed", {"crossed_floor": True},
     "the seeds × problems test keeps the seed term (its mean square floored at the residual's, on the seeds' "
     "S − 1 df) where v3 dropped it and the df jumped to the problems'"),
    ("family", {"claim_family": True},
     "\"holds on some tasks\" is Holm-corrected over every testable ordering of the claim on every task (a task's "
     "cell and \"holds on every task\" keep the task's family); a cell moves here when it holds in its task but no "
     "longer in the claim's family"),
    ("plateau", {"plateau_effect": True},
     "a plateau needs both mean curves to move less than half of min(|Δ|, δ) over the second half of the budget "
     "(v3: within ±δ of their end from half the budget on)"),
    ("margins", {"margins": "v4"},
     "task margins from one odds ratio (1.2) at the default recipe's end, where v3 took 5% of what it moves; "
     "kl_gradients' margin a ratio (5%, on the log of the KL) fixed before the runs, where v3 took 5% of the judged "
     "`none` runs"),
    ("words", {"size_words": True},
     "a significant difference whose interval reaches inside ±δ reads *size unclear*, not *holds* / *reversed* / "
     "*fails*"),
    ("exact", {"exact_max": stats.EXACT_MAX},
     f"every sign pattern enumerated up to {stats.EXACT_MAX} pairs (v3: 20,000 random patterns past 16)"),
    ("mechanism", {"mechanism": True},
     "an ordering whose part had nothing to act on is *not exercised*, with no verdict and in no count: each claim "
     "declares in its ablation file the per-step diagnostic that shows its mechanism acts (e.g. clip-higher: how "
     "often the 0.2 upper clip binds) and a threshold from the source's argument; v3 judged every such row, so a "
     "verdict could be read as evidence about a part that never acted (issue 41)"),
]


_NUMBER = {7: "seven"}  # the page says how many steps in words; another count prints its digits


def margin_v3(claim: dict, setting: str | None, column: str, task, means) -> tuple:
    """v3's margin: the claim's (kl_gradients' as v3 gave it; "P% of VARIANT" from that variant's judged mean),
    else 5% of what the task's default recipe moves its verdict metric, else the metric's."""
    own = dict(claim, margin=V3_CLAIM_MARGIN.get(_family(claim), claim.get("margin")))
    m = own.get("margin")
    m = m.get(setting) if isinstance(m, dict) else m
    if metrics.margin_from_runs(m):
        share, ref = float(m.split("%")[0]) / 100, m.split()[-1]
        return float(f"{share * abs(float(means[ref])):.3g}"), f"v3: {m} (from the judged runs)", False
    if m is not None:
        return float(m), "v3: the claim's margin", False
    offset = metrics.get(column).offset_of
    if task is not None and task.headroom and task.verdict_metric in (column, offset and metrics.final_column(offset)):
        start, end = task.headroom
        return round(V3_FRACTION * abs(end - start), 3), "v3: 5% of what the default recipe moves", False
    return metrics.get(column).margin, "v3: the metric's", False


def _family(claim: dict) -> str | None:
    return next((f for f in V3_CLAIM_MARGIN if claim.get("text", "").startswith("k1 in the loss")), None)


def scaled(factor: float):
    """v4's margins times `factor` (the sensitivity section)."""
    def margin_of(claim, setting, column, task, means):
        m, source, log = margin_v4(claim, setting, column, task, means)
        return (None if m is None else m * factor), source, log
    return margin_of


def cells(root: Path, families: dict, rules: stats.Rules, margin_of) -> dict:
    """(claim, setting, ordering) -> (verdict, holds in the claim's family across tasks, plateau, Δ, df, p, margin) on
    the claim's quantity, for each of `families` (collect's)."""
    out = {}
    for family, entry in families.items():
        for s, r in judge_claim(entry, root, rules, margin_of).items():
            for row in r["rows"]:
                if row["missing"]:
                    continue
                if row.get("unexercised") is not None:
                    out[(family, s, row["pair"])] = ("not exercised", False, False, None, None, None, None)
                    continue
                t = _tested(row, r["judge"])
                fam = t and (t["family"]["verdict"] if row["claim"] == "=" else t["family"]["outcome"]) == "holds"
                out[(family, s, row["pair"])] = ((t["verdict"], fam, row["plateau"] is not None,
                                                   t["diff"], t["df"], t["p"], r["margin"]) if t else
                                                  ("not testable", False, False, None, None, None, None))
    return out


def _word(state: tuple) -> str:
    verdict, fam, flat = state[:3]
    return verdict + (" (not in the claim's family across tasks)" if verdict == "holds" and not fam else "") + (
        ", at a plateau" if flat else "")


def render(root: Path) -> str:
    families, tasks, order = collect(root)
    rules, margin_of = stats.V3, margin_v3
    passes = [(rules, margin_of)]
    for name, change, _ in STEPS:
        rules = dataclasses.replace(rules, **change)
        margin_of = margin_v4 if rules.margins == "v4" else margin_v3
        passes.append((rules, margin_of))
    assert rules == stats.V4
    factors = (0.5, 2.0)
    passes += [(stats.V4, scaled(factor)) for factor in factors]
    judged = [{} for _ in passes]
    # claim by claim, every set of rules on results read once (a claim's directories only, to bound the memory)
    for family, entry in families.items():
        with reading_once():
            for cell, (rules, margin_of) in zip(judged, passes):
                cell.update(cells(root, {family: entry}, rules, margin_of))
    states, sensitivity = judged[:len(STEPS) + 1], judged[len(STEPS) + 1:]
    v3, v4 = states[0], states[-1]
    keys = list(v4)
    moved_at = {k: [STEPS[i][0] for i in range(len(STEPS)) if states[i][k][:3] != states[i + 1][k][:3]] for k in keys}
    per_step = {name: sum(name in m for m in moved_at.values()) for name, _, _ in STEPS}
    verdicts = {STEPS[i][0]: sum(states[i][k][0] != states[i + 1][k][0] for k in keys) for i in range(len(STEPS))}
    flats = [sum(st[k][2] for k in keys) for st in (v3, v4)]
    moved = [k for k in keys if v3[k][:3] != v4[k][:3]]
    name = {s: n for s, (n, _) in names(order, tasks).items()}
    tested = sum(1 for k in keys if v4[k][0] not in ("not testable", "not exercised"))
    lines = ["## What changed in v4, and why: the verdict rules", "",
             f"This table isolates the rules: FINDINGS v4 changes {_NUMBER.get(len(STEPS), len(STEPS))} of v3's "
             f"([Statistics](../docs/statistics.md); issue 42), and judges results rerun and added since v3 (issue 41), "
             f"so each cell here is judged on today's committed results under both rule sets, and a move is the rules' "
             f"alone. `python -m grpo_bench.analysis.rule_changes "
             f"results` judges every cell (claim × task × ordering, on the claim's quantity: {len(keys)} cells, "
             f"{tested} testable under v4) with v3's rules, then applies v4's changes one at a time in the order "
             f"below; a cell moves when its verdict, its verdict in the claim's family across tasks, or its plateau "
             f"mark changes, and is put down to each step at which it did. {len(moved)} of {len(keys)} cells moved."
             f" The cell's own verdict (its outcome on its task) moved in {sum(v3[k][0] != v4[k][0] for k in keys)}; "
             f"rows at a plateau: {flats[0]} under v3, {flats[1]} under v4.",
             "", "| step | what changed, and why | cells moved | of which the cell's verdict |", "|---|---|---:|---:|"]
    lines += [f"| {n} | {why} | {per_step[n]} | {verdicts[n]} |" for n, _, why in STEPS]
    lines += ["", "| claim | task | ordering | v3 | v4 | moved at |", "|---|---|---|---|---|---|"]
    for k in moved:
        f, s, o = k
        lines.append(f"| [{f}](FINDINGS.md#{f}) | {name.get(s, s)} | `{o}` | {_word(v3[k])} | **{_word(v4[k])}** | "
                     f"{', '.join(moved_at[k]) or '—'} |")
    # the step changes nothing else a cell carries: a df that moved at all is a dropped seed term kept
    crossed = [k for k in keys if states[0][k][4] is not None and states[1][k][4] is not None
               and states[0][k][4] != states[1][k][4]]
    lines += ["", f"**The df jump (step crossed).** In {len(crossed)} crossed rows the seed term's estimate was "
              "negative and v3 dropped it; the table gives v3's and v4's df and p (same variance: only the df "
              "change) and the verdict at each.", "",
              "| claim | task | ordering | v3: df, p, verdict | after: df, p, verdict |", "|---|---|---|---|---|"]
    for k in crossed:
        a, b = states[0][k], states[1][k]
        lines.append(f"| {k[0]} | {name.get(k[1], k[1])} | `{k[2]}` | {a[4]:.0f}, {a[5]:.2g}, {a[0]} | "
                     f"{b[4]:.1f}, {b[5]:.2g}, {b[0]} |")
    lines += ["", "**Sensitivity to the margin.** Every v4 verdict judged again with every margin halved and doubled "
              "(the task's and the claim's alike):", "", "| margins | cells whose verdict moves | which |", "|---|---:|---|"]
    for factor, other in zip(factors, sensitivity):
        diff = [k for k in keys if other[k][0] != v4[k][0]]
        lines.append(f"| × {factor:g} | {len(diff)} of {tested} | " + "; ".join(
            f"{k[0]} {name.get(k[1], k[1])} `{k[2]}`: {v4[k][0]} → {other[k][0]}" for k in diff) + " |")
    return "\n".join(lines) + "\n\n"


def main(argv: list[str] | None = None) -> None:
    root = Path((argv or sys.argv[1:] or ["results"])[0])
    out = root / RULES_FILE
    out.write_text(render(root))
    print(out)


if __name__ == "__main__":
    main()
