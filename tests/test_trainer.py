"""The trainer does what its config says: filters, reference updates, KL placement, eval cadence."""
import dataclasses
import math

import pytest
import torch

from grpo_bench import registry
from grpo_bench.config.run import resolve_run
from grpo_bench.engine.sampling import sample
from grpo_bench.engine.trainer import Population, train

# one position, two tokens, two responses per prompt: about half the groups are all-equal
COIN = {"task": {"name": "sort", "prompts": None, "n": 1, "vocab": 2, "num_prompts": 6, "dim": 4},
        "group_size": 2, "epochs": 3, "inner_steps": 1, "delta": "centered"}


# three positions over five tokens, groups of four: every epoch has signal
RICH = {**COIN, "group_size": 4, "task": {**COIN["task"], "n": 3, "vocab": 5, "num_prompts": 8}}


def _rows(over=None, **kw):
    rows = []
    summary = train(resolve_run({**COIN, **(over or {}), **kw}), rows=rows)
    return summary, rows


def _spy(entry, fn):
    """entry with its function replaced by fn, run member by member: a spy must see real tensors, not vmap's."""
    return dataclasses.replace(entry, obj=fn, traits={**entry.traits, "per_member": True})


def _install_spy(monkeypatch, entry, fn, seen: list):
    """entry's part replaced by the spy fn. The registry checks a user's part once per process by calling it
    on a probe (B 2 x G 3): whichever test installs a spy first in its worker would see that call, so it is
    made here and forgotten (test_kl_in_the_loss_leaves_the_rewards_alone failed alone, passed after others)."""
    monkeypatch.setitem(registry._REGISTRY[entry.axis], entry.name, _spy(entry, fn))
    registry.entry(entry.axis, entry.name)
    seen.clear()


def _floats(metrics):
    """A population of one's (1,) metric tensors as floats."""
    return {k: float(v[0]) for k, v in metrics.items()}


def _sample(over, seed=0):
    """One run's first batch and its sampling metrics, without the population axis."""
    cfg = resolve_run({**COIN, **over, "seed": seed})
    task = registry.get("task", "sort")(cfg.task, [cfg])
    ro, m, _ = sample(task, Population([cfg]), 0, cfg.group_size, cfg.task.generation_budget)
    return ro.replace(rewards=ro.rewards[0], responses=ro.responses[0], mask=ro.mask[0]), _floats(m)


def _flat(rewards):
    return (rewards == rewards[:, :1]).all(-1)


def test_dynamic_sampling_fills_the_batch_with_groups_that_carry_signal():
    for seed in range(5):
        plain, _ = _sample({}, seed)
        assert _flat(plain.rewards).any()  # without the filter, all-equal groups are common here
        ro, m = _sample({"filters": [{"name": "dynamic_sampling", "max_draws": 50}]}, seed)
        assert ro.rewards.shape == plain.rewards.shape
        assert m["filter/capped"] == 0.0 and not _flat(ro.rewards).any()
        assert m["filter/draws"] >= 2
        assert m["samples/responses"] == m["filter/draws"] * 6 * 2
        # the kept groups are the first ones drawn: the first rollout's signal groups lead
        assert torch.equal(ro.rewards[: int((~_flat(plain.rewards)).sum())], plain.rewards[~_flat(plain.rewards)])


def test_dynamic_sampling_says_when_its_cap_left_equal_groups():
    ro, m = _sample({"filters": [{"name": "dynamic_sampling", "max_draws": 1}]})
    assert m["filter/draws"] == 1.0 and m["filter/capped"] == 1.0 and _flat(ro.rewards).any()
    # the policy's own numbers are those of its samples, before any filter
    plain, pm = _sample({})
    assert m["reward/mean"] == pm["reward/mean"] and m["reward/zero_std_frac"] == pm["reward/zero_std_frac"] > 0


def test_filters_report_what_they_removed():
    _, rows = _rows({"task": {**COIN["task"], "n": 4, "vocab": 6}, "group_size": 4},
                    filters=[{"name": "top_entropy", "rho": 0.25}, {"name": "overlong_punish", "cache": 2}])
    gated = [v for _, m, v in rows if m == "filter/top_entropy/gated"]
    assert gated and all(0.6 <= v <= 0.8 for v in gated)       # about 1 - rho of the tokens
    # every response of the toy has n = 4 tokens, the whole budget: the full penalty of -1
    assert {v for _, m, v in rows if m == "filter/overlong_punish/reward_shift"} == {-1.0}


def test_reference_follows_its_schedule():
    # K = 1, KL in the loss: at each step kl/value compares the current policy with the reference,
    # so it is exactly 0 where the reference was just set to the policy and positive elsewhere
    over = {**RICH, "kl_coef": 0.1, "kl": "k2", "epochs": 5, "lr": 0.05, "ref_update": {"name": "hard", "every": 2}}
    _, rows = _rows(over)
    kl = [v for _, m, v in rows if m == "kl/value"]
    assert kl[0] == 0.0 and kl[2] == 0.0 and kl[4] == 0.0      # epoch 0 (initial policy), 2, 4
    assert kl[1] > 0 and kl[3] > 0
    _, rows = _rows({**over, "ref_update": "frozen"})
    assert all(v > 0 for v in [v for _, m, v in rows if m == "kl/value"][1:])
    _, rows = _rows({**over, "ref_update": {"name": "soft", "every": 1, "alpha": 0.5}})
    soft = [v for _, m, v in rows if m == "kl/value"]
    assert all(0 < s for s in soft[1:])


