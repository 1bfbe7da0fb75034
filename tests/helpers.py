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
