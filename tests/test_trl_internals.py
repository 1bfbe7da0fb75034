"""GRPOBenchTrainer's bookkeeping, each piece on inputs made by hand: the snapshot adapter's horizon and start, a
micro-batch's shares of the generation batch, the entropy controller's window, TRL's MoE auxiliary loss, and the
small readers of TRL's batch (finished, the tool mask, eval groups). tests/test_trl.py and test_trl_v3.py hold the
losses to TRL's own; these hold what those comparisons cannot reach (mutation testing found each unheld).
"""
import copy
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from helpers import needs

needs("trl")
from trl.trainer.utils import use_adapter  # noqa: E402

from grpo_bench.integrations.trl import GRPOBenchTrainer  # noqa: E402

from test_trl import LORA, B, Bigram, hand_batch, loss_and_grads, make, tiny_dir, tok  # noqa: E402,F401
from test_trl_v3 import SPLIT, scored  # noqa: E402

HARD = {"kl_coef": 0.1, "ref_update": {"name": "hard"}}


def lora(**kw):
    from peft import LoraConfig

    return LoraConfig(**LORA | kw)


# ------------------------------------------------------------------ the reference's snapshot adapter


@pytest.mark.parametrize("every,max_steps,made", [(1, 2, True), (2, 2, False), (2, 3, True)])
def test_the_snapshot_adapter_is_made_when_an_update_falls_inside_the_run(every, max_steps, made, tok, tiny_dir,
                                                                         tmp_path):
    """One generation per optimizer step here: rollouts 0 .. max_steps - 1, and `hard` updates at every `every`-th
    after the first. An update due after the run's end makes no adapter (its memory, its reference pass)."""
    ours = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, peft_config=lora(), max_steps=max_steps,
                variant=HARD | {"ref_update": {"name": "hard", "every": every}})
    assert ours._rollouts_planned(ours.args) == max_steps
    assert ("ref" in ours.model.peft_config) == made


def test_the_rollouts_planned_follow_trls_generation_schedule():
    """ceil(max_steps x accumulation / (steps_per_generation x num_iterations)), TRL's `_step % generate_every`;
    the end-to-end tests check it against TRL's loop (3 and 2 rollouts there)."""
    from types import SimpleNamespace as Args

    plan = GRPOBenchTrainer._rollouts_planned
    assert plan(Args(max_steps=6, gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=2)) == 3
    assert plan(Args(max_steps=5, gradient_accumulation_steps=2, steps_per_generation=4, num_iterations=1)) == 3
    assert plan(Args(max_steps=1, gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1)) == 1
    # max_steps 0 or -1: transformers trains for num_train_epochs instead
    for epochs in (0, -1):
        assert plan(Args(max_steps=epochs, gradient_accumulation_steps=8, steps_per_generation=8,
                         num_iterations=1)) == 10_001


@pytest.mark.parametrize("variant,key", [({"corrections": [{"name": "snis", "level": "sequence"}]}, "corrections"),
                                         ({"entropy_coef": 0.1, "filters": ["top_entropy"]}, "entropy_coef")])
def test_what_needs_the_whole_batch_is_refused_on_two_processes(variant, key, tok, tiny_dir, tmp_path):
    """One micro-batch per generation but two processes (the split test_trl_v3 refuses at two micro-batches):
    each process holds half the batch, so a mean over the whole of it is as unknown."""
    from types import SimpleNamespace as Args

    from grpo_bench.errors import ConfigError

    ours = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant=variant)
    ours._check_split(Args(num_generations=4, steps_per_generation=1, world_size=1), "<variant>")
    with pytest.raises(ConfigError, match=f"^<variant>: {key}: .*on one process"):
        ours._check_split(Args(num_generations=4, steps_per_generation=1, world_size=2), "<variant>")


