"""A claim's mechanism (claim.mechanism): an ordering whose declared diagnostic stays under its threshold is *not
exercised*: no verdict printed, outside Holm's m and every count; the strict loader refuses a bad declaration in
one line naming the file and key."""
import dataclasses
import glob
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from grpo_bench import stats as S
from grpo_bench.analysis import mechanism
from grpo_bench.analysis.findings import judge_setting
from grpo_bench.analysis.findings_text import across, counts, render, summarise
from grpo_bench.config.ablation import MECHANISM_KEYS, load_ablation, parse_ordering
from grpo_bench.config.strict_yaml import read_yaml
from grpo_bench.errors import ConfigError
from helpers import ROOT
from test_findings import write

DIAG = {"acts": "tokens the upper clip stops", "metric": "clip/high_frac", "variant": "b", "min": 0.01,
        "why": "the source's argument"}


def results(tmp_path, high: dict[str, list[float]], logged: str = "clip/high_frac", **diag):
    """One toy setting where a beats b and c by far; clip/high_frac per variant logged at two steps of every seed
    (high: variant -> the two steps' values)."""
    claim = {"text": "t", "source": "s", "expect": ["a > b", "a > c"], "margin": 0.02,
             "mechanism": {"default": DIAG | diag}}
    rng = np.random.default_rng(0)
    values = {"a": 0.9 + 0.01 * rng.standard_normal(5), "b": 0.5 + 0.01 * rng.standard_normal(5),
              "c": 0.5 + 0.01 * rng.standard_normal(5)}
    d = tmp_path / "mechx_sort"
    write(d, "mechx", "sort", values, claim)
    long = [{"run": f"{v}-s{s}", "variant": v, "seed": s, "step": step, "metric": logged, "value": x}
            for v, xs in high.items() for s in range(5) for step, x in zip((1, 2), xs)]
    pd.DataFrame(long).to_parquet(d / "metrics.parquet")
    return d, claim


def test_a_diagnostic_just_under_its_threshold_prints_no_verdict_and_counts_nowhere(tmp_path):
    # b's mean over its steps is 0.0099, just under 0.01, though its second step alone (0.0198) is over it:
    # the mean over steps, not the last or the largest value, decides; c's is exactly 0.01, which acts (>=)
    d, claim = results(tmp_path, {"b": [0.0, 0.0198], "c": [0.005, 0.015]})
    result = judge_setting(d, claim, "sort")
    ab, ac = result["rows"]
    assert ab["unexercised"] == "clip/high_frac on `b` 0.0099 < 0.01 (tokens the upper clip stops)"
    assert "quantities" not in ab or not ab["quantities"]
    assert ac["unexercised"] is None and ac["mechanism"]["acts"] is True
    # Holm's m is the one exercised ordering, and the counts leave the other out
    assert ac["quantities"]["final"]["m"] == 1
    assert counts(result["rows"], "final")["not exercised"] == 1
    assert summarise(result, None) == "holds (eval reward, final: 1 of 1 hold; 1 not exercised)"
    assert across({"sort": result}, 0) == (0, 0) and across({"sort": result}, 1) == (1, 1)
    text = render(tmp_path)
    line = next(x for x in text.splitlines() if x.startswith("| `a > b` |"))
    assert "**not exercised**: clip/high_frac on `b` 0.0099 < 0.01" in line
    assert not any(w in line for w in ("holds", "p_holm", "undecided", "equivalent"))
    line = next(x for x in text.splitlines() if x.startswith("| `a > c` |"))
    assert "**holds" in line and "mechanism acts: clip/high_frac on `c` 0.01 ≥ 0.01" in line


def test_just_over_the_threshold_is_judged_and_the_rule_can_be_turned_off(tmp_path):
    d, claim = results(tmp_path, {"b": [0.0, 0.0202], "c": [0.0, 0.0]})
    ab, ac = judge_setting(d, claim, "sort")["rows"]
    assert ab["unexercised"] is None and ab["quantities"]["final"]["outcome"] == "holds"
    assert ac["unexercised"].startswith("clip/high_frac on `c` 0 < 0.01")
    # v3's rules judge every row (rule_changes replays them)
    v3ish = dataclasses.replace(S.V4, mechanism=False)
    assert all(r["unexercised"] is None and r["quantities"] for r in judge_setting(d, claim, "sort", rules=v3ish)["rows"])


