"""results/FINDINGS_changes.md: every verdict that moved between FINDINGS v2 and v3, and which rule moved it.

    python scripts/findings_changes.py [RESULTS] [V2_FINDINGS]

V2_FINDINGS is the v2 file (default: `git show b96bbe1:results/FINDINGS.md`). The v2 verdicts are
recomputed from the committed results with v2's rule (below) and checked against that file cell by
cell; then the v3 changes are applied one at a time, in this order, each ordering's outcome
recomputed after each, and a change is put down to the step at which the outcome changed:

    outcomes   six outcomes: significance no longer beats equivalence (negligible differences)
    testable   orderings that cannot differ leave Holm and the counts (identical runs, inert parts,
               an ordering asked twice), and kl_gradients' "=" gets the margin it lacked
    metric     the toy judged on its greedy held-out reward, not the sampled training reward
    margin     each task's margin from its headroom (toy 0.044, LM 0.027; were 0.02 and 0.03)
    samples    variants with different budgets compared at equal samples drawn

The last step is FINDINGS v3 itself, which the script checks against findings.judge_setting. The v2 cells
are recomputed from the results as they were before the LM claims were rerun (commit V3_COMMIT, read with
`git archive`: the rerun's numbers are not v2's). A second section lists every verdict that moved between
FINDINGS at V3_COMMIT and FINDINGS now (the rerun of the arithmetic LM claims with seven evaluations and
per-problem outcomes, tested on seeds x problems), with both cells' difference and test.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path


from grpo_bench import stats
from grpo_bench.analysis import findings as F
from grpo_bench.analysis import findings_text as T
from grpo_bench.store import metrics
from grpo_bench.analysis.compare import load_side
from grpo_bench.config.ablation import parse_ordering
from grpo_bench.store.metrics import final_names
from grpo_bench.store.rundir import read_meta, read_table

V2_COMMIT = "b96bbe1"
V3_COMMIT = "16f30c5"   # the last FINDINGS before the arithmetic LM claims were rerun (issue 27)
V2_MARGIN = {"final/reward": 0.02, "final/eval/reward": 0.02, "final/eval/accuracy": 0.03}  # v2's global constants
STEPS = ("outcomes", "testable", "metric", "margin", "samples")
WHY = {"outcomes": "significant and inside ±δ: now *negligible*, not a hold or a reversal (significance "
                   "no longer beats equivalence)",
       "testable": "not testable here, or its Holm family changed (orderings that cannot differ left it); "
                   "kl_gradients' \"=\" got the margin it lacked",
       "metric": "judged on the toy's greedy held-out reward, not the sampled training reward",
       "margin": "the task's margin from its headroom (toy ±0.044, LM ±0.027; v2: ±0.02, ±0.03)",
       "samples": "compared at equal samples drawn (dynamic sampling drew 3.5x / 2.4x the samples)"}


def v2_cells(text: str) -> dict[tuple[str, str, str], str]:
    """(claim, task label, ordering) -> the v2 verdict, from v2's detail tables."""
    out, claim, labels = {}, None, []
    for line in text.splitlines():
        if line.startswith("## "):
            claim = line[3:].strip()
        elif line.startswith("| ordering (a > b) |"):
            labels = [c.split(":")[0].strip() for c in line.split(" | ")[1:]]
        elif line.startswith("| `") and claim:
            cells = line.strip("| \n").split(" | ")
            ordering = cells[0].strip("`")
            for label, cell in zip(labels, cells[1:]):
                found = re.search(r"\*\*(.+?)\*\*", cell)
                if found:
                    out[(claim, label, ordering)] = found.group(1)
    return out


DROPPED = {"prompt_mean > seq_mean": "the pair was asked twice, as '=' and '>'; asked once now",
           "k1_loss_b05 > k3st_loss_b05": "`k3st_loss_b05` ran the same numbers as `k2_loss_b05`: the same test "
                                          "as `k1_loss_b05 > k2_loss_b05`; dropped from the claim"}


