"""Advantage ("delta") modes: rewards (B, G) -> one advantage per response (B, G), or per token (B, G, T).

Most modes are outcome-level: one scalar per response, spread over its tokens by the
loss. `lengths` (B, G) are the responses' token counts before any filter; `greedy`
(B,) is the reward of each prompt's greedy response, computed by the trainer only for
parts registered with needs=("greedy",); `components` (B, G, C) are the raw scores of
the task's C reward functions (their weighted sum is `rewards`), read only by gdpo;
`extra` (an Extra, below) carries what the other needs ask the trainer for: per-token
data of the sampled responses (their ids, the old policy's log-probs, entropy and
sum of squared probabilities) and the rewards of responses sampled from the reference.
Parts registered token_level=True return per-token deltas (B, G, T), 0 on masked tokens:
optimal_token_baseline and gtpo. Every loss takes either shape (algos/losses.py).
A group whose rewards are all equal gets exactly 0 from every group-centred mode but
two: optimal_token_baseline gives r * eps / sum W (verl's numbers), gtpo its entropy penalty.

Advantage clipping is not a mode: it applies to any of them after the fact (the run
config's `adv_clip`, `clip_deltas` below), as NeMo-RL and ROLL do.
"""
from __future__ import annotations

import math
from typing import Annotated, NamedTuple

import torch
from torch import Tensor

from ..registry import Choice, NonNegative, Positive, PositiveInt, register
from .common import centre, masked_mean, zero_flat


class Extra(NamedTuple):
    """What a delta part registered with needs=(...) asks the trainer for, beyond the rewards.

    A field is None unless the part needs it (the trainer computes nothing it was not
    asked for); `mask` comes with any of them. The per-token ones are those of the old
    policy pi_old, the one that sampled, under the sampling temperature.
    """

    mask: Tensor | None = None         # (B, G, T) 1.0 on the response tokens
    ids: Tensor | None = None          # (B, G, T) the sampled token ids                        need "ids"
    logp: Tensor | None = None         # (B, G, T) log pi_old of each sampled token             need "logp"
    entropy: Tensor | None = None      # (B, G, T) entropy of pi_old at each position           need "entropy"
    sum_pi_sq: Tensor | None = None    # (B, G, T) sum over the vocabulary of pi_old(v)^2       need "sum_pi_sq"
    ref_rewards: Tensor | None = None  # (B, N) rewards of N responses per prompt from pi_ref   need "ref_rewards"


# the needs an Extra answers (greedy has its own argument)
EXTRA_NEEDS = ("ids", "logp", "entropy", "sum_pi_sq", "ref_rewards")


def _need(extra: Extra | None, part: str, *fields: str) -> Extra:
    missing = [f for f in ("mask", *fields) if extra is None or getattr(extra, f) is None]
    if missing:
        raise ValueError(f"{part} needs extra={{{', '.join(missing)}}} (an algos.deltas.Extra; the trainer fills "
                         "what a part's registration asks for)")
    return extra


Count = Annotated[str, Choice(("advantage", "reward"))]
BatchNorm = Annotated[str, Choice(("tokens", "responses", "none"))]


def _weights(rewards: Tensor, lengths: Tensor | None) -> Tensor:
    return torch.ones_like(rewards) if lengths is None else lengths.to(rewards.dtype)


def _whiten(x: Tensor, w: Tensor, eps: float) -> Tensor:
    """(x - mean) / sqrt(var + eps) over the batch, each response weighted by w (its tokens).

    verl's masked_whiten over the response tokens: x repeated on every token, so a mean
    and an unbiased (Bessel, over tokens) variance in which each response counts |o| times.
    """
    n = w.sum()
    mean = (w * x).sum() / n.clamp(min=1e-12)
    var = (w * (x - mean) ** 2).sum() / (n - 1).clamp(min=1e-12)
    return (x - mean) * torch.rsqrt(var + eps)


