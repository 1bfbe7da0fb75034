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


def test_a_metric_whose_code_changed_since_the_sweep_is_compared_apart_with_its_size(tmp_path):
    """The spread diagnostics' root changed (CHANGED): a sweep made before holds the old root's values, so their
    differences are counted in changed_differ, measured in float32 units in the last place, and values_differ
    counts the rest."""
    values = [("loss", 0.1), ("response/length_cv", float(np.float32(0.7))), ("reward/group_std_cv", float(np.float32(0.3)))]
    made = _sweep(tmp_path / "m", values)
    one_up = float(np.nextafter(np.float32(0.7), np.float32(1)))
    two_down = float(np.nextafter(np.nextafter(np.float32(0.3), np.float32(0)), np.float32(0)))
    rerun = _sweep(tmp_path / "r", [("loss", 0.1), ("response/length_cv", one_up), ("reward/group_std_cv", two_down)])
    cols = ("values", "values_differ", "differ_metrics", "changed_metrics", "changed_differ", "changed_max_ulps")
    rows = XC.compare(made, rerun, {"response/length_cv", "reward/group_std_cv"})
    assert [tuple(r[c] for c in cols) for r in rows] == [
        (1, 0, "", "response/length_cv reward/group_std_cv", 2, 2.0)] * 2
    rows = XC.compare(made, rerun, {"response/length_cv"})   # a metric not named is counted as ever
    assert [tuple(r[c] for c in cols) for r in rows] == [
        (2, 1, "reward/group_std_cv", "response/length_cv", 1, 1.0)] * 2
    rows = XC.compare(made, rerun)
    assert [(r["values_differ"], r["changed_differ"], r["changed_max_ulps"]) for r in rows] == [(2, 0, 0.0)] * 2
    # a float64 value is measured in float64's units
    assert XC.ulps(np.array([0.1]), np.array([np.nextafter(0.1, 1.0)])).tolist() == [1.0]


def test_a_sweep_committed_before_a_change_has_its_metrics_set_apart(tmp_path, monkeypatch):
    """changed_since reads git history: a sweep whose metrics.parquet was last committed before the change holds
    the old code's values; one committed at or after it, or never committed, is compared in full."""
    import subprocess

    def git(*a):
        return subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *a], cwd=tmp_path, check=True,
                              capture_output=True, text=True).stdout.strip()

    def commit(path, msg):
        (tmp_path / path).parent.mkdir(exist_ok=True)
        (tmp_path / path).write_text(msg)
        git("add", path)
        git("commit", "-q", "-m", msg)
        return git("rev-parse", "HEAD")

    git("init", "-q")
    commit("before/metrics.parquet", "made before")
    change = commit("code.py", "the change")
    commit("after/metrics.parquet", "made after")
    monkeypatch.setattr(XC, "ROOT", tmp_path)
    monkeypatch.setattr(XC, "CHANGED", {change: ("m1", "m2"), git("rev-parse", "HEAD~2"): ("m0",)})
    assert XC.changed_since(tmp_path / "before") == {"m1", "m2"}
    assert XC.changed_since(tmp_path / "after") == set()
    (tmp_path / "loose").mkdir()
    assert XC.changed_since(tmp_path / "loose") == set()


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
        # what is set apart as changed code is the old root's last bits, not a difference of any size
        assert (g.changed_differ == 0).all() or (g.changed_max_ulps.max() <= 2 and g.changed_metrics.notna().all())
        for r in g.itertuples():   # the accuracy at stake is the committed run's
            want = summary[(summary.variant == r.variant) & (summary.seed == r.seed)]["final/eval/accuracy"]
            assert len(want) == 1 and (np.isnan(r.final_accuracy) and want.isna().all()
                                       or round(float(want.iloc[0]), 4) == r.final_accuracy)
