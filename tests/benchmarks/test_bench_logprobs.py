"""Selected-token log-prob, forward and forward+backward, against the real peers.

Providers (skipped with a reason where they cannot run):
    naive      log_softmax(logits.float()).gather(label): token_logprobs(backend="torch")
    chunked    token_logprobs(backend="chunked"), the CPU path
    trl        TRL's own trl.trainer.utils.selective_log_softmax (trl==1.16.0, the dev extra) on
               GRPO's (B, L, V) logits, as its trainer calls it: on CPU a loop over dim 0 (fp32:
               gather - logsumexp; bf16: log_softmax), on CUDA TRL's own Triton kernel
    trl_rows   the same TRL function handed the flattened (N, V) logits: one logsumexp per token,
               the most favourable way to call it on CPU; fp32 forward at V = 50,257 only
    compile    torch.compile of the naive function (compile time in extra_info)
    triton     token_logprobs(backend="triton")
    liger      Liger-Kernel's own fused_selective_log_softmax (its GRPO log-prob; forward only,
               it runs under no_grad); it reads logits (B, L+1, V), the last row unused
    liger_ce   Liger-Kernel's LigerCrossEntropyLoss(reduction="none") = -log p, with its backward
    bound      x.sum() over the same logits (forward), plus x * 0.5 (forward+backward): one read of
               the logits (and one write of a logits-sized gradient), the machine's memory bound
Triton providers (triton, liger*) time only on CUDA; in the smoke run they run in Triton's
interpreter, which checks the wiring but says nothing about speed. Every provider but bound
is checked before it is timed against an fp64 reference written here (log p = x_y - logsumexp x,
d/dx sum(g log p) = g (onehot(y) - softmax x)): values on every row, gradients on a fixed
set of rows. Logits come in as (N / 512, 512, V): GRPO's (responses, tokens, vocab).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import pytest
import torch

from grpo_bench.numerics.logprobs import token_logprobs

VOCABS = {50_257: "gpt2", 151_936: "qwen"}
SEQ = 512
CHECK_ROWS = 64  # gradient rows compared with the fp64 reference, first and last included


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


PROVIDERS = ["naive", "chunked", "trl", "trl_rows", "compile", "triton", "liger", "liger_ce", "bound"]
TRITON = {"triton", "liger", "liger_ce"}


def applies(p: str, mode: str, v: int, dtype, full: bool) -> bool:
    if p == "liger":
        return mode == "fwd"  # no backward: Liger runs it under no_grad
    if p == "trl_rows":  # thousands of tiny ops a call: only where the goal compares against it
        return mode == "fwd" and dtype == torch.float32 and (v == 50_257 or not full)
    return True


def cases(full: bool, device: str) -> dict[str, list[Case]]:
    f32, bf16 = torch.float32, torch.bfloat16
    if not full:  # smoke: tiny, every provider but torch.compile (tens of seconds to compile)
        sizes = [("fwd", 8, 97, f32), ("fwd", 8, 97, bf16), ("fwd+bwd", 8, 97, f32)]
        providers = [p for p in PROVIDERS if p != "compile"]
    elif device == "cuda":
        sizes = [("fwd", 16384, 50_257, bf16), ("fwd", 16384, 151_936, bf16), ("fwd", 8192, 50_257, f32),
                 ("fwd", 8192, 151_936, f32), ("fwd+bwd", 16384, 50_257, bf16), ("fwd+bwd", 16384, 151_936, bf16)]
        providers = PROVIDERS
    else:  # CPU, sized for a few minutes on 2 cores; N=4096, V=50,257 fp32 is the goal's case
        sizes = [("fwd", 4096, 50_257, f32), ("fwd", 1024, 151_936, f32),
                 ("fwd+bwd", 1024, 50_257, f32), ("fwd+bwd", 512, 151_936, f32)]
        providers = PROVIDERS
    out = {"fwd_case": [], "fwdbwd_case": [], "fwd_config_case": fwd_config_cases(full, device)}
    for mode, n, v, dtype in sizes:
        for p in providers:
            if applies(p, mode, v, dtype, full):
                out["fwd_case" if mode == "fwd" else "fwdbwd_case"].append(Case(mode, p, n, v, dtype))
    return out


@dataclass(frozen=True)
class ConfigCase:
    case: Case
    cfg: tuple  # (BLOCK_V, num_warps, num_stages, tile-reduce), as kernels/logprob.FWD_CONFIGS

    @property
    def id(self) -> str:
        return f"{self.case.id}-" + "-".join(map(str, self.cfg))


def fwd_config_cases(full: bool, device: str) -> list[ConfigCase]:
    try:
        from grpo_bench.numerics.kernels.logprob import FWD_CONFIGS
    except ImportError:  # no Triton: nothing to sweep
        return []
    if not full:  # smoke: the test's wiring in the interpreter, one configuration of each scheme
        return [ConfigCase(Case("fwd", "triton", 8, 97, torch.float32), c) for c in (FWD_CONFIGS[1], FWD_CONFIGS[3])]
    if device != "cuda":
        return []
    return [ConfigCase(Case("fwd", "triton", 16384, v, torch.bfloat16), cfg) for v in VOCABS for cfg in FWD_CONFIGS]


def _naive(x, y):
    return token_logprobs(x, y, backend="torch")[0]


_COMPILED = {}


def _trl():
    try:
        from trl.trainer.utils import selective_log_softmax
    except ImportError:
        pytest.skip("trl is not installed (the dev extra pins trl==1.16.0: pip install -e '.[dev]')")
    return selective_log_softmax


def _liger(module: str):
    try:
        return __import__(module, fromlist=["_"])
    except ImportError:
        pytest.skip("liger-kernel is not installed (pip install liger-kernel)")


def provider(name: str, device: str, full: bool):
    """The function (logits (B, L, V), labels (B, L)) -> log p (B, L) (bound: anything), or pytest.skip."""
    if name in TRITON and device != "cuda" and full:
        pytest.skip(f"{name} is a Triton kernel: off-GPU it runs only in Triton's interpreter, whose timings "
                    "mean nothing (the smoke run checks it there)")
    if name == "naive":
        return _naive
    if name == "chunked":
        return lambda x, y: token_logprobs(x, y, backend="chunked")[0]
    if name == "trl":
        return _trl()
    if name == "trl_rows":
        fn = _trl()
        return lambda x, y: fn(x.reshape(-1, x.shape[-1]), y.reshape(-1)).view(y.shape)
    if name == "compile":
        if "fn" not in _COMPILED:
            _COMPILED["fn"] = torch.compile(_naive, dynamic=False)
        return _COMPILED["fn"]
    if name == "triton":
        return lambda x, y: token_logprobs(x, y, backend="triton")[0]
    if name == "liger":
        fn = _liger("liger_kernel.ops.grpo_loss").fused_selective_log_softmax
        # x is the padded (B, L+1, V) copy made by inputs(); temperature defaults to 0.9 there
        return lambda xp, y: fn(xp, y, temperature=1.0)
    if name == "liger_ce":
        ce = _liger("liger_kernel.transformers").LigerCrossEntropyLoss(reduction="none")
        return lambda x, y: -ce(x.reshape(-1, x.shape[-1]), y.reshape(-1)).view(y.shape)
    if name == "bound":
        return lambda x, y: x.sum()
    raise ValueError(name)


def reference(x: torch.Tensor, y: torch.Tensor, g: torch.Tensor, rows: torch.Tensor, chunk: int = 256):
    """fp64 log p of every row and d/dx sum(g * log p) on `rows`, by the closed forms, chunked over rows."""
    xf, yf, gf = x.detach().reshape(-1, x.shape[-1]), y.reshape(-1), g.reshape(-1)
    logp = torch.empty(len(yf), dtype=torch.float64, device=x.device)
    for s in range(0, len(yf), chunk):
        xs = xf[s:s + chunk].double()
        logp[s:s + chunk] = xs.gather(1, yf[s:s + chunk, None])[:, 0] - torch.logsumexp(xs, -1)
    xr = xf[rows].double()
    grad = -torch.softmax(xr, -1)
    grad[torch.arange(len(rows), device=x.device), yf[rows]] += 1.0
    return logp.view(y.shape), grad * gf[rows, None].double()


_INPUTS: dict = {}


def inputs(case: Case, device: str):
    """logits (B, L, V), labels, upstream gradient, checked rows and the fp64 reference, cached per size."""
    key = (case.n, case.v, case.dtype, case.mode)
    if key not in _INPUTS:
        _INPUTS.clear()  # one size at a time: the logits alone can be a few GB
        gen = torch.Generator(device).manual_seed(0)
        b, l = (max(1, case.n // SEQ), min(case.n, SEQ))
        x = (2 * torch.randn(b, l, case.v, generator=gen, device=device, dtype=torch.float32)).to(case.dtype)
        y = torch.randint(0, case.v, (b, l), generator=gen, device=device)
        g = torch.randn(b, l, generator=gen, device=device, dtype=torch.float32)
        rows = torch.unique(torch.cat([torch.tensor([0, case.n - 1]),
                                       torch.randint(0, case.n, (CHECK_ROWS,), generator=torch.Generator().manual_seed(1))]))
        rows = rows.to(device)
        ref = reference(x, y, g, rows)
        _INPUTS[key] = (x.requires_grad_(case.mode == "fwd+bwd"), y, g, rows, ref)
    return _INPUTS[key]


def tolerance(case: Case) -> dict:
    if case.dtype == torch.float32:
        return dict(rtol=1e-5, atol=1e-4)
    # bf16 logits are exact in fp64; TRL's bf16 path does its log_softmax in bf16 and Liger's
    # cross entropy returns bf16, so those two round to bf16's 8 bits
    return dict(rtol=2e-2, atol=1e-1) if case.provider in ("trl", "liger_ce") else dict(rtol=1e-4, atol=1e-3)


def check(case: Case, fn, x, y, g, rows, ref) -> None:
    """The provider's values (every row) and, for fwd+bwd, its gradient (CHECK_ROWS rows) vs fp64."""
    ref_logp, ref_grad = ref
    if case.provider == "liger":
        with torch.no_grad():
            out = fn(_padded(x), y)
    elif case.mode == "fwd":
        with torch.no_grad():
            out = fn(x, y)
    else:
        out = fn(x, y)
        (grad,) = torch.autograd.grad(out, x, g.to(out.dtype))
        grad = grad.reshape(-1, x.shape[-1])[rows].double()
        gtol = dict(rtol=1e-4, atol=1e-6) if case.dtype == torch.float32 else \
            dict(rtol=2e-2, atol=1e-2 * ref_grad.abs().max().item())
        torch.testing.assert_close(grad, ref_grad, **gtol, msg=lambda m: f"{case.id} gradient: {m}")
    torch.testing.assert_close(out.detach().double(), ref_logp, **tolerance(case),
                               msg=lambda m: f"{case.id} log p: {m}")


