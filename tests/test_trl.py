"""grpo_bench's parts inside TRL's GRPOTrainer (grpo_bench/integrations/trl.py), held to TRL's own code.

Parity: for every composition TRL also offers, TRL's `_compute_loss` and the
integration's run on one batch, in one process, and must agree in value and gradient
in fp64. Both trainers compute log-probs with the same stub (a bigram model with fp64
weights, in place of TRL's fused LM head, which is fp32 only), so everything after the
log-probs is each side's own code. Advantages are compared the same way: TRL's
generation step and the integration's, on one set of rewards.
"""
import importlib.util
import math
import subprocess
import sys

import pytest
import torch
from helpers import ROOT, needs

needs("trl")  # the trl extra (pip install -e '.[trl]'); without it these tests skip
from datasets import Dataset  # noqa: E402  (comes with trl)
from transformers import AutoModelForCausalLM
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import split_tensor_dict, use_adapter

from grpo_bench import registry
from grpo_bench.errors import ConfigError
from grpo_bench.integrations import trl as bench_trl
from grpo_bench.integrations.trl import GRPOBenchTrainer, check_trl_version, variant_from_ablation
from grpo_bench.algos import rewards as lm_rewards
from grpo_bench.tasks.lm.models import build_tiny, lora_factors
from grpo_bench.tasks.lm.tokenizer import build_char_tokenizer
from grpo_bench.numerics.logprobs import grpo_loss

B, G, T, P = 8, 4, 6, 3  # completions, group size, completion tokens, prompt tokens


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def tiny_dir(tok, tmp_path_factory):
    # a saved model, so that TRL can build its reference model from the policy's path
    d = tmp_path_factory.mktemp("tiny")
    build_tiny(tok, n_layer=1, n_embd=16, n_head=2, seed=0).save_pretrained(d)
    return d


def make(cls, tok, tiny_dir, tmp_path, *, peft_config=None, reward_funcs=None, **kw):
    cfg = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=B, num_generations=G,
               max_completion_length=T, use_cpu=True, report_to=[], save_strategy="no", disable_tqdm=True)
    variant = kw.pop("variant", None)
    args = GRPOConfig(**(cfg | kw))
    extra = {} if variant is None else {"variant": variant}
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    ds = Dataset.from_dict({"prompt": ["1+2=", "3+4="]})
    return cls(model, reward_funcs=reward_funcs or [lm_rewards.length_penalty], args=args, train_dataset=ds,
               processing_class=tok, peft_config=peft_config, **extra)


class Bigram(torch.nn.Module):
    """log pi(token | previous token, position) with fp64 weights: TRL's log-prob function, stubbed."""

    def __init__(self, vocab: int, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.w = torch.nn.Parameter(torch.randn(vocab, vocab, generator=g, dtype=torch.float64))
        self.pos = torch.nn.Parameter(torch.randn(T, vocab, generator=g, dtype=torch.float64) * 0.5)

    def __call__(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False,
                 compute_aux_loss=False, **_):
        prev, tgt = input_ids[:, -logits_to_keep - 1:-1], input_ids[:, -logits_to_keep:]
        lp = torch.log_softmax(self.w[prev] + self.pos[:logits_to_keep], dim=-1)    # (b, T, V)
        logp = lp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
        # fp32 values, as TRL's fused head gives them: TRL takes its entropy quantile in fp32
        entropy = -(lp.exp() * lp).sum(-1).float().double() if compute_entropy else None
        return logp, entropy, None


def hand_batch(stub: Bigram, vocab: int, seed: int = 0, noise: float = 0.3,
               lengths=(6, 3, 1, 6, 5, 2, 6, 4)) -> dict:
    """A generation batch as TRL's generation step returns it, with ratios far enough from 1 to clip."""
    g = torch.Generator().manual_seed(seed)
    completion_mask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).long()
    batch = {
        "prompt_ids": torch.randint(4, vocab, (B, P), generator=g), "prompt_mask": torch.ones(B, P, dtype=torch.long),
        "completion_ids": torch.randint(4, vocab, (B, T), generator=g), "completion_mask": completion_mask,
        "advantages": torch.randn(B, generator=g, dtype=torch.float64),
        "num_items_in_batch": completion_mask.sum(),
    }
    with torch.no_grad():
        logp = stub(None, torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1), None, T)[0]
    shift = noise * torch.randn(B, T, generator=g, dtype=torch.float64)
    shift[0, :3] = torch.tensor([2.0, -2.0, 1.7])  # ratios of e^2 and e^-2: beyond every clip and CISPO's cap of 5
    shift[5, :2] = torch.tensor([-1.8, 1.9])
    batch["old_per_token_logps"] = logp - shift
    batch["ref_per_token_logps"] = logp + 0.5 * torch.randn(B, T, generator=g, dtype=torch.float64)
    return batch


