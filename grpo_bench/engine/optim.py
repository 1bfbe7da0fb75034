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

OPTIMIZERS = ("adam", "adamw", "sgd")


class StackedOptimizer:
    """Adam, AdamW (decoupled decay) or SGD (no momentum) over stacked parameters, per-member lr and decay.

    Each member's slice of each parameter goes through torch's fused single-pass kernel
    (the one torch.optim.Adam(fused=True) runs), members grouped by their (lr, weight decay):
    the kernel is elementwise per tensor, so a member's update is the same whoever shares
    the call, and equal to the bit to torch.optim.<Optimizer>(fused=True) on that member alone.
    """

    def __init__(self, params: list[Tensor], kind: str, lr: list[float], weight_decay: list[float],
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        if kind not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {kind!r}; valid: {', '.join(OPTIMIZERS)}")
        self.params, self.kind, self.betas, self.eps = list(params), kind, betas, eps
        self.lr, self.weight_decay = list(lr), list(weight_decay)
        self.step_count = 0
        adam = kind in ("adam", "adamw")
        self.exp_avg = [torch.zeros_like(p) for p in self.params] if adam else []
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params] if adam else []

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        self.step_count += 1
        groups: dict[tuple[float, float], list[int]] = {}
        for i, key in enumerate(zip(self.lr, self.weight_decay)):
            groups.setdefault(key, []).append(i)
        live = [j for j, p in enumerate(self.params) if p.grad is not None]
        for (lr, wd), members in groups.items():
            views = [self.params[j][i] for i in members for j in live]
            grads = [self.params[j].grad[i] for i in members for j in live]
            if self.kind == "sgd":
                torch._fused_sgd_(views, grads, [], weight_decay=wd, momentum=0.0, lr=lr, dampening=0.0,
                                  nesterov=False, maximize=False, is_first_step=self.step_count == 1)
                continue
            step = torch.tensor(float(self.step_count), device=views[0].device)
            fused = torch._fused_adamw_ if self.kind == "adamw" else torch._fused_adam_
            fused(views, grads, [self.exp_avg[j][i] for i in members for j in live],
                  [self.exp_avg_sq[j][i] for i in members for j in live], [], [step] * len(views),
                  lr=lr, beta1=self.betas[0], beta2=self.betas[1], weight_decay=wd, eps=self.eps,
                  amsgrad=False, maximize=False)

    def keep(self, idx: list[int]) -> None:
        """Only the members at idx go on (the others failed); rebind() then takes the narrowed parameters."""
        self.lr = [self.lr[i] for i in idx]
        self.weight_decay = [self.weight_decay[i] for i in idx]
        self.exp_avg = [s[idx] for s in self.exp_avg]
        self.exp_avg_sq = [s[idx] for s in self.exp_avg_sq]

    def rebind(self, params: list[Tensor]) -> None:
        self.params = list(params)


@torch.no_grad()
def clip_grad_norm(params: list[Tensor], max_norm: list[float]) -> Tensor:
    """Each member's global gradient norm (P,), before clipping; grads scaled in place to at most max_norm (0 = no clip)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(len(max_norm))
    norms = torch.stack([torch.linalg.vector_norm(g.flatten(1), 2, dim=1) for g in grads], dim=1)  # (P, n_params)
    total = torch.linalg.vector_norm(norms, 2, dim=1)                                                 # (P,)
    limit = torch.tensor([m if m > 0 else math.inf for m in max_norm], dtype=total.dtype, device=total.device)
    coef = (limit / (total + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(coef.view(-1, *[1] * (g.dim() - 1)))
    return total
