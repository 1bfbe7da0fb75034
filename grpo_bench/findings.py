"""results/FINDINGS.md: the field's published claims, each tested by an ablation that carries a `claim`.

An ablation file states its claim (text, source, the paper's setting, and `expect`: the
orderings the paper reports, as "a > b" between variant labels, or "a = b" for a claimed
absence of effect; optionally `metric`, the summary column judged) and usually runs on two
`settings`, the sorting toy and the arithmetic LM. For every expected ordering and every
setting this computes, from the per-seed values of the task's main metric (final rollout
reward on the toy, final held-out accuracy on the LM): the difference of means with its
95% Welch confidence interval, Welch's p, and Holm's correction over the claim's orderings
on that setting. An ordering is

    agrees                  p_holm < 0.05 and the difference has the paper's sign
    disagrees               p_holm < 0.05 and the opposite sign
    no difference           otherwise (at this scale: these seeds, this budget)

and Kendall's tau between the toy's and the LM's orderings of the shared variants asks
whether the toy predicts the LM. Everything is recomputed from the results directories:
`python -m grpo_bench findings` rebuilds the file without training.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from scipy import stats

from .compare import kendall, load_side
from .config import ConfigError
from .report import ALPHA, label_column, read_meta

NAMES = {"sort": "sorting toy", "lm": "arithmetic LM"}
ORDER = ("sort", "lm")


def welch(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float, float]:
    """(mean(x) - mean(y), CI low, CI high, two-sided p) by Welch's unequal-variance t."""
    diff = float(x.mean() - y.mean())
    vx, vy = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    se = math.sqrt(vx + vy)
    if se == 0:
        return diff, diff, diff, (0.0 if diff != 0 else 1.0)
    dof = (vx + vy) ** 2 / (vx ** 2 / (len(x) - 1) + vy ** 2 / (len(y) - 1))
    half = float(stats.t.ppf(0.975, dof)) * se
    p = float(2 * stats.t.sf(abs(diff) / se, dof))
    return diff, diff - half, diff + half, p


