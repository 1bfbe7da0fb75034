"""An ablation's variant on TRL's GRPOTrainer: TRL generates, scores, distributes and logs; the registry does the maths.

    from grpo_bench.integrations.trl import GRPOBenchTrainer, variant_from_ablation
    trainer = GRPOBenchTrainer(model, reward_funcs=[...], args=GRPOConfig(...), train_dataset=ds,
                               variant={"delta": "rloo", "loss": {"name": "clipped", "clip_high": 0.28},
                                        "kl": "k1", "kl_coef": 0.05, "kl_placement": "reward"})
    trainer.train()

A variant is the GRPO part of a run config (VARIANT_KEYS), in the YAML syntax of an
ablation and checked by the same code (config.resolve_part, config.validate), so a bad
part is the same one-line ConfigError. Two of GRPOTrainer's methods are replaced; both
call the run's Recipe, the composition the project's own trainer calls:

    _generate_and_score_completions   TRL's generation and reward functions run as always; then, on the
                                      rewards of the whole batch (all processes; each reward function's
                                      scores as GDPO's components), the variant's rollout filters, the KL
                                      penalty in the reward and the delta part give the advantages.
                                      Reference updates (ref_update) run before each generation, the KL
                                      controller (kl_ctrl) after it.
    _compute_loss                     TRL's log-probs and entropies, each prompt's responses regrouped
                                      (TRL shuffles rows); step filters; then Recipe.loss: the policy term,
                                      the off-policy corrections fed by the sampler's log-probs (TRL's
                                      sampling_per_token_logps, from vLLM), the KL term, the entropy bonus
                                      (its controller, entropy_ctrl, steps once per optimizer step) and the
                                      positive-example NLL term.

The loss is over the whole generation batch, as the project's trainer's is over its
rollout: each micro-batch's aggregate is scaled by its share of the batch's (the weights
are d aggregate / d per-token loss, so no part is named here), and the entropy bonus and
the NLL term, token means, by the micro-batch's share of their tokens. Gradient
accumulation and data parallelism then give the gradient of one loss over every
process's completions. TRL does this for loss_type dapo only; grpo, bnpo and dr_grpo
average per-micro-batch aggregates, which is the same only when micro-batches are alike.

A checkpoint also holds the controllers' state and, made inside a generation's reuse, that
generation; the train sampler takes the epoch it is in. So a resumed run goes on bit for
bit, where TRL's own replays the first epoch's prompts and generates anew.

TRL's own off-policy corrections (vllm_importance_sampling_*, off_policy_mask_threshold)
become the registry corrections they equal (TRL_IS_MODES, opsm) when the variant has none;
beside the variant's own they are refused. What cannot carry over is refused with a
one-line error (see docs/trl.md, "What does not carry over"): filters that draw
replacement groups (dynamic sampling) or retire prompts (a curriculum: TRL's sampler
draws a fixed dataset), deltas that need a greedy rollout (remax), and TRL options that
the variant replaces (loss_type, scale_rewards, beta, entropy_coef, ...) when set.

Supported TRL: SUPPORTED_TRL. The hooks are private methods of GRPOTrainer, which change
between minor releases; the pin in pyproject's `trl` extra follows this range.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from packaging.version import Version
from torch import Tensor

from .. import registry
from ..algos import Batch, masked_mean
from ..algos.corrections import compose
from ..errors import ConfigError
from ..engine.recipe import Recipe

SUPPORTED_TRL = ">=1.16.0,<1.17"
_TRL_RANGE = (Version("1.16.0"), Version("1.17"))


def check_trl_version(version: str) -> None:
    """ImportError (one line) unless `version` is a TRL release this integration was written against."""
    if not _TRL_RANGE[0] <= Version(version) < _TRL_RANGE[1]:
        raise ImportError(f"grpo_bench.integrations.trl supports trl{SUPPORTED_TRL} (it overrides GRPOTrainer "
                          f"internals that change between releases); found trl {version}: pip install -e '.[trl]'")


try:
    import trl
except ImportError:
    raise ImportError("grpo_bench.integrations.trl needs trl: pip install -e '.[trl]'") from None
check_trl_version(trl.__version__)

from accelerate.utils import is_peft_model  # noqa: E402  (trl brings accelerate)
from trl import GRPOConfig, GRPOTrainer  # noqa: E402
from trl.trainer.callbacks import SyncRefModelCallback  # noqa: E402

from .trl_variant import (REPLACED, TRL_IS_MODES, TRL_OWNED, VARIANT_KEYS, check_trl_args,  # noqa: E402,F401
                          load_variant, resolve_corrections, resolve_variant, trl_corrections, variant_from_ablation)

CONTROLLERS = "grpo_bench_controllers.json"   # in each checkpoint
GENERATION = "grpo_bench_generation_{}.pt"     # a process's generation under way, in a checkpoint made inside one
REF_ADAPTER = "ref"  # TRL computes reference log-probs through the adapter of this name when the model has one
# model inputs TRL's _compute_loss forwards besides the token ids (multimodal models)
_FORWARD_KEYS = ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes",
                 "num_tiles", "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids")


# ------------------------------------------------------------------- sampler


class EpochSampler(torch.utils.data.Sampler):
    """TRL's RepeatSampler with the epoch accelerate names (set_epoch): a run resumed in epoch e rebuilds the sampler,
    whose generator TRL seeds once and draws one permutation from per epoch, so it replayed epoch 0's prompt order
    where the uninterrupted run drew epoch e's. Here the generator is put back to its state after e permutations."""

    def __init__(self, inner):
        self.inner = inner
        self.start = inner.generator.get_state() if inner.shuffle else None

    def __len__(self) -> int:
        return len(self.inner)

    def set_epoch(self, epoch: int) -> None:
        # redrawn at every epoch, resumed or not: e permutations of the prompts cost far less than one generation
        if self.start is not None:
            self.inner.generator.set_state(self.start)
            for _ in range(epoch):
                torch.randperm(self.inner.num_samples, generator=self.inner.generator)

    def __iter__(self):
        return iter(self.inner)