def loss_and_grads(trainer, stub, inputs: list[dict], accumulation: int = 1):
    """Summed loss over micro-batches (TRL's gradient accumulation) and the stub's gradients."""
    trainer._get_per_token_logps_and_entropies = stub
    trainer.current_gradient_accumulation_steps = accumulation
    trainer.model.train()
    stub.zero_grad()
    total = sum(trainer._compute_loss(trainer.model, mb) for mb in inputs)
    total.backward()
    return total.detach(), [p.grad.clone() for p in stub.parameters()]


# (name, TRL's options, the registry composition that docs/registry.md's name map says reproduces them, noise)
SHARED = [
    ("grpo", dict(loss_type="grpo"), {"loss": "clipped", "aggregate": "seq_mean_token_mean"}, 0.3),
    ("bnpo", dict(loss_type="bnpo"), {"loss": "clipped", "aggregate": "token_mean"}, 0.3),
    ("dr_grpo", dict(loss_type="dr_grpo"), {"loss": "clipped", "aggregate": "seq_mean_token_sum_norm"}, 0.3),
    ("dapo", dict(loss_type="dapo", epsilon_high=0.28),
     {"loss": {"name": "clipped", "clip_high": 0.28}, "aggregate": "token_mean"}, 0.3),
    ("gspo", dict(loss_type="grpo", importance_sampling_level="sequence", epsilon=3e-4, epsilon_high=4e-4),
     {"loss": "gspo", "aggregate": "seq_mean_token_mean"}, 3e-4),
    ("luspo", dict(loss_type="luspo", importance_sampling_level="sequence", epsilon=3e-4, epsilon_high=4e-4),
     {"loss": "gspo", "aggregate": "seq_mean_token_sum"}, 3e-4),
    ("two_sided_clip", dict(loss_type="dapo", delta=1.5),
     {"loss": {"name": "dual_clip", "clip_c": 1.5}, "aggregate": "token_mean"}, 0.3),
    ("cispo", dict(loss_type="cispo", epsilon_high=5.0),
     {"loss": {"name": "cispo", "clip_high": 4.0}, "aggregate": "token_mean"}, 0.3),
    # TRL builds its temperatures with torch.where on Python floats, so in fp32: 1.05 would differ in the 8th
    # digit; 1.25 is exact in both
    ("sapo", dict(loss_type="sapo", sapo_temperature_neg=1.25),
     {"loss": {"name": "sapo", "tau_neg": 1.25}, "aggregate": "seq_mean_token_mean"}, 0.3),
    ("vespo", dict(loss_type="vespo"), {"loss": "vespo", "aggregate": "token_mean"}, 0.1),
    ("beta_k3", dict(loss_type="grpo", beta=0.04, use_bias_correction_kl=False),
     {"loss": "clipped", "aggregate": "seq_mean_token_mean", "kl": "k3", "kl_coef": 0.04}, 0.3),
    ("beta_k3_is", dict(loss_type="dapo", beta=0.04),  # use_bias_correction_kl defaults to True in TRL 1.16
     {"loss": "clipped", "aggregate": "token_mean", "kl": "k3_is", "kl_coef": 0.04}, 0.3),
    ("top_entropy", dict(loss_type="dapo", top_entropy_quantile=0.5),
     {"loss": "clipped", "aggregate": "token_mean", "filters": [{"name": "top_entropy", "rho": 0.5}]}, 0.3),
]


