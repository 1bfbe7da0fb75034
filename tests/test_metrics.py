"""A task and its metrics are declared once (grpo_bench/store/metrics.py): a task defined here, registered from
this file and nowhere else, reaches ablation.json, the trainer's summary, REPORT.md, its figures and
FINDINGS.md; declarations drive figure ranges and scales; old results read as they did."""
import copy
import json
import sys
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from matplotlib.collections import PolyCollection
from torch import nn

from grpo_bench.analysis import compare as C
from grpo_bench.store import metrics as M
from grpo_bench import registry
from grpo_bench.numerics import rng
from grpo_bench.analysis import figures as F
from grpo_bench.analysis import plotting as P
from grpo_bench.analysis import report as R
from grpo_bench.store import rundir as ST
from grpo_bench.__main__ import main
from grpo_bench.store.metrics import Metric
from grpo_bench.errors import ConfigError
from grpo_bench.tasks import Rollout

# ------------------------------------------------------------------ a task from nowhere else


@dataclass
class BanditConfig:
    arms: int = 4
    """K arms; arm k pays k / (K - 1)."""
    prompts: int = 4
    """B prompts per epoch (all alike: a bandit has no context)."""

    @property
    def generation_budget(self) -> int:
        return 1


class Logits(nn.Module):
    def __init__(self, p: int, k: int):
        super().__init__()
        self.logits = nn.Parameter(torch.zeros(p, k))  # (P, K): every member starts uniform


class Bandit:
    """A K-armed bandit: one token per response, the arm; the policy is a softmax over arms."""

    label, short = "bandit toy", "bandit"
    main_metric = "final/eval/hit"
    curves = ("eval/hit", "bandit/regret")
    metrics = (
        Metric("eval/hit", label="held-out hit rate", summary="eval hit", range=(0, 1), higher_is_better=True,
               margin=0.05),
        Metric("bandit/regret", label="regret", range=(0, 1), scale="heavy", higher_is_better=False, tail=True),
        Metric("bandit/pulls", label="pulls", summary="pulls", range=(0, 1e9), scale="log"),
        Metric("bandit/std", range=(0, 0.5)),  # narrower than the core's */std family
    )

    def __init__(self, cfg: BanditConfig, run_cfgs):
        self.cfg, self.seeds = cfg, [c.seed for c in run_cfgs]
        self.policy = Logits(len(self.seeds), cfg.arms)
        self.reference = copy.deepcopy(self.policy).requires_grad_(False)
        self.pay = torch.arange(cfg.arms, dtype=torch.float32) / (cfg.arms - 1)

    @staticmethod
    def member_bytes(run_cfg) -> int:
        return 1 << 10

    @staticmethod
    def population_cap(run_cfg) -> int:
        return 64

    def rollout(self, epoch, draw, group_size):
        p, b = len(self.seeds), self.cfg.prompts
        probs = torch.softmax(self.policy.logits.detach(), -1)
        arms = torch.stack([torch.multinomial(probs[i], b * group_size, True, generator=rng.stream(s, "s", epoch, draw))
                            for i, s in enumerate(self.seeds)]).view(p, b, group_size, 1)
        rewards = self.pay[arms[..., 0]]
        return Rollout(prompts=torch.zeros(p, b, dtype=torch.long), responses=arms, mask=torch.ones(arms.shape),
                       rewards=rewards, metrics={"bandit/regret": 1 - rewards.flatten(1).mean(1)})

    def logprobs(self, ro, reference=False):
        lp = torch.log_softmax((self.reference if reference else self.policy).logits, -1)  # (P, K)
        logp = lp.gather(1, ro.responses.flatten(1)).view(ro.responses.shape)
        ent = -(lp.exp() * lp).sum(-1).view(-1, 1, 1, 1).expand(logp.shape)
        return logp, None if reference else ent

    @torch.no_grad()
    def mix_reference(self, weights):
        w = torch.tensor(weights).view(-1, 1)
        self.reference.logits.lerp_(self.policy.logits, w)

    def retire(self, member, prompts):
        raise RuntimeError("a bandit has no prompts to retire")

    def greedy_rewards(self, ro):
        best = self.pay[self.policy.logits.argmax(-1)]
        return best.view(-1, 1).expand(ro.rewards.shape[:2])

    @torch.no_grad()
    def evaluate(self):
        probs = torch.softmax(self.policy.logits, -1)
        return [{"eval/hit": float(q[-1])} for q in probs]

    def keep(self, idx):
        self.seeds = [self.seeds[i] for i in idx]
        for module in (self.policy, self.reference):
            module.logits = nn.Parameter(module.logits.detach()[idx].clone(),
                                         requires_grad=module.logits.requires_grad)


