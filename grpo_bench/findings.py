"""results/FINDINGS.md: the field's published claims, each tested by an ablation that carries a `claim`.

An ablation file states its claim (text, source, the paper's setting, and `expect`: the
orderings the paper reports, as "a > b" between variant labels, or "a = b" for a claimed
absence of effect; optionally `metric`, the summary column judged, and `margin`, the
equivalence margin) and usually runs on two `settings`, the sorting toy and the arithmetic
LM. For every expected ordering and every setting this computes, from the per-seed values
of the task's main metric (as the task declares it: final rollout reward on the toy, final
held-out accuracy on the LM), with grpo_bench.stats: the difference of means a - b with its
95% CI, the test (paired on per-seed differences where the variants share seeds, Welch's t
where not), Holm's correction over the claim's orderings on that setting, the minimum
detectable effect, a TOST equivalence test within the margin, and a verdict:

    agrees                   p_holm < 0.05 and the difference has the paper's sign
                             (for "a = b": equivalent within the margin)
    disagrees                p_holm < 0.05 and the opposite sign (for "a = b": a difference
                             beyond seed noise that TOST does not put within the margin)
    equivalent within ±δ     not significant, and TOST puts the difference within ±δ
    undecided                neither: with the seeds per side that would decide it

and Kendall's tau between two settings' orderings of the shared variants (the toy's and the
LM's) asks whether one predicts the other. A column per setting that any claim ran on, in the
order the files list them, named by the declaration of the task it trains (grpo_bench/metrics.py).
Everything is recomputed from the results directories: `python -m grpo_bench findings` rebuilds
the file without training.
"""
from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

from . import metrics, registry, stats
from .compare import kendall, load_side
from .config import ConfigError
from .report import final_names, label_column, read_meta, read_table

# Results written before ablation.json recorded its task and its file's settings: the shipped files'
# settings, in their order, and the task each trains. A setting added since never needs a line here.
LEGACY_SETTINGS = {"sort": "sort", "lm": "arithmetic"}


def judge_setting(directory: Path, expect: list[str], metric: str | None = None, claim: dict | None = None,
                  setting: str | None = None) -> dict:
    """Every expected ordering tested on one results directory (stats.compare_pairs, Holm over them)."""
    side = load_side(directory, metric)
    margin, source = stats.claim_margin(claim, setting, side.column)
    rows, pairs = [], []
    for e in expect:
        equal = "=" in e and ">" not in e
        a, b = (s.strip() for s in e.split("=" if equal else ">"))
        x, y = side.values.get(a), side.values.get(b)
        missing = x is None or y is None or len(x) < 2 or len(y) < 2
        rows.append({"pair": e, "a": a, "b": b, "missing": missing})
        if not missing:
            pairs.append((a, b, "=" if equal else ">"))
    tested = iter(stats.compare_pairs(side.by_seed, pairs, margin))
    rows = [r if r["missing"] else next(tested) | {"pair": r["pair"], "missing": False} for r in rows]
    sweep = directory / "sweep.json"
    try:
        timing = json.loads(sweep.read_text()) if sweep.is_file() else None
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(str(sweep), "<file>", f"not valid JSON: {str(e).splitlines()[0]}") from None
    return {"dir": directory, "side": side, "rows": rows, "column": side.column, "margin": margin,
            "margin_source": source, "sweep": timing}


def summarise(result: dict | None, reason: str | None) -> str:
    if result is None:
        return f"not testable: {reason}" if reason else "not run"
    verdicts = [r["verdict"] for r in result["rows"] if not r["missing"]]
    if not verdicts:
        return "not run"
    agree, disagree = verdicts.count("agrees"), verdicts.count("disagrees")
    equivalent, undecided = verdicts.count("equivalent"), verdicts.count("undecided")
    if disagree:
        head = "disagrees" if not agree else "mixed"
    elif agree == len(verdicts):
        head = "agrees"
    elif agree:
        head = "partly agrees"
    elif equivalent == len(verdicts):
        head = "no difference beyond the margin"
    else:
        head = "undecided at this scale"
    return (f"{head} ({agree} of {len(verdicts)} orderings hold, {disagree} reversed, {equivalent} equivalent, "
            f"{undecided} undecided)")