def test_a_diagnostic_not_logged_is_judged_and_says_so(tmp_path):
    # the metric is absent (or declared none): nothing shows the part idle, so the verdict stands, marked
    d, claim = results(tmp_path, {"b": [0.0, 0.0]}, metric="response/length_std")
    ab, _ = judge_setting(d, claim, "sort")["rows"]
    assert ab["unexercised"] is None and ab["mechanism"]["acts"] is None
    assert "mechanism not measured: response/length_std on `b` not logged" in render(tmp_path)
    # a list acts when any of its diagnostics does; an ordering's own entry wins over the default
    m = {"default": DIAG, "a > b": [DIAG | {"min": 1.0}, DIAG | {"variant": "a", "min": 1e-9}]}
    table = pd.DataFrame({"run": ["r0", "r1"], "variant": ["a", "b"], "metric": ["clip/high_frac"] * 2,
                          "value": [1e-6, 0.5]})
    assert mechanism.judge(table, m, "a > b", "a", "b")["acts"] is True
    assert mechanism.judge(table, {"a > b": [DIAG | {"min": 1.0}]}, "a > b", "a", "b")["acts"] is False
    assert mechanism.judge(table, m, "a > c", "a", "c")["acts"] is None  # c logged nothing


def test_a_mechanism_grid_hides_the_panels_it_does_not_fill(tmp_path):
    """Five diagnostics on a grid of four columns: the second row's last three axes are switched off, not
    drawn as empty frames with ticks beside the fifth panel."""
    from grpo_bench.analysis import figures

    names = ["clip/high_frac", "clip/frac", "kl/seq", "mismatch/kl", "entropy/coef"]
    d, _ = results(tmp_path, {"b": [0.02, 0.02], "c": [0.02, 0.02], "a": [0.5, 0.5]})
    meta = json.loads((d / "ablation.json").read_text())
    meta["claim"]["mechanism"] = {"default": [DIAG | {"metric": m} for m in names]}
    (d / "ablation.json").write_text(json.dumps(meta))
    m = pd.read_parquet(d / "metrics.parquet")
    pd.concat([m.assign(metric=n) for n in names]).to_parquet(d / "metrics.parquet")
    fig = {stem: fig for stem, fig, _ in figures.build_figures(d)}["mechanism"]
    assert [m for m, *_ in mechanism.panels(meta, d)] == names
    assert [ax.axison for ax in fig.axes] == [True] * 5 + [False] * 3
    assert [ax.get_title().split("\n")[0] for ax in fig.axes[:5]] == names


def test_a_scale_that_varies_over_steps_acts_by_its_spread_not_its_size(tmp_path):
    """reduce: cv reads each run's coefficient of variation over its logged steps (what Adam does not absorb):
    b's steps 1 and 3 (cv 0.5) act; c's 1.0 and 1.1 (cv 1/21) do not, however large the values; the figure
    draws no threshold line across values the threshold is not about."""
    from grpo_bench.analysis import figures

    d, claim = results(tmp_path, {"b": [1.0, 3.0], "c": [1.0, 1.1], "a": [2.0, 2.0]}, reduce="cv", min=0.1)
    ab, ac = judge_setting(d, claim, "sort")["rows"]
    assert ab["unexercised"] is None and ab["mechanism"]["readings"][0][1] == pytest.approx(0.5)
    assert ac["unexercised"] == "cv over steps of clip/high_frac on `c` 0.0476 < 0.1 (tokens the upper clip stops)"
    meta = json.loads((d / "ablation.json").read_text())
    ax = {stem: fig for stem, fig, _ in figures.build_figures(d)}["mechanism"].axes[0]
    assert not [line for line in ax.get_lines() if line.get_linestyle() == ":"] and "cv over steps" in ax.get_title()
    assert mechanism.panels(meta, d) == [("clip/high_frac", 0.1, "cv")]