@pytest.mark.parametrize("every,made", [(10_000, True), (10_001, False)])
def test_without_max_steps_an_update_past_ten_thousand_rollouts_says_so(every, made, tok, tiny_dir, tmp_path):
    ours = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, peft_config=lora(),
                variant=HARD | {"ref_update": {"name": "hard", "every": every}})
    assert ("ref" in ours.model.peft_config) == made
    if not made:
        ours._rollouts = every
        with pytest.raises(RuntimeError, match=r"rollout 10001, past the 10,001 rollouts planned .* no 'ref' adapter: "
                                               r"set max_steps"):
            ours._mix_reference(1.0)


def test_the_snapshot_adapter_starts_as_the_adapter_switched_off_whatever_the_init(tok, tiny_dir, tmp_path):
    """TRL's reference without a "ref" adapter is the adapter switched off; the snapshot is the same reference until
    its first update, also under an init whose B is not zero (peft's init_lora_weights=False), and never trains."""
    ours = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, peft_config=lora(init_lora_weights=False), variant=HARD)
    model = ours.model
    ids = torch.tensor([tok("1+2=34")["input_ids"]])
    with torch.no_grad():
        policy = model(ids).logits
        with use_adapter(model, "ref"):
            ref = model(ids).logits
        with use_adapter(model, None):
            off = model(ids).logits
    assert torch.equal(ref, off) and not torch.allclose(policy, off, atol=1e-3)
    assert model.active_adapter == "default"
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".default." in n for n in trainable)


def test_corrections_without_a_sampler_leave_an_on_policy_batchs_weights_alone(tok, tiny_dir, tmp_path):
    """No vLLM and one pass: TRL leaves the old log-probs None and there is no sampler, so the corrections keep every
    token (rho = 1) and the batch weighs as without them."""
    stub = Bigram(len(tok))
    rewards = torch.randn(B, 1, generator=torch.Generator().manual_seed(3))
    out = {}
    for name, variant in (("plain", {}), ("corrected", {"corrections": [{"name": "seq_mis", "high": 1.001}]})):
        ours = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant=variant)
        out[name] = scored(ours, hand_batch(stub, len(tok)) | {"old_per_token_logps": None}, rewards)
    assert torch.equal(out["corrected"]["bench_weight"], out["plain"]["bench_weight"])
    assert out["plain"]["bench_weight"].sum() > 0


# ------------------------------------------------------------------ a micro-batch's shares


def shares(trainer, here_mask, whole, *, ent=None, all_ent=4.0, positive=None, all_pos=4.0):
    """_shares on one prompt's group (1, G, T) whose kept tokens are here_mask; token_mean weighs each kept token
    1 / (their number), so whole = c * that is a share c of the generation batch."""
    kept = torch.tensor(here_mask, dtype=torch.float64)[None]
    inputs = {"bench_weight": torch.tensor(whole, dtype=torch.float64)[None], "bench_tokens": torch.tensor(all_ent),
              "bench_positive_tokens": torch.tensor(all_pos)}
    ent_tokens = kept if ent is None else torch.tensor(ent, dtype=torch.float64)[None]
    return trainer._shares(inputs, kept, ent_tokens, positive, None, "train")


@pytest.fixture
def split(tok, tiny_dir, tmp_path):
    """Two micro-batches per generation batch: the shares are computed, not 1."""
    return make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant={"aggregate": "token_mean"}, **SPLIT)


def test_a_proportional_micro_batch_gets_its_share(split):
    # three kept tokens of 1/3 each; the whole batch's weights on them are a quarter of that
    assert shares(split, [[1, 1, 0], [1, 0, 0]], [[1 / 12, 1 / 12, 0], [1 / 12, 0, 0]])[0] == pytest.approx(0.25)
    # rounding is not a refusal, however large the share (the tolerance is relative)
    big = 2.0 ** 20 / 3
    assert shares(split, [[1, 1, 0], [1, 0, 0]], [[big, big * (1 + 1e-13), 0], [big, 0, 0]])[0] == \
        pytest.approx(2.0 ** 20)


