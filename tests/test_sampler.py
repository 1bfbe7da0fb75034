"""The sampler dial: a copy of the policy that samples in another precision and/or some updates old.

Its own log-probs travel with the rollout, as an inference engine's do; the corrections read
them, and mismatch/* say how far it is from the trainer on what it sampled.
"""
import pytest
import torch

from grpo_bench.errors import ConfigError
from grpo_bench.config.run import resolve_run
from grpo_bench.registry import get
from grpo_bench.engine.trainer import Sampler, train

SORT = {"task": {"name": "sort", "prompts": None, "n": 4, "vocab": 6, "num_prompts": 8, "dim": 16},
        "group_size": 4, "epochs": 12, "inner_steps": 3, "lr": 0.05}


pytestmark = pytest.mark.usefixtures("one_thread")


def _rows(**over):
    rows = []
    train(resolve_run({**SORT, **over}), rows)
    by = {}
    for _, m, v in rows:
        by.setdefault(m, []).append(v)
    return by


def test_the_sampler_loads_the_weights_of_k_updates_ago():
    cfg = resolve_run({**SORT, "sampler": {"staleness": 2}})
    task = get("task", "sort")(cfg.task, [cfg])
    params = [p for p in task.policy.parameters() if p.requires_grad]
    sampler = Sampler(task.policy, params, cfg.sampler)
    seen = [[p.detach().clone() for p in params]]
    for step in range(4):
        with torch.no_grad():
            for p in params:
                p.add_(1.0)
        sampler.updated(params)
        seen.append([p.detach().clone() for p in params])
        loaded = [p.detach() for p in sampler.load(params).parameters()]
        want = seen[max(0, len(seen) - 1 - 2)]   # two updates ago, the start until there were two
        assert all(torch.equal(a, b) for a, b in zip(loaded, want)), step
    assert not any(p.requires_grad for p in sampler.model.parameters())


def test_a_sampler_rollout_carries_the_samplers_own_logprobs():
    cfg = resolve_run({**SORT, "sampler": {"precision": "bf16"}})
    task = get("task", "sort")(cfg.task, [cfg])
    params = [p for p in task.policy.parameters() if p.requires_grad]
    model = Sampler(task.policy, params, cfg.sampler).load(params)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    ro = task.rollout(0, 0, 4, model)
    with torch.no_grad():
        want = torch.log_softmax(model(ro.prompts).float(), -1)            # the bf16 policy's distribution
        mine, _ = task.logprobs(ro)                                        # the fp32 trainer's
    p, b, g, n = ro.responses.shape
    for i in range(b):
        for j in range(g):
            for t in range(n):
                assert ro.sampler_logp[0, i, j, t] == want[0, i, t, ro.responses[0, i, j, t]]
    gap = (ro.sampler_logp - mine).abs()
    assert 0 < gap.max() < 0.05          # bf16 rounding: visible, small
    # the same stream: a sampler in fp32 with the current weights draws what the policy draws
    plain = task.rollout(0, 0, 4)
    assert plain.sampler_logp is None and plain.responses.shape == ro.responses.shape


def test_mismatch_rises_with_staleness_and_corrections_see_it():
    k3 = {k: sum(_rows(sampler={"staleness": k})["mismatch/k3"]) for k in (1, 4, 16)}
    assert 0 < k3[1] < k3[4] < k3[16]
    none = _rows()
    assert "mismatch/kl" not in none          # no sampler: nothing to measure
    # fp16 keeps 10 mantissa bits to bf16's 7: a smaller gap (the FP16 paper's point)
    bf16, fp16 = _rows(sampler={"precision": "bf16"}), _rows(sampler={"precision": "fp16"})
    assert 0 < max(fp16["mismatch/ratio_max"]) - 1 < max(bf16["mismatch/ratio_max"]) - 1
    # a token mask at a tight band drops the stale sampler's outliers, and says so
    masked = _rows(sampler={"staleness": 8}, corrections=[{"name": "token_mis", "low": 0.9, "high": 1.1}])
    assert max(masked["correction/token_mis/masked_frac"]) > 0


def test_a_fresh_fp32_sampler_is_no_sampler():
    assert not resolve_run({**SORT, "sampler": {"precision": "fp32", "staleness": 0}}).sampler.active
    rows_default, rows_explicit = [], []
    train(resolve_run(SORT), rows_default)
    train(resolve_run({**SORT, "sampler": {"precision": "fp32", "staleness": 0}}), rows_explicit)
    strip = lambda rows: [r for r in rows if not r[1].startswith("time/")]  # noqa: E731
    assert strip(rows_default) == strip(rows_explicit)


def test_lm_sampler_logprobs_are_the_models_own():
    """The generation loop's log-probs of its samples equal the task's log-probs of them under the same weights."""
    cfg = resolve_run({"task": {"name": "arithmetic", "ops": {"add": [0, 99]}, "prompts_per_step": 3, "eval_size": 12,
                                "model": {"source": "tiny-scratch", "layers": 1, "width": 32, "heads": 2},
                                "sampling": {"max_new_tokens": 4, "temperature": 0.7}},
                       "group_size": 3, "sampler": {"staleness": 1}})
    task = get("task", "arithmetic")(cfg.task, [cfg])
    with torch.no_grad():
        for layer in task.layers:
            layer.B.add_(0.3 * torch.randn(layer.B.shape, generator=torch.Generator().manual_seed(0)))
    params = [p for p in task.policy.parameters() if p.requires_grad]
    ro = task.rollout(0, 0, 3, Sampler(task.policy, params, cfg.sampler).load(params))
    with torch.no_grad():
        mine, _ = task.logprobs(ro)
    on = ro.mask > 0
    torch.testing.assert_close(ro.sampler_logp[on], mine[on], rtol=1e-5, atol=1e-5)
    assert (ro.sampler_logp[~on] == 0).all()


@pytest.mark.parametrize("key, value, message", [
    ("precision", "fp8", "unknown 'fp8'; valid: fp32, bf16, fp16"),
    ("staleness", -1, "must be >= 0"),
])
def test_bad_sampler_settings_are_one_line_errors(key, value, message):
    with pytest.raises(ConfigError, match=f"sampler.{key}: {message}"):
        resolve_run({**SORT, "sampler": {key: value}})