def holm(ps: list[float]) -> list[float]:
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    out, running = [0.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
        out[i] = running
    return out


def verdict(diff: float, p_holm: float, equal: bool = False) -> str:
    """A claimed ordering a > b, or a claimed absence of effect a = b (which a difference refutes)."""
    if equal:
        return "agrees (no difference detected)" if p_holm >= ALPHA else "disagrees"
    if p_holm >= ALPHA:
        return "no difference"
    return "agrees" if diff > 0 else "disagrees"


def judge_setting(directory: Path, expect: list[str], metric: str | None = None) -> dict:
    side = load_side(directory, metric)
    rows = []
    for e in expect:
        equal = "=" in e and ">" not in e
        a, b = (s.strip() for s in e.split("=" if equal else ">"))
        x, y = side.values.get(a), side.values.get(b)
        if x is None or y is None or len(x) < 2 or len(y) < 2:
            rows.append({"pair": e, "a": a, "b": b, "missing": True})
            continue
        diff, lo, hi, p = welch(x, y)
        rows.append({"pair": e, "a": a, "b": b, "diff": diff, "lo": lo, "hi": hi, "p": p, "seeds": (len(x), len(y)),
                     "equal": equal})
    tested = [r for r in rows if not r.get("missing")]
    for r, ph in zip(tested, holm([r["p"] for r in tested])):
        r["p_holm"], r["verdict"] = ph, verdict(r["diff"], ph, r["equal"])
    sweep = directory / "sweep.json"
    try:
        timing = json.loads(sweep.read_text()) if sweep.is_file() else None
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(str(sweep), "<file>", f"not valid JSON: {str(e).splitlines()[0]}") from None
    return {"dir": directory, "side": side, "rows": rows, "column": side.column, "sweep": timing}


def summarise(result: dict | None, reason: str | None) -> str:
    if result is None:
        return f"not testable: {reason}" if reason else "not run"
    verdicts = [r["verdict"] for r in result["rows"] if "verdict" in r]
    if not verdicts:
        return "not run"
    agree = sum(v.startswith("agrees") for v in verdicts)
    disagree = verdicts.count("disagrees")
    if disagree:
        head = "disagrees" if not agree else "mixed"
    elif agree == len(verdicts):
        head = "agrees"
    elif agree:
        head = "partly agrees"
    else:
        head = "no difference at this scale"
    return f"{head} ({agree} of {len(verdicts)} orderings hold, {disagree} reversed)"


def collect(root: Path) -> dict[str, dict]:
    """family -> {"claim": ..., "source": ..., "settings": {setting: results dir}}, from ablation.json files."""
    if not root.is_dir():
        raise ConfigError(str(root), "<dir>", "not a directory" if root.exists() else "no such directory")
    families: dict[str, dict] = {}
    for meta_file in sorted(root.glob("*/ablation.json")):
        meta = read_meta(meta_file.parent)
        claim, setting = meta.get("claim"), meta.get("setting")
        if not claim:
            continue
        family = meta["name"].removesuffix(f"_{setting}") if setting else meta["name"]
        entry = families.setdefault(family, {"claim": claim, "source": meta.get("source", ""), "settings": {}})
        entry["settings"][setting or "sort"] = meta_file.parent
    for entry in families.values():  # the toy first, then the LM, then anything else
        entry["settings"] = dict(sorted(entry["settings"].items(),
                                        key=lambda kv: (ORDER.index(kv[0]) if kv[0] in ORDER else len(ORDER), kv[0])))
    return families


def _cell(r: dict) -> str:
    if r.get("missing"):
        return "—"
    return f"{r['diff']:+.3f} [{r['lo']:+.3f}, {r['hi']:+.3f}], p_holm {r['p_holm']:.2g}: {r['verdict']}"


def _tau(results: dict) -> str:
    if "sort" not in results or "lm" not in results:
        return "—"
    a, b = results["sort"]["side"], results["lm"]["side"]
    tau, p, n = kendall(a.means, b.means)
    return "—" if math.isnan(tau) else f"{tau:+.2f} (p {p:.2g}, {n} variants)"


def _ranking(result: dict) -> str:
    means = result["side"].means.sort_values(ascending=False)
    return " > ".join(f"`{v}` {m:.3f}" for v, m in means.items())


def _timing(result: dict) -> str:
    s = result["sweep"]
    if not s:
        return "not recorded"
    return f"{s['wall_s'] / 60:.1f} min for {s['runs']} runs ({s['where']}, {s['cpu']}, load {s['load_avg_end']})"


def render(root: Path) -> str:
    families = collect(root)
    lines = ["# Findings: published claims about GRPO, put to the test", "",
             "Each row is one claim, tested by the shipped ablation of the same name on the sorting toy "
             "(`sort_hard`) and on two-digit addition with the embedded tiny GPT-2 and LoRA "
             "(`arithmetic_tiny`), everything else held fixed; the seeds of each are in its section. The "
             "metric is each task's main one (final rollout reward on the toy, final held-out greedy accuracy "
             "on the LM) unless the claim names another. An ordering "
             "\"a > b\" the paper reports *agrees* when a − b > 0 with a Holm-corrected Welch p < 0.05 "
             "(over the claim's orderings on that task), *disagrees* when significant the other way, and "
             "shows *no difference* otherwise — at this scale: these seeds and this budget, not the "
             "paper's. Kendall's τ between the toy's and the LM's orderings of the same variants asks "
             "whether the toy predicts the LM. Generated by `python -m grpo_bench findings` from the "
             "results directories: every number is recomputed from them.", "",
             "| claim | source | sorting toy | arithmetic LM | toy ↔ LM τ |", "|---|---|---|---|---|"]
    details = []
    for family, entry in families.items():
        claim = entry["claim"]
        untestable = claim.get("untestable") or {}
        results = {s: judge_setting(d, claim["expect"], claim.get("metric")) for s, d in entry["settings"].items()}
        cells = [summarise(results.get(s), untestable.get(s)) for s in ("sort", "lm")]
        row = [f"[{family}](#{family}): {claim['text']}", claim["source"], *cells, _tau(results)]
        # a claim's own text may hold a pipe (1/|o|), which would split the table's cell
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |")
        details += [f"## {family}", "", f"**Claim.** {claim['text']}", "", f"**Source.** {claim['source']}", ""]
        if claim.get("setting"):
            details += [f"**Their setting.** {claim['setting']}", ""]
        if claim.get("metric"):
            details += [f"**Judged on** `{claim['metric']}` (mean over the last 10% of rollouts).", ""]
        details += [f"**Here.** `{entry['source']}`; " + "; ".join(
            f"{NAMES.get(s, s)}: `results/{d.name}`" for s, d in entry["settings"].items()), ""]
        details += ["| ordering (a > b) | " + " | ".join(NAMES.get(s, s) + " Δ [95% CI], Holm p" for s in results) + " |",
                    "|---|" + "---|" * len(results)]
        for i, e in enumerate(claim["expect"]):
            details.append(f"| `{e}` | " + " | ".join(_cell(r["rows"][i]) for r in results.values()) + " |")
        details.append("")
        for s, r in results.items():
            details.append(f"- {NAMES.get(s, s)} ({label_column(r['column'])}, {r['side'].seeds} seeds): {_ranking(r)}. "
                           f"Time: {_timing(r)}. Command: `python -m grpo_bench run {entry['source']} --setting {s}`.")
        for s, why in untestable.items():
            details.append(f"- {NAMES.get(s, s)}: {'not testable here' if s not in results else 'note'}: {why}")
        details.append("")
    if not families:
        lines.append("| (no results with a claim yet) | | | | |")
    notes = root / "FINDINGS_notes.md"  # commentary written after looking at these results
    return "\n".join(lines + [""] + details + ([notes.read_text()] if notes.is_file() else []))


def write_findings(root: Path, out: Path | None = None) -> Path:
    out = out or root / "FINDINGS.md"
    out.write_text(render(root))
    return out
