"""The trainer does what its config says: filters, reference updates, KL placement, eval cadence."""
import dataclasses

import pytest
import torch

from grpo_bench import registry
from grpo_bench.config import resolve_run
from grpo_bench.trainer import _filters, sample, train

# one position, two tokens, two responses per prompt: about half the groups are all-equal
COIN = {"task": {"name": "sort", "prompts": None, "n": 1, "vocab": 2, "num_prompts": 6, "dim": 4},
        "group_size": 2, "epochs": 3, "inner_steps": 1, "delta": "centered"}


# three positions over five tokens, groups of four: every epoch has signal
RICH = {**COIN, "group_size": 4, "task": {**COIN["task"], "n": 3, "vocab": 5, "num_prompts": 8}}


def _rows(over=None, **kw):
    rows = []
    summary = train(resolve_run({**COIN, **(over or {}), **kw}), rows=rows)
    return summary, rows


def _sample(over, seed=0):
    cfg = resolve_run({**COIN, **over})
    torch.manual_seed(cfg.seed)
    task = registry.get("task", "sort")(cfg.task, cfg)
    gen = torch.Generator().manual_seed(seed)
    return sample(task, 0, cfg, gen, _filters(cfg, "rollout"))


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

    def spy(rewards, lengths=None, greedy=None):
        seen.append(rewards.clone())
        return raw.obj(rewards, lengths, greedy)

    monkeypatch.setitem(registry._REGISTRY["delta"], "centered", dataclasses.replace(raw, obj=spy))
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
    torch.manual_seed(0)
    task = registry.get("task", "sort")(cfg.task, cfg)
    ro = task.rollout(0, 4, torch.Generator().manual_seed(0))
    greedy = task.greedy_rewards(ro)
    with torch.no_grad():
        g = task.policy(ro.prompts).argmax(-1)
    same = (ro.responses == g.unsqueeze(1)).all(-1)
    d = registry.get("delta", "remax")(ro.rewards, None, greedy)
    assert same.any() and (d[same] == 0).all()
    _, rows = _rows({"delta": "remax"})
    assert rows
