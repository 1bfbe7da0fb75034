"""Registry v3 inside TRL's GRPOTrainer (issue 21, point 7): what carries over, held to TRL's own code.

As in tests/test_trl.py, TRL's `_compute_loss` and the integration's run on one batch with the
log-prob function stubbed by an fp64 bigram (its entropy differentiable), and must agree in
value and gradient. Where TRL has no such option (the NLL term, prompt_mean, a correction
that leaves tokens out of the normaliser) the reference is the registry's composition on the
whole batch, grouped by prompt, as the project's own trainer calls it.
"""
import math
from pathlib import Path

import pytest
import torch
from helpers import needs

needs("trl")
from trl import GRPOConfig, GRPOTrainer  # noqa: E402
from trl.trainer.utils import shuffle_sequence_dict, split_tensor_dict  # noqa: E402

from grpo_bench import registry  # noqa: E402
from grpo_bench.algos import masked_mean  # noqa: E402
from grpo_bench.errors import ConfigError  # noqa: E402
from grpo_bench.config.run import RunConfig
from grpo_bench.integrations.trl import GRPOBenchTrainer, resolve_corrections, trl_corrections  # noqa: E402
from grpo_bench.numerics.logprobs import grpo_loss  # noqa: E402

from test_parts_v3 import TRL_MODES, _trl_vllm_is  # noqa: E402  (TRL's vLLM weights, transcribed once)
from test_trl import (B, G, T, Bigram, fixed_rewards, generated, hand_batch, loss_and_grads, make,  # noqa: E402,F401
                      tiny_dir, tok)

SPLIT = dict(gradient_accumulation_steps=2, per_device_train_batch_size=B // 2)   # two micro-batches per generation


def forward(stub, batch):
    """The stub's log-probs and entropies of a batch's completions, with gradient: (B, T) each."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    logp, ent, _ = stub(None, ids, None, T, compute_entropy=True)
    return logp, ent


def by_prompt(x):
    return None if x is None else x.reshape(B // G, G, *x.shape[1:])


def scored(trainer, batch, rewards):
    """The integration's generation step on a hand-made batch whose reward functions gave `rewards` (B, F)."""
    trainer._rewards_per_func = rewards
    trainer._apply_variant(batch, training=True)
    return batch


def with_sampler(batch, scale=0.15, seed=5):
    g = torch.Generator().manual_seed(seed)
    old = batch["old_per_token_logps"]
    return batch | {"sampling_per_token_logps": old + scale * torch.randn(old.shape, generator=g, dtype=old.dtype)}


# ------------------------------------------------------------------- entropy


@pytest.mark.parametrize("trl_loss,aggregate", [("dapo", "token_mean"), ("grpo", "seq_mean_token_mean")])
def test_entropy_bonus_matches_trl(trl_loss, aggregate, tok, tiny_dir, tmp_path):
    theirs = make(GRPOTrainer, tok, tiny_dir, tmp_path, loss_type=trl_loss, entropy_coef=0.1)
    ours = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant={"aggregate": aggregate, "entropy_coef": 0.1})
    plain = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant={"aggregate": aggregate})
    stub = Bigram(len(tok))
    batch = hand_batch(stub, len(tok))
    want, want_grads = loss_and_grads(theirs, stub, [batch])
    got, got_grads = loss_and_grads(ours, stub, [batch])
    assert got.item() == pytest.approx(want.item(), rel=1e-12)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-13)
    without, _ = loss_and_grads(plain, stub, [batch])
    logp, ent = forward(stub, batch)
    h = masked_mean(ent, batch["completion_mask"].double()).item()
    assert got.item() - without.item() == pytest.approx(-0.1 * h, rel=1e-10)   # the bonus: -c x token mean
    assert ours._metrics["train"]["entropy/coef"] == [0.1]
    assert ours._metrics["train"]["loss/entropy"] == [pytest.approx(h, rel=1e-12)]


def test_adaptive_entropy_matches_trl_step_by_step(tok, tiny_dir, tmp_path):
    """The controller steps once per optimizer step and applies nothing before its first measurement, as TRL."""
    stub = Bigram(len(tok))
    batch = hand_batch(stub, len(tok))
    with torch.no_grad():
        h0 = masked_mean(forward(stub, batch)[1], batch["completion_mask"].double()).item()
    trl_opts = dict(entropy_coef=0.02, use_adaptive_entropy=True, entropy_target=0.9 * h0, entropy_coef_delta=0.01,
                    entropy_coef_min=0.0, entropy_coef_max=0.035)
    theirs = make(GRPOTrainer, tok, tiny_dir, tmp_path, loss_type="dapo", **trl_opts)
    ours = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant={
        "aggregate": "token_mean", "entropy_coef": 0.02,
        "entropy_ctrl": {"name": "adaptive", "target": 0.9 * h0, "delta": 0.01, "coef_min": 0.0, "coef_max": 0.035}})
    states = []
    for scale in (1.0, 2.0, 2.0, 2.0, 0.125, 1.0):   # sharper logits: lower entropy, then back
        with torch.no_grad():
            stub.w.mul_(scale)
            stub.pos.mul_(scale)
        want, want_grads = loss_and_grads(theirs, stub, [batch])
        got, got_grads = loss_and_grads(ours, stub, [batch])
        assert got.item() == pytest.approx(want.item(), rel=1e-12), scale
        for a, b in zip(got_grads, want_grads):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-13)
        assert ours.recipe.entropy_state == pytest.approx(theirs.entropy_coef, abs=1e-15)
        states.append(round(ours.recipe.entropy_state, 12))
    # down while entropy is above the target, up to the cap below it, down again: every branch compared
    assert states == [0.01, 0.02, 0.03, 0.035, 0.025, 0.015], states
    applied = ours._metrics["train"]["entropy/coef"]
    assert applied[0] == 0 and applied[3] == 0.03 and applied[4] == 0.035 and applied[-1] == 0


