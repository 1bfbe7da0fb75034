"""The GRPO composition of one run, bound once from its resolved config: what every trainer calls.

    recipe = Recipe.from_config(cfg)                     # cfg: config.resolve_run(...)
    w = recipe.ref_weight(epoch)                         # reference <- w * policy + (1 - w) * reference
    batch, m = recipe.filter_rollout(batch)              # rollout-stage filters (algos.Batch)
    deltas, m = recipe.advantages(batch, old, ref)       # KL in the reward, then the delta part
    gate, m = recipe.filter_step(batch, entropy)         # step-stage filters: a per-token gate or None
    loss, stats = recipe.loss(logp, old, ref, deltas, batch.mask, gate, entropy=entropy)
    recipe.kl_coef = recipe.next_kl_coef(m["kl/observed"], n_samples)
    recipe.entropy_state, recipe.entropy_coef = recipe.next_entropy_coef(stats["loss/entropy"])   # with a bonus

The trainer (trainer.py) and TRL's GRPOTrainer (integrations/trl.py) call exactly these;
README has a 15-line loop of one's own. Every tensor method works on one run's data
(B, G, T) and is written so that torch.func.vmap can apply it to a population's stacked
data (P, B, G, T): metrics are tensors, never Python floats, and the run's numbers (float
parameters of its parts and beta) may be passed in as `numbers`, 0-d tensors under vmap,
so the members of a population may differ in them. `Recipe.structure()` is what members
must share; `Recipe.numbers()` is what they may not.
"""
from __future__ import annotations

import copy
import functools
from dataclasses import dataclass

import torch
from torch import Tensor

from .. import registry
from ..algos import Batch, masked_mean, masked_sum
from ..algos.deltas import EXTRA_NEEDS, Extra, clip_deltas
from ..config.run import PART_KEYS, RunConfig, run_dict
from ..numerics.logprobs import compose_loss, loss_needs_ref

Numbers = dict[str, "float | Tensor"]
# per-member trainer-level numbers: what a population may vary besides the parts' float parameters
RUN_NUMBERS = ("lr", "weight_decay", "max_grad_norm", "kl_coef", "entropy_coef", "nll_coef")


@dataclass(frozen=True)
class Bound:
    """One part: its axis, name and every parameter, resolved."""

    axis: str
    key: str          # where it sits in the run config: "loss", "filters.0", ...
    name: str
    params: dict

    @functools.cached_property
    def entry(self) -> registry.Entry:
        return registry.entry(self.axis, self.name)

    def part(self, numbers: Numbers | None = None) -> registry.Part:
        """What compose_loss takes: the entry and the parameters, a population member's numbers in them."""
        return self.entry, self.with_numbers(numbers)

    @property
    def per_member(self) -> bool:
        """True for a part a population must run member by member (it cannot be vmapped)."""
        return bool(self.entry.traits.get("per_member"))

    def float_keys(self) -> list[str]:
        return [k for k, v in self.params.items() if isinstance(v, float)]

    def with_numbers(self, numbers: Numbers | None) -> dict:
        if not numbers:
            return self.params
        return {k: numbers.get(f"{self.key}.{k}", v) for k, v in self.params.items()}

    def __call__(self, *args, numbers: Numbers | None = None):
        return self.entry.obj(*args, **self.with_numbers(numbers))


def effect(before: Batch, after: Batch) -> dict[str, Tensor]:
    """What one filter did, as a share of the tokens (or groups) it was given, or a reward shift."""
    out = {}
    on = before.mask > 0
    n = on.sum().clamp(min=1)
    if after.mask is not before.mask:
        out["removed"] = ((after.mask <= 0) & on).sum() / n
    if after.gate is not before.gate and after.gate is not None:
        old_gate = torch.ones_like(after.gate) if before.gate is None else before.gate
        out["gated"] = ((after.gate <= 0) & (old_gate > 0) & on).sum() / n
    if after.keep is not None and after.keep is not before.keep:
        out["dropped_groups"] = 1.0 - after.keep.float().mean()
    if after.rewards is not before.rewards:
        out["reward_shift"] = (after.rewards - before.rewards).mean()
    if after.retire is not None and after.retire is not before.retire:
        out["retired"] = after.retire.float().mean()
    return out