def test_kl_in_the_reward_is_subtracted(monkeypatch):
    seen = []
    raw = registry.entry("delta", "centered")

    def spy(rewards, lengths=None, greedy=None, components=None, extra=None):
        seen.append(rewards.clone())
        return raw.obj(rewards, lengths, greedy)

    _install_spy(monkeypatch, raw, spy, seen)
    beta = 0.5
    _, rows = _rows({**RICH, "kl_coef": beta, "kl": "k2", "kl_placement": "reward", "lr": 0.1, "epochs": 3})
    by_epoch = {}
    for _, m, v in rows:
        by_epoch.setdefault(m, []).append(v)
    for epoch in (1, 2):
        gap = by_epoch["reward/mean"][epoch] - by_epoch["reward/penalised"][epoch]
        # r - beta * sum_t k2: every response has n = 3 tokens, so the mean sequence KL is 3 kl/value
        assert gap == pytest.approx(beta * 3 * by_epoch["kl/value"][epoch], rel=1e-5)
        assert gap > 0
        assert seen[epoch].mean().item() == pytest.approx(by_epoch["reward/penalised"][epoch], rel=1e-6)


def test_eval_rows_at_the_configured_cadence():
    _, rows = _rows({"epochs": 7, "inner_steps": 2, "eval_every": 3})
    steps = sorted({s for s, m, _ in rows if m == "eval/accuracy"})
    # before training, after epochs 3 and 6, and at the end
    assert steps == [0, 5, 11, 13]
    _, rows = _rows({"epochs": 7, "inner_steps": 2})
    assert sorted({s for s, m, _ in rows if m == "eval/accuracy"}) == [13]


def test_adaptive_kl_moves_beta_towards_its_target():
    over = {**RICH, "kl_coef": 0.1, "kl": "k3", "epochs": 8, "lr": 0.05}
    _, rows = _rows(over, kl_ctrl={"name": "adaptive", "target": 1e-6, "horizon": 100.0})
    coefs = [v for _, m, v in rows if m == "kl/coef"]
    # epoch 0 samples the reference itself (KL 0, below target: beta shrinks), then KL >> target: it grows
    assert coefs[0] == 0.1 and coefs[1] == pytest.approx(0.1 * (1 - 0.2 * 32 / 100))
    assert all(b > a for a, b in zip(coefs[1:], coefs[2:]))
    _, rows = _rows(over, kl_ctrl={"name": "adaptive", "target": 100.0, "horizon": 100.0})
    coefs = [v for _, m, v in rows if m == "kl/coef"]
    assert all(b < a for a, b in zip(coefs, coefs[1:]))


def test_remax_gets_the_greedy_baseline():
    # with ReMax the advantage of a response equal to the greedy one is exactly 0
    cfg = resolve_run({**COIN, "delta": "remax", "task": {**COIN["task"], "n": 2, "vocab": 3}})
    task = registry.get("task", "sort")(cfg.task, [cfg])
    ro = task.rollout(0, 0, 4)
    greedy = task.greedy_rewards(ro)[0]
    with torch.no_grad():
        g = task.policy(ro.prompts)[0].argmax(-1)
    same = (ro.responses[0] == g.unsqueeze(1)).all(-1)
    d = registry.get("delta", "remax")(ro.rewards[0], None, greedy)
    assert same.any() and (d[same] == 0).all()
    _, rows = _rows({"delta": "remax"})
    assert rows


# ------------------------------------------------------------------ the loop's bookkeeping


def _by_metric(rows):
    out = {}
    for step, m, v in rows:
        out.setdefault(m, []).append((step, v))
    return out


def test_log_cadence_and_the_summary():
    summary, rows = _rows({**RICH, "epochs": 20, "inner_steps": 2, "log_every": 4})
    m = _by_metric(rows)
    # every 4th gradient step, and always the last
    assert [s for s, _ in m["loss/total"]] == [3, 7, 11, 15, 19, 23, 27, 31, 35, 39]
    assert [v for _, v in m["epoch"]] == [1, 3, 5, 7, 9, 11, 13, 15, 17, 19]
    # final/reward: the mean rollout reward of the last tenth of the epochs (here 2), the first epoch's too
    # the same seed logging every step: the same samples, every epoch's reward/mean
    _, every = _rows({**RICH, "epochs": 20, "inner_steps": 2, "log_every": 1})
    per_epoch = [v for s, k, v in every if k == "reward/mean" and s % 2 == 0]
    assert len(per_epoch) == 20 and [v for _, v in m["reward/mean"]] == per_epoch[1::2]
    assert summary["final/reward"] == pytest.approx((per_epoch[18] + per_epoch[19]) / 2)
    assert summary["final/reward_first"] == per_epoch[0]
    # 8 prompts x 4 responses a rollout, no filter: 32 responses each
    assert summary["final/samples"] == 20 * 32 and m["samples/total"][-1][1] == 20 * 32
    assert [v for _, v in m["samples/total"]] == [32.0 * (e + 1) for e in range(1, 20, 2)]
    assert summary["final/eval/accuracy"] == m["eval/accuracy"][-1][1] and m["eval/accuracy"][-1][0] == 39


def test_sample_reports_what_the_policy_sampled():
    ro, m = _sample({**RICH})
    r = ro.rewards
    assert m["reward/mean"] == pytest.approx(r.mean().item()) and m["reward/std"] == pytest.approx(r.std().item())
    assert m["reward/zero_std_frac"] == pytest.approx(_flat(r).float().mean().item())
    assert m["response/length"] == 3.0 and m["samples/responses"] == 8 * 4
    assert "filter/draws" not in m