def test_entropy_controller_steps_once_per_optimizer_step(tok, tiny_dir, tmp_path):
    """Two accumulated micro-batches: one controller step, from the token mean entropy of both (TRL's window)."""
    ctrl = {"name": "adaptive", "target": 100.0, "delta": 0.01}
    ours = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant={"entropy_coef": 0.02, "entropy_ctrl": ctrl},
                **SPLIT)
    stub = Bigram(len(tok))
    batch = scored(ours, hand_batch(stub, len(tok), lengths=(6, 6, 5, 6, 1, 2, 1, 3)), torch.randn(B, 1))
    sync = ours.accelerator.gradient_state._set_sync_gradients
    try:
        for k, half in enumerate(split_tensor_dict(batch, 2)):
            sync(k == 1)                                   # the second micro-batch ends the optimizer step
            loss_and_grads(ours, stub, [half], accumulation=2)
            assert ours.recipe.entropy_state == (0.02 if k == 0 else pytest.approx(0.03))
    finally:
        sync(True)
    with torch.no_grad():
        h = masked_mean(forward(stub, batch)[1], batch["completion_mask"].double()).item()
    ctrl_fn = registry.bind("entropy_ctrl", ctrl)
    assert ours.recipe.entropy_coef == ctrl_fn(0.02, h)[1]   # applied from the next step: the whole window's mean
    assert ours._metrics["train"]["entropy/coef"] == [0.0, 0.0]


@pytest.mark.parametrize("option,value,part", [
    ("entropy_coef", 0.01, "entropy_coef/entropy_ctrl"),
    ("use_adaptive_entropy", True, "entropy_coef/entropy_ctrl (adaptive)"),
    ("entropy_target", 0.5, "entropy_ctrl.target"),
    ("multi_objective_aggregation", "normalize_then_sum", "delta (normalize_then_sum: {name: gdpo"),
])
def test_trl_entropy_and_gdpo_options_are_replaced(option, value, part, tok, tiny_dir, tmp_path):
    with pytest.raises(ConfigError) as e:
        make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant={}, **{option: value})
    assert str(e.value).startswith(f"GRPOConfig: {option}: replaced by the variant's {part}")
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------- corrections


def test_a_variant_resolves_the_new_keys():
    from grpo_bench.integrations.trl import resolve_variant

    cfg = resolve_variant({"corrections": ["token_tis"], "entropy_ctrl": "adaptive", "delta": "gdpo", "adv_clip": 2.0,
                           "nll_coef": 0.1}, max_len=4, group_size=4, reward_weights=[1, 0.5])
    assert cfg.corrections == [{"name": "token_tis", "low": None, "high": 2.0}]
    assert cfg.delta["reward_weights"] == [1.0, 0.5] and cfg.entropy_ctrl["target"] == 0.2 and cfg.adv_clip == 2.0
    for variant, message in (({"corrections": [{"name": "token_tis", "high": -1}]},
                              "<variant>: corrections.0.high: must be > 0"),
                             ({"entropy_ctrl": {"name": "adaptive", "cap": 1}},
                              "<variant>: entropy_ctrl.cap: entropy_ctrl 'adaptive' has no parameter 'cap'"),
                             ({"adv_clip": [2.0, 1.0]}, "<variant>: adv_clip: expected null, a number > 0")):
        with pytest.raises(ConfigError) as e:
            resolve_variant(variant, max_len=4, group_size=4)
        assert str(e.value).startswith(message) and "\n" not in str(e.value)


