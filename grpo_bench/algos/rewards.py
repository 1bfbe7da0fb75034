"""Rewards: rule rewards with TRL's signature, `fn(prompts, completions, **kwargs) -> list[float]`.

A task's `rewards` maps reward -> weight; the total is the weighted sum. A reward is a
registered name below (each registered for the task whose data it reads) or
`module:function` with the same signature: a module beside the task presets (`tasks/`,
e.g. `arithmetic_rewards:digits`) or any importable one. Each task calls every reward
with the same keyword arguments, so a function takes what it needs and **kwargs:

    sort        prompts, completions: lists of n token ids
    arithmetic  prompts, completions: text; answer (exact result), finished (ended with
                EOS), completion_lengths (tokens, EOS included), max_new_tokens
    gym         as arithmetic, answer being the dataset's reference answer (text), and
                entry: the reasoning-gym entries (grpo_bench/tasks/gym.py Entry)

Every call of a reward goes through `call`, whoever wrote it (the task's own, a reasoning-gym
verifier, a user's `module:function`): a score that is not finite is an error (NonFiniteReward),
never a reward, and a call that has not returned after its limit raises RewardTimeout, from any
thread (`bounded`), naming the reward, the limit and the prompt it had got to. The limit is the
task's `reward_timeout` (seconds a call may take; each task's default fits what its own rewards
take), overridden for every task of a process by the environment variable GRPO_BENCH_REWARD_TIMEOUT
(0: none). The tasks call rewards member by member, so either error fails only the run whose prompt
it was. (sort's built-in rewards are not calls: they are tensor forms of match and inclusion_order
computed for the whole population at once, with nothing that can stall.)

How the limit is kept, measured per call on this machine's CPU (scripts in docs/reliability.md):
SIGALRM in the main thread costs a few microseconds and also ends a blocking call (a sleep, a socket);
a thread waited on costs tens of microseconds and cannot end a call blocked in C (it is abandoned, a
daemon); a process per call costs tens of milliseconds, and a persistent reward process would have to
pickle every batch, the reward and its keyword arguments (reasoning-gym entries) each way. So: SIGALRM
where it can be used, the thread elsewhere. What neither ends is one C call that never returns to
Python (a regular expression that backtracks forever): the alarm is handled when it returns.
"""
from __future__ import annotations

import contextlib
import contextvars
import ctypes
import importlib
import importlib.util
import math
import os
import signal
import sys
import threading
from typing import Callable

from .. import registry
from .answers import extract_answer, is_answer, is_bare_int
from ..registry import entry, names, register

RewardFn = Callable[..., list]


class NonFiniteReward(FloatingPointError):
    pass


class RewardTimeout(TimeoutError):
    pass


REWARD_TIMEOUT_S = 300.0  # a call without a task's limit (a reward called by hand)


def timeout_s(configured: float | None = None) -> float:
    """Seconds a reward call may take: GRPO_BENCH_REWARD_TIMEOUT if set, else the task's `configured`
    reward_timeout, else REWARD_TIMEOUT_S; 0 or less: no limit."""
    text = os.environ.get("GRPO_BENCH_REWARD_TIMEOUT")
    if text is None:
        return REWARD_TIMEOUT_S if configured is None else float(configured)
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"GRPO_BENCH_REWARD_TIMEOUT: expected seconds, got {text!r}") from None


def _expired(spec: str, seconds: float) -> RewardTimeout:
    return RewardTimeout(f"reward {spec!r} did not return within {seconds:g} s")


class _Read(list):
    """A list that remembers the furthest index a reward read of it: where a call that never returned had
    got to (a reward that reads every completion first, into an array, is reported at the last)."""

    __slots__ = ("furthest",)

    def __init__(self, items):
        super().__init__(items)
        self.furthest = -1

    def __iter__(self):
        for i in range(len(self)):
            self.furthest = max(self.furthest, i)
            yield list.__getitem__(self, i)

    def __getitem__(self, k):
        if isinstance(k, int) and self:
            self.furthest = max(self.furthest, k % len(self))
        return list.__getitem__(self, k)


