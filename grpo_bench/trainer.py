"""The GRPO loop, shared by every task: machinery, not a place to add parts.

Per epoch:
    reference update (ref_update)            when the KL term is on
    rollout -> rollout-stage filters         groups a filter drops are drawn again (up to its cap)
    old and reference log-probs, no grad     K = 1 takes the old ones from the gradient pass itself
    KL-in-reward penalty -> deltas
    K inner steps: log-probs -> step-stage filters -> grpo_loss(loss, aggregate, KL) -> optimiser
    KL controller (kl_ctrl)

With K = 1 the update is exactly on-policy: old log-probs are the detached log-probs of the
same forward pass, so the ratio is 1 to the last bit (as TRL does) even with dropout, and
no separate no-grad pass is paid for. With K > 1 they come from one no-grad pass in eval
mode before the first step.

Metrics are one flat namespace: reward/*, loss/*, kl/*, clip/*, ratio/*, filter/*,
samples/*, entropy, grad/norm, time/step_s, eval/*; final/* summarise a finished run.
reward/* describe the policy: they are taken on the epoch's first rollout, before any
filter. kl/seq, logged whenever there is a reference (kl_coef > 0 or kl_track), is the
same estimate for every variant: the mean over responses of the summed log-ratio
log pi_old - log pi_ref, unbiased for the sequence KL. kl/old is KL(pi_old || pi) estimated as (ratio - 1) - log ratio on the tokens
pi_old sampled (CleanRL's approx_kl): how far the inner steps moved the policy.
"""
from __future__ import annotations

import math
import time

import torch
from torch import Tensor

from . import registry
from .algos import Batch, masked_mean, masked_sum
from .algos.deltas import clip_deltas
from .config import RunConfig, task_name
from .logprobs import grpo_loss
from .tasks import Rollout

Row = tuple[int, str, float]  # (step, metric, value)
# per-rollout metrics whose mean over the last 10% of epochs is summarised as final/<metric>
# (final/reward is reward/mean's): what the claims in results/FINDINGS.md are judged on
TAIL = ("kl/seq", "response/length", "response/length_correct", "response/length_incorrect")


class NonFiniteLoss(FloatingPointError):
    pass


