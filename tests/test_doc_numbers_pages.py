"""docs/tasks.md, docs/populations.md and docs/testing.md: their result numbers held to the files they report.

The pages were typed by hand. Each entry rebuilds a sentence from its file with the page's rounding, and where the
page states a bound ("pass 80%") whether the file meets it. Numbers whose data was not kept say so on the page ("not
kept") and are not held. `python tests/test_doc_numbers_pages.py` prints every sentence as it should read.
"""
from __future__ import annotations

import json
import math
import re
import struct
from functools import cache

import pandas as pd
import pytest

from helpers import ROOT

R = ROOT / "results"


@cache
def page(name: str) -> str:
    # pages wrap sentences anywhere: compare with runs of whitespace as one space
    return " ".join((ROOT / "docs" / name).read_text().split())


def manifest(d: str) -> dict:
    return json.loads((ROOT / "tasks" / d / "manifest.json").read_text())


def summary(d: str) -> pd.DataFrame:
    return (s := pd.read_csv(R / d / "summary.csv"))[s.status == "ok"]


def pct(x: float, digits: int = 1) -> str:
    return f"{100 * x:.{digits}f}%"


def sci(x: float) -> str:  # 0.003 -> 3e-3, as the pages write learning rates
    m, e = f"{x:.1e}".split("e")
    return f"{m.removesuffix('.0')}e{int(e)}"


def params(d: str) -> int:
    blob = (ROOT / "tasks" / d / "checkpoint/model.safetensors").read_bytes()
    header = json.loads(blob[8:8 + struct.unpack("<Q", blob[:8])[0]])
    return sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")


def curve(d: str, metric: str = "eval/accuracy") -> pd.DataFrame:
    m = pd.read_parquet(R / d / "metrics.parquet", filters=[("metric", "==", metric)])
    return m.groupby(["variant", "step"], observed=True).value.mean().unstack()


def start_pass8() -> float:
    # the shipped arithmetic_scratchpad start is the search's 2000-step warm-start; its manifest keeps no pass@k
    m = pd.read_parquet(R / "headroom_search_start/metrics.parquet", filters=[("metric", "==", "eval/pass@k")])
    return m[(m.step == 0) & (m["task.warmstart.steps"] == 2000)].value.mean()


M = "tasks/{}/manifest.json".format


def starts() -> list[tuple[str, str, bool]]:
    sp, wide, tiny = (manifest(d) for d in ("arithmetic_scratchpad", "arithmetic_scratchpad_wide", "arithmetic_tiny"))
    g, gw, p8, ws = sp["heldout_greedy_accuracy"], wide["heldout_greedy_accuracy"], start_pass8(), wide["recipe"]["start"]
    small, big = params("arithmetic_scratchpad"), params("arithmetic_scratchpad_wide")
    shipped = sum(f.stat().st_size for f in (ROOT / "tasks/arithmetic_tiny/checkpoint").iterdir())
    checks = [c["step"] for c in wide["checks"]]
    both, sw = M("arithmetic_scratchpad") + ", headroom_search_start", M("arithmetic_scratchpad_wide")
    return [
        (both, f"on a shipped tiny GPT-2 at {pct(g)} greedy held-out accuracy (pass@8 {pct(p8, 0)})", True),
        (sw, f"on a start {big / small:.0f}x the size (width {ws['width']}, {big / 1e6:.1f}M parameters) at {pct(gw)} "
             f"greedy (pass@8 {pct(wide['heldout_pass@k'], 0)})", True),
        (M("arithmetic_tiny"), f"on the first shipped tiny GPT-2 ({pct(tiny['heldout_greedy_accuracy'])})", True),
        (M("arithmetic_tiny"), f"held-out greedy accuracy, **{pct(tiny['heldout_greedy_accuracy'])}**", True),
        ("tasks/arithmetic_tiny/checkpoint/", f"and shipped ({shipped / 1e6:.1f} MB)", True),
        (sw, f"width {ws['width']} and {ws['heads']} heads ({big / 1e6:.1f}M parameters against {small / 1e6:.2f}M)", True),
        (M("arithmetic_scratchpad"), f"At the small start's lr ({sci(sp['recipe']['warmstart']['lr'])})", True),
        (sw, f"at {sci(ws['lr'])} its greedy accuracy climbs through the window", True),
        (sw, f"checks every step from {ws['check_from']} (`check_from`) and stops at {wide['steps']} ({pct(gw)})",
         ws["check_every"] == 1 and checks[0] == ws["check_from"] and checks[-1] == wide["steps"]),
        (sw + ", headroom_search_start", f"Its pass@8 there is {pct(wide['heldout_pass@k'], 0)}, about "
         f"{wide['heldout_pass@k'] / gw:.0f}x greedy where the small start's is {p8 / g:.1f}x: the wider model samples "
         f"less widely, so its criterion asks {ws['pass_ratio']:g}x", True),
        (M("arithmetic_scratchpad"), f"was warm-started {sp['recipe']['warmstart']['steps']} steps with "
         f"{pct(sp['recipe']['warmstart']['scratchpad'], 0)} of its examples worked out", True),
        (both, f"greedy held-out accuracy is {pct(g)} while pass@8 is about {pct(p8, 0)}", True),
        (M("arithmetic_scratchpad"), f"{sp['task']['eval_size']} held-out problems (greedy accuracy, `eval/pass@k`", True),
    ]


