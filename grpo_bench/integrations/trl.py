"""An ablation's variant on TRL's GRPOTrainer: TRL generates, scores, distributes and logs; the registry does the maths.

    from grpo_bench.integrations.trl import GRPOBenchTrainer, variant_from_ablation
    trainer = GRPOBenchTrainer(model, reward_funcs=[...], args=GRPOConfig(...), train_dataset=ds,
                               variant={"delta": "rloo", "loss": {"name": "clipped", "clip_high": 0.28},
                                        "kl": "k1", "kl_coef": 0.05, "kl_placement": "reward"})
    trainer.train()

A variant is the GRPO part of a run config (VARIANT_KEYS), in the YAML syntax of an
ablation and checked by the same code (config.resolve_part, config.validate), so a bad
part is the same one-line ConfigError. Two of GRPOTrainer's methods are replaced:

    _generate_and_score_completions   TRL's generation and reward functions run as always; then, on the
                                      rewards of the whole batch (all processes), the variant's rollout
                                      filters, the KL penalty in the reward and the delta part give the
                                      advantages. Reference updates (ref_update) run before each generation,
                                      the KL controller (kl_ctrl) after it.
    _compute_loss                     TRL's log-probs and entropies; step filters; then grpo_loss, the exact
                                      composition the project's trainer calls.

The aggregation is over the whole generation batch, as the project's trainer aggregates
over its whole rollout: each micro-batch's aggregate is scaled by its share of the batch's
(the weights are d aggregate / d per-token loss, so no part is named here), which makes
gradient accumulation and data parallelism give the gradient of one aggregate over every
process's completions. TRL does this for loss_type dapo only; grpo, bnpo and dr_grpo
average per-micro-batch aggregates, which is the same only when micro-batches are alike.

What cannot carry over is refused with a one-line error (see docs/trl.md, "What does not
carry over"): filters that draw replacement groups (dynamic sampling: TRL generates once per
step and cannot draw more prompts), deltas that need a greedy rollout (remax), and TRL
options that the variant replaces (loss_type, scale_rewards, beta, epsilon, ...) when set.

Supported TRL: SUPPORTED_TRL. The hooks are private methods of GRPOTrainer, which change
between minor releases; the pin in pyproject's `trl` extra follows this range.
"""
from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import torch
from packaging.version import Version
from torch import Tensor

from .. import registry
from ..algos import Batch, masked_mean
from ..config import (PART_KEYS, ConfigError, RunConfig, build_dataclass, load_ablation, read_yaml, resolve_part,
                      validate)
from ..recipe import Recipe

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

# The run-config keys a variant carries to TRL; the others belong to TRL's own config.
VARIANT_KEYS = ("delta", "loss", "aggregate", "kl", "kl_coef", "kl_placement", "kl_ctrl", "ref_update",
                "filters", "backend", "corrections", "entropy_coef", "entropy_ctrl", "nll_coef", "adv_clip")