def _optimizer(cfg: RunConfig, params):
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.SGD(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def build_task(cfg: RunConfig):
    return registry.get("task", task_name(cfg))(cfg.task, cfg)


def _filters(cfg: RunConfig, stage: str) -> list[tuple[str, callable]]:
    return [(f["name"], registry.bind("filter", f)) for f in cfg.filters
            if registry.entry("filter", f["name"]).traits.get("stage") == stage]


def filter_effect(before: Batch, after: Batch) -> dict[str, float]:
    """What one filter did, as a share of the tokens (or groups) it was given, or a reward shift."""
    out = {}
    on = before.mask > 0
    n = on.sum().clamp(min=1)
    if after.mask is not before.mask:
        out["removed"] = ((after.mask <= 0) & on).sum().item() / n.item()
    if after.gate is not before.gate and after.gate is not None:
        old_gate = torch.ones_like(after.gate) if before.gate is None else before.gate
        out["gated"] = ((after.gate <= 0) & (old_gate > 0) & on).sum().item() / n.item()
    if after.keep is not None and after.keep is not before.keep:
        out["dropped_groups"] = 1.0 - after.keep.float().mean().item()
    if after.rewards is not before.rewards:
        out["reward_shift"] = (after.rewards - before.rewards).mean().item()
    if after.retire is not None and after.retire is not before.retire:
        out["retired"] = after.retire.float().mean().item()
    return out


def sample(task, epoch: int, cfg: RunConfig, gen: torch.Generator, filters) -> tuple[Rollout, dict[str, float]]:
    """The epoch's batch through the rollout-stage filters, and what the policy's samples looked like.

    A filter that marks groups as not kept (batch.keep) has them replaced by groups of
    further rollouts, up to batch.max_draws rollouts; if the cap is reached the batch is
    filled with dropped groups in draw order and filter/capped is 1.
    """
    kept, spare, n_kept, draws, metrics = [], [], 0, 0, {}
    while True:
        ro = task.rollout(epoch, cfg.group_size, gen)
        draws += 1
        if draws == 1:
            b = ro.rewards.shape[0]
            flat = (ro.rewards == ro.rewards[:, :1]).all(-1)
            metrics = {"reward/mean": ro.rewards.mean().item(), "reward/std": ro.rewards.std().item(),
                       "reward/zero_std_frac": flat.float().mean().item(),
                       "response/length": ro.lengths.float().mean().item(), **ro.metrics}
        batch = Batch(ro.rewards, ro.mask, ro.lengths, ro.finished, cfg.task.generation_budget)
        for name, f in filters:
            before, batch = batch, f(batch)
            if draws == 1:
                metrics.update({f"filter/{name}/{k}": v for k, v in filter_effect(before, batch).items()})
        ro = ro.replace(rewards=batch.rewards, mask=batch.mask)
        if batch.retire is not None and batch.retire.any():  # a curriculum: the task's stream drops these prompts
            task.retire(ro.select(batch.retire).prompts)
        if batch.keep is None:
            break
        kept.append(ro.select(batch.keep))
        spare.append(ro.select(~batch.keep))
        n_kept += int(batch.keep.sum())
        if n_kept >= b or draws >= batch.max_draws:
            ro = Rollout.cat(kept + spare).select(torch.arange(b))
            metrics |= {"filter/draws": float(draws), "filter/capped": float(n_kept < b)}
            break
    metrics["samples/responses"] = float(draws * b * cfg.group_size)
    return ro, metrics


def _step_metrics(loss: Tensor, stats: dict, logp: Tensor, old_logp: Tensor, mask: Tensor,
                  entropy: Tensor | None, gnorm: Tensor, dt: float) -> dict[str, float]:
    with torch.no_grad():
        log_ratio = (logp - old_logp).detach()
        ratio = log_ratio.exp()
        on = mask > 0
        m = {"loss/total": loss.item(), **{k: v.item() for k, v in stats.items()},
             "ratio/max": ratio[on].max().item() if on.any() else 1.0,
             "ratio/min": ratio[on].min().item() if on.any() else 1.0,
             "kl/old": masked_mean(torch.expm1(log_ratio) - log_ratio, mask).item(),
             "grad/norm": gnorm.item(), "time/step_s": dt}
        if entropy is not None:
            m["entropy"] = masked_mean(entropy.detach(), mask).item()
    return m


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

    delta_fn = registry.bind("delta", cfg.delta)
    needs_greedy = "greedy" in registry.entry("delta", cfg.delta["name"]).traits.get("needs", ())
    kl_fn = registry.bind("kl", cfg.kl)
    kl_ctrl = registry.bind("kl_ctrl", cfg.kl_ctrl)
    ref_update = registry.bind("ref_update", cfg.ref_update)
    rollout_filters, step_filters = _filters(cfg, "rollout"), _filters(cfg, "step")
    entropy_ctrl = registry.bind("entropy_ctrl", cfg.entropy_ctrl)
    use_entropy = cfg.entropy_coef > 0 or cfg.entropy_ctrl["name"] != "fixed"
    entropy_state, entropy_coef = entropy_ctrl(cfg.entropy_coef, None)
    use_ref = cfg.kl_coef > 0 or cfg.kl_track
    kl_in_loss = cfg.kl_coef > 0 and cfg.kl_placement == "loss"
    kl_coef = cfg.kl_coef
    on_policy = cfg.inner_steps == 1
    total_steps = cfg.epochs * cfg.inner_steps
    epoch_rewards: list[float] = []
    tails: dict[str, list[float]] = {m: [] for m in TAIL}
    samples = 0.0

    def log(step: int, metrics: dict[str, float]) -> None:
        rows.extend((step, k, float(v)) for k, v in metrics.items())

    def evaluate(step: int) -> None:
        task.policy.eval()
        log(step, task.evaluate(gen))

    if cfg.eval_every:
        evaluate(0)  # the starting point of every eval curve
    for epoch in range(cfg.epochs):
        if use_ref:
            w = ref_update(epoch)
            if w:
                task.mix_reference(w)
        t0 = time.perf_counter()
        task.policy.eval()  # sampling and old log-probs without dropout
        ro, epoch_metrics = sample(task, epoch, cfg, gen, rollout_filters)
        samples += epoch_metrics.pop("samples/responses")
        epoch_metrics["samples/total"] = samples
        mask = ro.mask
        task.policy.train()
        first = None
        with torch.no_grad():
            ref_logp = task.logprobs(ro, reference=True)[0] if use_ref else None
        if on_policy:
            first = task.logprobs(ro)
            old_logp = first[0].detach()
        else:
            with torch.no_grad():
                task.policy.eval()
                old_logp = task.logprobs(ro)[0]
                task.policy.train()
        rewards = ro.rewards
        if use_ref:
            kl_tok = torch.where(mask > 0, kl_fn(old_logp, ref_logp, old_logp), torch.zeros_like(old_logp))
            observed_kl = masked_mean(kl_tok, mask, dim=-1)[mask.sum(-1) > 0].mean().item() if (mask > 0).any() else 0.0
            # one estimator for every variant, whatever its own: the sampled sequence's log-ratio,
            # an unbiased estimate of the sequence KL(pi_old || pi_ref)
            epoch_metrics["kl/seq"] = masked_sum(old_logp - ref_logp, mask, dim=-1).mean().item()
            epoch_metrics["kl/coef"] = kl_coef
            if cfg.kl_placement == "reward" and cfg.kl_coef > 0:
                # a per-response penalty: the sequence KL is the sum of its token terms
                rewards = rewards - kl_coef * masked_sum(kl_tok, mask, dim=-1)
                epoch_metrics["reward/penalised"] = rewards.mean().item()
        greedy = task.greedy_rewards(ro) if needs_greedy else None
        deltas = clip_deltas(delta_fn(rewards, mask.sum(-1), greedy, ro.components), cfg.adv_clip)
        epoch_metrics["delta/abs_mean"] = deltas.abs().mean().item()
        epoch_rewards.append(epoch_metrics["reward/mean"])
        for m in TAIL:
            if m in epoch_metrics:
                tails[m].append(epoch_metrics[m])
        rollout_s = time.perf_counter() - t0

        for k in range(cfg.inner_steps):
            step = epoch * cfg.inner_steps + k
            t1 = time.perf_counter()
            logp, entropy = first if first is not None else task.logprobs(ro)
            first = None
            gate, filter_metrics = None, {}
            if step_filters:
                batch = Batch(rewards, mask, ro.lengths, ro.finished, cfg.task.generation_budget,
                              entropy=None if entropy is None else entropy.detach())
                for name, f in step_filters:
                    before, batch = batch, f(batch)
                    filter_metrics |= {f"filter/{name}/{key}": v for key, v in filter_effect(before, batch).items()}
                gate = batch.gate
            loss, stats = grpo_loss(logp, old_logp, ref_logp if kl_in_loss else None, deltas, mask,
                                    loss=cfg.loss, aggregate=cfg.aggregate, kl=cfg.kl if kl_in_loss else None,
                                    kl_coef=kl_coef if kl_in_loss else 0.0, gate=gate, backend=cfg.backend,
                                    corrections=cfg.corrections, entropy=entropy if use_entropy else None,
                                    entropy_coef=entropy_coef, nll_coef=cfg.nll_coef, positive=ro.rewards > 0)
            if not torch.isfinite(loss):
                raise NonFiniteLoss(f"non-finite loss {loss.item()} at epoch {epoch}, inner step {k}")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gnorm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm if cfg.max_grad_norm > 0 else math.inf)
            opt.step()
            dt = time.perf_counter() - t1 + (rollout_s if k == 0 else 0.0)
            if use_entropy:
                filter_metrics["entropy/coef"] = entropy_coef
                entropy_state, entropy_coef = entropy_ctrl(entropy_state, stats["loss/entropy"].item())

            # the end of each window: with log_every = K that is the most off-policy step
            if (step + 1) % cfg.log_every == 0 or step == total_steps - 1:
                m = _step_metrics(loss, stats, logp, old_logp, mask, entropy, gnorm, dt)
                if use_ref and "kl/value" not in m:  # KL in the reward, or tracked only: still worth watching
                    with torch.no_grad():
                        m["kl/value"] = masked_mean(kl_fn(logp, ref_logp, old_logp), mask).item()
                log(step, m | filter_metrics | epoch_metrics | {"epoch": epoch})
        if cfg.kl_coef > 0:
            kl_coef = kl_ctrl(kl_coef, observed_kl, int(mask.shape[0] * mask.shape[1]))
        if cfg.eval_every and (epoch + 1) % cfg.eval_every == 0 and epoch + 1 < cfg.epochs:
            evaluate(step)

    task.policy.eval()
    final_evals = task.evaluate(gen)
    log(total_steps - 1, final_evals)
    tail = max(1, len(epoch_rewards) // 10)
    summary = {"final/reward": sum(epoch_rewards[-tail:]) / tail, "final/reward_first": epoch_rewards[0],
               "final/samples": samples}
    for m, values in tails.items():
        if values:  # a metric a task logs only some epochs (no correct answer yet) averages what it has
            last = values[-max(1, len(values) // 10):]
            summary[f"final/{m}"] = sum(last) / len(last)
    summary.update({f"final/{k}": v for k, v in final_evals.items()})
    return summary
