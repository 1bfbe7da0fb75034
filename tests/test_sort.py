"""The sorting toy and the trainer on it."""
import torch

from grpo_bench.config import resolve_run
from grpo_bench.algos import rewards
from grpo_bench.tasks.sort import SortTask, score
from grpo_bench.trainer import train


def test_rewards_are_weighted_per_response():
    prompts = torch.tensor([[2, 0, 1]])
    responses = torch.tensor([[[0, 1, 2], [2, 1, 0], [0, 0, 0], [1, 0, 2]]])
    fns = rewards.check({"match": 1.0, "inclusion_order": 0.5}, "sort")
    total, means, parts = score(fns, prompts, responses)
    # match 1, 1/3, 1/3, 1/3; inclusion_order 5/5, 3/5, 3/5, 4/5 (see test_lm_rewards)
    torch.testing.assert_close(total, torch.tensor([[1.5, 1 / 3 + 0.3, 1 / 3 + 0.3, 1 / 3 + 0.4]]))
    torch.testing.assert_close(parts, torch.tensor([[[1.0, 1.0], [1 / 3, 0.6], [1 / 3, 0.6], [1 / 3, 0.8]]]))
    assert abs(means["reward/match"] - 0.5) < 1e-9 and abs(means["reward/inclusion_order"] - 0.75) < 1e-9


def test_lecture_defaults():
    cfg = resolve_run({"task": {"name": "sort"}})
    assert (cfg.task.n, cfg.task.vocab, cfg.task.prompts) == (3, 5, [[1, 0, 2], [3, 2, 4], [1, 2, 3]])
    assert (cfg.group_size, cfg.lr, cfg.epochs, cfg.inner_steps, cfg.optimizer) == (10, 1e-3, 100, 10, "adam")


def test_rollout_shapes_and_logprobs():
    cfg = resolve_run({"task": {"name": "sort", "prompts": None, "n": 4, "vocab": 7, "num_prompts": 3}})
    torch.manual_seed(0)
    task = SortTask(cfg.task, cfg)
    ro = task.rollout(0, 5, torch.Generator().manual_seed(0))
    assert ro.responses.shape == (3, 5, 4) and ro.rewards.shape == (3, 5) and ro.mask.shape == (3, 5, 4)
    assert ro.responses.max() < 7
    logp, ent = task.logprobs(ro)
    # independent per position: log pi(response) is the gather of the per-position log-softmax
    ref = torch.log_softmax(task.policy(ro.prompts), -1)
    for b in range(3):
        for i in range(5):
            for t in range(4):
                torch.testing.assert_close(logp[b, i, t], ref[b, t, ro.responses[b, i, t]])
    assert (ent > 0).all() and (ent <= torch.log(torch.tensor(7.0)) + 1e-5).all()


def test_reference_is_frozen_until_refresh():
    cfg = resolve_run({"task": "sort", "kl_coef": 0.1})
    task = SortTask(cfg.task, cfg)
    ro = task.rollout(0, 4, torch.Generator().manual_seed(0))
    before = task.logprobs(ro, reference=True)[0].clone()
    with torch.no_grad():
        for p in task.policy.parameters():
            p.add_(0.5)
    torch.testing.assert_close(task.logprobs(ro, reference=True)[0], before)
    task.mix_reference(1.0)
    assert torch.equal(task.logprobs(ro, reference=True)[0], task.logprobs(ro)[0])
    assert not any(p.requires_grad for p in task.reference.parameters())


def _run(over):
    rows = []
    summary = train(resolve_run({"task": {"name": "sort", "prompts": None, "n": 5, "vocab": 8}, "epochs": 15,
                                 "inner_steps": 3, **over}), rows=rows)
    return summary, rows


def test_same_seed_same_numbers():
    over = {"kl_coef": 0.1, "kl": "k2", "ref_update": {"name": "hard", "every": 4}, "seed": 3}
    (s1, r1), (s2, r2) = _run(over), _run(over)
    strip = lambda rows: [r for r in rows if r[1] != "time/step_s"]  # noqa: E731
    assert strip(r1) == strip(r2) and s1 == s2
    s3, r3 = _run({**over, "seed": 4})
    assert strip(r3) != strip(r1)


def test_single_inner_step_never_clips():
    # K = 1: the only step is taken at the old policy, so the ratio is exactly 1
    _, rows = _run({"inner_steps": 1})
    assert {v for _, m, v in rows if m == "clip/frac"} == {0.0}
    assert {v for _, m, v in rows if m in ("ratio/max", "ratio/min")} == {1.0}
    _, rows = _run({"inner_steps": 4, "lr": 0.05, "loss": {"name": "clipped", "clip_low": 0.05, "clip_high": 0.05}})
    assert max(v for _, m, v in rows if m == "clip/frac") > 0


def test_grpo_learns_the_lecture_task():
    summary, rows = _run({"task": {"name": "sort"}, "epochs": 60, "inner_steps": 5, "lr": 0.01})
    assert summary["final/reward"] > summary["final/reward_first"] + 0.15


def test_metric_namespace():
    _, rows = _run({"kl_coef": 0.1})
    names = {m for _, m, _ in rows}
    for m in ["reward/mean", "reward/std", "loss/policy", "loss/total", "kl/value", "clip/frac", "ratio/max",
              "entropy", "grad/norm", "time/step_s", "eval/accuracy"]:
        assert m in names, m
