"""Arithmetic problems: a seeded generator, a fixed held-out set, prompt templates, scratchpads.

Answers are computed from the operands with `operator`, never by evaluating a
string. The held-out set depends only on its own seed, so every variant and
every seed of an ablation is scored on the same problems, and the training
stream skips those problems and their commutative twins (a + b and b + a,
a * b and b * a), so held-out accuracy measures arithmetic learned rather than
answers memorised.
"""
from __future__ import annotations

import operator
import random
from dataclasses import dataclass
from functools import lru_cache

# name in YAML -> (symbol in the prompt, exact integer function)
COMMUTATIVE = ("add", "mul")
OPS = {
    "add": ("+", operator.add),
    "sub": ("-", operator.sub),
    "mul": ("*", operator.mul),
    "floordiv": ("//", operator.floordiv),
}
TEMPLATES = ("auto", "plain", "chat")
# how operands are drawn from an op's [lo, hi]: uniformly, or a digit count first (uniform
# over the counts the range holds), so 1-digit operands are as common as 4-digit ones
OPERANDS = ("uniform", "digits")
CHAT_INSTRUCTION = "Compute {a} {sym} {b}{note}. Reply with the integer only."


@dataclass(frozen=True)
class Problem:
    a: int
    op: str
    b: int

    @property
    def symbol(self) -> str:
        return OPS[self.op][0]

    @property
    def answer(self) -> int:
        return OPS[self.op][1](self.a, self.b)

    def plain(self) -> str:
        return f"{self.a}{self.symbol}{self.b}="

    def scratchpad(self) -> str:
        """The answer worked column by column from the units, then the result:
        347+85 -> `(7+5=12 4+8+1=13 3+0+1=4)432`. A column is `a+b=s`, with `+1` when a
        carry comes in; the missing digits of the shorter operand are 0. Its length grows
        with the operands' digits and their carries, and the parentheses make the first
        token say whether a completion works it out or answers at once."""
        if self.op != "add" or self.a < 0 or self.b < 0:
            raise ValueError(f"scratchpad: only for additions of non-negative operands, got {self.plain()}")
        a, b = str(self.a)[::-1], str(self.b)[::-1]
        steps, carry = [], 0
        for i in range(max(len(a), len(b))):
            x, y = int(a[i]) if i < len(a) else 0, int(b[i]) if i < len(b) else 0
            total = x + y + carry
            steps.append(f"{x}+{y}" + ("+1" if carry else "") + f"={total}")
            carry = total // 10
        return "(" + " ".join(steps) + f"){self.answer}"


def check_ops(ops: dict) -> None:
    """Raise ValueError("ops: ...") unless ops maps known names to [lo, hi] integer ranges."""
    if not ops:
        raise ValueError(f"ops: empty; give at least one of {', '.join(OPS)}")
    for name, rng in ops.items():
        if name not in OPS:
            raise ValueError(f"ops: unknown operation {name!r}; valid: {', '.join(OPS)}")
        if (not isinstance(rng, list) or len(rng) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in rng) or rng[0] > rng[1]):
            raise ValueError(f"ops: {name} needs an operand range [lo, hi] of integers with lo <= hi, got {rng!r}")
        if name == "floordiv" and rng == [0, 0]:
            raise ValueError("ops: floordiv needs a range with a non-zero divisor")


def check_scratchpad(ops: dict) -> None:
    """Raise ValueError("ops: ...") unless every problem of ops has a scratchpad (see Problem.scratchpad)."""
    if set(ops) != {"add"} or ops["add"][0] < 0:
        raise ValueError(f"ops: the scratchpad is written for additions of non-negative operands only, got {ops}")


def space_size(ops: dict) -> int:
    total = 0
    for name, (lo, hi) in ops.items():
        n = hi - lo + 1
        total += n * (n - (1 if name == "floordiv" and lo <= 0 <= hi else 0))
    return total


@lru_cache(maxsize=None)
def _digit_spans(lo: int, hi: int) -> tuple[tuple[tuple[int, int], ...], ...]:
    """[lo, hi] cut by the digit count of |x|: per count present, its spans (the negatives, the positives)."""
    out = []
    for d in range(1, len(str(max(abs(lo), abs(hi)))) + 1):
        first, last = (0 if d == 1 else 10 ** (d - 1)), 10 ** d - 1
        spans = [(a, b) for a, b in ((max(lo, -last), min(hi, -max(first, 1))), (max(lo, first), min(hi, last)))
                 if a <= b]
        if spans:
            out.append(tuple(spans))
    return tuple(out)


def _operand(lo: int, hi: int, rng: random.Random, operands: str) -> int:
    if operands == "uniform":
        return rng.randint(lo, hi)
    spans = rng.choice(_digit_spans(lo, hi))  # a digit count, uniformly, then a value of that many digits
    k = rng.randrange(sum(b - a + 1 for a, b in spans))
    for a, b in spans:
        if k <= b - a:
            return a + k
        k -= b - a + 1
    raise AssertionError("unreachable")


def sample(ops: dict, rng: random.Random, operands: str = "uniform") -> Problem:
    name = rng.choice(sorted(ops))
    lo, hi = ops[name]
    a = _operand(lo, hi, rng, operands)
    b = _operand(lo, hi, rng, operands)
    while name == "floordiv" and b == 0:
        b = _operand(lo, hi, rng, operands)
    return Problem(a, name, b)


def extremes(ops: dict) -> list[Problem]:
    """Problems whose operands are each range's ends: the widest any problem renders (a sign counts)."""
    return [Problem(a, name, b) for name, (lo, hi) in ops.items() for a in (lo, hi) for b in (lo, hi)]


def heldout(ops: dict, size: int, seed: int, operands: str = "uniform") -> list[Problem]:
    """`size` distinct problems drawn with their own seed (check() keeps size well under the space)."""
    rng = random.Random(seed)
    seen: dict[Problem, None] = {}
    while len(seen) < size:
        seen.setdefault(sample(ops, rng, operands), None)
    return list(seen)


def exclusion(heldout: list[Problem]) -> set[Problem]:
    """What the training stream must never show: the held-out problems and their commutative
    twins (25+17 answers 17+25 as surely as 17+25 itself)."""
    out = set(heldout)
    out.update(Problem(p.b, p.op, p.a) for p in heldout if p.op in COMMUTATIVE)
    return out


def train_batch(ops: dict, n: int, rng: random.Random, exclude: set[Problem],
                operands: str = "uniform") -> list[Problem]:
    out = []
    while len(out) < n:
        p = sample(ops, rng, operands)
        if p not in exclude:
            out.append(p)
    return out


def resolve_template(template: str, tokenizer) -> str:
    if template == "auto":
        return "chat" if getattr(tokenizer, "chat_template", None) else "plain"
    return template


def render(problem: Problem, template: str, tokenizer, system: str = "", prefix: str = "") -> str:
    """The prompt text; `template` is already resolved to plain or chat. system and prefix: see chat()."""
    if template == "plain":
        return problem.plain()
    note = " (floor division)" if problem.op == "floordiv" else ""
    content = CHAT_INSTRUCTION.format(a=problem.a, sym=problem.symbol, b=problem.b, note=note)
    return chat(tokenizer, content, system, prefix.format(a=problem.a, sym=problem.symbol, b=problem.b))


def chat(tokenizer, content: str, system: str = "", prefix: str = "") -> str:
    """A user turn through the tokenizer's chat template with the assistant's turn opened: after a system
    message where `system` is given (else the template's own, if it has one), and begun with `prefix`, which
    is then part of the prompt and never of the completion that is scored."""
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": content}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + prefix