@pytest.mark.parametrize("whole", [
    [[1 / 3, 2 / 3, 0], [1.0, 0, 0]],          # the same tokens, weighed 1 : 2 : 3 against the micro-batch's own
    [[1 / 3, 1 / 3 * (1 + 1e-6), 0], [1 / 3, 0, 0]],   # one weight off by a millionth
    [[1 / 12, 1 / 12, 0], [1 / 12, 0, 1 / 12]],  # proportional where both weigh, but a token only the batch weighs
    [[0.0, 0, 0], [0, 0, 0]],                   # a share of nothing
])
def test_a_micro_batch_that_is_no_share_of_the_batch_is_refused(split, whole):
    with pytest.raises(RuntimeError, match=r"does not split into micro-batches \(aggregate 'token_mean'"):
        shares(split, [[1, 1, 0], [1, 0, 0]], whole)


def test_the_entropy_and_nll_shares_count_kept_tokens(split):
    kept, whole = [[1, 1, 0], [1, 0, 0]], [[1 / 12, 1 / 12, 0], [1 / 12, 0, 0]]
    gated = [[1, 0, 0], [1, 0, 0]]              # the entropy bonus's tokens: two of the three
    assert shares(split, kept, whole, ent=gated, all_ent=8.0)[1] == 0.25
    assert shares(split, kept, whole, ent=gated, all_ent=2.0)[1] == 1.0
    assert shares(split, kept, whole, ent=gated, all_ent=0.0)[1] == 0.0     # no token anywhere: no bonus
    one = [[1, 0, 0], [0, 0, 0]]
    assert shares(split, one, [[0.5, 0, 0], [0, 0, 0]], all_ent=1.0)[1] == 1.0
    # the NLL term's: kept tokens of positive responses; without rewards the term is the micro-batch's own
    positive = torch.tensor([[True, False]])    # the first response's two kept tokens
    assert shares(split, kept, whole, positive=positive, all_pos=8.0)[2] == 0.25
    assert shares(split, kept, whole, positive=~positive, all_pos=1.0)[2] == 1.0
    assert shares(split, kept, whole, positive=positive, all_pos=0.0)[2] == 0.0
    assert shares(split, kept, whole)[2] == 1.0


# ------------------------------------------------------------------ statistics over processes


class Pair:
    """Two ranks' collectives in one process, one thread each: a call returns once both ranks have made it."""

    def __init__(self):
        self.barrier, self.slots = threading.Barrier(2, timeout=60), [None, None]

    def exchange(self, rank, x):
        self.slots[rank] = x
        self.barrier.wait()
        both = list(self.slots)
        self.barrier.wait()
        return both


class Rank:
    """What GRPOBenchTrainer asks of accelerate's Accelerator on one of two processes."""
    num_processes = 2

    def __init__(self, pair, rank):
        self.pair, self.process_index = pair, rank

    def gather(self, x):
        return torch.cat([t.reshape(1) if t.dim() == 0 else t for t in self.pair.exchange(self.process_index, x)])

    def pad_across_processes(self, x, dim=0, pad_index=0):
        if dim >= x.dim():   # as accelerate's: a tensor without that dimension comes back as it is
            return x
        n = max(t.shape[dim] for t in self.pair.exchange(self.process_index, x))
        shape = list(x.shape)
        shape[dim] = n - x.shape[dim]
        return torch.cat([x, x.new_full(shape, pad_index)], dim)


def on_two_processes(trainer, calls):
    """calls[rank]: (method name, args); each rank a shallow copy of trainer with its own Accelerator."""
    pair = Pair()
    ranks = [copy.copy(trainer) for _ in range(2)]
    for r, t in enumerate(ranks):
        t.accelerator = Rank(pair, r)
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(getattr(t, name), *args) for t, (name, args) in zip(ranks, calls)]
        return [f.result(timeout=120) for f in futures]