@pytest.fixture
def bandit():
    """The bandit on the task axis for one test, as a module of grpo_bench/tasks/ would register it."""
    registry.register("task", "bandit", config=BanditConfig)(Bandit)
    yield
    registry._REGISTRY["task"].pop("bandit")


@pytest.fixture(autouse=True)
def close_figures():
    yield
    import matplotlib.pyplot as plt
    plt.close("all")


def test_a_task_declared_once_reaches_every_report(bandit, tmp_path, capsys):
    doc = {"name": "arms", "description": "Big steps find the best arm sooner.",
           "claim": {"text": "a larger lr finds the best arm sooner", "source": "this test", "setting": "none",
                     "expect": ["big > small"]},
           # the bandit listed first: FINDINGS.md orders its columns as the file lists its settings
           "settings": {"bandit": {"task": {"name": "bandit"}, "epochs": 20, "seeds": 3},
                        "sort": {"task": "sort_lecture", "epochs": 2, "seeds": 2}},
           "base": {"group_size": 4, "inner_steps": 1, "eval_every": 5},
           "variants": {"big": {"lr": 0.3}, "small": {"lr": 0.001}}}
    path = tmp_path / "arms.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    for setting in ("bandit", "sort"):
        code = main(["run", str(path), "--setting", setting, "--out", str(tmp_path / "res" / f"arms_{setting}"),
                     "--workers", "1", "--threads", "1", "--no-progress"])
        assert code == 0, capsys.readouterr().err[-2000:]
    d = tmp_path / "res" / "arms_bandit"
    meta = json.loads((d / "ablation.json").read_text())
    # its own declarations, recorded so that plot and findings need not import it (infinite ends as null)
    recorded = {m["name"]: m for m in meta["task"].pop("metrics")}
    assert list(recorded) == ["eval/hit", "bandit/regret", "bandit/pulls", "bandit/std"]
    assert recorded["bandit/regret"] == {"name": "bandit/regret", "label": "regret", "range": [0, 1],
                                         "scale": "heavy", "higher_is_better": False, "tail": True}
    assert meta["task"] == {"name": "bandit", "label": "bandit toy", "short": "bandit", "main_metric": "final/eval/hit",
                            "curves": ["eval/hit", "bandit/regret"], "higher_is_better": True,
                            "verdict_metric": "final/eval/hit", "margin": None,
                            "margin_rule": "no margin declared for this task", "inert": {}}
    assert meta["settings"] == ["bandit", "sort"]
    assert json.loads((tmp_path / "res" / "arms_sort" / "ablation.json").read_text())["task"]["name"] == "sort"

    # the trainer summarised the task's `tail` metric: its mean over the last tenth of the rollouts
    summary = pd.read_csv(d / "summary.csv")
    table = pd.read_parquet(d / "metrics.parquet")
    run = summary.run[0]
    logged = table[(table.run == run) & (table.metric == "bandit/regret")].drop_duplicates("step")
    per_epoch = logged.groupby(logged.step // 1).value.first().to_numpy()  # one row per epoch (K = 1)
    assert len(per_epoch) == 20
    assert summary.loc[0, "final/bandit/regret"] == pytest.approx(per_epoch[-2:].mean(), abs=1e-12)

    # REPORT.md: the task's headline metric is a column and has its differences; the figures its curves
    text = (d / "REPORT.md").read_text()
    assert "| variant | runs ok | final reward | eval hit | wall s / run |" in text
    assert "## Differences in eval hit" in text and "equivalence margin ±0.05 (the metric's declared margin)" in text
    figs = {stem: fig for stem, fig, _ in F.build_figures(d)}
    head = figs["headline"]
    assert [ax.get_ylabel() for ax in head.axes if ax.get_ylabel()] == ["held-out hit rate", "regret"]
    assert head.axes[1].get_yscale() in ("log", "symlog")  # regret is declared heavy-tailed
    assert C.resolve_column(summary, None, "x", meta) == "final/eval/hit"

    # FINDINGS.md: a column per setting, named by the task's declaration, in the file's order
    assert main(["findings", str(tmp_path / "res")]) == 0
    findings = (tmp_path / "res" / "FINDINGS.md").read_text()
    assert "| claim | source | bandit toy | sorting toy | across tasks | tasks agree (Kendall's W) |" in findings
    assert "- bandit toy (eval hit, final, 3 seeds): " in findings
    # the bandit's hit rate declares a margin of its own; the toy's is its task's, on its held-out reward
    assert "**Margin δ.** bandit toy: ±0.05 (the metric's declared margin); sorting toy: ±0.01 (the task's: " \
        in findings
    assert "**Judged on** bandit toy: `final/eval/hit`, final; sorting toy: `final/eval/reward`, final." in findings


def test_adding_a_task_module_needs_no_registry_edit(tmp_path, monkeypatch):
    # every module of the task package is imported on the first lookup of the task axis
    pkg = tmp_path / "more_tasks"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "coin.py").write_text(
        "from dataclasses import dataclass\nfrom grpo_bench.registry import register\n\n"
        "@dataclass\nclass CoinConfig:\n    sides: int = 2\n\n"
        "@register('task', 'coin', config=CoinConfig)\nclass Coin:\n    \"\"\"Heads or tails.\"\"\"\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(registry._PROVIDERS, "task", ("more_tasks",))
    monkeypatch.setattr(registry, "_LOADED", registry._LOADED - {"task"})
    try:
        assert "coin" in registry.names("task")
        # a task that declares nothing is judged on its rollout reward
        info = M.declared_task("coin")
        assert (info.label, info.main_metric, info.curves, info.higher_is_better) == \
            ("coin", "final/reward", ("reward/mean",), True)
    finally:
        registry._REGISTRY["task"].pop("coin", None)
        sys.modules.pop("more_tasks.coin", None)


def test_the_shipped_tasks_declare_what_they_are_judged_on():
    for name in registry.names("task"):
        info = M.declared_task(name)
        # the headline's first curve is the main metric's, and "best" has a direction
        assert M.final_column(info.curves[0]) == info.main_metric, name
        assert M.get(info.main_metric).higher_is_better is not None, name
    assert (M.declared_task("sort").label, M.declared_task("arithmetic").label) == ("sorting toy", "arithmetic LM")
    # the trainer summarises what it did before the declarations, and the sampler's mismatch, per task
    shared = ("kl/seq", "response/length", "mismatch/k3", "mismatch/kl")
    assert M.tail(registry.get("task", "arithmetic")) == shared + ("response/length_correct",
                                                                   "response/length_incorrect")
    assert M.tail(registry.get("task", "sort")) == shared


def test_a_property_comes_from_the_first_declaration_that_sets_it(bandit):
    # a task's declaration comes before the core's family: bandit/std is (0, 0.5), any other */std (0, inf)
    assert M.get("bandit/std").range == (0, 0.5) and M.get("reward/std").range == (0, np.inf)
    # eval/accuracy_gain: range from the arithmetic task, higher_is_better from its own declaration
    m = M.get("final/eval/accuracy_gain")
    assert (m.name, m.range, m.margin, m.label, m.offset_of) == \
        ("eval/accuracy_gain", (-1, 1), None, "held-out accuracy gain", "eval/accuracy")
    # reward/format: range from */format (no family sets a margin: a task's comes from its headroom)
    assert (M.get("reward/format").range, M.get("reward/format").margin) == ((0, 1), None)
    assert M.get("loss/policy") == M.DEFAULT.__class__("loss/policy", range=(-np.inf, np.inf), scale="linear",
                                                       tail=False)
    assert M.metric_of("final/reward") == "reward/mean" and M.final_column("reward/mean") == "final/reward"
    assert M.metric_of("eval/accuracy") is None  # a per-step column is no final value
    with pytest.raises(ValueError, match="scale 'cubic'; valid: linear, log, heavy"):
        Metric("x", scale="cubic")


INF = np.inf
# what each core quantity can be, from its definition (a share in [0, 1], a ratio or a norm >= 0, an accuracy
# difference in [-1, 1]) and which way is better where one is: (range, scale, higher_is_better, tail); the
# shipped tasks' declarations add their directions and tails
CORE_FACTS = {
    "eval/accuracy": ((0, 1), "linear", True, False), "eval/accuracy_gain": ((-1, 1), "linear", True, False),
    "eval/pass@k": ((0, 1), "linear", True, False), "reward/format": ((0, 1), "linear", None, False),
    "clip/high_frac": ((0, 1), "linear", None, False), "ratio/max": ((0, INF), "heavy", None, False),
    "grad/norm": ((0, INF), "heavy", None, False), "kl/old": ((0, INF), "heavy", None, False),
    "time/step_s": ((0, INF), "heavy", None, False), "entropy": ((0, INF), "linear", None, False),
    "reward/std": ((0, INF), "linear", None, False), "adv/abs_mean": ((0, INF), "linear", None, False),
    "response/length": ((0, INF), "linear", None, True), "response/length_cv": ((0, INF), "linear", None, False),
    "response/length_correct": ((0, INF), "linear", None, True),
    "mismatch/k3": ((0, INF), "log", False, True), "mismatch/kl": ((-INF, INF), "linear", None, True),
    "mismatch/ratio_max": ((0, INF), "heavy", None, False), "kl/seq": ((-INF, INF), "linear", None, True),
    "reward/mean": ((-INF, INF), "linear", True, False), "loss/policy": ((-INF, INF), "linear", None, False),
    # names only a core family covers (the tasks declare eval/accuracy and the like themselves)
    "greedy/accuracy": ((0, 1), "linear", None, False), "greedy/accuracy_gain": ((-1, 1), "linear", None, False),
    "sample/pass@k": ((0, 1), "linear", None, False), "response/length_max": ((0, INF), "linear", None, False),
    "group/reward_cv": ((0, INF), "linear", None, False),
}


@pytest.mark.parametrize("name", list(CORE_FACTS))
def test_core_declarations_are_what_each_quantity_can_be(name):
    m = M.get(name)
    assert (m.range, m.scale, m.higher_is_better, m.tail) == CORE_FACTS[name], name
    assert (m.lo, m.hi) == m.range


def test_the_core_names_and_an_undeclared_metrics_bounds():
    assert (M.get("reward/mean").label, M.get("reward/mean").summary, M.get("reward/mean").column) == \
        ("rollout reward", "final reward", "final/reward")
    assert (M.get("mismatch/k3").label, M.get("mismatch/k3").summary) == ("sampler-trainer k3 KL",
                                                                          "sampler mismatch (k3)")
    assert M.get("mismatch/kl").label == "sampler-trainer KL (k1)"
    bare = Metric("x")   # no range declared: unbounded both ways
    assert (bare.lo, bare.hi, bare.heavy, bare.column) == (-INF, INF, False, "final/x")


def test_declarations_round_trip_through_json_and_refuse_an_empty_range():
    import dataclasses
    m = Metric("a/b", range=(-INF, INF), label="ab")
    enc = M._encode(m)
    assert enc == {"name": "a/b", "label": "ab", "range": [None, None]}
    assert M._decode(json.loads(json.dumps(enc, allow_nan=False))) == m
    assert M._decode(M._encode(Metric("c", range=(0, INF)))).range == (0, INF)
    with pytest.raises(ValueError, match="range \\(1, 1\\) is empty"):
        Metric("x", range=(1, 1))
    with pytest.raises(dataclasses.FrozenInstanceError):
        M.declared_task("sort").label = "x"
    assert [M._pattern(n) for n in ("eval/*", "a?", "[ab]", "eval/accuracy")] == [True, True, True, False]


def test_the_summary_readers_on_columns_with_and_without_values():
    """final_names holds a final column with any value (not one all missing, nor a per-step column);
    main_column prefers the task's main metric, then its curves, then a headline column; higher_is_better reads
    the task's record for its main metric and the declaration elsewhere (higher where it says neither)."""
    nan = float("nan")
    summary = pd.DataFrame({"run": ["a", "b"], "final/reward": [0.5, nan], "final/eval/accuracy": [nan, nan],
                            "final/kl/seq": [0.1, 0.2], "eval/accuracy": [0.3, 0.4]})
    assert M.final_names(summary) == {"reward/mean", "kl/seq"}
    sort_meta = {"task": M.declared_task("sort").record()}
    assert M.main_column(summary, sort_meta) == "final/reward"
    lm_meta = {"task": M.declared_task("arithmetic").record()}     # its main metric has no value here
    assert M.main_column(summary, lm_meta) == "final/reward"
    assert M.main_column(summary.drop(columns="final/reward"), lm_meta) is None
    assert M.resolve_column(summary, None, "x", sort_meta) == "final/reward"
    # a --metric is looked up among the final columns with a value: one all missing, or per step, is none
    assert M.resolve_column(summary, "kl/seq", "x", sort_meta) == "final/kl/seq"
    for missing in ("eval/accuracy", "final/eval/accuracy"):
        with pytest.raises(ConfigError, match=r"unknown .*; valid: final/reward, final/kl/seq$"):
            M.resolve_column(summary, missing, "x", sort_meta)
    assert [h[0] for h in M.headline_columns(summary, sort_meta)] == ["final/reward"]
    lower = {"task": {**M.declared_task("sort").record(), "higher_is_better": False}}
    assert M.higher_is_better("final/reward", lower) is False          # the record's direction, main metric
    assert M.higher_is_better("final/reward", sort_meta) is True
    assert M.higher_is_better("final/mismatch/k3", lower) is False     # declared lower-is-better
    assert M.higher_is_better("final/kl/seq", lower) is True           # declared neither: higher


def test_a_recorded_task_is_judged_by_its_record_where_it_is_not_registered():
    rec = {"name": "ghost_judged", "label": "ghost", "short": "g", "main_metric": "final/eval/ghost_hit",
           "curves": ["eval/ghost_hit"], "higher_is_better": False, "verdict_metric": "final/eval/ghost_hit", "margin": 0.02,
           "margin_rule": "by hand", "inert": {"loss": [["a", "b"], "same here"]},
           "metrics": [{"name": "eval/ghost_hit", "range": [0, 1]}]}
    info = M.recorded_task({"task": rec, "configs": {"v": {"task": {"name": "ghost_judged"}}}})
    assert M.recorded_task({"task": rec, "configs": ["not a mapping"]}) == info   # a damaged configs is no section
    assert (info.label, info.curves, info.higher_is_better, info.margin, info.margin_rule) == \
        ("ghost", ("eval/ghost_hit",), False, 0.02, "by hand")
    assert info.inert == {"loss": (("a", "b"), "same here")}
    assert info.record()["inert"] == {"loss": [["a", "b"], "same here"]}
    assert M.declared_task("ghost_judged") == info                    # remembered by reading the record
    assert "ghost_judged" in M.task_names() and M.get("eval/ghost_hit").range == (0, 1)
    # a registered task's judging is its declaration's, whatever its record says
    sort = M.recorded_task({"task": {**M.declared_task("sort").record(), "margin": 9.0}})
    assert sort.margin == M.declared_task("sort").margin != 9.0
    # a known task's headline is its own; one not known here, every task's
    assert [m.name for m in M.headline("sort")] == ["reward/mean", "mismatch/k3", "eval/accuracy", "eval/reward"]
    assert M.headline("no_such_task") == M.headline(None) != M.headline("sort")
    # no task recorded or recognisable: the first headline column with a value
    nan = float("nan")
    bare = pd.DataFrame({"run": ["a"], "final/mismatch/k3": [0.1], "final/eval/reward": [0.5], "final/x": [nan]})
    assert M.main_column(bare, None) == "final/mismatch/k3"


def test_a_task_that_declares_no_direction_reads_higher_and_its_inert_parts_are_tuples(bandit):
    class Quiet(Bandit):
        main_metric = "final/bandit/pulls"
        inert = {"loss": (["naive", "unclipped"], "one step a rollout")}

    registry.register("task", "quiet", config=BanditConfig)(Quiet)
    try:
        info = M.declared_task("quiet")
        assert info.higher_is_better is True
        assert info.inert == {"loss": (("naive", "unclipped"), "one step a rollout")}
        assert info.record()["inert"] == {"loss": [["naive", "unclipped"], "one step a rollout"]}
    finally:
        registry._REGISTRY["task"].pop("quiet", None)
        M._table.cache_clear()


def test_the_columns_a_task_writes_and_a_task_info_without_a_verdict_metric():
    """final_columns: what every run of the task writes (the reward's, the tail metrics', the held-out metrics it
    declares by name, never a pattern); final_known also takes a held-out column a declared pattern covers."""
    cls = registry.get("task", "arithmetic")
    cols = M.final_columns(cls)
    assert cols[:3] == ["final/reward", "final/reward_first", "final/samples"]
    assert "final/kl/seq" in cols and "final/eval/accuracy" in cols and not any("*" in c for c in cols)
    # an own metric that is neither held-out nor a tail one (response/finished) has no final column
    assert all(c in cols[:3] or c.removeprefix("final/") in M.tail(cls) or c.startswith("final/eval/") for c in cols)
    assert M.final_known(cls, "final/eval/accuracy") and M.final_known(cls, "final/eval/format")   # */format
    assert not M.final_known(cls, "final/eval/nothing") and not M.final_known(cls, "final/clip/high_frac")
    assert M.TaskInfo("t", "l", "s", "final/x", ("x",), True).verdict_metric == "final/x"


def test_without_the_heavy_packages_tasks_are_known_by_their_records(monkeypatch):
    """plot and findings on a machine without torch: the task modules cannot import, so no task is registered
    here and a record is the only source; a missing package that is not a heavy one is a real error."""
    def missing(name):
        def get(axis, n):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return get

    monkeypatch.setattr(M, "_NO_TASKS", [])
    monkeypatch.setattr(M.registry, "get", missing("torch.nn"))
    assert M._classes() is None and M._NO_TASKS == [True]
    monkeypatch.setattr(M, "_NO_TASKS", [])
    monkeypatch.setattr(M.registry, "get", missing("yaml"))
    with pytest.raises(ModuleNotFoundError):
        M._classes()
    assert M._NO_TASKS == []


def test_two_tasks_may_not_declare_one_name_differently(bandit):
    class Other(Bandit):
        metrics = (Metric("eval/hit", label="hits", range=(0, 1)),)

    registry.register("task", "other", config=BanditConfig)(Other)
    try:
        with pytest.raises(ValueError, match="metric 'eval/hit' is declared differently by tasks 'bandit' and 'other'"):
            M.get("eval/hit")
    finally:
        registry._REGISTRY["task"].pop("other")


# --------------------------------------------------------------- declarations drive the figures


def write_results(d, meta_task, curves: dict, finals: dict, seeds=range(5), variants=("a", "b")):
    """A results directory by hand: curves {metric: f(i, seed, step)}, finals {column: f(i, seed)}."""
    d.mkdir(parents=True)
    runs, rows, summary = [], [], []
    for i, v in enumerate(variants):
        for s in seeds:
            run = f"{v}-s{s}"
            runs.append(run)
            rows += [(run, v, s, step, m, f(i, s, step)) for m, f in curves.items() for step in range(0, 40, 2)]
            summary.append({"run": run, "variant": v, "seed": s, "status": "ok", "error": "", "wall_s": 1.0,
                            **{c: f(i, s) for c, f in finals.items()}})
    meta = {"name": d.name, "source": "x.yaml", "description": "", "axes": ["variant_name"],
            "variants": list(variants), "seeds": list(seeds), "runs": runs}
    if meta_task is not None:
        meta["task"] = meta_task
    (d / "ablation.json").write_text(json.dumps(meta))
    pd.DataFrame(summary).to_csv(d / "summary.csv", index=False)
    pd.DataFrame(rows, columns=["run", "variant", "seed", "step", "metric", "value"]).to_parquet(
        d / "metrics.parquet", index=False)
    return d


def bands(ax):
    return [p.vertices[:, 1] for c in ax.collections if isinstance(c, PolyCollection) for p in c.get_paths()]


def test_declared_ranges_and_scales_drive_the_figures(bandit, tmp_path):
    # eval/hit runs past 1 on some seeds (no core family knows the name: only the task's range clips it);
    # regret is heavy-tailed (median, log axis); pulls is declared log (mean, log axis)
    curves = {"eval/hit": lambda i, s, t: 0.6 + 0.02 * t + 0.2 * s,
              "bandit/regret": lambda i, s, t: float(np.exp(2 * np.sin(7 * t + s + i))),
              "bandit/pulls": lambda i, s, t: 10.0 ** (1 + t / 10 + 0.1 * s)}
    finals = {"final/reward": lambda i, s: 0.5 + 0.1 * i, "final/eval/hit": lambda i, s: 0.6 + 0.1 * i,
              "final/bandit/pulls": lambda i, s: 100.0 * (i + 1)}
    d = write_results(tmp_path / "b", M.declared_task("bandit").record(), curves, finals)
    figs = {stem: fig for stem, fig, _ in F.build_figures(d)}
    hit, regret = [ax for ax in figs["headline"].axes if ax.get_ylabel()]
    ys = np.concatenate([ln.get_ydata() for ln in hit.get_lines()] + bands(hit))
    assert ys.max() == 1.0 and ys.min() >= 0.6   # clipped at the declared top, not dropped
    assert regret.get_yscale() == "log"
    med = np.median([[np.exp(2 * np.sin(7 * t + s)) for s in range(5)] for t in range(0, 40, 2)], axis=1)
    # the median (20 points: unsmoothed), clipped to the declared range like every line
    assert np.allclose(regret.get_lines()[0].get_ydata(), np.clip(med, 0, 1)) and med.max() > 2
    pulls = figs["curve_bandit_pulls"].axes[0]
    assert pulls.get_yscale() == "log"
    mean = np.mean([[10.0 ** (1 + t / 10 + 0.1 * s) for s in range(5)] for t in range(0, 40, 2)], axis=1)
    assert np.allclose(pulls.get_lines()[0].get_ydata(), mean)
    assert P.describe_band("bandit/pulls", 5) == "mean over 5 seeds, band: 95% bootstrap CI of the mean, log scale"
    # REPORT.md's columns and verdict margins come from the same declarations
    s = pd.read_csv(d / "summary.csv")
    meta = ST.read_meta(d)
    assert [h[1] for h in R.headline_columns(s, meta)] == ["final reward", "eval hit", "pulls"]
    assert R.main_column(s, meta) == "final/eval/hit" and M.get("final/eval/hit").margin == 0.05


def test_lower_is_better_reads_as_best(bandit, tmp_path):
    regret = {"final/bandit/regret": lambda i, s: [0.5, 0.1, 0.3][i] + 0.01 * s}
    task = M.declared_task("bandit").record() | {"main_metric": "final/bandit/regret", "higher_is_better": False}
    d = write_results(tmp_path / "r", task, {"bandit/regret": lambda i, s, t: 0.1}, regret,
                      variants=("a", "b", "c"))
    s, meta = pd.read_csv(d / "summary.csv"), ST.read_meta(d)
    assert R.answer(s, "final/bandit/regret", ["a", "b", "c"], meta).startswith("`b` is best")
    side = C.load_side(d, None)
    assert side.column == "final/bandit/regret"
    text = C.markdown([side, side])
    ranks = text.split("\n\nCells:", 1)[0]   # the ranks table, not the variance or orderings ones after it
    rows = {line.split(" | ")[0]: line for line in ranks.splitlines() if line.startswith("| `")}
    assert rows["| `b`"].endswith("(1) |") and rows["| `a`"].endswith("(3) |")  # rank 1: the lowest regret
    assert "1 = best: the highest, or the lowest where lower is better" in text



def test_compare_reads_only_finished_runs_with_a_value(bandit, tmp_path):
    """load_side keeps a run that finished (status ok) and has the column's value: a failed run's leftover number or
    an ok run with none is not a seed's value."""
    regret = {"final/bandit/regret": lambda i, s: [0.5, 0.1, 0.3][i] + 0.01 * s}
    task = M.declared_task("bandit").record() | {"main_metric": "final/bandit/regret", "higher_is_better": False}
    d = write_results(tmp_path / "r", task, {"bandit/regret": lambda i, s, t: 0.1}, regret, variants=("a", "b", "c"))
    s = pd.read_csv(d / "summary.csv")
    a = s.index[s.variant == "a"]
    s.loc[a[0], "status"] = "failed"                      # its number stays in the table
    s.loc[a[1], "final/bandit/regret"] = float("nan")     # finished, but never measured it
    s.to_csv(d / "summary.csv", index=False)
    side = C.load_side(d, "final/bandit/regret")
    assert len(side.values["a"]) == len(a) - 2 and not np.isnan(side.values["a"]).any()
    assert len(side.values["b"]) == int((s.variant == "b").sum())


# ------------------------------------------------------------------------------- old results


def lm_like(i, s, t):
    return 0.1 + 0.005 * t * (i + 1) + 0.01 * s


@pytest.mark.parametrize("task, curves, finals", [
    ("sort", {"reward/mean": lm_like, "eval/reward": lm_like, "eval/accuracy": lm_like},
     {"final/reward": lambda i, s: 0.3 + 0.1 * i, "final/eval/accuracy": lambda i, s: 0.1 * s}),
    ("arithmetic", {"reward/mean": lm_like, "eval/accuracy": lm_like, "eval/accuracy_gain": lm_like,
                    "eval/pass@k": lm_like},
     {"final/reward": lambda i, s: 0.3, "final/eval/accuracy": lambda i, s: 0.1 * i + 0.01 * s,
      "final/eval/accuracy_gain": lambda i, s: 0.1 * i - 0.2, "final/eval/pass@k": lambda i, s: 0.5 + 0.01 * s})])
def test_results_without_a_recorded_task_plot_as_with_one(task, curves, finals, tmp_path):
    # ablation.json from before the task was recorded: known by a metric only its task logs
    old = write_results(tmp_path / "old" / "r", None, curves, finals)
    new = write_results(tmp_path / "new" / "r", M.declared_task(task).record(), curves, finals)
    assert M.task_of(ST.read_meta(old), R.final_names(pd.read_csv(old / "summary.csv"))).name == task
    for d in (old, new):
        R.make_report(d, "svg")
    for f in sorted(p.name for p in old.iterdir() if p.suffix == ".svg"):
        assert (old / f).read_bytes() == (new / f).read_bytes(), f
    assert (old / "REPORT.md").read_text() == (new / "REPORT.md").read_text()
    s = pd.read_csv(old / "summary.csv")
    assert R.main_column(s) == R.main_column(s, ST.read_meta(new)) == M.declared_task(task).main_metric


def test_a_recorded_task_wins_over_the_guess(bandit, tmp_path):
    # the metrics look like the toy's, but the results say they are the bandit's
    curves = {"reward/mean": lm_like, "eval/hit": lm_like, "bandit/regret": lm_like}
    finals = {"final/reward": lambda i, s: 0.3, "final/eval/hit": lambda i, s: 0.1 * i}
    d = write_results(tmp_path / "d", M.declared_task("bandit").record(), curves, finals)
    s, meta = pd.read_csv(d / "summary.csv"), ST.read_meta(d)
    assert R.main_column(s) == "final/reward" and R.main_column(s, meta) == "final/eval/hit"
    assert M.main_metrics(curves, meta) == ["eval/hit", "bandit/regret"]


def test_a_damaged_task_record_is_a_clear_error(tmp_path):
    d = write_results(tmp_path / "d", {"name": "sort", "label": "sorting toy"}, {"reward/mean": lm_like},
                      {"final/reward": lambda i, s: 0.3})
    from grpo_bench.errors import ConfigError
    with pytest.raises(ConfigError, match=r"ablation.json: task.short: missing or of the wrong type; the runner "
                                          r"writes a mapping with name \(str\), label \(str\)"):
        ST.read_meta(d)
