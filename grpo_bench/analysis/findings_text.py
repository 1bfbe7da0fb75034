"""results/FINDINGS.md and README.md's claims table, written from what analysis/findings.py judges.

One row per claim (a head word and counts per task, across tasks, Kendall's W), then a section per claim:
its orderings on every task with the test, interval, outcome and the Holm family each statement rests on.
`python -m grpo_bench findings` rebuilds the file without training (docs/statistics.md has the rules).
"""
from __future__ import annotations

import itertools
import json
import math
import re
from pathlib import Path

from .. import stats
from ..errors import ConfigError
from ..store import metrics
from ..store.rundir import read_meta
from .compare import kendall, kendall_w
from .findings import QUANTITIES, _completeness, _tested, collect, judge_claim
from .mechanism import text as mech_text
from .plotting import label_column

RULES_FILE = "FINDINGS_rules.md"  # what v4's rule changes moved, written by analysis/rule_changes.py
WORDS = """## The outcome words

| outcome (a − b > 0 / < 0) | what was shown (difference test and TOST, each Holm-corrected in its family) |
|---|---|
| *holds* / *reversed* | significant, and its interval lies beyond ±δ on its side: a difference the margin calls meaningful |
| *holds, size unclear* / *reversed, size unclear* | significant, not shown within ±δ, but its interval reaches inside ±δ: real, size not shown to matter |
| *holds, negligible* / *reversed, negligible* | significant, and shown within ±δ: real and too small to matter |
| *equivalent* | not significant, shown within ±δ |
| *undecided* | neither test passed; the row says how many seeds would decide it |
| *fails* / *fails, size unclear* (a claimed "a = b") | a significant difference whose interval clears ±δ / does not |
| *not testable here* | the variants cannot differ on this task (inert parts, identical runs): in no count |
| *not exercised* | the part's mechanism had nothing to act on here: the diagnostic its claim declares (with the threshold the source's argument needs) stayed under it; the value is printed, not a verdict: in no count |

A claimed "a = b" *holds* when equivalent or negligible."""

# -------------------------------------------------------------------------------- writing


COUNTED = ("hold", "size unclear", "negligible", "equivalent", "reversed, size unclear", "reversed", "fail",
           "fail, size unclear", "undecided")
APART = ("not testable", "not exercised")  # rows in no count: outside Holm's m and "holds on k of m"


def counts(rows: list[dict], quantity: str) -> dict[str, int]:
    """How many of a claim's orderings on one setting hold (beyond the margin), hold with a size unclear, are
    negligible, equivalent, reversed (either way), fail ("a = b"), undecided; not testable and not exercised
    ones apart."""
    out = dict.fromkeys(COUNTED + APART, 0)
    for r in rows:
        if r["missing"]:
            continue
        if r.get("unexercised") is not None:
            out["not exercised"] += 1
            continue
        t = (r.get("quantities") or {}).get(quantity)
        if r["why"] is not None or t is None or t["verdict"] == stats.NOT_TESTABLE:
            out["not testable"] += 1
        elif r["claim"] == "=":
            v = t["verdict"]
            out["hold" if v == "holds" else v.replace("fails", "fail") if v.startswith("fails") else "undecided"] += 1
        else:
            o = t["outcome"]
            out["hold" if o == "holds" else "size unclear" if o == "holds" + stats.UNCLEAR
                else "negligible" if o.endswith("negligible") else o] += 1
    return out