@pytest.mark.parametrize("bad, match", [
    ({"default": DIAG | {"on": "b"}}, r"claim\.mechanism\.default\.on: unknown key; valid: acts, metric, variant"),
    ({"x > z": DIAG}, r"claim\.mechanism\.x > z: unknown key; valid: default, x > y$"),
    ({"default": {k: v for k, v in DIAG.items() if k != "min"}}, r"claim\.mechanism\.default\.min: expected a positive"),
    ({"default": DIAG | {"reduce": "max"}}, r"claim\.mechanism\.default\.reduce: expected one of mean, abs_mean"),
    ({"default": DIAG | {"variant": "w"}}, r"claim\.mechanism\.default\.variant: unknown variant 'w'; valid: a, b, x, y"),
    ({"x > y": [DIAG, {"acts": "a"}]}, r"claim\.mechanism\.x > y\[1\]\.metric: expected text"),
    ({"default": DIAG | {"metric": "none"}}, r"claim\.mechanism\.default\.min: metric none has no value"),
    ([DIAG], r"claim\.mechanism: expected a mapping default or 'a > b'"),
])
def test_a_bad_mechanism_is_refused_in_one_line(tmp_path, bad, match):
    doc = {"name": "c", "base": {"inner_steps": 1}, "variants": {"x": {"loss": "naive"}, "y": {"loss": "clipped"}},
           "claim": {"text": "t", "source": "s", "expect": ["x > y"], "mechanism": bad}}
    path = tmp_path / "c.yaml"
    # YAML reads a bare `on:` as true: written as text, the key reaches the loader as True and is refused
    path.write_text(yaml.safe_dump(doc, sort_keys=False).replace("'on':", "on:"))
    with pytest.raises(ConfigError, match=rf"^{path}: {match.replace('.on:', '.True:')}"):
        load_ablation(path)


@pytest.mark.parametrize("path", sorted(glob.glob(str(ROOT / "ablations" / "*.yaml"))))
def test_every_shipped_claim_declares_a_mechanism_for_each_ordering(path):
    doc = read_yaml(Path(path))
    claim = doc.get("claim")
    if claim is None:
        return
    m = claim.get("mechanism") or {}
    for e in claim["expect"]:
        ds = mechanism.diagnostics(m, e)
        assert ds, f"{path}: {e!r} declares no mechanism"
        for d in ds:  # each says why its threshold, and reads a side of the ordering or a variant of the file
            assert set(d) <= set(MECHANISM_KEYS) and d["why"].strip()
            assert d.get("variant", "a") in ("a", "b", *parse_ordering(e)[:2], *doc["variants"])


def test_report_says_whether_each_mechanism_acted_and_draws_it_against_its_threshold(tmp_path):
    """REPORT.md's table reads the same value FINDINGS does (b under the threshold: not exercised; c at it:
    acts), and mechanism.png draws each declared metric with the threshold as a dotted line."""
    from grpo_bench.analysis import figures

    d, claim = results(tmp_path, {"b": [0.0, 0.0198], "c": [0.005, 0.015], "a": [0.02, 0.02]})
    meta = json.loads((d / "ablation.json").read_text())
    lines = mechanism.report_section(meta, d)
    ab = next(x for x in lines if x.startswith("| `a > b` |"))
    ac = next(x for x in lines if x.startswith("| `a > c` |"))
    assert "0.0099 < 0.01" in ab and ab.endswith("| **no: not exercised** |")
    assert "0.01 ≥ 0.01" in ac and ac.endswith("| yes |")
    figures = {stem: fig for stem, fig, _ in figures.build_figures(d)}
    ax = figures["mechanism"].axes[0]
    dotted = [line for line in ax.get_lines() if line.get_linestyle() == ":"]
    assert [line.get_ydata()[0] for line in dotted] == [0.01]
    assert "clip/high_frac" in ax.get_title() and "threshold 0.01" in ax.get_title()


def test_report_names_orderings_a_settings_only_left_out_as_not_run_not_as_not_measured(tmp_path):
    """A setting that ran a and b only: `a > c` was not run there, which is not a diagnostic left unlogged."""
    d, _ = results(tmp_path, {"b": [0.0, 0.0198], "c": [0.005, 0.015], "a": [0.02, 0.02]})
    meta = json.loads((d / "ablation.json").read_text()) | {"variants": ["a", "b"]}
    lines = mechanism.report_section(meta, d)
    assert any(x.startswith("| `a > b` |") for x in lines)
    assert not any(x.startswith("| `a > c` |") for x in lines)
    assert "Not run in this setting (a variant of each is outside its `only:`): `a > c`." in lines
    only_c = mechanism.report_section(meta | {"variants": ["a", "c"]}, d)
    assert not any(x.startswith("| `a > b` |") for x in only_c) and any(x.startswith("| `a > c` |") for x in only_c)
    neither = mechanism.report_section(meta | {"variants": ["a"]}, d)
    # no table at all, and one blank line between the section's words and the sentence
    assert neither[:2] == ["## Did the mechanism act?", ""] and neither[2].startswith("Each ordering's part acts")
    assert neither[3:] == ["", "Not run in this setting (a variant of each is outside its `only:`): `a > b`, `a > c`.", ""]


