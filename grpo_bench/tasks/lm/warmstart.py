"""Supervised warm-start: a short SFT phase so that GRPO starts from a policy with non-zero reward.

A randomly initialised model never samples a correct answer, so every group has
equal rewards and GRPO has nothing to learn from. A few hundred SFT steps on the
training stream (never the held-out set) give a partial policy, deliberately
stopped early so that RL has accuracy to gain. The checkpoint is a plain
`save_pretrained` directory cached under `$GRPO_BENCH_CACHE` (default
`.cache/grpo_bench/` in the repository), keyed by a hash of everything that
shapes it; concurrent workers serialise on a file lock and publish with an
atomic rename, so they build it once and never see a half-written one.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import shutil
import tempfile
from pathlib import Path

import torch

from . import cache_root, models, problems

VERSION = 4  # bump when the SFT recipe changes, so old checkpoints are not reused


def _model_identity(model_id: str) -> object:
    path = Path(model_id).expanduser()
    if not path.exists():
        return model_id  # a hub id (or "tiny", whose shape is part of the spec)
    files = sorted(p for p in path.rglob("*") if p.is_file())
    return [str(path.resolve())] + [[str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns] for p in files]


def spec(cfg) -> dict:
    """Everything the checkpoint depends on; its hash names the cache entry."""
    from . import shipped

    source = cfg.model.source
    which = shipped.name(source)
    identity = shipped.manifest(which)["files"] if which else _model_identity(source)
    out = {
        "version": VERSION, "model": identity, "ops": cfg.ops, "template": cfg.template,
        "eval_size": cfg.eval_size, "eval_seed": cfg.eval_seed, "steps": cfg.warmstart.steps,
        "batch": cfg.warmstart.batch, "lr": cfg.warmstart.lr, "seed": cfg.warmstart.seed,
    }
    if source == shipped.SCRATCH:
        out["tiny"] = [cfg.model.layers, cfg.model.width, cfg.model.heads]
    # only when set, so the checkpoints cached before these keys existed keep their names
    if cfg.operands != "uniform":
        out["operands"] = cfg.operands
    if cfg.warmstart.scratchpad:
        out["scratchpad"] = cfg.warmstart.scratchpad
    return out


def checkpoint(cfg, device: torch.device) -> Path:
    """Directory of the warm-started model and tokenizer, built on first use."""
    blob = json.dumps(spec(cfg), sort_keys=True)
    key = hashlib.sha256(blob.encode()).hexdigest()[:16]
    root = cache_root()
    final = root / f"warmstart-{key}"
    if (final / "done.json").exists():
        return final
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"warmstart-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if (final / "done.json").exists():  # another worker built it while we waited
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=root))
        try:
            model, tokenizer, accuracy = _build(cfg, device)
            with models.quiet_progress():
                model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            meta = {"spec": json.loads(blob), "last_batch_token_accuracy": accuracy}
            (tmp / "done.json").write_text(json.dumps(meta))
            os.chmod(tmp, 0o755)  # mkdtemp's 0700 would hide the cache from other users
            if final.exists():  # incomplete (no done.json) and not ours: rename cannot replace it
                shutil.rmtree(final)
            os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _build(cfg, device: torch.device, check=None):
    """check(model, tokenizer, step, token accuracy) -> True to stop there (build-start's held-out checks)."""
    model, tokenizer = models.starting_model(cfg, device, dtype=torch.float32)
    models.disable_dropout(model)
    # One CPU thread whatever the caller uses: float sums in another order change the
    # stopping point of a deliberately unfinished run, so the cached checkpoint would
    # depend on which worker happened to build it.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        accuracy = sft(model, tokenizer, cfg, device, check)
    finally:
        torch.set_num_threads(threads)
    return model, tokenizer, accuracy


def _sequences(tokenizer, batch: list[problems.Problem], template: str, eos: int, device: torch.device,
               scratchpad: list[bool] | None = None):
    """Left-padded prompt+answer+EOS ids, attention mask, and labels (-100 outside the answer);
    scratchpad[i] writes the i-th answer out column by column (Problem.scratchpad)."""
    prompts = [problems.render(p, template, tokenizer) for p in batch]
    answers = [p.scratchpad() if scratchpad and scratchpad[i] else str(p.answer) for i, p in enumerate(batch)]
    return sequences(tokenizer, prompts, answers, template != "chat", eos, device)


def sequences(tokenizer, prompts: list[str], answers: list[str], special: bool, eos: int, device: torch.device):
    """Left-padded prompt+answer+EOS ids, attention mask, and labels (-100 outside the answer) of texts;
    special: the tokenizer adds its special tokens (BOS) to the prompt (not to a chat template's)."""
    rows, label_rows = [], []
    for prompt_text, text in zip(prompts, answers):
        prompt = tokenizer(prompt_text, add_special_tokens=special).input_ids
        answer = tokenizer(text, add_special_tokens=False).input_ids + [eos]
        rows.append(prompt + answer)
        label_rows.append([-100] * len(prompt) + answer)
    width = max(map(len, rows))
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=device)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
    labels = torch.tensor([[-100] * (width - len(r)) + r for r in label_rows], device=device)
    return ids, mask, labels