def summarise(result: dict | None, reason: str | None, short: bool = False) -> str:
    """A setting's cell in the claims table: a head word and the counts, on the claim's quantity (short: README's,
    without the metric and the reasons, which its column header and FINDINGS.md give)."""
    if result is None:
        return ("not testable" if short else f"not testable: {reason}") if reason else "not run"
    c = counts(result["rows"], result["judge"])
    n = sum(v for k, v in c.items() if k not in APART)
    apart = c["not testable"] + c["not exercised"]
    if not n and not apart:
        return "not run"
    where = f"{label_column(result['column'])}, {result['judge']}"
    if not n:
        word = "not exercised" if not c["not testable"] else "not testable" if not c["not exercised"] else \
            "not testable or not exercised"
        return f"{word} here ({where}: {apart} of {apart} orderings)"
    against = sum(c[k] for k in COUNTED if k.startswith(("reversed", "fail")))
    held = c["hold"] + c["size unclear"]
    head = ("mixed" if against and held else "does not hold" if against else "holds" if c["hold"] == n
            else "partly holds" if held else "no difference that matters" if c["negligible"] + c["equivalent"] == n
            else "undecided at this scale")
    parts = [f"{c['hold']} of {n} hold"] + [f"{c[k]} {k}" for k in COUNTED[1:] if c[k]]
    tail = f"; {c['not testable']} not testable{'' if short else ' here'}" if c["not testable"] else ""
    tail += f"; {c['not exercised']} not exercised" if c["not exercised"] else ""
    flat = [r for r in result["rows"] if r.get("plateau") is not None]
    if flat and not short:
        other = next(q for q in QUANTITIES if q != result["judge"])
        moved = sum(1 for r in flat if _disagree(r, result["judge"]))
        tail += (f"; {len(flat)} at a plateau (" + (f"the {other} agrees" if not moved else
                                                     f"the {other} differs on {moved}") + ")")
    elif flat:
        tail += f"; {len(flat)} at a plateau"
    return f"{head} ({'' if short else where + ': '}{', '.join(parts)}{tail})"


def _disagree(r: dict, own: str) -> str | None:
    """The other quantity's outcome where it differs from the claim's quantity's, else None."""
    if r["missing"] or r["why"] is not None or r.get("unexercised") is not None:
        return None
    other = next(q for q in QUANTITIES if q != own)
    a, b = (r["quantities"].get(q) or {} for q in (own, other))
    return b["outcome"] if a.get("outcome") and b.get("outcome") and a["outcome"] != b["outcome"] else None


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
    if r.get("unexercised") is not None:
        return f"**not exercised**: {r['unexercised']}"
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
            if r.get("mechanism"):
                parts.append(("mechanism acts: " if r["mechanism"]["acts"] else "mechanism not measured: ")
                             + mech_text(r["mechanism"], r["a"], r["b"]))
            parts += [x for x in (_plateau_text(result, r),) if x]
            fam = t.get("family")
            if fam and fam["m"] != t.get("m") and fam["outcome"] != t["outcome"]:
                parts.append(f"in the claim's family across its tasks (Holm over {fam['m']}): p_holm "
                             f"{fam['p_holm']:.2g}, *{fam['outcome']}*")
        else:
            parts.append(f"{q} (beside; not the claim's quantity): Δ {t['diff']:+.3f}, p_holm {t['p_holm']:.2g}: "
                         f"{stats.verdict_text(t)}")
            if _disagree(r, own):
                parts.append(f"**final and area disagree**: {own} *{r['quantities'][own]['outcome']}*, {q} "
                             f"*{t['outcome']}*")
    return "<br>".join(parts)


def _plateau_text(result: dict, r: dict) -> str | None:
    p = r.get("plateau")
    if p is None:
        return None
    if isinstance(p, dict):
        return (f"at a plateau: over the second half of the budget both mean curves move at most {p['moved']:.3g}, "
                f"under half of min(|Δ|, δ) = {2 * p['bound']:.3g}, so the final value compares where they level "
                "off, not how fast they get there (the area's question)")
    return (f"at a plateau: both mean curves stay within ±{result['margin']:g} of their final value from {p:.0%} "
            "of the budget on, so the final value compares where they level off (v3's rule)")