def _padded(x):
    # Liger's kernel takes causal-LM logits (B, L+1, V) and skips the last position
    key = ("padded", x.data_ptr())
    if key not in _INPUTS:
        _INPUTS[key] = torch.cat([x.detach(), x.detach()[:, :1]], dim=1).contiguous()
    return _INPUTS[key]


def run_case(bench, case: Case, device: str):
    fn = provider(case.provider, device, bench.full)
    x, y, g, rows, ref = inputs(case, device)
    t0 = time.perf_counter()
    if case.provider != "bound":
        try:
            check(case, fn, x, y, g, rows, ref)  # compiles outside the timing
        except Exception as e:  # noqa: BLE001 - torch.compile without a working toolchain is skipped
            if case.provider != "compile" or isinstance(e, AssertionError):
                raise
            pytest.skip(f"torch.compile failed here: {type(e).__name__}: {e}"[:300])
    compile_s = time.perf_counter() - t0
    if case.provider == "liger":
        xp = _padded(x)

        def step():
            return fn(xp, y)
    elif case.provider == "bound" and case.mode == "fwd+bwd":
        def step():  # read the logits twice, write a logits-sized tensor once
            with torch.no_grad():
                return x.sum(), torch.mul(x, 0.5)
    elif case.mode == "fwd":
        def step():
            with torch.no_grad():
                return fn(x, y)
    else:
        def step():
            out = fn(x, y)
            return torch.autograd.grad(out, x, g.to(out.dtype))[0]
    n, v, elt = case.n, case.v, x.element_size()
    # ideal traffic: read the logits (and labels) once, write N floats; the backward reads the
    # logits again and writes a gradient of the logits' size
    nbytes = n * v * elt + 12 * n if case.mode == "fwd" else 3 * n * v * elt + 16 * n
    extra = {"compile_s": compile_s} if case.provider == "compile" else {}
    bench.run(step, group=case.group, rows=n, nbytes=nbytes, kernel="logprob", mode=case.mode,
              provider=case.provider, n=n, v=v, dtype=case.dtype_name, **extra)
    if case.provider == "liger_ce" and case.mode == "fwd+bwd":
        _INPUTS.clear()  # Liger's cross entropy writes its gradient into the logits, in place