def test_statistics_over_two_processes_weigh_each_by_what_it_averages(tok, tiny_dir, tmp_path):
    """Each process holds two whole prompts (responses 0-7 and 8-15), with unequal token counts and completion
    lengths. A token mean weighs each process by its tokens (a term's own count where it has one); loss/policy by
    its share of the per-prompt aggregate (a half each: two of four prompts); the ratio extremes are the extremes;
    a term without a token anywhere is not logged, one with a single token is its value."""
    ours = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant={"aggregate": "prompt_mean"})
    ours.model.train()
    masks = [(torch.arange(6)[None] < torch.tensor([6, 3, 1, 6, 5, 2, 6, 4])[:, None]).double(),
             (torch.arange(4)[None] < torch.tensor([1, 2, 1, 3, 4, 4, 2, 1])[:, None]).double()]
    values = [{"entropy": 0.5, "loss/policy": 0.25, "mismatch/ratio_max": 1.5, "mismatch/ratio_min": 0.75,
               "loss/nll": 0.0, "loss/entropy": 0.0},
              {"entropy": 2.0, "loss/policy": -1.0, "mismatch/ratio_max": 1.25, "mismatch/ratio_min": 0.5,
               "loss/nll": 3.0, "loss/entropy": 0.0}]
    counts = [{"loss/nll": torch.tensor(0), "loss/entropy": torch.tensor(0)},
              {"loss/nll": torch.tensor(1), "loss/entropy": torch.tensor(0)}]
    calls = [("_gather_stats", ({k: torch.tensor(v, dtype=torch.float64) for k, v in values[r].items()}, masks[r],
                                torch.arange(8) + 8 * r, counts[r])) for r in range(2)]
    got = on_two_processes(ours, calls)
    assert got[0] == got[1]
    t0, t1 = (m.sum().item() for m in masks)
    assert got[0] == {"entropy": pytest.approx((0.5 * t0 + 2.0 * t1) / (t0 + t1), rel=1e-15),
                      "loss/policy": pytest.approx(0.5 * 0.25 + 0.5 * -1.0, rel=1e-15),
                      "mismatch/ratio_max": 1.5, "mismatch/ratio_min": 0.5, "loss/nll": 3.0}


def test_statistics_of_one_process_leave_out_a_mean_over_no_token(tok, tiny_dir, tmp_path):
    ours = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant={})
    stats = {"entropy": torch.tensor(0.5), "loss/nll": torch.tensor(2.0), "loss/entropy": torch.tensor(0.0)}
    mask = torch.ones(B, 6)
    got = ours._gather_stats(stats, mask, None, {"loss/nll": torch.tensor(1), "loss/entropy": torch.tensor(0)})
    assert got == {"entropy": 0.5, "loss/nll": 2.0}


# ------------------------------------------------------------------ the entropy controller's window


def test_the_controller_steps_on_the_token_mean_of_its_window(tok, tiny_dir, tmp_path, monkeypatch):
    ours = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant={
        "entropy_coef": 0.02, "entropy_ctrl": {"name": "adaptive", "target": 100.0, "delta": 0.01}}, **SPLIT)
    seen = []
    step = ours.recipe.next_entropy_coef
    monkeypatch.setattr(ours.recipe, "next_entropy_coef", lambda h: seen.append(h) or step(h))
    sync = ours.accelerator.gradient_state._set_sync_gradients
    try:
        sync(False)
        ours._step_entropy(torch.tensor(0.5), torch.tensor(3))
        assert seen == []
        sync(True)
        ours._step_entropy(torch.tensor(2.0), torch.tensor(1))
        ours._step_entropy(torch.tensor(0.7, dtype=torch.float64), torch.tensor(1))   # a window of one token
    finally:
        sync(True)
    assert seen == [pytest.approx((3 * 0.5 + 2.0) / 4, rel=1e-15), pytest.approx(0.7, rel=1e-15)]


