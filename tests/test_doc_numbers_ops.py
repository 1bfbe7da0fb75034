"""docs/ray.md, trackers.md, reliability.md, extending.md and storage.md: each number rebuilt, with the page's
rounding, from the committed file it reports or the code constant it states (imported where it has a name, read from
the source where it is a literal). Figures measured once and not kept say so on their page and are not held."""
from __future__ import annotations

import ast
import importlib
import inspect
import io
import json
import re
import subprocess
import tempfile
import textwrap
from fnmatch import fnmatch
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from helpers import ROOT


@cache
def page(name: str) -> str:
    return " ".join((ROOT / "docs" / f"{name}.md").read_text().split())  # pages wrap sentences anywhere


def src(rel: str) -> str:
    return (ROOT / rel).read_text()


def lit(rel: str, pattern: str) -> tuple[int, ...]:
    """The integers a pattern captures in a file, which must match once: a literal the code has no name for."""
    found = re.findall(pattern, src(rel))
    assert len(found) == 1, f"{rel}: {pattern!r} matches {len(found)} times"
    return tuple(map(int, found[0] if isinstance(found[0], tuple) else (found[0],)))


def const(dotted: str):
    module, name = dotted.rsplit(".", 1)
    return getattr(importlib.import_module("grpo_bench." + module), name)


@cache
def tracked() -> tuple[str, ...]:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True).stdout.split("\0")
    if not any(files):
        pytest.skip("not a git checkout")
    return tuple(f for f in files if f)


@cache
def metrics_tables() -> dict[str, pd.DataFrame]:
    return {f: pd.read_parquet(ROOT / f) for f in tracked() if re.fullmatch(r"results/.*/metrics\.parquet", f)}


def ray_package() -> tuple[str, str]:
    # Ray uploads the checkout less cluster.EXCLUDES as the job's working_dir, its zip stored without compression
    def shipped(f: str) -> bool:
        return not any("/" + f.split("/")[0] == e if e[0] == "/" else any(fnmatch(p, e) for p in f.split("/"))
                       for e in const("sweep.cluster.EXCLUDES"))
    sizes = {f: (ROOT / f).stat().st_size for f in tracked() if shipped(f) and (ROOT / f).is_file()}
    mb = sum(sizes.values()) / 1e6
    assert sum(s for f, s in sizes.items() if "/checkpoint/" in f) / 1e6 > mb / 2, "most of it is the checkpoints"
    return f"about {mb:.0f} MB zipped", f"the {mb:.0f} MB code package"


def rows_per_run() -> str:
    def span(d: str) -> str:
        n = metrics_tables()[f"results/{d}/metrics.parquet"].groupby("run", observed=True).size()
        return f"{n.min():,}" if n.min() == n.max() else f"{n.min():,}–{n.max():,}"
    return f"now logs {span('loss_modes')} metric rows in loss_modes and {span('arithmetic_lora')} in arithmetic_lora"


def ray_options() -> tuple[str, str, str]:
    (pin,) = re.findall(r'^ray = \["ray==([\d.]+)"\]', src("pyproject.toml"), re.M)
    cli = lit("grpo_bench/__main__.py", r'"--max-retries", type=int, default=(\d+)')[0]
    api = inspect.signature(const("sweep.runner.run_ablation")).parameters["max_retries"].default
    assert cli == api, f"--max-retries defaults to {cli}, run_ablation's max_retries to {api}"
    return (f"(ray=={pin}) too", f"Ray {pin.rsplit('.', 1)[0]} authenticates",
            f"(default {cli}; each retry is logged: `run ID: worker lost (...); retry 1 of {cli}`)")


def lm_core_hours() -> str:
    # the committed CPU sweeps of the LM tasks, known by the metric only they log (as metrics.LEGACY knows them)
    total = 0.0
    for f in (f for f in tracked() if re.fullmatch(r"results/[\w-]+/sweep\.json", f)):
        if "final/eval/accuracy_gain" in pd.read_csv(ROOT / f.replace("sweep.json", "summary.csv"), nrows=0):
            s = json.loads(src(f))
            total += s["wall_s"] * int(s["where"].split()[1]) * s["threads"]  # "local: 2 workers"
    return f"(rerunning every LM sweep is about {total / 3600:.0f} core-hours by their `sweep.json` times)"


def checkpoint_mb() -> str:
    sizes = [sum((ROOT / "tasks" / t / "checkpoint" / f).stat().st_size
                 for f in json.loads(src(f"tasks/{t}/manifest.json"))["files"])
             for t in ("arithmetic_tiny", "arithmetic_scratchpad")]
    return f"({max(sizes) / 1e6:.1f} MB: milliseconds)"


