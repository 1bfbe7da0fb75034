"""The GRPO hot path from the model's output to the gradient, against the peers' own fused code.

Two groups, forward+backward, bf16 inputs:

logits -> loss: (B*G, T, V) logits to the GRPO loss (clipped 0.2 / 0.28, k3 KL at beta 0.04,
seq_mean_token_mean, temperature 1) and its gradient on the logits.
    torch     token_logprobs(backend="torch") then grpo_loss(backend="torch")
    compile   torch.compile of that composition
    ours      grpo_loss_from_logits(backend="triton"): one kernel reads each unmasked row for its
              log-sum-exp and at once for its gradient, written in the forward (kernels/logits_loss.py)
    trl       TRL 1.16's own Triton kernel, trl.kernels.selective_log_softmax_and_entropy (it
              returns the entropy too), then the same torch loss
    liger     Liger-Kernel 0.8.5's fused GRPO loss, liger_kernel.transformers.grpo_loss.triton_grpo_loss
              with loss_type="grpo" (per-response token mean, then the batch mean: our
              seq_mean_token_mean), reduce=True, inplace=False so the timed logits stay intact

hidden -> log p: the LM head fused with the log-prob, (N, H) hidden states and a (V, H) head,
no (N, V) logits held.
    materialised  hidden @ W^T, fp32 log_softmax, gather
    ours          linear_logprobs(backend="triton") (CUDA) / "chunked" (CPU)
    ours:NAME     the same tiled schedule under another entry of kernels/head.py's tuning table
                  (CONFIGS), timed beside it so one GPU run picks the default
    trl           TRL 1.16's trl.kernels.ChunkedLogProbFunction (cuBLAS tiles folded by its own
                  Triton kernel; no optional outputs asked for; its trainer's vocabulary tile)
    liger         Liger's LigerFusedLinearCrossEntropyLoss(reduction="none") = -log p

Every provider is checked before it is timed against fp64 written here: the loss from
log_softmax in fp64 and the objective of tests/benchmarks/test_bench_loss.reference (the
papers' formulas), its gradient on a fixed set of rows by the chain rule
dL/dx = dL/dlogp (onehot - softmax x); the head's log p on every row against fp64 logits.
A plain pytest run calls every provider once at tiny sizes (Triton in its interpreter).

Each logits -> loss case records its memory bounds (hot_path_bytes over the copy bandwidth
measured in the same session, conftest.copy_bandwidth): `bound`, the unmasked rows' logits
read once (what a kernel that keeps a row on chip would move), and `bound2`, read twice (a
log-sum-exp pass, then a gradient pass: what every provider here does); of_bound and
of_bound2 are the shares of them each provider reaches. test_logits_loss_config times the
kernel's launch configurations (kernels/logits_loss.CONFIGS) on the same cases, after the
providers (a run stopped at its budget keeps the comparison).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import pytest
import torch

from benchmarks.test_bench_loss import CONFIG, reference as loss_reference
from grpo_bench.numerics.logprobs import grpo_loss, grpo_loss_from_logits, linear_logprobs, token_logprobs

VOCABS = {50_257: "gpt2", 151_936: "qwen"}
TRITON = {"ours", "trl", "liger"}


def _head_candidates() -> list[str]:
    """ours:NAME for every non-default entry of the fused head's tuning table (none without Triton)."""
    try:
        from grpo_bench.numerics.kernels.head import CONFIGS
    except ImportError:
        return []
    return [f"ours:{name}" for name in CONFIGS if name != "default"]


@dataclass(frozen=True)
class Case:
    kind: str      # "loss" (logits -> loss) or "head" (hidden -> log p)
    provider: str
    rows: int      # B*G responses (loss) or N tokens (head)
    t: int         # tokens per response (loss); hidden width (head)
    v: int

    @property
    def id(self) -> str:
        return f"{self.kind}-{self.provider}-{self.rows}x{self.t}-V{self.v}"

    @property
    def group(self) -> str:
        name = VOCABS.get(self.v, "tiny")
        if self.kind == "loss":
            return f"logits->GRPO loss fwd+bwd {self.rows}x{self.t} V={self.v} ({name}) bf16"
        return f"fused head fwd+bwd N={self.rows} H={self.t} V={self.v} ({name}) bf16"


