"""The same bits under every instruction-set setting the installed libraries offer (grpo_bench/numerics/cpu.py).

Each setting runs in a fresh process (MKL and ATen fix their paths at their first computation): the
sorting toy, every loss mode, a budget long enough for the native paths to
part at some step, compared on every logged metric bit for bit (20 epochs x 10 steps is enough). The same runs with the pin off
(GRPO_BENCH_CPU_NUMERICS=native) must differ somewhere: otherwise the settings change nothing on
this machine and the test proves nothing.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from grpo_bench.numerics import cpu

ROOT = Path(__file__).resolve().parents[1]
TOY = r"""
import hashlib, struct, sys
from grpo_bench.config.ablation import load_ablation
from grpo_bench.sweep.runner import plan
from grpo_bench.sweep.worker import train_group
from grpo_bench.numerics import cpu
abl = load_ablation("ablations/loss_modes.yaml", seeds=1, sets=["epochs=20", "log_every=1", "eval_every=10"])
h = hashlib.sha256()
for spec in plan(abl):
    (cfg, rows, summary, _), = train_group([spec])
    assert summary["status"] == "ok", summary
    h.update(repr([r for r in rows if not r[1].startswith(("time/", "perf/"))]).encode())  # not the clocks
print(cpu.state(), h.hexdigest())
"""
LM = r"""
import hashlib
from grpo_bench.sweep.worker import train_group, RunSpec
from grpo_bench.numerics import cpu
cfg = {"task": {"name": "arithmetic_tiny", "prompts_per_step": 4, "pass_k": 0}, "epochs": 3, "group_size": 4,
       "inner_steps": 2, "log_every": 1, "eval_every": 1, "lr": 1e-2, "seed": 0}
(c, rows, summary, _), = train_group([RunSpec("lm", "v", {}, 0, cfg)])
assert summary["status"] == "ok", summary
print(cpu.state(), hashlib.sha256(repr([r for r in rows if not r[1].startswith(("time/", "perf/"))]).encode()).hexdigest())
"""
# every setting the libraries read, whatever this CPU supports (a value it lacks falls back)
SETTINGS = [{}, {"MKL_CBWR": "COMPATIBLE"}, {"MKL_CBWR": "AUTO"}, {"MKL_CBWR": "AVX2"}, {"MKL_CBWR": "AVX512"},
            {"MKL_ENABLE_INSTRUCTIONS": "AVX2"}, {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
            {"ATEN_CPU_CAPABILITY": "default"}, {"ATEN_CPU_CAPABILITY": "avx2"}, {"ATEN_CPU_CAPABILITY": "avx512"},
            {"ONEDNN_MAX_CPU_ISA": "SSE41"}]


def _toy(env: dict, code: str = TOY) -> tuple[str, str]:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA",
                          "GRPO_BENCH_CPU_NUMERICS")}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=clean | {"GRPO_BENCH_CPU_PIN": "1"} | env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    state, digest = out.stdout.split("\n")[-2].rsplit(" ", 1)
    return state, digest


needs_mkl = pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="torch without MKL: nothing to pin")


@needs_mkl
def test_toy_is_the_same_bits_under_every_instruction_set_setting():
    native = {"GRPO_BENCH_CPU_NUMERICS": "native"}
    envs = SETTINGS + [native, native | {"MKL_CBWR": "COMPATIBLE"}, native | {"ATEN_CPU_CAPABILITY": "default"}]
    with ThreadPoolExecutor(2) as pool:  # a process each: the paths are fixed at a process's first computation
        got = dict(zip(map(str, envs), pool.map(_toy, envs)))
    pinned = [got[str(e)] for e in SETTINGS]
    assert {s for s, _ in pinned} == {cpu.PINNED}, got
    assert len({d for _, d in pinned}) == 1, got
    # the control: unpinned, the settings change the bits, so the agreement above is the pin's doing
    assert len({got[str(e)][1] for e in envs[len(SETTINGS):]}) > 1, f"the native paths agree here: {got}"


@needs_mkl
def test_a_short_lm_run_is_the_same_bits_under_each_library_setting():
    """The tiny GPT-2 with LoRA (transformers' layers, the chunked log-probs, sampling): 3 rollouts x 2 steps."""
    native = {"GRPO_BENCH_CPU_NUMERICS": "native"}
    envs = [{}, {"MKL_CBWR": "COMPATIBLE"}, {"ATEN_CPU_CAPABILITY": "default"}, native,
            native | {"ATEN_CPU_CAPABILITY": "default"}]
    with ThreadPoolExecutor(2) as pool:
        got = list(pool.map(lambda e: _toy(e, LM), envs))
    assert len({d for _, d in got[:3]}) == 1 and {s for s, _ in got[:3]} == {cpu.PINNED}, got
    assert len({d for _, d in got[3:]}) > 1, f"the native paths agree here: {got}"


def test_a_late_pin_warns_and_says_what_is_in_force():
    code = ("import warnings, torch; from grpo_bench.numerics import cpu\n"
            "torch.ones(64, 64) @ torch.ones(64, 64)\n"  # MKL and ATen have computed: too late
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always'); s = cpu.pin()\n"
            "print(s); print(len(w), w[0].message if w else '')")
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "GRPO_BENCH_CPU_NUMERICS")}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    state, warned = out.stdout.splitlines()[-2:]
    if state == cpu.PINNED:
        pytest.skip(f"this CPU's native paths are the pinned ones ({state}): nothing to warn about")
    assert warned.startswith("1 ") and "may differ on another processor" in warned, out.stdout