def test_length_and_reward_spreads_by_hand():
    """The mechanisms' spreads (length_bias, aggregation, adv_norm) over the groups a loss sees, against numpy on
    the lengths listed by hand: a flat group (advantage 0 under every delta) counts in none of them, and a member
    with only flat groups logs NaN, not a 0 that would read as "did not act"."""
    import numpy as np

    from grpo_bench.engine.sampling import _rollout_metrics
    from grpo_bench.tasks import Rollout

    # member 2: one group a loss sees, two of its responses empty (a mean length under 1 token)
    lengths = [[[2, 4, 6], [5, 5, 5], [3, 3, 10]], [[4, 4, 4], [1, 7, 7], [2, 2, 2]], [[0, 0, 1], [3, 3, 3], [2, 2, 2]]]
    rewards = torch.tensor([[[0, 1, 1], [1, 1, 1], [0, 0, 0.5]], [[1, 1, 1], [0, 0, 0], [1, 1, 1]],
                            [[0, 1, 0], [1, 1, 1], [0, 0, 0]]])
    mask = torch.zeros(3, 3, 3, 12)
    for p, member in enumerate(lengths):
        for b, group in enumerate(member):
            for g, n in enumerate(group):
                mask[p, b, g, :n] = 1
    m = _rollout_metrics(Rollout(prompts=None, responses=torch.zeros(3, 3, 3, 12, dtype=torch.long), mask=mask,
                                 rewards=rewards))
    live = [np.array(lengths[0][0], float), np.array(lengths[0][2], float)]   # member 0's groups 0 and 2

    def cv(x):
        return np.std(x) / np.mean(x)
    assert m["response/length_cv"][0].item() == pytest.approx(cv(np.concatenate(live)))
    assert m["response/length_group_cv"][0].item() == pytest.approx((cv(live[0]) + cv(live[1])) / 2)
    assert m["response/length_prompt_cv"][0].item() == pytest.approx(cv([12, 16]))   # = 1/7
    assert m["reward/group_std_cv"][0].item() == pytest.approx(1 / 3)   # stds s and s/2 (0, 1, 1 and 0, 0, 1/2)
    assert all(math.isnan(m[k][1].item()) for k in ("response/length_cv", "response/length_group_cv",
                                                      "response/length_prompt_cv", "reward/group_std_cv"))
    # one group: its own spread, and nothing between groups to vary
    assert m["response/length_cv"][2].item() == pytest.approx(cv([0, 0, 1])) == m["response/length_group_cv"][2].item()
    assert m["response/length_prompt_cv"][2].item() == 0 and m["reward/group_std_cv"][2].item() == 0


def test_step_metrics_by_hand():
    from grpo_bench.engine.trainer import _step_metrics
    logp = torch.tensor([[[-1.0, -2.0, -3.0]]])
    old = torch.tensor([[[-1.5, -1.75, -1.0]]])
    mask = torch.tensor([[[1.0, 1.0, 0.0]]])
    ent = torch.tensor([[[0.5, 1.5, 9.0]]])
    m = {k: v.item() for k, v in _step_metrics(logp, old, mask, ent).items()}
    assert m["ratio/max"] == pytest.approx(math.exp(0.5)) and m["ratio/min"] == pytest.approx(math.exp(-0.25))  # not the masked e^-2
    assert m["kl/old"] == pytest.approx((math.expm1(0.5) - 0.5 + math.expm1(-0.25) + 0.25) / 2)  # (r - 1) - log r
    assert m["entropy"] == pytest.approx(1.0)
    none = {k: v.item() for k, v in _step_metrics(logp, old, torch.zeros_like(mask), None).items()}
    assert none["ratio/max"] == none["ratio/min"] == 1.0 and "entropy" not in none and none["kl/old"] == 0.0


def test_removed_reports_each_kind_of_change():
    from grpo_bench.algos import Batch
    from grpo_bench.engine.recipe import effect

    def _removed(before, after):
        return {k: v.item() for k, v in effect(before, after).items()}
    mask = torch.tensor([[[1.0, 1.0], [1.0, 0.0]], [[1.0, 1.0], [0.0, 0.0]]])   # 5 tokens
    b = Batch(torch.tensor([[1.0, 0.0], [2.0, 2.0]]), mask, torch.tensor([[2, 1], [2, 0]]),
              torch.ones(2, 2, dtype=torch.bool), 2)
    assert _removed(b, b) == {}
    cut = mask.clone()
    cut[0, 0] = 0  # two of the five tokens
    assert _removed(b, b.replace(mask=cut)) == {"removed": pytest.approx(2 / 5)}
    gate = torch.ones_like(mask)
    gate[1, 0, 0] = 0  # one token; gates on masked tokens do not count
    gate[1, 1] = 0
    assert _removed(b, b.replace(gate=gate)) == {"gated": pytest.approx(1 / 5)}
    gated = b.replace(gate=gate)
    assert _removed(gated, gated.replace(gate=gate * 0)) == {"gated": pytest.approx(4 / 5)}  # newly gated only
    assert _removed(b, b.replace(keep=torch.tensor([True, False]))) == {"dropped_groups": 0.5}
    assert _removed(b, b.replace(rewards=b.rewards - 0.5)) == {"reward_shift": -0.5}
    # what a filter passed on unchanged is not its doing
    kept = b.replace(keep=torch.tensor([True, False]))
    assert _removed(gated, gated) == {} and _removed(kept, kept.replace(rewards=b.rewards + 1)) == {"reward_shift": 1.0}
    one = b.replace(mask=torch.zeros_like(mask))
    one.mask[0, 0, 0] = 1.0   # a single token: removing it removes all of the batch
    assert _removed(one, one.replace(mask=torch.zeros_like(mask))) == {"removed": 1.0}