@pytest.mark.parametrize("mode", TRL_MODES)
def test_correction_fed_by_sampler_logps_matches_trls_vllm_path(mode, tok, tiny_dir, tmp_path):
    """TRL's vLLM importance weights in its own loss == the variant's correction on sampling_per_token_logps."""
    stub = Bigram(len(tok))
    batch = with_sampler(hand_batch(stub, len(tok)))
    sampler = batch["sampling_per_token_logps"]
    sampler[3, 1] = float("nan")                     # vLLM could not score it: ratio 1 in TRL and here
    old, mask = batch["old_per_token_logps"], batch["completion_mask"].double()
    low, high = (0.9, 1.1) if mode.endswith("truncate") else (0.8, 1.25)
    ratio = _trl_vllm_is(old, sampler, mask, mode, low, high)
    theirs = make(GRPOTrainer, tok, tiny_dir, tmp_path, loss_type="dapo")
    theirs.use_vllm = theirs.vllm_importance_sampling_correction = True   # what its loss reads on the vLLM path
    ours = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant={
        "aggregate": "token_mean", "corrections": [{"name": TRL_MODES[mode], "low": low, "high": high}]})
    want, want_grads = loss_and_grads(theirs, stub, [batch | {"importance_sampling_ratio": ratio}])
    got, got_grads = loss_and_grads(ours, stub, [batch])
    assert got.item() == pytest.approx(want.item(), rel=1e-12)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-13)
    region = "truncated" if mode.endswith("truncate") else "masked"
    frac = ours._metrics["train"][f"correction/{TRL_MODES[mode]}/{region}_frac"][-1]
    assert 0 < frac < 1                                                  # the bounds act on this batch
    on = mask > 0
    lr = (old - torch.where(torch.isnan(sampler), old, sampler))[on]
    assert ours._metrics["train"]["mismatch/kl"][-1] == pytest.approx((-lr).mean().item(), rel=1e-12)


def test_without_a_sampler_corrections_see_ratio_one(tok, tiny_dir, tmp_path):
    """No vLLM: no sampling_per_token_logps, so rho = pi_old / pi_old = 1, as in the project's trainer."""
    stub = Bigram(len(tok))
    batch = hand_batch(stub, len(tok))
    tight = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path,
                 variant={"corrections": [{"name": "seq_mis", "low": 0.999, "high": 1.001}, "token_tis"]})
    plain = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant={})
    got, got_grads = loss_and_grads(tight, stub, [batch])
    want, want_grads = loss_and_grads(plain, stub, [batch])
    assert got.item() == want.item()
    assert all(torch.equal(a, b) for a, b in zip(got_grads, want_grads))
    m = tight._metrics["train"]
    assert m["mismatch/kl"] == [0.0] and m["correction/seq_mis/masked_frac"] == [0.0]
    # and the same corrections do act once a sampler's log-probs are there
    got, _ = loss_and_grads(tight, stub, [with_sampler(batch)])
    assert m["correction/seq_mis/masked_frac"][-1] > 0 and got.item() != want.item()


def test_trls_own_corrections_become_registry_parts(tok, tiny_dir, tmp_path):
    args = GRPOConfig("x", use_vllm=True, vllm_importance_sampling_mode="token_truncate",
                      vllm_importance_sampling_clip_min=0.0, vllm_importance_sampling_clip_max=2.0,
                      off_policy_mask_threshold=0.5, report_to=[], use_cpu=True)
    assert trl_corrections(args) == [
        ("vllm_importance_sampling_correction", {"name": "token_tis", "low": None, "high": 2.0}),
        ("off_policy_mask_threshold", {"name": "opsm", "threshold": 0.5})]
    assert trl_corrections(GRPOConfig("x", report_to=[], use_cpu=True)) == []          # TRL's IS needs vLLM
    cfg = RunConfig()
    resolve_corrections(cfg, args)
    assert cfg.corrections == [{"name": "token_tis", "low": None, "high": 2.0}, {"name": "opsm", "threshold": 0.5}]
    # without vLLM TRL's off-policy mask runs alone: the integration runs it as opsm, equal to TRL's own
    stub = Bigram(len(tok))
    batch = hand_batch(stub, len(tok))
    theirs = make(GRPOTrainer, tok, tiny_dir, tmp_path, loss_type="grpo", off_policy_mask_threshold=0.05)
    ours = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant={}, off_policy_mask_threshold=0.05)
    assert ours.variant.corrections == [{"name": "opsm", "threshold": 0.05}]
    for b in (batch, with_sampler(batch, scale=0.5)):   # TRL reads the sampler's log-probs when there are any
        want, want_grads = loss_and_grads(theirs, stub, [b])
        got, got_grads = loss_and_grads(ours, stub, [b])
        assert got.item() == pytest.approx(want.item(), rel=1e-12)
        for x, y in zip(got_grads, want_grads):
            torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-13)
        assert 0 < ours._metrics["train"]["correction/opsm/masked_frac"][-1] < 1


@pytest.mark.parametrize("trl_option,value,off", [("use_vllm", True, "vllm_importance_sampling_correction: "),
                                                  ("off_policy_mask_threshold", 0.5, "off_policy_mask_threshold: ")])