@register("delta", "raw")
def raw(rewards: Tensor, lengths: Tensor | None = None, greedy: Tensor | None = None,
        components: Tensor | None = None, extra: Extra | None = None) -> Tensor:
    """r: plain REINFORCE, no baseline.

    Source: Williams (1992).
    """
    return rewards.clone()


@register("delta", "centered", needs_group=True)
def centered(rewards: Tensor, lengths: Tensor | None = None, greedy: Tensor | None = None,
             components: Tensor | None = None, extra: Extra | None = None) -> Tensor:
    """r - group mean: unbiased baseline, scale kept.

    Source: Dr. GRPO (Liu et al., 2025); TRL scale_rewards="none"; verl grpo with norm_adv_by_std_in_grpo=False; nanochat.
    """
    return centre(rewards)


@register("delta", "zscore", needs_group=True)
def zscore(rewards: Tensor, lengths: Tensor | None = None, greedy: Tensor | None = None,
           components: Tensor | None = None, extra: Extra | None = None, *, eps: Positive = 1e-6) -> Tensor:
    """(r - group mean) / (group std + eps), unbiased std.

    Source: DeepSeekMath GRPO (Shao et al., 2024); verl adv_estimator=grpo (eps 1e-6); TRL scale_rewards="group" (eps 1e-4).
    """
    return zero_flat(rewards, centre(rewards) / (rewards.std(dim=-1, keepdim=True) + eps))


@register("delta", "batch_std", needs_group=True)
def batch_std(rewards: Tensor, lengths: Tensor | None = None, greedy: Tensor | None = None,
              components: Tensor | None = None, extra: Extra | None = None, *, eps: Positive = 1e-6) -> Tensor:
    """(r - group mean) / (std of the whole batch + eps): group baseline, batch scale.

    Source: Tricks or Traps? Lite PPO (Liu et al., 2025); TRL scale_rewards="batch" (eps 1e-4).
    """
    return centre(rewards) / (rewards.std() + eps)


@register("delta", "rloo", needs_group=True)
def rloo(rewards: Tensor, lengths: Tensor | None = None, greedy: Tensor | None = None,
         components: Tensor | None = None, extra: Extra | None = None) -> Tensor:
    """r_i - mean of the other G-1 rewards (leave-one-out baseline).

    Source: RLOO (Ahmadian et al., 2024; Kool et al., 2019); verl adv_estimator=rloo.
    """
    g = rewards.shape[-1]
    return centre(rewards) * (g / (g - 1))  # r - (sum - r)/(G-1) = G/(G-1) * (r - mean)


@register("delta", "max", needs_group=True)
def best_only(rewards: Tensor, lengths: Tensor | None = None, greedy: Tensor | None = None,
              components: Tensor | None = None, extra: Extra | None = None) -> Tensor:
    """Only the best response(s) of a group keep their reward, the rest get 0.

    Source: a best-of-G ablation of this suite (rejection-sampling fine-tuning as a policy gradient).
    """
    best = rewards == rewards.max(dim=-1, keepdim=True).values
    return torch.where(best, rewards, torch.zeros_like(rewards))


@register("delta", "passk", needs_group=True)
def passk(rewards: Tensor, lengths: Tensor | None = None, greedy: Tensor | None = None,
          components: Tensor | None = None, extra: Extra | None = None, *, normalize: bool = True,
          eps: Positive = 1e-6) -> Tensor:
    """Pass@k training: only the group's best response learns, from r_max - r_second (/ group std).

    Source: Pass@k training (Chen et al., 2025, arXiv 2503.19595); verl adv_estimator=grpo_passk.
    """
    top = rewards.topk(2, dim=-1).values                                     # (B, 2)
    gap = top[:, :1] - top[:, 1:]                                            # (B, 1)
    if normalize:
        gap = gap / (rewards.std(dim=-1, keepdim=True) + eps)
    # ties give a zero gap, so which of the tied best responses is picked never matters
    first_best = torch.nn.functional.one_hot(rewards.argmax(-1), rewards.shape[-1]).to(torch.bool)
    return torch.where(first_best, gap.expand_as(rewards), torch.zeros_like(rewards))


