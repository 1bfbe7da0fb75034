"""One GRPO step of the arithmetic task on a wide-vocabulary causal LM: materialised logits vs the fused head.

The step is the trainer's inner step: the policy's log-probs and entropy (Arithmetic.logprobs,
LoRA on every projection), the clipped GRPO loss against fixed old log-probs, and the
backward into the adapter. The model is a Qwen2 built from config with Qwen2.5's 151,936-token
vocabulary, random weights and 2 small layers, over the character tokenizer padded to that
vocabulary (saved once, loaded by the task as `model.source: DIR` would).

Providers:
    materialised  backend torch: the model's (N, T, V) logits, fp32 log_softmax and entropy
    fused         backend chunked (CPU) / auto (CUDA): final hidden states and the head's weight
                  through linear_logprobs, chunks of rows only
Rollouts are fixed (random digit completions, every token unmasked), so both providers see the
same tokens and the step is all that is timed. Before timing, each provider's log-probs of two
prompts' completions are checked against the model's own forward (its logits, log_softmax). GB/s in extra_info is that of writing one fp32 (N, T, V) logits
tensor, the traffic the fused path avoids, over the step's median time.

CPU sizes: the issue's 32 prompts x 8 samples x 32 new tokens (N = 8,192 rows: its logits alone
are 5 GB in fp32) and a quarter of its prompts (N = 2,048), where the materialised path fits
beside other jobs. A case whose materialised step would need more memory than is available is
skipped with both figures. CUDA: the same step at Qwen2.5-0.5B's shape in bf16 with
512-token completions.
"""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from grpo_bench.config.run import resolve_run
from grpo_bench.numerics.logprobs import grpo_loss
from grpo_bench.registry import get
from grpo_bench.tasks import Rollout

QWEN_VOCAB = 151_936
# the materialised step's peak is about 5 fp32 (N, T, V) tensors (measured at N = 2,048: 5.9 GiB
# against 1.16 GiB, see results/kernels/); a case is skipped when 6 would not fit
MATERIALISED_COPIES = 6


@dataclass(frozen=True)
class Case:
    provider: str
    prompts: int
    samples: int
    new_tokens: int
    vocab: int
    width: int
    layers: int
    dtype: torch.dtype

    @property
    def n(self) -> int:
        return self.prompts * self.samples * self.new_tokens

    @property
    def id(self) -> str:
        return f"{self.provider}-B{self.prompts}xG{self.samples}xT{self.new_tokens}-V{self.vocab}-H{self.width}"

    @property
    def group(self) -> str:
        return (f"GRPO step B={self.prompts} G={self.samples} T={self.new_tokens} V={self.vocab} "
                f"H={self.width} L={self.layers} {str(self.dtype).removeprefix('torch.')}")


def cases(full: bool, device: str) -> dict[str, list[Case]]:
    if not full:  # smoke: a narrow model, a handful of tokens
        sizes = [(2, 2, 4, 1000, 16, 1, torch.float32)]
    elif device == "cuda":  # Qwen2.5-0.5B's head and width, 2 layers: the head is what differs
        # the 32 prompts (the materialised step cannot fit: ~6 x 80 GB), and 2 prompts,
        # where both paths fit on one 80 GB GPU and can be compared
        sizes = [(2, 8, 512, QWEN_VOCAB, 896, 2, torch.bfloat16), (32, 8, 512, QWEN_VOCAB, 896, 2, torch.bfloat16)]
    else:
        sizes = [(8, 8, 32, QWEN_VOCAB, 128, 2, torch.float32), (32, 8, 32, QWEN_VOCAB, 128, 2, torch.float32)]
    return {"step_case": [Case(p, *s) for s in sizes for p in ("materialised", "fused")]}


_MODELS: dict = {}
_TASKS: dict = {}


