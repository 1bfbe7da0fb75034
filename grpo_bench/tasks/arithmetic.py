"""Arithmetic on a causal LM with LoRA: `17+25=` -> `42<eos>`, scored by rule rewards.

The policy is any causal LM (the embedded tiny GPT-2 by default, or a hub id / a
`save_pretrained` directory) with a LoRA adapter; only the adapter trains. One
epoch draws `prompts_per_step` problems from the seeded training stream,
samples G completions each with `generate` (KV cache, left padding), masks each
completion after its first EOS and scores it with weighted rule rewards.
Log-probs are those of the sampler: logits divided by the temperature, as TRL
does, so a temperature other than 1 does not make the "on-policy" data
off-policy. They never hold the (N, T, V) logits: the final hidden states and
the LM head's weight go through the fused, row-chunked head + log-prob kernel
(backend torch keeps the materialised logits, as the reference). Held-out
greedy accuracy, pass@k and mean@k go to `eval/`.

This module is imported whenever tasks are listed, so its top level is the
config and the class; transformers and peft load only when a task is built.

    python -m grpo_bench run ablations/arithmetic_lora.yaml
"""
from __future__ import annotations

import random
import warnings
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..registry import register
from . import Rollout


def _default_ops() -> dict:
    # What the embedded 2-layer model learns within the CPU budget; mixing in sub, mul
    # and floordiv stalls its short warm-start (see ablations/arithmetic_lora.yaml).
    return {"add": [0, 99]}


def _default_rewards() -> dict:
    return {"correct": 1.0, "format": 0.1}


@dataclass
class ModelSection:
    """Which causal LM, and the shape of one built from code."""

    source: str = "tiny"
    """`tiny`: the embedded warm-started 2-layer GPT-2 shipped in tasks/arithmetic_tiny/ (offline and
    identical on every machine); `shipped:<dir>`: another checkpoint shipped that way, in tasks/<dir>/;
    `tiny-scratch`: that architecture with fresh weights (layers, width,
    heads below), to warm-start yourself; a hub id (`Qwen/Qwen2.5-0.5B-Instruct`) or a local
    `save_pretrained` directory."""
    layers: int = 2
    """tiny-scratch: transformer blocks."""
    width: int = 128
    """tiny-scratch: hidden size (n_embd)."""
    heads: int = 4
    """tiny-scratch: attention heads."""


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


