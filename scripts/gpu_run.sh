#!/usr/bin/env bash
# The GPU figures in results/kernels/gpu/: the kernel tests at full size on CUDA, then the
# benchmarks, on a CUDA machine whose python3 already holds torch and triton.
#
#   bash scripts/gpu_run.sh tests   [OUTDIR]   # kernel, log-prob and property tests on the GPU
#   bash scripts/gpu_run.sh bench   [OUTDIR]   # log-prob, loss and memory benchmarks -> benchmark.json
#   bash scripts/gpu_run.sh step    [OUTDIR]   # the full-size GRPO step -> lm_step.json
#
# TRL and Liger are the peers' own code: install trl==1.16.0 and liger-kernel==0.8.5 first
# (pip install trl==1.16.0 liger-kernel==0.8.5), or their rows skip with that reason.
set -uo pipefail
stage=${1:?tests, bench or step}
out=${2:-results/kernels/gpu}
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py=${PYTHON:-python3}

{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv
  $py -c "import torch, triton; print('torch', torch.__version__, '| triton', triton.__version__, '| cuda', torch.version.cuda)"
  $py -c "import trl, liger_kernel; print('trl', trl.__version__, '| liger-kernel', __import__('importlib.metadata').metadata.version('liger-kernel'))" 2>&1 | tail -1
} > "$out/device.txt"
cat "$out/device.txt"

case $stage in
  tests)
    $py -m pytest -q -p no:cacheprovider -rs tests/test_kernels_logprob.py tests/test_kernels_loss.py \
      tests/test_kernels_linear.py tests/test_logprobs.py tests/test_properties.py tests/test_arithmetic_fused.py \
      tests/benchmarks 2>&1 | tee "$out/tests.log" ;;
  bench)
    $py -m pytest -q -p no:cacheprovider -rs tests/benchmarks/test_bench_logprobs.py tests/benchmarks/test_bench_loss.py \
      tests/benchmarks/test_bench_memory.py --benchmark-only --benchmark-json="$out/benchmark.json" 2>&1 | tee "$out/bench.log" ;;
  step)
    $py -m pytest -q -p no:cacheprovider -rs tests/benchmarks/test_bench_lm_step.py --benchmark-only \
      --benchmark-json="$out/lm_step.json" 2>&1 | tee "$out/step.log" ;;
  *) echo "unknown stage '$stage': valid: tests, bench, step" >&2; exit 2 ;;
esac