def reward_timeouts() -> str:
    s = {t: const(f"tasks.{t}.{c}").__dataclass_fields__["reward_timeout"].default
         for t, c in [("sort", "SortConfig"), ("arithmetic", "ArithmeticConfig"), ("gym", "GymConfig")]}
    return f"(sort {s['sort']:g} s, arithmetic {s['arithmetic']:g} s, gym {s['gym']:g} s;"


def pin_cost() -> str:
    # the four times were not kept (the page says so); the percentage drawn from them is held to them
    m = re.search(r"(\S+) and (\S+) CPU-seconds pinned, (\S+) and (\S+) native", page("reliability"))
    a, b, c, d = map(float, m.groups())
    return f"{m.group(0)}, so about {100 * ((a + b) / (c + d) - 1):.0f}% more"


def parquet_tables() -> tuple[str, str]:
    share, ours, theirs = [], 0, 0
    for f, m in metrics_tables().items():
        v, buf = m.value.to_numpy(), io.BytesIO()
        share.append(np.mean((v.astype(np.float32).astype(np.float64) == v) | np.isnan(v)))
        m.to_parquet(buf)  # pandas' defaults
        ours, theirs = ours + (ROOT / f).stat().st_size, theirs + len(buf.getvalue())
    assert 0.4 <= ours / theirs < 0.6, f"the committed tables are {ours / theirs:.2f} of pandas' Parquet, not half"
    return (f"only {100 * min(share):.1f}–{100 * max(share):.1f}% of the committed values",
            "at about half the bytes of pandas' own Parquet")


def outcomes_size() -> str:
    runs, evals, problems = lit("tests/test_outcomes.py", r"n = (\d+) \* (\d+) \* (\d+)\n")
    rng = np.random.default_rng(0)  # tests/test_outcomes.py's table: coin-flip answers, k = 8, the same draws
    n, run, steps = runs * evals * problems, np.repeat(np.arange(runs), evals * problems), 10 * np.arange(evals) - 1
    table = pd.DataFrame({"run": [f"v{r // 5}-s{r % 5}-0123456789" for r in run], "variant": [f"v{r//5}" for r in run],
                          "seed": run % 5, "step": np.tile(np.repeat(steps.clip(0), problems), runs),
                          "problem": np.tile(np.arange(problems), runs * evals), "greedy": rng.integers(0, 2, n),
                          "k_correct": rng.binomial(8, 0.5, n)})
    with tempfile.TemporaryDirectory() as tmp:
        const("store.rundir._write_outcomes")(table, Path(tmp) / "o.parquet")
        kib = (Path(tmp) / "o.parquet").stat().st_size / 1024
    return (f"{runs} runs x {evals} evaluations x {problems:,} problems is {n:,} rows: "
            f"about {5 * round(kib / 5)} KiB with answers as uncertain as coin flips")


def code_lines() -> tuple[str, str]:
    text = src("examples/my_variant/my_loss.py")
    loss = sum(1 for line in text.splitlines()[ast.parse(text).body[0].end_lineno:] if line.strip())  # no docstring
    nodes = {n.name: n for n in ast.parse(src("tests/test_metrics.py")).body if hasattr(n, "name")}
    bandit = nodes["Bandit"].end_lineno - nodes["BanditConfig"].decorator_list[0].lineno + 1  # its config to its end
    return f"a loss in {loss} lines", f"(a K-armed bandit, about {5 * round(bandit / 5)} lines)"