def lengths() -> list[tuple[str, str, bool]]:
    """What the scratchpad start's held-out problems take, in its tokenizer's tokens and an EOS."""
    from tokenizers import Tokenizer

    from grpo_bench.tasks.lm.problems import heldout
    t = manifest("arithmetic_scratchpad")["task"]
    problems = heldout(t["ops"], t["eval_size"], t["eval_seed"], t["operands"])
    tok = Tokenizer.from_file(str(ROOT / "tasks/arithmetic_scratchpad/checkpoint/tokenizer.json"))
    n = lambda s: len(tok.encode(s, add_special_tokens=False).ids) + 1  # noqa: E731
    worked = [n(p.scratchpad()) for p in problems]
    budget = int(re.search(r"max_new_tokens: (\d+)", (ROOT / "tasks/arithmetic_scratchpad.yaml").read_text()).group(1))
    over = sum(w > budget for w in worked) / len(worked)
    return [("the held-out split of " + M("arithmetic_scratchpad"), f"completions run from "
             f"{min(n(str(p.answer)) for p in problems)} tokens (`7<eos>`) to the {budget}-token budget, which the longest "
             f"working ({max(worked)} tokens, {pct(over, 0)} of problems) does not fit", over > 0)]


def models() -> list[tuple[str, str, bool]]:
    # every sorting ablation's best variant: the page's "pass 80%" is the weakest best, floored to tens
    best = {}
    for a in sorted(R.glob("*/ablation.json")):
        j = json.loads(a.read_text())
        if j.get("setting") == "sort" or re.search(r"^  task: sort_converge$", (ROOT / j["source"]).read_text(), re.M):
            best[a.parent.name] = summary(a.parent.name).groupby("variant")["final/eval/accuracy"].mean().max()
    # SmolLM2: its base's bf16 bytes on the GPU, the shape the code records, the vocabulary its test holds
    mem = pd.read_csv(R / "smollm2_start/memory.csv")
    code = (ROOT / "grpo_bench/tasks/lm/pretrained.py").read_text()
    width, layers = re.search(r"width=(\d+), layers=(\d+)\)", code).groups()
    vocab = int(re.search(r"vocab_size == (\d+)", (ROOT / "tests/test_pretrained.py").read_text()).group(1))
    qwen = int(re.search(r"default=([\d_]+), help=.vocabulary", (ROOT / "scripts/wide_model.py").read_text()).group(1))
    return [
        ("results/*sort*/summary.csv", f"the best recipes pass {int(10 * min(best.values())) * 10}% exact-sort held-out "
                                       "accuracy", len(best) >= 10),
        ("results/smollm2_start/memory.csv, pretrained.py", f"into a {mem.base_bytes.iloc[0] / 2 / 1e6:.1f}M-parameter "
         f"`LlamaForCausalLM` ({layers} layers, width {width}, tied embedding, {vocab:,}-token vocabulary)",
         mem.device.str.startswith("NVIDIA").all() and mem.base_bytes.nunique() == 1),
        ("scripts/wide_model.py", f"Qwen2 with Qwen2.5's {qwen:,}-token vocabulary", True),
    ]