def test_cpu_sqrt_is_ieees_where_a_tensors_need_not_be():
    """cpu.sqrt is the correctly rounded root in float32 and float64 (numpy's sqrt is the IEEE instruction), keeps
    the shape, and gives NaN below 0 as torch does; torch's own CPU sqrt goes through MKL's vector math, which
    is not correctly rounded and, under the pin, rounded differently on an Intel Xeon and an AMD EPYC."""
    import numpy as np

    g = torch.Generator().manual_seed(0)
    for dtype, npdtype in ((torch.float32, np.float32), (torch.float64, np.float64)):
        x = (torch.rand(4000, generator=g, dtype=torch.float64) * 100).to(dtype).view(40, 100)
        got = cpu.sqrt(x)
        assert got.dtype == dtype and got.shape == x.shape
        assert torch.equal(got, torch.from_numpy(np.sqrt(x.numpy().astype(npdtype))))
    special = cpu.sqrt(torch.tensor([0.0, 4.0, float("inf"), -1.0, float("nan")]))
    assert special[:3].tolist() == [0.0, 2.0, float("inf")] and special[3:].isnan().all()


def test_the_spread_metrics_round_as_ieee_says():
    """The coefficients of variation the mechanisms read (sampling._spreads) on lengths whose sums, mean and squared
    deviations are exact in float32: every rounding left is the root's and the quotient's, so each value must be
    the correctly rounded one bit for bit, the same on every processor (with MKL's root, many were one unit off)."""
    import types

    import numpy as np

    from grpo_bench.engine.sampling import _spreads

    g = torch.Generator().manual_seed(1)
    p, b, gs, t = 200, 8, 8, 40
    lengths = torch.randint(1, t + 1, (p, b, gs), generator=g)
    mask = (torch.arange(t) < lengths[..., None]).float()                # (P, B, G, T): each response's tokens
    rewards = torch.rand(p, b, gs, generator=g)                          # no group flat: all 64 responses live
    got = _spreads(types.SimpleNamespace(mask=mask, rewards=rewards), torch.zeros(p, b, dtype=torch.bool))
    f32 = np.float32
    for name, values in (("response/length_cv", lengths.flatten(1)), ("response/length_prompt_cv", lengths.sum(-1))):
        v = values.numpy().astype(np.float64)
        mean = v.mean(1)                                                 # n is 64 or 8: exact in binary
        var = ((v - mean[:, None]) ** 2).mean(1)                         # multiples of 1/64**2, far below 2**24
        want = (np.sqrt(var.astype(f32)) / mean.astype(f32)).astype(f32)
        assert np.array_equal(got[name].numpy(), want), name


