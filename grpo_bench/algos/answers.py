"""Answer parsing for the arithmetic rewards (grpo_bench/algos/rewards.py).

Model text is parsed with regular expressions, never evaluated.
"""
from __future__ import annotations

import re

# An integer, optionally with thousands separators and a zero fractional part
# ("1,234", "42.0"); the last one in the text is the answer, so echoed prompts
# ("17+25=42") and chatty answers ("The answer is 42.") both parse.
_NUMBER = re.compile(r"-?(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?")
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_BARE_INT = re.compile(r"\s*-?[0-9]+\s*")
# an answer worked out first: `(7+5=12 4+8+1=13)132`, the working in one pair of parentheses
_WORKED = re.compile(r"\s*\([^()]*\)\s*-?[0-9]+\s*")
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


def is_bare_int(text: str) -> bool:
    return isinstance(text, str) and _BARE_INT.fullmatch(text) is not None


def is_answer(text: str) -> bool:
    """A bare integer, or a parenthesised scratchpad followed by one."""
    return isinstance(text, str) and (_BARE_INT.fullmatch(text) is not None or _WORKED.fullmatch(text) is not None)