def bounded(spec: str, seconds: float, fn: Callable, args: tuple = (), kwargs: dict | None = None):
    """fn(*args, **kwargs), or RewardTimeout once it has run `seconds` (0 or less: no limit). In the main
    thread by SIGALRM, which also cuts a blocking call short; elsewhere (a thread of the caller's: SIGALRM
    reaches only the main thread) or where a timer is already running (not ours to replace) fn runs in a
    daemon thread that this one waits for, and on a timeout that thread is told to stop (_stop)."""
    kwargs = kwargs or {}
    if seconds <= 0:
        return fn(*args, **kwargs)
    if (hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
            and signal.getitimer(signal.ITIMER_REAL)[0] == 0):
        with _deadline(spec, seconds):
            return fn(*args, **kwargs)
    box: dict = {}
    context = contextvars.copy_context()  # the caller's context variables, as a call in this thread sees them

    def target():
        with contextlib.suppress(_Abandoned):  # told to stop (_stop): nobody waits for it any more
            try:
                box["value"] = context.run(fn, *args, **kwargs)
            except BaseException as e:  # handed to the caller
                box["error"] = e

    t = threading.Thread(target=target, daemon=True, name=f"grpo_bench-reward {spec}")
    t.start()
    t.join(seconds)
    if t.is_alive():
        _stop(t)
        raise _expired(spec, seconds)
    if "error" in box:
        raise box["error"]
    return box["value"]


class _Abandoned(BaseException):
    """Raised in a reward's thread that timed out: not an Exception, so a reward's `except Exception` lets it by."""


def _stop(t: threading.Thread) -> None:
    """Ask a timed-out reward's thread to stop: _Abandoned is raised in it at its next Python instruction
    (CPython's PyThreadState_SetAsyncExc), so a loop in Python ends at once; a call blocked in C (a socket,
    a sleep) finishes first. A daemon thread: it never keeps the process alive."""
    if t.is_alive():
        with contextlib.suppress(AttributeError, ValueError, TypeError):  # not CPython: left to finish
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(t.ident), ctypes.py_object(_Abandoned))


@contextlib.contextmanager
def _deadline(spec: str, seconds: float):
    """RewardTimeout in this (main) thread after `seconds`, by SIGALRM (bounded checks that it can be used)."""
    def expire(signum, frame):
        raise _expired(spec, seconds)

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def call(spec: str, fn: RewardFn, prompts: list, completions: list, *, limit: float | None = None,
         group: int = 1, **kwargs) -> list[float]:
    """fn's scores of the completions as floats (None, TRL's "does not apply", is 0); ValueError when it
    returns another number of them, NonFiniteReward for inf or NaN, RewardTimeout past timeout_s(limit).
    group: completions per prompt (prompts repeat, one per completion), to name the prompt's index."""
    for key, column in kwargs.items():   # TRL's contract: a per-completion column has a value per completion
        if isinstance(column, list) and len(column) != len(completions):
            raise ValueError(f"reward {spec!r}: {key} has {len(column)} values for {len(completions)} completions")
    seconds = timeout_s(limit)
    read_p, read_c = _Read(prompts), _Read(completions)
    try:
        scores = bounded(spec, seconds, fn, (read_p, read_c), kwargs)
    except RewardTimeout as e:
        at = max(read_p.furthest, read_c.furthest)
        where = (f"before reading any of its {len(completions)} completions" if at < 0 else
                 f"at prompt {at // group} of {math.ceil(len(completions) / group)} (index of the last "
                 f"completion it read: {at})")
        raise RewardTimeout(f"{e} {where}; task.reward_timeout or GRPO_BENCH_REWARD_TIMEOUT sets the limit") from None
    if len(scores) != len(completions):
        raise ValueError(f"reward {spec!r} returned {len(scores)} scores for {len(completions)} completions")
    out = [0.0 if s is None else float(s) for s in scores]
    for j, s in enumerate(out):
        if not math.isfinite(s):
            raise NonFiniteReward(f"reward {spec!r} returned {s} for a completion of prompt {prompts[j]!r}; "
                                  "a reward must be a finite number")
    return out


@register("reward", "match", task="sort")
def match(prompts: list, completions: list, **kwargs) -> list[float]:
    """Fraction of positions equal to the sorted prompt.

    Source: CS336 lecture 17 ("minimal GRPO"), normalised to [0, 1].
    """
    return [sum(a == b for a, b in zip(sorted(p), c)) / len(p) for p, c in zip(prompts, completions)]


@register("reward", "inclusion_order", task="sort")
def inclusion_order(prompts: list, completions: list, **kwargs) -> list[float]:
    """Prompt tokens present in the response, plus adjacent pairs in order, over 2n - 1.

    Source: CS336 lecture 17's shaped reward, normalised to [0, 1].
    """
    out = []
    for p, c in zip(prompts, completions):
        present = sum(x in c for x in p)
        ordered = sum(a <= b for a, b in zip(c, c[1:]))
        out.append((present + ordered) / (2 * len(p) - 1))
    return out