def collect(root: Path) -> tuple[dict[str, dict], dict[str, metrics.TaskInfo], list[str]]:
    """From the ablation.json files under root: family -> {"claim", "source", "settings": {setting: results
    dir}}, setting -> the task it trains, and every setting in the order the files list them."""
    if not root.is_dir():
        raise ConfigError(str(root), "<dir>", "not a directory" if root.exists() else "no such directory")
    families: dict[str, dict] = {}
    tasks: dict[str, metrics.TaskInfo] = {}
    listed: list[str] = []
    for meta_file in sorted(root.glob("*/ablation.json")):
        d = meta_file.parent
        meta = read_meta(d)
        claim, setting = meta.get("claim"), meta.get("setting")
        if not claim:
            continue
        task = metrics.task_of(meta, () if meta.get("task") else final_names(read_table(d / "summary.csv", ["run"])))
        family = meta["name"].removesuffix(f"_{setting}") if setting else meta["name"]
        setting = setting or (task.name if task else d.name)  # a file without settings: its task's name
        entry = families.setdefault(family, {"claim": claim, "source": meta.get("source", ""), "settings": {}})
        entry["settings"][setting] = d
        listed += [s for s in meta.get("settings") or [] if s not in listed]
        if task is not None:
            tasks.setdefault(setting, task)
    seen = {s for e in families.values() for s in [*e["settings"], *(e["claim"].get("untestable") or {})]}
    known = registry.names("task")
    for s, task in LEGACY_SETTINGS.items():
        if s in seen and s not in tasks and task in known:
            tasks[s] = metrics.declared_task(task)
    order = list(dict.fromkeys([s for s in listed + list(LEGACY_SETTINGS) if s in seen] + sorted(seen)))
    for entry in families.values():
        entry["settings"] = dict(sorted(entry["settings"].items(), key=lambda kv: order.index(kv[0])))
    return families, tasks, order


def names(order: list[str], tasks: dict[str, metrics.TaskInfo]) -> dict[str, tuple[str, str]]:
    """setting -> (its name in a column, its short name beside another): its task's declared label and
    short name, with the setting where two settings train one task; the setting itself where none is known."""
    plain = {s: (tasks[s].label, tasks[s].short) if s in tasks else (s, s) for s in order}
    labels = [n[0] for n in plain.values()]
    return {s: (f"{n[0]} ({s})", f"{n[1]} ({s})") if labels.count(n[0]) > 1 else n for s, n in plain.items()}


def _cell(r: dict) -> str:
    if r["missing"]:
        return "—"
    return (f"{r['diff']:+.3f} [{r['lo']:+.3f}, {r['hi']:+.3f}]; {stats.which_test(r)}; p_holm {r['p_holm']:.2g}; "
            f"P(a > b) {r['poi']:.2f}; {stats.power_text(r)}: **{stats.verdict_text(r)}**")


def _tau(results: dict, x: str, y: str) -> str:
    if x not in results or y not in results:
        return "—"
    a, b = results[x]["side"], results[y]["side"]
    tau, p, n = kendall(a.means, b.means)
    return "—" if math.isnan(tau) else f"{tau:+.2f} (p {p:.2g}, {n} variants)"


def _ranking(result: dict) -> str:
    side = result["side"]
    means = side.means.sort_values(ascending=False)
    return " > ".join(f"`{v}` {m:.3f} (IQM {stats.iqm(side.values[v]):.3f})" for v, m in means.items())


def _timing(result: dict) -> str:
    s = result["sweep"]
    if not s:
        return "not recorded"
    return f"{s['wall_s'] / 60:.1f} min for {s['runs']} runs ({s['where']}, {s['cpu']}, load {s['load_avg_end']})"


def _command(d: Path, source: str) -> str:
    """The command that made results directory d: its setting (only a file with settings has one), --seeds
    auto:CAP where its seeds were chosen sequentially, --out where d is not the default results/<name>."""
    meta = read_meta(d)
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


