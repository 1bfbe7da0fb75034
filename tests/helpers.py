import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


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
