"""GRPO loss, forward+backward, across providers.

    torch    the registry's loss, KL and aggregation composed, as the trainer does
             (grpo_loss(backend="torch"))
    compile  torch.compile of that composition (compile time in extra_info)
    triton   the fused kernel (grpo_loss(backend="triton")); CUDA only
The configuration is the common GRPO one: clipped ratio (DAPO's 0.2 / 0.28), k3 KL with
beta = 0.04, seq_mean_token_mean; logp, old, ref and mask are fp32 (B, G, T).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import pytest
import torch

from grpo_bench.logprobs import grpo_loss

CONFIG = dict(loss={"name": "clipped", "clip_low": 0.2, "clip_high": 0.28}, kl="k3", kl_coef=0.04,
              aggregate="seq_mean_token_mean")


@dataclass(frozen=True)
class Case:
    provider: str
    b: int
    g: int
    t: int

    @property
    def id(self) -> str:
        return f"{self.provider}-{self.b}x{self.g}x{self.t}"

    @property
    def group(self) -> str:
        return f"loss fwd+bwd B={self.b} G={self.g} T={self.t} fp32"


def cases(full: bool, device: str) -> dict[str, list[Case]]:
    if not full:
        sizes, providers = [(2, 3, 17)], ["torch", "triton"]
    elif device == "cuda":
        sizes, providers = [(64, 16, 4096), (64, 16, 16384)], ["torch", "compile", "triton"]
    else:
        sizes, providers = [(16, 8, 1024)], ["torch", "compile", "triton"]
    return {"loss_case": [Case(p, *s) for s in sizes for p in providers]}


def _torch(*args):
    return grpo_loss(*args, backend="torch", **CONFIG)[0]


_COMPILED = {}


def provider(name: str, device: str, full: bool):
    if name == "torch":
        return _torch
    if name == "compile":
        return _COMPILED.setdefault("fn", torch.compile(_torch, dynamic=False))
    if device != "cuda" and full:
        pytest.skip("triton runs on CUDA only (the interpreter, which smoke runs use, has no meaningful timings)")
    return lambda *args: grpo_loss(*args, backend="triton", **CONFIG)[0]


def inputs(case: Case, device: str):
    gen = torch.Generator(device).manual_seed(0)
    shape = (case.b, case.g, case.t)
    f32 = torch.float32
    logp = -3 * torch.rand(shape, generator=gen, device=device, dtype=f32)
    old = logp + 0.2 * torch.randn(shape, generator=gen, device=device, dtype=f32)
    ref = logp + 0.2 * torch.randn(shape, generator=gen, device=device, dtype=f32)
    deltas = torch.randn(case.b, case.g, generator=gen, device=device, dtype=f32)
    lengths = torch.randint(1, case.t + 1, (case.b, case.g), generator=gen, device=device)
    mask = (torch.arange(case.t, device=device) < lengths.unsqueeze(-1)).float()
    return logp.requires_grad_(), old, ref, deltas, mask


def test_loss_forward_backward(bench, loss_case, device):
    case = loss_case
    fn = provider(case.provider, device, bench.full)
    logp, *rest = inputs(case, device)

    def step():
        return torch.autograd.grad(fn(logp, *rest), logp)[0]

    t0 = time.perf_counter()
    try:
        grad = step()
    except Exception as e:  # noqa: BLE001 - torch.compile without a working toolchain is skipped
        if case.provider != "compile":
            raise
        pytest.skip(f"torch.compile failed here: {type(e).__name__}: {e}"[:300])
    compile_s = time.perf_counter() - t0
    torch.testing.assert_close(grad, torch.autograd.grad(_torch(logp, *rest), logp)[0], rtol=1e-4, atol=1e-7)
    tokens = case.b * case.g * case.t
    # ideal traffic: logp, old, ref, mask read by the forward and again by the backward, one
    # gradient written
    nbytes = 9 * 4 * tokens
    extra = {"compile_s": compile_s} if case.provider == "compile" else {}
    bench.run(step, group=case.group, rows=tokens, nbytes=nbytes, kernel="grpo_loss", mode="fwd+bwd",
              provider=case.provider, n=tokens, b=case.b, g=case.g, t=case.t, dtype="float32", **extra)
