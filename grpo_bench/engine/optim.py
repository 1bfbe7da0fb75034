"""Optimisers and gradient clipping over parameters stacked on a leading population axis.

Adam, AdamW and SGD are elementwise, so one optimiser over (P, ...) parameters is P
independent ones; what a member may have of its own is its learning rate, weight decay and
clipping norm. tests/test_population.py holds the update to torch.optim.Adam / AdamW / SGD
(fused=True) run on each member alone, to the bit. Clipping is per member: each
member's own global norm over its own parameters, as torch.nn.utils.clip_grad_norm_.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from ..numerics import rng

OPTIMIZERS = ("adam", "adamw", "sgd")


class StackedOptimizer:
    """Adam, AdamW (decoupled decay) or SGD (no momentum) over stacked parameters, per-member lr and decay.

    Members are grouped by their (lr, weight decay); a group's slices of every parameter go
    through torch's fused single-pass kernel (the one torch.optim.Adam(fused=True) runs) in one
    call. On the CPU a slice is one member, so each member's tensors are those it has alone:
    equal to the bit to torch.optim.<Optimizer>(fused=True) on that member alone
    (tests/test_population.py). On a GPU (rng.device_paths) a slice is a run of consecutive
    members: a population of one lr is one slice per parameter whatever P is, where one view
    per member per parameter was 12 P tensor ops a step, the pace of a large population. The
    CUDA kernel does the same arithmetic at every element, so members' numbers do not change; the
    CPU's does not quite (its vector loop and scalar tail round differently: one ulp).
    """

    def __init__(self, params: list[Tensor], kind: str, lr: list[float], weight_decay: list[float],
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        if kind not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {kind!r}; valid: {', '.join(OPTIMIZERS)}")
        self.params, self.kind, self.betas, self.eps = list(params), kind, betas, eps
        self.lr, self.weight_decay = list(lr), list(weight_decay)
        adam = kind in ("adam", "adamw")
        self.exp_avg = [torch.zeros_like(p) for p in self.params] if adam else []
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params] if adam else []
        # the kernel reads the step from a device tensor: counted there in place, never copied from the host
        self.step_tensor = torch.zeros((), device=self.params[0].device) if self.params else None
        self._groups = None

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def groups(self) -> list[tuple[float, float, list[slice]]]:
        """(lr, weight decay, the slices of members it updates): one slice per member on the CPU, one per
        run of consecutive members sharing both on a device. Computed once: the members change only in keep()."""
        if self._groups is not None:
            return self._groups
        batched = bool(self.params) and rng.device_paths(self.params[0].device)
        out: dict[tuple[float, float], list[slice]] = {}
        last = None
        for i, key in enumerate(zip(self.lr, self.weight_decay)):
            slices = out.setdefault(key, [])
            if batched and key == last:
                slices[-1] = slice(slices[-1].start, i + 1)
            else:
                slices.append(slice(i, i + 1))
            last = key
        self._groups = [(*key, slices) for key, slices in out.items()]
        return self._groups

    @torch.no_grad()
    def step(self) -> None:
        if self.step_tensor is not None:
            self.step_tensor.add_(1.0)  # exact: a float32 counts to 2**24
        live = [j for j, p in enumerate(self.params) if p.grad is not None]
        for lr, wd, members in self.groups():
            pick = lambda ts: [t[m] for m in members for t in ts]  # noqa: E731
            views, grads = pick([self.params[j] for j in live]), pick([self.params[j].grad for j in live])
            if self.kind == "sgd":
                # no momentum, so no buffers: every step is like the first (torch reads is_first_step for buffers only)
                torch._fused_sgd_(views, grads, [], weight_decay=wd, momentum=0.0, lr=lr, dampening=0.0,
                                  nesterov=False, maximize=False, is_first_step=False)
                continue
            fused = torch._fused_adamw_ if self.kind == "adamw" else torch._fused_adam_
            fused(views, grads, pick([self.exp_avg[j] for j in live]), pick([self.exp_avg_sq[j] for j in live]), [],
                  [self.step_tensor] * len(views), lr=lr, beta1=self.betas[0], beta2=self.betas[1],
                  weight_decay=wd, eps=self.eps, amsgrad=False, maximize=False)

    def keep(self, idx: list[int]) -> None:
        """Only the members at idx go on (the others failed); rebind() then takes the narrowed parameters."""
        self._groups = None
        self.lr = [self.lr[i] for i in idx]
        self.weight_decay = [self.weight_decay[i] for i in idx]
        self.exp_avg = [s[idx] for s in self.exp_avg]
        self.exp_avg_sq = [s[idx] for s in self.exp_avg_sq]

    def rebind(self, params: list[Tensor]) -> None:
        self.params = list(params)


@torch.no_grad()
def clip_limits(max_norm: list[float], device=None) -> Tensor:
    """The (P,) norms clip_grad_norm clips to (inf: no clipping), built once: a step copies nothing from the host."""
    return torch.tensor([m if m > 0 else math.inf for m in max_norm], device=device)


@torch.no_grad()
def clip_grad_norm(params: list[Tensor], max_norm: list[float] | Tensor) -> Tensor:
    """Each member's global gradient norm (P,), before clipping; grads scaled in place to at most max_norm (0 = no
    clip), given as a list or as clip_limits(max_norm)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(len(max_norm))
    norms = torch.stack([torch.linalg.vector_norm(g.flatten(1), 2, dim=1) for g in grads], dim=1)  # (P, n_params)
    total = torch.linalg.vector_norm(norms, 2, dim=1)                                                 # (P,)
    limit = (max_norm if isinstance(max_norm, Tensor) else clip_limits(max_norm, total.device)).to(total.dtype)
    coef = (limit / (total + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(coef.view(-1, *[1] * (g.dim() - 1)))
    return total
