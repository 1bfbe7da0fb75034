"""grpo_bench/analysis/bench_report.py: the goal checks read the right rows and compare the right way."""
import json

import pytest

from grpo_bench.analysis import bench_report

GPU, CPU = "NVIDIA H100 80GB HBM3", "AMD EPYC, 2 cores, 2 torch threads"


def row(kernel, mode, provider, n, v, dtype, ms, device, gb=0.0, peak=0.0):
    group = f"{kernel} {mode} N={n} V={v} {dtype} {device[:4]}"
    return {"stats": {"rounds": 20, "min": ms / 1e3, "median": ms / 1e3, "iqr": 0.0},
            "extra_info": {"kernel": kernel, "mode": mode, "group": group, "provider": provider, "n": n, "v": v,
                           "dtype": dtype, "gb_per_s": gb, "rows_per_s": 1.0, "peak_mem_mb": peak, "device": device,
                           "torch": "2.x", "load_avg": 0.0, "omp_wait_policy": ""}}


@pytest.fixture
def report(tmp_path):
    rows = [
        # GPU forward: triton at 2,700 GB/s, bound at 2,880 -> 94% of the bound, 0.9 of 3 TB/s
        row("logprob", "fwd", "bound", 16_384, 151_936, "bfloat16", 1.0, GPU, gb=2880),
        row("logprob", "fwd", "triton", 16_384, 151_936, "bfloat16", 1.0 / 0.9375, GPU, gb=2700),
        row("logprob", "fwd", "naive", 16_384, 151_936, "bfloat16", 20.0, GPU),
        # GPU fwd+bwd: 1.25x the bound -> missed
        row("logprob", "fwd+bwd", "bound", 16_384, 50_257, "bfloat16", 2.0, GPU),
        row("logprob", "fwd+bwd", "triton", 16_384, 50_257, "bfloat16", 2.5, GPU),
        row("logprob", "fwd+bwd", "naive", 16_384, 50_257, "bfloat16", 14.0, GPU),
        # GPU loss: 4x eager, 1.1x compile's time -> met, missed
        row("grpo_loss", "fwd+bwd", "torch", 1, 1, "float32", 4.0, GPU),
        row("grpo_loss", "fwd+bwd", "compile", 1, 1, "float32", 1.0 / 1.1, GPU),
        row("grpo_loss", "fwd+bwd", "triton", 1, 1, "float32", 1.0, GPU),
        # CPU forward at the CPU goals' case: chunked 2.5x naive, half of trl's speed-up goal
        row("logprob", "fwd", "naive", 4096, 50_257, "float32", 250.0, CPU, peak=800),
        row("logprob", "fwd", "chunked", 4096, 50_257, "float32", 100.0, CPU, peak=16),
        row("logprob", "fwd", "trl", 4096, 50_257, "float32", 150.0, CPU, peak=100),
    ]
    path = tmp_path / "b.json"
    path.write_text(json.dumps({"datetime": "2026-11-22T00:00:00", "benchmarks": rows}))
    return bench_report.markdown(bench_report.load([path]))


def test_gpu_goals_read_the_gpu_rows(report):
    gpu = report.split("Goals (GPU):")[1].split("Goals")[0]
    assert "share of the measured bound: 0.938 (goal >= 0.9): **met**" in gpu
    assert "GB/s over 3.0 TB/s: 0.9 (goal >= 0.9): **met**" in gpu
    assert "triton time / three-pass bound: 1.25x (goal <= 1.2x): **missed**" in gpu
    assert "fused speed-up over eager torch: 4x (goal >= 3x): **met**" in gpu
    assert "fused time / torch.compile's: 1.1x (goal <= 1x): **missed**" in gpu
    assert "4096" not in gpu  # the CPU rows are not judged by the GPU goals


def test_cpu_goals_read_the_cpu_rows(report):
    cpu = report.split("Goals (CPU, fp32, N=4096, V=50,257, forward):")[1].split("Goals")[0]
    assert "chunked vs naive, forward speed-up: 2.5x (goal >= 2x): **met**" in cpu
    assert "chunked vs trl, forward speed-up: 1.5x (goal >= 3x): **missed**" in cpu
    assert "chunked peak extra memory / naive's: 0.02 (goal <= 0.1): **met**" in cpu