INCLUDED = r"""
import pickle, sys, warnings
warnings.simplefilter("error", RuntimeWarning)   # a late pin warns: here that is the failure
spec = pickle.loads(open(sys.argv[1], "rb").read())   # loads examples/my_variant: its contract probe computes
from grpo_bench.sweep.worker import train_group
(cfg, rows, summary, _), = train_group([spec])
from grpo_bench.numerics import cpu
print(summary["status"], cpu.state())
"""


@needs_mkl
@pytest.mark.usefixtures("registry_restored")   # the include below registers the example's soft_clip here too
def test_a_worker_pins_before_a_users_part_is_probed(tmp_path):
    """A spawned worker (or a Ray task) unpickles its runs, which loads their include; registering a user's part
    runs its contract probe, a small computation, and MKL's path is fixed by its first one. The worker must pin
    before that, or every run of a user's part keeps this CPU's native paths (examples/my_variant did, with a
    RuntimeWarning per worker)."""
    import pickle

    from grpo_bench.config.ablation import load_ablation
    from grpo_bench.sweep.runner import plan

    spec = plan(load_ablation(ROOT / "examples/my_variant/ablation.yaml", seeds=1))[0]   # one toy run
    (tmp_path / "spec.pkl").write_bytes(pickle.dumps(spec))
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "GRPO_BENCH_CPU_NUMERICS",
                                                            "ONEDNN_MAX_CPU_ISA", "MKL_CBWR")}
    out = subprocess.run([sys.executable, "-c", INCLUDED, str(tmp_path / "spec.pkl")], cwd=ROOT,
                         env=env | {"GRPO_BENCH_CPU_PIN": "1"}, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-1500:]
    assert out.stdout.splitlines()[-1] == f"ok {cpu.PINNED}", out.stdout


def test_cpu_memory_measures_each_malloc_setting_in_its_own_process(tmp_path):
    """scripts/cpu_memory.py: each MALLOC_MMAP_THRESHOLD_ reaches its own process (the child reports what its
    glibc read), the allocator changes no log-prob's bit, and a setting that cannot run fails in one message
    naming it."""
    import csv
    import importlib.util
    spec = importlib.util.spec_from_file_location("cpu_memory", Path(__file__).parents[1] / "scripts" / "cpu_memory.py")
    cm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cm)
    out = tmp_path / "mem.csv"
    assert cm.main(["arithmetic_scratchpad", "--prompts", "4", "--group", "4", "--passes", "1",
                    "--thresholds", "default", "131072", "--out", str(out)]) == 0
    dyn, fixed = list(csv.DictReader(out.open()))
    assert (dyn["mmap_threshold"], fixed["mmap_threshold"]) == ("default", "131072")
    assert dyn["logp_sum"] == fixed["logp_sum"] and float.fromhex(dyn["logp_sum"]) < 0
    assert dyn["responses"] == fixed["responses"] == "16"
    assert float(fixed["peak_rss_gb"]) > 0 and float(fixed["pass_s"]) > 0
    with pytest.raises(SystemExit, match="threshold 65536 failed"):
        cm.main(["no_such_preset", "--thresholds", "65536", "--out", str(tmp_path / "x.csv")])