def test_optimizer_follows_the_config(monkeypatch):
    from grpo_bench.engine import trainer
    made = []
    real = trainer.StackedOptimizer
    monkeypatch.setattr(trainer, "StackedOptimizer", lambda *a, **k: made.append(a) or real(*a, **k))
    for name in ("adam", "adamw", "sgd"):
        _rows({"optimizer": name, "lr": 0.3, "weight_decay": 0.01, "epochs": 1})
        params, kind, lr, wd = made[-1]
        assert kind == name and lr == [0.3] and wd == [0.01] and all(p.requires_grad for p in params)


def _captured(monkeypatch):
    from grpo_bench.engine import trainer
    built = []

    def build(cfgs):
        task = registry.get("task", "sort")(cfgs[0].task, cfgs)
        built.append((task, {k: v.clone() for k, v in task.policy.state_dict().items()}))
        return task

    monkeypatch.setattr(trainer, "build_task", build)
    return built


def test_max_grad_norm_bounds_each_step(monkeypatch):
    built = _captured(monkeypatch)
    over = {**RICH, "epochs": 1, "optimizer": "sgd", "lr": 1.0}
    _, rows = _rows({**over, "max_grad_norm": 1e-3})
    task, before = built[-1]
    moved = torch.sqrt(sum(((p - before[k]) ** 2).sum() for k, p in task.policy.state_dict().items()))
    assert moved.item() == pytest.approx(1e-3, rel=1e-4)   # one SGD step of the clipped gradient, lr 1
    gnorm = [v for _, m, v in rows if m == "grad/norm"][0]
    assert gnorm > 1e-2                                     # the norm before clipping is what is logged
    _, rows = _rows({**over, "max_grad_norm": 0.0})
    task, before = built[-1]
    moved = torch.sqrt(sum(((p - before[k]) ** 2).sum() for k, p in task.policy.state_dict().items()))
    assert moved.item() == pytest.approx(gnorm, rel=1e-4)   # 0: no clipping


def test_inner_steps_start_on_policy_and_move_off_it():
    _, rows = _rows({**RICH, "epochs": 2, "inner_steps": 3, "lr": 0.05, "loss": "unclipped"})
    m = {k: dict(v) for k, v in _by_metric(rows).items()}
    for first in (0, 3):  # the first step of each rollout: ratio exactly 1, no drift yet
        assert m["ratio/max"][first] == m["ratio/min"][first] == 1.0 and m["kl/old"][first] == 0.0
    for later in (1, 2, 4, 5):
        assert m["ratio/max"][later] > 1.0 > m["ratio/min"][later] and m["kl/old"][later] > 0
    assert m["kl/old"][2] > m["kl/old"][1]  # further from the sampler at every step
    # K = 1: every step is on-policy
    _, rows = _rows({**RICH, "epochs": 3, "lr": 0.05})
    assert {v for _, m_, v in rows if m_ in ("ratio/max", "ratio/min")} == {1.0}


def test_a_non_finite_loss_stops_the_run():
    from grpo_bench.engine.trainer import NonFiniteLoss
    rows = []
    with pytest.raises(NonFiniteLoss, match="non-finite loss"):
        train(resolve_run({**RICH, "optimizer": "sgd", "lr": 1e30, "epochs": 5, "inner_steps": 2}), rows=rows)
    assert rows  # what was logged before it is kept


def test_deltas_see_the_rewards_and_lengths(monkeypatch):
    seen = []
    raw = registry.entry("delta", "centered")

    def spy(rewards, lengths=None, greedy=None, components=None, extra=None):
        seen.append((rewards.clone(), lengths.clone(), greedy))
        return raw.obj(rewards, lengths, greedy)

    _install_spy(monkeypatch, raw, spy, seen)
    _, rows = _rows({**RICH, "epochs": 2})
    m = dict((m, v) for s, m, v in rows if s == 0)
    r, lengths, greedy = seen[0]
    assert torch.equal(lengths, torch.full((8, 4), 3.0)) and greedy is None   # tokens per response
    assert m["reward/mean"] == pytest.approx(r.mean().item())
    assert m["delta/abs_mean"] == pytest.approx(raw.obj(r).abs().mean().item())
    assert "kl/coef" not in m and "kl/value" not in m and "reward/penalised" not in m   # no KL, no reference


def _wrapped(monkeypatch, mask_fn=None):
    """The sort task, with its rollouts' masks edited by mask_fn and every logprobs call recorded:
    (reference?, policy in train mode?, grad enabled?, logp)."""
    from grpo_bench.engine import trainer
    calls, modes = [], []

    def build(cfgs):
        task = registry.get("task", "sort")(cfgs[0].task, cfgs)
        rollout, logprobs, evaluate = task.rollout, task.logprobs, task.evaluate

        def rollout_(*a, **k):
            modes.append(("rollout", task.policy.training))
            ro = rollout(*a, **k)
            return ro if mask_fn is None else ro.replace(mask=mask_fn(ro.mask[0].clone()).unsqueeze(0))

        def logprobs_(ro, reference=False):
            out = logprobs(ro, reference=reference)
            calls.append((reference, task.policy.training, torch.is_grad_enabled(), out[0][0].detach().clone()))
            return out

        def evaluate_():
            modes.append(("evaluate", task.policy.training))
            return evaluate()

        task.rollout, task.logprobs, task.evaluate = rollout_, logprobs_, evaluate_
        return task

    monkeypatch.setattr(trainer, "build_task", build)
    return calls, modes