# registry v3 keys this integration does not carry yet, and their "off" values: refused when set
NOT_WIRED = {"corrections": [], "entropy_coef": 0.0, "entropy_ctrl": "fixed", "nll_coef": 0.0, "adv_clip": None}
TRL_OWNED = {
    "task": "the train_dataset and reward_funcs you pass", "group_size": "GRPOConfig.num_generations",
    "inner_steps": "GRPOConfig.num_iterations", "epochs": "GRPOConfig.max_steps",
    "optimizer": "GRPOConfig.optim", "lr": "GRPOConfig.learning_rate", "weight_decay": "GRPOConfig.weight_decay",
    "max_grad_norm": "GRPOConfig.max_grad_norm", "seed": "GRPOConfig.seed", "log_every": "GRPOConfig.logging_steps",
    "eval_every": "GRPOConfig.eval_steps", "device": "accelerate (accelerate launch)",
    "kl_track": "GRPOConfig.beta > 0 (TRL logs kl only when the KL is in the loss)",
    "sampler": "TRL's generation: GRPOConfig.use_vllm and its vllm_* settings (vLLM's log-probs reach the corrections)",
}
# GRPOConfig fields whose job the variant does; set away from TRL's default they would be
# silently ignored, so they are refused.
REPLACED = {
    "loss_type": "loss and aggregate", "importance_sampling_level": "loss (gspo)", "epsilon": "loss.clip_low",
    "epsilon_high": "loss.clip_high", "delta": "loss (dual_clip, clip_c)", "sapo_temperature_pos": "loss (sapo)",
    "sapo_temperature_neg": "loss (sapo)", "vespo_k_pos": "loss (vespo)", "vespo_lambda_pos": "loss (vespo)",
    "vespo_k_neg": "loss (vespo)", "vespo_lambda_neg": "loss (vespo)", "scale_rewards": "delta",
    "beta": "kl_coef", "use_bias_correction_kl": "kl (k3_is)", "mask_truncated_completions": "filters (mask_truncated)",
    "top_entropy_quantile": "filters (top_entropy)", "sync_ref_model": "ref_update",
    "ref_model_mixup_alpha": "ref_update", "ref_model_sync_steps": "ref_update",
}
# GRPOConfig features with no registry part: refused rather than dropped.
UNSUPPORTED = {
    "entropy_coef": "an entropy bonus is not a registry part",
    "use_adaptive_entropy": "an entropy bonus is not a registry part",
    "multi_objective_aggregation": "the delta part sees one summed reward per completion",
}
REF_ADAPTER = "ref"  # TRL computes reference log-probs through the adapter of this name when the model has one
# model inputs TRL's _compute_loss forwards besides the token ids (multimodal models)
_FORWARD_KEYS = ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes",
                 "num_tiles", "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids")


# ------------------------------------------------------------------ variants


def load_variant(path: str | Path) -> dict:
    """A variant from a YAML file: a mapping of VARIANT_KEYS, as under `base:` or `variants.<name>:` of an ablation."""
    data = read_yaml(Path(path))
    if not isinstance(data, dict):
        raise ConfigError(str(path), "<root>", f"expected a mapping of {', '.join(VARIANT_KEYS)}")
    return data


def variant_from_ablation(path: str | Path, name: str) -> dict:
    """The GRPO keys of one variant of an ablation YAML (its label as in results/<name>/summary.csv, e.g. `dapo`).

    The ablation's other keys (task, group_size, inner_steps, lr, ...) belong to TRL's
    config; TRL_OWNED says where each goes.
    """
    abl = load_ablation(path, seeds=1)
    labels = [label for label, _, _ in abl.variants]
    if name not in labels:
        raise ConfigError(str(path), "variants", f"no variant {name!r}; valid: {', '.join(labels)}")
    run = next(run for label, _, run in abl.variants if label == name)
    return {k: run[k] for k in VARIANT_KEYS if k in run}


def resolve_variant(data: dict, source: str = "<variant>", *, max_len: int, group_size: int) -> RunConfig:
    """A RunConfig whose GRPO parts are resolved and checked as an ablation's are; ConfigError names the key.

    max_len (TRL's max_completion_length) fills parameters left at null, as the task's
    generation budget does in an ablation (Dr. GRPO's normaliser, overlong_punish).
    """
    if not isinstance(data, dict):
        raise ConfigError(source, "<root>", f"expected a mapping of {', '.join(VARIANT_KEYS)}")
    for key in data:
        if key in TRL_OWNED:
            raise ConfigError(source, key, f"TRL owns this setting: set {TRL_OWNED[key]}")
        if key not in VARIANT_KEYS:
            raise ConfigError(source, str(key), f"unknown key; valid: {', '.join(VARIANT_KEYS)}")
    for key, off in NOT_WIRED.items():
        if key in data and data[key] not in (off, {"name": off}):
            raise ConfigError(source, key, "not carried into TRL's GRPOTrainer by this integration yet")
    cfg = build_dataclass(RunConfig, copy.deepcopy(data), source)
    cfg.group_size = group_size
    context = {"max_len": max_len}
    for axis in PART_KEYS:
        setattr(cfg, axis, resolve_part(axis, getattr(cfg, axis), source, axis, context))
    cfg.filters = [resolve_part("filter", f, source, f"filters.{i}", context) for i, f in enumerate(cfg.filters)]
    validate(cfg, source)
    if cfg.delta["name"] == "gdpo":
        raise ConfigError(source, "delta", "'gdpo' needs each reward function's scores, which this integration "
                                           "does not pass yet (TRL: multi_objective_aggregation=normalize_then_sum)")
    if "greedy" in registry.entry("delta", cfg.delta["name"]).traits.get("needs", ()):
        raise ConfigError(source, "delta", f"{cfg.delta['name']!r} needs each prompt's greedy response, "
                                           "which TRL's GRPOTrainer does not generate")
    _probe_filters(cfg, source, max_len, group_size)
    return cfg


