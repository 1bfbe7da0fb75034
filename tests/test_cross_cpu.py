"""scripts/cross_cpu.py on planted sweeps: what counts as a difference between a committed run and its rerun."""
import importlib.util
import json

import numpy as np
import pandas as pd
import pytest

from helpers import ROOT

spec = importlib.util.spec_from_file_location("cross_cpu", ROOT / "scripts" / "cross_cpu.py")
XC = importlib.util.module_from_spec(spec)
spec.loader.exec_module(XC)


def _sweep(d, values, answers=None, runs=("a-s0-x", "a-s1-y")):
    d.mkdir()
    rows = [{"run": r, "variant": "a", "seed": s, "step": step, "metric": m, "value": v}
            for s, r in enumerate(runs) for step, (m, v) in enumerate(values)]
    rows += [{"run": r, "variant": "a", "seed": s, "step": 0, "metric": "time/step_s", "value": np.random.rand()}
             for s, r in enumerate(runs)]
    pd.DataFrame(rows).to_parquet(d / "metrics.parquet")
    pd.DataFrame({"run": list(runs), "variant": "a", "seed": range(len(runs)),
                  "final/eval/accuracy": [0.5, 0.25][:len(runs)]}).to_csv(d / "summary.csv", index=False)
    if answers is not None:
        pd.DataFrame([{"run": r, "variant": "a", "seed": s, "step": 0, "problem": p, "greedy": g, "k_correct": k}
                      for s, r in enumerate(runs) for p, (g, k) in enumerate(answers)]).astype(
            {"k_correct": "Int64"}).to_parquet(d / "outcomes.parquet")
    return d


VALUES = [("loss", 0.1), ("grad/norm", float("nan")), ("reward/mean", 0.75)]
ANSWERS = [(1, None), (0, 3)]


def test_the_same_bits_compare_equal_clocks_and_nan_aside(tmp_path):
    made, rerun = _sweep(tmp_path / "m", VALUES, ANSWERS), _sweep(tmp_path / "r", VALUES, ANSWERS)
    rows = XC.compare(made, rerun)
    assert [(r["seed"], r["values"], r["values_differ"], r["answers"], r["answers_differ"], r["final_accuracy"])
            for r in rows] == [(0, 3, 0, 2, 0, 0.5), (1, 3, 0, 2, 0, 0.25)]


def test_a_last_bit_a_missing_value_and_a_changed_answer_each_count(tmp_path):
    made = _sweep(tmp_path / "m", VALUES, ANSWERS)
    last_bit = [("loss", np.nextafter(0.1, 1.0)), ("grad/norm", float("nan")), ("reward/mean", 0.75)]
    rerun = _sweep(tmp_path / "r", last_bit, [(1, None), (0, 2)])
    rows = XC.compare(made, rerun)
    assert [(r["values_differ"], r["differ_metrics"], r["answers_differ"]) for r in rows] == [(1, "loss", 1)] * 2
    gone = _sweep(tmp_path / "g", VALUES[:2], [(1, 0), (0, 3)])   # a metric the rerun did not log; an answer now scored
    rows = XC.compare(made, gone)
    assert [(r["values_differ"], r["differ_metrics"], r["answers_differ"]) for r in rows] == [(1, "reward/mean", 1)] * 2


def test_a_metric_the_committed_sweep_never_logged_is_named_not_counted(tmp_path):
    """A rerun of a sweep made before a metric was added logs that metric too (adv_norm_sort's toy runs gained
    four length and reward spreads): nothing to compare it with, so it is named in new_metrics and every other
    value is still compared."""
    made = _sweep(tmp_path / "m", VALUES)
    added = VALUES + [("reward/group_std_cv", 0.3), ("response/length_cv", 0.0)]
    rows = XC.compare(made, _sweep(tmp_path / "r", added))
    assert [(r["values"], r["values_differ"], r["new_metrics"]) for r in rows] == [
        (3, 0, "response/length_cv reward/group_std_cv")] * 2
    changed = [("loss", 0.2), *added[1:]]
    rows = XC.compare(made, _sweep(tmp_path / "c", changed))
    assert [(r["values_differ"], r["differ_metrics"]) for r in rows] == [(1, "loss")] * 2


def test_only_the_reruns_runs_are_compared_and_an_unknown_run_is_refused(tmp_path):
    made = _sweep(tmp_path / "m", VALUES)
    rows = XC.compare(made, _sweep(tmp_path / "r", VALUES, runs=("a-s0-x",)))
    assert [(r["seed"], r["answers"]) for r in rows] == [(0, 0)]
    with pytest.raises(SystemExit, match="a-s0-other"):
        XC.compare(made, _sweep(tmp_path / "o", VALUES, runs=("a-s0-other",)))


def test_the_rerun_is_the_sweeps_own_command_with_seeds_workers_and_output_replaced(tmp_path):
    cmd = "run ablations/adv_norm.yaml --setting countdown --seeds 10 --workers 1 --no-progress --set lr=0.0001"
    assert XC.rerun_command(cmd, 2, tmp_path) == [
        "run", "ablations/adv_norm.yaml", "--setting", "countdown", "--set", "lr=0.0001",
        "--seeds", "2", "--workers", "2", "--no-progress", "--out", str(tmp_path)]
    assert XC.rerun_command("run a.yaml --seeds=5 --out=x --population 4", 1, tmp_path)[:2] == ["run", "a.yaml"]
    assert len(XC.rerun_command("run a.yaml --seeds=5 --out=x --population 4", 1, tmp_path)) == 9
    with pytest.raises(SystemExit, match="expected 'run"):
        XC.rerun_command("plot results/x", 1, tmp_path)


def test_the_committed_table_says_what_it_compared():
    """results/cross_cpu.csv: every committed rerun compared its sweep's runs on another processor, in full."""
    t = pd.read_csv(ROOT / "results/cross_cpu.csv")
    assert not t.duplicated(XC.KEY).any() and (t.made_on != t.rerun_on).all() and (t["values"] > 0).all()
    for sweep, g in t.groupby("sweep"):
        made = json.loads((ROOT / "results" / sweep / "sweep.json").read_text())
        assert set(g.made_on) == {made.get("cpu_model") or made["cpu"]}
        summary = pd.read_csv(ROOT / "results" / sweep / "summary.csv")
        for r in g.itertuples():   # the accuracy at stake is the committed run's
            want = summary[(summary.variant == r.variant) & (summary.seed == r.seed)]["final/eval/accuracy"]
            assert len(want) == 1 and (np.isnan(r.final_accuracy) and want.isna().all()
                                       or round(float(want.iloc[0]), 4) == r.final_accuracy)