class Recipe:
    """The bound parts of one run (see the module docstring)."""

    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        self.parts = {axis: Bound(axis, axis, *registry.split_spec(getattr(cfg, axis))) for axis in PART_KEYS}
        self.filters = [Bound("filter", f"filters.{i}", *registry.split_spec(f)) for i, f in enumerate(cfg.filters)]
        self.corrections = [Bound("correction", f"corrections.{i}", *registry.split_spec(c))
                            for i, c in enumerate(cfg.corrections)]
        # a loss registered needs=("ref_logp",) (a2po) regresses onto log pi / pi_ref: it takes the reference
        self.loss_needs_ref = loss_needs_ref(self.parts["loss"].name)
        self.use_ref = cfg.kl_coef > 0 or cfg.kl_track or self.loss_needs_ref
        self.use_entropy = cfg.entropy_coef > 0 or self.parts["entropy_ctrl"].name != "fixed"
        self.use_nll = cfg.nll_coef > 0
        self.kl_in_loss = cfg.kl_coef > 0 and cfg.kl_placement == "loss"
        self.kl_in_reward = cfg.kl_coef > 0 and cfg.kl_placement == "reward"
        needs = self.parts["delta"].entry.traits.get("needs", ())
        self.needs_greedy = "greedy" in needs
        # what else the delta part asks the trainer for (algos.deltas.Extra), and how many reference samples
        self.extra_needs = tuple(n for n in needs if n in EXTRA_NEEDS)
        self.ref_samples = self.parts["delta"].params.get("samples") if "ref_rewards" in needs else None
        self.kl_coef = float(cfg.kl_coef)
        # the entropy bonus's controller state and the coefficient it applies now
        self.entropy_state, self.entropy_coef = self.parts["entropy_ctrl"](float(cfg.entropy_coef), None)

    @classmethod
    def from_config(cls, cfg: RunConfig) -> "Recipe":
        return cls(cfg)

    # ------------------------------------------------------------ what members share

    def stage(self, stage: str) -> list[Bound]:
        return [f for f in self.filters if f.entry.traits.get("stage") == stage]

    def numbers(self) -> dict[str, float]:
        """The run's float values a population may vary per member: part parameters, lr, beta, ..."""
        out = {f"{b.key}.{k}": b.params[k] for b in self._bound() for k in b.float_keys()}
        return out | {k: float(getattr(self.cfg, k)) for k in RUN_NUMBERS}

    def structure(self) -> str:
        """Everything but the seed and the numbers: runs with the same structure can train as one population."""
        d = run_dict(copy.deepcopy(self.cfg))
        d.pop("seed")
        for k in RUN_NUMBERS:
            d.pop(k)
        for key in [*PART_KEYS, "filters", "corrections"]:
            parts = d[key] if key in ("filters", "corrections") else [d[key]]
            for part in parts:
                for k, v in list(part.items()):
                    if isinstance(v, float):
                        part[k] = "<number>"
        d["kl_on"] = self.cfg.kl_coef > 0
        d["clip_on"] = self.cfg.max_grad_norm > 0
        d["entropy_on"], d["nll_on"] = self.use_entropy, self.use_nll
        return repr(sorted(d.items()))

    def _bound(self) -> list[Bound]:
        return [*self.parts.values(), *self.filters, *self.corrections]

    # -------------------------------------------------------------------- schedules

    def ref_weight(self, epoch: int) -> float:
        """Weight w of the policy in reference <- w * policy + (1 - w) * reference before this epoch (0: none)."""
        return self.parts["ref_update"](epoch) if self.use_ref else 0.0

    def next_kl_coef(self, observed_kl: float, n_samples: int, kl_coef: float | None = None) -> float:
        """beta for the next rollout, from this rollout's observed KL (the kl_ctrl part)."""
        coef = self.kl_coef if kl_coef is None else kl_coef
        return self.parts["kl_ctrl"](coef, observed_kl, n_samples) if self.cfg.kl_coef > 0 else coef

    def next_entropy_coef(self, entropy: float, state: float | None = None) -> tuple[float, float]:
        """The entropy controller's (state, coefficient applied at the next step) after a step of this mean entropy."""
        return self.parts["entropy_ctrl"](self.entropy_state if state is None else state, float(entropy))

    # ------------------------------------------------------------------ tensor calls

    def filter_rollout(self, batch: Batch, numbers: Numbers | None = None,
                       parts: list[Bound] | None = None) -> tuple[Batch, dict[str, Tensor]]:
        """The rollout-stage filters in order; a filter that drops groups sets batch.keep."""
        metrics = {}
        for f in self.stage("rollout") if parts is None else parts:
            before, batch = batch, f(batch, numbers=numbers)
            metrics |= {f"filter/{f.name}/{k}": v for k, v in effect(before, batch).items()}
        return batch, metrics

    @property
    def loss_ref(self) -> bool:
        """Whether the loss reads the reference's log-probs: a KL term in it, or a loss that regresses onto pi_ref."""
        return self.kl_in_loss or self.loss_needs_ref

    def advantages(self, batch: Batch, old_logp: Tensor | None = None, ref_logp: Tensor | None = None,
                   greedy: Tensor | None = None, kl_coef: float | Tensor | None = None,
                   numbers: Numbers | None = None, extra: Extra | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        """Deltas (B, G), or (B, G, T) from a token-level part, of a filtered batch: the KL penalty in the
        reward (if placed there), then the delta part. `extra` holds what the part's needs asked for
        (self.extra_needs, algos.deltas.Extra), its mask that of the filtered batch.

        With a reference, also kl/seq (the sampled sequences' summed log-ratio, the same estimator
        whatever the variant's own), kl/coef and kl/observed (the controller's input: the mean over
        non-empty responses of the per-token estimator's mean).
        """
        beta = self.kl_coef if kl_coef is None else kl_coef
        mask, rewards, metrics = batch.mask, batch.rewards, {}
        if self.use_ref:
            on = mask > 0
            kl_tok = torch.where(on, self.parts["kl"](old_logp, ref_logp, old_logp, numbers=numbers),
                                 torch.zeros_like(old_logp))
            has = on.any(-1)
            per = masked_mean(kl_tok, mask, dim=-1)
            metrics["kl/observed"] = torch.where(has, per, torch.zeros_like(per)).sum() / has.sum().clamp(min=1)
            metrics["kl/seq"] = masked_sum(old_logp - ref_logp, mask, dim=-1).mean()
            metrics["kl/coef"] = beta if isinstance(beta, Tensor) else torch.tensor(beta, dtype=torch.float64)
            if self.kl_in_reward:
                # a per-response penalty: the sequence KL is the sum of its token terms
                rewards = rewards - beta * masked_sum(kl_tok, mask, dim=-1)
                metrics["reward/penalised"] = rewards.mean()
        lengths = mask.sum(-1)
        if extra is not None:
            extra = extra._replace(mask=mask)
        deltas = self.parts["delta"](rewards, lengths, greedy, batch.components, extra, numbers=numbers)
        deltas = clip_deltas(deltas, self.cfg.adv_clip)
        # per-token deltas: the mean over the batch's tokens
        metrics["delta/abs_mean"] = deltas.abs().mean() if deltas.dim() < mask.dim() else masked_mean(deltas.abs(), mask)
        return deltas, metrics

    def filter_step(self, batch: Batch, entropy: Tensor | None, numbers: Numbers | None = None
                    ) -> tuple[Tensor | None, dict[str, Tensor]]:
        """The step-stage filters on this step's entropies: a per-token gate on the policy term, or None."""
        steps = self.stage("step")
        if not steps:
            return None, {}
        batch = batch.replace(entropy=None if entropy is None else entropy.detach(), gate=None, keep=None)
        metrics = {}
        for f in steps:
            before, batch = batch, f(batch, numbers=numbers)
            metrics |= {f"filter/{f.name}/{k}": v for k, v in effect(before, batch).items()}
        return batch.gate, metrics

    def loss(self, logp: Tensor, old_logp: Tensor, ref_logp: Tensor | None, deltas: Tensor, mask: Tensor,
             gate: Tensor | None = None, kl_coef: float | Tensor | None = None, numbers: Numbers | None = None, *,
             entropy: Tensor | None = None, entropy_coef: float | Tensor | None = None,
             positive: Tensor | None = None, sampler_logp: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        """The scalar loss to minimise and its statistics (loss/policy, clip/*, kl/value, mismatch/*, ...):
        logprobs.grpo_loss's composition. entropy (with grad) feeds the bonus when the run has one;
        positive (B, G) marks the responses of the NLL term (default deltas > 0); sampler_logp the
        corrections (None: the trainer sampled itself)."""
        p = self.parts
        beta = self.kl_coef if kl_coef is None else kl_coef
        nums = numbers or {}
        return compose_loss(logp, old_logp, ref_logp if self.loss_ref else None, deltas, mask,
                            loss=p["loss"].part(numbers), aggregate=p["aggregate"].part(numbers),
                            kl=p["kl"].part(numbers) if self.kl_in_loss else None,
                            kl_coef=beta if self.kl_in_loss else 0.0, gate=gate, sampler_logp=sampler_logp,
                            corrections=[c.part(numbers) for c in self.corrections],
                            entropy=entropy if self.use_entropy else None,
                            entropy_coef=(self.entropy_coef if entropy_coef is None else entropy_coef)
                            if self.use_entropy else 0.0,
                            nll_coef=nums.get("nll_coef", self.cfg.nll_coef) if self.use_nll else 0.0,
                            positive=positive, backend=self.cfg.backend)

    def kl_value(self, logp: Tensor, ref_logp: Tensor, old_logp: Tensor, mask: Tensor,
                 numbers: Numbers | None = None) -> Tensor:
        """The run's KL estimator's token mean at the current policy (logged when the KL is not in the loss)."""
        return masked_mean(self.parts["kl"](logp, ref_logp, old_logp, numbers=numbers), mask)