def task_of(setting, settings=("lm",)) -> str:
    """The task a setting runs: `lm_wide` (a start 4x the size) and `lm_acts` (the same start where the
    mechanisms act) are settings of `lm`'s arithmetic task, `spell_backward_slow` (a budget it does not use up)
    of spell_backward's, not other tasks: a setting named <task>_<what>, where <task> is another of the claim's
    settings (the longest such), is counted with it, so "holds on k of m tasks" does not count one task's
    regimes as replications (spell_backward stays itself: no setting is named spell)."""
    setting = str(setting)
    heads = [str(s) for s in settings if setting.startswith(f"{s}_")]
    return max(heads, key=len) if heads else setting


def across(results: dict, i: int, family: bool = False) -> tuple[int, int]:
    """(tasks on which ordering i holds, tasks on which it was tested) on each setting's own quantity: an "a > b"
    holds where its outcome is *holds* (beyond the margin; negligible or size unclear do not count), an "a = b"
    where it is equivalent or negligible; missing, not testable or not exercised settings are in neither count.
    Settings of one task (task_of) count once: it holds on the task where it holds on every one of them it was
    tested on. family: each task's verdict in the claim's family across its tasks (what "holds on some tasks"
    rests on), else in the task's own (each task's cell, and "holds on every task")."""
    tasks: dict[str, bool] = {}
    for setting, r in results.items():
        row = r["rows"][i]
        t = _tested(row, r["judge"])
        if t is None:
            continue
        t = t.get("family", t) if family else t
        held = (t["verdict"] == "holds") if row["claim"] == "=" else (t["outcome"] == "holds")
        task = task_of(setting, results)
        tasks[task] = tasks.get(task, True) and held
    return sum(tasks.values()), len(tasks)


def start_base(setting) -> str | None:
    """The setting a <setting>_seed<N> reruns on another start (its last such suffix), None for any other name."""
    m = re.fullmatch(r"(.+)_seed\d+", str(setting))
    return m[1] if m else None


def starts(results: dict, i: int) -> dict[str, tuple[int, int]]:
    """Per task run on several starts (settings <setting>_seed<N> beside <setting>: the same setting on a start
    `build-start --seed N` built by the same recipe): (starts on which ordering i holds, starts it was tested on),
    each on its own verdict, as across() reads one."""
    out: dict[str, list[bool]] = {}
    seeded = {b for s in results if (b := start_base(s))}
    for setting, r in results.items():
        base = start_base(setting) or str(setting)
        if base not in seeded:
            continue
        t = _tested(r["rows"][i], r["judge"])
        if t is not None:
            held = (t["verdict"] == "holds") if r["rows"][i]["claim"] == "=" else (t["outcome"] == "holds")
            out.setdefault(base, []).append(held)
    return {base: (sum(h), len(h)) for base, h in out.items() if len(h) >= 2}


def _across_cell(results: dict, i: int) -> str:
    k, m = across(results, i)
    if not m:
        return "—"
    some = across(results, i, family=True)[0]
    cell = f"holds on {k} of {m} task{'s' if m > 1 else ''}" + (
        f" (on {some} in the claim's family)" if m > 1 and some != k and k != m else "")
    return cell + "".join(f"; {base}: on {h} of {n} starts" for base, (h, n) in starts(results, i).items())


def across_summary(results: dict, n: int) -> str:
    """A claim's orderings across tasks: how many tested on two or more hold on every one (each task's own
    family), on some (the claim's family across its tasks), on none."""
    pairs = [(across(results, i), across(results, i, family=True)) for i in range(n)]
    several = [(k, m, ks) for (k, m), (ks, _) in pairs if m >= 2]
    one = sum(1 for (_, m), _ in pairs if m == 1)
    if not several:
        return f"tested on one task only ({one} ordering{'s' if one != 1 else ''})" if one else "—"
    every = sum(1 for k, m, _ in several if k == m)
    some = sum(1 for k, m, ks in several if k < m and ks > 0)
    text = f"{every} of {len(several)} hold on every task" + (f", {some} on some" if some else "")
    return text + (f"; {one} tested on one task only" if one else "")