@pytest.mark.parametrize("name,trl_options,variant,noise", SHARED, ids=[c[0] for c in SHARED])
def test_loss_matches_trl(name, trl_options, variant, noise, tok, tiny_dir, tmp_path):
    theirs = make(GRPOTrainer, tok, tiny_dir, tmp_path, **trl_options)
    ours = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant=variant)
    stub = Bigram(len(tok))
    batch = hand_batch(stub, len(tok), noise=noise)
    want, want_grads = loss_and_grads(theirs, stub, [batch])
    got, got_grads = loss_and_grads(ours, stub, [batch])
    assert want.dtype == got.dtype == torch.float64
    assert got.item() == pytest.approx(want.item(), rel=1e-12, abs=1e-14)
    assert any(gr.abs().max() > 1e-3 for gr in want_grads)  # a gradient to compare, not two zeros
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-13)
    logged = {k for k in ours._metrics["train"]}
    assert {"loss/policy", "clip/low_frac", "clip/high_frac", "entropy"} <= logged
    if "kl_coef" in variant:
        assert "kl/value" in logged


def test_kl_parity_is_not_vacuous(tok, tiny_dir, tmp_path):
    """TRL's default KL (importance-corrected k3) and plain k3 give different gradients on the same batch."""
    theirs = make(GRPOTrainer, tok, tiny_dir, tmp_path, loss_type="dapo", beta=0.04)
    ours = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path,
                variant={"loss": "clipped", "aggregate": "token_mean", "kl": "k3", "kl_coef": 0.04})
    stub = Bigram(len(tok))
    batch = hand_batch(stub, len(tok))
    _, want = loss_and_grads(theirs, stub, [batch])
    _, got = loss_and_grads(ours, stub, [batch])
    assert not torch.allclose(got[0], want[0], rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("trl_loss,aggregate", [("dapo", "token_mean"), ("grpo", "seq_mean_token_mean")])
def test_accumulation_aggregates_the_whole_generation_batch(trl_loss, aggregate, tok, tiny_dir, tmp_path):
    """Two micro-batches accumulated: the integration's gradient is that of one aggregate over the whole batch.

    TRL's dapo does the same through num_items_in_batch; its grpo averages per-micro-batch
    means, equal here because no response is empty and both halves hold 4 responses.
    """
    kw = dict(gradient_accumulation_steps=2, per_device_train_batch_size=B // 2)
    theirs = make(GRPOTrainer, tok, tiny_dir, tmp_path, loss_type=trl_loss, **kw)
    ours = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant={"loss": "clipped", "aggregate": aggregate}, **kw)
    assert ours.args.steps_per_generation == 2
    stub = Bigram(len(tok))
    batch = hand_batch(stub, len(tok), lengths=(6, 6, 5, 6, 1, 2, 1, 3))  # unequal halves: 23 and 7 tokens
    ours._rewards_per_func = torch.randn(B, 1, generator=torch.Generator().manual_seed(3))
    ours._apply_variant(batch, training=True)   # the integration's generation step on this batch
    halves = split_tensor_dict(batch, 2)
    want, want_grads = loss_and_grads(theirs, stub, halves, accumulation=2)
    got, got_grads = loss_and_grads(ours, stub, halves, accumulation=2)
    assert got.item() == pytest.approx(want.item(), rel=1e-12)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-13)
    # and both equal the aggregate over the whole batch, computed in one piece
    stub.zero_grad()
    logp = stub(None, torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1), None, T)[0]
    whole, _ = grpo_loss(logp, batch["old_per_token_logps"], None, batch["advantages"],
                         batch["completion_mask"].double(), loss="clipped", aggregate=aggregate)
    assert got.item() == pytest.approx(whole.item(), rel=1e-12)


def test_accumulation_counts_responses_not_micro_batches(tok, tiny_dir, tmp_path):
    """An empty response in one half: seq_mean_token_mean over the whole batch leaves it out (TRL's grpo cannot)."""
    kw = dict(gradient_accumulation_steps=2, per_device_train_batch_size=B // 2)
    ours = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant={"aggregate": "seq_mean_token_mean"}, **kw)
    stub = Bigram(len(tok))
    batch = hand_batch(stub, len(tok), lengths=(6, 0, 5, 6, 1, 2, 1, 3))
    ours._rewards_per_func = torch.randn(B, 1, generator=torch.Generator().manual_seed(4))
    ours._apply_variant(batch, training=True)
    got, _ = loss_and_grads(ours, stub, split_tensor_dict(batch, 2), accumulation=2)
    with torch.no_grad():
        logp = stub(None, torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1), None, T)[0]
        lp, old = logp, batch["old_per_token_logps"]
        ratio = torch.exp(lp - old)
        adv = batch["advantages"][:, None].double()
        per_token = -torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
        m = batch["completion_mask"].double()
        per_seq = (per_token * m).sum(-1) / m.sum(-1).clamp(min=1)
        want = per_seq[m.sum(-1) > 0].mean()  # 7 responses, not 8
    assert got.item() == pytest.approx(want.item(), rel=1e-12)