@register("delta", "opo", needs_group=True)
def opo(rewards: Tensor, lengths: Tensor | None = None, greedy: Tensor | None = None,
        components: Tensor | None = None, extra: Extra | None = None) -> Tensor:
    """r - length-weighted group mean sum(|o| r) / sum(|o|): the optimal baseline under token-sum losses.

    Source: On-Policy RL with Optimal reward baseline, OPO (Hao et al., 2025, arXiv 2505.23585); verl adv_estimator=opo.
    """
    w = _weights(rewards, lengths)
    total = w.sum(-1, keepdim=True)
    base = torch.where(total > 0, (w * rewards).sum(-1, keepdim=True) / total.clamp(min=1e-12),
                       rewards.mean(-1, keepdim=True))
    return zero_flat(rewards, rewards - base)


@register("delta", "reinforce_pp")
def reinforce_pp(rewards: Tensor, lengths: Tensor | None = None, greedy: Tensor | None = None,
                 components: Tensor | None = None, extra: Extra | None = None, *, eps: Positive = 1e-8) -> Tensor:
    """Global batch whitening of the rewards, no group baseline (gamma = 1).

    Source: REINFORCE++ (Hu, 2025, arXiv 2501.03262); verl adv_estimator=reinforce_plus_plus with outcome rewards.
    """
    return _whiten(rewards, _weights(rewards, lengths), eps)


@register("delta", "reinforce_pp_baseline", needs_group=True)
def reinforce_pp_baseline(rewards: Tensor, lengths: Tensor | None = None, greedy: Tensor | None = None,
                          components: Tensor | None = None, extra: Extra | None = None, *, eps: Positive = 1e-8) -> Tensor:
    """r - group mean, then whitened over the batch's tokens.

    Source: REINFORCE++-baseline (Hu, 2025); verl adv_estimator=reinforce_plus_plus_baseline.
    """
    return _whiten(centre(rewards), _weights(rewards, lengths), eps)


@register("delta", "gpg", needs_group=True)
def gpg(rewards: Tensor, lengths: Tensor | None = None, greedy: Tensor | None = None,
        components: Tensor | None = None, extra: Extra | None = None, *, f_norm: Positive = 1.0, count: Count = "advantage") -> Tensor:
    """alpha * (r - group mean) / f_norm, alpha = N / #responses that count, undoing the dilution by flat groups.

    count="advantage" counts responses with a non-zero advantage (the paper's B / (B - M));
    count="reward" counts non-zero rewards, as verl's implementation does.

    Source: GPG (Chu et al., 2025, arXiv 2504.02546); verl adv_estimator=gpg.
    """
    adv = centre(rewards)
    counted = adv if count == "advantage" else rewards
    alpha = rewards.numel() / torch.count_nonzero(counted).clamp(min=1).to(rewards.dtype)  # not the default dtype
    return alpha * adv / f_norm


@register("delta", "remax", needs=("greedy",))
def remax(rewards: Tensor, lengths: Tensor | None = None, greedy: Tensor | None = None,
          components: Tensor | None = None, extra: Extra | None = None) -> Tensor:
    """r - reward of the prompt's greedy response.

    Source: ReMax (Li et al., 2024, arXiv 2310.10505); verl adv_estimator=remax.
    """
    if greedy is None:
        raise ValueError("remax needs the greedy responses' rewards (greedy=...)")
    return rewards - greedy.to(rewards.dtype).unsqueeze(-1)



