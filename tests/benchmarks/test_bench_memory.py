"""The peak-memory measurement the benchmarks record, and the chunked path's memory claim.

Plain tests (no benchmark fixture): they run in the normal test run, on CPU tensors.
"""
import torch

from grpo_bench.numerics.logprobs import token_logprobs


def test_cpu_measure_sees_tensors_and_temporaries(measure_peak):
    n = 3_000_000
    x = torch.ones(n, dtype=torch.float32)
    assert measure_peak(lambda: torch.empty(n, dtype=torch.float32).fill_(1), "cpu") == 4 * n
    # (x + 1) is a temporary freed before the sum returns: it still counts in the peak
    assert 4 * n <= measure_peak(lambda: (x + 1).sum(), "cpu") < 4 * n + 4096
    assert measure_peak(lambda: None, "cpu") == 0


def test_chunked_needs_under_a_tenth_of_naive_memory(measure_peak):
    n, v = 4096, 5000
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, v, generator=gen, dtype=torch.float32)
    y = torch.randint(0, v, (n,), generator=gen)
    naive = measure_peak(lambda: token_logprobs(x, y, backend="torch")[0], "cpu")
    chunked = measure_peak(lambda: token_logprobs(x, y, backend="chunked")[0], "cpu")
    assert naive >= 4 * n * v  # the (N, V) fp32 log-softmax
    assert chunked <= naive / 10