def cases(full: bool, device: str) -> dict[str, list[Case]]:
    if not full:
        loss = [Case("loss", p, 4, 9, 97) for p in ("torch", "ours", "trl", "liger")]
        head = [Case("head", p, 24, 16, 97) for p in ("materialised", "ours", *_head_candidates(), "trl", "liger")]
    elif device == "cuda":
        loss = [Case("loss", p, 32, 512, v) for v in VOCABS for p in ("torch", "compile", "ours", "trl", "liger")]
        head = [Case("head", p, 16384, 896, v) for v in VOCABS for p in ("materialised", "ours", "trl", "liger")]
        # the tuning candidates last: a run stopped at its budget has the comparison with the peers first
        head += [Case("head", p, 16384, 896, v) for v in VOCABS for p in _head_candidates()]
    else:  # CPU: the Triton providers skip (interpreter timings mean nothing)
        loss = [Case("loss", p, 8, 128, 50_257) for p in ("torch", "compile")]
        head = [Case("head", p, 1024, 256, 50_257) for p in ("materialised", "ours")]
    return {"step_case": loss + head, "config_case": config_cases(full, device)}


@dataclass(frozen=True)
class ConfigCase:
    case: Case
    cfg: tuple  # (BLOCK_V, num_warps, programs per SM, reverse), as kernels/logits_loss.CONFIGS

    @property
    def id(self) -> str:
        return f"{self.case.id}-" + "-".join(str(int(c)) for c in self.cfg)


def config_cases(full: bool, device: str) -> list[ConfigCase]:
    try:
        from grpo_bench.numerics.kernels.logits_loss import CONFIGS
    except ImportError:  # no Triton: nothing to sweep
        return []
    if not full:  # smoke: the test's wiring, one configuration in the interpreter
        return [ConfigCase(Case("loss", "ours", 4, 9, 97), CONFIGS[0])]
    if device != "cuda":
        return []
    return [ConfigCase(Case("loss", "ours", 32, 512, v), cfg) for v in VOCABS for cfg in CONFIGS]


def hot_path_bytes(rows: int, t: int, v: int, itemsize: int, unmasked: int, reads: int = 1) -> int:
    """Bytes logits -> GRPO loss -> d loss / d logits must move: the logits of the unmasked tokens read
    `reads` times (a masked token needs no log-prob), a gradient row written for every token (zeros
    where masked), the label (int64), old and ref log-probs (fp32) of each unmasked token, every
    token's mask (fp32), one advantage per response and the scalar loss (fp32)."""
    n = rows * t
    return reads * unmasked * v * itemsize + n * v * itemsize + 16 * unmasked + 4 * n + 4 * rows + 4


def test_hot_path_bytes_by_hand():
    # 2 responses x 3 tokens, V = 10, bf16, 4 unmasked tokens: logits 4*10*2 = 80 read once, the
    # gradient 6*10*2 = 120, labels+old+ref 4*16 = 64, mask 6*4 = 24, advantages 2*4 = 8, loss 4
    assert hot_path_bytes(2, 3, 10, 2, 4) == 80 + 120 + 64 + 24 + 8 + 4 == 300
    assert hot_path_bytes(2, 3, 10, 2, 4, reads=2) == 380


def _peer(module: str, name: str):
    try:
        return getattr(__import__(module, fromlist=[name]), name)
    except (ImportError, AttributeError) as e:
        pytest.skip(f"{module}.{name} is not importable ({e}); the dev extra pins trl==1.16.0, liger-kernel==0.8.5")


_COMPILED: dict = {}


def _loss_torch(x, y, old, ref, deltas, mask, backend="torch"):
    b, t = y.shape[0] // deltas.shape[1], y.shape[1]
    logp = token_logprobs(x, y, backend=backend)[0].view(b, -1, t)
    return grpo_loss(logp, old, ref, deltas, mask, backend=backend, **CONFIG)[0]