def test_a_second_correction_is_refused(trl_option, value, off, tok, tiny_dir, tmp_path):
    with pytest.raises(ConfigError) as e:
        make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant={"corrections": ["token_tis"]}, **{trl_option: value})
    msg = str(e.value)
    assert msg.startswith("GRPOConfig: " + off + "a second off-policy correction beside the variant's corrections")
    assert ("set it to False (it is the correction {name: seq_mis, low: None, high: 3.0})" in msg if value is True
            else "set it to None (it is the correction {name: opsm, threshold: 0.5})" in msg) and "\n" not in msg
    # switched off, the variant's corrections stand alone
    cfg = RunConfig(corrections=[{"name": "token_tis", "low": None, "high": 2.0}])
    resolve_corrections(cfg, GRPOConfig("x", use_vllm=True, vllm_importance_sampling_correction=False, report_to=[],
                                        use_cpu=True))
    assert cfg.corrections == [{"name": "token_tis", "low": None, "high": 2.0}]


# ------------------------------------------------------- NLL, GDPO, clipping


def test_nll_term_on_positive_rewards(tok, tiny_dir, tmp_path):
    """nll_coef x the token mean of -log pi over the responses with reward > 0 (not advantage > 0)."""
    stub = Bigram(len(tok))
    rewards = torch.tensor([1.0, 2.0, 3.0, 4.0, -1.0, 0.0, 0.0, 1.0])   # a group all positive, one with one
    ours = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant={"aggregate": "token_mean", "nll_coef": 0.5})
    plain = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant={"aggregate": "token_mean"})
    batches = [scored(t, hand_batch(stub, len(tok)), rewards[:, None]) for t in (ours, plain)]
    positive = rewards > 0
    assert not torch.equal(positive, batches[0]["advantages"] > 0)     # the two rules differ on this batch
    got, got_grads = loss_and_grads(ours, stub, [batches[0]])
    base, base_grads = loss_and_grads(plain, stub, [batches[1]])
    mask = batches[0]["completion_mask"].double() * positive[:, None]
    stub.zero_grad()
    logp, _ = forward(stub, batches[0])
    nll = (-logp * mask).sum() / mask.sum()
    nll_grads = torch.autograd.grad(nll, list(stub.parameters()))
    assert got.item() == pytest.approx(base.item() + 0.5 * nll.item(), rel=1e-12)
    for g, b, n in zip(got_grads, base_grads, nll_grads):
        torch.testing.assert_close(g, b + 0.5 * n, rtol=1e-10, atol=1e-13)
    assert ours._metrics["train"]["loss/nll"] == [pytest.approx(nll.item(), rel=1e-12)]
    # no positive response: no term, and no mean over no token in the log
    batch = scored(ours, hand_batch(stub, len(tok)), -rewards.abs()[:, None])
    got, _ = loss_and_grads(ours, stub, [batch])
    base, _ = loss_and_grads(plain, stub, [scored(plain, hand_batch(stub, len(tok)), -rewards.abs()[:, None])])
    assert got.item() == base.item() and len(ours._metrics["train"]["loss/nll"]) == 1


def two_rewards(tok, tiny_dir, tmp_path, variant, **kw):
    gen = torch.Generator().manual_seed(11)
    comps = torch.randint(0, 2, (16, 2), generator=gen).float()
    comps[:G] = 1.0                                                   # a flat group

    def fa(prompts, completions, **kwargs):
        return comps[:len(completions), 0].tolist()

    def fb(prompts, completions, **kwargs):
        return comps[:len(completions), 1].tolist()

    opts = dict(per_device_train_batch_size=16, max_completion_length=2, reward_funcs=[fa, fb],
                reward_weights=[1.0, 0.5])
    cls = GRPOTrainer if variant is None else GRPOBenchTrainer
    extra = {} if variant is None else {"variant": variant}
    return generated(make(cls, tok, tiny_dir, tmp_path, **opts | kw | extra))["advantages"]


def test_gdpo_matches_trl_normalize_then_sum(tok, tiny_dir, tmp_path):
    """TRL's reward functions are GDPO's components, weighted by GRPOConfig.reward_weights as TRL weighs them."""
    theirs = two_rewards(tok, tiny_dir, tmp_path, None, multi_objective_aggregation="normalize_then_sum")
    trl_gdpo = {"delta": {"name": "gdpo", "eps": 1e-4, "batch_norm": "responses"}}
    got = two_rewards(tok, tiny_dir, tmp_path, trl_gdpo)
    torch.testing.assert_close(got, theirs, rtol=1e-5, atol=1e-6)
    assert got.abs().max() > 0.5 and got[:G].abs().max() < 1e-3
    # not vacuous: the weights reach GDPO (equal weights give other advantages), and TRL's own
    # sum_then_normalize is another algorithm
    equal = two_rewards(tok, tiny_dir, tmp_path, {"delta": trl_gdpo["delta"] | {"reward_weights": [1.0, 1.0]}})
    summed = two_rewards(tok, tiny_dir, tmp_path, None)
    assert (equal - got).abs().max() > 0.05 and (summed - got).abs().max() > 0.05