NUMERICS, BENCH = "tests/test_cpu_numerics.py", "tests/benchmarks/test_bench_reward_call.py"
toy = lambda: yaml.safe_load(src("ablations/loss_modes.yaml"))["base"]  # noqa: E731
pow2 = lambda n: f"2**{n.bit_length() - 1}" if n & (n - 1) == 0 else f"{n:,}"  # noqa: E731
# (page, source, phrase or phrases as the source makes them); a source is read only when its case runs
CASES = [
    ("ray", "pyproject.toml's ray pin, --max-retries' default", ray_options),
    ("ray", "config.ablation.RESOURCES",
     lambda: "`resources: {{cpus: {cpus}, gpus: {gpus}}}`".format(**const("config.ablation.RESOURCES"))),
    ("ray", "cluster.py's window of tasks in flight",
     lambda: "at most {} × (runs the cluster holds at once) + {} tasks in flight".format(
         *lit("grpo_bench/sweep/cluster.py", r"len\(pending\) < (\d+) \* self\.slots\(\w+\) \+ (\d+)"))),
    ("ray", "tracked files less cluster.EXCLUDES", ray_package),
    ("ray", "results/{loss_modes,arithmetic_lora}/metrics.parquet", rows_per_run),
    ("trackers", "trackers.TIMEOUT_S",
     lambda: f"`GRPO_BENCH_TRACKER_TIMEOUT` seconds ({const('sweep.trackers.TIMEOUT_S'):g};"),
    ("reliability", "ablations/loss_modes.yaml",
     lambda: "(clipped, seed 0, {epochs} epochs x {inner_steps} steps)".format(**toy())),
    ("reliability", f"{NUMERICS}'s runs, loss_modes.yaml", lambda: (
        "every loss mode, {} epochs x {} steps".format(*lit(NUMERICS, r'"epochs=(\d+)"'), toy()["inner_steps"]),
        "`default` alone changed the toy at {} epochs".format(*lit(NUMERICS, r'"epochs=(\d+)"')),
        "a {}-rollout run of the tiny GPT-2".format(*lit(NUMERICS, r'"epochs": (\d+), "group_size"')))),
    ("reliability", "results/*/sweep.json of the LM sweeps", lm_core_hours),
    ("reliability", "config.run.SEED_LIMIT, MAX_SEEDS", lambda: (
        f"`0 <= seed < {pow2(const('config.run.SEED_LIMIT'))}`",
        f"`--seeds N` take at most {const('config.run.MAX_SEEDS'):,}.")),
    ("reliability", "tasks/*/manifest.json's checkpoint files", checkpoint_mb),
    ("reliability", "runner._slug, runner.run_id", lambda: (
        f"at most {len(const('sweep.runner._slug')('x' * 1000))} characters",
        "`+<{} hex of the label's SHA-256>`".format(
            len(const("sweep.runner.run_id")("α", 0, "h").split("+")[1].split("-")[0])))),
    ("reliability", "the tasks' reward_timeout defaults", reward_timeouts),
    ("reliability", "trackers.TIMEOUT_S",
     lambda: f"`GRPO_BENCH_TRACKER_TIMEOUT` ({const('sweep.trackers.TIMEOUT_S'):g} s)"),
    ("reliability", f"{BENCH}'s batch", lambda: "`correct` on {} completions".format(
        np.prod(lit(BENCH, r"COMPLETIONS = .*range\((\d+)\) for j in range\((\d+)\)")))),
    ("reliability", "tests/test_faults.py's tmpfs",
     lambda: "a real {} MB tmpfs".format(*lit("tests/test_faults.py", r'"size=(\d+)m"'))),
    ("reliability", "the page's own four CPU times", pin_cost),
    ("extending", "algos/contracts.py's B, G, T", lambda: "(B = {} prompts, G = {} responses, T = {} tokens".format(
        *(const(f"algos.contracts.{k}") for k in "BGT"))),
    ("extending", "Arithmetic.headroom",
     lambda: "headroom = ({:.3f}, {:.3f},".format(*const("tasks.arithmetic.Arithmetic").headroom)),
    ("extending", "store/metrics.MARGIN_ODDS",
     lambda: f"(odds of {const('store.metrics.MARGIN_ODDS'):g} at that level"),
    ("extending", "examples/my_variant/my_loss.py, tests/test_metrics.py's bandit", code_lines),
    ("storage", "every committed metrics.parquet: its values in float32, its bytes", parquet_tables),
    ("storage", "tests/test_outcomes.py's table", outcomes_size),
    ("storage", "tests/test_docs.py's budget",
     lambda: "holds the tracked `results/` under {} MB".format(*lit("tests/test_docs.py", r"size < (\d+)e6"))),
    ("storage", "store/rundir.py's zstd level",
     lambda: "zstd at level {}".format(*lit("grpo_bench/store/rundir.py", r"compression_level=(\d+)"))),
    ("storage", "analysis/plotting.DPI", lambda: f"palette PNGs at {const('analysis.plotting.DPI')} dpi"),
    ("storage", "config.run.SEED_LIMIT", lambda: f"seeds go up to {pow2(const('config.run.SEED_LIMIT'))} - 1"),
]


@pytest.mark.parametrize("name, source, phrases", CASES, ids=[f"{p}:{s}" for p, s, _ in CASES])
def test_a_number_on_the_page_is_its_sources(name, source, phrases):
    want = phrases()
    for phrase in (want,) if isinstance(want, str) else want:
        assert phrase in page(name), f"docs/{name}.md should say {phrase!r} ({source})"


def test_extendings_preset_is_the_shipped_one():
    """The preset extending.md shows is tasks/arithmetic_tiny.yaml's task section, its description cut short."""
    block = re.search(r"```yaml\n(.*?)```", src("docs/extending.md"), re.S).group(1)
    shown, shipped = yaml.safe_load(textwrap.dedent(block)), yaml.safe_load(src("tasks/arithmetic_tiny.yaml"))
    assert shown["task"] == shipped["task"], "docs/extending.md's preset is not tasks/arithmetic_tiny.yaml's task"
    assert " ".join(shipped["description"].split()).startswith(shown["description"].strip().removesuffix("...").strip())