def test_sampling_and_old_logprobs_without_dropout_gradient_pass_with_it(monkeypatch):
    calls, modes = _wrapped(monkeypatch)
    _rows({**RICH, "epochs": 2, "inner_steps": 2, "eval_every": 1, "kl_coef": 0.1})
    # per epoch: reference (no grad), old log-probs (eval mode, no grad), one gradient pass per inner step
    assert [(r, tr, g) for r, tr, g, _ in calls] == [(True, True, False), (False, False, False), (False, True, True),
                                                     (False, True, True)] * 2
    assert {m for _, m in modes} == {False}   # rollouts and evaluations in eval mode
    assert [k for k, _ in modes] == ["evaluate", "rollout", "evaluate", "rollout", "evaluate"]
    calls.clear()
    modes.clear()
    _rows({**RICH, "epochs": 2, "inner_steps": 1})
    # K = 1: the gradient pass gives the old log-probs too; no second pass
    assert [(r, tr, g) for r, tr, g, _ in calls] == [(False, True, True)] * 2
    # no evaluation between epochs: the second rollout still samples in eval mode
    assert modes == [("rollout", False), ("rollout", False), ("evaluate", False)]


def test_kl_controller_sees_the_rollouts_kl(monkeypatch):
    def mask_fn(m):
        m[0, 0] = 0           # an empty response: not part of the mean
        m[1, 0, 1:] = 0       # one token
        m[:, 1, -1] = 0
        return m

    calls, _ = _wrapped(monkeypatch, mask_fn)
    seen = []
    fixed = registry.entry("kl_ctrl", "fixed")
    monkeypatch.setitem(registry._REGISTRY["kl_ctrl"], "fixed",
                        dataclasses.replace(fixed, obj=lambda c, kl, n: seen.append((kl, n)) or c))
    _rows({**RICH, "epochs": 3, "kl_coef": 0.1, "kl": "k2", "lr": 0.05})
    seen[:] = [x for x in seen if x[1] == 32]  # not the contract check's probe (registry: 2 x 3 responses)
    mask = mask_fn(torch.ones(8, 4, 3))
    for epoch, (kl, n) in enumerate(seen):
        ref, old = calls[2 * epoch][3], calls[2 * epoch + 1][3]
        k2 = 0.5 * (old - ref) ** 2
        per_response = [(k2[b, g] * mask[b, g]).sum() / mask[b, g].sum()
                        for b in range(8) for g in range(4) if mask[b, g].sum() > 0]
        assert kl == pytest.approx(torch.stack(per_response).mean().item(), rel=1e-6) and n == 32
    assert seen[0][0] == 0.0 and seen[1][0] > 0
    seen.clear()
    _wrapped(monkeypatch, lambda m: m * 0)  # every token masked: no KL to observe, and no nan
    _rows({**RICH, "epochs": 2, "kl_coef": 0.1, "kl": "k2"})
    assert [kl for kl, _ in seen] == [0.0, 0.0]


def test_kl_seq_is_the_mean_over_responses_of_each_summed_log_ratio(monkeypatch):
    # tracked only (no KL coefficient): the reference is the initial policy, so from epoch 1 on
    # old and ref differ. Groups of 4, responses of 3 tokens: a sum over the wrong axis, or a mean
    # over the wrong count, gives another number
    def mask_fn(m):
        m[0, 0] = 0           # an empty response: a sequence KL of 0 that still counts in the mean
        m[1, 2, 1:] = 0
        return m

    calls, _ = _wrapped(monkeypatch, mask_fn)
    _, rows = _rows({**RICH, "epochs": 3, "kl_track": True, "lr": 0.1})
    assert [r for r, *_ in calls] == [True, False] * 3     # per epoch: the reference, then the policy
    kl_seq = [v for _, m, v in rows if m == "kl/seq"]
    mask = mask_fn(torch.ones(8, 4, 3))
    for epoch, got in enumerate(kl_seq):
        ref, old = calls[2 * epoch][3], calls[2 * epoch + 1][3]
        total = sum(float(old[b, g, t] - ref[b, g, t]) for b in range(8) for g in range(4) for t in range(3)
                    if mask[b, g, t] > 0)
        assert got == pytest.approx(total / 32, rel=1e-5, abs=1e-7)   # 8 prompts x 4 responses
    assert kl_seq[0] == 0.0 and abs(kl_seq[2]) > 1e-3


def test_summary_tails_average_the_last_tenth_of_the_epochs():
    # 20 epochs: the last 2; 5 epochs: at least the last one. kl/seq moves every epoch, so another
    # window gives another number
    for epochs, tail in [(20, 2), (5, 1)]:
        summary, rows = _rows({**RICH, "epochs": epochs, "kl_track": True, "lr": 0.1})
        kl_seq = [v for _, m, v in rows if m == "kl/seq"]
        assert len(kl_seq) == epochs and len(set(kl_seq[-3:])) == 3
        assert summary["final/kl/seq"] == pytest.approx(sum(kl_seq[-tail:]) / tail, rel=1e-12)
        assert summary["final/response/length"] == 3.0     # the sort task answers with all n = 3 tokens


def test_narrowing_a_rollout_keeps_the_survivors_reward_components_and_sampler_log_probs():
    from grpo_bench.engine.trainer import _narrow

    ro = _Scripted([[[[1.0, 0.0]] * 2]] * 3).rollout(0, 0, 2)
    ro = ro.replace(components=torch.arange(3.0).view(3, 1).expand(3, 4), sampler_logp=-torch.arange(3.0).view(3, 1))
    kept = _narrow(ro, [0, 2])
    assert kept.components[:, 0].tolist() == [0.0, 2.0] and kept.sampler_logp[:, 0].tolist() == [0.0, -2.0]
    assert kept.rewards.shape[0] == 2
    bare = _narrow(ro.replace(components=None, sampler_logp=None), [1])
    assert bare.components is None and bare.sampler_logp is None


