"""The package's wings (docs/files.md) as import-linter contracts (pyproject.toml), and what they promise.

Which one-line bug each test catches: an upward import (a store module importing the sweep, the registry
importing a task) breaks the layers contract; `import torch` at the top of any results-reading module
breaks the forbidden contract and the subprocess check; a new module-level circle breaks the last test.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
# the `lint-imports` command, from this interpreter (its console script may not be on PATH)
LINT = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command as c; sys.exit(c())",
        "--no-cache"]


def test_import_linter_contracts_hold():
    out = subprocess.run(LINT, cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    if "No module named importlinter" in out.stderr:
        pytest.fail("import-linter is not installed: pip install -e '.[dev]'")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "3 kept, 0 broken" in out.stdout


def test_a_broken_layer_is_caught(tmp_path):
    """The contract is not vacuous: the same configuration over a copy with one upward import fails."""
    import shutil
    shutil.copytree(ROOT / "grpo_bench", tmp_path / "grpo_bench", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    rundir = tmp_path / "grpo_bench" / "store" / "rundir.py"
    rundir.write_text(rundir.read_text() + "\nfrom ..sweep import runner  # noqa: E402,F401\n")
    paired = tmp_path / "grpo_bench" / "stats" / "paired.py"  # inference reading a results directory
    paired.write_text(paired.read_text() + "\nfrom ..store import rundir  # noqa: E402,F401\n")
    out = subprocess.run(LINT, cwd=tmp_path, capture_output=True,
                         text=True, timeout=300, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert out.returncode != 0 and "grpo_bench.store.rundir -> grpo_bench.sweep.runner" in out.stdout, out.stdout[-2000:]
    assert "grpo_bench.stats.paired -> grpo_bench.store.rundir" in out.stdout, out.stdout[-2000:]


def test_reading_results_imports_no_torch():
    code = ("import sys; import grpo_bench, grpo_bench.analysis.report, grpo_bench.analysis.compare, "
            "grpo_bench.analysis.findings, grpo_bench.store.rundir, grpo_bench.config.ablation, grpo_bench.__main__; "
            "heavy = [m for m in ('torch', 'transformers', 'peft', 'triton') if m in sys.modules]; "
            "assert not heavy, heavy")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


def test_no_import_circle_between_modules():
    graph = grimp.build_graph("grpo_bench")
    circles = sorted({tuple(sorted((m, i))) for m in graph.modules for i in graph.find_modules_directly_imported_by(m)
                      if graph.chain_exists(importer=i, imported=m)})
    assert circles == []


NO_TORCH = ("import importlib.abc, runpy, sys\n"
            "class NoTorch(importlib.abc.MetaPathFinder):  # as where they are not installed\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in ('torch', 'transformers', 'peft', 'triton'):\n"
            "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
            "sys.meta_path.insert(0, NoTorch())\n"
            "sys.argv = ['grpo_bench', *sys.argv[1:]]\n"
            "runpy.run_module('grpo_bench', run_name='__main__', alter_sys=True)\n")


def test_plot_compare_and_findings_work_without_torch(tmp_path):
    """Where torch cannot be imported, plot, compare and findings read each task's declaration from
    ablation.json and write what they write with it: the same REPORT.md, the same figures byte for byte, the
    same comparison and FINDINGS.md (an LM claim beside a toy one: inert parts, margins and labels)."""
    import shutil

    dirs = ["policy_losses_sort", "policy_losses_lm", "dapo_ladder_sort"]
    out = {}
    for mode in ("torch", "none"):
        root = tmp_path / mode / "results"
        for d in dirs:
            shutil.copytree(ROOT / "results" / d, root / d, ignore=shutil.ignore_patterns("*.png", "REPORT.md"))
        pre = [sys.executable, "-m", "grpo_bench"] if mode == "torch" else [sys.executable, "-c", NO_TORCH]
        for args in (["plot", str(root / "policy_losses_lm")],
                     ["compare", str(root / "policy_losses_sort"), str(root / "policy_losses_lm"),
                      "--out", str(root / "compare")],
                     ["findings", str(root)]):
            r = subprocess.run([*pre, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)
            assert r.returncode == 0, (mode, args, r.stderr[-2000:])
        lm = root / "policy_losses_lm"
        out[mode] = {p.relative_to(root).as_posix(): p.read_bytes().replace(str(root).encode(), b"ROOT")
                     for p in [*lm.glob("*.png"), lm / "REPORT.md", *(root / "compare").iterdir(), root / "FINDINGS.md"]}
    assert out["none"].keys() == out["torch"].keys() and len(out["torch"]) > 4
    differ = [k for k in out["torch"] if out["torch"][k] != out["none"][k]]
    assert not differ, differ


def test_no_two_test_modules_share_a_name():
    """A benchmark's spawned process imports its test module by name: a tests/test_bench_population.py beside
    tests/benchmarks/' made that process import the other file and die, and CI waited on it until killed."""
    names = [p.name for p in (ROOT / "tests").rglob("test_*.py")]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []
