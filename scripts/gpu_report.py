"""results/gpu/README.md and its figures from the files scripts/gpu_run.sh wrote there.

    python scripts/gpu_report.py [results/gpu]

Reads device.txt, population.csv, population_equality.csv, profile_*.txt, step.jsonl and
bench.jsonl (one line per finished benchmark), and writes README.md (the tables README.md's
"On a GPU" section quotes), population.png and kernels.png. Nothing here is measured: every
number comes from those files.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from grpo_bench.analysis import png  # noqa: E402

GOALS = {"toy": 20_000.0, "lm": 1_000.0}  # issue 44: runs per GPU-minute at the harness budget
TASK_NAMES = {"toy": "sorting toy (sort_converge, loss=clipped)", "lm": "arithmetic LM (arithmetic_scratchpad, grpo, LoRA)"}
PEERS = {"trl": "TRL {trl}", "liger": "Liger-Kernel {liger}", "ours": "grpo_bench (Triton)", "torch": "torch eager",
         "compile": "torch.compile", "materialised": "torch, materialised logits", "naive": "torch eager",
         "chunked": "grpo_bench (chunked torch)", "triton": "grpo_bench (Triton)", "trl_rows": "TRL {trl}, (N, V) rows",
         "liger_ce": "Liger-Kernel {liger} cross entropy", "bound": "memory bound (x.sum)"}


def versions(device_txt: str) -> dict[str, str]:
    out = {}
    for line in device_txt.splitlines():
        for part in line.split("|"):
            words = part.split()
            if len(words) == 2 and words[0] in ("torch", "triton", "cuda", "trl", "liger-kernel", "transformers", "peft"):
                out[words[0].replace("liger-kernel", "liger")] = words[1]
    return out


def population_table(pop: pd.DataFrame) -> list[str]:
    lines = ["| task | P | CUDA graphs | runs | s per run | runs per GPU-minute | goal | speed-up over P = 1 "
             "| CPU cores one GPU replaces | peak GPU memory (MB) | memory per member (MB) |",
             "|---|---:|---|---:|---:|---:|---|---:|---:|---:|---:|"]
    for task, g in pop.groupby("task", sort=False):
        top = g.runs_per_device_minute.max()
        for _, r in g.iterrows():
            goal = GOALS.get(task)
            mark = ""
            if goal and r.runs_per_device_minute == top:
                mark = f"≥ {goal:,.0f}: {'met' if top >= goal else 'not met'}"
            per = "—" if pd.isna(r.mem_per_member_mb) else f"{r.mem_per_member_mb:.1f}"
            cores = "—" if pd.isna(r.get("cpu_cores_replaced")) else f"{r.cpu_cores_replaced:.1f}"
            graphs = r.get("cuda_graphs", "off")
            lines.append(f"| {task} | {r.population} | {'off' if pd.isna(graphs) else graphs} | {r.runs} | {r.s_per_run:.3f} "
                         f"| {r.runs_per_device_minute:,.1f} | {mark} | {r.speedup:.1f}x | {cores} | {r.peak_mem_mb:.0f} | {per} |")
    return lines


def busy_table(path: Path) -> list[str]:
    """population_profile.csv: the device-busy share and launches of 3 profiled epochs per case."""
    if not path.is_file():
        return []
    prof = pd.read_csv(path)
    # the phases' wall seconds (gpu_population.Phases), in files written since 2026-12-01
    phases = "rollout_s" in prof and prof.rollout_s.notna().any()
    head = "| task | P | CUDA graphs | device busy (share of wall) | kernel launches | memcpy calls | syncs |"
    rule = "|---|---:|---|---:|---:|---:|---:|"
    if phases:
        head, rule = head + " rollouts / log-prob passes / evaluation / rest (s) |", rule + "---|"
    lines = [head, rule]
    for _, r in prof.iterrows():
        line = (f"| {r.task} | {r.population} | {r.cuda_graphs} | {100 * r.device_busy_share:.1f}% (goal ≥ 50% "
                f"for the toy) | {r.kernel_launches} | {r.memcpy_calls} | {r.syncs} |")
        if phases:
            cols = [r.get(f"{n}_s") for n in ("rollout", "logprobs", "evaluate", "other")]
            line += (" — |" if any(pd.isna(c) for c in cols) else f" {' / '.join(f'{c:.2f}' for c in cols)} |")
        lines.append(line)
    return ["Device-busy share over 3 profiled epochs and the final evaluation (`population_profile.csv`, "
            "torch.profiler's CUDA time over the wall time; each phase's wall time with a sync at its edges):",
            "", *lines, ""]


def members_per_gpu(pop: pd.DataFrame, total_mb: float) -> dict[str, int]:
    """Members that fit in the GPU's memory at the measured memory per member (an extrapolation)."""
    out = {}
    for task, g in pop.groupby("task", sort=False):
        per = g.mem_per_member_mb.dropna()
        if len(per):
            base = g[g.population == 1].peak_mem_mb.iloc[0]
            out[task] = int((total_mb - base) // per.iloc[-1])
    return out


def equality_table(eq: pd.DataFrame) -> list[str]:
    lines = ["| task | metric | rows compared | bitwise equal | largest abs. difference |", "|---|---|---:|---:|---:|"]
    for _, r in eq.iterrows():
        lines.append(f"| {r.task} | `{r.metric}` | {r.rows} | {r.bitwise_equal} | {r.max_abs_diff:.3g} |")
    return lines


def bench_rows(path: Path) -> pd.DataFrame:
    if not path.exists():
        return pd.DataFrame()
    rows = []
    for line in path.read_text().splitlines():
        d = json.loads(line)
        e = d["extra_info"]
        rows.append({"group": e["group"], "provider": e["provider"], "median_ms": d["stats"]["median"] * 1e3,
                     "iqr_ms": d["stats"]["iqr"] * 1e3, "rounds": d["stats"]["rounds"], "gb_per_s": e["gb_per_s"],
                     "peak_mem_mb": e["peak_mem_mb"], "kernel": e.get("kernel", ""),
                     **{k: e.get(k, float("nan")) for k in ("of_bound", "of_bound2", "bound_ms", "copy_gb_per_s")}})
    return pd.DataFrame(rows)


def _share(r) -> str:
    """Share of the case's memory bound (bytes over the measured copy bandwidth): one read of the
    logits, and in brackets two (a log-sum-exp pass and a gradient pass), where recorded."""
    if pd.isna(r.of_bound):
        return "—"
    return f"{r.of_bound:.0%}" + ("" if pd.isna(r.of_bound2) else f" ({r.of_bound2:.0%})")


def kernel_table(df: pd.DataFrame, v: dict[str, str]) -> list[str]:
    lines = ["| case | provider | median ms (IQR) | x fastest | effective GB/s | of bound | peak extra memory (MB) |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for group, g in df.groupby("group", sort=False):
        best = g.median_ms.min()
        for _, r in g.sort_values("median_ms").iterrows():
            who = PEERS.get(r.provider, r.provider).format(**{"trl": v.get("trl", "?"), "liger": v.get("liger", "?")})
            lines.append(f"| {group} | {who} | {r.median_ms:.2f} ({r.iqr_ms:.2f}) | {r.median_ms / best:.2f} "
                         f"| {r.gb_per_s:.0f} | {_share(r)} | {r.peak_mem_mb:.0f} |")
    return lines


def bound_note(df: pd.DataFrame) -> list[str]:
    bw = df.copy_gb_per_s.dropna() if "copy_gb_per_s" in df else pd.Series(dtype=float)
    if not len(bw):
        return []
    return [f"Of bound: the case's bound time over the provider's median, the bound being the bytes the case must "
            f"move (the unmasked rows' logits read once, or twice in brackets; the whole gradient written; the "
            f"small inputs once) over the device-to-device copy bandwidth measured in the same run, "
            f"{bw.median():,.0f} GB/s (tests/benchmarks: hot_path_bytes, loss_bytes, conftest.copy_bandwidth).", ""]


def claims_section(c: pd.DataFrame, d: Path) -> list[str]:
    """`gpu_run.sh claims` calls (claims.csv, one row per sweep): what finished, in how long."""
    kept = c[(c.status == "ok") & (c.note == "")]
    # a population's time is the sum of its members' wall_s (sweep/worker.py shares it among them)
    walls = [pd.read_csv(d / s / "summary.csv").query("population == 10").groupby("variant").wall_s.sum()
             for s in kept.sweep if (d / s / "summary.csv").is_file()]
    walls = pd.concat(walls) if walls else pd.Series(dtype=float)
    rows = ["| call | sweep | worker processes | status | wall s | note |", "|---:|---|---:|---|---:|---|"]
    rows += [f"| {r.call} | `{r.sweep}` | {r.workers} | {r.status} | {r.wall_s:.0f} | {r.note} |" for r in c.itertuples()]
    return ["## Claim sweeps", "",
            f"`gpu_run.sh claims` (`scripts/gpu_sweeps.py`, `claims.csv`, `claims_call*.log`): {len(c.call.unique())} "
            f"calls on {c.started_utc.iloc[0][:10]}, 10 seeds a variant, many sweeps at once with up to 3 worker "
            f"processes each (one population of a variant's seeds per worker), stopped at a deadline. "
            f"{len(kept)} sweeps are kept as results beside this file: "
            + ", ".join(f"`{s}`" for s in kept.sweep) + ". Their models are bf16 (`model.dtype: auto` on CUDA) where "
            "the CPU's are fp32, so a claim judged here is judged at another precision as well as on another device "
            "(FINDINGS names the device of each)."
            + "".join(f" {' and '.join(f'`{s}`' for s in rerun)} {'was' if len(rerun) == 1 else 'were'} since "
                      "rerun on the CPU with every evaluation on all the held-out problems (these score a subset "
                      "mid-run): FINDINGS judges the rerun and lists the sweep here beside it, not judged."
                      for rerun in [[s for s in kept.sweep if (d.parent / s).is_dir()]] if rerun)
            + (f" A countdown population of 10 took {walls.min():.0f}-{walls.max():.0f} s of wall time (the kept "
               "sweeps' `summary.csv`)." if len(walls) else ""), "", *rows, ""]


def acts_section(c: pd.DataFrame, d: Path) -> list[str]:
    """`gpu_run.sh acts` calls (acts_sweeps.csv): every claim's lm_acts setting, where its mechanism acts; the
    wall time is each call's stage as its log (acts_call<N>.log) says."""
    import re

    kept = c[c.status == "ok"]
    wall = sum(int(m) for f in sorted(d.glob("acts_call*.log"))
               for m in re.findall(r"== acts: exit \d+.* in (\d+) s", f.read_text()))
    rows = ["| call | sweep | worker processes | status | wall s | note |", "|---:|---|---:|---|---:|---|"]
    rows += [f"| {r.call} | `{r.sweep}` | {r.workers} | {r.status} | {r.wall_s:.0f} | {r.note} |" for r in c.itertuples()]
    return ["## Where the mechanisms act", "",
            f"`gpu_run.sh acts` (`acts_sweeps.csv`, `acts_call*.log`): each claim's `lm_acts` setting (the arithmetic "
            f"LM with 8 optimizer steps a rollout; each ablation file says why), 10 seeds a variant, {len(kept)} sweeps "
            f"kept beside this file in {len(c.call.unique())} calls, "
            f"{wall / 60:.1f} minutes of wall time. The first call ran "
            "`gpu_run.sh smollm2` beside it (`smollm2_call1.log`): SmolLM2-135M's start table on all 200 problems and "
            "its memory per member (results/smollm2_start), then default GRPO as one population of 20 members, which "
            "ran out of the GPU's memory beside the sweeps: no SmolLM2 training result yet.", "", *rows, ""]


def pretrained_section(c: pd.DataFrame, d: Path) -> list[str]:
    """`gpu_run.sh pretrained` calls (pretrained_sweeps.csv): the claims whose mechanism can act only on SmolLM2,
    each sweep's runs kept beside this file; the wall time is each call's stage as its log says."""
    import re

    wall = sum(int(m) for f in sorted(d.glob("pretrained_call*.log"))
               for m in re.findall(r"== pretrained: exit \d+.* in (\d+) s", f.read_text()))
    kept = {r.sweep: _finished(d / r.sweep) for r in c.itertuples()}
    rows = ["| call | sweep | worker processes | status | wall s | runs kept | note |", "|---:|---|---:|---|---:|---:|---|"]
    rows += [f"| {r.call} | `{r.sweep}` | {r.workers} | {r.status} | {r.wall_s:.0f} | {kept[r.sweep]} | {r.note} |"
             for r in c.itertuples()]
    return ["## SmolLM2-135M: where a bf16 head or sampler could leave a gap", "",
            "`gpu_run.sh pretrained` (`pretrained_sweeps.csv`, `pretrained_call*.log`): fp32_head's and sampler_mismatch's "
            "`smollm2` settings (SmolLM2-135M-Instruct on countdown from its format warm-up, 10 seeds a variant, "
            "populations of 10 on one shared base; each ablation file says why), then default GRPO on the same task, "
            f"{len(c.call.unique())} call(s), {wall / 60:.1f} minutes of wall time. Runs kept: finished runs in the "
            "sweep's summary.csv; its REPORT.md says whether the mechanism acted.", "", *rows, ""]


def _finished(sweep: Path) -> int:
    f = sweep / "summary.csv"
    return int((pd.read_csv(f).status == "ok").sum()) if f.is_file() else 0


def population_figure(pop: pd.DataFrame, path: Path, device: str) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for task, g in pop.groupby("task", sort=False):
        axes[0].plot(g.population, g.runs_per_device_minute, "o-", label=TASK_NAMES.get(task, task))
        axes[1].plot(g.population, g.speedup, "o-", label=TASK_NAMES.get(task, task))
        if task in GOALS:
            axes[0].axhline(GOALS[task], ls=":", lw=1, color=axes[0].lines[-1].get_color())
    for ax, label in zip(axes, ("runs per GPU-minute", "speed-up over one run per process")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("members per population (P)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=8, loc="upper left")
    axes[0].set_title("dotted: the goals (toy 20,000, LM 1,000 runs per GPU-minute)", fontsize=9)
    fig.suptitle(f"Populations on one {device}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=120, metadata={"Software": None})
    plt.close(fig)
    png.shrink(path, [])


def kernels_figure(df: pd.DataFrame, path: Path, v: dict[str, str]) -> None:
    groups = list(dict.fromkeys(df.group))
    fig, axes = plt.subplots(len(groups), 1, figsize=(8, 1.3 + 1.1 * len(groups) * 1.6), squeeze=False)
    for ax, group in zip(axes[:, 0], groups):
        g = df[df.group == group].sort_values("median_ms", ascending=False)
        names = [PEERS.get(p, p).format(trl=v.get("trl", "?"), liger=v.get("liger", "?")) for p in g.provider]
        colors = ["tab:green" if p in ("ours", "triton") else "tab:gray" for p in g.provider]
        ax.barh(names, g.median_ms, color=colors)
        for i, ms in enumerate(g.median_ms):
            ax.text(ms, i, f" {ms:.2f}", va="center", fontsize=7)
        ax.set_xlim(0, g.median_ms.max() * 1.18)
        ax.set_title(group, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.set_xlabel("median ms (lower is better)", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)
    png.shrink(path, [])


def main(root: str = "results/gpu") -> str:
    d = Path(root)
    device_txt = (d / "device.txt").read_text()
    v = versions(device_txt)
    device = device_txt.splitlines()[2].split(",")[0].strip()
    total_mb = float(device_txt.splitlines()[2].split(",")[1].split()[0])
    md = [f"# On one {device}", "",
          f"What `scripts/gpu_run.sh` measured on a lent {device} on {device_txt.splitlines()[0][:10]}: "
          f"torch {v.get('torch')}, Triton {v.get('triton')}, CUDA {v.get('cuda')}, TRL {v.get('trl')} and "
          f"Liger-Kernel {v.get('liger')} (the peers' own code, from wheels), transformers {v.get('transformers')}, "
          f"peft {v.get('peft')} (`device.txt`). Tables and figures: `python scripts/gpu_report.py`.", ""]
    pop_path = d / "population.csv"
    if pop_path.exists():
        pop = pd.read_csv(pop_path)
        fit = members_per_gpu(pop, total_mb)
        md += ["## Populations", "",
               "`scripts/gpu_population.py` (`population.csv`): every population trained in one process after an "
               "untimed warm-up; P = 1 is two runs one after the other (one run per process, less the process "
               "start). Budgets cut along the run (" + "; ".join(f"{t}: `{s}`" for t, s in
                                                              pop.groupby("task", sort=False).settings.first().items())
               + "), the loss vmapped over members (backend=torch). CPU cores one GPU replaces: runs per GPU-minute over "
               "one CPU core's runs per minute, measured first in the same process (the toy as a population of 32 on "
               "one thread, the LM one run at a time).", "", *population_table(pop), "", *busy_table(d / "population_profile.csv"),
               "Members per GPU at the measured memory per member (extrapolated, not run): "
               + ", ".join(f"{t} about {n:,}" for t, n in fit.items()) + f" in {total_mb / 1024:.0f} GiB.", "",
               "![runs per GPU-minute and speed-up against P](population.png)", ""]
        population_figure(pop, d / "population.png", device)
        profiles = sorted(d.glob("profile_*.txt"))
        if profiles:
            md += ["Where the time goes (`profile_*.txt`, torch.profiler over 3 epochs):", ""]
            md += [f"- {p.read_text().splitlines()[0]}" for p in profiles] + [""]
    eq_path = d / "population_equality.csv"
    if eq_path.exists():
        eq = pd.read_csv(eq_path)
        differ = eq[eq.bitwise_equal < eq.rows]
        md += ["## A member against the same run alone, on CUDA", "",
               "Seeds 0 and 1 inside the smallest population against the same runs at P = 1 "
               f"(`population_equality.csv`): {len(differ)} of {len(eq)} metrics differ somewhere. On a CPU they are "
               "bitwise equal (tests/test_population.py); on CUDA the batched GEMMs of a population round "
               "differently from one run's, and the toy's runs then drift apart.", "", *equality_table(eq), ""]
    for name, title in (("step.jsonl", "The hot path against the peers"), ("bench.jsonl", "Log-prob kernels")):
        df = bench_rows(d / name)
        # a stage rerun in a later call keeps that call's device.txt beside its lines (<stage>_device.txt)
        own = d / f"{Path(name).stem}_device.txt"
        when = (f" Measured in a later call, on {own.read_text().splitlines()[0][:10]} (`{own.name}`: "
                f"{own.read_text().splitlines()[2].split(',')[0].strip()}, the same software)." if own.is_file() else "")
        if len(df):
            md += [f"## {title}", "", f"`{name}`: medians of 20 rounds after a warm-up, bf16 inputs; each provider "
                   f"checked against fp64 before it was timed.{when}", "",
                   *kernel_table(df[~df.kernel.isin(list(CONFIG_TABLES))], v), "", *bound_note(df)]
            for kind, text in CONFIG_TABLES.items():
                if (df.kernel == kind).any():
                    md += [text, "", *kernel_table(df[df.kernel == kind], v), ""]
    steps = bench_rows(d / "step.jsonl")
    if len(steps):
        steps = steps[~steps.kernel.isin(list(CONFIG_TABLES))]
    if len(steps):
        kernels_figure(steps, d / "kernels.png", v)
        md += ["![median time per provider, each case](kernels.png)", ""]
    claims_path = d / "claims.csv"
    if claims_path.exists():
        md += claims_section(pd.read_csv(claims_path, keep_default_na=False), d)
    acts_path = d / "acts_sweeps.csv"
    if acts_path.exists():
        md += acts_section(pd.read_csv(acts_path, keep_default_na=False), d)
    sweeps_path = d / "pretrained_sweeps.csv"
    if sweeps_path.exists():
        md += pretrained_section(pd.read_csv(sweeps_path, keep_default_na=False), d)
    (d / "README.md").write_text("\n".join(md))
    return "\n".join(md)


# the launch-configuration sweeps the benchmarks time beside the peers, each a table of its own
CONFIG_TABLES = {
    "loss_config": "Launch configurations of the logits -> loss kernel (`kernels/logits_loss.py` CONFIGS: BLOCK_V x "
                   "warps, programs per SM, second pass reversed), each checked against the default one:",
    "logprob_config": "Launch configurations of the log-prob forward (`kernels/logprob.py` FWD_CONFIGS: BLOCK_V x "
                      "warps, pipeline stages, and `tile` where each tile is reduced first, Liger's scheme; the first "
                      "is the default rule), each checked against fp64:",
}


if __name__ == "__main__":
    print(main(*sys.argv[1:]))


def readme_tables(d: Path) -> tuple[str, str]:
    """README's two GPU tables (populations; the hot path against the peers), from this directory's files alone."""
    dev = (d / "device.txt").read_text().splitlines()
    device, day, load = dev[2].split(",")[0].strip(), dev[0][:10], dev[-1].split("load ")[-1].split()[0]
    pop = pd.read_csv(d / "population.csv")
    prof = pd.read_csv(d / "population_profile.csv") if (d / "population_profile.csv").is_file() else None
    rows = [f"| task | one {device} (load {load}, {day}) | CPU cores one GPU replaces | device busy at that P |",
            "|---|---|---:|---:|"]
    for task, name in (("toy", "sorting toy"), ("lm", "arithmetic LM (LoRA)")):
        g = pop[pop.task == task]
        best, alone, goal = g.loc[g.runs_per_device_minute.idxmax()], g[g.population == 1].iloc[0], GOALS[task]
        busy = "—"
        if prof is not None:
            p = prof[(prof.task == task) & (prof.population == best.population) & (prof.cuda_graphs == best.cuda_graphs)]
            busy = "—" if p.empty else f"{100 * p.device_busy_share.iloc[0]:.1f}%"
        rows.append(f"| {name} | **{best.runs_per_device_minute:,.0f}** runs per GPU-minute at P = {best.population:,}"
                    f"{', CUDA graphs' if best.cuda_graphs == 'on' else ''} ({alone.runs_per_device_minute:,.1f} at "
                    f"P = 1; goal {goal:,.0f}: {'met' if best.runs_per_device_minute >= goal else 'not met'}) "
                    f"| {best.cpu_cores_replaced:.1f} | {busy} |")
    step = [json.loads(line) for line in (d / "step.jsonl").read_text().splitlines() if line.strip()]
    med = {}
    for r in step:
        e = r["extra_info"]
        if e.get("kernel") in ("loss", "head") and ":" not in e["provider"]:
            med[(e["kernel"], e["v"], e["provider"])] = r["stats"]["median"] * 1e3
    cols = ["ours", "trl", "liger", "compile", "torch", "materialised"]
    hot = ["| case | grpo_bench | TRL | Liger-Kernel | torch.compile | torch eager |", "|---|---:|---:|---:|---:|---:|"]
    for kernel, label in (("loss", "logits → GRPO loss, 32 x 512 tokens"), ("head", "fused LM head → log p, N = 16,384, H = 896")):
        for v in sorted({k[1] for k in med if k[0] == kernel}):
            got = {p: med.get((kernel, v, p)) for p in cols}
            eager = got["torch"] if kernel == "loss" else got["materialised"]
            fastest = min(x for p, x in got.items() if x is not None and p in ("ours", "trl", "liger", "compile"))
            cell = lambda x: "—" if x is None else (f"**{x:.2f}**" if x == fastest else f"{x:.2f}")  # noqa: E731
            hot.append(f"| {label}, V = {v:,} | {cell(got['ours'])} | {cell(got['trl'])} | {cell(got['liger'])} "
                       f"| {cell(got['compile'])} | {'—' if eager is None else f'{eager:.2f}'} |")
    return "\n".join(rows), "\n".join(hot)