@dataclass
class ArithmeticConfig:
    """Arithmetic problems answered by a causal LM trained through a LoRA adapter."""

    model: ModelSection = field(default_factory=ModelSection)
    """The causal LM (section)."""
    lora: LoraSection = field(default_factory=LoraSection)
    """The adapter (section)."""
    warmstart: WarmstartSection = field(default_factory=WarmstartSection)
    """Supervised warm-start (section)."""
    sampling: SamplingSection = field(default_factory=SamplingSection)
    """Rollout sampling (section)."""
    ops: dict = field(default_factory=_default_ops)
    """Operations and their operand range [lo, hi], any of add, sub, mul, floordiv (divisor 0 is skipped)."""
    operands: str = "uniform"
    """How operands are drawn from [lo, hi]: `uniform`, or `digits` (a digit count uniformly among those the
    range holds, then a value with that many digits: 1- to 4-digit operands equally often in [0, 9999])."""
    template: str = "auto"
    """Prompt: `plain` (`17+25=`), `chat` (the tokenizer's chat template), `auto` (chat if the tokenizer has one)."""
    prompts_per_step: int = 32
    """B: training problems per rollout batch (each gets group_size completions)."""
    rewards: dict = field(default_factory=_default_rewards)
    """Reward -> weight (registry axis `reward`): correct, format, length, or `module:function` with TRL's signature."""
    eval_size: int = 200
    """Held-out problems (fixed by eval_seed; neither they nor their commutative twins are ever trained on)."""
    eval_seed: int = 1234
    """Seed of the held-out set; the same for every run so variants are compared on the same problems."""
    pass_k: int = 8
    """k of eval/pass@k and eval/mean@k (k samples per held-out problem: whether any is right, and the share
    that is); 0 skips both."""

    @property
    def generation_budget(self) -> int:
        return self.sampling.max_new_tokens

    def check(self, run_cfg) -> None:
        from ..algos import rewards
        from ..lm import problems, shipped

        problems.check_ops(self.ops)
        if self.operands not in problems.OPERANDS:
            raise ValueError(f"operands: unknown {self.operands!r}; valid: {', '.join(problems.OPERANDS)}")
        if self.warmstart.scratchpad:
            if not 0 <= self.warmstart.scratchpad <= 1:
                raise ValueError(f"warmstart.scratchpad: must be in [0, 1], got {self.warmstart.scratchpad}")
            problems.check_scratchpad(self.ops)
        if self.template not in problems.TEMPLATES:
            raise ValueError(f"template: unknown {self.template!r}; valid: {', '.join(problems.TEMPLATES)}")
        if not self.model.source:
            raise ValueError("model.source: empty; give tiny, tiny-scratch, a hub id or a local directory")
        if self.eval_size < 1 or 2 * self.eval_size > problems.space_size(self.ops):
            raise ValueError(f"eval_size: must be >= 1 and at most half of the {problems.space_size(self.ops)} "
                             f"distinct problems (the rest are the training stream), got {self.eval_size}")
        rewards.check(self.rewards, "arithmetic")
        positive = {"prompts_per_step": self.prompts_per_step, "sampling.max_new_tokens": self.sampling.max_new_tokens,
                    "lora.rank": self.lora.rank, "lora.alpha": self.lora.alpha, "model.layers": self.model.layers,
                    "model.width": self.model.width, "model.heads": self.model.heads}
        for key, value in positive.items():
            if value < 1:
                raise ValueError(f"{key}: must be >= 1, got {value}")
        if self.model.width % self.model.heads:
            raise ValueError(f"model.width: must be a multiple of model.heads ({self.model.heads}), got {self.model.width}")
        if self.sampling.temperature <= 0:
            raise ValueError(f"sampling.temperature: must be > 0, got {self.sampling.temperature}")
        if not 0 < self.sampling.top_p <= 1:
            raise ValueError(f"sampling.top_p: must be in (0, 1], got {self.sampling.top_p}")
        if not 0 <= self.lora.dropout < 1:
            raise ValueError(f"lora.dropout: must be in [0, 1), got {self.lora.dropout}")
        for key, value in (("pass_k", self.pass_k), ("warmstart.steps", self.warmstart.steps)):
            if value < 0:
                raise ValueError(f"{key}: must be >= 0, got {value}")
        if self.warmstart.steps and (self.warmstart.batch < 1 or self.warmstart.lr <= 0):
            raise ValueError("warmstart.batch: batch must be >= 1 and warmstart.lr > 0 when warmstart.steps > 0")
        if shipped.name(self.model.source):
            shipped.check_compatible(self)


def completion_mask(tokens: Tensor, eos: Tensor) -> tuple[Tensor, Tensor]:
    """(mask, finished) of generated tokens (N, T): 1.0 up to and including the first EOS."""
    is_end = torch.isin(tokens, eos)
    before = is_end.long().cumsum(-1) - is_end.long()  # EOS seen strictly before this token
    return (before == 0).float(), is_end.any(-1)