# ---------------------------------------------------------------- advantages


REWARDS = torch.tensor([0.5, 0.5, 0.5, 0.5,        # a flat group: exactly 0 everywhere
                        1.0, 1.0, 1.0, 1 + 2**-10,  # a tiny spread, exact in fp32: where TRL's eps (1e-4) matters
                        0.0, 1.0, 0.0, 0.2,
                        3.0, -1.0, 0.5, 2.0])


def fixed_rewards(prompts, completions, **kwargs):
    return REWARDS[:len(completions)].tolist()


def generated(trainer):
    trainer.model.train()
    inputs = [{"prompt": p} for p in ["1+2=", "3+4=", "5+6=", "7+8="] for _ in range(G)]
    return trainer._generate_and_score_completions(inputs)


def rloo_by_hand(r):
    g = r.view(-1, G)
    return (g - (g.sum(-1, keepdim=True) - g) / (G - 1)).reshape(-1)


@pytest.mark.parametrize("scale,delta", [
    ("group", {"name": "zscore", "eps": 1e-4}),
    ("batch", {"name": "batch_std", "eps": 1e-4}),
    ("none", "centered"),
])
def test_advantages_match_trl(scale, delta, tok, tiny_dir, tmp_path):
    kw = dict(per_device_train_batch_size=16, max_completion_length=2, reward_funcs=[fixed_rewards])
    theirs = generated(make(GRPOTrainer, tok, tiny_dir, tmp_path, scale_rewards=scale, **kw))["advantages"]
    ours = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant={"delta": delta}, **kw)
    got = generated(ours)["advantages"]
    torch.testing.assert_close(got, theirs, rtol=1e-5, atol=1e-6)
    assert got.abs().max() > 0.5
    assert got[:G].abs().max() == 0  # the flat group
    assert list(ours._logs["advantages"]) == pytest.approx(got.tolist())  # TRL's completions table shows ours
    assert "delta/abs_mean" in ours._metrics["train"]


def test_default_eps_differs_from_trl(tok, tiny_dir, tmp_path):
    """zscore's own eps (1e-6, verl's) is not TRL's: the tiny-spread group tells them apart."""
    kw = dict(per_device_train_batch_size=16, max_completion_length=2, reward_funcs=[fixed_rewards])
    theirs = generated(make(GRPOTrainer, tok, tiny_dir, tmp_path, **kw))["advantages"]
    got = generated(make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant={"delta": "zscore"}, **kw))["advantages"]
    assert not torch.allclose(got[G:2 * G], theirs[G:2 * G], rtol=1e-3)
    torch.testing.assert_close(got[2 * G:], theirs[2 * G:], rtol=1e-3, atol=1e-3)


def test_rloo_with_kl_in_the_reward(tok, tiny_dir, tmp_path):
    """Advantages are RLOO of reward - beta * sum_t k1(pi_old, pi_ref), computed here by hand."""
    kw = dict(per_device_train_batch_size=16, max_completion_length=3, reward_funcs=[fixed_rewards])
    ours = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, **kw,
                variant={"delta": "rloo", "kl": "k1", "kl_coef": 0.5, "kl_placement": "reward"})
    with torch.no_grad():  # a policy that differs from the reference (the saved model)
        for p in ours.model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    out = generated(ours)
    with torch.no_grad():
        old = ours._logps(ours.model, out, entropy=False)[0]
    m = out["completion_mask"].double()
    k1 = ((old.double() - out["ref_per_token_logps"].double()) * m).sum(-1)
    assert k1.abs().max() > 0.01
    want = rloo_by_hand(REWARDS.double() - 0.5 * k1)
    torch.testing.assert_close(out["advantages"].double(), want, rtol=1e-5, atol=1e-6)
    assert ours._metrics["train"]["reward/penalised"][-1] == pytest.approx((REWARDS.double() - 0.5 * k1).mean().item(),
                                                                           rel=1e-5)