def test_a_population_narrowed_after_a_failure_maps_the_survivors_numbers_on_a_device():
    # off the CPU, map copies the members' numbers to the device once and reuses them: after keep() the copy
    # must be of the survivors' ('meta' stands in for CUDA: its tensors have shapes and no values)
    pop = Population([resolve_run({**COIN, "loss": {"name": "clipped", "clip_high": 0.2 + 0.1 * i}, "seed": i})
                      for i in range(3)])
    shapes = lambda out: tuple(out.shape)  # noqa: E731
    fn = lambda a, numbers: a.sum() + numbers["loss.clip_high"]  # noqa: E731
    assert shapes(pop.map(fn, torch.zeros(3, 2, device="meta"), per_member=False)) == (3,)
    pop.keep([0, 2])
    assert pop.seeds == [0, 2] and pop.numbers["loss.clip_high"].tolist() == pytest.approx([0.2, 0.4])
    assert shapes(pop.map(fn, torch.zeros(2, 2, device="meta"), per_member=False)) == (2,)


def test_a_delta_that_needs_entropies_is_refused_where_the_task_gives_none():
    from grpo_bench.engine.recipe import Recipe
    from grpo_bench.engine.trainer import _extra

    ro = _Scripted([[[[1.0, 0.0], [0.0, 1.0]]]]).rollout(0, 0, 2)
    logp = torch.zeros(1, 2, 2, 1)
    gtpo = Recipe.from_config(resolve_run({**COIN, "delta": "gtpo"}))
    with pytest.raises(ValueError, match="delta 'gtpo' needs the policy's entropy; the task gave none"):
        _extra(None, ro, gtpo, logp, None)
    ids, old, ent, *_ = _extra(None, ro, gtpo, logp, torch.ones(1, 2, 2, 1))
    assert ids is ro.responses and old is None and ent.sum() == 4
    # one that needs no entropy goes on without it
    task = type("T", (), {"sum_pi_squared": lambda self, r: torch.full((1, 2, 2, 1), 0.5)})()
    otb = Recipe.from_config(resolve_run({**COIN, "delta": "optimal_token_baseline"}))
    ids, old, ent, pi2, ref = _extra(task, ro, otb, logp, None)
    assert ids is None and old is logp and ent is None and pi2.sum() == 2 and ref is None


def test_a_step_filter_s_gate_reaches_the_loss():
    # top_entropy trains on the highest-entropy tokens only: the first update already differs from the unfiltered
    # one, and at rho 1 (every token kept) it is the unfiltered one to the bit
    def first(filters):
        _, rows = _rows({**RICH, "epochs": 1, "inner_steps": 1, "log_every": 1, "filters": filters})
        return [v for _, m, v in rows if m in ("loss/policy", "grad/norm")]

    plain = first([])
    assert first([{"name": "top_entropy", "rho": 0.3}]) != plain
    assert first([{"name": "top_entropy", "rho": 1.0}]) == plain


def test_kl_in_the_loss_leaves_the_rewards_alone(monkeypatch):
    seen = []
    raw = registry.entry("delta", "centered")
    spy = lambda r, n=None, g=None, c=None, x=None: seen.append(r.clone()) or raw.obj(r, n, g)  # noqa: E731
    _install_spy(monkeypatch, raw, spy, seen)
    _, rows = _rows({**RICH, "epochs": 3, "kl_coef": 0.5, "kl": "k2", "lr": 0.1, "kl_placement": "loss"})
    means = [v for _, m, v in rows if m == "reward/mean"]
    assert [r.mean().item() for r in seen] == pytest.approx(means, rel=1e-6)
    assert [v for _, m, v in rows if m == "kl/value"][-1] > 0    # there was a KL to subtract
    assert not any(m == "reward/penalised" for _, m, _ in rows)


def test_kl_in_the_loss_is_in_the_loss():
    # all responses are full (n tokens): the aggregated KL term is beta times the token mean kl/value
    for placement in ("loss", "reward"):
        _, rows = _rows({**RICH, "epochs": 3, "kl_coef": 0.5, "kl": "k2", "lr": 0.05, "kl_placement": placement})
        m = {k: [v for _, v in vs] for k, vs in _by_metric(rows).items()}
        for total, policy, kl in zip(m["loss/total"], m["loss/policy"], m["kl/value"]):
            if placement == "loss":
                assert total - policy == pytest.approx(0.5 * kl, rel=1e-5, abs=1e-9)
            else:
                assert total == policy
        assert m["kl/value"][-1] > 0


def test_step_time_counts_the_rollout_once(monkeypatch):
    from grpo_bench.engine import trainer

    class Clock:  # one second per reading
        now = 0.0

        def perf_counter(self):
            self.now += 1.0
            return self.now

    monkeypatch.setattr(trainer, "time", Clock())
    _, rows = _rows({**RICH, "epochs": 2, "inner_steps": 3})
    # the first step of a rollout: its own second plus the rollout's; the others: their own
    assert [v for _, m, v in rows if m == "time/step_s"] == [2.0, 1.0, 1.0] * 2