def test_the_bonus_counts_the_tokens_it_averages(tok, tiny_dir, tmp_path, monkeypatch):
    """The controller's weight and the logged mean's count are the tokens the bonus averages: the mask's, and with a
    step filter the ones it keeps, never the padding."""
    stub = Bigram(len(tok))
    for variant in ({"entropy_coef": 0.05}, {"entropy_coef": 0.05, "filters": ["top_entropy"]}):
        ours = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant=variant)
        batch = scored(ours, hand_batch(stub, len(tok)), torch.randn(B, 1))
        got = {}
        gate, count = ours._step_gate, ours._gather_stats
        monkeypatch.setattr(ours, "_step_gate", lambda *a: got.setdefault("gate", gate(*a)))
        monkeypatch.setattr(ours, "_step_entropy", lambda h, tokens: got.setdefault("window", int(tokens)))
        monkeypatch.setattr(ours, "_gather_stats", lambda s, m, i, counts: (
            got.setdefault("counted", int(counts["loss/entropy"])), count(s, m, i, counts))[1])
        loss_and_grads(ours, stub, [batch])
        want = batch["completion_mask"].bool()
        if "filters" in variant:
            want = want & (got["gate"] > 0)
            assert 0 < want.sum() < batch["completion_mask"].sum()
        assert got["window"] == got["counted"] == int(want.sum())


# ------------------------------------------------------------------ TRL's MoE auxiliary loss


class RoutedBigram(Bigram):
    """The bigram with a router's load-balancing loss, as TRL's forward returns it for a Mixture-of-Experts model."""

    def __call__(self, *args, compute_aux_loss=False, **kw):
        logp, entropy, _ = super().__call__(*args, **kw)
        return logp, entropy, (self.w.square().mean() if compute_aux_loss else None)


def test_an_moe_models_aux_loss_is_added_as_trls(tok, tiny_dir, tmp_path):
    """TRL adds router_aux_loss_coef x aux / accumulation in training (the policy loss is scaled so), aux itself in
    evaluation, and logs aux; the variant's loss does the same around its own, here one TRL also has (grpo)."""
    from trl import GRPOTrainer

    stub = RoutedBigram(len(tok))
    batch = hand_batch(stub, len(tok))
    theirs = make(GRPOTrainer, tok, tiny_dir, tmp_path, loss_type="grpo")
    ours = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant={"loss": "clipped",
                                                                    "aggregate": "seq_mean_token_mean"})
    for t in (theirs, ours):
        t.aux_loss_enabled, t.router_aux_loss_coef = True, 0.3
    for accumulation in (1, 2):
        want, want_grads = loss_and_grads(theirs, stub, [batch], accumulation)
        got, got_grads = loss_and_grads(ours, stub, [batch], accumulation)
        assert got.item() == pytest.approx(want.item(), rel=1e-12)
        for a, b in zip(got_grads, want_grads):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-13)
    aux = stub.w.square().mean().item()
    assert ours._metrics["train"]["aux_loss"] == pytest.approx([aux, aux], rel=1e-12)
    # evaluation: no accumulation to undo, whatever the last training step's
    ours.model.eval()
    with torch.no_grad():
        got = ours._compute_loss(ours.model, batch).item()
        ours.router_aux_loss_coef = 0.0
        assert got - ours._compute_loss(ours.model, batch).item() == pytest.approx(0.3 * aux, rel=1e-9)
    assert ours._metrics["eval"]["aux_loss"][0] == pytest.approx(aux, rel=1e-12)


def test_the_aux_loss_logged_is_the_mean_over_processes(tok, tiny_dir, tmp_path):
    """As TRL logs it (gather_for_metrics, then the mean): each process's router loss, averaged."""
    from trl.trainer.utils import split_tensor_dict

    stub = RoutedBigram(len(tok))
    ours = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant={})
    ours.aux_loss_enabled, ours.router_aux_loss_coef = True, 0.3
    ours._get_per_token_logps_and_entropies = stub
    ours.current_gradient_accumulation_steps = 1
    ours.model.train()
    halves = split_tensor_dict(hand_batch(stub, len(tok)), 2)
    on_two_processes(ours, [("_compute_loss", (ours.model, h)) for h in halves])
    aux = stub.w.square().mean().item()
    assert ours._metrics["train"]["aux_loss"] == pytest.approx([aux, aux], rel=1e-12)


# ------------------------------------------------------------------ readers of TRL's batch