def test_mask_truncated_matches_trl(tok, tiny_dir, tmp_path):
    """filters: [mask_truncated] leaves out of the loss exactly what TRL's mask_truncated_completions does."""
    eos = tok.eos_token_id  # made likely, so that the 16 completions hold both kinds
    kw = dict(per_device_train_batch_size=16, max_completion_length=4, reward_funcs=[fixed_rewards],
              generation_kwargs={"sequence_bias": [[[eos], 3.0]]})
    theirs = make(GRPOTrainer, tok, tiny_dir, tmp_path, mask_truncated_completions=True, **kw)
    ours = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant={"filters": ["mask_truncated"]}, **kw)
    torch.manual_seed(0)
    want = generated(theirs)
    torch.manual_seed(0)
    got = generated(ours)
    assert torch.equal(got["completion_ids"], want["completion_ids"])
    kept = want["completion_mask"].sum(-1) > 0
    assert kept.any() and (~kept).any()
    assert torch.equal(got["bench_mask"].long(), want["completion_mask"])
    removed = ours._metrics["train"]["filter/mask_truncated/removed"][-1]
    assert removed == pytest.approx(1 - (got["bench_mask"].sum() / got["completion_mask"].sum()).item())


# ------------------------------------------------------------------ reference


LORA = dict(r=4, lora_alpha=8, target_modules=["c_attn", "c_proj", "c_fc"], fan_in_fan_out=True, task_type="CAUSAL_LM")


def test_lora_reference_refresh_reaches_trl_reference_pass(tok, tiny_dir, tmp_path):
    from peft import LoraConfig

    ours = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, peft_config=LoraConfig(**LORA),
                variant={"kl_coef": 0.1, "ref_update": {"name": "soft", "every": 1, "alpha": 0.5}})
    model = ours.model
    trainable = sorted(n for n, p in model.named_parameters() if p.requires_grad)
    assert trainable and all(".default." in n for n in trainable)  # the reference adapter never trains
    with torch.no_grad():
        for _, b in lora_factors(model, "default"):
            b.normal_(0, 0.3)
    ids = torch.tensor([tok("1+2=34")["input_ids"]])

    def logp(adapter):
        with torch.no_grad(), use_adapter(model, adapter):  # what TRL's reference pass does
            return torch.log_softmax(model(ids).logits, -1)

    policy = logp("default")
    assert not torch.allclose(logp("ref"), policy, atol=1e-4)
    ours._mix_reference(0.5)  # from the switched-off adapter: exactly half the policy's update
    for (a_p, b_p), (a_r, b_r) in zip(lora_factors(model, "default"), lora_factors(model, "ref")):
        torch.testing.assert_close(b_r @ a_r, 0.5 * (b_p @ a_p), rtol=1e-4, atol=1e-6)
    ours._mix_reference(1.0)
    torch.testing.assert_close(logp("ref"), policy, rtol=1e-5, atol=1e-5)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():   # both factors move: the mix of two updates has rank up to 2r, and the adapter keeps r
        for a, b in lora_factors(model, "default"):
            a.add_(0.5 * torch.randn(a.shape, generator=g))
            b.add_(0.3 * torch.randn(b.shape, generator=g))
    ours._mix_reference(0.5)
    cuts = ours._metrics["train"]["ref/mix_residual"]
    assert cuts[:2] == [0.0, 0.0] and 1e-3 < cuts[2] < 1 and len(cuts) == 3


def test_full_model_reference_refresh(tok, tiny_dir, tmp_path):
    ours = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant={"kl_coef": 0.1, "ref_update": "hard"})
    with torch.no_grad():
        for p in ours.model.parameters():
            p.add_(0.1)
    pairs = list(zip(ours.model.parameters(), ours.ref_model.parameters()))
    assert not torch.equal(pairs[0][0], pairs[0][1])
    ours._mix_reference(1.0)
    assert all(torch.equal(p, r) for p, r in pairs)


# ----------------------------------------------------------------- end to end