def model_dir(case: Case, tmp_root) -> str:
    """A saved Qwen2 of the case's vocabulary, width and depth, built once per session."""
    key = (case.vocab, case.width, case.layers)
    if key not in _MODELS:
        from grpo_bench.tasks.lm import models
        from grpo_bench.tasks.lm.tokenizer import build_char_tokenizer

        path = tmp_root / f"qwen2-V{case.vocab}-H{case.width}-L{case.layers}"
        tok = models.prepare_tokenizer(build_char_tokenizer(size=case.vocab))
        n_head = max(2, case.width // 64)
        model = models.build_qwen2(tok, case.layers, case.width, n_head, seed=0, vocab=case.vocab, n_positions=1024)
        model.save_pretrained(path)
        tok.save_pretrained(path)
        _MODELS[key] = str(path)
    return _MODELS[key]


def setup(case: Case, device: str, tmp_root):
    """(task, rollout, old log-probs, advantages) for the case, the task built for its provider."""
    key = case
    if key not in _TASKS:
        _TASKS.clear()  # one size at a time: the materialised step's tensors are GBs
        backend = "torch" if case.provider == "materialised" else ("chunked" if device == "cpu" else "auto")
        task_cfg = {"name": "arithmetic", "model": {"source": model_dir(case, tmp_root)}, "ops": {"add": [0, 99]},
                    "prompts_per_step": case.prompts, "sampling": {"max_new_tokens": case.new_tokens},
                    "eval_size": 12, "pass_k": 0}
        cfg = resolve_run({"task": task_cfg, "group_size": case.samples, "backend": backend, "device": device})
        task = get("task", "arithmetic")(cfg.task, cfg)
        task.policy.to(case.dtype)
        assert task._fused == (case.provider == "fused")
        gen = torch.Generator().manual_seed(0)
        from grpo_bench.tasks.lm import problems

        batch = [problems.Problem(int(a), "add", int(b)) for a, b in torch.randint(0, 100, (case.prompts, 2), generator=gen)]
        ids, attn = task._prompts(batch)
        digits = torch.tensor(task.tokenizer.convert_tokens_to_ids(list("0123456789")))
        shape = (1, case.prompts, case.samples, case.new_tokens)   # a population of one
        responses = digits[torch.randint(0, 10, shape, generator=gen)].to(ids.device)
        ro = Rollout([batch], responses, torch.ones(shape, device=ids.device), torch.zeros(shape[:3], device=ids.device),
                     extra={"prompt_ids": ids[None], "prompt_mask": attn[None]})
        with torch.no_grad():
            old = task.logprobs(ro)[0]
        deltas = torch.randn(shape[:3], generator=gen).to(ids.device)
        _TASKS[key] = (task, ro, old, deltas)
    return _TASKS[key]


def grpo_step(task, ro, old, deltas):
    """The trainer's inner step: log-probs and entropy, clipped loss, backward into the adapter."""
    for p in task.policy.parameters():
        p.grad = None
    logp, entropy = task.logprobs(ro)
    loss, _ = grpo_loss(logp, old, None, deltas, ro.mask, loss="clipped", backend=task.run_cfg.backend)
    loss.backward()
    return loss.detach(), entropy.detach()  # the trainer keeps the entropy for its metrics


def available_bytes(device: str) -> int:
    if device == "cuda":
        return torch.cuda.mem_get_info()[0]
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable"))
    except (OSError, StopIteration):
        return 1 << 62


def test_grpo_step(bench, step_case, device, tmp_path_factory):
    case = step_case
    logits_bytes = case.n * case.vocab * 4
    if case.provider == "materialised" and bench.full:
        need, have = MATERIALISED_COPIES * logits_bytes, available_bytes(device)
        if need > 0.8 * have:  # the machine is shared: an out-of-memory kill could hit another job
            pytest.skip(f"the materialised step needs about {need / 2**30:.1f} GiB ({MATERIALISED_COPIES} fp32 "
                        f"(N, T, V) tensors of {logits_bytes / 2**30:.2f} GiB); {have / 2**30:.1f} GiB available")
    task, ro, old, deltas = setup(case, device, tmp_path_factory.getbasetemp())
    check(task, ro, case)
    bench.run(lambda: grpo_step(task, ro, old, deltas), group=case.group, rows=case.n, nbytes=logits_bytes,
              kernel="lm_step", mode="fwd+bwd", provider=case.provider, n=case.n, v=case.vocab,
              dtype=str(case.dtype).removeprefix("torch."), prompts=case.prompts, samples=case.samples,
              new_tokens=case.new_tokens, hidden=case.width, layers=case.layers,
              logits_mb=logits_bytes / 2**20, threads=torch.get_num_threads())


def check(task, ro: Rollout, case: Case, k: int = 2) -> None:
    """The provider's log-probs of the first k prompts' completions against the model's own logits."""
    from grpo_bench.tasks.lm.models import positions

    t = ro.responses.shape[-1]
    g = case.samples
    ids = torch.cat([ro.extra["prompt_ids"][0, :k].repeat_interleave(g, 0), ro.responses[0, :k].reshape(k * g, t)], 1)
    attn = torch.cat([ro.extra["prompt_mask"][0, :k].repeat_interleave(g, 0), ro.mask[0, :k].reshape(k * g, t).long()], 1)
    part = Rollout([ro.prompts[0][:k]], ro.responses[:, :k], ro.mask[:, :k], ro.rewards[:, :k],
                   extra={key: v[:, :k] for key, v in ro.extra.items()})
    with torch.no_grad():
        mine = task.logprobs(part)[0].reshape(k * g, t)
        logits = task.policy(input_ids=ids, attention_mask=attn, position_ids=positions(attn)).logits[:, -t - 1:-1]
        want = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, -t:, None])[..., 0]
    tol = dict(rtol=1e-4, atol=1e-4) if case.dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(mine, want, **tol, msg=lambda m: f"{case.id} log p: {m}")