def loss_provider(name: str):
    """(logits (R, T, V), labels (R, T), old, ref (B, G, T), deltas (B, G), mask (B, G, T)) -> scalar loss."""
    if name == "torch":
        return _loss_torch
    if name == "compile":
        return _COMPILED.setdefault("loss", torch.compile(_loss_torch, dynamic=False))
    if name == "ours":
        def ours(x, y, old, ref, deltas, mask):
            b, g, t = old.shape
            return grpo_loss_from_logits(x.view(b, g, t, -1), y.view(b, g, t), old, ref, deltas, mask,
                                         backend="triton", **CONFIG)[0]
        return ours
    if name == "trl":
        fn = _peer("trl.kernels", "selective_log_softmax_and_entropy")

        def trl(x, y, old, ref, deltas, mask):
            logp = fn(x, y)[0].view(old.shape)
            return grpo_loss(logp, old, ref, deltas, mask, backend="torch", **CONFIG)[0]
        return trl
    if name == "liger":
        fn = _peer("liger_kernel.transformers.grpo_loss", "triton_grpo_loss")

        def liger(xp, y, old, ref, deltas, mask):
            r, t = y.shape
            loss, _ = fn(xp, old.reshape(r, t), ref.reshape(r, t), y, deltas.reshape(r), mask.reshape(r, t),
                         temperature=1.0, beta=CONFIG["kl_coef"], eps_low=CONFIG["loss"]["clip_low"],
                         eps_high=CONFIG["loss"]["clip_high"], inplace=False, loss_type="grpo", reduce=True)
            return loss
        return liger
    raise ValueError(name)


def head_provider(name: str, device: str):
    """(hidden (N, H), weight (V, H), labels (N,)) -> fp32 log p (N,)."""
    if name == "materialised":
        return lambda h, w, y: token_logprobs(h @ w.T, y, backend="torch")[0]
    if name == "ours":
        backend = "triton" if device == "cuda" or not torch.cuda.is_available() else "chunked"
        return lambda h, w, y: linear_logprobs(h, w, y, backend=backend)[0]
    if name.startswith("ours:"):
        from grpo_bench.numerics.kernels.linear import fused_linear_logprobs
        return lambda h, w, y: fused_linear_logprobs(h, w, y, use_triton=True, config=name[5:])[0]
    if name == "trl":
        fn = _peer("trl.kernels", "ChunkedLogProbFunction")
        chunk = _peer("trl.trainer.utils", "_CHUNKED_LOGPROB_CHUNK_SIZE")  # the vocabulary tile TRL's trainer uses
        return lambda h, w, y: fn.apply(h, w, None, y, 1.0, chunk, None, 1.0, ())[0]
    if name == "liger":
        flce = _peer("liger_kernel.transformers", "LigerFusedLinearCrossEntropyLoss")(reduction="none")
        return lambda h, w, y: -flce(w, h, y)
    raise ValueError(name)


def _fp64_logp(x: torch.Tensor, y: torch.Tensor, chunk: int = 1024):
    """fp64 log p(y) and softmax rows, chunked: the full fp64 logits would not fit beside the inputs."""
    xf, yf = x.detach().reshape(-1, x.shape[-1]), y.reshape(-1)
    out = torch.empty(len(yf), dtype=torch.float64, device=x.device)
    for s in range(0, len(yf), chunk):
        xs = xf[s:s + chunk].double()
        out[s:s + chunk] = xs.gather(1, yf[s:s + chunk, None])[:, 0] - torch.logsumexp(xs, -1)
    return out.view(y.shape)