def test_the_mechanism_figures_title_wraps_a_long_name_inside_the_figure(tmp_path):
    from grpo_bench.analysis import figures

    d, _ = results(tmp_path, {"b": [0.0, 0.02], "c": [0.005, 0.015], "a": [0.02, 0.02]})
    meta = json.loads((d / "ablation.json").read_text())
    (d / "ablation.json").write_text(json.dumps(meta | {"name": "a_long_ablation_name_" * 5}))
    fig = {stem: fig for stem, fig, _ in figures.build_figures(d)}["mechanism"]
    fig.canvas.draw()
    box = fig._suptitle.get_window_extent(fig.canvas.get_renderer())
    assert "a_long_ablation_name_" * 5 in fig._suptitle.get_text().replace("\n", "") and box.x0 >= -1 and box.x1 <= fig.bbox.x1 + 1


def test_a_threshold_decades_above_the_curves_keeps_a_few_decade_labels(tmp_path):
    # fp32_head_lm: mismatch/k3 at 1e-6..2e-5 under a 1e-3 threshold; the 1-2-5 ticks chosen for the curves'
    # own range piled eleven labels into a 1.6-inch panel once the line widened the axis
    from grpo_bench.analysis import figures

    d, _ = results(tmp_path, {"b": [2e-6, 2e-5], "c": [1e-6, 1e-5], "a": [3e-6, 1.5e-5]},
                   logged="mismatch/k3", metric="mismatch/k3", min=1e-3)
    ax = {stem: fig for stem, fig, _ in figures.build_figures(d)}["mechanism"].axes[0]
    ax.figure.canvas.draw()
    lo, hi = ax.get_ylim()
    shown = [t.get_position()[1] for t in ax.get_yticklabels() if t.get_text() and lo <= t.get_position()[1] <= hi]
    assert ax.get_yscale() == "log" and hi >= 1e-3 and 2 <= len(shown) <= 5
    assert all(np.isclose(np.log10(y), round(np.log10(y))) for y in shown)   # decades only


def test_twelve_variants_get_twelve_colours():
    # sampler_mismatch has 11 variants: two of them must not share a colour and differ only by dashes
    from grpo_bench.analysis.plotting import variant_styles

    styles = variant_styles([f"v{i}" for i in range(12)])
    assert len({s["color"] for s in styles.values()}) == 12


def _cielab(hex_colour: str) -> np.ndarray:
    """sRGB (D65) to CIELAB, from the standard's formulas: an independent check on what a reader sees."""
    rgb = np.array([int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)]) / 255
    linear = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ linear
    t = xyz / np.array([0.95047, 1.0, 1.08883])
    f = np.where(t > (6 / 29) ** 3, np.cbrt(t), t / (3 * (6 / 29) ** 2) + 4 / 29)  # black lies on the linear toe
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def test_twelve_colours_a_reader_tells_apart():
    # kl_gradients_spell_backward's headline drew k2_loss_b005 (#009E73) and k1_reward_b05 (#44AA99) as one
    # green: distinct hex strings are not distinct lines. Okabe-Ito's blue and sky blue (ΔE 26) are the closest
    # pair it accepts, by design of that colour-blind-safe set.
    import itertools
    from grpo_bench.analysis.plotting import PALETTE

    assert np.allclose(_cielab("#FFFFFF"), [100, 0, 0], atol=0.05) and np.allclose(_cielab("#000000"), 0, atol=1e-9)
    assert np.allclose(_cielab("#FF0000"), [53.24, 80.09, 67.20], atol=0.1)   # sRGB red's published Lab
    gaps = {(a, b): float(np.linalg.norm(_cielab(a) - _cielab(b))) for a, b in itertools.combinations(PALETTE, 2)}
    closest = min(gaps, key=gaps.get)
    assert gaps[closest] >= 25, (closest, gaps[closest])


