"""Train a grpo_bench variant with TRL's GRPOTrainer: arithmetic, on the embedded tiny model or a hub model.

    # CPU, offline: the embedded tiny model, the default variant below (~30 s on 2 cores)
    .venv/bin/python examples/trl_example.py --steps 8

    # the variant that won an ablation, on a hub model across GPUs (pip install -e '.[trl]' there)
    accelerate launch examples/trl_example.py --ablation ablations/recipes.yaml --variant reinforce_pp \
        --model Qwen/Qwen2.5-0.5B-Instruct --lora 16 --bf16 --vllm \
        --steps 500 --batch 16 --generations 8 --max-new-tokens 64 --lr 1e-5

    # or a variant written as a YAML mapping of delta, loss, aggregate, kl, kl_coef, ...
    .venv/bin/python examples/trl_example.py --variant my_variant.yaml

    # checkpoints every 100 steps; an interrupted run goes on from one as if it had not stopped
    .venv/bin/python examples/trl_example.py --steps 500 --save-steps 100
    .venv/bin/python examples/trl_example.py --steps 500 --resume results/trl_example/checkpoint-300

The default variant is a composition TRL has no options for: RLOO advantages, k1 in the
reward and a LoRA reference refreshed every 2 rollouts, with clip-higher. TRL does the rest
(generation, vLLM, accelerate/DeepSpeed, logging). To adapt: the dataset (`dataset()`),
the reward functions (`REWARDS`) and the GRPOConfig below; the variant stays as the
ablation ran it. On the tiny model (random weights) the run shows the machinery, not
learning: rewards come mostly from the format and length terms.
"""
from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from grpo_bench.errors import ConfigError  # noqa: E402
from grpo_bench.algos import rewards  # noqa: E402
from grpo_bench.tasks.lm import problems  # noqa: E402

DEFAULT_VARIANT = {
    "delta": "rloo",
    "loss": {"name": "clipped", "clip_low": 0.2, "clip_high": 0.28},
    "aggregate": "token_mean",
    "kl": "k1",
    "kl_coef": 0.05,
    "kl_placement": "reward",
    "ref_update": {"name": "hard", "every": 2},
}
METRICS = ("reward", "loss/policy", "clip/low_frac", "clip/high_frac", "kl/value", "delta/abs_mean", "loss/entropy",
           "entropy/coef", "loss/nll", "mismatch/kl")


def _text(completions: list) -> list[str]:
    # TRL hands conversational completions over as [{"role": "assistant", "content": ...}]
    return [c[-1]["content"] if isinstance(c, list) else c for c in completions]


def correct(prompts, completions, answer, **kwargs) -> list[float]:
    return rewards.correct(prompts, _text(completions), answer=answer)


def bare_integer(prompts, completions, **kwargs) -> list[float]:
    return rewards.format_reward(prompts, _text(completions))


def shorter(prompts, completions, **kwargs) -> list[float]:
    return rewards.length_penalty(prompts, _text(completions))


REWARDS, WEIGHTS = [correct, bare_integer, shorter], [1.0, 0.1, 0.05]


def dataset(tokenizer, n: int, seed: int):
    """Prompts and exact answers: plain `17+25=` for a tokenizer without a chat template, else a user message."""
    from datasets import Dataset

    ops = {"add": [0, 99]}
    chat = bool(getattr(tokenizer, "chat_template", None))
    rows = {"prompt": [], "answer": []}
    # the task's held-out problems (and their commutative twins) stay out, as in an ablation run
    exclude = problems.exclusion(problems.heldout(ops, 200, 1234))
    for p in problems.train_batch(ops, n, random.Random(seed), exclude):
        content = problems.CHAT_INSTRUCTION.format(a=p.a, sym=p.symbol, b=p.b, note="")
        rows["prompt"].append([{"role": "user", "content": content}] if chat else p.plain())
        rows["answer"].append(p.answer)
    return Dataset.from_dict(rows)