def test_end_to_end_composition_trl_does_not_offer(tok, tmp_path):
    """RLOO + k1 in the reward + clip-higher + a refreshed LoRA reference, on TRL's training loop, CPU."""
    from peft import LoraConfig

    pairs = [(a, b) for a in range(0, 90, 13) for b in range(5, 50, 11)]
    ds = Dataset.from_dict({"prompt": [f"{a}+{b}=" for a, b in pairs], "answer": [a + b for a, b in pairs]})
    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=6, num_iterations=2, max_steps=6, learning_rate=2e-2, logging_steps=1,
                      reward_weights=[1.0, 0.1, 0.1], report_to=[], use_cpu=True, save_strategy="no", seed=0,
                      disable_tqdm=True,
                      # EOS made likely, so that completion lengths (and the length reward) vary within groups
                      generation_kwargs={"sequence_bias": [[[tok.eos_token_id], 2.0]]})
    variant = {"delta": "rloo", "loss": {"name": "clipped", "clip_high": 0.28}, "aggregate": "token_mean",
               "kl": "k1", "kl_coef": 0.05, "kl_placement": "reward", "ref_update": {"name": "hard", "every": 2}}
    trainer = GRPOBenchTrainer(build_tiny(tok, 2, 32, 2, seed=0), args=args, train_dataset=ds, processing_class=tok,
                               reward_funcs=[lm_rewards.correct, lm_rewards.format_reward, lm_rewards.length_penalty],
                               peft_config=LoraConfig(**LORA), variant=variant)
    trainer.train()
    steps = [row for row in trainer.state.log_history if "loss" in row]
    assert len(steps) == 6 and trainer._rollouts == trainer._rollouts_planned(args) == 3   # TRL's own schedule
    for row in steps:  # the registry's metrics, through TRL's own logging, every step
        assert math.isfinite(row["loss"])
        for k in ("loss/policy", "clip/low_frac", "clip/high_frac", "clip/frac", "kl/value"):
            assert math.isfinite(row[k]), k
            if "clip" in k:
                assert 0 <= row[k] <= 1
    generations = [row for row in steps if "reward" in row]  # TRL's own metrics are still there
    assert len(generations) == 3
    assert all(row["kl/coef"] == 0.05 and row["delta/abs_mean"] > 0 for row in generations)
    # the second inner step is off-policy: some ratio left the trust region, on each side
    assert max(row["clip/high_frac"] for row in steps) > 0 and max(row["clip/low_frac"] for row in steps) > 0
    # refreshed before rollout 2: the reference is the policy of then, so KL restarts at 0
    kl_at_generation = [row["kl/value"] for row in generations]
    assert kl_at_generation[0] == 0 and kl_at_generation[2] == 0 and kl_at_generation[1] != 0
    assert any(b.abs().max() > 0 for _, b in lora_factors(trainer.model, "ref"))


def test_example_script_runs_an_ablation_variant_and_resumes_it(tmp_path):
    def example(*extra):
        r = subprocess.run([sys.executable, "examples/trl_example.py", "--ablation", "ablations/recipes.yaml",
                            "--variant", "reinforce_pp", "--steps", "2", "--out", str(tmp_path), *extra],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        return r.stdout.strip().splitlines()

    lines = example("--save-steps", "1")
    assert any(ln.startswith("variant (ablations/recipes.yaml): {'name': 'reinforce_pp'") for ln in lines)
    assert lines[-1].startswith("last logged:") and "clip/high_frac=" in lines[-1] and "kl/value=" in lines[-1]
    # step 1's checkpoint is inside the run's one generation (2 passes over it): resumed, step 2 is the same
    assert example("--resume", str(tmp_path / "checkpoint-1"))[-1] == lines[-1]


def test_example_script_refuses_dapo_in_one_line(capsys):
    spec = importlib.util.spec_from_file_location("trl_example", ROOT / "examples" / "trl_example.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--ablation", str(ROOT / "ablations" / "recipes.yaml"), "--variant", "dapo"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "filters.0: 'dynamic_sampling' drops groups" in err and "\n" not in err


# --------------------------------------------------------------------- errors


@pytest.mark.parametrize("variant,message", [
    ({"loss": "ppo"}, "<variant>: loss: unknown loss 'ppo'; valid: a2po, cispo, "),
    ({"loss": {"name": "clipped", "tau": 1.0}}, "<variant>: loss.tau: loss 'clipped' has no parameter 'tau'"),
    ({"loss": {"name": "clipped", "clip_low": 1.5}}, "<variant>: loss.clip_low: must be < 1"),
    ({"kl_placement": "advantage"}, "<variant>: kl_placement: unknown 'advantage'; valid: loss, reward"),
    ({"kl_coef": "a lot"}, "<variant>: kl_coef: expected float, got 'a lot'"),
    ({"group_size": 8}, "<variant>: group_size: TRL owns this setting: set GRPOConfig.num_generations"),
    ({"clip_high": 0.28}, "<variant>: clip_high: unknown key; valid: delta, loss, "),
    ({"delta": "remax"}, "<variant>: delta: 'remax' needs each prompt's greedy response"),
    ({"delta": "optimal_token_baseline"}, "<variant>: delta: 'optimal_token_baseline' needs logp, sum_pi_sq from the "
                                          "trainer, or gives per-token advantages"),
    ({"delta": "a2po"}, "<variant>: delta: 'a2po' needs ref_rewards from the trainer"),
    ({"loss": "a2po"}, "<variant>: loss: 'a2po' regresses onto log pi / pi_ref"),
    ({"filters": ["dynamic_sampling"]}, "<variant>: filters.0: 'dynamic_sampling' drops groups and draws replacements"),
    ({"filters": [{"name": "overlong_punish", "cache": 6}]},
     "<variant>: filters.0: overlong_punish: cache (6) must be below"),
])
def test_bad_variant_is_one_line(variant, message, tok, tiny_dir, tmp_path):
    with pytest.raises(ConfigError) as e:
        make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant=variant)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_variant_file_is_named_in_errors(tok, tiny_dir, tmp_path):
    f = tmp_path / "winner.yaml"
    f.write_text("delta: rloo\nloss: {name: sapo, tau_pos: -1}\n")
    with pytest.raises(ConfigError, match=r"winner\.yaml: loss\.tau_pos: must be > 0"):
        make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant=str(f))