def test_a_variant_whose_runs_are_another_s_is_drawn_over_it_and_named(tmp_path):
    # kl_gradients' k3st_loss_b05 trains exactly as k2_loss_b05 (k3's value, k2's gradient): its line lay on
    # k2's at every point, and k2's black line was in the legend but nowhere on any curve
    from matplotlib.colors import to_hex

    from grpo_bench.analysis import figures
    from grpo_bench.analysis.plotting import PALETTE

    claim = {"text": "t", "source": "s", "expect": ["a > b"]}
    curves = {(v, s): [(step, 8 * step, {"a": 0.5, "b": 0.3, "c": 0.5}[v] + 0.01 * step * (s + 1)) for step in range(4)]
              for v in "abc" for s in range(3)}
    write(tmp_path / "tw_sort", "tw", "sort", {"a": [1.0, 1.1, 0.9], "b": [0.5, 0.4, 0.6], "c": [1.0, 1.1, 0.9]},
          claim, curves=curves)
    head = {stem: fig for stem, fig, _ in figures.build_figures(tmp_path / "tw_sort")}["curve_eval_reward"]
    lines = {to_hex(ln.get_color()).upper(): ln for ln in head.axes[0].get_lines() if ln.get_gid() in "abc"}
    assert lines[PALETTE[0]].get_linestyle() == "-" and lines[PALETTE[2]].get_linestyle() == "--"
    labels = [t.get_text() for t in head.legends[0].get_texts()]
    assert labels == ["a", "b", "c (= a)"]
    # one value apart at one step of one seed: two sets of runs, each drawn as itself
    curves[("c", 1)][2] = (2, 16, 0.75)
    write(tmp_path / "tw2_sort", "tw2", "sort", {"a": [1.0, 1.1, 0.9], "b": [0.5, 0.4, 0.6], "c": [1.0, 1.1, 0.9]},
          claim, curves=curves)
    head = {stem: fig for stem, fig, _ in figures.build_figures(tmp_path / "tw2_sort")}["curve_eval_reward"]
    assert [t.get_text() for t in head.legends[0].get_texts()] == ["a", "b", "c"]
    assert {ln.get_linestyle() for ln in head.axes[0].get_lines() if ln.get_gid() in "abc"} == {"-"}


def test_twins_are_read_on_training_not_on_the_objective_s_value_or_clocks():
    from grpo_bench.analysis.plotting import twin_variants

    def frame(v, metric, values):
        return pd.DataFrame({"run": f"{v}-s0", "variant": v, "seed": 0, "step": range(len(values)), "value": values})

    same = {"reward/mean": [0.1, 0.2, 0.3], "grad/norm": [1.0, 0.5, 0.25]}
    curves = {m: pd.concat([frame(v, m, x) for v in ("k2", "k3st", "k1")]) for m, x in same.items()}
    curves["reward/mean"].loc[curves["reward/mean"].variant.eq("k1"), "value"] = [0.1, 0.2, 0.31]
    for m, k2, k3 in (("kl/value", [0.0, 0.01, 0.02], [0.0, 0.011, 0.021]), ("loss/total", [1, 2, 3], [1, 2, 4]),
                      ("time/step_s", [1.0, 1.1, 1.2], [0.9, 1.0, 1.3])):
        curves[m] = pd.concat([frame("k2", m, k2), frame("k3st", m, k3), frame("k1", m, k2)])
    assert twin_variants(curves, ["k2", "k3st", "k1"]) == {"k3st": "k2"}
    curves["entropy"] = pd.concat([frame("k2", "entropy", [0.3, 0.2]), frame("k3st", "entropy", [0.3, 0.21])])
    assert twin_variants(curves, ["k2", "k3st", "k1"]) == {}


def test_the_headline_leads_with_the_metric_the_claim_is_judged_on(tmp_path):
    # kl_gradients is judged on final/kl/seq: its headline figure must show kl/seq, not only the task's reward
    from grpo_bench.analysis import figures

    claim = {"text": "t", "source": "s", "expect": ["a > b"], "metric": "final/kl/seq", "margin": "5%"}
    curves = {(v, s): [(step, 8 * step, (1.0 if v == "a" else 0.5) * (1 + step)) for step in (0, 1, 2)]
              for v in "ab" for s in range(3)}
    write(tmp_path / "klx_sort", "klx", "sort", {"a": [3.0, 3.1, 2.9], "b": [1.5, 1.4, 1.6]}, claim,
          column="final/kl/seq", curves=curves)
    figures = {stem: fig for stem, fig, _ in figures.build_figures(tmp_path / "klx_sort")}
    assert "headline" in figures and "kl/seq" in figures["headline"].axes[0].get_title() + \
        figures["headline"].axes[0].get_ylabel()
    # and its final values lead with it too (kl_gradients' once showed only accuracy and reward)
    assert figures["final_values"].axes[0].get_xlabel() == "final kl/seq"