def test_adv_clip_clamps_the_variants_advantages(tok, tiny_dir, tmp_path):
    kw = dict(per_device_train_batch_size=16, max_completion_length=2, reward_funcs=[fixed_rewards])
    free = generated(make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant={"delta": "zscore"}, **kw))["advantages"]
    ours = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant={"delta": "zscore", "adv_clip": [-0.5, 1.0]}, **kw)
    got = generated(ours)["advantages"]
    assert free.min() < -0.5 and free.max() > 1.0
    torch.testing.assert_close(got, free.clamp(-0.5, 1.0), rtol=0, atol=0)
    assert list(ours._logs["advantages"]) == pytest.approx(got.tolist())


def test_zero_variance_leaves_flat_groups_out_of_the_loss(tok, tiny_dir, tmp_path):
    kw = dict(per_device_train_batch_size=16, max_completion_length=3, reward_funcs=[fixed_rewards])
    ours = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant={"filters": ["zero_variance"]}, **kw)
    out = generated(ours)
    cm = out["completion_mask"].double()
    assert out["bench_mask"][:G].sum() == 0 and torch.equal(out["bench_mask"][G:], cm[G:])   # the flat group only
    removed = ours._metrics["train"]["filter/zero_variance/removed"][-1]
    assert removed == pytest.approx((cm[:G].sum() / cm.sum()).item())


def test_no_positive_resample_is_refused(tok, tiny_dir, tmp_path):
    with pytest.raises(ConfigError) as e:
        make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant={"filters": ["no_positive_resample"]})
    msg = str(e.value)
    assert msg.startswith("<variant>: filters.0: 'no_positive_resample' retires prompts from the prompt stream")
    assert "train_dataset" in msg and "\n" not in msg


# -------------------------------------------------------- prompt_mean, groups


def prompt_mean_by_hand(per_token, mask):
    per_prompt = [(per_token[i:i + G] * mask[i:i + G]).sum() / mask[i:i + G].sum() for i in range(0, B, G)]
    return sum(per_prompt) / len(per_prompt)


def test_prompt_mean_sees_each_prompts_group_after_trls_shuffle(tok, tiny_dir, tmp_path):
    ours = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant={"aggregate": "prompt_mean"})
    stub = Bigram(len(tok))
    batch = scored(ours, hand_batch(stub, len(tok), lengths=(6, 6, 5, 6, 1, 2, 1, 3)), torch.randn(B, 1))
    torch.manual_seed(0)
    got, _ = loss_and_grads(ours, stub, [shuffle_sequence_dict(batch)])   # TRL shuffles rows before the loss
    with torch.no_grad():
        logp = forward(stub, batch)[0]
        ratio = torch.exp(logp - batch["old_per_token_logps"])
        adv = batch["advantages"][:, None].double()
        per_token = -torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
        mask = batch["completion_mask"].double()
    assert got.item() == pytest.approx(prompt_mean_by_hand(per_token, mask).item(), rel=1e-12)
    token_mean = (per_token * mask).sum() / mask.sum()
    assert abs(got.item() - token_mean.item()) > 1e-4      # unequal prompts: not the token mean


def test_prompt_mean_is_refused_across_micro_batches(tok, tiny_dir, tmp_path):
    with pytest.raises(ConfigError) as e:
        make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant={"aggregate": "prompt_mean"}, **SPLIT)
    assert str(e.value).startswith("<variant>: aggregate: 'prompt_mean' weighs each prompt's group as a whole")
    make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant={"aggregate": "seq_mean_token_mean"}, **SPLIT)


def test_self_normalised_is_is_refused_across_micro_batches(tok, tiny_dir, tmp_path):
    # registry v4's snis divides by the mean weight of the whole batch, which a micro-batch does not hold
    with pytest.raises(ConfigError) as e:
        make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant={"corrections": ["snis"]}, **SPLIT)
    assert str(e.value).startswith("<variant>: corrections: 'snis' divides by a mean over the whole batch")
    make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant={"corrections": ["snis"]})   # one micro-batch


def test_entropy_bonus_with_a_step_filter_is_refused_across_micro_batches(tok, tiny_dir, tmp_path):
    variant = {"entropy_coef": 0.01, "filters": [{"name": "top_entropy", "rho": 0.5}]}
    with pytest.raises(ConfigError) as e:
        make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant=variant, **SPLIT)
    assert str(e.value).startswith("<variant>: entropy_coef: the entropy bonus is a token mean over the tokens step "
                                   "filter 'top_entropy' keeps in the whole batch, known only when one micro-batch "
                                   "on one process holds it")
    make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant=variant)            # one micro-batch: it is known


# ------------------------------------------------------ gradient accumulation

NEW_TERMS = {"aggregate": "seq_mean_token_mean", "entropy_coef": 0.05, "nll_coef": 0.3, "adv_clip": 1.5,
             # a weight and a rejection that leaves tokens out of every normaliser
             "corrections": [{"name": "token_tis", "high": 1.1},
                             {"name": "rollout_rs", "divergence": "k2", "level": "token", "high": 0.01}]}