def render(root: Path) -> str:
    families, tasks, order = collect(root)
    called = names(order, tasks)
    name = {s: n for s, (n, _) in called.items()}
    presets = _presets(families, root)
    where = " and ".join(f"the {name[s]}" + (f" (`{'`, `'.join(presets[s])}`)" if presets.get(s) else "")
                         for s in order)
    pairs = list(itertools.combinations(order, 2))  # a τ column per pair of settings: does one predict the other?
    lines = ["# Findings: published claims about GRPO, put to the test", "",
             f"Each row is one claim, tested by the shipped ablation of the same name on {where}, everything "
             "else held fixed; the settings and seeds of each are in its section. The "
             "metric is each task's main one (final rollout reward on the toy, final held-out greedy accuracy "
             "on the LM) unless the claim names another. Each ordering \"a > b\" the paper reports is tested "
             "on the per-seed final values: seed by seed on the differences a − b where the two variants ran "
             f"the same seeds (paired t below {stats.N_PERM} pairs, a sign-flip permutation test from "
             f"{stats.N_PERM}; ρ: their correlation across seeds), Welch's t otherwise; Holm-corrected over the "
             "claim's orderings on that task. It *agrees* when a − b > 0 with p_holm < 0.05, *disagrees* when "
             "significant the other way, is *equivalent within ±δ* when two one-sided tests (TOST, "
             "Holm-corrected) put the difference within the margin δ (the claim's `margin`, else the "
             "metric's default: 0.02 reward, 0.03 accuracy), and *undecided* otherwise, with the seeds per "
             "side that would decide it at 80% power if the difference were as observed. Every non-significant "
             "ordering carries its MDE: the smallest difference its test detects with 80% power at the level "
             "Holm compared it with — what \"no difference\" could have seen, at this scale: these seeds and "
             "this budget, not the paper's. A claimed \"a = b\" agrees when equivalent within δ. Kendall's τ "
             "between the toy's and the LM's orderings of the same variants asks whether the toy predicts the "
             "LM. Generated by `python -m grpo_bench findings` from the results directories: every number is "
             "recomputed from them.", "",
             "| " + " | ".join(["claim", "source", *(name[s] for s in order),
                                *(f"{called[a][1]} ↔ {called[b][1]} τ" for a, b in pairs)]) + " |",
             "|---|---|" + "---|" * (len(order) + len(pairs))]
    details = []
    for family, entry in families.items():
        claim = entry["claim"]
        untestable = claim.get("untestable") or {}
        results = {s: judge_setting(d, claim["expect"], claim.get("metric"), claim, s)
                   for s, d in entry["settings"].items()}
        cells = [summarise(results.get(s), untestable.get(s)) for s in order]
        row = [f"[{family}](#{family}): {claim['text']}", claim["source"], *cells,
               *(_tau(results, a, b) for a, b in pairs)]
        # a claim's own text may hold a pipe (1/|o|), which would split the table's cell
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |")
        details += [f"## {family}", "", f"**Claim.** {claim['text']}", "", f"**Source.** {claim['source']}", ""]
        if claim.get("setting"):
            details += [f"**Their setting.** {claim['setting']}", ""]
        if claim.get("metric"):
            details += [f"**Judged on** `{claim['metric']}` (mean over the last 10% of rollouts).", ""]
        details += [f"**Here.** `{entry['source']}`; " + "; ".join(
            f"{name[s]}: `results/{d.name}`" for s, d in entry["settings"].items()), ""]
        details += ["**Margin δ.** " + "; ".join(f"{name[s]}: " + (f"±{r['margin']:g}" if r["margin"] else "none")
                                                  + f" ({r['margin_source']})" for s, r in results.items()), ""]
        head = ": Δ = a − b [95% CI]; test; Holm p; P(a > b); detectable effect or margin: verdict"
        details += ["| ordering (a > b) | " + " | ".join(name[s] + head for s in results) + " |",
                    "|---|" + "---|" * len(results)]
        for i, e in enumerate(claim["expect"]):
            details.append(f"| `{e}` | " + " | ".join(_cell(r["rows"][i]) for r in results.values()) + " |")
        details.append("")
        for s, r in results.items():
            details.append(f"- {name[s]} ({label_column(r['column'])}, {r['side'].seeds} seeds): {_ranking(r)}. "
                           f"Time: {_timing(r)}. Command: `{_command(r['dir'], entry['source'])}`.")
        for s, why in untestable.items():
            details.append(f"- {name[s]}: {'not testable here' if s not in results else 'note'}: {why}")
        details.append("")
    if not families:
        raise ConfigError(str(root), "<dir>", "no results with a claim here (a <dir>/ablation.json with `claim`, "
                          "written by running an ablation that has one): nothing to judge")
    notes = root / "FINDINGS_notes.md"  # commentary written after looking at these results
    return "\n".join(lines + [""] + details + ([notes.read_text()] if notes.is_file() else []))


def write_findings(root: Path, out: Path | None = None) -> Path:
    out = out or root / "FINDINGS.md"
    out.write_text(render(root))
    return out