def test_gradients_do_not_accumulate_across_inner_steps(monkeypatch):
    from grpo_bench.engine import trainer
    real = trainer.StackedOptimizer
    monkeypatch.setattr(trainer, "StackedOptimizer", lambda params, *a: real(params, "sgd", [0.0], [0.0]))
    _, rows = _rows({**RICH, "epochs": 1, "inner_steps": 3, "loss": "unclipped"})
    norms = [v for _, m, v in rows if m == "grad/norm"]
    assert norms[0] > 0 and norms == [norms[0]] * 3   # the same loss each step (lr 0): the same gradient


def test_device_auto_and_short_runs():
    cfg = resolve_run({**RICH, "epochs": 3, "device": "auto"})
    summary = train(cfg)
    assert cfg.device == ("cuda" if torch.cuda.is_available() else "cpu")
    rows = []
    summary = train(resolve_run({**RICH, "epochs": 3, "log_every": 4, "inner_steps": 2}), rows=rows)
    assert sorted({s for s, m, _ in rows if m == "loss/total"}) == [3, 5]   # the last step, off the grid
    last = [v for s, m, v in rows if m == "reward/mean" and s == 5][0]
    assert summary["final/reward"] == last   # fewer than 20 epochs: the last epoch alone
    _, rows = _rows({"epochs": 6, "inner_steps": 1, "eval_every": 3})
    evals = [s for s, m, _ in rows if m == "eval/accuracy"]
    assert evals == [0, 2, 5]   # at 0, after epoch 3, and once at the end (not twice)


class _Scripted:
    """A task whose rollouts are given: P members, B = 2 prompts, G = 2, one token each.

    rewards[p][d] is member p's draw d; a draw asked for that was not scripted is all zeros."""

    def __init__(self, rewards):
        self.rewards, self.asked = rewards, []

    def rollout(self, epoch, draw, group_size):
        from grpo_bench.tasks import Rollout
        self.asked.append(draw)
        r = torch.tensor([m[draw] if draw < len(m) else [[0.0, 0.0]] * 2 for m in self.rewards])
        p = len(self.rewards)
        prompts = getattr(self, "prompts", None)
        return Rollout(prompts=torch.arange(2).expand(p, 2) if prompts is None else prompts, responses=torch.zeros(p, 2, 2, 1, dtype=torch.long),
                       mask=torch.ones(p, 2, 2, 1), rewards=r)


def _scripted_sample(rewards, max_draws):
    cfg = resolve_run({**COIN, "filters": [{"name": "dynamic_sampling", "max_draws": max_draws}]})
    cfgs = [resolve_run({**COIN, "filters": cfg.filters, "seed": s}) for s in range(len(rewards))]
    task = _Scripted(rewards)
    ro, m, _ = sample(task, Population(cfgs), 0, cfg.group_size, cfg.task.generation_budget)
    return ro, {k: v.tolist() for k, v in m.items()}, task