def gym_starts() -> list[tuple[str, str, bool]]:
    cd, sb = manifest("countdown"), manifest("spell_backward")
    c, s, then = cd["recipe"]["start"], sb["recipe"]["start"], cd["recipe"]["start"]["then"]
    # build times and spell_backward's split are the search's write-up's: the manifests keep neither
    search = " ".join((R / "gym_search/README.md").read_text().split())
    mins = {d: re.search(rf"\| `tasks/{d}.yaml` \|.*?\(([\d.]+) min", search).group(1)
            for d in ("countdown", "spell_backward")}
    worked, direct = re.search(r"a quarter of the words greedily \(([\d.]+)% right\) and answers the rest at once "
                               r"\(([\d.]+)% right\)", search).groups()
    grow = [(lambda x: x.iloc[-1] / x.iloc[0])(curve(f"{d}_grpo", "response/length").mean())
            for d in ("countdown", "spell_backward")]
    word = "no one two three four five".split()
    return [
        (M("countdown") + ", " + M("spell_backward"), f"all answers worked out first ({c['steps']} and {s['steps']} steps), "
         f"then at lr {sci(then['lr'])} with {pct(then['scratchpad'], 0)} worked out",
         c["scratchpad"] == s["scratchpad"] == 1 and then == s["then"]),
        (M("countdown") + ", " + M("spell_backward") + ", results/gym_search/README.md",
         f"(countdown step {cd['steps']}: greedy {pct(cd['heldout_greedy_accuracy'])}, pass@8 {pct(cd['heldout_pass@k'])}, "
         f"{mins['countdown']} minutes; spell_backward step {sb['steps']}: greedy {pct(sb['heldout_greedy_accuracy'])}, "
         f"pass@8 {pct(sb['heldout_pass@k'])}, {mins['spell_backward']} minutes)", True),
        ("results/gym_search/README.md", f"spell_backward {worked}% against {direct}%", True),
        ("results/{countdown,spell_backward}_grpo/metrics.parquet",
         f"completions grow {word[int(min(grow))]}- to {word[int(max(grow)) + 1]}fold", True),
    ]


