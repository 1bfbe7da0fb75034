"""GRPO loss, forward+backward, across providers.

    torch    the registry's loss, KL and aggregation composed, as the trainer does
             (grpo_loss(backend="torch"))
    compile  torch.compile of that composition (compile time in extra_info)
    triton   the fused kernel (grpo_loss(backend="triton")); CUDA only
The configuration is the common GRPO one: clipped ratio (DAPO's 0.2 / 0.28), k3 KL with
beta = 0.04, seq_mean_token_mean; logp, old, ref and mask are fp32 (B, G, T). Before it is
timed, every provider's loss and gradient are checked against that objective written out
here in fp64 (reference()), not against the registry the providers are built from. Each case
records its memory bound (loss_bytes over the session's measured copy bandwidth, see
conftest.copy_bandwidth) and the share of it each provider reaches (of_bound).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import pytest
import torch

from grpo_bench.numerics.logprobs import grpo_loss

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


def reference(logp, old, ref, deltas, mask, clip_low=0.2, clip_high=0.28, beta=0.04):
    """The GRPO objective in fp64, from the papers' formulas (PPO clip, Schulman's k3, GRPO's means)."""
    logp, old, ref, deltas, mask = (t.double() for t in (logp, old, ref, deltas, mask))
    ratio = torch.exp(logp - old)
    adv = deltas[..., None]
    surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - clip_low, 1 + clip_high) * adv)
    k3 = torch.exp(ref - logp) - (ref - logp) - 1  # KL(pi || ref) estimate, >= 0
    per_token = -surrogate + beta * k3
    per_seq = (per_token * mask).sum(-1) / mask.sum(-1)  # every response has >= 1 token here
    return per_seq.mean()


def loss_bytes(b: int, g: int, t: int, unmasked: int) -> int:
    """Bytes the loss and its gradient must move: logp, old and ref (fp32) of each unmasked token read
    once, every token's mask read and its gradient written (fp32), one advantage per response, the loss."""
    n = b * g * t
    return 12 * unmasked + 8 * n + 4 * b * g + 4


def test_loss_bytes_by_hand():
    # 1 x 2 responses of 4 tokens, 5 unmasked: 5*12 = 60 read, 8*4 = 32 mask, 8*4 = 32 gradient, 2*4 = 8, 4
    assert loss_bytes(1, 2, 4, 5) == 60 + 32 + 32 + 8 + 4 == 136


def test_reference_by_hand():
    # one response of two tokens: ratio e^0.5 is clipped at 1.28 for a positive advantage,
    # ratio e^-0.5 is not clipped (min picks the unclipped, smaller term); k3 from log r by hand
    f64 = dict(dtype=torch.float64)
    logp, old, ref = (torch.tensor([[v]], **f64) for v in ([0.0, -1.0], [-0.5, -0.5], [0.0, -0.8]))
    value = reference(logp, old, ref, torch.tensor([[2.0]], **f64), torch.ones(1, 1, 2, **f64))
    k3_second = math.exp(0.2) - 0.2 - 1
    expected = (-(1.28 * 2) + (-(math.exp(-0.5) * 2) + 0.04 * k3_second)) / 2
    assert value.item() == pytest.approx(expected, rel=1e-12)


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
    x = logp.detach().double().requires_grad_()
    expected = reference(x, *rest)
    (expected_grad,) = torch.autograd.grad(expected, x)
    torch.testing.assert_close(fn(logp.detach(), *rest).double(), expected.detach(), rtol=1e-5, atol=1e-7)
    # A ratio within fp32 rounding of a clip bound may land on the other side of it in fp32 than
    # in fp64, which switches its token's gradient between clipped and not: those few tokens are
    # left out (4M tokens on the GPU give a handful), every other token must match.
    ratio = torch.exp(x.detach() - rest[0].double())
    low, high = 1 - CONFIG["loss"]["clip_low"], 1 + CONFIG["loss"]["clip_high"]
    edge = ((ratio - low).abs() < 1e-6) | ((ratio - high).abs() < 1e-6)
    assert edge.sum() <= 1e-5 * edge.numel()
    torch.testing.assert_close(grad.double()[~edge], expected_grad[~edge], rtol=1e-4, atol=1e-9)
    tokens = case.b * case.g * case.t
    # ideal traffic: logp, old, ref, mask read by the forward and again by the backward, one
    # gradient written
    nbytes = 9 * 4 * tokens
    extra = {"compile_s": compile_s} if case.provider == "compile" else {}
    bounds = {"bound": loss_bytes(case.b, case.g, case.t, int((rest[-1] > 0).sum()))}
    bench.run(step, group=case.group, rows=tokens, nbytes=nbytes, bounds=bounds, kernel="grpo_loss", mode="fwd+bwd",
              provider=case.provider, n=tokens, b=case.b, g=case.g, t=case.t, dtype="float32", **extra)