def test_dynamic_sampling_stops_as_soon_as_the_batch_is_full():
    ro, m, _ = _scripted_sample([[[[1.0, 0.0], [1.0, 1.0]], [[0.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [0.0, 1.0]]]], 5)
    assert m["filter/draws"] == [2.0] and m["filter/capped"] == [0.0] and m["samples/responses"] == [8]
    assert ro.rewards[0].tolist() == [[1.0, 0.0], [0.0, 1.0]]      # the first group with signal of each draw
    assert m["filter/dynamic_sampling/dropped_groups"] == [0.5] and m["reward/zero_std_frac"] == [0.5]
    # capped: filled with the dropped groups, in draw order
    ro, m, _ = _scripted_sample([[[[1.0, 1.0], [1.0, 0.0]], [[0.0, 0.0], [1.0, 1.0]]]], 2)
    assert m["filter/draws"] == [2.0] and m["filter/capped"] == [1.0]
    assert ro.rewards[0].tolist() == [[1.0, 0.0], [1.0, 1.0]]


def test_a_member_whose_reward_failed_asks_for_no_more_draws():
    # both members' first draws leave them short; member 0's reward raised there, so only member 1 draws on,
    # and member 0's failure is reported once, from the draw it needed
    class Failing(_Scripted):
        def rollout(self, epoch, draw, group_size):
            if draw == 0:
                self.failed = {0: ValueError("reward")}
            return super().rollout(epoch, draw, group_size)

    flat = [[1.0, 1.0], [0.0, 0.0]]
    task = Failing([[flat, flat, flat], [flat, [[0.0, 1.0], [1.0, 0.0]]]])
    cfgs = [resolve_run({**COIN, "filters": [{"name": "dynamic_sampling", "max_draws": 3}], "seed": s}) for s in range(2)]
    _, m, failed = sample(task, Population(cfgs), 0, cfgs[0].group_size, cfgs[0].task.generation_budget)
    assert task.asked == [0, 1] and list(failed) == [0]
    assert m["filter/draws"].tolist() == [1.0, 2.0]


def test_a_curriculum_retires_each_member_s_passed_prompts_and_only_those():
    # member 0 passes its prompt 1 (every response 1.0) but not prompt 0; member 1 passes neither
    cfgs = [resolve_run({**COIN, "filters": ["no_positive_resample"], "seed": s}) for s in range(2)]
    task = _Scripted([[[[1.0, 0.0], [1.0, 1.0]]], [[[0.0, 1.0], [1.0, 0.0]]]])
    task.prompts = torch.tensor([[[3], [4]], [[5], [6]]])   # (P, B, n): which prompt is which
    retired = []
    task.retire = lambda member, prompts: retired.append((member, prompts.tolist()))
    ro, m, _ = sample(task, Population(cfgs), 0, cfgs[0].group_size, cfgs[0].task.generation_budget)
    assert retired == [(0, [[4]])]
    assert "filter/draws" not in m and task.asked == [0]   # it drops no group: nothing is drawn again
    assert ro.rewards.tolist() == [[[1.0, 0.0], [1.0, 1.0]], [[0.0, 1.0], [1.0, 0.0]]]   # this batch still learns


def test_dynamic_sampling_per_member_in_a_population():
    # member 0 is full after its first draw, member 1 needs two more: each takes only its own draws,
    # and member 0's count, spares and batch are what they are alone
    a = [[[1.0, 0.0], [0.0, 1.0]], [[7.0, 7.0], [5.0, 6.0]]]
    b = [[[1.0, 1.0], [0.0, 0.0]], [[0.0, 1.0], [2.0, 2.0]], [[3.0, 3.0], [4.0, 5.0]]]
    ro, m, task = _scripted_sample([a, b], 4)
    assert task.asked == [0, 1, 2]
    assert m["filter/draws"] == [1.0, 3.0] and m["filter/capped"] == [0.0, 0.0]
    assert m["samples/responses"] == [4.0, 12.0]
    assert ro.rewards.tolist() == [[[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [4.0, 5.0]]]
    alone, m_alone, _ = _scripted_sample([b], 4)
    assert alone.rewards[0].tolist() == ro.rewards[1].tolist() and m_alone["filter/draws"] == [3.0]


@pytest.mark.parametrize("log_every", [1, 6])
def test_a_loss_that_is_not_finite_at_the_first_inner_step_stops_the_run_there(monkeypatch, log_every):
    """The first non-finite loss is noticed whichever inner step it comes at, the very first (k = 0) included: a
    member whose loss is NaN from the start fails at epoch 0, inner step 0, and nothing after it is logged. Checked
    only at the end of the epoch (log_every 6), the failure still names its first step, not a later NaN's."""
    from grpo_bench.engine.trainer import NonFiniteLoss
    loss = resolve_run(RICH).loss
    raw = registry.entry("loss", loss["name"] if isinstance(loss, dict) else loss)

    armed = []

    def nan(logp, *a, **k):   # finite on the registry's probe, NaN in every training step
        loss, regions = raw.obj(logp, *a, **k)
        return (loss * float("nan") if armed else loss), regions

    if log_every == 1:
        _install_spy(monkeypatch, raw, nan, [])
    else:   # vmapped, as the shipped parts are: the trainer then reads failures at its host syncs only
        monkeypatch.setitem(registry._REGISTRY["loss"], raw.name, dataclasses.replace(raw, obj=nan))
        registry.entry("loss", raw.name)
    armed.append(True)
    rows = []
    with pytest.raises(NonFiniteLoss, match="non-finite loss nan at epoch 0, inner step 0"):
        train(resolve_run({**RICH, "epochs": 3, "inner_steps": 2, "log_every": log_every}), rows=rows)
    assert {s for s, _, _ in rows} <= {0}


def test_one_inner_step_takes_its_own_log_probs_as_the_old_ones(monkeypatch):
    """At inner_steps 1 the step's log-probs double as the old ones: detached, so the ratio is 1 with the policy
    gradient's slope (not a constant with none), and with their entropies for a delta that reads them."""
    _, rows = _rows({**RICH, "epochs": 2, "inner_steps": 1, "log_every": 1, "optimizer": "sgd"})
    norms = [v for _, m, v in rows if m == "grad/norm"]
    assert len(norms) == 2 and min(norms) > 1e-3
    # GTPO's deltas weigh tokens by the old policy's entropy: the first step is the same step at 1 inner step as at
    # 2, whose old log-probs and entropies come from a pass without a graph
    first = [{m: v for s, m, v in _rows({**RICH, "epochs": 1, "inner_steps": k, "log_every": 1,
                                         "delta": {"name": "gtpo", "threshold": 5.0}})[1] if s == 0}
             for k in (1, 2)]
    for m in ("loss/total", "grad/norm"):
        assert first[0][m] == pytest.approx(first[1][m], rel=1e-6), m


def test_the_nll_terms_responses_are_those_with_a_positive_reward(monkeypatch):
    """VAPO's positive-example NLL: the trainer hands the loss the responses whose reward is above 0 (on the coin a
    response scores 0 or 1)."""
    from grpo_bench.engine import recipe as recipe_mod, trainer
    rewards, positives = [], []
    sample, loss = trainer.sample, recipe_mod.Recipe.loss

    def sampled(*a, **k):
        out = sample(*a, **k)
        rewards.append(out[0].rewards[0])
        return out

    def loss_of(self, *a, **k):
        positives.append(k["positive"])
        return loss(self, *a, **k)

    monkeypatch.setattr(trainer, "sample", sampled)
    monkeypatch.setattr(recipe_mod.Recipe, "loss", loss_of)
    raw = registry.entry("loss", "clipped")
    _install_spy(monkeypatch, raw, raw.obj, [])   # member by member: the spy sees real tensors
    _rows({"nll_coef": 0.1, "loss": "clipped"})
    assert len(positives) == len(rewards) == COIN["epochs"]
    for r, pos in zip(rewards, positives):
        assert torch.equal(pos, r > 0)
    assert 0 < sum(int(p.sum()) for p in positives) < sum(p.numel() for p in positives)


def test_the_fused_triton_loss_runs_member_by_member_where_it_is_used():
    from types import SimpleNamespace as NS
    from grpo_bench.engine.trainer import _triton
    assert [_triton(NS(backend=b, device=d)) for b, d in
            [("triton", "cpu"), ("auto", "cpu"), ("auto", "cuda"), ("torch", "cuda")]] == [True, False, True, False]