def gym_claims() -> list[tuple[str, str, bool]]:
    from grpo_bench.store.metrics import odds_margin  # the rule itself, at the level each default recipe ends at
    sweeps = ["policy_losses_countdown", "policy_losses_spell_backward", "dapo_ladder_spell_backward"]
    margin = {d: odds_margin(round(summary(f"{d}_grpo")["final/eval/accuracy"].mean(), 3))
              for d in ("countdown", "spell_backward")}
    sat = pd.concat([curve(d) for d in sweeps[1:]])
    first = next(step for step in sat.columns if (sat[step] >= 0.95).all())
    epoch = pd.read_parquet(R / sweeps[1] / "metrics.parquet", filters=[("metric", "==", "epoch")]).groupby("step").value
    ends = pd.concat([summary(d).groupby("variant")["final/eval/accuracy"].mean() for d in sweeps[1:]])
    (b1, n1, e1, u1), (b2, n2, e2, u2) = (
        map(int, re.search(r"Beyond seed noise: (\d+) of (\d+)[^;]*; equivalent within the margin: (\d+); undecided: (\d+)",
                           (R / d / "REPORT.md").read_text().split("## Differences in eval accuracy")[1]).groups())
        for d in sweeps[1:])
    row = next(r for r in (R / "FINDINGS.md").read_text().splitlines() if r.startswith("| `gspo > dapo` |"))
    cell = row.split(" | ")[3]  # its columns: sort, lm, countdown, ...
    final, area = (float(re.search(rf"{w}.*?Δ ([-+][\d.]+)", cell).group(1)) for w in ("final:", "area"))
    walls = pd.concat([summary(d).wall_s for d in sweeps])
    runs = [json.loads((R / d / "sweep.json").read_text()) for d in sweeps]
    claims = [a.stem for a in sorted((ROOT / "ablations").glob("*.yaml"))
              if re.search(r"^  countdown:", a.read_text(), re.M)]
    gpu = [c for c in claims if not (R / f"{c}_countdown").is_dir() and (R / f"gpu/{c}_countdown").is_dir()]
    # a GPU's countdown sweep (250-problem mid-run evaluations) that a CPU rerun now replaces
    rerun = [c for c in claims if (R / f"{c}_countdown").is_dir() and (R / f"gpu/{c}_countdown").is_dir()]
    return [
        ("results/*_{countdown,spell_backward}/summary.csv", f"the claims' LM recipe, {summary(sweeps[0]).seed.nunique()} "
         f"seeds, greedy accuracy on all {manifest('countdown')['task']['eval_size']} held-out problems",
         len({summary(d).seed.nunique() for d in sweeps}) == 1),
        ("results/{countdown,spell_backward}_grpo/summary.csv", f"(countdown ±{margin['countdown']:.3f}, "
         f"spell_backward ±{margin['spell_backward']:.3f}: `Gym.HEADROOM`)", True),
        ("results/*_spell_backward/metrics.parquet", f"every variant is at 95% by rollout {int(epoch.first()[first]) + 1} "
         f"and ends within a point of {round(100 * ends.mean())}%", (abs(ends - round(ends.mean(), 2)) <= 0.01).all()),
        ("results/*_spell_backward/REPORT.md", f"(eval accuracy: {e1} of {n1} loss pairs and {e2} of {n2} DAPO pairs "
         f"equivalent within the margin, {b1 + b2} beyond seed noise, the rest undecided)",
         b1 + e1 + u1 == n1 and b2 + e2 + u2 == n2),
        ("results/FINDINGS.md", f"({-100 * area:.0f} points behind DAPO over the run, {-100 * final:.1f} at the end, "
         f"equivalent within the margin there)", "**equivalent within" in cell.split("area")[0]),
        ("results/*_{countdown,spell_backward}/summary.csv, sweep.json", f"Times per run ({runs[0]['where'].split()[1]} "
         f"workers on {runs[0]['cpus']} cores; load {min(r['load_avg_end'] for r in runs):.1f}-"
         f"{max(r['load_avg_end'] for r in runs):.1f} as the sweeps ended, past 2 beside other work): "
         f"{walls.min():.0f}-{walls.max():.0f} s.",
         all(r["where"] == runs[0]["where"] for r in runs)),
        ("results/, results/gpu/", "`dapo_ladder` on countdown and the other claims on both tasks ran later ("
         + "".join(" and ".join(f"`{c}`" for c in gpu) + " on countdown on a GPU; " for _ in gpu[:1])
         + "`fp32_head`'s, which cast the trainer's head alone, are withdrawn", True),
        ("results/, results/gpu/", " and ".join(f"`{c}`" for c in rerun) + " on countdown ran on a GPU first and "
         + ("is judged on its CPU rerun" if len(rerun) == 1 else "are judged on their CPU reruns")
         + " with every evaluation on all 1,000 problems",
         all((R / f"{c}_{t}").is_dir() or (R / f"gpu/{c}_{t}").is_dir()
             for c in claims if c != "fp32_head" for t in ("countdown", "spell_backward"))
         and not list(R.glob("**/fp32_head_countdown")) + list(R.glob("**/fp32_head_spell_backward"))),
    ]


def populations() -> list[tuple[str, str, bool]]:
    worker = (ROOT / "grpo_bench/sweep/worker.py").read_text()
    budget = re.search(r"MEMORY_BUDGET = (\d+) << 30", worker).group(1)
    cap = re.search(r"MAX_POPULATION = (\d+)", worker).group(1)
    lm = pd.read_csv(R / "population/population.csv").query("ablation == 'arithmetic_lora'").set_index("population")
    lm = lm.sort_index().cpu_s_per_run
    toy = pd.read_csv(R / "gpu/population.csv").query("task == 'toy'")
    return [
        ("grpo_bench/sweep/worker.py", f"budget of {budget} GiB by the task's own estimate of a member's memory, "
                                       f"at most {cap},", True),
        ("results/population/population.csv", f"has {lm.iloc[-1] / lm.iloc[0]:.1f}x the CPU time per member at "
                                              f"P = {lm.index[-1]}", lm.index[0] == 1),
        ("results/gpu/population.csv", f"`scripts/gpu_population.py` runs the toy to P = {toy.population.max():,}", True),
    ]