def _probe_filters(cfg: RunConfig, source: str, max_len: int, group_size: int) -> None:
    """Run each rollout filter on a small batch: refuse one that draws replacement groups, or bad parameters."""
    g = group_size
    rewards = torch.stack([torch.zeros(g), torch.arange(g, dtype=torch.float32)])   # one flat group, one not
    probe = Batch(rewards, torch.ones(2, g, max_len), torch.full((2, g), max_len), torch.ones(2, g, dtype=torch.bool),
                  max_len)
    for i, f in enumerate(cfg.filters):
        if registry.entry("filter", f["name"]).traits.get("stage") != "rollout":
            continue
        try:
            out = registry.bind("filter", f)(probe)
        except ValueError as e:
            raise ConfigError(source, f"filters.{i}", str(e)) from None
        if out.keep is not None:
            raise ConfigError(source, f"filters.{i}", f"{f['name']!r} drops groups and draws replacements, which "
                                                      "TRL's GRPOTrainer cannot (it generates one batch per step)")


def check_trl_args(args: GRPOConfig) -> None:
    """ConfigError (one line) when a GRPOConfig field the variant replaces, or one it cannot honour, is set."""
    defaults = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}
    for name, part in REPLACED.items():
        if getattr(args, name) != defaults[name]:
            raise ConfigError("GRPOConfig", name, f"replaced by the variant's {part}; leave it at TRL's default "
                                                  f"({defaults[name]!r})")
    for name, why in UNSUPPORTED.items():
        if getattr(args, name) != defaults[name]:
            raise ConfigError("GRPOConfig", name, f"not supported with a grpo_bench variant ({why}); "
                                                  f"leave it at {defaults[name]!r}")


# ------------------------------------------------------------------- trainer