@register("reward", "correct", task="arithmetic")
def correct(prompts: list, completions: list, answer: list | None = None, **kwargs) -> list[float]:
    """1 if the completion's integer equals the exact answer, else 0.

    Source: the verifiable outcome reward of RLVR (DeepSeek-R1, Tulu 3).
    """
    if answer is None:
        return [0.0] * len(completions)
    return [float(extract_answer(c) == a) for c, a in zip(completions, answer)]


@register("reward", "format", task="arithmetic")
def format_reward(prompts: list, completions: list, finished: list | None = None, **kwargs) -> list[float]:
    """1 if the completion is a bare integer that ended with EOS (not cut off), else 0.

    Source: the format rewards of DeepSeek-R1 and TRL's examples, for a bare-integer answer.
    """
    done = finished if finished is not None else [True] * len(completions)
    return [float(is_bare_int(c) and bool(f)) for c, f in zip(completions, done)]


@register("reward", "scratchpad_format", task="arithmetic")
def scratchpad_format(prompts: list, completions: list, finished: list | None = None, **kwargs) -> list[float]:
    """1 if the completion ended with EOS and is a bare integer, or a scratchpad in parentheses then
    a bare integer (`(7+5=12 4+8+1=13)132`), else 0.

    Source: `format` for the scratchpad preset (tasks/arithmetic_scratchpad.yaml), whose answers may be
    worked out first; the held-out eval/format of every preset.
    """
    done = finished if finished is not None else [True] * len(completions)
    return [float(is_answer(c) and bool(f)) for c, f in zip(completions, done)]


@register("reward", "length", task="arithmetic")
def length_penalty(prompts: list, completions: list, completion_lengths: list | None = None,
                   max_new_tokens: int | None = None, **kwargs) -> list[float]:
    """-(tokens used / max_new_tokens), in [-1, 0]: shorter answers score higher.

    Source: the length penalty of the seed notebook's TRL recipe (±1 correctness minus length).
    """
    if completion_lengths is None:
        completion_lengths = [len(c) if isinstance(c, str) else 0 for c in completions]
    cap = max_new_tokens or max(max(completion_lengths, default=1), 1)
    return [-min(n, cap) / cap for n in completion_lengths]


def resolve(spec: str, task: str) -> RewardFn:
    """A registered reward of this task, or `module:function` (modules beside the presets first)."""
    module, colon, attr = spec.partition(":")
    if not colon:
        own = [n for n in names("reward") if entry("reward", n).traits.get("task") == task]
        if spec not in own:
            raise ValueError(f"unknown reward {spec!r} for task {task}; valid: {', '.join(own)} or module:function")
        return entry("reward", spec).obj
    if not module or not attr:
        raise ValueError(f"reward {spec!r}: expected module:function")
    try:
        mod = _import(module)
        fn = getattr(mod, attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"cannot load reward {spec!r}: {e}") from None
    if not callable(fn):
        raise ValueError(f"reward {spec!r} is not callable")
    return fn


def _import(module: str):
    """A module beside the presets by its file (whether or not the package is installed), else by import."""
    path = registry.tasks_dir() / f"{module}.py"
    if not path.is_file():
        return importlib.import_module(module)
    name = f"{registry.PACKAGE}.{module}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        sys.modules[name] = mod
    return sys.modules[name]


def check(rewards: dict, task: str) -> dict[str, tuple[RewardFn, float]]:
    """{spec: (fn, weight)} for a task's `rewards` mapping; ValueError("rewards: ...") if it is bad."""
    if not isinstance(rewards, dict) or not rewards:
        raise ValueError("rewards: empty; give a mapping reward -> weight, e.g. {correct: 1.0}")
    out = {}
    for spec, weight in rewards.items():
        try:
            fn = resolve(str(spec), task)
        except ValueError as e:
            raise ValueError(f"rewards: {e}") from None
        if isinstance(weight, bool) or not isinstance(weight, (int, float)):
            raise ValueError(f"rewards: weight of {spec!r} must be a number, got {weight!r}")
        out[str(spec)] = (fn, float(weight))
    return out


def metric_name(spec: str) -> str:
    return spec.rpartition(":")[2]


def combine(fns: dict[str, tuple[RewardFn, float]], prompts: list, completions: list, *, limit: float | None = None,
            group: int = 1, **kwargs) -> tuple[list[float], dict[str, list[float]]]:
    """Weighted total per completion, and each function's raw scores keyed by its metric name (call's
    limit and group for each)."""
    total = [0.0] * len(completions)
    parts = {}
    for spec, (fn, weight) in fns.items():
        scores = call(spec, fn, prompts, completions, limit=limit, group=group, **kwargs)
        parts[metric_name(spec)] = scores
        total = [t + weight * s for t, s in zip(total, scores)]
    return total, parts