def loss_inputs(case: Case, device: str):
    gen = torch.Generator(device).manual_seed(0)
    g = 8 if case.rows % 8 == 0 else case.rows
    b, t, v = case.rows // g, case.t, case.v
    x = (2 * torch.randn(case.rows, t, v, generator=gen, device=device)).to(torch.bfloat16)
    y = torch.randint(0, v, (case.rows, t), generator=gen, device=device)
    logp = _fp64_logp(x, y).view(b, g, t)
    old = (logp + 0.2 * torch.randn(logp.shape, generator=gen, device=device, dtype=torch.float64)).float()
    ref = (logp + 0.2 * torch.randn(logp.shape, generator=gen, device=device, dtype=torch.float64)).float()
    deltas = torch.randn(b, g, generator=gen, device=device)
    lengths = torch.randint(1, t + 1, (b, g), generator=gen, device=device)
    mask = (torch.arange(t, device=device) < lengths.unsqueeze(-1)).float()
    return x, y, old, ref, deltas, mask, logp


def check_loss(case: Case, fn, x, y, old, ref, deltas, mask, logp64, pad=None) -> None:
    """Loss value against fp64, and the logits gradient on 8 rows by the chain rule."""
    xin = pad if pad is not None else x
    xin = xin.detach().requires_grad_()
    value = fn(xin, y, old, ref, deltas, mask)
    (grad,) = torch.autograd.grad(value, xin)
    lp = logp64.detach().clone().requires_grad_()
    expected = loss_reference(lp, old, ref, deltas, mask)
    (dlogp,) = torch.autograd.grad(expected, lp)
    torch.testing.assert_close(value.double(), expected.detach(), rtol=2e-3, atol=2e-4,
                               msg=lambda m: f"{case.id} loss: {m}")
    rows = torch.tensor([0, case.rows * case.t // 3, case.rows * case.t - 1], device=x.device)
    xr = x.reshape(-1, case.v)[rows].double()
    want = -torch.softmax(xr, -1)
    want[torch.arange(len(rows)), y.reshape(-1)[rows]] += 1.0
    want *= dlogp.reshape(-1)[rows, None]
    got = grad[:, : case.t].reshape(-1, case.v)[rows].double()
    scale = want.abs().max().item()
    torch.testing.assert_close(got, want, rtol=3e-2, atol=2e-2 * scale, msg=lambda m: f"{case.id} grad: {m}")


def head_inputs(case: Case, device: str):
    gen = torch.Generator(device).manual_seed(0)
    n, h, v = case.rows, case.t, case.v
    hidden = torch.randn(n, h, generator=gen, device=device).to(torch.bfloat16)
    weight = (torch.randn(v, h, generator=gen, device=device) / h ** 0.5).to(torch.bfloat16)
    y = torch.randint(0, v, (n,), generator=gen, device=device)
    ref = torch.cat([torch.log_softmax(hidden[s:s + 1024].double() @ weight.double().T, -1)
                     .gather(1, y[s:s + 1024, None])[:, 0] for s in range(0, n, 1024)])
    return hidden, weight, y, ref


def test_step(bench, step_case, device):
    case = step_case
    if case.provider.split(":")[0] in TRITON and device != "cuda" and bench.full:
        pytest.skip(f"{case.provider} is a Triton kernel: off-GPU only its interpreter runs (smoke run)")
    t0 = time.perf_counter()
    if case.kind == "loss":
        fn = loss_provider(case.provider)
        x, y, old, ref, deltas, mask, logp64 = loss_inputs(case, device)
        # Liger takes causal-LM logits (R, T+1, V) and skips the last position
        xp = torch.cat([x, x[:, :1]], 1).contiguous() if case.provider == "liger" else x
        try:
            check_loss(case, fn, x, y, old, ref, deltas, mask, logp64, pad=xp if case.provider == "liger" else None)
        except Exception as e:  # noqa: BLE001 - torch.compile without a working toolchain is skipped
            if case.provider != "compile" or isinstance(e, AssertionError):
                raise
            pytest.skip(f"torch.compile failed here: {type(e).__name__}: {e}"[:300])
        xg = xp.detach().requires_grad_()

        def step():
            return torch.autograd.grad(fn(xg, y, old, ref, deltas, mask), xg)[0]
        n = case.rows * case.t
        nbytes = 3 * n * case.v * 2 + 4 * 4 * n  # logits read twice, their gradient written; old, ref, mask, logp
        unmasked = int((mask > 0).sum())
        bounds = {f"bound{'' if k == 1 else k}": hot_path_bytes(case.rows, case.t, case.v, 2, unmasked, k)
                  for k in (1, 2)}
    else:
        fn = head_provider(case.provider, device)
        hidden, weight, y, ref = head_inputs(case, device)
        h = hidden.detach().requires_grad_()
        w = weight.detach().requires_grad_()
        out = fn(h, w, y)
        torch.testing.assert_close(out.detach().double(), ref, rtol=2e-2, atol=5e-2,
                                   msg=lambda m: f"{case.id} log p: {m}")
        g = torch.randn(case.rows, generator=torch.Generator(device).manual_seed(1), device=device)

        def step():
            return torch.autograd.grad(fn(h, w, y), (h, w), g)
        n = case.rows
        nbytes = 2 * (case.rows + case.v) * case.t * 2  # read hidden and head, write both gradients
        bounds = None
    bench.run(step, group=case.group, rows=n, nbytes=nbytes, bounds=bounds, kernel=case.kind, mode="fwd+bwd",
              provider=case.provider, n=n, v=case.v, dtype="bfloat16", check_s=time.perf_counter() - t0)


_SWEEP: dict = {}  # V -> the inputs and the default configuration's loss and gradient


def test_logits_loss_config(bench, config_case, device, monkeypatch):
    """One launch configuration of the logits -> loss kernel: the same numbers as the default one
    (which test_step checks against fp64), then timed; a configuration that fails to compile or
    launch on this GPU skips with the reason, so the sweep never stops the run."""
    case, cfg = config_case.case, config_case.cfg
    from grpo_bench.numerics.kernels import logits_loss as LL
    if not LL.valid(cfg):
        pytest.skip(f"{cfg} is not a valid configuration")
    fn = loss_provider("ours")
    if case.v not in _SWEEP:
        _SWEEP.clear()
        x, y, old, ref, deltas, mask, _ = loss_inputs(case, device)
        xg = x.detach().requires_grad_()
        value = fn(xg, y, old, ref, deltas, mask)
        _SWEEP[case.v] = (x, y, old, ref, deltas, mask), value.detach(), torch.autograd.grad(value, xg)[0]
    (x, y, old, ref, deltas, mask), want, want_grad = _SWEEP[case.v]
    block, warps, per_sm, reverse = cfg
    name = f"{block}x{warps}w" + (f" {per_sm}/SM" if per_sm else "") + (" rev" if reverse else "")
    monkeypatch.setenv("GRPO_BENCH_LOGITS_LOSS_CFG", f"{block},{warps},{per_sm},{int(reverse)}")
    xg = x.detach().requires_grad_()

    def step():
        return torch.autograd.grad(fn(xg, y, old, ref, deltas, mask), xg)[0]
    try:
        value = fn(xg, y, old, ref, deltas, mask)
        grad = torch.autograd.grad(value, xg)[0]
    except Exception as e:  # noqa: BLE001 - a configuration this GPU cannot run is a result, not a crash
        pytest.skip(f"configuration {name} failed here: {type(e).__name__}: {e}"[:300])
    torch.testing.assert_close(value, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad.float(), want_grad.float(), rtol=2e-2, atol=1e-2 * want_grad.abs().max().item())
    unmasked = int((mask > 0).sum())
    bounds = {f"bound{'' if k == 1 else k}": hot_path_bytes(case.rows, case.t, case.v, 2, unmasked, k) for k in (1, 2)}
    n = case.rows * case.t
    bench.run(step, group=f"logits->GRPO loss kernel configurations {case.rows}x{case.t} V={case.v} bf16", rows=n,
              nbytes=3 * n * case.v * 2 + 16 * n, bounds=bounds, kernel="loss_config", mode="fwd+bwd",
              provider=f"ours {name}", n=n, v=case.v, dtype="bfloat16")