def _agreement(results: dict, short: bool = False) -> str:
    """Kendall's W over every task the claim ran on that orders three variants or more: do the tasks order its
    variants alike? W needs three variants every task ran, so a task with fewer (sampler_mismatch on SmolLM2: its
    `only` runs two, and its bf16 runs failed once, leaving one) would leave too few in common for any W at all;
    it is left out, and the count of tasks says so."""
    w, p, m, n = kendall_w([r["side"].means for r in results.values() if r["side"].means.notna().sum() >= 3])
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


def _failed(d: Path) -> str:
    """The runs of directory d that failed, by variant and error, so a cell left empty says why."""
    import csv

    f = d / "summary.csv"
    if not f.is_file():
        return ""
    with f.open(newline="") as fh:
        runs = list(csv.DictReader(fh))
    bad = [r for r in runs if r.get("status", "ok") != "ok"]
    if not bad:
        return ""
    kinds: dict[str, list[str]] = {}
    for r in bad:
        kinds.setdefault(r.get("variant", "?"), []).append((r.get("error") or "").split(":")[0].strip())
    parts = [f"`{v}` {len(k)} ({', '.join(sorted(set(k) - {''})) or 'no error recorded'})" for v, k in kinds.items()]
    return f"{len(bad)} of {len(runs)} runs failed: {'; '.join(parts)}. "


def _timing(result: dict) -> str:
    s = result["sweep"]
    if not s or "wall_s" not in s:
        return "not recorded"
    # sweep.json is the last invocation's: a resumed sweep's earlier runs are not in its minutes
    before = f"; {s['skipped']} runs had finished in earlier invocations" if s.get("skipped") else ""
    return (f"{s['wall_s'] / 60:.1f} min for {s['runs']} runs ({s['where']}, {s['cpu']}, "
            f"load {s['load_avg_end']}{before})")


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

    from ..config.strict_yaml import load as load_yaml
    found: dict[str, list[str]] = {}
    for entry in families.values():
        for setting, d in entry["settings"].items():
            source = read_meta(d).get("source") or ""
            for path in (Path(source), root.parent / source):
                try:
                    task = (load_yaml(path.read_text()).get("settings") or {}).get(setting, {}).get("task")
                except (OSError, yaml.YAMLError, AttributeError):
                    continue
                task = task.get("name") if isinstance(task, dict) else task
                if isinstance(task, str) and task not in found.setdefault(setting, []):
                    found[setting].append(task)
                break
    return found


def setting_margins(judged: dict, tasks: dict[str, metrics.TaskInfo]) -> dict[str, float]:
    """setting -> the margin its rows on the task's own metric were judged with, where every claim judged there
    declared the same one of its own (spell_backward_slow: 0.031, the task's rule at that setting's end, where
    the task's margin is its rule at lr 1e-3's end, 0.007). A column heading shows this, not the task's."""
    used: dict[str, set] = {}
    for results in judged.values():
        for s, r in results.items():
            if s in tasks and r.get("margin") and not r.get("log") \
                    and r.get("column") == metrics.final_column(tasks[s].verdict_metric):
                used.setdefault(s, set()).add(r["margin"])
    return {s: m.pop() for s, m in used.items() if len(m) == 1 and m != {tasks[s].margin}}


