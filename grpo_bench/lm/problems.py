"""Arithmetic problems: a seeded generator, a fixed held-out set, prompt templates.

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

# name in YAML -> (symbol in the prompt, exact integer function)
COMMUTATIVE = ("add", "mul")
OPS = {
    "add": ("+", operator.add),
    "sub": ("-", operator.sub),
    "mul": ("*", operator.mul),
    "floordiv": ("//", operator.floordiv),
}
TEMPLATES = ("auto", "plain", "chat")
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


def space_size(ops: dict) -> int:
    total = 0
    for name, (lo, hi) in ops.items():
        n = hi - lo + 1
        total += n * (n - (1 if name == "floordiv" and lo <= 0 <= hi else 0))
    return total


def sample(ops: dict, rng: random.Random) -> Problem:
    name = rng.choice(sorted(ops))
    lo, hi = ops[name]
    a = rng.randint(lo, hi)
    b = rng.randint(lo, hi)
    while name == "floordiv" and b == 0:
        b = rng.randint(lo, hi)
    return Problem(a, name, b)


def extremes(ops: dict) -> list[Problem]:
    """Problems whose operands are each range's ends: the widest any problem renders (a sign counts)."""
    return [Problem(a, name, b) for name, (lo, hi) in ops.items() for a in (lo, hi) for b in (lo, hi)]


def heldout(ops: dict, size: int, seed: int) -> list[Problem]:
    """`size` distinct problems drawn with their own seed (check() keeps size well under the space)."""
    rng = random.Random(seed)
    seen: dict[Problem, None] = {}
    while len(seen) < size:
        seen.setdefault(sample(ops, rng), None)
    return list(seen)


def exclusion(heldout: list[Problem]) -> set[Problem]:
    """What the training stream must never show: the held-out problems and their commutative
    twins (25+17 answers 17+25 as surely as 17+25 itself)."""
    out = set(heldout)
    out.update(Problem(p.b, p.op, p.a) for p in heldout if p.op in COMMUTATIVE)
    return out


def train_batch(ops: dict, n: int, rng: random.Random, exclude: set[Problem]) -> list[Problem]:
    out = []
    while len(out) < n:
        p = sample(ops, rng)
        if p not in exclude:
            out.append(p)
    return out


def resolve_template(template: str, tokenizer) -> str:
    if template == "auto":
        return "chat" if getattr(tokenizer, "chat_template", None) else "plain"
    return template


def render(problem: Problem, template: str, tokenizer) -> str:
    """The prompt text; `template` is already resolved to plain or chat."""
    if template == "plain":
        return problem.plain()
    note = " (floor division)" if problem.op == "floordiv" else ""
    content = CHAT_INSTRUCTION.format(a=problem.a, sym=problem.symbol, b=problem.b, note=note)
    return tokenizer.apply_chat_template([{"role": "user", "content": content}],
                                         tokenize=False, add_generation_prompt=True)