def model_and_tokenizer(name: str, seed: int):
    from grpo_bench.tasks.lm.models import load, prepare_tokenizer

    if name == "tiny":  # the warm-started checkpoint shipped in tasks/arithmetic_tiny/
        import torch

        from grpo_bench.tasks.lm import shipped

        return load(str(shipped.directory()), torch.device("cpu"), torch.float32)
    from transformers import AutoTokenizer

    return name, prepare_tokenizer(AutoTokenizer.from_pretrained(name))  # TRL loads the model (model_init_kwargs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variant", help="a YAML file with the variant's keys, or with --ablation a variant's label")
    p.add_argument("--ablation", help="an ablation YAML; --variant then names one of its variants")
    p.add_argument("--model", default="tiny", help="`tiny` (embedded, offline) or a hub id / local directory")
    p.add_argument("--lora", type=int, default=8, help="LoRA rank; 0 trains every weight")
    p.add_argument("--steps", type=int, default=8, help="optimizer steps (GRPOConfig.max_steps)")
    p.add_argument("--batch", type=int, default=8, help="completions per device per step (per_device_train_batch_size)")
    p.add_argument("--generations", type=int, default=4, help="completions per prompt (num_generations = group_size)")
    p.add_argument("--iterations", type=int, default=2, help="gradient steps per generation (num_iterations)")
    p.add_argument("--max-new-tokens", type=int, default=6, help="max_completion_length")
    p.add_argument("--lr", type=float, default=2e-2)
    p.add_argument("--bf16", action="store_true", help="bf16 weights and autocast (GPUs)")
    p.add_argument("--vllm", action="store_true", help="generate with vLLM, colocated")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="results/trl_example")
    p.add_argument("--save-steps", type=int, default=0, help="a checkpoint every N optimizer steps, in --out")
    p.add_argument("--resume", metavar="CHECKPOINT", help="go on from a checkpoint (bit for bit: docs/trl.md)")
    a = p.parse_args(argv)

    try:
        from grpo_bench.integrations.trl import GRPOBenchTrainer, load_variant, resolve_variant, variant_from_ablation

        if a.ablation:
            if not a.variant:
                raise ConfigError("--variant", "variant", f"name one of the variants of {a.ablation}")
            variant, source = variant_from_ablation(a.ablation, a.variant), a.ablation
        elif a.variant:
            variant, source = load_variant(a.variant), a.variant
        else:
            variant, source = DEFAULT_VARIANT, "DEFAULT_VARIANT"
        resolved = resolve_variant(variant, source, max_len=a.max_new_tokens, group_size=a.generations,
                                   reward_weights=WEIGHTS)  # fail before any loading
    except (ConfigError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    import torch
    from peft import LoraConfig
    from trl import GRPOConfig

    from grpo_bench.tasks.lm.models import LORA_TARGETS

    model, tok = model_and_tokenizer(a.model, a.seed)
    args = GRPOConfig(
        output_dir=a.out, max_steps=a.steps, per_device_train_batch_size=a.batch, num_generations=a.generations,
        num_iterations=a.iterations, max_completion_length=a.max_new_tokens, learning_rate=a.lr,
        reward_weights=WEIGHTS, logging_steps=1, report_to=[], seed=a.seed,
        save_strategy="steps" if a.save_steps else "no", save_steps=a.save_steps or 500,
        bf16=a.bf16, use_cpu=not torch.cuda.is_available(), disable_tqdm=True,
        model_init_kwargs={"dtype": torch.bfloat16 if a.bf16 else torch.float32} if isinstance(model, str) else None,
        # a variant's own corrections replace TRL's vLLM importance sampling (both would correct twice)
        use_vllm=a.vllm, vllm_mode="colocate", vllm_importance_sampling_correction=not resolved.corrections,
    )
    model_type = "gpt2" if a.model == "tiny" else None
    lora = LoraConfig(r=a.lora, lora_alpha=2 * a.lora, task_type="CAUSAL_LM", fan_in_fan_out=model_type == "gpt2",
                      target_modules=LORA_TARGETS.get(model_type, "all-linear")) if a.lora else None
    try:
        trainer = GRPOBenchTrainer(model, reward_funcs=REWARDS, args=args, train_dataset=dataset(tok, 256, a.seed),
                                   processing_class=tok, peft_config=lora, variant=variant,
                                   variant_source=source)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"variant ({source}): {trainer.variant.delta} | {trainer.variant.loss} | {trainer.variant.aggregate} | "
          f"kl {trainer.variant.kl['name']} x {trainer.variant.kl_coef} in the {trainer.variant.kl_placement} | "
          f"ref_update {trainer.variant.ref_update} | filters {trainer.variant.filters} | "
          f"corrections {trainer.variant.corrections} | entropy {trainer.variant.entropy_coef} "
          f"{trainer.variant.entropy_ctrl['name']} | nll {trainer.variant.nll_coef}")
    trainer.train(resume_from_checkpoint=a.resume)
    last = {}
    for row in trainer.state.log_history:
        last.update({k: v for k, v in row.items() if k in METRICS})
    print("last logged: " + ", ".join(f"{k}={last[k]:.4g}" for k in METRICS if k in last))
    return 0


if __name__ == "__main__":
    sys.exit(main())