def intro(where: str, tasks: dict[str, metrics.TaskInfo], order: list[str], name: dict,
          own: dict[str, float] | None = None) -> str:
    own = own or {}
    judged = "; ".join(f"the {name[s]} on {label_column(tasks[s].verdict_metric)}"
                       + (f", δ ±{own[s]:g} (declared by the claims run there: the task's rule at that setting's end)"
                          if s in own else f", δ ±{tasks[s].margin:g} ({tasks[s].margin_rule})" if tasks[s].margin else "")
                       for s in order if s in tasks)
    return (
        f"Each row is one claim, tested by the shipped ablation of the same name on {where}, everything else held "
        "fixed; the settings and seeds of each are in its section. Each claim is judged on one quantity of one "
        "metric, named in every row: the task's held-out verdict metric unless the claim names another "
        f"({judged}; the sampled training reward is printed beside), and its value at the end of the budget "
        "(*final*) unless the claim says it is about the speed (*area*: the mean of the curve over the budget "
        "against samples drawn); both are printed for every ordering and the claim's own decides, and a row where "
        "the two disagree says so. A final value judged where both variants' mean curves move less than half of "
        "min(|Δ|, δ) over the second half of the budget is marked *at a plateau*: it compares where they level off, "
        "at the scale of the effect judged, and the area beside is then "
        "the only word on how fast they get there. Two variants "
        "that draw different numbers of samples (dynamic sampling) are both read at the smaller budget, and the "
        "row says so. Each ordering \"a > b\" is tested on per-seed values: seed by seed on a − b where the "
        f"variants ran the same seeds (paired t below {stats.N_PERM} pairs, a sign-flip permutation test from "
        f"{stats.N_PERM}, exact up to {stats.EXACT_MAX} pairs; ρ: their correlation across seeds), Welch's t otherwise, Holm-corrected over the "
        "claim's testable orderings on that task; and by two one-sided tests (TOST, Holm-corrected) within the "
        "margin δ (the claim's `margin`, else the task's, fixed before the runs). The two tests together give one of "
        "the outcomes the table below defines (*holds* only where the interval clears δ); the interval printed is "
        "the one the outcome used: TOST's (90% where Holm adjusts nothing) for an equivalent row, the Holm-adjusted "
        "one for every other. An ordering is *not testable here*, and in no count, when its variants differ only in "
        "parts the task declares inert, when every paired difference is exactly 0, or when its variants ran the same "
        "numbers as an earlier "
        "ordering's; it is *not exercised*, and in no count either, when the diagnostic its claim declares for the "
        "part's mechanism (a logged per-step metric and a threshold taken from the source's argument, in the "
        "ablation file) stays under that threshold: the part had nothing to act on, and the row prints the value "
        "beside the threshold instead of a verdict. Where the results kept each held-out problem's outcome (the LM tasks', from this version), a "
        "held-out accuracy row (final, area, or read at equal samples) is tested on the seeds × problems table of "
        "a − b, seeds and problems as "
        "crossed random effects, so its interval holds for a new held-out set as well as new seeds (the test is "
        "named *seeds × problems t*; its seed term is never dropped, so its degrees of freedom never jump from the seeds' "
        "to the problems'; docs/statistics.md). *Across tasks* says on how many of the tasks an ordering was tested on it "
        "holds (a negligible difference is not holding; *on some* is corrected over the claim's tasks), and per claim how many orderings tested on two or more tasks hold on every "
        "one; the arithmetic LM's settings (lm, lm_wide: a start 4x the size, lm_acts: where the mechanisms act, "
        "lm_seed<N>: lm on a start built by the same recipe from seed N) are one "
        "task there, on which an ordering holds where it holds in each of them it was tested in; where a setting "
        "ran on several starts the cell also says on how many of them the ordering holds. Kendall's W "
        "(tie-corrected, with a permutation p) asks whether the settings order the variants they all "
        "ran alike (1: the same order everywhere; 0: no agreement), and each pair's τ in the claim's section says "
        "which setting disagrees with which. "
        "Generated by `python -m grpo_bench findings` from the results directories: every "
        "number is recomputed from them (docs/statistics.md has the rules).")


def _with_presets(name: str, presets: list[str] | None) -> str:
    """"the arithmetic LM (lm: `arithmetic_scratchpad`)": a name's own parenthesis takes the task presets."""
    if not presets:
        return f"the {name}"
    tags = "`" + "`, `".join(presets) + "`"
    return f"the {name[:-1]}: {tags})" if name.endswith(")") else f"the {name} ({tags})"