def test_docs_quote_the_measured_cpu_memory():
    """docs/tasks.md's memory paragraph quotes results/smollm2_start/cpu_memory.csv (scripts/cpu_memory.py): what the
    first forward adds under every setting, the peak under glibc's own rule and at 128 KiB and 4 MiB thresholds, the
    time each costs, and the log-probs the same bits under all."""
    import csv
    root = Path(__file__).parents[1]
    rows = {r["mmap_threshold"]: r for r in csv.DictReader(open(root / "results/smollm2_start/cpu_memory.csv"))}
    dyn, small, large = rows["default"], rows["131072"], rows["4194304"]
    assert dyn["logp_sum"] == small["logp_sum"] == large["logp_sum"] and dyn["preset"] == "smollm2_countdown_warm"
    text = " ".join((root / "docs/tasks.md").read_text().split())
    gb = lambda r, k: f"{float(r[k]):.1f} GB"  # noqa: E731
    slower = lambda r: f"{round(100 * (float(r['pass_s']) / float(dyn['pass_s']) - 1))}%"  # noqa: E731
    assert {gb(r, "forward_rss_gb") for r in rows.values()} == {"0.7 GB"}
    assert f"{dyn['responses']} completions of {dyn['tokens']} tokens" in text
    assert (f"the first forward adds 0.7 GB under every setting, but under glibc's own rule the pass peaks at "
            f"{gb(dyn, 'peak_rss_gb')}; with `MALLOC_MMAP_THRESHOLD_=131072` in the environment it peaks at "
            f"{gb(small, 'peak_rss_gb')}, for {slower(small)} more time a pass and the same log-probs to the bit (a 4 MiB "
            f"threshold: {gb(large, 'peak_rss_gb')}, {slower(large)})") in text


def test_docs_quote_the_measured_shared_prefix():
    """docs/tasks.md's shared-prefix paragraph quotes results/smollm2_start/shared_prefix.csv (scripts/cpu_memory.py
    --layouts): a gradient pass's time and peak with each prompt run once for its group against each block
    recomputed, the same completions, in one call of the script."""
    import csv
    root = Path(__file__).parents[1]
    rows = {r["layout"]: r for r in csv.DictReader(open(root / "results/smollm2_start/shared_prefix.csv"))}
    shared, ckpt = rows["shared_prefix"], rows["checkpointed"]
    assert shared["preset"] == ckpt["preset"] == "smollm2_countdown_warm" and shared["machine"] == ckpt["machine"]
    assert (shared["responses"], shared["tokens"]) == (ckpt["responses"], ckpt["tokens"])
    text = " ".join((root / "docs/tasks.md").read_text().split())
    s, c = float(shared["pass_s"]), float(ckpt["pass_s"])
    assert (f"a gradient pass took {s:.0f} s against {c:.0f} s with each block recomputed ({c / s:.1f}x), and "
            f"peaked at {float(shared['peak_rss_gb']):.1f} GB against {float(ckpt['peak_rss_gb']):.1f} GB") in text



PIN = r"""
import os, sys
from grpo_bench.numerics import cpu
pinned = cpu.pin()   # before anything computes, as `run` does
import torch
torch.ones(64, 64) @ torch.ones(64, 64)
print(pinned, "|", cpu.state(), "|", os.environ.get("ATEN_CPU_CAPABILITY"), os.environ.get("ONEDNN_MAX_CPU_ISA"))
"""


def _pin_in_a_process(env: dict) -> list[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("MKL_CBWR", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA",
                                                              "GRPO_BENCH_CPU_NUMERICS")}
    out = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-c", PIN], cwd=ROOT, env=clean | env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-1500:]
    return [part.strip() for part in out.stdout.splitlines()[-1].split("|")]


@needs_mkl
def test_the_pin_overrides_what_the_environment_asked_for():
    """Pinned first thing, a process runs MKL COMPATIBLE and ATen AVX2 whatever its environment asked for (without a
    warning: nothing computed before); with the pin off it keeps the processor's own paths and leaves the
    environment alone."""
    asked = {"MKL_CBWR": "AUTO", "ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41"}
    assert _pin_in_a_process(asked) == [cpu.PINNED, cpu.PINNED, "avx2 AVX2"]
    native, state, env = _pin_in_a_process({"GRPO_BENCH_CPU_NUMERICS": "Native"})
    assert native == state != cpu.PINNED and state.startswith("MKL ") and env == "None None"