class GRPOBenchTrainer(GRPOTrainer):
    """GRPOTrainer whose advantages, loss, KL, reference updates and sample filters are a grpo_bench variant.

    Takes GRPOTrainer's arguments plus `variant`: a mapping of VARIANT_KEYS, or the path
    of a YAML file holding one (see variant_from_ablation for an ablation's variant), and
    `variant_source`, the name errors give a mapping (a YAML path names itself).
    Logs the registry's metrics beside TRL's: loss/policy, clip/frac, clip/low_frac,
    clip/high_frac (and a loss's own regions), kl/value, kl/coef, delta/abs_mean,
    reward/penalised, filter/<name>/<what>.
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
                                       group_size=args.num_generations)
        v = self.variant
        args = copy.copy(args)  # the caller's config stays as given
        # TRL builds the reference (a copy, or the adapter switched off) and its log-probs only when beta != 0
        args.beta = float(v.kl_coef)
        super().__init__(model, reward_funcs, args, *rest, **kwargs)
        # the same bound composition the ablation trainer calls: filters, KL in the reward, deltas, loss
        self.recipe = Recipe.from_config(v)
        self._use_ref = self.recipe.use_ref
        self._next_kl_coef: float | None = None
        self._rollouts = 0                    # training generations so far: the ablation trainer's epoch
        self._rewards_per_func: Tensor | None = None
        # ref_update is a pure function of the rollout index; the snapshot adapter must exist
        # before accelerate wraps the model, so it is made now if any update will come
        if self._use_ref and is_peft_model(self.model) and any(self.recipe.parts["ref_update"](e)
                                                               for e in range(1, 10_001)):
            self._add_ref_adapter()

    # ---------------------------------------------------------- generation side

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        # (N, F): every process's completions, in process order; NaN where a function returned None
        self._rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        return self._rewards_per_func

    def _generate_and_score_completions(self, inputs):
        training = self.model.training
        if training:
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
        rewards = (self._rewards_per_func.double() * self.reward_weights.to(completion_mask.device).double()).nansum(1)
        mask_local = self._loss_mask(out).double()
        lengths = self._gather_rows(completion_mask.sum(1).double())
        finished = self._gather_rows(self._finished(out))
        mask = self._gather_rows(mask_local)                                  # (N, T_max)
        n = rewards.numel()
        shape = (n // g, g)
        batch = Batch(rewards.view(shape), mask.view(*shape, -1), lengths.view(shape), finished.view(shape),
                      self.max_completion_length)
        batch, metrics = self.recipe.filter_rollout(batch)
        if batch.keep is not None:  # refused at construction; a part changed since
            raise RuntimeError("a rollout filter drops groups, which GRPOBenchTrainer cannot replace")
        mask = batch.mask.reshape(n, -1)                                      # (N, T_max)
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
        out["bench_weight"] = self._token_weights(mask)[rows, :t]
        logged = self._logs["advantages"]  # TRL logged its own advantages of the whole batch
        for _ in range(min(n, len(logged))):
            logged.pop()
        logged.extend(deltas.tolist())
        for k, val in metrics.items():
            self._metrics[mode][k].append(float(val))

    # ---------------------------------------------------------------- loss side

    def _compute_loss(self, model, inputs):
        mode = "train" if self.model.training else "eval"
        logp, entropy, aux = self._logps(model, inputs, entropy=True, aux=self.aux_loss_enabled)  # (b, T)
        mask = inputs.get("bench_mask")
        mask = (self._loss_mask(inputs) if mask is None else mask).to(logp.dtype)
        old = inputs.get("old_per_token_logps")
        old = logp.detach() if old is None else old
        ref = inputs.get("ref_per_token_logps")
        deltas = inputs["advantages"]                                          # (b,)
        gate = self._gate(inputs, logp, old, entropy, mask, deltas, mode)
        value, stats = self.recipe.loss(logp, old, ref, deltas, mask, gate)
        loss = value
        if mode == "train":
            # DDP averages over processes and accumulation sums micro-batches: scaled so,
            # every generation batch (steps_per_generation micro-batches) weighs as one aggregate
            loss = value * (self._batch_share(inputs, mask) * self.accelerator.num_processes
                            * self.args.steps_per_generation / self.current_gradient_accumulation_steps)
        if self.aux_loss_enabled:
            loss = loss + self.router_aux_loss_coef * aux / (self.current_gradient_accumulation_steps
                                                             if mode == "train" else 1.0)
            self._metrics[mode]["aux_loss"].append(self.accelerator.gather(aux.detach()).mean().item())
        with torch.no_grad():
            stats["entropy"] = masked_mean(entropy, mask)
            if ref is not None and not self.recipe.kl_in_loss:  # KL in the reward (or no KL term): still worth watching
                stats["kl/value"] = self.recipe.kl_value(logp, ref, old, mask)
        for k, val in self._gather_stats(stats, mask).items():
            self._metrics[mode][k].append(val)
        return loss

    def _gather_stats(self, stats: dict, mask: Tensor) -> dict:
        """This micro-batch's statistics over every process's part of it, as one process holding it all logs them.

        Each process's value weighs by its tokens (the token means: clip/*, kl/value, entropy)
        or by its share of the aggregate over all the parts (loss/policy), not equally: parts
        with unequal token counts would otherwise tilt the logged value toward the shorter one.
        """
        names = sorted(stats)
        values = torch.stack([stats[k].double() for k in names])
        if self.accelerator.num_processes == 1:
            return dict(zip(names, values.tolist()))
        b, t = mask.shape
        here = self._token_weights(mask)
        union = self._token_weights(self._gather_rows(mask))[self._rows(b), :t]
        on = here != 0
        share = (union[on] / here[on]).mean() if on.any() else here.new_zeros(())
        tokens = mask.sum().double()
        weights = torch.stack([share if k == "loss/policy" else tokens for k in names])
        num, den = self.accelerator.gather(torch.stack([values * weights, weights])[None]).sum(0)
        # loss/policy: the shares already make the aggregate (they sum to 1 only for means)
        means = torch.where(torch.tensor([k == "loss/policy" for k in names], device=num.device),
                            num, num / den.clamp(min=1))
        return dict(zip(names, means.tolist()))

    def _gate(self, inputs, logp, old, entropy, mask, deltas, mode) -> Tensor | None:
        """What multiplies the policy term per token: step filters, and TRL's own off-policy corrections."""
        gate = None
        if self.recipe.stage("step"):
            gate = self._step_gate(inputs, entropy, mask, mode)
        if self.use_vllm and self.vllm_importance_sampling_correction:  # sampler != trainer: TRL's IS weight
            w = inputs["importance_sampling_ratio"]
            gate = w if gate is None else gate * w
        if self.off_policy_mask_threshold is not None:
            keep = self.get_off_policy_mask(advantages=deltas.unsqueeze(1), per_token_logps=logp,
                                            sampling_per_token_logps=inputs.get("sampling_per_token_logps", old),
                                            mask=mask, off_policy_threshold=self.off_policy_mask_threshold)
            gate = keep if gate is None else gate * keep
        return None if gate is None else gate.expand_as(logp).to(logp.dtype)

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
        return None if gate is None else gate[:, 0][self._rows(b), :t]

    def _batch_share(self, inputs, mask: Tensor) -> float:
        """c with c * aggregate(micro-batch) = this micro-batch's part of aggregate(generation batch).

        Every aggregation is linear in the per-token loss with weights set by the mask; within
        a micro-batch they are a constant multiple of the generation batch's (token_mean:
        tokens here / tokens in all; seq_mean_*: responses here / responses in all).
        """
        whole = inputs.get("bench_weight")
        if whole is None:  # a batch built by hand: it is its own generation batch
            return 1.0
        here = self._token_weights(mask)
        on = here != 0
        if not on.any():
            return 1.0
        ratio = whole[on] / here[on]
        c = ratio.mean()
        if (ratio - c).abs().max() > 1e-9 * c.abs() or (whole[~on] != 0).any():
            raise RuntimeError(f"aggregate {self.variant.aggregate['name']!r} does not split into micro-batches; "
                               "use steps_per_generation=1")
        return c.item()

    def _token_weights(self, mask: Tensor) -> Tensor:
        """(N, T) float64: d aggregate / d per-token loss, the weight of each token in the aggregate."""
        x = torch.zeros(mask.shape, dtype=torch.float64, device=mask.device, requires_grad=True)
        with torch.enable_grad():
            (w,) = torch.autograd.grad(self.recipe.parts["aggregate"](x, mask.double()), x, allow_unused=True)
        return torch.zeros_like(x) if w is None else w

    # ---------------------------------------------------------------- reference

    def _add_ref_adapter(self) -> None:
        """A frozen adapter named "ref" that TRL's reference pass switches to; it starts as the adapter switched off."""
        from ..lm.models import lora_factors

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
        from ..lm.models import lora_factors, mix_low_rank

        pairs = zip(lora_factors(model, model.active_adapter), lora_factors(model, REF_ADAPTER), strict=True)
        for (a_p, b_p), (a_r, b_r) in pairs:
            if w == 1.0:  # a copy: exact, whatever the ranks
                a_r.copy_(a_p)
                b_r.copy_(b_p)
            else:
                a, b, _ = mix_low_rank(a_p, b_p, a_r, b_r, w)
                a_r.copy_(a)
                b_r.copy_(b)

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