def plain(verdict: str) -> str:
    """'equivalent within ±0.02' -> 'equivalent', 'agrees: equivalent within ±0.03' -> 'agrees'."""
    return next(w for w in ("disagrees", "agrees", "equivalent", "undecided") if verdict.startswith(w))


def v2_verdict(sig: bool, eq: bool, diff: float, kind: str) -> str:
    """v2's stats.judge: significance first."""
    if kind == "=":
        return "agrees" if eq else "disagrees" if sig else "undecided"
    if sig:
        return "agrees" if diff > 0 else "disagrees"
    return "equivalent" if eq else "undecided"


def outcome(sig: bool, eq: bool, diff: float, kind: str) -> str:
    o = (("holds" if diff > 0 else "reversed") + (", negligible" if eq else "")) if sig else \
        "equivalent" if eq else "undecided"
    if kind == "=":
        return {"equivalent": "holds (equivalent)"}.get(o, "holds (negligible)" if "negligible" in o else
                                                         "undecided" if o == "undecided" else "fails")
    return o


def as_v3(verdict: str, kind: str) -> str:
    """A v2 verdict in v3's words, so that 'did it move' is one comparison."""
    if kind == "=":
        return {"agrees": "holds (equivalent)", "disagrees": "fails"}.get(verdict, verdict)
    return {"agrees": "holds", "disagrees": "reversed"}.get(verdict, verdict)


def judge(directory: Path, expect: list[str], column: str, margin: float | None, drop: dict,
          budgets: dict | None, rule) -> dict[str, str]:
    """ordering -> verdict under one step: v2's arithmetic (every ordering in Holm, identical runs included),
    dropping `drop` (ordering -> why) from the family, reading at `budgets` (ordering -> samples)."""
    side = load_side(directory, column)
    curves = F.run_curves(directory, metrics.metric_of(column) or column) if budgets else {}
    rows, out = [], {}
    for e in expect:
        if e in drop:
            out[e] = "not testable here"
            continue
        a, b, kind = parse_ordering(e)
        budget = (budgets or {}).get(e)
        x = F._values(side.by_seed[a], a, "final", budget, curves)
        y = F._values(side.by_seed[b], b, "final", budget, curves)
        rows.append((e, kind, stats.two_sample(x, y)))
    ps = [r["p"] for _, _, r in rows]
    tosts = [stats.tost(r["diff"], r["se"], r["df"], margin) if margin else 1.0 for _, _, r in rows]
    for (e, kind, r), ph, pth in zip(rows, stats.holm(ps), stats.holm(tosts)):
        out[e] = rule(ph < stats.ALPHA, bool(margin) and pth < stats.ALPHA, r["diff"], kind)
    return out


