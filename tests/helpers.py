import importlib
import os
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# distributions whose import name is not theirs with - as _
IMPORT_NAMES = {"mlflow-skinny": "mlflow", "pyyaml": "yaml", "pillow": "PIL", "scikit-learn": "sklearn"}
HIDE_ENV = "GRPO_BENCH_HIDE_EXTRA"   # conftest makes these extras' modules unimportable (extra,extra,...)


@lru_cache(maxsize=1)
def extras() -> dict[str, tuple[str, ...]]:
    """Each optional extra of pyproject.toml but `dev` (the suite's own) -> the modules it installs."""
    # read by pattern, not tomllib: the suite runs on Python 3.10 too
    text = (ROOT / "pyproject.toml").read_text().split("[project.optional-dependencies]")[1].split("\n[")[0]
    text = "\n".join(line for line in text.splitlines() if not line.strip().startswith("#"))
    out = {}
    for extra, body in re.findall(r"^([\w-]+)\s*=\s*\[(.*?)\]", text, re.M | re.S):
        if extra != "dev":
            reqs = re.findall(r'"([^"]+)"', body)
            names = [re.split(r"[<>=!~\[;@ ]", r, maxsplit=1)[0].strip().lower() for r in reqs]
            out[extra] = tuple(IMPORT_NAMES.get(n, n.replace("-", "_")) for n in names)
    return out


def needs(extra: str):
    """Skip the calling test (at a module's top: the module) where an extra is not installed, with the reason
    and the command that installs it; else the extra's first module."""
    import pytest

    mods = []
    for name in extras()[extra]:
        try:
            mods.append(importlib.import_module(name))
        except ImportError:
            pytest.skip(f"needs the {extra} extra, pip install -e '.[{extra}]' ({name} is not installed)",
                        allow_module_level=True)
    return mods[0]


def installed(extra: str) -> bool:
    try:
        for name in extras()[extra]:
            importlib.import_module(name)
    except ImportError:
        return False
    return True


def hide_extra(extra: str) -> None:
    """This process as where `extra` is not installed: its modules neither import nor are found."""
    for name in extras()[extra]:
        sys.modules[name] = None


def cli(*args, cwd=None, timeout=300, **popen):
    """Run `python -m grpo_bench ARGS` as a user would; returns the CompletedProcess."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), TQDM_DISABLE="1")
    return subprocess.run([sys.executable, "-m", "grpo_bench", *map(str, args)], cwd=cwd or ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout, **popen)


def cpu_allocations(fn) -> list[tuple[int, int]]:
    """(bytes, allocator's running total) of every CPU allocation and free (bytes < 0) that fn()
    makes, in time order, from torch.profiler's allocator hook: every tensor and ATen temporary,
    not the Python heap. fn's result is dropped inside the window, so its frees are seen too."""
    import json
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
        del out
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    mem = sorted((e for e in events if e.get("name") == "[memory]" and e["args"].get("Device Type") == 0),
                 key=lambda e: e["ts"])
    return [(e["args"]["Bytes"], e["args"]["Total Allocated"]) for e in mem]


def close(a, b, **kw):
    """fp64 equality to 1e-12 unless told otherwise: the parts' formula tests."""
    import torch
    torch.testing.assert_close(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64),
                               **({"rtol": 1e-12, "atol": 1e-12} | kw))


def rand_batch(b=3, g=4, t=6, seed=0, spread=0.3, mismatch_=0.2):
    """logp, old, sampler log-probs (B, G, T), deltas (B, G) and a ragged mask, in the default dtype."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    logp = -3 * torch.rand(b, g, t, generator=gen)
    old = logp + spread * torch.randn(b, g, t, generator=gen)
    sampler = old + mismatch_ * torch.randn(b, g, t, generator=gen)
    lengths = torch.randint(1, t + 1, (b, g), generator=gen)
    mask = (torch.arange(t) < lengths.unsqueeze(-1)).double()
    deltas = torch.randn(b, g, generator=gen)
    return logp, old, sampler, deltas, mask
