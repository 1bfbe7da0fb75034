"""An installed grpo_bench (not only a checkout) has every module and every task preset, and the test tools work
as pyproject.toml configures them."""
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parent.parent


def test_every_subpackage_is_declared():
    declared = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "grpo_bench").rglob("__init__.py")}
    assert found <= declared, f"add to pyproject.toml's packages: {sorted(found - declared)}"


def test_wheel_carries_the_presets_and_the_shipped_checkpoint(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path)], check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("grpo_bench-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for preset in (ROOT / "tasks").glob("*.yaml"):
        assert f"grpo_bench_tasks/{preset.name}" in names
    for f in (ROOT / "tasks").rglob("*"):
        if f.is_file() and "__pycache__" not in f.parts:
            assert f"grpo_bench_tasks/{f.relative_to(ROOT / 'tasks').as_posix()}" in names, f
    assert "grpo_bench/algos/losses.py" in names


@pytest.mark.xdist_group("probe")
def test_a_marked_test_reaches_xdist_with_its_group(request):
    """pyproject's `--dist loadgroup` sends the tests of a module that share a costly module fixture (test_ray's
    cluster and sweep, test_trl_multiprocess's trainings, test_pretrained's dequantised weights) to one worker,
    by a suffix xdist adds to each marked test's id. Under pytest 9.2, which keeps the id where xdist 3.8 does not
    write, the suffix was lost: both workers set up the Ray sweep and the TRL trainings, about 200 s each."""
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("a check of pyproject's --dist loadgroup, in one of its xdist workers")
    assert request.node.nodeid.endswith("@probe"), request.node.nodeid