def test_finished_reads_the_last_kept_token(tok, tiny_dir, tmp_path):
    """Ended with EOS (or pad) within the budget, TRL's test; a one-token EOS answer is finished, an empty one not."""
    ours = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant={})
    eos, pad, x = tok.eos_token_id, tok.pad_token_id, tok.convert_tokens_to_ids("7")
    assert x not in (eos, pad)
    ids = torch.tensor([[eos, x, x], [x, x, x], [x, eos, pad], [pad, pad, pad]])
    mask = torch.tensor([[1, 0, 0], [1, 1, 1], [1, 1, 0], [0, 0, 0]])
    assert ours._finished({"completion_ids": ids, "completion_mask": mask}).tolist() == [True, False, True, False]


def test_the_tool_mask_leaves_tool_output_out_of_the_loss():
    mask = torch.ones(2, 3, dtype=torch.long)
    tool = torch.tensor([[1, 0, 1], [1, 1, 0]])
    assert torch.equal(GRPOBenchTrainer._loss_mask({"completion_mask": mask, "tool_mask": tool}), tool)
    assert GRPOBenchTrainer._loss_mask({"completion_mask": mask}) is mask


def test_evaluation_groups_are_num_generations_eval(tok, tiny_dir, tmp_path):
    ours = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant={}, num_generations_eval=2)
    index = torch.tensor([6, 1])   # in groups of two, prompts 3 and 0; of four, prompts 1 and 0
    slots, n, g = ours._groups({"bench_index": index}, "eval")
    assert (n, g) == (2, 2) and slots.tolist() == [2, 1]
    slots, n, g = ours._groups({"bench_index": index}, "train")
    assert (n, g) == (2, 4) and slots.tolist() == [6, 1]


def test_a_resumed_run_counts_the_generations_before_it(tok, tiny_dir, tmp_path, monkeypatch):
    """Resumed at optimizer step 5 with 2 micro-batches a step and a generation every 2 x 2 of them: TRL generated
    ceil(10 / 4) = 3 times before, so ref_update reads rollout 3, then 4; a fresh run reads 0, then 1."""
    from trl import GRPOTrainer

    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", lambda self, inputs: {})
    monkeypatch.setattr(GRPOBenchTrainer, "_apply_variant", lambda self, out, training: None)
    for step, want in ((0, [0, 1]), (5, [3, 4])):
        ours = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant=HARD, num_iterations=2, max_steps=8,
                    **SPLIT)
        read = []
        weight = ours.recipe.ref_weight
        monkeypatch.setattr(ours.recipe, "ref_weight", lambda e: read.append(e) or weight(e))
        monkeypatch.setattr(ours, "_mix_reference", lambda w: None)
        ours.state.global_step = step
        ours.model.train()
        for _ in range(2):
            ours._generate_and_score_completions({})
            ours.state.global_step += 1
        assert read == want


# ------------------------------------------------------------------ checkpoints


def test_a_resumed_run_goes_on_with_the_controllers_where_they_were(tok, tiny_dir, tmp_path):
    """Four optimizer steps, a generation every two, a checkpoint at step 2; resumed from it, the run's adaptive KL
    coefficient at its second generation and the entropy coefficient at steps 3 and 4 are the uninterrupted run's
    (both controllers restarted from their first values before their state went into the checkpoint)."""
    variant = {"kl": "k2", "kl_coef": 0.1, "kl_placement": "reward",
               "kl_ctrl": {"name": "adaptive", "target": 1e-6, "horizon": 8},
               "entropy_coef": 0.01, "entropy_ctrl": {"name": "adaptive", "target": 100.0, "delta": 0.01}}
    args = dict(variant=variant, num_iterations=2, max_steps=4, logging_steps=1, save_strategy="steps", save_steps=2,
                learning_rate=5e-2, seed=0, **SPLIT)

    def run(resume=None):
        trainer = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, **args)
        trainer.train(resume_from_checkpoint=resume)
        return [[row[k] for row in trainer.state.log_history if k in row] for k in ("kl/coef", "entropy/coef", "loss")]

    kl, entropy, loss = run()
    assert len(kl) == 2 and kl[1] != kl[0] and len(entropy) == 4 and entropy[2] != entropy[0]
    checkpoint = tmp_path / "out" / "checkpoint-2"
    kl_resumed, entropy_resumed, loss_resumed = run(str(checkpoint))
    assert (kl_resumed, entropy_resumed) == (kl, entropy)
    # and everything else with them: the resumed steps are the uninterrupted run's, bit for bit (TRL's own sampler
    # replayed epoch 0's prompt order in epoch 1, and step 4's loss was 1.1% off)
    assert loss_resumed == loss
    # a checkpoint made before the controllers' state was saved: they start over, as they did then
    (checkpoint / "grpo_bench_controllers.json").unlink()
    kl_old, entropy_old, _ = run(str(checkpoint))
    assert kl_old == [kl[0], kl[0]] and entropy_old[2:] == entropy[:2]


