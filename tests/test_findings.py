"""FINDINGS.md from results alone: Welch effect sizes, Holm, verdicts, toy-vs-LM tau; ablation settings and claims."""
import json
import math

import re

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy import stats

from grpo_bench.config import ConfigError, ablation_settings, load_ablation
from grpo_bench.findings import holm, render, judge_setting, verdict, welch


def write(path, name, setting, values, claim, column="final/reward"):
    """A results directory with one summary column: values = {variant: [per-seed values]}."""
    path.mkdir(parents=True)
    rows = [{"run": f"{v}-s{i}", "variant": v, "seed": i, "status": "ok", "error": "", "wall_s": 1.0, column: x}
            for v, xs in values.items() for i, x in enumerate(xs)]
    pd.DataFrame(rows).to_csv(path / "summary.csv", index=False)
    meta = {"name": f"{name}_{setting}", "source": f"ablations/{name}.yaml", "variants": list(values),
            "seeds": list(range(len(next(iter(values.values()))))), "runs": [r["run"] for r in rows],
            "claim": claim, "setting": setting}
    (path / "ablation.json").write_text(json.dumps(meta))
    (path / "sweep.json").write_text(json.dumps({"wall_s": 90.0, "runs": len(rows), "skipped": 0, "where": "local: 2 workers",
                                                 "threads": 1, "cpus": 2, "cpu": "Test CPU", "load_avg_end": 1.0,
                                                 "command": "run"}))


def test_welch_interval_and_p_against_scipy():
    x, y = np.array([0.51, 0.55, 0.49, 0.6, 0.52]), np.array([0.40, 0.47, 0.44, 0.38])
    diff, lo, hi, p = welch(x, y)
    ref = stats.ttest_ind(x, y, equal_var=False)
    assert p == pytest.approx(ref.pvalue, rel=1e-9)
    assert diff == pytest.approx(x.mean() - y.mean())
    ci = ref.confidence_interval(0.95)
    assert (lo, hi) == (pytest.approx(ci.low, rel=1e-9), pytest.approx(ci.high, rel=1e-9))
    assert welch(np.array([1.0, 1.0]), np.array([1.0, 1.0]))[3] == 1.0   # no noise, no difference


def test_holm_by_hand():
    # sorted p: 0.01 * 3, 0.02 * 2 (kept monotone), 0.04 * 1
    assert holm([0.04, 0.01, 0.02]) == pytest.approx([0.04, 0.03, 0.04])
    assert holm([0.5, 0.9]) == [1.0, 1.0]   # 2 * 0.5 caps at 1, and adjusted p never decrease


def test_verdicts():
    assert verdict(0.1, 0.01) == "agrees" and verdict(-0.1, 0.01) == "disagrees"
    assert verdict(0.1, 0.2) == "no difference"
    assert verdict(0.0, 0.5, equal=True).startswith("agrees") and verdict(0.2, 0.01, equal=True) == "disagrees"


def test_findings_from_two_settings(tmp_path):
    claim = {"text": "a beats b and c by 1/|o|", "source": "Someone (2025)", "setting": "a big model",
             "expect": ["a > b", "a > c", "b = c"], "untestable": {"sort": "(part) a note"}}
    rng = np.random.default_rng(0)
    sort = {"a": 0.9 + 0.01 * rng.standard_normal(5), "b": 0.5 + 0.01 * rng.standard_normal(5),
            "c": 0.5 + 0.01 * rng.standard_normal(5)}
    lm = {"a": 0.2 + 0.01 * rng.standard_normal(3), "b": 0.6 + 0.01 * rng.standard_normal(3),
          "c": 0.61 + 0.05 * rng.standard_normal(3)}
    write(tmp_path / "claimx_sort", "claimx", "sort", sort, claim)
    write(tmp_path / "claimx_lm", "claimx", "lm", lm, claim, column="final/eval/accuracy")
    write(tmp_path / "other", "other", None, {"a": [1, 2]}, None)   # no claim: not a finding
    text = render(tmp_path)
    row = next(line for line in text.splitlines() if line.startswith("| [claimx]"))
    assert len(re.findall(r"(?<!\\)\|", row)) == 6 and "1/\\|o\\|" in row   # the claim's pipe is escaped
    sort_cell, lm_cell, tau_cell = row.split(" | ")[2:5]
    assert sort_cell.startswith("agrees (3 of 3")
    assert lm_cell.startswith("mixed (1 of 3 orderings hold, 2 reversed)")   # b = c holds, a > b and a > c reverse
    # the toy ranks a > b ~ c, the LM b ~ c > a: the orderings disagree
    tau = stats.kendalltau([np.mean(sort[v]) for v in "abc"], [np.mean(lm[v]) for v in "abc"]).statistic
    assert tau_cell.startswith(f"{tau:+.2f}")
    assert "other" not in text.split("## claimx")[0].split("|---|")[1]
    assert "note: (part) a note" in text and "Test CPU" in text and "1.5 min for 15 runs" in text
    lm_result = judge_setting(tmp_path / "claimx_lm", claim["expect"])
    ab = lm_result["rows"][0]
    assert ab["diff"] == pytest.approx(lm["a"].mean() - lm["b"].mean())
    assert ab["p_holm"] == pytest.approx(holm([r["p"] for r in lm_result["rows"]])[0])
    (tmp_path / "FINDINGS_notes.md").write_text("## What we make of it\nhand-written\n")
    assert render(tmp_path).endswith("hand-written\n")