def whole_batch_loss(stub, batch, rewards, variant):
    """The registry's composition on the whole generation batch, grouped by prompt: the project trainer's call."""
    logp, ent = forward(stub, batch)
    mask = batch["bench_mask"]
    return grpo_loss(*map(by_prompt, (logp, batch["old_per_token_logps"])), None, by_prompt(batch["advantages"]),
                     by_prompt(mask), aggregate=variant["aggregate"], corrections=variant.get("corrections", ()),
                     sampler_logp=by_prompt(batch.get("sampling_per_token_logps")), entropy=by_prompt(ent),
                     entropy_coef=variant.get("entropy_coef", 0.0), nll_coef=variant.get("nll_coef", 0.0),
                     positive=by_prompt(rewards > 0), backend="torch")


def test_accumulation_is_one_loss_over_the_batch_with_the_new_terms(tok, tiny_dir, tmp_path):
    """Shuffled and split in two, as TRL does: the policy aggregate, the entropy bonus and the NLL term (token
    means) and the rejected tokens all add up to the loss of the whole batch, value and gradient."""
    ours = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant=NEW_TERMS, **SPLIT)
    stub = Bigram(len(tok))
    rewards = torch.tensor([1.0, 0.0, 2.0, -1.0, 0.5, 0.0, 3.0, 1.0])
    batch = scored(ours, with_sampler(hand_batch(stub, len(tok), lengths=(6, 6, 5, 6, 1, 2, 1, 3))), rewards[:, None])
    torch.manual_seed(1)
    halves = split_tensor_dict(shuffle_sequence_dict(batch), 2)
    got, got_grads = loss_and_grads(ours, stub, halves, accumulation=2)
    stub.zero_grad()
    want, stats = whole_batch_loss(stub, batch, rewards, NEW_TERMS)
    want_grads = torch.autograd.grad(want, list(stub.parameters()))
    assert got.item() == pytest.approx(want.item(), rel=1e-12)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-13)
    # not vacuous: tokens were rejected, the halves differ, and averaging the halves' own losses is another number
    assert stats["correction/rollout_rs/masked_frac"] > 0
    per_half = []
    for h in halves:
        logp, ent = forward(stub, h)
        v, _ = grpo_loss(logp, h["old_per_token_logps"], None, h["advantages"], h["bench_mask"],
                         aggregate="seq_mean_token_mean", corrections=NEW_TERMS["corrections"],
                         sampler_logp=h["sampling_per_token_logps"], entropy=ent, entropy_coef=0.05, nll_coef=0.3,
                         positive=h["bench_rewards"] > 0, backend="torch")
        per_half.append(v.item())
    assert abs(sum(per_half) / 2 - want.item()) > 1e-4


def test_a_batch_wide_correction_does_not_split(tok, tiny_dir, tmp_path):
    """M2PO masks by the second moment of the whole batch: a micro-batch's own differs, and the loss says so;
    in one micro-batch it is exact."""
    variant = {"aggregate": "token_mean", "corrections": [{"name": "m2po", "threshold": 1e-3}]}
    stub = Bigram(len(tok))
    one = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant=variant)
    batch = scored(one, with_sampler(hand_batch(stub, len(tok))), torch.randn(B, 1))
    got, _ = loss_and_grads(one, stub, [batch])
    want, stats = whole_batch_loss(stub, batch, batch["bench_rewards"], variant)
    assert got.item() == pytest.approx(want.item(), rel=1e-12) and stats["correction/m2po/masked_frac"] > 0
    split = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant=variant, **SPLIT)
    batch = scored(split, with_sampler(hand_batch(stub, len(tok))), torch.randn(B, 1))
    with pytest.raises(RuntimeError, match=r"does not split into micro-batches .*'m2po'.*steps_per_generation=1"):
        loss_and_grads(split, stub, split_tensor_dict(batch, 2), accumulation=2)
    assert math.isfinite(got.item())


# ----------------------------------------------------------------- end to end


