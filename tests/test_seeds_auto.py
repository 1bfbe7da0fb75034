"""`run --seeds auto[:CAP]` end to end on the sorting toy: where it stops, why, and that a resumed sweep stops there too.

The budget is tiny (10 epochs x 4 steps, ~0.05 s a run) and chosen so that the pairs separate, or do
not, by a wide margin: lr 1e-6 barely moves the policy (final reward ~0.065), lr 0.003 learns
(~0.12; paired difference 0.052, sd 0.015 over 20 seeds), lr 0.1 is erratic (0.003 vs 0.1: difference
0.009, sd 0.032). The statistics themselves (boundaries, false-positive rate, power) are tested in
test_stats.py; these tests check the loop around them.
"""
import json

import pandas as pd
import pytest
import yaml

from grpo_bench.sweep import runner as RN
from grpo_bench.__main__ import main
from grpo_bench.config.ablation import load_ablation

TINY = {"task": "sort_hard", "epochs": 10, "inner_steps": 4}
STILL, MOVING, WILD = {"lr": 1.0e-6}, {"lr": 0.003}, {"lr": 0.1}
TWIN = {"lr": 1.1e-6}  # another config with the same numbers at this budget (a claim may not name one config twice)


@pytest.fixture(autouse=True)
def _torch_threads():
    import torch
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)  # train_group sets it for the runs it trains in this process


def write(tmp_path, variants, claim=None, name="abl"):
    doc = {"name": name, **({"claim": claim} if claim else {}), "base": TINY, "variants": variants}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def sweep(path, out, cap, population=None):
    """An auto sweep in this process (no report): the runner's loop as `run --seeds auto:CAP` drives it."""
    RN.run_ablation(load_ablation(path, seeds=cap), out, workers=1, threads=1, progress=False, sequential=True,
                    population=population)
    return json.loads((out / "sweep.json").read_text())


def decisions(s: dict) -> dict:
    return {r["ordering"]: (r["outcome"], r["n"], r["look"]) for r in s["orderings"]}


def test_a_clear_difference_stops_before_the_cap(tmp_path, capsys):
    path = write(tmp_path, {"still": STILL, "moving": MOVING})
    out = tmp_path / "out"
    assert main(["run", str(path), "--seeds", "auto:40", "--out", str(out), "--workers", "1", "--no-progress"]) == 0
    s = json.loads((out / "sweep.json").read_text())
    # look 1 (5 pairs: the boundary is z = 6.23 at 1/8 of the cap) cannot decide it; look 2 (z = 4.33) does
    assert (s["stopped"], s["reason"], s["looks"], s["seeds"]) == ("decided", "every ordering decided", [5, 10],
                                                                  list(range(10)))
    assert decisions(s) == {"still vs moving": ("moving > still", 10, 1)}
    assert s["seeds_per_variant"] == {"still": 10, "moving": 10} and s["sequential"] == {"cap": 40, "batch": 5,
                                                                                       "orderings": 1}
    # decided on the toy's verdict metric (held-out greedy reward) with its task's margin
    assert (s["metric"], s["margin"], s["runs"], s["skipped"]) == ("final/eval/reward", 0.01, 20, 0)
    meta = json.loads((out / "ablation.json").read_text())
    assert meta["seeds"] == list(range(10)) and len(meta["runs"]) == 20
    assert meta["sequential"]["stopped"] == "decided"
    summary = pd.read_csv(out / "summary.csv")
    assert len(summary) == 20 and (summary.status == "ok").all() and len(list((out / "runs").iterdir())) == 20
    # the decision is the one stats makes of the summary's values
    by = {v: dict(zip(g.seed, g["final/eval/reward"])) for v, g in summary.groupby("variant")}
    assert min(by["moving"][k] - by["still"][k] for k in range(10)) > 0
    report = (out / "REPORT.md").read_text()
    assert ("Seeds were chosen sequentially (`--seeds auto:40`): after each batch of 5" in report
            and "O'Brien–Fleming-type alpha spending" in report and "every ordering was decided at 10 seeds" in report)
    err = capsys.readouterr().err
    assert "look 1 at 5 seeds: 1 of 1 orderings undecided" in err and "look 2 at 10 seeds: every ordering decided" in err