@register("delta", "gdpo", needs_group=True)
def gdpo(rewards: Tensor, lengths: Tensor | None = None, greedy: Tensor | None = None,
         components: Tensor | None = None, extra: Extra | None = None, *, eps: Positive = 1e-6, reward_weights: list | None = None,
         batch_norm: BatchNorm = "tokens") -> Tensor:
    """Each reward component z-scored within its group, then their weighted sum normalised over the batch.

    components (B, G, C) are the task's raw reward scores; reward_weights null takes the task's
    weights (filled in from the run config), or 1 each when the part is called directly;
    without components the total reward is the only component. batch_norm: "tokens" whitens
    the sum over the batch's tokens (verl's masked_whiten: each response counted |o| times,
    Bessel's correction, eps 1e-8 under the root), "responses" is (x - mean) / (std + eps)
    over responses (TRL), "none" keeps the sum.

    Source: GDPO (arXiv 2601.05242); verl adv_estimator=gdpo (eps 1e-6, batch_norm tokens); TRL multi_objective_aggregation=normalize_then_sum (eps 1e-4, batch_norm responses).
    """
    comps = rewards.unsqueeze(-1) if components is None else components.to(rewards.dtype)
    per = comps.movedim(-1, 0)                                               # (C, B, G)
    z = zero_flat(per, centre(per) / (per.std(dim=-1, keepdim=True) + eps))
    if reward_weights is None:
        total = z.sum(0)
    else:
        if len(reward_weights) != per.shape[0]:
            raise ValueError(f"gdpo: {len(reward_weights)} reward_weights for {per.shape[0]} reward components")
        w = torch.tensor(reward_weights, dtype=z.dtype, device=z.device)
        total = (w.view(-1, 1, 1) * z).sum(0)                                # (B, G)
    if batch_norm == "tokens":
        return _whiten(total, _weights(rewards, lengths), 1e-8)
    if batch_norm == "responses":
        return (total - total.mean()) / (total.std() + eps)
    return total


@register("delta", "maxrl", needs_group=True)
def maxrl(rewards: Tensor, lengths: Tensor | None = None, greedy: Tensor | None = None,
          components: Tensor | None = None, extra: Extra | None = None, *, eps: Positive = 1e-6) -> Tensor:
    """(r - group mean) / (group mean + eps): the pass rate as the scale, so hard prompts weigh 1/p; 0 where the mean is <= 0.

    Meant for rewards in [0, 1] (a pass rate): with binary rewards a correct response gets
    (G - K) / K of a group with K correct, a wrong one -1. A group with no positive mean
    (nothing solved) learns nothing, as in the reference implementation.

    Source: Maximum Likelihood RL, MaxRL (Tajwar et al., 2026, arXiv 2602.02710, eps 1e-6); SkyRL adv_estimator=maxrl (no guard: a negative mean flips the sign); prime-rl.
    """
    mu = rewards.mean(dim=-1, keepdim=True)
    return torch.where(mu > 0, centre(rewards) / (mu + eps), torch.zeros_like(rewards))