def suite() -> list[tuple[str, str, bool]]:
    mutation = (R / "mutation.md").read_text()
    total = float(re.search(r"total ([\d.]+) min", mutation).group(1))
    table = mutation.split("\n\n")[2].strip()  # the first table: the page shows it whole
    cells = [[c.strip() for c in r.strip().strip("|").split("|")] for r in table.splitlines()[2:]]
    rows = {c[0].strip("`"): c for c in cells}  # module -> [module, tests, mutants, killed, ..., equivalent, score, time]
    sampled = [(m.split("/")[-1], re.search(r"\((1 in \d+)\)", r[2]).group(1)) for m, r in rows.items() if "(1 in" in r[2]]
    tsv = [r for r in (ROOT / "scripts/mutants_equivalent.tsv").read_text().splitlines() if r and not r.startswith("#")]
    examples = [int(x) for x in re.findall(r"max_examples=(\d+)", (ROOT / "tests/test_properties.py").read_text())]
    m = "results/mutation.md"
    return [
        (m, f"mutation testing, on demand (not in CI): about {total:.0f} min on 2 cores for the table below", True),
        (m, " ".join(table.split()), True),
        (m, (f"Sampled: {', '.join(f'`{name}` ({k})' for name, k in sampled)}; every other module ran all of its "
             if sampled else "Every module ran all of its ") + f"mutants: {total} min of wall time", True),
        # rows of a sampled module may explain mutants outside its sample: the table counts those it drew
        ("scripts/mutants_equivalent.tsv", f"with the reason it cannot change behaviour ({len(tsv)} rows, "
         f"{rows['**all**'][7]} of them about mutants this run drew;", len(tsv) >= int(rows["**all**"][7])),
        ("tests/test_properties.py", f"Examples are few ({min(examples)} to {max(examples)} per test)", True),
    ]


CASES = [("tasks.md", *c) for f in (starts, lengths, models, gym_starts, gym_claims) for c in f()] \
    + [("populations.md", *c) for c in populations()] + [("testing.md", *c) for c in suite()]


@pytest.mark.parametrize("name, source, text, holds", CASES, ids=[f"{p}:{i}" for i, (p, *_) in enumerate(CASES)])
def test_a_number_on_the_page_is_its_file(name, source, text, holds):
    assert holds, f"docs/{name}: {source} no longer bears out {text!r}"
    assert text in page(name), f"docs/{name} does not say what {source} says; it should read: {text!r}"


if __name__ == "__main__":
    print("\n".join(f"docs/{p} ({s}): {t}" for p, s, t, _ in CASES))


def _mutate(monkeypatch):
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("mutate", ROOT / "scripts" / "mutate.py")
    mutate = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "mutate", mutate)  # its dataclasses look their module up there
    spec.loader.exec_module(mutate)
    return mutate


def test_a_failed_baselines_log_outlives_the_work_directory(tmp_path, monkeypatch):
    """mutate.py's "the tests fail before any mutation; see LOG" once named a log inside the temporary directory it
    removes on exit; the log is now copied beside the module's cache, and a missing one says so."""
    import shutil

    mutate = _mutate(monkeypatch)
    monkeypatch.setattr(mutate, "ROOT", tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    (work / "baseline.log").write_text("FAILED tests/test_x.py::test_y\n")
    kept = mutate._kept_log("grpo_bench/x.py", work / "baseline.log")
    shutil.rmtree(work)
    assert kept == tmp_path / ".cache" / "mutate-grpo_bench_x.py.baseline.log"
    assert kept.read_text() == "FAILED tests/test_x.py::test_y\n"
    assert mutate._kept_log("grpo_bench/x.py", work / "baseline.log").read_text() == "(pytest wrote no log)\n"


def test_the_mutation_report_is_what_mutate_writes_from_its_own_rows(tmp_path, monkeypatch):
    """results/mutation.md is scripts/mutate.py's: rewritten from its own module rows (what --report keeps for a
    module run on another machine), it comes out byte for byte, so its **all** row and its total are the sums of
    the rows and no row was typed in by hand."""
    mutate = _mutate(monkeypatch)
    kept = mutate.committed(R / "mutation.md")
    assert set(kept) == set(mutate.MODULES)  # every module listed has been run and reported
    mutate.REPORT = tmp_path / "mutation.md"
    cores = int(re.search(r"on a (\d+)-core machine", (R / "mutation.md").read_text()).group(1))
    monkeypatch.setattr(mutate.os, "cpu_count", lambda: cores)  # the machine it ran on, not this one
    mutate.write_report({}, 2, 0.0, kept)
    assert mutate.REPORT.read_text() == (R / "mutation.md").read_text()
    # and each module lists as many equivalent mutants, with their reasons, as its row counts
    for module, entry in kept.items():
        assert len(entry["why"]) == entry["equivalent"], module