def test_identical_variants_are_equivalent_at_the_first_look(tmp_path):
    # one config under two names: the runs of a seed are the same numbers, every paired difference is 0, so
    # TOST's statistics are infinite (margin / 0): equivalent within the margin, never an ordering (0 / 0)
    out = tmp_path / "out"
    s = sweep(write(tmp_path, {"still": STILL, "twin": STILL}), out, 40)
    assert (s["stopped"], s["looks"]) == ("decided", [5])
    assert decisions(s) == {"still vs twin": ("equivalent within ±0.01", 5, 0)}
    summary = pd.read_csv(out / "summary.csv")
    a, b = (summary[summary.variant == v].set_index("seed")["final/reward"] for v in ("still", "twin"))
    assert a.equals(b)


def test_a_claim_decides_its_orderings_with_its_margin(tmp_path):
    # `wild` vs anything stays undecided (see test_the_cap); a plain ablation would ask it and run to the cap
    claim = {"text": "t", "source": "s", "expect": ["moving > still", "twin = still"], "margin": 0.01}
    path = write(tmp_path, {"still": STILL, "twin": TWIN, "moving": MOVING, "wild": WILD}, claim)
    s = sweep(path, tmp_path / "out", 40)
    assert (s["stopped"], s["looks"], s["margin"], s["margin_source"]) == ("decided", [5, 10], 0.01, "the claim's margin")
    assert decisions(s) == {"moving > still": ("moving > still", 10, 1), "twin = still": ("equivalent within ±0.01", 10, 0)}
    assert "at alpha / 2" in s["correction"] and s["seeds_per_variant"]["wild"] == 10


def test_the_cap(tmp_path):
    # a cap that is no multiple of the batch: looks at 5 and 7; on the sampled reward (the claim's metric),
    # where lr 0.003 and 0.1 do not separate
    claim = {"text": "t", "source": "s", "expect": ["moving > wild"], "metric": "final/reward"}
    s = sweep(write(tmp_path, {"moving": MOVING, "wild": WILD}, claim), tmp_path / "out", 7)
    assert (s["stopped"], s["reason"], s["looks"], s["seeds"]) == ("cap", "cap of 7 seeds reached", [5, 7], list(range(7)))
    assert s["metric"] == "final/reward" and decisions(s) == {"moving > wild": (None, 7, -1)}
    assert s["orderings"][0]["why"] == "undecided after 7 pairs (the cap)"


def test_a_sweep_that_decides_some_orderings_stops_at_the_cap_as_capped(tmp_path):
    # moving > still is decided (by look 2 at the latest), moving > wild never is: the sweep stops because of the cap
    claim = {"text": "t", "source": "s", "expect": ["moving > still", "moving > wild"], "metric": "final/reward"}
    s = sweep(write(tmp_path, {"still": STILL, "moving": MOVING, "wild": WILD}, claim), tmp_path / "out", 7)
    assert (s["stopped"], s["reason"]) == ("cap", "cap of 7 seeds reached")
    got = decisions(s)
    assert got["moving > still"][0] == "moving > still" and got["moving > wild"] == (None, 7, -1)
    assert list(s["seeds_per_variant"]) == ["moving", "still", "wild"]   # sorted, whatever order the runs finished in


def test_interrupted_sweep_resumes_to_the_same_decision(tmp_path, monkeypatch, capsys):
    path = write(tmp_path, {"still": STILL, "moving": MOVING})
    whole = sweep(path, tmp_path / "whole", 40, population=1)  # one run a process: the same looks and numbers
    out = tmp_path / "cut"
    real, written = RN.write_run, []

    def write_run(out_, spec, result):  # Ctrl-C after 13 runs: batch 1 (10 runs) and 3 of batch 2
        if len(written) == 13:
            raise KeyboardInterrupt
        written.append(spec.run_id)
        real(out_, spec, result)

    monkeypatch.setattr(RN, "write_run", write_run)
    with pytest.raises(KeyboardInterrupt):
        sweep(path, out, 40)
    cut = json.loads((out / "sweep.json").read_text())
    assert (cut["stopped"], cut["looks"], cut["runs"]) == ("interrupted", [5], 10)
    assert decisions(cut) == {"still vs moving": (None, 5, -1)}
    assert len(list((out / "runs").iterdir())) == 13
    monkeypatch.setattr(RN, "write_run", real)
    resumed = sweep(path, out, 40)
    assert "13 of 20 runs already finished" in capsys.readouterr().err
    assert (resumed["runs"], resumed["skipped"]) == (7, 13)  # only what the first sweep had not finished
    same = ("stopped", "reason", "looks", "seeds", "seeds_per_variant", "orderings", "metric", "margin", "sequential")
    assert {k: resumed[k] for k in same} == {k: whole[k] for k in same}
    a, b = (pd.read_csv(d / "summary.csv").set_index("run")["final/reward"] for d in (tmp_path / "whole", out))
    assert a.sort_index().equals(b.sort_index())  # the same runs, to the bit
    # a finished sweep run again runs nothing and replays the same looks; its timing is the sweep's that ran
    again = sweep(path, out, 40)
    assert again == resumed and len(list((out / "runs").iterdir())) == 20
    # another cap is refused: its looks would test the seeds already judged again, at new fractions
    # (family-wise error 0.078 in simulation); nothing runs and the records stay as they were
    from grpo_bench.errors import ConfigError
    for cap in (60, 20):
        with pytest.raises(ConfigError, match=rf"--seeds: auto:{cap}: .*cut was run with --seeds auto:40; resume it "
                                              "with auto:40"):
            sweep(path, out, cap)
    assert json.loads((out / "sweep.json").read_text()) == resumed and len(list((out / "runs").iterdir())) == 20


