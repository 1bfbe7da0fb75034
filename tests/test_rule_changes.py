"""rule_changes: the v3 -> v4 replay FINDINGS appends (results/FINDINGS_rules.md), on a planted results root small enough
to read by hand: one cell for each of four of v4's steps (a seeds x problems df jump, the task margin, the size words,
the mechanism rule), cells that stay (an equivalence, a not-testable pair, an ordering outside the run), and the margin
sensitivity of each. (The committed page is held to the committed results by test_findings, at 90 s a run.)"""
import numpy as np
import pandas as pd
import pytest

from grpo_bench import stats
from grpo_bench.analysis import rule_changes as RC
from grpo_bench.analysis.findings_text import RULES_FILE
from grpo_bench.store import metrics as M
from test_findings import LM, write
from test_mechanism import results


def planted(tmp_path):
    # mechx: a beats b and c by 0.4; b's clip diagnostic is 0 (under its 0.01), c's 0.02: a > b not exercised in v4
    results(tmp_path, {"b": [0.0, 0.0], "c": [0.02, 0.02]})
    # wordx (margin 0.05): a - c is 0.061 on average over 6 paired seeds, significant, but with seeds this noisy its
    # interval reaches inside 0.05; a - b is 0.4; e ran b's numbers (not testable), f is b within 0.001 (equivalent);
    # d never ran (its ordering is outside the run: no cell)
    rng = np.random.default_rng(1)
    vals = {"a": 0.60 + 0.02 * rng.standard_normal(6), "c": 0.54 + 0.02 * rng.standard_normal(6),
            "b": 0.2 + 0.01 * rng.standard_normal(6)}
    vals |= {"e": vals["b"].copy(), "f": vals["b"] + 0.001 * rng.standard_normal(6)}
    write(tmp_path / "wordx_sort", "wordx", "sort", vals,
          {"text": "w", "source": "s", "expect": ["a > c", "a > b", "b = f", "b > e", "a > d"], "margin": 0.05})
    # marginx (no margin of its own): a - b is 0.019, exact to 0.0005: within v3's 5% of the toy's headroom, beyond
    # v4's odds-ratio 0.01
    m = {"a": 0.52 + 0.0005 * rng.standard_normal(6), "b": 0.5 + 0.0005 * rng.standard_normal(6)}
    write(tmp_path / "marginx_sort", "marginx", "sort", m, {"text": "m", "source": "s", "expect": ["a > b"]})
    # crossedx: 3 seeds x 60 held-out problems, a's edge on a few problems and not on every seed: the seeds x
    # problems test's seed term comes out negative, v3 drops it (df 59, the problems') and v4 floors it (df ~7)
    rng = np.random.default_rng(45)
    base = rng.random(60) < 0.5
    outcome = {("b", s): base & (rng.random(60) > 0.05) for s in range(3)}
    gain = rng.random(60) < 0.08
    outcome |= {("a", s): outcome[("b", s)] | (gain & (rng.random(60) > 0.3)) for s in range(3)}
    d = tmp_path / "crossedx_lm"
    write(d, "crossedx", "lm", {v: [float(outcome[(v, s)].mean()) for s in range(3)] for v in "ab"},
          {"text": "c", "source": "s", "expect": ["a > b"], "margin": {"lm": 0.01}}, column=LM)
    pd.DataFrame([{"run": f"{v}-s{s}", "variant": v, "seed": s, "step": step, "problem": j,
                   "greedy": int(outcome[(v, s)][j]), "k_correct": None}
                  for (v, s) in outcome for step in (0, 59) for j in range(60)]).to_parquet(d / "outcomes.parquet")