@register("task", "arithmetic", config=ArithmeticConfig)
class Arithmetic:
    """Arithmetic (+ - * //) on a causal LM with LoRA; tiny offline GPT-2 by default."""

    def __init__(self, task_config: ArithmeticConfig, run_config):
        from transformers import GenerationConfig

        from ..algos import rewards
        from ..lm import models, problems, warmstart

        self.cfg, self.run_cfg = task_config, run_config
        self.device = models.resolve_device(run_config.device)
        cfg = task_config
        if cfg.warmstart.steps > 0:
            base, self.tokenizer = models.load(str(warmstart.checkpoint(cfg, self.device)), self.device)
        else:
            base, self.tokenizer = models.starting_model(cfg, self.device)
        self.eos = torch.tensor(models.eos_ids(base, self.tokenizer), device=self.device)
        # A clean generation config: checkpoints ship sampling defaults (Qwen: top_k 20,
        # repetition penalty) that would make the sampler differ from the trained policy.
        base.generation_config = GenerationConfig(
            eos_token_id=self.eos.tolist(), pad_token_id=self.tokenizer.pad_token_id,
            bos_token_id=self.tokenizer.bos_token_id, max_new_tokens=cfg.sampling.max_new_tokens)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(run_config.seed)  # LoRA's A matrices are random
            self.policy = models.attach_lora(base, cfg.lora.rank, cfg.lora.alpha, cfg.lora.dropout, cfg.lora.targets)
        self.policy.eval()
        self.reference = models.Reference(self.policy)
        # backend torch keeps the materialised logits as the reference path; the others take
        # log-probs from the final hidden states and the head's weight (logprobs.linear_logprobs)
        self._fused = run_config.backend != "torch" and models.plain_head(self.policy)
        if run_config.backend != "torch" and not self._fused:
            warnings.warn(f"model type {base.config.model_type!r} is not one whose logits are known to be "
                          f"lm_head(final hidden state) ({', '.join(models.PLAIN_HEADS)}): its log-probs "
                          "go through the materialised (N, T, V) logits", stacklevel=2)
        self.template = problems.resolve_template(cfg.template, self.tokenizer)
        self.heldout = problems.heldout(cfg.ops, cfg.eval_size, cfg.eval_seed, cfg.operands)
        self._exclude = problems.exclusion(self.heldout)
        self.rewards = rewards.check(cfg.rewards, "arithmetic")
        self._problems, self._models, self._rewards_mod = problems, models, rewards
        self._evals, self._base_acc = 0, None

    # ------------------------------------------------------------------ sampling

    def _prompts(self, batch: list) -> tuple[Tensor, Tensor]:
        texts = [self._problems.render(p, self.template, self.tokenizer) for p in batch]
        return self._models.encode(self.tokenizer, texts, self.template == "chat", self.device)

    @torch.no_grad()
    def _generate(self, ids: Tensor, mask: Tensor, n: int, sample: bool, seed: int) -> Tensor:
        """(len(ids) * n, T) generated tokens, the n samples of a prompt adjacent."""
        cfg = self.cfg.sampling
        knobs = (dict(do_sample=True, temperature=cfg.temperature, top_p=cfg.top_p, top_k=0) if sample
                 else dict(do_sample=False))
        self.policy.eval()
        # HF samples from the global RNG; fork it so rollouts are a function of the
        # seed alone and the caller's RNG stream is left untouched.
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            torch.manual_seed(seed)
            out = self.policy.generate(input_ids=ids, attention_mask=mask, num_return_sequences=n,
                                       max_new_tokens=cfg.max_new_tokens, use_cache=True, **knobs)
        return out[:, ids.shape[1]:]

    def _decode(self, tokens: Tensor) -> tuple[list[str], Tensor, Tensor]:
        """Text of generated tokens (N, T) up to EOS, their mask and whether they finished."""
        mask, finished = completion_mask(tokens, self.eos)
        # the text before EOS, special tokens kept: skipping them would read `4<pad><bos>2` as `42`
        content = (mask.sum(-1) - finished.float()).long().tolist()
        texts = self.tokenizer.batch_decode([t[:k] for t, k in zip(tokens.tolist(), content)], skip_special_tokens=False)
        return texts, mask, finished

    def _score(self, batch: list, texts: list[str], mask: Tensor, finished: Tensor, n: int):
        """Weighted total reward and the raw components of the n completions of each problem."""
        prompts = [self._problems.render(p, self.template, self.tokenizer) for p in batch for _ in range(n)]
        return self._rewards_mod.combine(
            self.rewards, prompts, texts, answer=[p.answer for p in batch for _ in range(n)],
            finished=finished.tolist(), completion_lengths=mask.sum(-1).long().tolist(),
            max_new_tokens=self.cfg.sampling.max_new_tokens)

    def _seed(self, gen: torch.Generator | None, salt: int) -> int:
        if gen is None:
            return self.run_cfg.seed * 1_000_003 + salt
        return int(torch.randint(0, 2**62, (1,), generator=gen).item())

    def rollout(self, epoch: int, group_size: int, gen: torch.Generator) -> Rollout:
        seed = self._seed(gen, epoch)
        batch = self._problems.train_batch(self.cfg.ops, self.cfg.prompts_per_step, random.Random(seed), self._exclude,
                                           self.cfg.operands)
        ids, attn = self._prompts(batch)
        tokens = self._generate(ids, attn, group_size, sample=True, seed=seed)  # (B*G, T)
        texts, mask, finished = self._decode(tokens)
        total, parts = self._score(batch, texts, mask, finished, group_size)
        b, t = len(batch), tokens.shape[1]
        metrics = {f"reward/{name}": sum(v) / len(v) for name, v in parts.items()}
        metrics["response/finished"] = finished.float().mean().item()
        # Dr. GRPO's length bias shows as wrong answers growing longer: lengths split by exact correctness
        right = torch.tensor(self._rewards_mod.correct([], texts, answer=[p.answer for p in batch for _ in range(group_size)]),
                             dtype=torch.bool)
        lengths = mask.sum(-1).cpu()
        for name, sel in (("response/length_correct", right), ("response/length_incorrect", ~right)):
            if sel.any():
                metrics[name] = lengths[sel].float().mean().item()
        return Rollout(
            prompts=batch,
            responses=tokens.view(b, group_size, t),
            mask=mask.view(b, group_size, t),
            rewards=torch.tensor(total, dtype=torch.float32, device=self.device).view(b, group_size),
            finished=finished.view(b, group_size),
            extra={"prompt_ids": ids, "prompt_mask": attn},
            left_pad={"prompt_ids": self.tokenizer.pad_token_id, "prompt_mask": 0},
            metrics=metrics,
        )

    # ------------------------------------------------------------------ log-probs

    def _forward(self, ids: Tensor, attn: Tensor, responses: Tensor, mask: Tensor, with_entropy: bool):
        """fp32 log p and entropy (N, T) of responses (N, T) after prompts (N, P), under the sampler's
        tempered distribution softmax(fp32(logits) / T)."""
        from ..logprobs import linear_logprobs, token_logprobs

        t = responses.shape[1]
        tau = self.cfg.sampling.temperature
        full = torch.cat([ids, responses], 1)                            # (N, P+T)
        full_mask = torch.cat([attn, mask.to(attn.dtype)], 1)
        inputs = dict(input_ids=full, attention_mask=full_mask, position_ids=self._models.positions(full_mask),
                      use_cache=False)
        if self._fused:
            # Position P-1 predicts the first response token. The head's GEMM, the softmax and
            # their backward run in row chunks: no (N, T, V) logits, nor their gradient.
            hidden = self._models.last_hidden(self.policy, **inputs)[:, -t - 1:-1]  # (N, T, H)
            hidden, weight, bias = self._models.head_inputs(self.policy, hidden)
            return linear_logprobs(hidden, weight, responses, backend=self.run_cfg.backend,
                                   with_entropy=with_entropy, bias=bias, temperature=tau)
        # the materialised reference: the model's own logits, the T that predict response tokens
        logits = self.policy(**inputs, logits_to_keep=t + 1).logits[:, :t]   # (N, T, V)
        if tau != 1.0:
            # in fp32, as the sampler divides: bf16 logits / T would round to other log-probs
            logits = logits.float() / tau
        return token_logprobs(logits, responses, backend=self.run_cfg.backend, with_entropy=with_entropy)

    def logprobs(self, rollout: Rollout, reference: bool = False) -> tuple[Tensor, Tensor | None]:
        b, g, t = rollout.responses.shape
        ids = rollout.extra["prompt_ids"].repeat_interleave(g, 0)
        attn = rollout.extra["prompt_mask"].repeat_interleave(g, 0)
        responses, mask = rollout.responses.reshape(b * g, t), rollout.mask.reshape(b * g, t)
        if reference:
            logp, ent = self.reference.forward(lambda: self._forward(ids, attn, responses, mask, False))
        else:
            # train mode only matters for LoRA dropout (base dropout is off); no_grad passes
            # (old log-probs) run in eval mode so they match the sampler
            self.policy.train(torch.is_grad_enabled())
            logp, ent = self._forward(ids, attn, responses, mask, True)
            self.policy.eval()
        return logp.view(b, g, t), None if ent is None else ent.view(b, g, t)

    def mix_reference(self, weight: float) -> None:
        self.reference.mix(weight)

    @torch.no_grad()
    def greedy_rewards(self, rollout: Rollout) -> Tensor:
        ids, attn = rollout.extra["prompt_ids"], rollout.extra["prompt_mask"]
        texts, mask, finished = self._decode(self._generate(ids, attn, 1, sample=False, seed=0))
        total, _ = self._score(rollout.prompts, texts, mask, finished, 1)
        return torch.tensor(total, dtype=torch.float32, device=self.device)

    # ---------------------------------------------------------------- evaluation

    @torch.no_grad()
    def _greedy(self, batch: list) -> tuple[list[str], Tensor, Tensor]:
        ids, attn = self._prompts(batch)
        return self._decode(self._generate(ids, attn, 1, sample=False, seed=0))

    @torch.no_grad()
    def evaluate(self, gen: torch.Generator) -> dict[str, float]:
        """Held-out greedy accuracy, reward and format rate, pass@k and mean@k of k sampled completions,
        and the gain in accuracy over the base model (the warm-start: the adapter switched off)."""
        # Sampling seeds come from the run seed and a counter, not from `gen`, so that
        # how often a run is evaluated never changes its training stream.
        self._evals += 1
        seed = self.run_cfg.seed * 1_000_003 + 7919 * self._evals
        correct, fmt = self._rewards_mod.correct, self._rewards_mod.scratchpad_format
        k, chunk = self.cfg.pass_k, 256
        totals = dict.fromkeys(["accuracy", "reward", "format", "pass@k", "mean@k"], 0.0)
        for start in range(0, len(self.heldout), chunk):
            batch = self.heldout[start:start + chunk]
            answers = [p.answer for p in batch]
            texts, mask, finished = self._greedy(batch)
            # exact correctness whatever the training rewards, so reward mixes stay comparable
            totals["accuracy"] += sum(correct([], texts, answer=answers))
            totals["format"] += sum(fmt([], texts, finished=finished.tolist()))
            totals["reward"] += sum(self._score(batch, texts, mask, finished, 1)[0])
            if k:
                ids, attn = self._prompts(batch)
                texts, _, _ = self._decode(self._generate(ids, attn, k, sample=True, seed=seed + start))
                hits = torch.tensor(correct([], texts, answer=[a for a in answers for _ in range(k)])).view(len(batch), k)
                totals["pass@k"] += hits.amax(-1).sum().item()   # some of the k samples is right
                totals["mean@k"] += hits.mean(-1).sum().item()   # the share of them that is: the sampler's accuracy
        if not k:
            del totals["pass@k"], totals["mean@k"]
        out = {f"eval/{name}": v / len(self.heldout) for name, v in totals.items()}
        out["eval/accuracy_gain"] = out["eval/accuracy"] - self._base_accuracy()
        return out

    def _base_accuracy(self) -> float:
        if self._base_acc is None:
            with self.policy.disable_adapter():
                texts, _, _ = self._greedy(self.heldout)
            answers = [p.answer for p in self.heldout]
            self._base_acc = sum(self._rewards_mod.correct([], texts, answer=answers)) / len(self.heldout)
        return self._base_acc