def test_failed_runs_stop_the_sweep(tmp_path, capsys):
    path = write(tmp_path, {"still": STILL, "bad": {"optimizer": "sgd", "lr": 1e30}})  # a non-finite loss
    out = tmp_path / "out"
    assert main(["run", str(path), "--seeds", "auto:40", "--out", str(out), "--workers", "1", "--no-progress"]) == 1
    s = json.loads((out / "sweep.json").read_text())
    assert (s["stopped"], s["looks"], s["seeds"]) == ("failed", [5], list(range(5)))
    assert s["reason"].startswith("5 of 10 runs failed")
    assert "the sweep stopped because runs failed at 5 seeds" in (out / "REPORT.md").read_text()


@pytest.mark.parametrize("value, words", [
    ("auto:", ["expected N (seeds 0..N-1), auto or auto:CAP", "'auto:'"]),
    ("auto:x", ["auto:CAP", "'auto:x'"]),
    ("auto:40:5", ["auto:CAP", "'auto:40:5'"]),
    ("automatic", ["auto:CAP", "'automatic'"]),
    ("2.5", ["auto:CAP", "'2.5'"]),
    ("auto:2", ["a cap of at least 3 seeds", "'auto:2'"]),
    ("auto:-1", ["a cap of at least 3 seeds"]),
    ("0", ["must be >= 1, got 0"]),
    ("auto:1000000000000", ["at most 100000", "1000000000000"]),
])
def test_bad_seeds_is_one_line_exit_2(tmp_path, capsys, value, words):
    path = write(tmp_path, {"still": STILL, "moving": MOVING})
    code = main(["run", str(path), "--seeds", value, "--out", str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("error: --seeds: seeds: "), err
    for w in words:
        assert w in err, (w, err)
    assert not (tmp_path / "out").exists()


def test_one_variant_has_nothing_to_decide(tmp_path, capsys):
    path = write(tmp_path, {"still": STILL})
    code = main(["run", str(path), "--seeds", "auto", "--out", str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err == (f"error: --seeds: auto: {path} has one variant: there is no ordering for more "
                                 "seeds to decide; give a number of seeds")
    assert not (tmp_path / "out").exists()


def test_a_resumed_sweep_counts_each_skipped_run_once(tmp_path, capsys):
    # issue 31: a resumed sweep counted the runs it found finished once per look. Another cap is refused
    # now (issue 27), so the resume here is of a sweep whose last look's runs were lost (killed)
    import shutil

    path, out = write(tmp_path, {"moving": MOVING, "wild": WILD}), tmp_path / "out"
    first = sweep(path, out, 15)
    assert first["looks"] == [5, 10] and (first["runs"], first["skipped"]) == (20, 0)
    # the second look's plan holds the first look's runs, run by this sweep: not "already finished"
    assert "already finished" not in capsys.readouterr().err
    for d in (out / "runs").iterdir():
        if int(d.name.rsplit("-s", 1)[1].split("-")[0]) >= 5:   # the second look's runs were lost
            shutil.rmtree(d)
    s = sweep(path, out, 15)
    assert s["looks"] == first["looks"] and s["stopped"] == first["stopped"]
    assert (s["runs"], s["skipped"]) == (10, 10)   # the first look's 10 counted once, not at each look
