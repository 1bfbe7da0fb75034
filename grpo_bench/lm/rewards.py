"""Rule rewards with TRL's signature, `fn(prompts, completions, **kwargs) -> list[float]`.

The task calls every reward function with the same keyword arguments:
`answer` (list[int], the exact result), `finished` (list[bool], the completion
ended with EOS), `completion_lengths` (list[int], tokens up to and including
EOS) and `max_new_tokens` (int). A function that does not need them takes
**kwargs. The total reward is the weighted sum of the functions named in the
task's `rewards` mapping: a built-in name below or `module:function`, imported
with importlib (model text is parsed with regular expressions, never evaluated).
"""
from __future__ import annotations

import importlib
import re
from typing import Callable

RewardFn = Callable[..., list]

# An integer, optionally with thousands separators and a zero fractional part
# ("1,234", "42.0"); the last one in the text is the answer, so echoed prompts
# ("17+25=42") and chatty answers ("The answer is 42.") both parse.
_NUMBER = re.compile(r"-?(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?")
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_BARE_INT = re.compile(r"\s*-?[0-9]+\s*")
# int() refuses more than 4300 digits and no result of this task is that long
MAX_DIGITS = 64


def extract_answer(text: str) -> int | None:
    """The integer a completion answers with, or None when it gives none."""
    if not isinstance(text, str):
        return None
    boxed = _BOXED.findall(text)
    if boxed:
        text = boxed[-1]
    numbers = _NUMBER.findall(text)
    if not numbers:
        return None
    number = numbers[-1].replace(",", "")
    whole, _, frac = number.partition(".")
    if frac.strip("0"):  # 42.5 is not an integer answer
        return None
    if len(whole.lstrip("-")) > MAX_DIGITS:
        return None
    return int(whole)


def correct(prompts: list, completions: list, answer: list | None = None, **kwargs) -> list[float]:
    """1 if the completion's integer equals the exact answer, else 0."""
    if answer is None:
        return [0.0] * len(completions)
    return [float(extract_answer(c) == a) for c, a in zip(completions, answer)]


def format_reward(prompts: list, completions: list, finished: list | None = None, **kwargs) -> list[float]:
    """1 if the completion is a bare integer that ended with EOS (not cut off), else 0."""
    done = finished if finished is not None else [True] * len(completions)
    return [float(isinstance(c, str) and _BARE_INT.fullmatch(c) is not None and bool(f))
            for c, f in zip(completions, done)]


def length_penalty(prompts: list, completions: list, completion_lengths: list | None = None,
                   max_new_tokens: int | None = None, **kwargs) -> list[float]:
    """-(tokens used / max_new_tokens), in [-1, 0]: shorter answers score higher."""
    if completion_lengths is None:
        completion_lengths = [len(c) if isinstance(c, str) else 0 for c in completions]
    cap = max_new_tokens or max(max(completion_lengths, default=1), 1)
    return [-min(n, cap) / cap for n in completion_lengths]


BUILTIN: dict[str, RewardFn] = {"correct": correct, "format": format_reward, "length": length_penalty}


def resolve(spec: str) -> RewardFn:
    """A built-in reward by name, or `module:function` imported from the Python path."""
    if spec in BUILTIN:
        return BUILTIN[spec]
    module, colon, attr = spec.partition(":")
    if not colon or not module or not attr:
        raise ValueError(f"unknown reward {spec!r}; valid: {', '.join(BUILTIN)} or module:function")
    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"cannot load reward {spec!r}: {e}") from None
    if not callable(fn):
        raise ValueError(f"reward {spec!r} is not callable")
    return fn


def metric_name(spec: str) -> str:
    return spec.rpartition(":")[2]


def combine(fns: dict[str, tuple[RewardFn, float]], prompts: list, completions: list,
            **kwargs) -> tuple[list[float], dict[str, list[float]]]:
    """Weighted total per completion, and each function's raw scores keyed by its metric name."""
    total = [0.0] * len(completions)
    parts = {}
    for spec, (fn, weight) in fns.items():
        scores = fn(prompts, completions, **kwargs)
        if len(scores) != len(completions):
            raise ValueError(f"reward {spec!r} returned {len(scores)} scores for {len(completions)} completions")
        # TRL lets a function return None for "does not apply"; it counts as 0 here
        scores = [0.0 if s is None else float(s) for s in scores]
        parts[metric_name(spec)] = scores
        total = [t + weight * s for t, s in zip(total, scores)]
    return total, parts
