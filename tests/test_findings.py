"""FINDINGS.md from results alone: paired or Welch tests, Holm, MDE, TOST, four verdicts, toy-vs-LM tau;
ablation settings and claims. The statistics themselves are tested in test_stats.py."""
import json

import re

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy import stats

from grpo_bench import stats as S
from grpo_bench.config import ConfigError, ablation_settings, load_ablation
from grpo_bench.findings import judge_setting, render, summarise


def write(path, name, setting, values, claim, column="final/reward", seeds=None):
    """A results directory with one summary column: values = {variant: [per-seed values]};
    seeds = {variant: [its seeds]} where they are not 0, 1, ... for every variant."""
    path.mkdir(parents=True)
    seeds = seeds or {}
    rows = [{"run": f"{v}-s{i}", "variant": v, "seed": seeds.get(v, range(len(xs)))[i], "status": "ok", "error": "",
             "wall_s": 1.0, column: x} for v, xs in values.items() for i, x in enumerate(xs)]
    pd.DataFrame(rows).to_csv(path / "summary.csv", index=False)
    meta = {"name": f"{name}_{setting}", "source": f"ablations/{name}.yaml", "variants": list(values),
            "seeds": list(range(len(next(iter(values.values()))))), "runs": [r["run"] for r in rows],
            "claim": claim, "setting": setting}
    (path / "ablation.json").write_text(json.dumps(meta))
    (path / "sweep.json").write_text(json.dumps({"wall_s": 90.0, "runs": len(rows), "skipped": 0, "where": "local: 2 workers",
                                                 "threads": 1, "cpus": 2, "cpu": "Test CPU", "load_avg_end": 1.0,
                                                 "command": "run"}))


def test_summaries_count_the_four_verdicts():
    def result(*verdicts):
        return {"rows": [{"missing": False, "verdict": v} for v in verdicts] + [{"missing": True}]}

    assert summarise(result("agrees", "agrees"), None) == \
        "agrees (2 of 2 orderings hold, 0 reversed, 0 equivalent, 0 undecided)"
    assert summarise(result("agrees", "disagrees", "undecided"), None).startswith("mixed (1 of 3 orderings hold, 1 rev")
    assert summarise(result("disagrees", "equivalent"), None).startswith("disagrees (0 of 2")
    assert summarise(result("agrees", "equivalent", "undecided"), None) == \
        "partly agrees (1 of 3 orderings hold, 0 reversed, 1 equivalent, 1 undecided)"
    assert summarise(result("equivalent", "equivalent"), None).startswith("no difference beyond the margin (0 of 2")
    assert summarise(result("equivalent", "undecided"), None).startswith("undecided at this scale (0 of 2")
    assert summarise(None, "no such task") == "not testable: no such task" and summarise(None, None) == "not run"


def test_findings_from_two_settings(tmp_path):
    claim = {"text": "a beats b and c by 1/|o|", "source": "Someone (2025)", "setting": "a big model",
             "expect": ["a > b", "a > c", "b = c"], "untestable": {"sort": "(part) a note"},
             "margin": {"sort": 0.05, "lm": 0.1}}
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
    # b = c holds on the toy: TOST within the claim's 0.05
    assert sort_cell == "agrees (3 of 3 orderings hold, 0 reversed, 0 equivalent, 0 undecided)"
    # the LM reverses a > b and a > c; b = c cannot be shown within 0.1 on three noisy seeds
    assert lm_cell == "disagrees (0 of 3 orderings hold, 2 reversed, 0 equivalent, 1 undecided)"
    # the toy ranks a > b ~ c, the LM b ~ c > a: the orderings disagree
    tau = stats.kendalltau([np.mean(sort[v]) for v in "abc"], [np.mean(lm[v]) for v in "abc"]).statistic
    assert tau_cell.startswith(f"{tau:+.2f}")
    assert "other" not in text.split("## claimx")[0].split("|---|")[1]
    assert "note: (part) a note" in text and "Test CPU" in text and "1.5 min for 15 runs" in text
    assert "**Margin δ.** sorting toy: ±0.05 (the claim's margin); arithmetic LM: ±0.1 (the claim's margin)" in text
    lm_result = judge_setting(tmp_path / "claimx_lm", claim["expect"], claim=claim, setting="lm")
    ab, ac, bc = lm_result["rows"]
    # paired on the shared seeds: a - b seed by seed, Holm over the claim's three orderings
    assert ab["paired"] and ab["diff"] == pytest.approx(lm["a"].mean() - lm["b"].mean())
    assert ab["p"] == pytest.approx(stats.ttest_rel(lm["a"], lm["b"]).pvalue)
    assert [r["p_holm"] for r in (ab, ac, bc)] == pytest.approx(S.holm([r["p"] for r in (ab, ac, bc)]))
    assert bc["verdict"] == "undecided" and bc["claim"] == "=" and bc["margin"] == 0.1
    # each ordering's row: Δ and its CI, the test with ρ, Holm p, its MDE or margin, the verdict
    line = next(x for x in text.splitlines() if x.startswith("| `b = c` |"))
    toy, lmc = line.split(" | ")[1:3]
    assert "paired t, ρ " in toy and "±0.05 (TOST p " in toy and toy.endswith("**agrees: equivalent within ±0.05**")
    u = stats.mannwhitneyu(sort["b"], sort["c"]).statistic
    assert f"; P(a > b) {u / 25:.2f}; " in toy
    assert f"`a` {sort['a'].mean():.3f} (IQM {stats.trim_mean(sort['a'], 0.25):.3f}) > " in text
    assert f"MDE {bc['mde']:.3f} (α {bc['level']:.3g})" in lmc and f"undecided (about {bc['seeds_needed']} pairs" in lmc
    (tmp_path / "FINDINGS_notes.md").write_text("## What we make of it\nhand-written\n")
    assert render(tmp_path).endswith("hand-written\n")