def _series(items: list[str]) -> str:
    return " and ".join(items) if len(items) < 3 else ", ".join(items[:-1]) + ", and " + items[-1]


def render(root: Path) -> str:
    return _render(root)[0]


def readme_table(root: Path) -> str:
    """README.md's claims table: each claim's head and counts per task and across tasks, from FINDINGS.md's rows."""
    return _render(root)[1]


def _render(root: Path) -> tuple[str, str]:
    families, tasks, order = collect(root)
    judged = {family: judge_claim(entry, root) for family, entry in families.items()}
    called = names(order, tasks)
    name = {s: n for s, (n, _) in called.items()}
    presets = _presets(families, root)
    where = _series([_with_presets(name[s], presets.get(s)) for s in order])
    own = setting_margins(judged, tasks)
    lines = ["# Findings: published claims about GRPO, put to the test", "", intro(where, tasks, order, name, own), "",
             "| " + " | ".join(["claim", "source", *(name[s] for s in order), "across tasks",
                                "tasks agree (Kendall's W)"]) + " |",
             "|---|---|" + "---|" * (len(order) + 2)]
    details, everywhere, specific = [], [], []
    # README folds a setting's other starts (<setting>_seed<N>) into one column: one per start would be a column
    # of "not run" for every claim not rerun there
    again = {s: b for s in map(str, order) if (b := start_base(s)) in order}
    rerun = list(dict.fromkeys(again.values()))
    readme = ["| claim | " + " | ".join(
        f"{name[s]} ({label_column(tasks[s].verdict_metric)}" + (f", ±{own.get(s, tasks[s].margin):g})"
                                                                if tasks[s].margin or s in own else ")")
        if s in tasks else name[s]
        for s in order if s not in again)
        + "".join(f" | {name[b]} on other starts ({', '.join(s for s in again if again[s] == b)})"
                  for b in rerun)
        + " | across tasks | tasks agree (W) |", "|---|" + "---|" * (len(order) - len(again) + len(rerun) + 2)]
    for family, entry in families.items():
        claim = entry["claim"]
        untestable = claim.get("untestable") or {}
        results = judged[family]
        cells = [summarise(results.get(s), untestable.get(s))
                 + ("" if s not in results or device(entry["settings"][s]).startswith("CPU")
                    else f"; {results[s]['side'].seeds} seeds on {device(entry['settings'][s])}") for s in order]
        row = [f"[{family}](#{family}): {claim['text']}", claim["source"], *cells,
               across_summary(results, len(claim["expect"])), _agreement(results)]
        for i, e in enumerate(claim["expect"]):
            k, m = across(results, i)
            if m >= 2 and k == m:
                everywhere.append(f"`{e}` ([{family}](#{family}), {m} tasks)")
            elif m >= 2 and across(results, i, family=True)[0]:
                held = [name[s] for s, r in results.items() if across({s: r}, i, family=True) == (1, 1)]
                specific.append(f"`{e}` ([{family}](#{family}): the {' and the '.join(held)} only)")
        # a claim's own text may hold a pipe (1/|o|), which would split the table's cell
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |")
        first = next(iter(results.values()), None)
        own = (f" ({label_column(first['column'])}" + (f", ±{first['margin']:g}{' on its log' * first['log']})"
                                                        if first["margin"] else ")")
               if claim.get("metric") and first else "")
        cell = {s: summarise(results.get(s), untestable.get(s), short=True)
                + ("" if s not in results or device(entry["settings"][s]).startswith("CPU")
                   else f"; {results[s]['side'].seeds} seeds on {device(entry['settings'][s])}") for s in order}
        readme.append(f"| [{family}](results/FINDINGS.md#{family}){own} | " + " | ".join(
            [cell[s] for s in order if s not in again]
            + ["; ".join(f"{s}: {cell[s]}" for s in again if again[s] == b and s in results) or "not run"
               for b in rerun])
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
        details += ["**Margin δ.** " + "; ".join(f"{name[s]}: " + (f"±{r['margin']:g}" + " on the log of the metric" * r["log"]
                                                                    if r["margin"] else "none")
                                                  + f" ({r['margin_source']})" for s, r in results.items()), ""]
        for s, r in results.items():
            if r["sequential"]:
                seq = r["sequential"]
                details += [f"**Seeds chosen sequentially** on the {name[s]} (`--seeds auto:{seq['cap']}`, on "
                            f"`{seq['metric']}`): " + ("its verdicts use the O'Brien–Fleming boundaries that chose "
                                                       "them, not the fixed-sample tests" if seq["applies"] else
                                                       "judged here on another metric or quantity, with "
                                                       "fixed-sample tests that ignore that stopping rule") + ".", ""]
        details += [_families(results, claim, name), ""]
        head = ": quantity: Δ = a − b [interval]; test; P(a > b); detectable effect or margin: verdict"
        details += ["| ordering | " + " | ".join(name[s] + head for s in results) + " | across tasks |",
                    "|---|" + "---|" * (len(results) + 1)]
        for i, e in enumerate(claim["expect"]):
            details.append(f"| `{e}` | " + " | ".join(_cell(r, r["rows"][i]) for r in results.values())
                           + f" | {_across_cell(results, i)} |")
        details.append("")
        for s, r in results.items():
            details.append(f"- {name[s]} ({label_column(r['column'])}, final, {r['side'].seeds} seeds): {_ranking(r)}. "
                           f"{_failed(r['dir'])}Time: {_timing(r)}. Command: `{_command(r['dir'], entry['source'])}`.")
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
                    "(a negligible difference, or one whose size is unclear, is not holding), each task at its own "
                    "Holm level; it is task-specific when it holds on some of them with Holm over every testable "
                    "ordering of the claim on every task (the family of a statement about *some* tasks).", "",
                    "- Holds on every task tested: " + ("; ".join(everywhere) or "none") + ".",
                    "- Task-specific: " + ("; ".join(specific) or "none") + ".", ""]
    # what the rule changes of this version moved (analysis/rule_changes.py), the changes of the versions before,
    # then commentary written after looking at these results
    extra = [p.read_text() for p in (root / RULES_FILE, root / "FINDINGS_changes.md", root / "FINDINGS_notes.md")
             if p.is_file()]
    return "\n".join(lines + [""] + [WORDS, ""] + across_tasks + details + extra), "\n".join(readme)