def test_a_run_resumed_inside_a_generation_goes_on_bit_for_bit(tok, tiny_dir, tmp_path):
    """A generation every two optimizer steps (num_iterations 2), checkpoints at steps 3 and 6: step 3's is inside
    the generation begun at step 3, so it holds that generation and the KL coefficient it was made with (KL in the
    loss, an adaptive controller); resumed from it, steps 4 to 6 are the uninterrupted run's. TRL's own resume
    generated anew at step 4 and went on a generation out of step (steps 4 to 6 off)."""
    from grpo_bench.integrations.trl import GENERATION

    variant = {"kl": "k3", "kl_coef": 0.1, "kl_placement": "loss",
               "kl_ctrl": {"name": "adaptive", "target": 1e-6, "horizon": 8}}
    args = dict(variant=variant, num_iterations=2, max_steps=6, logging_steps=1, save_strategy="steps", save_steps=3,
                learning_rate=5e-2, seed=0, **SPLIT)

    def run(resume=None):
        trainer = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, **args)
        trainer.train(resume_from_checkpoint=resume)
        return [[row[k] for row in trainer.state.log_history if k in row] for k in ("kl/coef", "loss")]

    kl, loss = run()
    assert len(set(kl)) == 3                     # the coefficient moves at each generation
    inside, boundary = tmp_path / "out" / "checkpoint-3", tmp_path / "out" / "checkpoint-6"
    assert (inside / GENERATION.format(0)).is_file() and not (boundary / GENERATION.format(0)).exists()
    assert run(str(inside)) == [kl, loss]
    # a checkpoint of the weights alone is not one to resume from, and every process but the first would write into
    # a directory that only the first makes
    args |= dict(save_only_model=True, max_steps=3, output_dir=str(tmp_path / "weights"))
    run()
    saved = tmp_path / "weights" / "checkpoint-3"
    assert (saved / "model.safetensors").is_file() and not (saved / GENERATION.format(0)).exists()


def test_the_sampler_of_a_resumed_run_draws_the_epoch_it_resumes_in(tok, tiny_dir, tmp_path):
    """Six prompts, three epochs: a sampler rebuilt and told epoch 2 (as a resume tells it) yields the uninterrupted
    sampler's third epoch, where TRL's rebuilt sampler yields its first; an unshuffled one stays unshuffled."""
    from datasets import Dataset

    ds = Dataset.from_dict({"prompt": [f"{i}+1=" for i in range(6)]})

    def sampler(**kw):
        trainer = make(GRPOBenchTrainer, tok, tiny_dir, tmp_path, variant={}, per_device_train_batch_size=4,
                       num_generations=2, seed=3, **kw)
        return trainer._get_train_sampler(ds)

    running = sampler()
    epochs = []
    for e in range(3):
        running.set_epoch(e)
        epochs.append(list(running))
    assert len(set(map(tuple, epochs))) == 3 and len(epochs[0]) == len(running) == 12
    resumed = sampler()
    resumed.set_epoch(2)
    assert list(resumed) == epochs[2]
    assert list(sampler().inner) == epochs[0]          # TRL's own, rebuilt: epoch 0 again
    resumed.set_epoch(1)                               # and back, as a second resume of the same object would
    assert list(resumed) == epochs[1]
    plain = sampler(shuffle_dataset=False)
    plain.set_epoch(2)
    assert list(plain) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