def test_findings_fall_back_to_welch_and_default_margins(tmp_path):
    # b ran other seeds than a: no pairs to form, Welch's t; no claim margin: the metric's default
    claim = {"text": "t", "source": "s", "expect": ["a > b"]}
    values = {"a": [0.50, 0.52, 0.49, 0.51], "b": [0.50, 0.51, 0.50, 0.52]}
    write(tmp_path / "c_sort", "c", "sort", values, claim, seeds={"a": [0, 1, 2, 3], "b": [4, 5, 6, 7]})
    (r,) = judge_setting(tmp_path / "c_sort", claim["expect"], claim=claim, setting="sort")["rows"]
    assert not r["paired"] and r["test"] == "Welch t" and r["margin"] == S.default_margin("final/reward") == 0.02
    assert r["p"] == pytest.approx(stats.ttest_ind(values["a"], values["b"], equal_var=False).pvalue)
    assert "Welch t; p_holm" in render(tmp_path) and "ρ" not in render(tmp_path).split("| `a > b` |")[1]


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
    fails(r"claim\.sauce: unknown key; valid: text, source, setting, expect, metric, untestable, margin$",
          claim={**ok, "sauce": 1})
    for margin, key in ((-0.1, "claim.margin"), (0, "claim.margin"), ("big", "claim.margin"), (True, "claim.margin"),
                        (float("inf"), "claim.margin"), ({"sort": 0}, "claim.margin.sort")):
        fails(rf"{key}: expected a positive number in the metric's units", claim={**ok, "margin": margin})
    # a margin per setting names settings the file has
    fails(r"claim\.margin\.lm: unknown setting; valid: sort$", setting="sort", settings={"sort": {"epochs": 2}},
          claim={**ok, "margin": {"lm": 0.03}})
    path.write_text(yaml.safe_dump({**doc, "claim": {**ok, "margin": 0.03}}, sort_keys=False))
    assert load_ablation(path).claim["margin"] == 0.03
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


def test_findings_name_the_presets_their_ablation_files_set(tmp_path):
    # a resolved config no longer knows its preset: the intro reads it from the ablation file's settings
    claim = {"text": "a beats b", "source": "Someone (2025)", "expect": ["a > b"]}
    (tmp_path / "ablations").mkdir()
    (tmp_path / "ablations" / "claimx.yaml").write_text(yaml.safe_dump(
        {"settings": {"sort": {"task": "sort_converge"}, "lm": {"task": {"name": "arithmetic_scratchpad"}}}}))
    root = tmp_path / "results"
    write(root / "claimx_sort", "claimx", "sort", {"a": [0.9, 0.91], "b": [0.5, 0.52]}, claim)
    write(root / "claimx_lm", "claimx", "lm", {"a": [0.3, 0.31], "b": [0.2, 0.22]}, claim, column="final/eval/accuracy")
    intro = render(root).splitlines()[2]
    assert "on the sorting toy (`sort_converge`) and the arithmetic LM (`arithmetic_scratchpad`)," in intro
    (tmp_path / "ablations" / "claimx.yaml").unlink()   # the file gone: the labels alone, no guess
    assert "on the sorting toy and the arithmetic LM," in render(root).splitlines()[2]
