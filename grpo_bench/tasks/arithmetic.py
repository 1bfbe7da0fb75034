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

from ..config.run import NEW_OPTION
from ..numerics import rng
from ..store.metrics import Metric
from ..registry import register
from . import Rollout, device_for, guarded
from .lm.passes import Passes
from .lm.sections import (LoraSection, ModelSection, SamplingSection, WarmstartSection, check_eval_subset,
                          check_numerics, check_prefix, check_reward_timeout, check_source)


def _default_ops() -> dict:
    # What the embedded 2-layer model learns within the CPU budget; mixing in sub, mul
    # and floordiv stalls its short warm-start (see ablations/arithmetic_lora.yaml).
    return {"add": [0, 99]}


def _default_rewards() -> dict:
    return {"correct": 1.0, "format": 0.1}


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
    system: str = field(default="", metadata=NEW_OPTION)
    """chat: a system message before the question ("": the template's own, where it has one)."""
    prefix: str = field(default="", metadata=NEW_OPTION)
    """chat: what the assistant's turn starts with, part of the prompt ({a}, {sym}, {b}: the operands and the
    operator; `{a} {sym} {b} = ` asks for the result alone, a format a small instruct model follows)."""
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
    reward_timeout: float = field(default=30.0, metadata=NEW_OPTION)
    """Seconds one reward call may take (it scores one member's prompts_per_step x G completions, which the
    built-in rewards do in milliseconds); past it that member fails with RewardTimeout. 0: no limit; the
    environment variable GRPO_BENCH_REWARD_TIMEOUT overrides it."""
    eval_subset: int = field(default=0, metadata=NEW_OPTION)
    """Held-out problems of an evaluation in the middle of a run: the first eval_subset of the eval_size
    (eval/problems logs how many), for cheaper curves; the evaluations at step 0 and at the end always take
    all of them. 0: all of them at every evaluation."""

    @property
    def generation_budget(self) -> int:
        return self.sampling.max_new_tokens

    def weights_id(self) -> str | None:
        """What a run id holds of the weights this config loads (a shipped checkpoint's manifest hash, a
        packaged GGUF's SHA-256)."""
        from .lm import pretrained, shipped
        return shipped.weights_id(self) or pretrained.weights_id(self)

    def check(self, run_cfg) -> None:
        from ..algos import rewards
        from .lm import pretrained, problems, shipped

        problems.check_ops(self.ops)
        if self.operands not in problems.OPERANDS:
            raise ValueError(f"operands: unknown {self.operands!r}; valid: {', '.join(problems.OPERANDS)}")
        if self.warmstart.scratchpad:
            if not 0 <= self.warmstart.scratchpad <= 1:
                raise ValueError(f"warmstart.scratchpad: must be in [0, 1], got {self.warmstart.scratchpad}")
            problems.check_scratchpad(self.ops)
        if self.template not in problems.TEMPLATES:
            raise ValueError(f"template: unknown {self.template!r}; valid: {', '.join(problems.TEMPLATES)}")
        check_prefix(self.prefix, {"a": 1, "sym": "+", "b": 2})
        if not self.model.source:
            raise ValueError("model.source: empty; give tiny, tiny-scratch, a hub id or a local directory")
        if self.eval_size < 1 or 2 * self.eval_size > problems.space_size(self.ops):
            raise ValueError(f"eval_size: must be >= 1 and at most half of the {problems.space_size(self.ops)} "
                             f"distinct problems (the rest are the training stream), got {self.eval_size}")
        rewards.check(self.rewards, "arithmetic")
        check_reward_timeout(self)
        positive = {"prompts_per_step": self.prompts_per_step, "sampling.max_new_tokens": self.sampling.max_new_tokens,
                    "lora.rank": self.lora.rank, "lora.alpha": self.lora.alpha, "model.layers": self.model.layers,
                    "model.width": self.model.width, "model.heads": self.model.heads}
        for key, value in positive.items():
            if value < 1:
                raise ValueError(f"{key}: must be >= 1, got {value}")
        check_numerics(self.model, run_cfg)
        if self.model.width % self.model.heads:
            raise ValueError(f"model.width: must be a multiple of model.heads ({self.model.heads}), got {self.model.width}")
        if self.sampling.temperature <= 0:
            raise ValueError(f"sampling.temperature: must be > 0, got {self.sampling.temperature}")
        if not 0 < self.sampling.top_p <= 1:
            raise ValueError(f"sampling.top_p: must be in (0, 1], got {self.sampling.top_p}")
        if not 0 <= self.lora.dropout < 1:
            raise ValueError(f"lora.dropout: must be in [0, 1), got {self.lora.dropout}")
        if self.model.shared_prefix and (self.model.gradient_checkpointing or self.lora.dropout):
            # a recomputed block would append to the prompt's cache a second time; a dropout mask drawn once for
            # the prompt would be shared by its group where one pass per row draws one a row
            raise ValueError("model.shared_prefix: needs model.gradient_checkpointing false and lora.dropout 0, got "
                             f"{self.model.gradient_checkpointing} and {self.lora.dropout}")
        if self.model.gradient_checkpointing and self.lora.dropout:
            # the recomputed forward would draw other dropout masks from the members' own streams
            raise ValueError("model.gradient_checkpointing: needs lora.dropout 0 (the recomputed forward would "
                             f"draw other dropout masks), got lora.dropout {self.lora.dropout}")
        check_eval_subset(self)
        for key, value in (("pass_k", self.pass_k), ("warmstart.steps", self.warmstart.steps)):
            if value < 0:
                raise ValueError(f"{key}: must be >= 0, got {value}")
        if self.warmstart.steps and (self.warmstart.batch < 1 or self.warmstart.lr <= 0):
            raise ValueError("warmstart.batch: batch must be >= 1 and warmstart.lr > 0 when warmstart.steps > 0")
        check_source(self.model)
        if shipped.name(self.model.source):
            shipped.check_compatible(self)
        elif self.model.source != shipped.SCRATCH and not pretrained.name(self.model.source):
            from .lm import models
            models.check_local_source(self.model.source)