def test_logprob_forward(bench, fwd_case, device):
    run_case(bench, fwd_case, device)


def test_logprob_forward_backward(bench, fwdbwd_case, device):
    run_case(bench, fwdbwd_case, device)


def test_logprob_forward_config(bench, fwd_config_case, device, monkeypatch):
    """One launch configuration of the log-prob forward (kernels/logprob.FWD_CONFIGS), checked against fp64 like
    every provider, then timed beside the others; one this GPU cannot compile or launch skips with the reason."""
    case, (block, warps, stages, tile) = fwd_config_case.case, fwd_config_case.cfg
    name = f"{block}x{warps}w {stages}st" + (" tile" if tile else "")
    from grpo_bench.numerics.kernels import logprob as K
    if not K.fwd_config_valid(fwd_config_case.cfg):
        pytest.skip(f"{fwd_config_case.cfg} is not a valid configuration")
    fn = provider(case.provider, device, bench.full)
    x, y, g, rows, ref = inputs(case, device)
    monkeypatch.setenv("GRPO_BENCH_LOGPROB_FWD_CFG", f"{block},{warps},{stages},{tile}")
    try:
        with torch.no_grad():
            fn(x, y)
    except Exception as e:  # noqa: BLE001 - a configuration this GPU cannot run is a result, not a crash
        pytest.skip(f"configuration {name} failed here: {type(e).__name__}: {e}"[:300])
    check(case, fn, x, y, g, rows, ref)

    def step():
        with torch.no_grad():
            return fn(x, y)
    n = case.n
    bench.run(step, group=f"logprob fwd kernel configurations N={n} V={case.v} {case.dtype_name}", rows=n,
              nbytes=n * case.v * x.element_size() + 12 * n, kernel="logprob_config", mode="fwd",
              provider=f"ours {name}", n=n, v=case.v, dtype=case.dtype_name)


def test_reference_is_the_log_softmax_and_its_gradient():
    # the reference's closed forms against autograd through log_softmax, on one small case
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 5, 11, generator=gen, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 11, (2, 5), generator=gen)
    g = torch.randn(2, 5, generator=gen, dtype=torch.float64)
    rows = torch.tensor([0, 3, 9])
    logp, grad = reference(x, y, g, rows)
    auto = torch.log_softmax(x, -1).gather(-1, y[..., None])[..., 0]
    torch.testing.assert_close(logp, auto.detach())
    (full,) = torch.autograd.grad(auto, x, g)
    torch.testing.assert_close(grad, full.reshape(-1, 11)[rows])
    # and a hand value: uniform logits over V = 4 give log p = -log 4
    lp, _ = reference(torch.zeros(1, 1, 4), torch.tensor([[2]]), torch.ones(1, 1), torch.tensor([0]))
    assert lp.item() == pytest.approx(-1.3862943611198906)