def optimizer(model, lr: float, steps: int):
    """AdamW without weight decay, a linear warm-up over a tenth of `steps`, then constant: the phase
    is stopped mid-learning on purpose, and a decayed rate would leave the model stuck just before
    the jump in accuracy."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    warmup = max(1, steps // 10)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))


def step(model, opt, sched, ids, mask, labels) -> float:
    """One supervised step on (ids, mask, labels); the token accuracy of the batch before it."""
    logits = model(input_ids=ids, attention_mask=mask, position_ids=models.positions(mask)).logits[:, :-1]
    target = labels[:, 1:]
    loss = torch.nn.functional.cross_entropy(logits.float().transpose(1, 2), target, ignore_index=-100)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    with torch.no_grad():
        counted = target != -100
        return ((logits.argmax(-1) == target) & counted).sum().item() / max(counted.sum().item(), 1)


def sft(model, tokenizer, cfg, device: torch.device, check=None) -> float:
    """Train on prompt -> answer for cfg.warmstart.steps batches, or until check(model, tokenizer, step, token
    accuracy) says stop; returns token accuracy of the last batch. Training draws no torch randomness (its data
    come from `rng`, dropout is off), so what a check samples leaves the steps after it as they were."""
    template = problems.resolve_template(cfg.template, tokenizer)
    eos = tokenizer.eos_token_id if template == "plain" else _chat_eos(tokenizer, model)
    exclude = problems.exclusion(problems.heldout(cfg.ops, cfg.eval_size, cfg.eval_seed, cfg.operands))
    rng = random.Random(cfg.warmstart.seed)
    torch.manual_seed(cfg.warmstart.seed)
    model.train()
    opt, sched = optimizer(model, cfg.warmstart.lr, cfg.warmstart.steps)
    accuracy = 0.0
    for s in range(1, cfg.warmstart.steps + 1):
        batch = problems.train_batch(cfg.ops, cfg.warmstart.batch, rng, exclude, cfg.operands)
        # drawn only when asked for, so a run without scratchpads sees the data it always saw
        pads = [rng.random() < cfg.warmstart.scratchpad for _ in batch] if cfg.warmstart.scratchpad else None
        accuracy = step(model, opt, sched, *_sequences(tokenizer, batch, template, eos, device, pads))
        if check is not None:
            model.eval()
            if check(model, tokenizer, s, accuracy):
                break
            model.train()
    model.eval()
    return accuracy


def _chat_eos(tokenizer, model) -> int:
    # Instruct models end a turn with their own token (<|im_end|> for Qwen), which
    # the generation config lists first or the tokenizer holds as eos_token.
    ids = model.generation_config.eos_token_id
    if isinstance(ids, list) and ids:
        return ids[0]
    return ids if isinstance(ids, int) else tokenizer.eos_token_id