def test_ablation_settings_and_claims(tmp_path):
    doc = {"name": "c", "claim": {"text": "t", "source": "s", "expect": ["x > y"]},
           "settings": {"sort": {"task": "sort_hard", "epochs": 3, "seeds": 2},
                        "lm": {"task": "sort_lecture", "epochs": 5, "seeds": [7]}},
           "base": {"inner_steps": 1}, "variants": {"x": {"loss": "naive"}, "y": {"loss": "clipped"}}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    assert ablation_settings(path) == ["sort", "lm"]   # the file's order
    sort, lm = load_ablation(path, setting="sort"), load_ablation(path, setting="lm")
    assert (sort.name, sort.seeds, sort.variants[0][2]["epochs"]) == ("c_sort", [0, 1], 3)
    assert (lm.name, lm.seeds, lm.variants[0][2]["task"]) == ("c_lm", [7], "sort_lecture")
    assert sort.claim["expect"] == ["x > y"] and sort.setting == "sort"
    with pytest.raises(ConfigError, match="unknown setting 'gpu'; valid: sort, lm"):
        load_ablation(path, setting="gpu")
    bad = dict(doc, claim={"text": "t", "source": "s", "expect": ["x > z"]})
    path.write_text(yaml.safe_dump(bad, sort_keys=False))
    with pytest.raises(ConfigError, match="claim.expect: 'z' is no variant; valid: x, y"):
        load_ablation(path, setting="sort")


def test_settings_and_claims_that_do_not_load(tmp_path):
    doc = {"name": "c", "base": {"inner_steps": 1}, "variants": {"x": {"loss": "naive"}, "y": {"loss": "clipped"}}}
    path = tmp_path / "c.yaml"

    def fails(match, setting=None, **over):
        path.write_text(yaml.safe_dump({**doc, **over}, sort_keys=False))
        with pytest.raises(ConfigError, match=match):
            load_ablation(path, setting=setting)

    # a file with settings runs one of them, never its bare base; one without has none to pick
    fails(r"unknown setting None; valid: sort", settings={"sort": {"epochs": 2}})
    fails(r"--setting: settings: unknown setting 'sort'; valid: none", setting="sort")
    for settings in ([{"epochs": 2}], {}, {"sort": {"epochs": 2}, "lm": 3}):
        path.write_text(yaml.safe_dump({**doc, "settings": settings}, sort_keys=False))
        with pytest.raises(ConfigError, match="settings: expected a mapping name -> "):
            ablation_settings(path)
    ok = {"text": "t", "source": "s", "expect": ["x > y", "x = y"]}
    for claim in ({"text": "t", "source": "s"}, ["x > y"]):
        fails(r"claim: expected a mapping with text, source and expect", claim=claim)
    fails(r"claim\.sauce: unknown key; valid: text, source, setting, expect, metric, untestable$",
          claim={**ok, "sauce": 1})
    for expect in ("x > y", ["x > y", "x >= y"], ["x y"], [["x > y"]]):   # one > or = per comparison
        fails(r"claim\.expect: expected a list of", claim={**ok, "expect": expect})
    path.write_text(yaml.safe_dump({**doc, "claim": ok}, sort_keys=False))
    assert load_ablation(path).claim["expect"] == ["x > y", "x = y"]


@pytest.mark.parametrize("name", ["adv_norm", "dapo_ladder", "policy_losses", "kl_gradients", "length_bias",
                                  "ref_policy"])
def test_shipped_claims_load_on_every_setting(name):
    from pathlib import Path
    path = Path(__file__).resolve().parent.parent / "ablations" / f"{name}.yaml"
    settings = ablation_settings(path)
    assert settings and set(settings) <= {"sort", "lm"}
    for s in settings:
        abl = load_ablation(path, setting=s)
        assert len(abl.seeds) >= (5 if s == "sort" else 3)
        assert abl.claim and abl.claim["source"] and abl.claim["setting"]
    untestable = load_ablation(path, setting=settings[0]).claim.get("untestable", {})
    assert "sort" in settings or "sort" in untestable   # a claim not run on the toy says why


TINY = {"sort": ["--set", "epochs=2", "--set", "inner_steps=1"],
        # a 1-layer model from code and 20 held-out problems: the machinery, not the shipped model
        "lm": ["--set", "epochs=1", "--set", "inner_steps=1", "--set", "group_size=2", "--set", "eval_every=0",
               "--set", "task.prompts_per_step=2", "--set", "task.eval_size=20", "--set", "task.model.source=tiny-scratch",
               "--set", "task.model.layers=1", "--set", "task.model.width=32", "--set", "task.model.heads=2"]}


@pytest.mark.parametrize("name", ["adv_norm", "dapo_ladder", "policy_losses", "kl_gradients", "length_bias",
                                  "ref_policy"])
def test_shipped_claims_run_and_become_findings(name, tmp_path, capsys):
    # every setting of every claim ablation runs at a tiny budget, and FINDINGS.md has its row;
    # in-process with one worker, so that eleven settings cost no interpreter start-ups
    from pathlib import Path

    from grpo_bench.__main__ import main

    path = Path(__file__).resolve().parent.parent / "ablations" / f"{name}.yaml"
    for setting in ablation_settings(path):
        code = main(["run", str(path), "--setting", setting, "--seeds", "2", "--out", str(tmp_path / f"{name}_{setting}"),
                     "--workers", "1", "--no-progress", *TINY[setting]])
        assert code == 0, capsys.readouterr().err[-2000:]
        summary = pd.read_csv(tmp_path / f"{name}_{setting}" / "summary.csv")
        assert (summary.status == "ok").all(), summary.error.tolist()
        assert json.loads((tmp_path / f"{name}_{setting}" / "sweep.json").read_text())["runs"] == len(summary)
    assert main(["findings", str(tmp_path)]) == 0
    text = (tmp_path / "FINDINGS.md").read_text()
    assert f"| [{name}](#{name}): " in text and f"## {name}" in text