def _families(results: dict, claim: dict, name: dict) -> str:
    """The Holm family behind each kind of statement the claim's rows and cells make."""
    per_task = "; ".join(f"{name[s]}: {sum(1 for row in r['rows'] if _tested(row, r['judge']))}"
                         for s, r in results.items())
    m = sum(1 for r in results.values() for row in r["rows"] if _tested(row, r["judge"]))
    text = (f"**Holm families.** A row and a task's cell: the claim's testable orderings on that task ({per_task}). "
            "*Holds on every task*: each task's own family, no further correction (every task must pass).")
    if len(results) >= 2:
        text += (f" *Holds on some tasks* (task-specific): every testable ordering of the claim on every task, "
                 f"m = {m}.")
    return text


def _shown(d: Path, root: Path) -> str:
    """results/<...> as a reader finds it from the repository's root."""
    return f"{root.name}/{d.relative_to(root).as_posix()}"


def _why_not(d: Path) -> str:
    complete, outcomes, full, seeds = _completeness(d)
    return f"{seeds} seeds" + ("" if complete else ", not every planned run finished") + \
        ("" if outcomes else ", no per-problem outcomes") + \
        ("" if full else ", mid-run evaluations on a subset of the problems")


def write_findings(root: Path, out: Path | None = None) -> Path:
    out = out or root / "FINDINGS.md"
    out.write_text(render(root))
    return out