def test_each_move_is_put_down_to_the_step_that_made_it(tmp_path):
    planted(tmp_path)
    text = RC.render(tmp_path)
    assert "FINDINGS v4 changes seven of v3's" in text
    # 8 cells (a > d never ran), 6 testable (b > e ran the same numbers, mechx's a > b had nothing to act on)
    assert ("8 cells, 6 testable under v4" in text and "4 of 8 cells moved. The cell's own verdict (its outcome on "
            "its task) moved in 4; rows at a plateau: 0 under v3, 0 under v4." in text)
    steps = {n: line.rsplit(" | ", 2)[1:] for n, _, why in RC.STEPS for line in text.splitlines()
             if line.startswith(f"| {n} | {why} | ")}
    assert list(steps) == [s for s, _, _ in RC.STEPS]
    assert {s: c for s, c in steps.items() if c != ["0", "0 |"]} == {
        "crossed": ["1", "1 |"], "margins": ["1", "1 |"], "words": ["1", "1 |"], "mechanism": ["1", "1 |"]}
    assert "\n| claim | task | ordering | v3 | v4 | moved at |\n|---|---|---|---|---|---|\n| [crossedx]" in text
    assert "**Sensitivity to the margin.** Every v4 verdict judged again" in text
    moved = [line for line in text.splitlines() if line.startswith("| [")]
    assert moved == [
        "| [crossedx](FINDINGS.md#crossedx) | arithmetic LM | `a > b` | holds | **undecided** | crossed |",
        "| [marginx](FINDINGS.md#marginx) | sorting toy | `a > b` | holds, negligible | **holds** | margins |",
        "| [mechx](FINDINGS.md#mechx) | sorting toy | `a > b` | holds | **not exercised** | mechanism |",
        "| [wordx](FINDINGS.md#wordx) | sorting toy | `a > c` | holds | **holds, size unclear** | words |"]
    # the df jump: the same difference and variance, the problems' 59 df against the floored seed term's
    crossed = next(line for line in text.splitlines() if line.startswith("| crossedx |"))
    v3, after = crossed.split(" | ")[3:5]
    assert v3.startswith("59, 0.03") and v3.endswith(", holds") and after.endswith(", undecided |")
    assert 5 < float(after.split(",")[0]) < 10 and "In 1 crossed rows" in text
    # half the margins: marginx's 0.019 against 0.005 is clear of it but not by its interval, wordx's 0.061 clears
    # 0.025; twice them: marginx's interval reaches inside 0.02, wordx's lies inside 0.1
    assert ("| × 0.5 | 1 of 6 | wordx sorting toy `a > c`: holds, size unclear → holds |" in text)
    assert ("| × 2 | 2 of 6 | marginx sorting toy `a > b`: holds → holds, size unclear; wordx sorting toy `a > c`: "
            "holds, size unclear → holds, negligible |" in text)
    RC.main([str(tmp_path)])
    assert (tmp_path / RULES_FILE).read_text() == text


def test_each_cell_is_its_verdict_family_plateau_and_numbers(tmp_path):
    """cells(): a claimed equality holds in its family by its verdict (its outcome reads 'equivalent'), a pair that
    ran the same numbers and one whose mechanism never acted carry no family, plateau or numbers, and an ordering
    whose variant never ran is no cell."""
    planted(tmp_path)
    cells = RC.cells(tmp_path, RC.collect(tmp_path)[0], stats.V4, RC.margin_v4)
    assert cells[("wordx", "sort", "b = f")][:3] == ("holds", True, False)
    assert cells[("wordx", "sort", "b > e")] == ("not testable", False, False, None, None, None, None)
    assert cells[("mechx", "sort", "a > b")] == ("not exercised", False, False, None, None, None, None)
    assert ("wordx", "sort", "a > d") not in cells
    verdict, fam, flat, diff, df, p, margin = cells[("marginx", "sort", "a > b")]
    assert (verdict, fam, flat, margin) == ("holds", True, False, 0.01) and diff == pytest.approx(0.02, abs=2e-3)


def test_a_holding_cell_outside_its_claims_family_says_so():
    assert RC._word(("holds", False, False)) == "holds (not in the claim's family across tasks)"
    assert RC._word(("holds", True, True)) == "holds, at a plateau"
    assert RC._word(("reversed", False, False)) == "reversed"


def test_v3s_margins_as_v3_took_them():
    """A claim's number; "P% of VARIANT" from that variant's judged mean; else 5% of what the task's default recipe
    moves its verdict metric (v4 takes an odds ratio there), on that metric only; else the metric's; kl_gradients'
    v3 numbers whatever its file says now."""
    task = M.declared_task("arithmetic")
    col = "final/eval/accuracy"
    assert RC.margin_v3({"margin": {"lm": 0.1}}, "lm", col, task, {}) == (0.1, "v3: the claim's margin", False)
    assert RC.margin_v3({"margin": "5% of none"}, "lm", col, task, {"none": -0.8}) == (
        0.04, "v3: 5% of none (from the judged runs)", False)
    start, end = task.headroom
    assert RC.margin_v3({}, "lm", col, task, {}) == (round(0.05 * abs(end - start), 3),
                                                     "v3: 5% of what the default recipe moves", False)
    other = "final/response/length_incorrect"
    assert RC.margin_v3({}, "lm", other, task, {}) == (M.get(other).margin, "v3: the metric's", False)
    assert RC.margin_v3({}, "lm", col, None, {}) == (M.get(col).margin, "v3: the metric's", False)
    kl = {"text": "k1 in the loss does not regularise", "margin": 0.3}
    assert RC.margin_v3(kl, "sort", col, task, {})[0] == 0.6 and RC.margin_v3(kl, "lm", col, task, {})[0] == 0.08


def test_main_reads_results_by_default_and_says_where_it_wrote(tmp_path, monkeypatch, capsys):
    planted(tmp_path)
    monkeypatch.chdir(tmp_path.parent)
    monkeypatch.setattr(RC, "render", lambda root: f"rendered {root}\n")
    monkeypatch.setattr("sys.argv", ["rule_changes", tmp_path.name])
    RC.main()
    assert (tmp_path / RULES_FILE).read_text() == f"rendered {tmp_path.name}\n"
    assert capsys.readouterr().out == f"{tmp_path.name}/{RULES_FILE}\n"