def test_a_threshold_near_the_axis_floor_is_read_on_a_log_scale_above_it(tmp_path):
    """sampler_mismatch_countdown: mismatch/kl from 6e-5 (bf16) to 1.1 (none_k16) against a 1e-3 threshold. On a
    linear axis the dotted line sat on the floor with bf16 under it; above a tenth of the threshold the axis is
    logarithmic, so a curve under the line is drawn visibly under it and one over it visibly over it."""
    from grpo_bench.analysis import figures

    d, _ = results(tmp_path, {"b": [-1e-4, 6e-5], "c": [3e-3, 3e-3], "a": [0.8, 2.0]},
                   logged="mismatch/kl", metric="mismatch/kl", min=1e-3)
    ax = {stem: fig for stem, fig, _ in figures.build_figures(d)}["mechanism"].axes[0]
    assert ax.get_yscale() == "symlog" and ax.yaxis.get_transform().linthresh == pytest.approx(1e-4)
    to_px = ax.transData.transform
    height = ax.bbox.height
    line = to_px((0, 1e-3))[1]
    b, c = (max(to_px((0, y))[1] for y in ys) for ys in ([-1e-4, 6e-5], [3e-3]))
    assert line - b > 0.05 * height and c - line > 0.05 * height
    # k1's dip under 0 is drawn, and the floor is not rounded down to a decade far below it (it was -0.1)
    assert -1e-3 < ax.get_ylim()[0] <= -1e-4
    # a threshold inside the curves' range stays on a linear axis
    d, _ = results(tmp_path / "mid", {"b": [0.0, 0.0198], "c": [0.005, 0.015], "a": [0.02, 0.02]})
    ax = {stem: fig for stem, fig, _ in figures.build_figures(d)}["mechanism"].axes[0]
    assert ax.get_yscale() == "linear"


def test_a_variant_fifty_times_the_others_does_not_flatten_them(tmp_path):
    # kl_gradients_lm_acts: k1 in the loss at beta 0.5 runs its KL to 350 nats while nine others stay under 2;
    # on a linear axis those nine are one line at 0
    from grpo_bench.analysis import figures

    claim = {"text": "t", "source": "s", "expect": ["a > b"], "metric": "final/kl/seq", "margin": "5%"}
    scale = {"a": 300.0, "b": 1.0, "c": 1.5, "d": 0.5}
    curves = {(v, s): [(step, 8 * step, scale[v] * (1 + step)) for step in (0, 1, 2)] for v in scale for s in range(3)}
    write(tmp_path / "kly_sort", "kly", "sort", {v: [scale[v]] * 3 for v in scale}, claim, column="final/kl/seq",
          curves=curves)
    ax = {stem: fig for stem, fig, _ in figures.build_figures(tmp_path / "kly_sort")}["headline"].axes[0]
    assert ax.get_yscale() == "symlog"
    # and the same variants within 50x of each other stay linear
    scale["a"] = 20.0
    curves = {(v, s): [(step, 8 * step, scale[v] * (1 + step)) for step in (0, 1, 2)] for v in scale for s in range(3)}
    write(tmp_path / "klz_sort", "klz", "sort", {v: [scale[v]] * 3 for v in scale}, claim, column="final/kl/seq",
          curves=curves)
    ax = {stem: fig for stem, fig, _ in figures.build_figures(tmp_path / "klz_sort")}["headline"].axes[0]
    assert ax.get_yscale() == "linear"