@register("delta", "optimal_token_baseline", needs=("logp", "sum_pi_sq"), needs_group=True, token_level=True)
def optimal_token_baseline(rewards: Tensor, lengths: Tensor | None = None, greedy: Tensor | None = None,
                           components: Tensor | None = None, extra: Extra | None = None, *,
                           eps: Positive = 1e-8, zero_tail: bool = True) -> Tensor:
    """Per-token deltas r - B*_t, B*_t = sum_i r_i W_t^i / (sum_i W_t^i + eps) over the group, W_t the running sum of 1 - 2 pi_t + sum_v pi_v^2.

    1 - 2 pi_t + sum_v pi_v^2 = ||e_y - pi||^2 is the squared norm of the score of the sampled
    token y in the logits, W_t^i its sum over response i's tokens up to t: the variance-optimal
    baseline for token t weighs each response's return by how much gradient its path carries.
    The return of every token is the response's reward (gamma 1, outcome reward). pi and
    sum_v pi_v^2 are the old policy's (needs logp, sum_pi_sq: the trainer asks the task for the
    second, from the fused head without the (N, V) logits). zero_tail: where one response of a
    group is longer than every other, its tokens past the second-longest get baseline 0
    (verl's handle_zero_tail; alone there, the baseline would be its own reward). verl's
    tir_optimal_token_baseline differs only for responses with masked holes (tool outputs in
    multi-turn), which single-turn responses have none of: the same numbers here (tested against
    both). Not here: verl's W scaled by rho^2 under rollout IS (corrections act in the loss, after the deltas).

    Source: The Optimal Token Baseline (Li et al., 2026, arXiv 2602.07078), its Logit-Gradient Proxy; verl adv_estimator=optimal_token_baseline / tir_optimal_token_baseline (epsilon 1e-8, handle_zero_tail True).
    """
    x = _need(extra, "optimal_token_baseline", "logp", "sum_pi_sq")
    on = x.mask > 0
    m = on.to(rewards.dtype)
    w = (1.0 - 2.0 * torch.exp(x.logp) + x.sum_pi_sq).to(rewards.dtype)
    cum = torch.where(on, w, torch.zeros_like(w)).cumsum(-1) * m         # (B, G, T) W_t, 0 past the response
    ret = rewards.unsqueeze(-1) * m                                       # G_t = r on the response's tokens
    if rewards.shape[-1] == 1:                                            # a group of one: no baseline
        return ret
    base = ((ret * cum).sum(-2, keepdim=True) / (cum.sum(-2, keepdim=True) + eps)).expand_as(ret)
    if zero_tail:
        # past the second-longest length only a group's one longest response has tokens (a tie leaves none)
        second = m.sum(-1).topk(2, -1).values[..., 1:]                    # (B, 1)
        t = torch.arange(m.shape[-1], device=m.device, dtype=m.dtype)
        base = torch.where(t >= second.unsqueeze(-1), torch.zeros_like(base), base)
    return (ret - base) * m


def _conflicts(ids: Tensor, on: Tensor, pos: Tensor, neg: Tensor) -> Tensor:
    """(B, G, T) bool: the token opens a run, from the response's first token, of tokens that
    some positive and some negative response of the group have at the same position."""
    same = (ids.unsqueeze(-3) == ids.unsqueeze(-2)) & on.unsqueeze(-2)   # (B, G_other, G, T), the other's token real
    in_pos = (same & pos[..., :, None, None]).any(-3)
    in_neg = (same & neg[..., :, None, None]).any(-3)
    hit = in_pos & in_neg & on & (pos | neg).unsqueeze(-1)
    return hit.to(torch.int64).cumprod(-1).bool()