EVAL_CHUNK = 256    # held-out problems per greedy generation call, per member
SAMPLE_CHUNK = 64   # per sampled (pass@k) call: k completions each


def completion_mask(tokens: Tensor, eos: Tensor) -> tuple[Tensor, Tensor]:
    """(mask, finished) of generated tokens (N, T): 1.0 up to and including the first EOS."""
    is_end = torch.isin(tokens, eos)
    before = is_end.long().cumsum(-1) - is_end.long()  # EOS seen strictly before this token
    return (before == 0).float(), is_end.any(-1)



@register("task", "arithmetic", config=ArithmeticConfig)
class Arithmetic(Passes):
    """Arithmetic (+ - * //) on a causal LM with LoRA; tiny offline GPT-2 by default."""

    label, short = "arithmetic LM", "LM"
    # `device: auto`: one H200 at a population of 64 did the work of this many CPU cores (results/gpu/population.csv,
    # held by tests/test_runner.py); the gym tasks share the model and the loop, and this measurement
    gpu_replaces_cores = 51.47
    main_metric = "final/eval/accuracy"  # held-out greedy accuracy at the end of training
    curves = ("eval/accuracy", "reward/mean")
    # Claims are judged on the held-out greedy accuracy; its margin follows from where the default recipe ends
    # (metrics.odds_margin: odds of 1.2 at 0.818, 0.027), declared from the arithmetic_scratchpad runs below
    verdict_metric = "final/eval/accuracy"
    headroom = (0.280, 0.818, "the default recipe (z-score, PPO clip 0.2, per-response mean, no KL) on "
                "arithmetic_scratchpad, 30 rollouts of 16 prompts x 8, 5 seeds: results/arithmetic_lora `grpo`")
    # a start of another size moves by its own amount: the wide start's (4x the parameters) from its own
    # default-recipe runs, 29 points where the small start's are 54
    HEADROOM = {"shipped:arithmetic_scratchpad_wide": (
        0.273, 0.565, "the default recipe (z-score, PPO clip 0.2, per-response mean, no KL) on "
        "arithmetic_scratchpad_wide, 30 rollouts of 16 prompts x 8, 5 seeds: results/dapo_ladder_lm_wide `grpo`")}
    metrics = (
        Metric("eval/accuracy", label="held-out accuracy", summary="eval accuracy", range=(0, 1),
               higher_is_better=True),
        Metric("eval/accuracy_gain", label="held-out accuracy gain", summary="eval accuracy gain", range=(-1, 1),
               higher_is_better=True, offset_of="eval/accuracy"),
        Metric("eval/reward", label="held-out reward", summary="eval reward", higher_is_better=True),
        Metric("eval/pass@k", label="held-out pass@k", summary="eval pass@k", range=(0, 1), higher_is_better=True),
        Metric("eval/mean@k", label="held-out mean@k", summary="eval mean@k", range=(0, 1), higher_is_better=True),
        Metric("response/finished", range=(0, 1)),
        # Dr. GRPO's length bias: wrong answers growing longer (ablations/length_bias.yaml)
        Metric("response/length_correct", tail=True),
        Metric("response/length_incorrect", tail=True),
    )

    def __init__(self, task_config: ArithmeticConfig, run_configs):
        from ..algos import rewards
        from .lm import models, problems, stacked

        run_configs = run_configs if isinstance(run_configs, list) else [run_configs]
        self.cfg, self.run_cfg = task_config, run_configs[0]
        self.seeds = [c.seed for c in run_configs]
        self.device = models.resolve_device(device_for(self.run_cfg.device, type(self)))
        cfg = task_config
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}.get(cfg.model.dtype)   # auto: by device
        base, self.tokenizer = self._starting_model(dtype)
        self.eos = torch.tensor(models.eos_ids(base, self.tokenizer), device=self.device)
        models.disable_dropout(base)
        models.batch_invariant_attention(base, self.device)
        targets = cfg.lora.targets or models.LORA_TARGETS.get(base.config.model_type)
        if not targets:
            raise ValueError(f"lora.targets: no default for model type {base.config.model_type!r}; name the modules")
        # one frozen base model, one adapter per member (lm/stacked.py)
        self.layers = stacked.attach(base, targets, cfg.lora.rank, cfg.lora.alpha, cfg.lora.dropout, self.seeds)
        self.policy = base.eval()
        if cfg.model.gradient_checkpointing:  # transformers 5.24 renamed it; older releases have the old name
            enable = getattr(self.policy, "activation_checkpointing_enable", None)
            if enable is not None:
                enable({"use_reentrant": False})
            else:
                self.policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        # backend torch keeps the materialised logits as the reference path; the others take
        # log-probs from the final hidden states and the head's weight (logprobs.linear_logprobs)
        self._fused = self.run_cfg.backend != "torch" and models.plain_head(self.policy)
        if self.run_cfg.backend != "torch" and not self._fused:
            warnings.warn(f"model type {base.config.model_type!r} is not one whose logits are known to be "
                          f"lm_head(final hidden state) ({', '.join(models.PLAIN_HEADS)}): its log-probs "
                          "go through the materialised (N, T, V) logits", stacklevel=2)
        self._problems, self._models, self._rewards_mod, self._stacked = problems, models, rewards, stacked
        self.rewards = rewards.check(cfg.rewards, self.reward_task)
        self.failed: dict[int, Exception] = {}  # members whose own reward raised since the trainer last looked
        self._evals, self._base_hits, self._passes, self._ref_draws = 0, None, 0, 0
        self.outcomes: list[dict] | None = None  # each member's per-problem outcomes of the last evaluate
        # each member's relative error of the last soft reference mix's rank cut, its worst module's (the trainer
        # logs it as ref/mix_residual); None before a mix
        self.residual: list[float] | None = None
        self._setup_problems()

    # the hooks a task on other problems (grpo_bench/tasks/gym.py) replaces: the model it starts from, its
    # problems, how a batch is drawn, and what counts as right

    reward_task = "arithmetic"  # the rewards registered for this task (traits task=...)

    def _starting_model(self, dtype):
        from .lm import models, warmstart

        if self.cfg.warmstart.steps > 0:
            return models.load(str(warmstart.checkpoint(self.cfg, self.device)), self.device, dtype)
        return models.starting_model(self.cfg, self.device, dtype)

    def _setup_problems(self) -> None:
        """The template, the held-out set, each member's exclusions, and the prompt width."""
        cfg, problems = self.cfg, self._problems
        self.template = problems.resolve_template(cfg.template, self.tokenizer)
        self.heldout = problems.heldout(cfg.ops, cfg.eval_size, cfg.eval_seed, cfg.operands)
        # what each member's training stream never shows: the held-out set, and what its curriculum retired
        self._exclude = [problems.exclusion(self.heldout) for _ in self.seeds]
        # every prompt is left-padded to one width, the longest the problem space can render:
        # a member's shapes never depend on the other members' prompts
        self.width = max(len(self.tokenizer(self._render(q), add_special_tokens=self.template != "chat")["input_ids"])
                         for q in problems.extremes(cfg.ops) + self.heldout)

    def _train_batch(self, seed: int, exclude: set, epoch: int, draw: int) -> list:
        """prompts_per_step training problems of the member with this seed, from its stream for (epoch, draw)."""
        return self._problems.train_batch(self.cfg.ops, self.cfg.prompts_per_step,
                                          random.Random(rng.stream_seed(seed, "prompts", epoch, draw)), exclude,
                                          self.cfg.operands)

    def _correct(self, batch: list, texts: list[str], n: int = 1) -> list[float]:
        """1.0 per completion (n per problem of batch) that answers exactly, else 0.0."""
        r = self._rewards_mod
        return r.call("correct", r.correct, [q for q in batch for _ in range(n)], texts,
                      limit=self.cfg.reward_timeout, group=n, answer=[q.answer for q in batch for _ in range(n)])

    def _member_correct(self, member: int, batch: list, texts: list[str], n: int = 1) -> list[float]:
        """_correct of one member's completions; a verifier that raises or hangs fails that member alone."""
        return guarded(self.failed, member, lambda: self._correct(batch, texts, n), [0.0] * len(texts))

    def _format(self, texts: list[str], finished: list[bool]) -> list[float]:
        return self._rewards_mod.scratchpad_format([], texts, finished=finished)

    @staticmethod
    def member_bytes(run_cfg) -> int:
        """A generous estimate of one member's memory in a gradient pass: the activations a
        transformer keeps for its backward, about 24 values per hidden unit per layer per token."""
        from .lm import pretrained

        c = run_cfg.task
        width = 4096 if c.model.source not in ("tiny", "tiny-scratch") else c.model.width
        layers = 32 if c.model.source not in ("tiny", "tiny-scratch") else c.model.layers
        packaged = pretrained.entry(c.model.source)
        if packaged is not None:  # its shape is known without loading it
            width, layers = packaged.width, packaged.layers
        tokens = c.prompts_per_step * run_cfg.group_size * (24 + c.sampling.max_new_tokens)
        return 4 * 24 * tokens * width * layers + (64 << 20)

    @staticmethod
    def population_cap(run_cfg) -> int:
        """Members worth stacking. On a CPU a member's rows already make the GEMMs compute-bound
        (measured on the embedded model: the same time per member at P = 1 and 2, 1.6x more at
        P = 8, where the activations leave the cache), so CPU runs train one at a time; a GPU
        is left to the memory budget. `auto` is sized as the device it means here (device_for), so a caller
        that sizes before the runner's plan resolves it does not stack LM runs on a CPU."""
        return 1 if device_for(run_cfg.device, Arithmetic) == "cpu" else 1 << 30

    @property
    def size(self) -> int:
        return len(self.seeds)

    # ------------------------------------------------------------------ sampling

    def _render(self, problem) -> str:
        return self._problems.render(problem, self.template, self.tokenizer, self.cfg.system, self.cfg.prefix)

    def _prompts(self, batch: list) -> tuple[Tensor, Tensor]:
        """Left-padded (ids, mask) (len(batch), width) of problems."""
        enc = self.tokenizer([self._render(q) for q in batch], padding="max_length", max_length=self.width,
                             add_special_tokens=self.template != "chat", return_tensors="pt")
        if enc["input_ids"].shape[1] != self.width:
            raise ValueError(f"a prompt is longer than the {self.width} tokens the task planned for")
        return enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device)

    def _generate(self, ids: Tensor, mask: Tensor, gens: list[torch.Generator] | None, model=None,
                  with_logprobs: bool = False, n: int = 1):
        """(N n, max_new_tokens) completions of member-major prompt rows, n consecutive ones of each row; gens None:
        greedy. model: who generates (the policy, or a sampler copy of it); with_logprobs: its log-probs of them too."""
        cfg = self.cfg.sampling
        model = self.policy if model is None else model
        model.eval()
        repeat = n if cfg.shared_prefill else 1
        if repeat == 1 and n > 1:
            ids, mask = ids.repeat_interleave(n, 0), mask.repeat_interleave(n, 0)
        return self._stacked.generate(model, ids, mask, cfg.max_new_tokens, self.eos, self.tokenizer.pad_token_id,
                                      gens, cfg.temperature, cfg.top_p, with_logprobs=with_logprobs, repeat=repeat)

    def _decode(self, tokens: Tensor) -> tuple[list[str], Tensor, Tensor]:
        """Text of generated tokens (N, T) up to EOS, their mask and whether they finished."""
        mask, finished = completion_mask(tokens, self.eos)
        # the text before EOS, special tokens kept: skipping them would read `4<pad><bos>2` as `42`
        content = (mask.sum(-1) - finished.float()).long().tolist()
        texts = self.tokenizer.batch_decode([t[:k] for t, k in zip(tokens.tolist(), content)], skip_special_tokens=False)
        return texts, mask, finished

    @staticmethod
    def _host(mask: Tensor, finished: Tensor) -> tuple[list[int], list[bool]]:
        """Every row's length (EOS included) and whether it finished, read by the host once for all members:
        the rewards slice these lists member by member, which on a GPU would otherwise be two syncs a member."""
        return mask.sum(-1).long().tolist(), finished.tolist()

    def _score(self, batch: list, texts: list[str], lengths: list[int], finished: list[bool], n: int):
        """Weighted total reward and the raw components of the n completions of each problem (lengths and finished:
        _host's, for these completions)."""
        prompts = [self._render(p) for p in batch for _ in range(n)]
        return self._rewards_mod.combine(
            self.rewards, prompts, texts, limit=self.cfg.reward_timeout, group=n,
            answer=[p.answer for p in batch for _ in range(n)],
            finished=finished, completion_lengths=lengths, max_new_tokens=self.cfg.sampling.max_new_tokens)

    def _member_score(self, member: int, batch: list, texts: list[str], lengths: list[int], finished: list[bool],
                      n: int):
        """_score of one member's completions; a reward that raises (or is not finite) fails that member
        alone (self.failed) and scores it 0."""
        zeros = [0.0] * (len(batch) * n)
        stand_in = (zeros, {self._rewards_mod.metric_name(spec): zeros for spec in self.rewards})
        return guarded(self.failed, member, lambda: self._score(batch, texts, lengths, finished, n), stand_in)

    def rollout(self, epoch: int, draw: int, group_size: int, sampler=None) -> Rollout:
        p, g, b = self.size, group_size, self.cfg.prompts_per_step
        batches = [self._train_batch(s, exclude, epoch, draw) for s, exclude in zip(self.seeds, self._exclude)]
        ids, attn = self._prompts([q for batch in batches for q in batch])          # (P B, L)
        gens = self._streams("sample", epoch, draw)
        out = self._generate(ids, attn, gens, sampler, with_logprobs=sampler is not None, n=g)   # (P B G, T)
        tokens, sampler_logp = out if sampler is not None else (out, None)
        texts, mask, finished = self._decode(tokens)
        lengths_h, finished_h = self._host(mask, finished)
        n = b * g
        # members' rewards as host lists, each kind made a tensor once: no tensor op (a GPU's launch) per member
        rewards, metrics, components, right = [], {}, [], []
        for i, batch in enumerate(batches):
            rows = slice(i * n, (i + 1) * n)
            total, parts = self._member_score(i, batch, texts[rows], lengths_h[rows], finished_h[rows], g)
            rewards.append(total)
            components.append(list(zip(*parts.values())))
            for name, v in parts.items():
                metrics.setdefault(f"reward/{name}", []).append(sum(v) / len(v))
            right += self._member_correct(i, batch, texts[rows], g)
        right = torch.tensor(right, dtype=torch.bool)
        metrics = {k: torch.tensor(v, dtype=torch.float64) for k, v in metrics.items()}
        metrics["response/finished"] = finished.float().view(p, n).mean(1)
        # Dr. GRPO's length bias shows as wrong answers growing longer: lengths split by exact correctness
        lengths = mask.sum(-1).cpu().view(p, n)
        right = right.view(p, n)
        for name, sel in (("response/length_correct", right), ("response/length_incorrect", ~right)):
            counts = sel.sum(1)
            means = torch.where(sel, lengths, torch.zeros_like(lengths)).sum(1) / counts.clamp(min=1)
            # NaN for a member with none of them: it logs nothing (NaN rows are not written), as alone
            metrics[name] = torch.where(counts > 0, means, torch.full_like(means, float("nan")))
        t = tokens.shape[1]
        return Rollout(
            prompts=batches,
            responses=tokens.view(p, b, g, t),
            mask=mask.view(p, b, g, t),
            rewards=torch.tensor(rewards, dtype=torch.float32, device=self.device).view(p, b, g),
            finished=finished.view(p, b, g),
            extra={"prompt_ids": ids.view(p, b, -1), "prompt_mask": attn.view(p, b, -1)},
            metrics=metrics,
            components=torch.tensor(components, dtype=torch.float32).view(p, b, g, -1).to(self.device),
            sampler_logp=None if sampler_logp is None else sampler_logp.view(p, b, g, t),
        )

    # ------------------------------------------------------------------ log-probs

    @classmethod
    def headroom_of(cls, section: dict | None):
        """What the default recipe moves greedy held-out accuracy from this section's start: the model-size axis's
        wide start has its own, a pretrained model none yet (the tiny start's would set its margin), every other
        start the class's."""
        source = ((section or {}).get("model") or {}).get("source")
        if cls.pretrained_of(section):
            return None
        return cls.HEADROOM[source] if source in cls.HEADROOM else cls.headroom

    @staticmethod
    def pretrained_of(section: dict | None) -> str | None:
        """The packaged pretrained model a task section trains (its model.source, or the base a shipped warm-up
        sits on), else None: reads the manifest only, so judging old results loads no weights."""
        from .lm import pretrained, shipped

        source = ((section or {}).get("model") or {}).get("source")
        if not isinstance(source, str):
            return None
        for s in (source, shipped.base(source) if source.startswith(shipped.PREFIX) else None):
            found = pretrained.entry(s) if s else None
            if found is not None:
                return found.model
        return None

    @classmethod
    def label_of(cls, section: dict | None) -> str:
        """FINDINGS' name for the task a section runs: a pretrained model's runs are their own model family."""
        model = cls.pretrained_of(section)
        return f"{model} ({cls.label})" if model else cls.label

    @torch.no_grad()
    def reference_rewards(self, rollout: Rollout, n: int) -> Tensor:
        """(P, B, n) rewards of n responses the reference policy samples for each prompt of the rollout
        (A*-PO's estimate of V*), from each member's stream of such draws."""
        p, b = rollout.rewards.shape[:2]
        ids, attn = rollout.extra["prompt_ids"].view(p * b, -1), rollout.extra["prompt_mask"].view(p * b, -1)
        self._ref_draws += 1
        gens = self._streams("reference_samples", self._ref_draws)
        with self._stacked.adapters(self.layers, self._stacked.REFERENCE):
            tokens = self._generate(ids, attn, gens, n=n)
        texts, mask, finished = self._decode(tokens)
        lengths, done = self._host(mask, finished)
        out = [self._score(batch, texts[i * b * n:(i + 1) * b * n], lengths[i * b * n:(i + 1) * b * n],
                           done[i * b * n:(i + 1) * b * n], n)[0] for i, batch in enumerate(rollout.prompts)]
        return torch.tensor(out, dtype=torch.float32, device=self.device).view(p, b, n)

    def mix_reference(self, weights: list[float]) -> None:
        self.residual = [max(cuts) for cuts in zip(*(layer.mix(weights) for layer in self.layers))]

    def retire(self, member: int, prompts: list) -> None:
        """Member `member` never draws these problems again: a curriculum filter's decision (no_positive_resample)."""
        self._exclude[member].update(prompts)
        if len(self._exclude[member]) >= self._problems.space_size(self.cfg.ops):
            raise RuntimeError("every training problem is retired: nothing left to draw")

    @torch.no_grad()
    def greedy_rewards(self, rollout: Rollout) -> Tensor:
        p, b = rollout.rewards.shape[:2]
        ids, attn = rollout.extra["prompt_ids"].view(p * b, -1), rollout.extra["prompt_mask"].view(p * b, -1)
        texts, mask, finished = self._decode(self._generate(ids, attn, None))
        lengths, done = self._host(mask, finished)
        out = [self._member_score(i, batch, texts[i * b:(i + 1) * b], lengths[i * b:(i + 1) * b],
                                  done[i * b:(i + 1) * b], 1)[0] for i, batch in enumerate(rollout.prompts)]
        return torch.tensor(out, dtype=torch.float32, device=self.device)

    def _streams(self, *key) -> list[torch.Generator] | rng.DeviceStreams:
        """Each member's sampling stream for `key`: CPU generators, or on a GPU counter-based streams on the device
        (rng.device_paths): other numbers, the same common random numbers, no host work per member and token."""
        if rng.device_paths(self.device):
            return rng.DeviceStreams(torch.tensor(self.seeds, dtype=torch.int64, device=self.device), *key)
        return [rng.stream(s, *key) for s in self.seeds]

    def keep(self, idx: list[int]) -> None:
        self.seeds = [self.seeds[i] for i in idx]
        self._exclude = [self._exclude[i] for i in idx]
        for layer in self.layers:
            layer.keep(idx)

    # ---------------------------------------------------------------- evaluation

    @torch.no_grad()
    def evaluate(self, mid_run: bool = False) -> list[dict[str, float]]:
        """Held-out greedy accuracy, reward and format rate, pass@k and mean@k of k sampled completions,
        and the gain in accuracy over the base model (the warm-start: the adapter switched off), per member;
        each problem's outcome in self.outcomes. mid_run: on the first eval_subset problems, where it is set."""
        # Sampling seeds come from the run seed and a counter, not from the training streams,
        # so that how often a run is evaluated never changes its training.
        self._evals += 1
        p, k = self.size, self.cfg.pass_k
        heldout = self.heldout[:self.cfg.eval_subset] if mid_run and self.cfg.eval_subset else self.heldout
        names = ["accuracy", "reward", "format"] + (["pass@k", "mean@k"] if k else [])
        # Chunks of a fixed number of problems whatever P (greedy: EVAL_CHUNK; sampled: SAMPLE_CHUNK,
        # each chunk's k samples from the member's stream for that chunk), summed in problem order
        # at the end: a member's numbers are the ones it has alone.
        scores = [[[] for _ in names] for _ in range(p)]
        right = [[] for _ in range(p)]   # per member, problem: how many of its k samples are right
        for start in range(0, len(heldout), EVAL_CHUNK):
            batch = heldout[start:start + EVAL_CHUNK]
            n = len(batch)
            ids, attn = self._prompts(batch)
            texts, mask, finished = self._decode(self._generate(ids.repeat(p, 1), attn.repeat(p, 1), None))
            lengths, done = self._host(mask, finished)
            for i in range(p):
                rows = slice(i * n, (i + 1) * n)
                # exact correctness whatever the training rewards, so reward mixes stay comparable
                scores[i][0] += self._member_correct(i, batch, texts[rows])
                scores[i][1] += self._member_score(i, batch, texts[rows], lengths[rows], done[rows], 1)[0]
                scores[i][2] += self._format(texts[rows], done[rows])
        for start in range(0, len(heldout), SAMPLE_CHUNK if k else len(heldout)):
            if not k:
                break
            batch = heldout[start:start + SAMPLE_CHUNK]
            n = len(batch)
            ids, attn = self._prompts(batch)
            gens = self._streams("eval", self._evals, start)
            texts, _, _ = self._decode(self._generate(ids.repeat(p, 1), attn.repeat(p, 1), gens, n=k))
            for i in range(p):
                hits = torch.tensor(self._member_correct(i, batch, texts[i * n * k:(i + 1) * n * k], k)).view(n, k)
                scores[i][3] += hits.amax(-1).tolist()   # some of the k samples is right
                scores[i][4] += hits.mean(-1).tolist()   # the share of them that is: the sampler's accuracy
                right[i] += hits.sum(-1).long().tolist()
        # problem j is self.heldout[j]: a mid-run subset is the first problems, so the index is the same in both
        self.outcomes = [{"greedy": [int(v) for v in member[0]], "k_correct": right[i] if k else None}
                         for i, member in enumerate(scores)]
        if self._base_hits is None and len(heldout) == len(self.heldout) and 0 not in self.failed and self._unmoved():
            # member 0's adapters add exactly zero (a run's first evaluation, before any step): its greedy answers
            # are the base model's bit for bit (same chunks, same rows), so a second pass would only repeat them
            self._base_hits = list(scores[0][0])
        totals = torch.tensor([[sum(v) for v in member] for member in scores], dtype=torch.float64)
        base = self._base_accuracy(len(heldout))
        out = []
        for row in (totals / len(heldout)).tolist():
            d = {f"eval/{name}": v for name, v in zip(names, row)}
            d["eval/accuracy_gain"] = d["eval/accuracy"] - base
            # curves that mix subset and full points say which is which; undeclared, since declaring it would
            # change the task's declaration every committed ablation.json records
            if self.cfg.eval_subset:
                d["eval/problems"] = float(len(heldout))
            out.append(d)
        return out

    def _unmoved(self) -> bool:
        """Whether member 0's every adapter is B A = 0 as initialised (A or B all zero) and acting."""
        return all(layer.mode == self._stacked.POLICY and (not layer.A[0].any() or not layer.B[0].any())
                   for layer in self.layers)

    def _base_accuracy(self, n: int | None = None) -> float:
        """Greedy accuracy of the base model (every adapter off) on the first n held-out problems (all by
        default), the same for every member."""
        if self._base_hits is None:
            self._base_hits = []
            with self._stacked.adapters(self.layers, self._stacked.OFF):
                for start in range(0, len(self.heldout), 256):
                    batch = self.heldout[start:start + 256]
                    ids, attn = self._prompts(batch)
                    texts, _, _ = self._decode(self._generate(ids, attn, None))
                    self._base_hits += self._correct(batch, texts)
        n = len(self.heldout) if n is None else n
        return sum(self._base_hits[:n]) / n