def main(root: Path, v2_text: str) -> str:
    published = v2_cells(v2_text)
    families, tasks, order = F.collect(root)
    called = {s: n for s, (n, _) in T.names(order, tasks).items()}
    moved, checked, kept = [], 0, 0
    for family, entry in families.items():
        claim = entry["claim"]
        for setting, d in entry["settings"].items():
            meta = read_meta(d)
            v2_expect = [e for (c, label, e) in published if c == family and label == called[setting]]
            task = metrics.task_of(meta, final_names(read_table(d / "summary.csv", ["run"])))
            v2_column = claim.get("metric") or task.main_metric
            v3 = F.judge_setting(d, claim, setting, root)
            v3_column, v3_margin = v3["column"], v3["margin"]
            stated = claim.get("margin")
            stated = stated.get(setting) if isinstance(stated, dict) else stated

            def old(column: str, v2: bool = False) -> float | None:
                """The margin v2 would have used on a column: the claim's (kl_gradients had none in v2), else
                v2's global constant."""
                if stated is not None and not (v2 and family == "kl_gradients"):
                    return stated
                return None if family == "kl_gradients" else V2_MARGIN.get(column)

            drop = {r["pair"]: r["why"] for r in v3["rows"] if r["why"]}
            drop |= {r["pair"]: r["quantities"]["final"]["why"] for r in v3["rows"] if "final" in r.get("quantities", {})
                     if not r["why"] and r["quantities"]["final"]["verdict"] == stats.NOT_TESTABLE}
            drop |= {e: DROPPED[e] for e in v2_expect if e not in claim["expect"]}
            budgets = {r["pair"]: r["budget"] for r in v3["rows"] if r.get("budget")}
            steps = {
                "v2": judge(d, v2_expect, v2_column, old(v2_column, True), {}, None, v2_verdict),
                "outcomes": judge(d, v2_expect, v2_column, old(v2_column, True), {}, None, outcome),
                "testable": judge(d, v2_expect, v2_column, old(v2_column), drop, None, outcome),
                "metric": judge(d, v2_expect, v3_column, old(v3_column), drop, None, outcome),
                "margin": judge(d, v2_expect, v3_column, v3_margin, drop, None, outcome),
                "samples": judge(d, v2_expect, v3_column, v3_margin, drop, budgets, outcome)}
            for e in v2_expect:
                was = published[(family, called[setting], e)]
                recomputed = steps["v2"][e]
                assert plain(was) == recomputed, (family, setting, e, was, recomputed)
                checked += 1
                final = steps["samples"][e]
                if e in claim["expect"]:
                    r = v3["rows"][claim["expect"].index(e)]
                    t = r.get("quantities", {}).get("final")
                    mine = "not testable here" if r["why"] or t is None or t["verdict"] == stats.NOT_TESTABLE else \
                        outcome(t["significant"], t["equivalent"], t["diff"], t["claim"])
                    assert mine == final, (family, setting, e, mine, final)
                before = as_v3(recomputed, parse_ordering(e)[2])
                if before == final:
                    kept += 1
                    continue
                chain, prev = [], as_v3(recomputed, parse_ordering(e)[2])
                for step in STEPS:
                    now = steps[step][e]
                    if now != prev:
                        chain.append(f"{step}: {prev} → {now}")
                    prev = now
                why = drop.get(e)
                moved.append((family, called[setting], e, recomputed, final, chain,
                              (f"{label_of(v2_column)} → {label_of(v3_column)}" if v2_column != v3_column else
                               label_of(v3_column)), why))
    lines = ["## What changed since v2, and why", "",
             f"FINDINGS v2 (commit {V2_COMMIT}) judged every ordering on its final value with four verdicts in which "
             "significance beat equivalence, on the toy's sampled training reward, with global margins (±0.02 "
             "reward, ±0.03 accuracy), every ordering asked counted in Holm, and dynamic sampling at equal "
             "gradient steps. v3 changes five rules ([Statistics](../docs/statistics.md)); no run was "
             "retrained. `scripts/findings_changes.py` recomputed all "
             f"{checked} v2 cells from the committed results with v2's rule (each matches the v2 file), then "
             "applied the v3 rules one at a time in the order below; each verdict that moved is put down to the "
             f"step(s) at which it changed. {len(moved)} of {checked} moved; {kept} did not (in v3's words: a v2 "
             "*agrees* that stays significant and outside the margin is *holds*).", "",
             "| step | what changed |", "|---|---|"]
    lines += [f"| {s} | {WHY[s]} |" for s in STEPS]
    lines += ["", "| claim | task | ordering | metric (final) | v2 | v3 | moved at |", "|---|---|---|---|---|---|---|"]
    for family, label, e, was, now, chain, metric, why in moved:
        note = f" ({why})" if why and now == "not testable here" else ""
        lines.append(f"| [{family}](FINDINGS.md#{family}) | {label} | `{e}` | {metric} | {was} | **{now}**{note} | "
                     + "; ".join(chain) + " |")
    lines += ["", "Not in the table: orderings added since v2 (none); claims whose every ordering kept its verdict. "
              "The area under the curve is printed beside every v3 row but decides no shipped claim (each says "
              "`judge: final`), so it moved none of them.", ""]
    return "\n".join(lines)


def label_of(column: str) -> str:
    from grpo_bench.analysis.report import label_column
    return label_column(column)