@pytest.mark.parametrize("option,value,part", [
    ("loss_type", "grpo", "loss and aggregate"), ("scale_rewards", "none", "delta"), ("beta", 0.04, "kl_coef"),
    ("epsilon_high", 0.28, "loss.clip_high"), ("mask_truncated_completions", True, "filters"),
])
def test_trl_option_the_variant_replaces_is_refused(option, value, part, tok, tiny_dir, tmp_path):
    with pytest.raises(ConfigError) as e:
        make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant={}, **{option: value})
    assert str(e.value).startswith(f"GRPOConfig: {option}: replaced by the variant's {part}")


def test_unsupported_trl_version_is_one_line(monkeypatch):
    for good in ("1.16.0", "1.16.2"):
        check_trl_version(good)
    for bad in ("1.15.0", "1.17.0", "2.0.0"):
        with pytest.raises(ImportError, match=rf"supports trl>=1\.16\.0,<1\.17 .*found trl {bad}") as e:
            check_trl_version(bad)
        assert "\n" not in str(e.value)
    # importing the module checks the installed version
    import trl

    monkeypatch.setattr(trl, "__version__", "1.14.2")
    spec = importlib.util.spec_from_file_location("grpo_bench.integrations._trl_probe", bench_trl.__file__)
    with pytest.raises(ImportError, match="found trl 1.14.2"):
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


def test_variant_from_ablation(tmp_path):
    f = tmp_path / "abl.yaml"
    f.write_text("name: abl\nbase: {task: sort, group_size: 4, kl_coef: 0.01}\n"
                 "variants:\n  winner: {delta: rloo, loss: {name: clipped, clip_high: 0.28}, inner_steps: 2}\n"
                 "  loser: {loss: naive}\n")
    v = variant_from_ablation(f, "winner")
    assert v == {"delta": "rloo", "loss": {"name": "clipped", "clip_high": 0.28}, "kl_coef": 0.01}
    with pytest.raises(ConfigError, match=r"abl\.yaml: variants: no variant 'best'; valid: winner, loser"):
        variant_from_ablation(f, "best")


def test_every_variant_key_is_a_run_config_key():
    from dataclasses import fields

    from grpo_bench.config.run import PART_KEYS, RunConfig

    run_keys = {f.name for f in fields(RunConfig) if f.init}  # the keys a user sets (not task_name: resolve_run sets it)
    assert set(bench_trl.VARIANT_KEYS) | set(bench_trl.TRL_OWNED) == run_keys
    assert set(PART_KEYS) <= set(bench_trl.VARIANT_KEYS)
    assert registry.names("delta")  # the registry loads under the integration's import
