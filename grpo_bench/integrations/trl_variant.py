"""A grpo_bench variant as TRL's GRPOTrainer takes it: the run-config keys it carries (VARIANT_KEYS), those TRL
owns (TRL_OWNED) and the GRPOConfig fields it replaces (REPLACED), resolved and checked by the ablations' own code,
and TRL's off-policy options as the registry corrections they equal. The trainer is grpo_bench.integrations.trl,
which checks TRL's version before anything here is used; this module imports no TRL of its own.
"""
from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .. import registry
from ..algos import Batch
from ..config.ablation import load_ablation
from ..config.run import RunConfig, build_dataclass, load_includes, resolve_part, resolve_parts, validate
from ..config.strict_yaml import read_yaml
from ..errors import ConfigError

if TYPE_CHECKING:
    from trl import GRPOConfig

# The run-config keys a variant carries to TRL; the others belong to TRL's own config.
VARIANT_KEYS = ("delta", "loss", "aggregate", "kl", "kl_coef", "kl_placement", "kl_ctrl", "ref_update",
                "filters", "backend", "corrections", "entropy_coef", "entropy_ctrl", "nll_coef", "adv_clip", "include")
TRL_OWNED = {
    "task": "the train_dataset and reward_funcs you pass", "group_size": "GRPOConfig.num_generations",
    "inner_steps": "GRPOConfig.num_iterations", "epochs": "GRPOConfig.max_steps",
    "optimizer": "GRPOConfig.optim", "lr": "GRPOConfig.learning_rate", "weight_decay": "GRPOConfig.weight_decay",
    "max_grad_norm": "GRPOConfig.max_grad_norm", "seed": "GRPOConfig.seed", "log_every": "GRPOConfig.logging_steps",
    "eval_every": "GRPOConfig.eval_steps", "device": "accelerate (accelerate launch)",
    "cuda_graphs": "TRL's own training step (the toy's graph capture has no TRL counterpart)",
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
    "entropy_coef": "entropy_coef/entropy_ctrl", "use_adaptive_entropy": "entropy_coef/entropy_ctrl (adaptive)",
    "entropy_target": "entropy_ctrl.target", "entropy_coef_min": "entropy_ctrl.coef_min",
    "entropy_coef_max": "entropy_ctrl.coef_max", "entropy_coef_delta": "entropy_ctrl.delta",
    "multi_objective_aggregation": "delta (normalize_then_sum: {name: gdpo, eps: 1e-4, batch_norm: responses})",
}
# TRL's vllm_importance_sampling_mode -> the correction it equals, with low = clip_min, high = clip_max
TRL_IS_MODES = {"token_truncate": "token_tis", "token_mask": "token_mis", "sequence_truncate": "seq_tis",
                "sequence_mask": "seq_mis"}



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


def resolve_variant(data: dict, source: str = "<variant>", *, max_len: int, group_size: int,
                    reward_weights: list[float] | None = None) -> RunConfig:
    """A RunConfig whose GRPO parts are resolved and checked as an ablation's are; ConfigError names the key.

    max_len (TRL's max_completion_length) fills parameters left at null, as the task's
    generation budget does in an ablation (Dr. GRPO's normaliser, overlong_punish);
    reward_weights (GRPOConfig.reward_weights; None: 1 each, TRL's default) fill gdpo's.
    """
    if not isinstance(data, dict):
        raise ConfigError(source, "<root>", f"expected a mapping of {', '.join(VARIANT_KEYS)}")
    for key in data:
        if key in TRL_OWNED:
            raise ConfigError(source, key, f"TRL owns this setting: set {TRL_OWNED[key]}")
        if key not in VARIANT_KEYS:
            raise ConfigError(source, str(key), f"unknown key; valid: {', '.join(VARIANT_KEYS)}")
    load_includes(data.get("include"), source)
    cfg = build_dataclass(RunConfig, copy.deepcopy(data), source)
    cfg.group_size = group_size
    context = {"max_len": max_len}
    if reward_weights is not None:
        context["reward_weights"] = [float(w) for w in reward_weights]
    resolve_parts(cfg, source, context)
    validate(cfg, source)
    delta = registry.entry("delta", cfg.delta["name"]).traits
    if "greedy" in delta.get("needs", ()):
        raise ConfigError(source, "delta", f"{cfg.delta['name']!r} needs each prompt's greedy response, "
                                           "which TRL's GRPOTrainer does not generate")
    if delta.get("needs") or delta.get("token_level"):
        raise ConfigError(source, "delta", f"{cfg.delta['name']!r} needs {', '.join(delta.get('needs', ()))} "
                                           "from the trainer, or gives per-token advantages: neither carries over "
                                           "to TRL's GRPOTrainer (its advantages are one per completion)")
    if registry.entry("loss", cfg.loss["name"]).traits.get("needs"):
        raise ConfigError(source, "loss", f"{cfg.loss['name']!r} regresses onto log pi / pi_ref, which TRL's "
                                          "GRPOTrainer loss side does not hand over (use TRL's own A2POTrainer)")
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
        if out.retire is not None:
            raise ConfigError(source, f"filters.{i}", f"{f['name']!r} retires prompts from the prompt stream (a "
                                                      "curriculum), which TRL's GRPOTrainer cannot: its sampler "
                                                      "draws the fixed train_dataset in a seeded order")


def check_trl_args(args: GRPOConfig) -> None:
    """ConfigError (one line) when a GRPOConfig field the variant replaces is set away from TRL's default."""
    from trl import GRPOConfig  # here, not at import: grpo_bench.integrations.trl checks TRL's version first

    defaults = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}
    for name, part in REPLACED.items():
        if getattr(args, name) != defaults[name]:
            raise ConfigError("GRPOConfig", name, f"replaced by the variant's {part}; leave it at TRL's default "
                                                  f"({defaults[name]!r})")


def trl_corrections(args: GRPOConfig) -> list[tuple[str, dict]]:
    """(GRPOConfig field, the registry correction it equals) for each off-policy correction TRL's options turn on.

    vLLM's importance sampling runs only with use_vllm; a clip_min <= 0 bounds nothing
    (ratios are positive), which the registry writes as null.
    """
    out = []
    if args.use_vllm and args.vllm_importance_sampling_correction:
        low = args.vllm_importance_sampling_clip_min
        out.append(("vllm_importance_sampling_correction",
                    {"name": TRL_IS_MODES[args.vllm_importance_sampling_mode],
                     "low": low if low is not None and low > 0 else None,
                     "high": args.vllm_importance_sampling_clip_max}))
    if args.off_policy_mask_threshold is not None:
        out.append(("off_policy_mask_threshold", {"name": "opsm", "threshold": args.off_policy_mask_threshold}))
    return out


def _spec(part: dict) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in part.items()) + "}"


def resolve_corrections(cfg: RunConfig, args: GRPOConfig) -> None:
    """The variant's corrections, or TRL's own as registry parts; ConfigError when both are set.

    Two corrections of one mismatch would multiply (the sampler's ratio applied twice), so a
    variant with corrections needs TRL's switched off.
    """
    own = trl_corrections(args)
    if own and cfg.corrections:
        key, part = own[0]
        off = "False" if key.startswith("vllm") else "None"
        raise ConfigError("GRPOConfig", key, f"a second off-policy correction beside the variant's corrections; "
                                             f"set it to {off} (it is the correction {_spec(part)})")
    if own:
        cfg.corrections = [resolve_part("correction", part, "GRPOConfig", key) for key, part in own]