@needs_mkl
def test_state_names_each_mkl_branch_as_mkl_numbers_it():
    """cpu.BRANCHES against MKL itself: every code MKL accepts here reads back as a branch the table names, every
    entry is one MKL accepts (the AVX-512 ones where the processor has AVX-512), and the names of the branches every
    x86-64 runs are mkl_service.h's (MKL's own deprecation warnings confirm 6 and 9). A wrong entry would misname
    the paths a run's metadata records."""
    code = ("from grpo_bench.numerics import cpu\n"
            "get, set_ = cpu._mkl()\n"
            "for code in range(32):\n"
            "    if set_(code) == 0:\n"   # MKL_CBWR_SUCCESS; a code it does not know, or a branch this CPU lacks, fails
            "        print(code, get(cpu.CBWR_BRANCH), cpu.state().split(',')[0])\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-1500:]
    seen = {int(c): (int(read), named) for c, read, named in (line.split(" ", 2) for line in out.stdout.splitlines())}
    assert seen[0] == (1, "MKL OFF")   # 0 unsets every mode: the branch reads back as off
    for c, (read, named) in seen.items():
        assert read in cpu.BRANCHES and named == f"MKL {cpu.BRANCHES[read]}" and (read == c or c == 0), (c, read)
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    if "GenuineIntel" in info:   # MKL refuses its instruction-set branches on other vendors (AVX2 on an AMD EPYC)
        assert set(cpu.BRANCHES) - set(seen) <= (set() if "avx512f" in info else {12, 14}), seen
    universal = {1: "OFF", 2: "AUTO", 3: "COMPATIBLE", 4: "SSE2", 5: "SSE3", 6: "SSSE3", 7: "SSE4_1", 8: "SSE4_2",
                 9: "AVX", 10: "AVX2"}
    assert {c: cpu.BRANCHES[c] for c in universal} == universal


def test_pin_sets_what_it_must_and_warns_once_with_a_stand_in_mkl(monkeypatch):
    """pin()'s decisions, in this process, against a stand-in for MKL's service functions (the real ones refuse
    once MKL has computed, as it has here): the ATen and oneDNN variables set, MKL asked for COMPATIBLE only when
    on another branch, a refusal warned about once per state in force, naming it, at pin()'s caller; native
    touches nothing; without MKL there is nothing to set or warn about."""
    import warnings
    branch, asked = [2], []

    def set_(code, refuse=False):
        asked.append(code)
        if not refuse:
            branch[0] = code
        return -8 if refuse else 0

    monkeypatch.setattr(cpu, "_mkl", lambda: (lambda what: branch[0] if what == cpu.CBWR_BRANCH else -1, set_))
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx512")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE")
    monkeypatch.delenv("GRPO_BENCH_CPU_NUMERICS", raising=False)
    cpu._warn.cache_clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cpu.pin() == cpu.PINNED and asked == [cpu.CBWR_COMPATIBLE]
        assert (os.environ["ATEN_CPU_CAPABILITY"], os.environ["ONEDNN_MAX_CPU_ISA"]) == ("avx2", "AVX2")
        assert cpu.pin() == cpu.PINNED and asked == [3]   # already there: not asked again
    branch[0] = 2
    monkeypatch.setattr(cpu, "_mkl", lambda: (lambda what: branch[0], lambda code: set_(code, refuse=True)))
    with pytest.warns(RuntimeWarning, match=r"\(MKL AUTO, ATen AVX2, not MKL COMPATIBLE, ATen AVX2\)") as seen:
        assert cpu.pin() == "MKL AUTO, ATen AVX2"
        cpu.pin()
    assert len(seen) == 1 and seen[0].filename == __file__ and asked == [3, 3, 3]
    cpu._warn.cache_clear()
    monkeypatch.setenv("GRPO_BENCH_CPU_NUMERICS", "NATIVE")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    assert cpu.pin() == "MKL AUTO, ATen AVX2" and asked == [3, 3, 3] and os.environ["ATEN_CPU_CAPABILITY"] == "default"
    monkeypatch.delenv("GRPO_BENCH_CPU_NUMERICS")
    monkeypatch.setattr(cpu, "_mkl", lambda: None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cpu.pin() == cpu.state() == "MKL none, ATen AVX2"


@needs_mkl
def test_torchs_own_mkl_service_functions_are_found():
    get, set_ = cpu._mkl()
    assert get(cpu.CBWR_BRANCH) in cpu.BRANCHES   # this process's branch, whatever it is