def v3_cells(text: str) -> dict[tuple[str, str, str], tuple[str, str]]:
    """(claim, task label, ordering) -> (outcome, the cell's difference and test) from v3's detail tables."""
    out, claim, labels = {}, None, []
    for line in text.splitlines():
        if line.startswith("## "):
            claim = line[3:].strip()
        elif line.startswith("| ordering |"):
            # "arithmetic LM (lm)" is the arithmetic LM's column once the wide start (lm_wide) shares its task
            labels = [c.split(":")[0].strip().removesuffix(" (lm)") for c in line.strip("| \n").split(" | ")[1:]]
        elif line.startswith("| `") and claim:
            cells = line.strip("| \n").split(" | ")
            for label, cell in zip(labels, cells[1:]):
                found = re.search(r"\*\*(.+?)\*\*", cell)
                if found:
                    verdict = found.group(1).split(" (")[0].split(" within")[0]
                    head = cell.split("<br>")[0].split(": ", 1)[-1]
                    delta = re.search(r"Δ ([-+]?[0-9.]+)", head)
                    test = head.split("; ")[1].split(", ρ")[0] if head.count("; ") else ""
                    out[(claim, label, cells[0].strip("`"))] = (verdict, f"Δ {delta.group(1) if delta else '?'}; {test}")
    return out


def rerun_section(before: str, now: str) -> str:
    old, new = v3_cells(before), v3_cells(now)
    moved = [(k, old[k], new[k]) for k in old if k in new and old[k][0] != new[k][0]]
    same = sum(1 for k in old if k in new and old[k][0] == new[k][0])
    added = [k for k in new if k not in old]
    lines = ["## What changed since the LM claims were rerun", "",
             f"FINDINGS at commit {V3_COMMIT} judged the arithmetic LM's claims on results with four held-out "
             "evaluations a run and no per-problem outcomes, tested on seeds alone (and policy_losses and "
             "dapo_ladder on results/gpu's 10 CUDA seeds). They were rerun on the CPU with seven evaluations "
             "(every 5 rollouts, 250 problems mid-run, all 1,000 at the start and end) and each problem's outcome "
             "kept; training is bit-identical (the same final values run for run: an evaluation draws nothing "
             "from the training's random streams), so what moved is the test (seeds × problems, for the final "
             "value, the area and readings at equal samples), the area (seven points, not four), and for "
             "policy_losses and dapo_ladder the seeds judged (the CPU's 5 with outcomes over the GPU's 10 "
             f"without). {len(moved)} verdicts moved, {same} did not; {len(added)} cells are new (tasks or "
             "orderings FINDINGS did not have then). Every cell as it was and as it is:", "",
             "| claim | task | ordering | was | is | was: Δ; test | is: Δ; test |", "|---|---|---|---|---|---|---|"]
    for (claim, label, e), (v0, c0), (v1, c1) in moved:
        lines.append(f"| [{claim}](FINDINGS.md#{claim}) | {label} | `{e}` | {v0} | **{v1}** | {c0} | {c1} |")
    return "\n".join(lines + [""])


if __name__ == "__main__":
    import tarfile
    import tempfile
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "results")
    text = Path(sys.argv[2]).read_text() if len(sys.argv) > 2 else subprocess.run(
        ["git", "show", f"{V2_COMMIT}:results/FINDINGS.md"], capture_output=True, text=True, check=True).stdout
    before = subprocess.run(["git", "show", f"{V3_COMMIT}:results/FINDINGS.md"], capture_output=True, text=True,
                            check=True).stdout
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "archive", V3_COMMIT, "results", "ablations"], capture_output=True,
                                 check=True).stdout
        with tarfile.open(fileobj=__import__("io").BytesIO(archive)) as tar:
            tar.extractall(tmp, filter="data")
        first = main(Path(tmp) / "results", text)
    out = root / "FINDINGS_changes.md"
    out.write_text(first)   # render() appends this file: the rerun section compares the tables above it
    out.write_text(first + "\n" + rerun_section(before, T.render(root)))
    print(out)