def test_end_to_end_every_new_part_on_trls_loop(tok, tmp_path):
    """GDPO on two reward functions, adv_clip, zero_variance, an adaptive entropy bonus, the NLL term and opsm,
    through TRL's own training loop with two accumulated micro-batches and two passes per rollout."""
    from datasets import Dataset

    from grpo_bench.algos import rewards as lm_rewards
    from grpo_bench.tasks.lm.models import build_tiny

    pairs = [(a, b) for a in range(0, 90, 13) for b in range(5, 50, 11)]
    ds = Dataset.from_dict({"prompt": [f"{a}+{b}=" for a, b in pairs], "answer": [a + b for a, b in pairs]})
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, gradient_accumulation_steps=2,
                      num_generations=4, max_completion_length=6, num_iterations=2, max_steps=4, learning_rate=5e-2,
                      logging_steps=1, reward_weights=[1.0, 0.5], report_to=[], use_cpu=True, save_strategy="no",
                      seed=0, disable_tqdm=True, generation_kwargs={"sequence_bias": [[[tok.eos_token_id], 2.0]]})
    variant = {"delta": "gdpo", "adv_clip": 1.0, "aggregate": "seq_mean_token_mean", "filters": ["zero_variance"],
               "entropy_coef": 0.01, "entropy_ctrl": {"name": "adaptive", "target": 100.0, "delta": 0.01},
               "nll_coef": 0.1, "corrections": [{"name": "opsm", "threshold": 1e-4}]}
    def spread(prompts, completions, **kwargs):   # distinct values within a group, from the text alone
        return [(sum(map(ord, c)) % 7) / 7 for c in completions]

    trainer = GRPOBenchTrainer(build_tiny(tok, 2, 32, 2, seed=0), args=args, train_dataset=ds, processing_class=tok,
                               reward_funcs=[spread, lm_rewards.length_penalty], variant=variant)
    assert trainer.variant.delta["reward_weights"] == [1.0, 0.5]
    trainer.train()
    steps = [row for row in trainer.state.log_history if "loss" in row]
    assert len(steps) == 4 and all(math.isfinite(row["loss"]) for row in steps)
    assert trainer._rollouts == trainer._rollouts_planned(args) == 2     # 8 micro-batches, one generation per 4
    for k in ("loss/entropy", "loss/nll", "correction/opsm/masked_frac", "entropy/coef"):
        assert all(math.isfinite(row[k]) for row in steps), k
    # the controller: nothing before its first measurement, then one step of 0.01 per optimizer step
    assert [round(row["entropy/coef"], 9) for row in steps] == [0.0, 0.02, 0.03, 0.04]
    generations = [row for row in steps if "delta/abs_mean" in row]
    assert len(generations) == 2 and all(0 < row["delta/abs_mean"] <= 1.0 for row in generations)
    assert max(row["correction/opsm/masked_frac"] for row in steps) > 0   # the second pass drifts


def test_a_variant_carries_its_own_parts_group_size_and_filters(tmp_path, monkeypatch):
    """A variant's include registers its user's parts before they resolve; TRL's num_generations becomes the group
    size the parts are checked with; a rollout filter that reads lengths and a step filter both pass the probe."""
    from grpo_bench.integrations.trl import resolve_variant
    mine = (Path(__file__).parents[1] / "examples" / "my_variant" / "my_loss.py").read_text().replace('"soft_clip"', '"soft_clip_for_trl"')
    (tmp_path / "mine.py").write_text(mine)
    monkeypatch.setitem(registry._REGISTRY, "loss", dict(registry._REGISTRY["loss"]))   # forgotten after the test
    cfg = resolve_variant({"include": [str(tmp_path / "mine.py")], "loss": "soft_clip_for_trl",
                           "filters": [{"name": "overlong_punish", "cache": 2}, "top_entropy"]},
                          str(tmp_path / "variant.yaml"), max_len=4, group_size=7)
    assert cfg.loss["name"] == "soft_clip_for_trl" and cfg.group_size == 7
    assert [f["name"] for f in cfg.filters] == ["overlong_punish", "top_entropy"]


def test_a_positive_clip_min_bounds_the_ratio_from_below():
    args = GRPOConfig("x", use_vllm=True, vllm_importance_sampling_mode="sequence_mask",
                      vllm_importance_sampling_clip_min=0.5, vllm_importance_sampling_clip_max=2.0, report_to=[],
                      use_cpu=True)
    assert trl_corrections(args) == [("vllm_importance_sampling_correction",
                                      {"name": "seq_mis", "low": 0.5, "high": 2.0})]


def test_the_variant_module_imports_no_trl_of_its_own():
    """grpo_bench.integrations.trl checks TRL's version before anything of TRL's is imported; trl_variant, which
    it imports, must not import TRL first (its GRPOConfig is a type hint only)."""
    import importlib
    import sys
    from grpo_bench.integrations import trl_variant
    saved = {k: v for k, v in sys.modules.items() if k == "trl" or k.startswith("trl.")}
    for k in saved:
        del sys.modules[k]
    try:
        importlib.reload(trl_variant)
        assert "trl" not in sys.modules
    finally:
        sys.modules.update(saved)
        importlib.reload(trl_variant)


# ------------------------------------------------------- the integration's own wiring


def test_on_policy_old_log_probs_are_the_steps_own_detached(tok, tiny_dir, tmp_path):
    """One iteration per generation: TRL hands no old log-probs and takes the step's own, detached (ratio 1 with
    the policy gradient's slope); so does the variant, value and gradient equal to TRL's own loss."""
    stub = Bigram(len(tok))
    batch = {k: v for k, v in hand_batch(stub, len(tok)).items() if k != "old_per_token_logps"}
    theirs = make(GRPOTrainer, tok, tiny_dir, tmp_path, loss_type="grpo")
    ours = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant={"loss": "clipped",
                                                                     "aggregate": "seq_mean_token_mean"})
    want, want_grads = loss_and_grads(theirs, stub, [batch])
    got, got_grads = loss_and_grads(ours, stub, [batch])
    assert got.item() == pytest.approx(want.item(), rel=1e-12) and max(g.abs().max() for g in got_grads) > 1e-3
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-13)


