"""rule_changes: the v3 -> v4 replay FINDINGS appends (results/FINDINGS_rules.md), on a planted results root small enough
to read by hand: one cell moved by v4's size words, one by the mechanism rule, two that stay, and the margin
sensitivity of each. (The committed page is held to the committed results by test_findings, at 90 s a run.)"""
import numpy as np

from grpo_bench.analysis import rule_changes as RC
from grpo_bench.analysis.findings_text import RULES_FILE
from test_findings import write
from test_mechanism import results


def planted(tmp_path):
    # mechx: a beats b and c by 0.4; b's clip diagnostic is 0 (under its 0.01), c's 0.02: a > b not exercised in v4
    results(tmp_path, {"b": [0.0, 0.0], "c": [0.02, 0.02]})
    # wordx: a - c is 0.061 on average over 6 paired seeds, significant, but with seeds this noisy its interval
    # reaches inside the claim's 0.05; a - b is 0.4
    rng = np.random.default_rng(1)
    vals = {"a": 0.60 + 0.02 * rng.standard_normal(6), "c": 0.54 + 0.02 * rng.standard_normal(6),
            "b": 0.2 + 0.01 * rng.standard_normal(6)}
    write(tmp_path / "wordx_sort", "wordx", "sort", vals,
          {"text": "w", "source": "s", "expect": ["a > c", "a > b"], "margin": 0.05})
    return vals


def test_each_move_is_put_down_to_the_step_that_made_it(tmp_path):
    vals = planted(tmp_path)
    d = vals["a"] - vals["c"]
    assert abs(d.mean() - 0.061) < 5e-4 and d.min() < 0.05   # what the planted cell is: a mean beyond δ, seeds inside
    text = RC.render(tmp_path)
    assert "FINDINGS v4 changes seven of v3's" in text
    assert ("4 cells, 3 testable under v4" in text and "2 of 4 cells moved. The cell's own verdict (its outcome on "
            "its task) moved in 2; rows at a plateau: 0 under v3, 0 under v4." in text)
    steps = {n: line.rsplit(" | ", 2)[1:] for n, _, why in RC.STEPS for line in text.splitlines()
             if line.startswith(f"| {n} | {why} | ")}
    assert list(steps) == [s for s, _, _ in RC.STEPS]
    assert {s: c for s, c in steps.items() if c != ["0", "0 |"]} == {"words": ["1", "1 |"], "mechanism": ["1", "1 |"]}
    moved = [line for line in text.splitlines() if line.startswith("| [")]
    assert moved == ["| [mechx](FINDINGS.md#mechx) | sorting toy | `a > b` | holds | **not exercised** | mechanism |",
                     "| [wordx](FINDINGS.md#wordx) | sorting toy | `a > c` | holds | **holds, size unclear** | words |"]
    assert "In 0 crossed rows" in text
    # half the margin (0.025) clears the interval; twice it (0.1) contains it; a - b moves at neither
    assert "| × 0.5 | 1 of 3 | wordx sorting toy `a > c`: holds, size unclear → holds |" in text
    assert "| × 2 | 1 of 3 | wordx sorting toy `a > c`: holds, size unclear → holds, negligible |" in text
    RC.main([str(tmp_path)])
    assert (tmp_path / RULES_FILE).read_text() == text


def test_a_holding_cell_outside_its_claims_family_says_so():
    assert RC._word(("holds", False, False)) == "holds (not in the claim's family across tasks)"
    assert RC._word(("holds", True, True)) == "holds, at a plateau"
    assert RC._word(("reversed", False, False)) == "reversed"


def test_v3s_margins_as_v3_took_them():
    """A claim's number; "P% of VARIANT" from that variant's judged mean; else 5% of what the task's default recipe
    moves its verdict metric (v4 takes an odds ratio there); kl_gradients' v3 numbers whatever its file says now."""
    from grpo_bench.store import metrics as M
    task = M.declared_task("arithmetic")
    col = "final/eval/accuracy"
    assert RC.margin_v3({"margin": {"lm": 0.1}}, "lm", col, task, {}) == (0.1, "v3: the claim's margin", False)
    assert RC.margin_v3({"margin": "5% of none"}, "lm", col, task, {"none": -0.8}) == (
        0.04, "v3: 5% of none (from the judged runs)", False)
    start, end = task.headroom
    assert RC.margin_v3({}, "lm", col, task, {}) == (round(0.05 * abs(end - start), 3),
                                                     "v3: 5% of what the default recipe moves", False)
    kl = {"text": "k1 in the loss does not regularise", "margin": 0.3}
    assert RC.margin_v3(kl, "sort", col, task, {})[0] == 0.6 and RC.margin_v3(kl, "lm", col, task, {})[0] == 0.08
