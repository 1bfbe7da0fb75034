"""Selected-token log-prob, forward and forward+backward, across providers.

Providers (skipped with a reason where they cannot run):
    naive           log_softmax(logits.float()).gather(label): token_logprobs(backend="torch")
    chunked         token_logprobs(backend="chunked"), the CPU path
    trl_style       TRL's selective_log_softmax re-implemented (TRL is not a dependency):
                    fp32 -> gather, then one logsumexp per entry of dim 0 (a sequence, on
                    GRPO's (B, L, V) logits); bf16 -> one log_softmax per entry of dim 0
    trl_style_rows  the same function handed the flattened (N, V) logits: one logsumexp per
                    token, the most favourable way to call it; fp32 forward at V = 50,257 only
                    (the goal's comparison), as each call is thousands of small ops
    trl             the real trl.trainer.utils.selective_log_softmax, if trl is installed
    compile         torch.compile of the naive function (compile time in extra_info)
    triton          token_logprobs(backend="triton"); CUDA only
    liger           Liger-Kernel's cross entropy with reduction="none" (= -log p); CUDA only,
                    and untested here: no GPU was available when this was written
Logits come in as (N / 512, 512, V): GRPO's (responses, tokens, vocab).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import pytest
import torch

from grpo_bench.logprobs import token_logprobs

VOCABS = {50_257: "gpt2", 151_936: "qwen"}
SEQ = 512


@dataclass(frozen=True)
class Case:
    mode: str  # "fwd" or "fwd+bwd"
    provider: str
    n: int
    v: int
    dtype: torch.dtype

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    @property
    def id(self) -> str:
        return f"{self.provider}-N{self.n}-V{self.v}-{self.dtype_name}"

    @property
    def group(self) -> str:
        return f"logprob {self.mode} N={self.n} V={self.v} ({VOCABS.get(self.v, 'tiny')}) {self.dtype_name}"


PROVIDERS = ["naive", "chunked", "trl_style", "trl_style_rows", "trl", "compile", "triton", "liger"]


def cases(full: bool, device: str) -> dict[str, list[Case]]:
    f32, bf16 = torch.float32, torch.bfloat16
    if not full:  # smoke: tiny, every provider but torch.compile (tens of seconds to compile)
        sizes = [("fwd", 8, 97, f32), ("fwd", 8, 97, bf16), ("fwd+bwd", 8, 97, f32)]
        providers = [p for p in PROVIDERS if p != "compile"]
    elif device == "cuda":
        sizes = [("fwd", 16384, 50_257, bf16), ("fwd", 16384, 151_936, bf16), ("fwd", 8192, 50_257, f32),
                 ("fwd", 8192, 151_936, f32), ("fwd+bwd", 16384, 50_257, bf16), ("fwd+bwd", 16384, 151_936, bf16)]
        providers = PROVIDERS
    else:  # CPU, sized for a 3-minute run on 2 cores; N=4096, V=50,257 fp32 is the goal's case
        sizes = [("fwd", 4096, 50_257, f32), ("fwd", 1024, 151_936, f32),
                 ("fwd+bwd", 1024, 50_257, f32), ("fwd+bwd", 512, 151_936, f32)]
        providers = PROVIDERS
    out = {"fwd_case": [], "fwdbwd_case": []}
    for mode, n, v, dtype in sizes:
        for p in providers:
            # thousands of tiny ops a call: only where the goal compares against it
            if p == "trl_style_rows" and (mode != "fwd" or dtype != f32 or (full and v != 50_257)):
                continue
            out["fwd_case" if mode == "fwd" else "fwdbwd_case"].append(Case(mode, p, n, v, dtype))
    return out


def _trl_style(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    # TRL's algorithm (trl/trainer/utils.py), written out here rather than imported
    if logits.dtype in (torch.float32, torch.float64):
        selected = torch.gather(logits, dim=-1, index=index.unsqueeze(-1)).squeeze(-1)
        lse = torch.stack([torch.logsumexp(lg, dim=-1) for lg in logits])  # loop to bound memory
        return selected - lse
    out = []
    for row_logits, row_labels in zip(logits, index):  # bf16 logsumexp is inaccurate: log_softmax
        row = torch.log_softmax(row_logits, dim=-1)
        out.append(row.gather(dim=-1, index=row_labels.unsqueeze(-1)).squeeze(-1))
    return torch.stack(out)


def _naive(x, y):
    return token_logprobs(x, y, backend="torch")[0]


_COMPILED = {}


def provider(name: str, device: str, full: bool):
    """The function (logits (B, L, V), labels (B, L)) -> log p (B, L), or pytest.skip."""
    if name == "naive":
        return _naive
    if name == "chunked":
        return lambda x, y: token_logprobs(x, y, backend="chunked")[0]
    if name == "trl_style":
        return _trl_style
    if name == "trl_style_rows":
        return lambda x, y: _trl_style(x.reshape(-1, x.shape[-1]), y.reshape(-1)).view(y.shape)
    if name == "trl":
        utils = pytest.importorskip("trl.trainer.utils", reason="trl is not installed")
        return utils.selective_log_softmax
    if name == "compile":
        if "fn" not in _COMPILED:
            _COMPILED["fn"] = torch.compile(_naive, dynamic=False)
        return _COMPILED["fn"]
    if device != "cuda" and name == "liger":
        pytest.skip("liger runs on CUDA only")
    if device != "cuda" and name == "triton" and full:
        pytest.skip("triton runs on CUDA only (the interpreter, which smoke runs use, has no meaningful timings)")
    if name == "triton":
        return lambda x, y: token_logprobs(x, y, backend="triton")[0]
    if name == "liger":
        mod = pytest.importorskip("liger_kernel.transformers", reason="liger-kernel is not installed")
        ce = mod.LigerCrossEntropyLoss(reduction="none")
        return lambda x, y: -ce(x.reshape(-1, x.shape[-1]), y.reshape(-1)).view(y.shape)
    raise ValueError(name)


_INPUTS: dict = {}


def inputs(case: Case, device: str):
    """logits (B, L, V), labels, a fixed upstream gradient and the naive result, cached per size."""
    key = (case.n, case.v, case.dtype, case.mode)
    if key not in _INPUTS:
        _INPUTS.clear()  # one size at a time: the logits alone can be a few GB
        gen = torch.Generator(device).manual_seed(0)
        b, l = (max(1, case.n // SEQ), min(case.n, SEQ))
        x = (2 * torch.randn(b, l, case.v, generator=gen, device=device, dtype=torch.float32)).to(case.dtype)
        y = torch.randint(0, case.v, (b, l), generator=gen, device=device)
        g = torch.randn(b, l, generator=gen, device=device, dtype=torch.float32)
        with torch.no_grad():
            ref = _naive(x, y)
        _INPUTS[key] = (x.requires_grad_(case.mode == "fwd+bwd"), y, g, ref)
    return _INPUTS[key]


def run_case(bench, case: Case, device: str):
    fn = provider(case.provider, device, bench.full)
    x, y, g, ref = inputs(case, device)
    if case.mode == "fwd":
        def step():
            with torch.no_grad():
                return fn(x, y)
    elif case.provider == "liger":  # its backward takes a scalar upstream gradient only
        def step():
            return torch.autograd.grad(fn(x, y).sum(), x)[0]
    else:
        def step():
            return torch.autograd.grad(fn(x, y), x, g)[0]
    t0 = time.perf_counter()
    try:
        out = step()  # compiles outside the timing, and gives a result to check
    except Exception as e:  # noqa: BLE001 - torch.compile without a working toolchain is skipped
        if case.provider != "compile":
            raise
        pytest.skip(f"torch.compile failed here: {type(e).__name__}: {e}"[:300])
    compile_s = time.perf_counter() - t0
    if case.mode == "fwd":  # bf16 providers (trl_style) may do the softmax itself in bf16
        tol = dict(rtol=1e-4, atol=1e-4) if case.dtype == torch.float32 else dict(rtol=2e-2, atol=1e-1)
        torch.testing.assert_close(out.float(), ref, **tol)
    del out
    n, v, elt = case.n, case.v, x.element_size()
    # ideal traffic: read the logits (and labels) once, write N floats; the backward reads the
    # logits again and writes a gradient of the logits' size
    nbytes = n * v * elt + 12 * n if case.mode == "fwd" else 3 * n * v * elt + 16 * n
    extra = {"compile_s": compile_s} if case.provider == "compile" else {}
    bench.run(step, group=case.group, rows=n, nbytes=nbytes, kernel="logprob", mode=case.mode,
              provider=case.provider, n=n, v=v, dtype=case.dtype_name, **extra)
    if case.provider == "liger":
        _INPUTS.clear()  # Liger's cross entropy writes its gradient into the logits, in place


def test_logprob_forward(bench, fwd_case, device):
    run_case(bench, fwd_case, device)


def test_logprob_forward_backward(bench, fwdbwd_case, device):
    run_case(bench, fwdbwd_case, device)