def test_the_kl_controller_sets_each_rollouts_coefficient(tok, tiny_dir, tmp_path, monkeypatch):
    """The adaptive controller after each generation, as the ablation trainer runs it: with the KL far above a tiny
    target its error clips at +0.2, and with n / horizon = 8 / 8 each rollout's beta is 1.2 times the last's."""
    ours = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant={
        "kl": "k2", "kl_coef": 0.1, "kl_placement": "reward",
        "kl_ctrl": {"name": "adaptive", "target": 1e-6, "horizon": 8}})
    stub = Bigram(len(tok))
    batch = hand_batch(stub, len(tok))
    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", lambda self, inputs: dict(batch))
    ours.model.train()
    for _ in range(3):
        ours._rewards_per_func = torch.randn(B, 1, dtype=torch.float64)
        ours._generate_and_score_completions([])
    assert ours._metrics["train"]["kl/coef"] == pytest.approx([0.1, 0.12, 0.144], rel=1e-12)


def test_a_reward_function_returning_none_scores_zero(tok, tiny_dir, tmp_path):
    """TRL writes NaN where a reward function returned None; the variant counts it 0, as grpo_bench's reward sum."""
    ours = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant={})
    rewards = torch.tensor([[1.0], [float("nan")], [2.0], [0.5], [0.0], [3.0], [1.0], [2.0]])
    out = scored(ours, hand_batch(Bigram(len(tok)), len(tok)), rewards)
    assert out["bench_rewards"].tolist() == [1.0, 0.0, 2.0, 0.5, 0.0, 3.0, 1.0, 2.0]


@pytest.mark.parametrize("variant,key", [
    ({"corrections": [{"name": "snis", "level": "sequence"}]}, "corrections"),
    ({"entropy_coef": 0.1, "filters": ["top_entropy"]}, "entropy_coef"),
    ({"aggregate": "prompt_mean"}, "aggregate")])
def test_what_needs_the_whole_batch_is_refused_at_two_micro_batches(variant, key, tok, tiny_dir, tmp_path):
    """steps_per_generation = 2 (TRL shuffles the generation batch into two micro-batches): a correction normalised
    over the whole batch, an entropy bonus over a step filter's kept tokens, and a per-prompt aggregate at G = 2 (a
    group of two is no different from two responses of one prompt at any other G) are each refused by key."""
    with pytest.raises(ConfigError) as e:
        make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant=variant, num_generations=2, **SPLIT)
    assert str(e.value).startswith(f"<variant>: {key}: ") and "steps_per_generation=1" in str(e.value)


def test_a_rollout_filter_that_drops_groups_at_run_time_stops_the_step(tok, tiny_dir, tmp_path, monkeypatch):
    ours = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant={})
    filter_rollout = ours.recipe.filter_rollout
    monkeypatch.setattr(ours.recipe, "filter_rollout", lambda batch: (
        lambda out: (out[0].replace(keep=torch.ones(out[0].rewards.shape[0], dtype=torch.bool)), out[1]))(
        filter_rollout(batch)))
    with pytest.raises(RuntimeError, match="a rollout filter drops groups or retires prompts"):
        scored(ours, hand_batch(Bigram(len(tok)), len(tok)), torch.randn(B, 1))


def test_corrections_take_the_generation_time_old_log_probs_when_trl_has_none(tok, tiny_dir, tmp_path):
    """A sampler's log-probs (vLLM) and one iteration per generation: TRL computes no old log-probs, and the
    corrections' ratio pi_old / pi_sampler needs them for every micro-batch alike: the integration takes them once,
    at generation time, from the policy there."""
    stub = Bigram(len(tok))
    ours = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant={"corrections": ["token_tis"]})
    ours._get_per_token_logps_and_entropies = stub
    batch = with_sampler(hand_batch(stub, len(tok)))
    del batch["old_per_token_logps"]
    out = scored(ours, batch, torch.randn(B, 1))
    with torch.no_grad():
        want = stub(None, torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1), None, T)[0]
    assert torch.equal(out["old_per_token_logps"], want)


def test_trls_completions_table_shows_the_variants_advantages_only(tok, tiny_dir, tmp_path):
    """TRL logs its own advantages of the batch before the variant replaces them; the table keeps the variant's
    alone, also where the batch is smaller than the table (a generation batch of two micro-batches here)."""
    ours = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant={}, gradient_accumulation_steps=2)
    batch = hand_batch(Bigram(len(tok)), len(tok))
    ours._logs["advantages"].extend(batch["advantages"].tolist())   # TRL's, as its generation step logged them
    out = scored(ours, batch, torch.randn(B, 1))
    assert ours._logs["advantages"].maxlen == 2 * B
    assert list(ours._logs["advantages"]) == pytest.approx(out["advantages"].tolist())
