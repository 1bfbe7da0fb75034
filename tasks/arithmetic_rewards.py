"""User rewards for the arithmetic task, named in a preset or ablation as `arithmetic_rewards:<function>`.

Each takes TRL's signature and the arithmetic task's keywords (answer, finished,
completion_lengths, max_new_tokens); model text is parsed, never evaluated.
"""
from __future__ import annotations

from grpo_bench.algos.answers import extract_answer


def digits(prompts: list, completions: list, answer: list | None = None, **kwargs) -> list[float]:
    """Partial credit: the share of the answer's digits right, aligned from the units digit.

    A denser signal than exact correctness for a model that gets carries wrong: `41` for
    42 scores 0.5, `142` for 42 scores 2/3 (the extra digit counts against it).
    """
    if answer is None:
        return [0.0] * len(completions)
    out = []
    for text, a in zip(completions, answer):
        got = extract_answer(text)
        if got is None:
            out.append(0.0)
            continue
        want, have = str(abs(a))[::-1], str(abs(got))[::-1]
        same = sum(x == y for x, y in zip(want, have)) if (got < 0) == (a < 0) else 0
        out.append(same / max(len(want), len(have)))
    return out