# ------------------------------------------------------------------- trainer


class GRPOBenchTrainer(GRPOTrainer):
    """GRPOTrainer whose advantages, loss, KL, reference updates and sample filters are a grpo_bench variant.

    Takes GRPOTrainer's arguments plus `variant`: a mapping of VARIANT_KEYS, or the path
    of a YAML file holding one (see variant_from_ablation for an ablation's variant), and
    `variant_source`, the name errors give a mapping (a YAML path names itself).
    Logs the registry's metrics beside TRL's: loss/policy, clip/frac, clip/low_frac,
    clip/high_frac (and a loss's own regions), kl/value, kl/coef, delta/abs_mean,
    reward/penalised, filter/<name>/<what>; with corrections mismatch/* and
    correction/<name>/<region>_frac; with an entropy bonus loss/entropy and entropy/coef
    (the coefficient applied); with an NLL term loss/nll.
    """

    def __init__(self, model, reward_funcs=None, args: GRPOConfig | None = None, *rest,
                 variant: dict | str | Path | None = None, variant_source: str = "<variant>", **kwargs):
        if args is None:
            args = GRPOConfig("grpo_bench-GRPO")
        source = variant_source
        if isinstance(variant, (str, Path)):
            source, variant = str(variant), load_variant(variant)
        check_trl_args(args)
        self.variant = resolve_variant(variant or {}, source, max_len=args.max_completion_length,
                                       group_size=args.num_generations, reward_weights=args.reward_weights)
        v = self.variant
        resolve_corrections(v, args)
        # the same bound composition the ablation trainer calls: filters, KL in the reward, deltas, loss
        self.recipe = Recipe.from_config(v)
        self._check_split(args, source)
        args = copy.copy(args)  # the caller's config stays as given
        # TRL builds the reference (a copy, or the adapter switched off) and its log-probs only when beta != 0
        args.beta = float(v.kl_coef)
        super().__init__(model, reward_funcs, args, *rest, **kwargs)
        self._use_ref = self.recipe.use_ref
        self._next_kl_coef: float | None = None
        self._rollouts = 0                    # training generations so far: the ablation trainer's epoch
        self._rewards_per_func: Tensor | None = None
        self._entropy_window: Tensor | None = None   # (sum of entropy, tokens) of this optimizer step's micro-batches
        # ref_update is a pure function of the rollout index; the snapshot adapter must exist
        # before accelerate wraps the model, so it is made now if any update will come
        if self._use_ref and is_peft_model(self.model) and any(self.recipe.parts["ref_update"](e)
                                                               for e in range(1, self._rollouts_planned(args))):
            self._add_ref_adapter()

    @staticmethod
    def _generations(args: GRPOConfig, steps: int) -> int:
        """The generations TRL makes in `steps` optimizer steps: one every steps_per_generation x num_iterations
        of their steps x gradient_accumulation_steps micro-batches."""
        return -(-steps * args.gradient_accumulation_steps // (args.steps_per_generation * args.num_iterations))

    @classmethod
    def _rollouts_planned(cls, args: GRPOConfig) -> int:
        """The generations a run makes; without max_steps (epochs over a dataset) 10,001: an update first due
        later finds no snapshot adapter, and _mix_reference says so."""
        return cls._generations(args, args.max_steps) if args.max_steps > 0 else 10_001

    def _check_split(self, args: GRPOConfig, source: str) -> None:
        """Refuse what cannot be one loss over a generation batch that TRL shuffles and splits into micro-batches.

        Groups split across processes are caught at the first step (_shares): whether they do
        depends on the per-device batch, not on the variant.
        """
        probe = torch.ones(2, args.num_generations, 3)   # two prompts with unequal token counts
        probe[0, 0, 1:] = 0
        as_rows = self._token_weights(probe.view(-1, 1, 3)).view_as(probe)
        grouped = not torch.allclose(self._token_weights(probe), as_rows, rtol=1e-12, atol=0)
        if grouped and args.steps_per_generation > 1:
            raise ConfigError(source, "aggregate", f"{self.variant.aggregate['name']!r} weighs each prompt's group "
                                                   "as a whole, and TRL shuffles responses across micro-batches: "
                                                   "use steps_per_generation=1")
        whole = [c.name for c in self.recipe.corrections if c.entry.traits.get("whole_batch")]
        if whole and (args.steps_per_generation > 1 or args.world_size > 1):
            raise ConfigError(source, "corrections", f"{whole[0]!r} divides by a mean over the whole batch, known "
                                                     "only when one micro-batch on one process holds it: use "
                                                     "steps_per_generation=1 on one process")
        step = self.recipe.stage("step")
        if self.recipe.use_entropy and step and (args.steps_per_generation > 1 or args.world_size > 1):
            raise ConfigError(source, "entropy_coef", f"the entropy bonus is a token mean over the tokens step filter "
                                                      f"{step[0].name!r} keeps in the whole batch, known only when one "
                                                      "micro-batch on one process holds it: use steps_per_generation=1 "
                                                      "on one process")

    # ---------------------------------------------------------- generation side

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        # (N, F): every process's completions, in process order; NaN where a function returned None
        self._rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        return self._rewards_per_func

    def _generate_and_score_completions(self, inputs):
        training = self.model.training
        if training:
            if self._rollouts == 0 and self.state.global_step:   # resumed from a checkpoint: TRL's schedule says how
                self._rollouts = self._generations(self.args, self.state.global_step)   # many generations came before
            if self._next_kl_coef is not None:
                self.recipe.kl_coef = self._next_kl_coef
            w = self.recipe.ref_weight(self._rollouts)
            if w:
                self._mix_reference(w)
        out = super()._generate_and_score_completions(inputs)
        self._apply_variant(out, training)
        if training:
            self._rollouts += 1
        return out

    def _apply_variant(self, out: dict, training: bool) -> None:
        """Replace TRL's advantages with the variant's, on the whole batch, and attach what the loss needs."""
        mode = "train" if training else "eval"
        g = self.num_generations if training else self.num_generations_eval
        completion_mask = out["completion_mask"]
        b, t = completion_mask.shape
        rows = self._rows(b)
        # None counts as 0, as grpo_bench's own reward sum does (TRL drops all-None rows from the baseline)
        scores = self._rewards_per_func.double().nan_to_num(0.0)                 # (N, F)
        rewards = (scores * self.reward_weights.to(scores.device).double()).sum(1)
        mask_local = self._loss_mask(out).double()
        lengths = self._gather_rows(completion_mask.sum(1).double())
        finished = self._gather_rows(self._finished(out))
        mask = self._gather_rows(mask_local)                                  # (N, T_max)
        n = rewards.numel()
        shape = (n // g, g)
        batch = Batch(rewards.view(shape), mask.view(*shape, -1), lengths.view(shape), finished.view(shape),
                      self.max_completion_length, components=scores.view(*shape, -1))
        batch, metrics = self.recipe.filter_rollout(batch)
        if batch.keep is not None or batch.retire is not None:  # refused at construction; a part changed since
            raise RuntimeError("a rollout filter drops groups or retires prompts, which GRPOBenchTrainer cannot do")
        mask = batch.mask.reshape(n, -1)                                      # (N, T_max)
        sampler = out.get("sampling_per_token_logps")
        if self.recipe.corrections and sampler is not None and out.get("old_per_token_logps") is None:
            # the corrections' ratio is pi_old / pi_sampler: the old log-probs of generation time, as TRL's own
            # vLLM correction takes them, so that every micro-batch and pass sees the same ones
            with torch.no_grad():
                out["old_per_token_logps"] = self._logps(self.model, out, entropy=False, batch_size=b)[0]
        old = ref = None
        if self._use_ref:
            old = out.get("old_per_token_logps")
            if old is None:  # on-policy: TRL takes them from the loss's own forward pass, too late for the reward
                with torch.no_grad():
                    old = self._logps(self.model, out, entropy=False, batch_size=b)[0]
            # every process's log-probs: the KL in the reward and the controller see the whole batch
            old, ref = (self._gather_rows(x.double()).view(*shape, -1) for x in (old, out["ref_per_token_logps"]))
        deltas, adv = self.recipe.advantages(batch, old, ref)
        metrics |= adv
        observed = metrics.pop("kl/observed", None)
        if self._use_ref and training:  # the coefficient of the next rollout, as the ablation trainer updates it after this one
            self._next_kl_coef = self.recipe.next_kl_coef(float(observed), n)
        deltas = deltas.reshape(n)                                            # (N,)
        out["advantages"] = deltas[rows].to(out["advantages"].dtype)
        out["bench_mask"] = mask[rows, :t].to(completion_mask.device)
        out["bench_rewards"] = batch.rewards.reshape(n)[rows]
        out["bench_index"] = torch.arange(n, device=completion_mask.device)[rows]   # its place: group = index // g
        # the whole batch's loss weights, for each micro-batch's share (_shares): the mask the corrections leave
        kept = mask
        if sampler is not None and self.recipe.corrections:   # without a sampler rho = 1: only the loss-time parts act
            old_local = out["old_per_token_logps"]
            kept = self._gather_rows(self._corrected(old_local, old_local, self._sampler_logp(out, old_local),
                                                     out["advantages"], out["bench_mask"]).double())
        on = kept > 0
        out["bench_weight"] = self._token_weights(kept.view(*shape, -1)).view(n, -1)[rows, :t]
        out["bench_tokens"] = on.sum().double()                                       # the entropy bonus's
        out["bench_positive_tokens"] = (on & (batch.rewards.reshape(n, 1) > 0)).sum().double()   # the NLL term's
        logged = self._logs["advantages"]  # TRL logged its own advantages of the whole batch
        for _ in range(min(n, len(logged))):
            logged.pop()
        logged.extend(deltas.tolist())
        for k, val in metrics.items():
            self._metrics[mode][k].append(float(val))

    # ---------------------------------------------------------------- loss side

    def _compute_loss(self, model, inputs):
        mode = "train" if self.model.training else "eval"
        r = self.recipe
        logp, entropy, aux = self._logps(model, inputs, entropy=True, aux=self.aux_loss_enabled)  # (b, T)
        mask = inputs.get("bench_mask")
        mask = (self._loss_mask(inputs) if mask is None else mask).to(logp.dtype)
        old = inputs.get("old_per_token_logps")
        old = logp.detach() if old is None else old
        sampler = self._sampler_logp(inputs, old) if r.corrections else None
        gate = self._step_gate(inputs, entropy, mask, mode) if r.stage("step") else None
        rewards = inputs.get("bench_rewards")
        # the NLL term's responses: reward > 0, as the ablation trainer's (a batch built by hand: deltas > 0)
        positive = None if rewards is None else rewards > 0
        groups = self._groups(inputs, mode)
        # (n, G, ...): each prompt's responses together, in their order, as the parts see a rollout
        lp, old_g, ref, deltas, mask_g, gate_g, ent, pos, samp = (self._grouped(x, groups) for x in (
            logp, old, inputs.get("ref_per_token_logps"), inputs["advantages"], mask, gate, entropy, positive,
            sampler))
        kept = self._corrected(lp.detach(), old_g, samp, deltas, mask_g) if r.corrections else mask_g
        ent_tokens = kept if gate_g is None else kept * gate_g
        s_agg, s_ent, s_nll = self._shares(inputs, kept, ent_tokens, pos, groups, mode)
        coef = r.entropy_coef                                                  # the controller's, for this step
        # tensors, as the ablation trainer passes them: a coefficient of 0 (no positive response here; the
        # adaptive controller before its first measurement) keeps its term, so the fused kernel never takes
        # the step and the term's statistic, which the controller reads, is always there
        number = lambda x: torch.tensor(x, dtype=logp.dtype, device=logp.device)  # noqa: E731
        value, stats = r.loss(lp, old_g, ref, deltas, mask_g, gate_g, sampler_logp=samp, positive=pos,
                              entropy=ent, entropy_coef=number(coef * s_ent / s_agg),
                              numbers={"nll_coef": number(r.cfg.nll_coef * s_nll / s_agg)} if r.use_nll else None)
        loss = value
        if mode == "train":
            # DDP averages over processes and accumulation sums micro-batches: scaled so,
            # every generation batch (steps_per_generation micro-batches) weighs as one loss
            loss = value * (s_agg * self.accelerator.num_processes
                            * self.args.steps_per_generation / self.current_gradient_accumulation_steps)
        if self.aux_loss_enabled:
            loss = loss + self.router_aux_loss_coef * aux / (self.current_gradient_accumulation_steps
                                                             if mode == "train" else 1.0)
            self._metrics[mode]["aux_loss"].append(self.accelerator.gather(aux.detach()).mean().item())
        if r.use_entropy and mode == "train":
            self._step_entropy(stats["loss/entropy"], (ent_tokens > 0).sum())
            self._metrics[mode]["entropy/coef"].append(float(coef))
        with torch.no_grad():
            stats["entropy"] = masked_mean(entropy, mask)
            if ref is not None and not r.kl_in_loss:  # KL in the reward (or no KL term): still worth watching
                stats["kl/value"] = r.kl_value(lp, ref, old_g, mask_g)
        counts = {"loss/entropy": (ent_tokens > 0).sum()}
        if pos is not None:
            counts["loss/nll"] = ((kept > 0) & pos.unsqueeze(-1)).sum()
        for k, val in self._gather_stats(stats, mask, inputs.get("bench_index"), counts).items():
            self._metrics[mode][k].append(val)
        return loss

    def _step_entropy(self, entropy: Tensor, tokens: Tensor) -> None:
        """The entropy controller's step at each optimizer step, from the token mean entropy of its micro-batches
        on every process (TRL's window-global entropy; the ablation trainer's step is one whole batch)."""
        here = torch.stack([entropy.double() * tokens, tokens.double()])
        self._entropy_window = here if self._entropy_window is None else self._entropy_window + here
        if self.accelerator.sync_gradients:
            total = self.accelerator.reduce(self._entropy_window, reduction="sum")
            h = (total[0] / total[1].clamp(min=1)).item()
            self.recipe.entropy_state, self.recipe.entropy_coef = self.recipe.next_entropy_coef(h)
            self._entropy_window = None

    def _shares(self, inputs, kept: Tensor, ent_tokens: Tensor, positive: Tensor | None, groups, mode: str
                ) -> tuple[float, float, float]:
        """This micro-batch's share of the generation batch's aggregate, entropy tokens and NLL tokens.

        The aggregate's weights on this micro-batch are then a constant multiple of those of
        the whole batch (every aggregation is linear in the per-token loss with weights set by
        the mask; token_mean: tokens here / tokens in all; seq_mean_*: responses here /
        responses in all); a RuntimeError says when they are not (the corrections or the
        aggregate do not split into micro-batches).
        """
        whole = inputs.get("bench_weight")
        one = self.accelerator.num_processes == 1 and self.args.steps_per_generation == 1
        if mode != "train" or whole is None or one:  # the micro-batch is its own generation batch
            return 1.0, 1.0, 1.0
        here = self._rows_of(self._token_weights(kept), groups)
        on = here != 0
        ratio = whole[on] / here[on]
        c = ratio.mean() if on.any() else here.new_ones((), dtype=torch.float64)
        if (on.any() and ((ratio - c).abs().max() > 1e-9 * c.abs() or c <= 0)) or (whole[~on] != 0).any():
            raise RuntimeError(f"the loss does not split into micro-batches (aggregate "
                               f"{self.variant.aggregate['name']!r}, corrections "
                               f"{[p.name for p in self.recipe.corrections]}): use steps_per_generation=1")
        # the entropy bonus's tokens: a step gate with a bonus is refused here (_check_split), so they are kept's
        all_ent = inputs["bench_tokens"]
        s_ent = ((ent_tokens > 0).sum() / all_ent).item() if all_ent > 0 else 0.0
        s_nll = 1.0
        if positive is not None:
            n_pos = ((kept > 0) & positive.unsqueeze(-1)).sum().double()
            all_pos = inputs["bench_positive_tokens"]
            s_nll = (n_pos / all_pos).item() if all_pos > 0 else 0.0
        return c.item(), s_ent, s_nll

    def _gather_stats(self, stats: dict, mask: Tensor, index: Tensor | None, counts: dict[str, Tensor]) -> dict:
        """This micro-batch's statistics over every process's part of it, as one process holding it all logs them.

        Each process's value weighs by its tokens (the token means: clip/*, kl/value, entropy,
        mismatch/kl; loss/entropy and loss/nll by the tokens they average, `counts`), or by its
        share of the aggregate over all the parts (loss/policy), not equally: parts with unequal
        token counts would otherwise tilt the logged value toward the shorter one. The extreme
        ratios (mismatch/ratio_max, _min) are the extremes over processes. A mean over no
        token at all (`counts` 0 on every process) is not logged.
        """
        names = sorted(stats)
        values = torch.stack([stats[k].double() for k in names])
        if self.accelerator.num_processes == 1:  # a mean over no token (no positive response for loss/nll) is left out
            return {k: v for k, v in zip(names, values.tolist()) if k not in counts or counts[k] > 0}
        b, t = mask.shape
        groups = self._groups({"bench_index": index}, "train" if self.model.training else "eval")
        here = self._rows_of(self._token_weights(self._grouped(mask, groups)), groups)
        every = self._gather_rows(mask)
        every_groups = None if index is None else self._groups({"bench_index": self._gather_rows(index)},
                                                               "train" if self.model.training else "eval")
        union = self._rows_of(self._token_weights(self._grouped(every, every_groups)), every_groups)[self._rows(b), :t]
        on = here != 0
        share = (union[on] / here[on]).mean() if on.any() else here.new_zeros(())
        tokens = mask.sum().double()
        weights = torch.stack([share if k == "loss/policy" else counts.get(k, tokens).double() for k in names])
        num, den, top, bottom = self.accelerator.gather(torch.stack([values * weights, weights, values,
                                                                     -values])[None]).unbind(1)
        num, den, top, bottom = num.sum(0), den.sum(0), top.amax(0), -bottom.amax(0)
        # loss/policy: the shares already make the aggregate (they sum to 1 only for means)
        out = {k: (num[i] if k == "loss/policy" else num[i] / den[i].clamp(min=1)).item() for i, k in enumerate(names)
               if k not in counts or den[i] > 0}
        for i, k in enumerate(names):
            if k.startswith("mismatch/ratio_"):
                out[k] = (top[i] if k.endswith("_max") else bottom[i]).item()
        return out

    def _step_gate(self, inputs, entropy, mask, mode) -> Tensor | None:
        """Step filters on this micro-batch of every process (without groups: TRL shuffles before splitting)."""
        b, t = mask.shape
        rewards = inputs.get("bench_rewards")
        if rewards is None:  # a batch this trainer did not score (built by hand): there is no reward to show
            rewards = torch.full((b,), float("nan"), device=mask.device)
        col = lambda x: self._gather_rows(x)[:, None]  # noqa: E731  (N, 1, ...): groups of one
        batch = Batch(col(rewards.double()), col(mask), col(inputs["completion_mask"].sum(1)),
                      col(self._finished(inputs)), self.max_completion_length)
        gate, metrics = self.recipe.filter_step(batch, col(entropy.detach()))
        for k, val in metrics.items():
            self._metrics[mode][k].append(float(val))
        return None if gate is None else gate[:, 0][self._rows(b), :t].to(entropy.dtype)

    def _corrected(self, logp: Tensor, old: Tensor, sampler: Tensor | None, deltas: Tensor, mask: Tensor) -> Tensor:
        """The loss mask the variant's corrections leave (their `keep`), as Recipe.loss computes it."""
        fixes = [c.part() for c in self.recipe.corrections]
        return compose(fixes, logp, old, sampler, deltas, mask)[1]

    @staticmethod
    def _sampler_logp(inputs: dict, old: Tensor) -> Tensor | None:
        """The sampler's log-probs (vLLM's, TRL's sampling_per_token_logps), or None where TRL has none.

        vLLM leaves NaN where it could not score a token; TRL gives such a token ratio 1, and so
        does this (the old log-prob in its place).
        """
        s = inputs.get("sampling_per_token_logps")
        return None if s is None else torch.where(torch.isnan(s), old, s.to(old.dtype))

    def _groups(self, inputs: dict, mode: str) -> tuple[Tensor, int, int] | None:
        """(slot of each row in an (n, G) grid, n, G) for the prompts this micro-batch holds any response of."""
        index = inputs.get("bench_index")
        if index is None:  # a batch built by hand: no groups, each row on its own
            return None
        g = self.num_generations if mode == "train" else self.num_generations_eval
        present, which = torch.unique(index // g, return_inverse=True)
        return which * g + index % g, len(present), g

    @staticmethod
    def _grouped(x: Tensor | None, groups) -> Tensor | None:
        """(b, ...) rows -> (n, G, ...), a prompt's responses in their order; responses not here are empty (zeros)."""
        if x is None or groups is None:
            return x
        slots, n, g = groups
        return x.new_zeros((n * g, *x.shape[1:])).index_copy(0, slots, x).view(n, g, *x.shape[1:])

    @staticmethod
    def _rows_of(x: Tensor, groups) -> Tensor:
        """The inverse of _grouped: (n, G, T) -> this micro-batch's rows (b, T)."""
        return x if groups is None else x.reshape(-1, *x.shape[2:])[groups[0]]

    def _token_weights(self, mask: Tensor) -> Tensor:
        """float64, mask's shape: d aggregate / d per-token loss, the weight of each token in the aggregate."""
        x = torch.zeros(mask.shape, dtype=torch.float64, device=mask.device, requires_grad=True)
        with torch.enable_grad():
            (w,) = torch.autograd.grad(self.recipe.parts["aggregate"](x, mask.double()), x, allow_unused=True)
        return torch.zeros_like(x) if w is None else w

    # --------------------------------------------------------------- checkpoints

    def _get_train_sampler(self, dataset=None):
        return EpochSampler(super()._get_train_sampler(dataset))

    def _save_checkpoint(self, model, trial) -> None:
        """The controllers' state beside TRL's own (its entropy_ctrl_state.json), and inside a generation's reuse the
        generation: a run resumed from the checkpoint goes on as the uninterrupted run did, bit for bit."""
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        super()._save_checkpoint(model, trial)
        out = Path(self._get_output_dir(trial=trial)) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        if self.args.should_save:
            # the KL coefficient of the generation under way, and the one the next sets (as the ablation trainer's)
            state = {"next_kl_coef": self._next_kl_coef, "kl_coef": self.recipe.kl_coef,
                     "entropy_state": self.recipe.entropy_state, "entropy_coef": self.recipe.entropy_coef}
            (out / CONTROLLERS).write_text(json.dumps(state))
        inside = self._step % (self.args.steps_per_generation * self.num_iterations)
        if inside and self._buffered_inputs is not None and not self.args.save_only_model:
            # TRL keeps no buffer in a checkpoint, so a resume generated anew there and went on a generation out of
            # step with the uninterrupted run; each process keeps its part, beside the RNG state it has just saved
            torch.save({"step": self._step, "buffer": self._buffered_inputs},
                       out / GENERATION.format(self.accelerator.process_index))

    def _load_optimizer_and_scheduler(self, checkpoint) -> None:
        # where TRL reads its own controller's state back; a checkpoint made without the file restarts them
        super()._load_optimizer_and_scheduler(checkpoint)
        file = Path(checkpoint) / CONTROLLERS if checkpoint is not None else None
        if file is not None and file.is_file():
            state = json.loads(file.read_text())
            self._next_kl_coef = state["next_kl_coef"]
            self.recipe.kl_coef = state.get("kl_coef", self.recipe.kl_coef)
            self.recipe.entropy_state, self.recipe.entropy_coef = state["entropy_state"], state["entropy_coef"]
        buffer = Path(checkpoint) / GENERATION.format(self.accelerator.process_index) if checkpoint else None
        if buffer is not None and buffer.is_file():
            # to the CPU first: under torch.distributed on CPUs the device is cpu:0, which torch.load cannot map to
            saved = torch.load(buffer, map_location="cpu", weights_only=True)
            device = self.accelerator.device
            self._step = saved["step"]
            self._buffered_inputs = [{k: v.to(device) if isinstance(v, Tensor) else v for k, v in part.items()}
                                     for part in saved["buffer"]]

    # ---------------------------------------------------------------- reference

    def _add_ref_adapter(self) -> None:
        """A frozen adapter named "ref" that TRL's reference pass switches to; it starts as the adapter switched off."""
        from ..tasks.lm.models import lora_factors

        model = self.model
        policy = model.active_adapter
        if REF_ADAPTER not in model.peft_config:  # TRL makes one, a copy, when given a PeftModel
            model.add_adapter(REF_ADAPTER, model.peft_config[policy])
            model.set_adapter(policy)  # add_adapter can leave the new adapter trainable
            with torch.no_grad():
                for _, b in lora_factors(model, REF_ADAPTER):
                    b.zero_()
        for a, b in lora_factors(model, REF_ADAPTER):
            a.requires_grad_(False)
            b.requires_grad_(False)

    @torch.no_grad()
    def _mix_reference(self, w: float) -> None:
        """reference <- w * policy + (1 - w) * reference: the LoRA deltas at the adapter's rank, or every weight."""
        model = self.accelerator.unwrap_model(self.model)
        if not is_peft_model(model):
            SyncRefModelCallback.sync_target_model(model, self.ref_model, w)  # TRL's own TR-DPO update
            return
        from ..tasks.lm.models import lora_factors, mix_low_rank

        if REF_ADAPTER not in model.peft_config:
            planned = self._rollouts_planned(self.args)
            raise RuntimeError(f"a reference update at rollout {self._rollouts}, past the {planned:,} rollouts planned "
                               f"when the trainer was made, finds no {REF_ADAPTER!r} adapter: set max_steps")
        pairs = zip(lora_factors(model, model.active_adapter), lora_factors(model, REF_ADAPTER), strict=True)
        worst = 0.0
        for (a_p, b_p), (a_r, b_r) in pairs:
            if w == 1.0:  # a copy: exact, whatever the ranks
                a_r.copy_(a_p)
                b_r.copy_(b_p)
            else:
                a, b, cut = mix_low_rank(a_p, b_p, a_r, b_r, w)
                a_r.copy_(a)
                b_r.copy_(b)
                worst = max(worst, cut)
        # as the suite's own trainer logs it: how much the adapter's rank cut off the mix, its worst module's
        self._metrics["train"]["ref/mix_residual"].append(worst)

    # ------------------------------------------------------------------ helpers

    def _logps(self, model, inputs: dict, *, entropy: bool, aux: bool = False, batch_size: int | None = None):
        """TRL's log-probs (and entropies) of the completion tokens, as its _compute_loss calls them: (b, T)."""
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        return self._get_per_token_logps_and_entropies(
            model, ids, attention, inputs["completion_ids"].size(1), batch_size=batch_size, compute_entropy=entropy,
            compute_aux_loss=aux, **{k: inputs.get(k) for k in _FORWARD_KEYS})

    @staticmethod
    def _loss_mask(inputs: dict) -> Tensor:
        mask = inputs["completion_mask"]
        return mask if "tool_mask" not in inputs else mask * inputs["tool_mask"]

    def _finished(self, inputs: dict) -> Tensor:
        """(b,) bool: the completion ended with EOS (or pad) within the budget, TRL's test for truncation."""
        ids, lengths = inputs["completion_ids"], inputs["completion_mask"].sum(1)
        last = ids.gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
        ends = torch.tensor([*self.eos_token_ids, self._tokenizer.pad_token_id], device=ids.device)
        return torch.isin(last, ends) & (lengths > 0)

    def _gather_rows(self, x: Tensor) -> Tensor:
        """(b, ...) on this process -> (P * b, ...) of every process in process order, padded on dim 1 with 0."""
        if self.accelerator.num_processes == 1:
            return x
        if x.dim() > 1:
            x = self.accelerator.pad_across_processes(x, dim=1, pad_index=0)
        return self.accelerator.gather(x)

    def _rows(self, b: int) -> slice:
        p = self.accelerator.process_index
        return slice(p * b, (p + 1) * b)


__all__ = ["GRPOBenchTrainer", "VARIANT_KEYS", "check_trl_args", "check_trl_version", "load_variant",
           "resolve_variant", "variant_from_ablation"]