@register("delta", "gtpo", needs=("ids", "entropy"), needs_group=True, token_level=True)
def gtpo(rewards: Tensor, lengths: Tensor | None = None, greedy: Tensor | None = None,
         components: Tensor | None = None, extra: Extra | None = None, *,
         threshold: Positive = 0.7, gamma: NonNegative = 0.1, conflict_weight: NonNegative = 2.0,
         eps: Positive = 1e-4) -> Tensor:
    """Per-token deltas d_i (A_i - gamma <H>_i) lambda_it: conflict tokens protected, responses above an entropy threshold dropped.

    A_i is the group z-score (eps as TRL's and Unsloth's GRPO). Conflict tokens are those a
    positive and a negative response (A > 0, A < 0) of a group share at the same position, in
    the run that opens the response, and in the run that closes it (positions counted from
    each response's end): lambda is conflict_weight on them in positive responses, 0 in
    negative ones, 1 elsewhere (the two runs' weights multiply). <H>_i is the response's mean
    entropy under the old policy (need entropy): d_i = 0 when it exceeds threshold (the
    paper's ln 2; 0.7 in its code), and gamma <H>_i is subtracted from every advantage, so a
    flat group still gets its entropy penalty. With loss unclipped and aggregate
    seq_mean_token_mean, no KL: the paper's objective. Not here: the paper's exception for a
    policy that starts above ln 2 (d_i = 1 throughout: threshold .inf), and its code's division
    of each response's loss by its number of conflict tokens, which the objective does not have.

    Source: GTPO (Simoni et al., 2025, arXiv 2508.03772) and its code (github.com/winstonsmith1897/GTPO: ENT_THRESHOLD 0.7, ENT_SCALE 0.1, W_RAW 2.0); requested as a TRL loss_type in huggingface/trl#5226 (open).
    """
    x = _need(extra, "gtpo", "ids", "entropy")
    on = x.mask > 0
    m = on.to(rewards.dtype)
    adv = zero_flat(rewards, centre(rewards) / (rewards.std(dim=-1, keepdim=True) + eps))
    pos, neg = adv > 0, adv < 0
    # the run from the start
    fwd = _conflicts(x.ids, on, pos, neg)
    # the run from the end: position k of the reversed response is token n - 1 - k
    n = on.sum(-1, keepdim=True)                                          # (B, G, 1)
    t = torch.arange(on.shape[-1], device=on.device)
    back = (n - 1 - t).clamp(min=0)                                       # (B, G, T)
    rev_on = t < n
    bwd_rev = _conflicts(x.ids.gather(-1, back), rev_on, pos, neg)
    bwd = bwd_rev.gather(-1, back) & on                                   # back to forward positions
    one = torch.ones_like(m)
    w_pos = one * conflict_weight

    def weight(c: Tensor) -> Tensor:
        return torch.where(c, torch.where(pos.unsqueeze(-1), w_pos, torch.zeros_like(m)), one)

    lam = weight(fwd) * weight(bwd)
    h = masked_mean(x.entropy.to(rewards.dtype), m, dim=-1)               # (B, G)
    shaped = torch.where(h <= threshold, adv - gamma * h, torch.zeros_like(adv))
    return shaped.unsqueeze(-1) * lam * m


@register("delta", "a2po", needs=("ref_rewards",))
def a2po(rewards: Tensor, lengths: Tensor | None = None, greedy: Tensor | None = None,
         components: Tensor | None = None, extra: Extra | None = None, *,
         beta1: Positive = 0.5, samples: PositiveInt = 8) -> Tensor:
    """r - V*(x), V*(x) = beta1 * log mean_j exp(r_j / beta1) over `samples` responses of the reference policy.

    The optimal value of the KL-regularised objective, estimated from the reference policy's
    samples (need ref_rewards: the trainer asks the task for `samples` of them per prompt). TRL
    estimates V* once per prompt of its fixed dataset before training; here the prompt stream
    is not a fixed set, so each rollout draws its prompts' reference samples afresh: the same
    estimator, paid per rollout (a reference updated by ref_update moves V* with it; A*-PO
    keeps it frozen). Pair with loss a2po, group_size 1 as TRL (no group is compared). Not here:
    TRL's filter_all_incorrect (prompts no reference sample solved leave its dataset).

    Source: A*-PO (Brantley et al., 2025, arXiv 2505.20686); TRL experimental A2POTrainer (beta1 0.5, num_value_samples 8).
    """
    x = _need(extra, "a2po", "ref_rewards")
    ref = x.ref_rewards.to(rewards.dtype)
    v_star = beta1 * (torch.logsumexp(ref / beta1, dim=-1, keepdim=True) - math.log(ref.shape[-1]))
    return rewards - v_star


def clip_deltas(deltas: Tensor, clip: float | list | None) -> Tensor:
    """Deltas clamped to [-clip, clip], or to [low, high] for a pair (a None end is open); None: unchanged.

    Source: NeMo-RL advantage_clip_low / advantage_clip_high; ROLL advantage_clip (symmetric, 2.0 in its GRPO recipe).
    """
    if clip is None:
        return deltas
    low, high = (-clip, clip) if not isinstance(clip, (list, tuple)) else clip
    if low is not None:
        deltas = deltas.clamp(min=low)
    return deltas if high is None else deltas.clamp(max=high)