def test_a_claims_report_tests_the_pairs_its_claim_asks_about(tmp_path):
    """REPORT.md's differences on a claim's results are its orderings' pairs, Holm over them as in FINDINGS, not
    every pair of its variants (b vs c is no claim's); an ablation without a claim keeps every pair."""
    from grpo_bench.analysis import report

    d, claim = results(tmp_path, {"b": [0.02, 0.02], "c": [0.02, 0.02]})
    text = report.render(d)[0]
    section = text.split("## Differences in eval reward\n", 1)[1].split("\n## ", 1)[0]
    assert "2 pairs (the claim's orderings, the pairs FINDINGS reads;" in section
    assert "| `a` vs `b` |" in section and "| `a` vs `c` |" in section and "| `b` vs `c` |" not in section
    # a metric the claim is not judged on: each variant's seeds, no pairs tested again
    summary = pd.read_csv(d / "summary.csv").assign(**{"final/reward": 0.5})
    meta = json.loads((d / "ablation.json").read_text())
    lines = report.differences_section(summary, "final/reward", "final reward", ["a", "b", "c"], meta)
    assert lines[2] == "The claim is judged on `final/eval/reward`: its orderings are tested there. Here each variant's seeds:"
    assert "| `a` | 5 | 0.500 [0.500, 0.500] | 0.500 [0.500, 0.500] |" in lines and not any("| pair |" in x for x in lines)
    assert "| pair |" in "\n".join(report.differences_section(summary, "final/eval/reward", "eval reward",
                                                              ["a", "b", "c"], meta))
    meta = json.loads((d / "ablation.json").read_text())
    meta.pop("claim")
    (d / "ablation.json").write_text(json.dumps(meta))
    section = report.render(d)[0].split("## Differences in eval reward\n", 1)[1].split("\n## ", 1)[0]
    assert "3 pairs, Holm-corrected together" in section and "| `b` vs `c` |" in section


def test_without_a_metrics_table_every_ordering_is_judged_and_marked_not_measured(tmp_path):
    """A results directory whose sweep kept no per-step metrics shows nothing idle: the verdicts stand, each
    marked, rather than the reading failing on the missing table."""
    d, claim = results(tmp_path, {"b": [0.0, 0.0], "c": [0.0, 0.0]})
    (d / "metrics.parquet").unlink()
    ab, ac = judge_setting(d, claim, "sort")["rows"]
    assert ab["unexercised"] is None and ab["mechanism"]["acts"] is None
    assert ab["quantities"]["final"]["outcome"] == "holds" and ac["quantities"]["final"]["m"] == 2
    assert "mechanism not measured: clip/high_frac on `b` not logged" in render(tmp_path)


def test_a_diagnostic_nothing_logs_says_why_once_and_draws_no_panel():
    none = {"acts": "the reference's distance", "metric": "none", "why": "no per-step metric shows it"}
    table = pd.DataFrame({"run": ["r0"], "variant": ["b"], "metric": ["none"], "value": [5.0]})
    result = mechanism.judge(table, {"default": none}, "a > b", "a", "b")
    assert result == {"readings": [(none, None)], "acts": None}
    assert mechanism.text(result, "a", "b") == "no diagnostic logged (the reference's distance)"
    meta = {"claim": {"expect": ["a > b", "a > c"],
                      "mechanism": {"a > b": [none, DIAG], "a > c": [DIAG | {"min": 0.5}, DIAG | {"metric": "x/y"}]}}}
    # each metric once, with the threshold of the first ordering that declares it; none is no panel
    assert mechanism.panels(meta, None) == [("clip/high_frac", 0.01, "mean"), ("x/y", 0.01, "mean")]


def test_the_ablation_file_found_first_decides_and_a_bad_declaration_in_it_is_refused_naming_it(tmp_path, monkeypatch):
    """declared(): the file as the results name it (from the working directory) wins over one beside the results
    root, and where it declares no mechanism the recorded one stands (not the other file's)."""
    claim = {"text": "t", "source": "s", "expect": ["a > b"], "mechanism": {"default": DIAG}}
    here, beside = tmp_path / "cwd", tmp_path / "repo"
    for top, mech in ((here, None), (beside, {"default": DIAG | {"min": 0.5}})):
        (top / "ablations").mkdir(parents=True)
        own = {k: v for k, v in claim.items() if k != "mechanism"} | ({"mechanism": mech} if mech else {})
        (top / "ablations" / "x.yaml").write_text(yaml.safe_dump({"name": "x", "claim": own}))
    monkeypatch.chdir(here)
    meta = {"source": "ablations/x.yaml", "claim": claim}
    assert mechanism.declared(meta, beside / "results") == {"default": DIAG}
    monkeypatch.chdir(tmp_path)  # now only the file beside the results exists: today's threshold
    assert mechanism.declared(meta, beside / "results") == {"default": DIAG | {"min": 0.5}}
    bad = beside / "ablations" / "x.yaml"
    bad.write_text(yaml.safe_dump({"name": "x", "claim": claim | {"mechanism": {"default": DIAG | {"min": 0}}}}))
    with pytest.raises(ConfigError, match=rf"^{bad}: claim\.mechanism\.default\.min: expected a positive number"):
        mechanism.declared(meta, beside / "results")
