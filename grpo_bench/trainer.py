"""The GRPO loop, shared by every task.

Per epoch: sample G responses per prompt -> rewards -> (KL-in-reward penalty) ->
deltas -> old and reference log-probs, once, without grad -> K inner gradient
steps on aggregate(loss + beta * KL) -> metrics. With K = 1 the ratio is exactly
1 at the only step, so ratio and clipping only matter for K > 1 (the seed
notebooks' mistake of taking "old" log-probs from the live weights).

Metrics are one flat namespace: reward/*, loss/*, kl/*, clip/frac, ratio/*,
entropy, grad/norm, time/step_s, eval/*; final/* summarise a finished run.
kl/old is KL(pi_old || pi) estimated as (ratio - 1) - log ratio on the tokens
pi_old sampled (CleanRL's approx_kl): how far the inner steps moved the policy.
"""
from __future__ import annotations

import math
import time
import torch

from . import registry
from .config import RunConfig, task_name
from .logprobs import grpo_loss

Row = tuple[int, str, float]  # (step, metric, value)


class NonFiniteLoss(FloatingPointError):
    pass


def _optimizer(cfg: RunConfig, params):
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.SGD(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    return (torch.where(mask > 0, x, torch.zeros_like(x)).sum() / mask.sum().clamp(min=1)).item()


def build_task(cfg: RunConfig):
    return registry.get("task", task_name(cfg))(cfg.task, cfg)


def train(cfg: RunConfig, rows: list[Row] | None = None) -> dict:
    """Train one run; append (step, metric, value) rows to `rows`; return the final/* summary.

    `rows` is filled as training goes, so a caller still has the metrics of a run
    that raised half way.
    """
    rows = [] if rows is None else rows
    if cfg.device == "auto":
        cfg.device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    task = build_task(cfg)
    params = [p for p in task.policy.parameters() if p.requires_grad]
    opt = _optimizer(cfg, params)

    delta_fn = registry.get("delta", cfg.delta)
    kl_fn = registry.get("kl", cfg.kl)
    use_ref = cfg.kl_coef > 0
    total_steps = cfg.epochs * cfg.inner_steps
    epoch_rewards: list[float] = []

    def log(step: int, metrics: dict[str, float]) -> None:
        rows.extend((step, k, float(v)) for k, v in metrics.items())

    def evaluate(step: int) -> None:
        task.policy.eval()
        log(step, task.evaluate(gen))

    if cfg.eval_every:
        evaluate(0)  # the starting point of every eval curve
    for epoch in range(cfg.epochs):
        if use_ref and cfg.ref_refresh and epoch > 0 and epoch % cfg.ref_refresh == 0:
            task.refresh_reference()
        t0 = time.perf_counter()
        task.policy.eval()  # sampling and old log-probs without dropout
        ro = task.rollout(epoch, cfg.group_size, gen)
        mask = ro.mask
        with torch.no_grad():
            old_logp, _ = task.logprobs(ro)
            ref_logp = task.logprobs(ro, reference=True)[0] if use_ref else None
        rewards = ro.rewards
        epoch_metrics = {"reward/mean": rewards.mean().item(), "reward/std": rewards.std().item(), **ro.metrics}
        if use_ref and cfg.kl_placement == "reward":
            # a per-response penalty: the sequence KL is the sum of its token terms
            seq_kl = torch.where(mask > 0, kl_fn(old_logp, ref_logp), torch.zeros_like(old_logp)).sum(-1)
            rewards = rewards - cfg.kl_coef * seq_kl
            epoch_metrics["reward/penalised"] = rewards.mean().item()
        deltas = delta_fn(rewards, eps=cfg.adv_eps)
        epoch_metrics["delta/abs_mean"] = deltas.abs().mean().item()
        epoch_rewards.append(epoch_metrics["reward/mean"])
        rollout_s = time.perf_counter() - t0

        task.policy.train()
        for k in range(cfg.inner_steps):
            step = epoch * cfg.inner_steps + k
            t1 = time.perf_counter()
            logp, entropy = task.logprobs(ro)
            kl_in_loss = use_ref and cfg.kl_placement == "loss"
            # one entry point for every backend: the torch composition of the registry
            # parts, or the fused Triton kernel (forward and backward in one pass each)
            loss, stats = grpo_loss(logp, old_logp, ref_logp if kl_in_loss else None, deltas, mask,
                                    loss=cfg.loss, kl=cfg.kl if kl_in_loss else None,
                                    kl_coef=cfg.kl_coef if kl_in_loss else 0.0, aggregate=cfg.aggregate,
                                    clip_low=cfg.clip_low, clip_high=cfg.clip_high, max_len=cfg.max_len,
                                    backend=cfg.backend, return_stats=True)
            if not torch.isfinite(loss):
                raise NonFiniteLoss(f"non-finite loss {loss.item()} at epoch {epoch}, inner step {k}")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gnorm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm if cfg.max_grad_norm > 0 else math.inf)
            opt.step()
            dt = time.perf_counter() - t1 + (rollout_s if k == 0 else 0.0)

            # the end of each window: with log_every = K that is the most off-policy step
            if (step + 1) % cfg.log_every == 0 or step == total_steps - 1:
                with torch.no_grad():
                    log_ratio = (logp - old_logp).detach()
                    ratio = log_ratio.exp()
                    on = mask > 0
                    m = {"loss/total": loss.item(), **{k: v.item() for k, v in stats.items()},
                         "ratio/max": ratio[on].max().item() if on.any() else 1.0,
                         "ratio/min": ratio[on].min().item() if on.any() else 1.0,
                         "kl/old": _masked_mean(torch.expm1(log_ratio) - log_ratio, mask),
                         "grad/norm": gnorm.item(), "time/step_s": dt, "epoch": epoch, **epoch_metrics}
                    if use_ref and "kl/value" not in m:  # KL in the reward: still worth watching
                        m["kl/value"] = _masked_mean(kl_fn(logp, ref_logp), mask)
                    if entropy is not None:
                        m["entropy"] = _masked_mean(entropy.detach(), mask)
                log(step, m)
        if cfg.eval_every and (epoch + 1) % cfg.eval_every == 0 and epoch + 1 < cfg.epochs:
            evaluate(step)

    task.policy.eval()
    final_evals = task.evaluate(gen)
    log(total_steps - 1, final_evals)
    tail = max(1, len(epoch_rewards) // 10)
    summary = {"final/reward": sum(epoch_rewards[-tail:]) / tail, "final/reward_first": epoch_rewards[0]}
    summary.update({f"final/{k}": v for k, v in final_evals.items()})
    return summary
