"""Per-problem held-out outcomes (issue 27): each member's own, as alone; the mid-run subset and the full ends;
stored per run (checked like the metrics) and per ablation; the run ids of configs that never set the option.

The task-level tests script the model's answers (who is right on which problem, how many of its k samples
are), so a member's outcomes written for another, a count off by one or the subset taken at the wrong
evaluation shows as a wrong number rather than as one more zero.
"""
import copy
import json

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from grpo_bench.config.run import config_hash, resolve_run, run_dict
from grpo_bench.engine.trainer import train, train_population
from grpo_bench.errors import ConfigError
from grpo_bench.registry import get
from grpo_bench.store import rundir as ST
from grpo_bench.sweep import runner as RN
from helpers import needs

SMALL = {"name": "arithmetic", "ops": {"add": [0, 99]}, "model": {"source": "tiny-scratch", "layers": 1, "width": 32,
         "heads": 2}, "prompts_per_step": 4, "sampling": {"max_new_tokens": 5}, "eval_size": 12, "pass_k": 2}
# the shipped two-digit start (15% held-out greedy accuracy): outcomes that are not all 0; its split is 200 problems
TINY_LM = {"task": {"name": "arithmetic", "model": {"source": "tiny"}, "ops": {"add": [0, 99]}, "prompts_per_step": 3,
                    "sampling": {"max_new_tokens": 6}, "eval_size": 200, "pass_k": 2, "eval_subset": 50},
           "group_size": 3, "epochs": 3, "inner_steps": 1, "eval_every": 2}   # evaluations at steps 0, 1 and 2


@pytest.fixture(autouse=True)
def _private_cache_one_thread(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_BENCH_CACHE", str(tmp_path / "cache"))
    before = torch.get_num_threads()
    torch.set_num_threads(1)   # member == alone holds at one thread per population, the runner's default
    yield
    torch.set_num_threads(before)


def make(task=None, seeds=(0,), name="arithmetic", base=SMALL):
    from grpo_bench.config.presets import merge
    cfgs = [resolve_run({"task": merge(base, task or {}), "group_size": 3, "seed": s}) for s in seeds]
    return get("task", name)(cfgs[0].task, cfgs)


def scripted(task, greedy_right, sample_right, answer=lambda e: str(e.answer)):
    """The task's model replaced by a script: member i's greedy answer to held-out problem j is right iff
    greedy_right(i, j), its sample s iff sample_right(i, j, s). Rows come member-major as the task stacks them."""
    k = task.cfg.pass_k
    sampled, base = [], []
    base_accuracy = task._base_accuracy

    def base_model(n=None):   # the adapters off: greedy answers of one model, scripted as member 0's
        base.append(True)
        try:
            return base_accuracy(n)
        finally:
            base.pop()

    def generate(ids, attn, gens, n=1):   # n: samples of each prompt row
        sampled.append(gens is not None)
        return torch.zeros(len(ids) * n, 1)

    def decode(tokens):
        rows = len(tokens)
        p = 1 if base else task.size
        n = rows // p // (k if sampled[-1] else 1)
        texts = []
        for r in range(rows):
            if sampled[-1]:
                i, j, s = r // (n * k), r // k % n, r % k
                right = sample_right(i, j, s)
            else:
                i, j = r // n, r % n
                right = greedy_right(i, j)
            e = task.heldout[j]
            texts.append(answer(e) if right else answer(e) + "7")
        return texts, torch.ones(rows, 3), torch.ones(rows, dtype=torch.bool)

    task._generate, task._decode, task._base_accuracy = generate, decode, base_model
    return task


def greedy_script(i, j):
    return (j + i) % 3 == 0


def sample_script(i, j, s):   # member i gets (j + 2 i) % 3 of its 2 samples right, capped at 2
    return s < (j + 2 * i) % 3


def test_each_member_keeps_its_own_outcomes_and_the_scalars_are_their_means():
    task = scripted(make(seeds=(3, 0, 5)), greedy_script, sample_script)
    evals = task.evaluate()
    n = len(task.heldout)
    for i, (member, d) in enumerate(zip(task.outcomes, evals)):
        assert member["greedy"] == [int(greedy_script(i, j)) for j in range(n)]
        assert member["k_correct"] == [min(2, (j + 2 * i) % 3) for j in range(n)]
        assert d["eval/accuracy"] == sum(member["greedy"]) / n           # the scalar is the outcomes' mean
        assert d["eval/mean@k"] == pytest.approx(sum(member["k_correct"]) / (2 * n))
        assert d["eval/pass@k"] == pytest.approx(sum(c > 0 for c in member["k_correct"]) / n)
    assert "eval/problems" not in evals[0]   # logged only where a subset is set: default runs' rows unchanged


def test_a_mid_run_evaluation_takes_the_first_eval_subset_problems_and_the_others_all():
    task = scripted(make({"eval_subset": 5}, seeds=(0, 1)), greedy_script, sample_script)
    mid = task.evaluate(mid_run=True)
    for i, (member, d) in enumerate(zip(task.outcomes, mid)):
        assert member["greedy"] == [int(greedy_script(i, j)) for j in range(5)]
        assert len(member["k_correct"]) == 5 and d["eval/problems"] == 5
        assert d["eval/accuracy"] == sum(member["greedy"]) / 5
        # the gain is over the base model on the same 5 problems (the script's base answers as member 0)
        base = sum(greedy_script(0, j) for j in range(5)) / 5
        assert d["eval/accuracy_gain"] == pytest.approx(d["eval/accuracy"] - base)
    full = task.evaluate()
    assert [len(m["greedy"]) for m in task.outcomes] == [12, 12] and full[1]["eval/problems"] == 12
    assert full[1]["eval/accuracy"] == sum(greedy_script(1, j) for j in range(12)) / 12
    # eval_subset 0: every problem at every evaluation, and no eval/problems
    task = scripted(make(seeds=(0,)), greedy_script, sample_script)
    assert "eval/problems" not in task.evaluate(mid_run=True)[0] and len(task.outcomes[0]["greedy"]) == 12


def test_without_pass_at_k_k_correct_is_none():
    task = scripted(make({"pass_k": 0}, seeds=(0, 1)), greedy_script, sample_script)
    task.evaluate()
    assert [m["k_correct"] for m in task.outcomes] == [None, None]
    assert task.outcomes[1]["greedy"] == [int(greedy_script(1, j)) for j in range(12)]


@pytest.mark.parametrize("subset", [0, 7])
def test_the_gym_task_keeps_the_verifiers_outcomes(subset):
    needs("gym")
    base = {"name": "gym", "dataset": "countdown", "config": {"min_numbers": 4, "max_numbers": 4},
            "model": {"layers": 1, "width": 32, "heads": 2}, "prompts_per_step": 4, "eval_size": 20, "pass_k": 2,
            "eval_subset": subset}
    task = scripted(make(seeds=(0, 4), name="gym", base=base), greedy_script, sample_script,
                    answer=lambda e: e.answer)   # a countdown answer with "7" after it is no longer right
    task.evaluate(mid_run=True)
    n = subset or 20
    for i, member in enumerate(task.outcomes):
        assert member["greedy"] == [int(greedy_script(i, j)) for j in range(n)]
        assert member["k_correct"] == [min(2, (j + 2 * i) % 3) for j in range(n)]


# ------------------------------------------------------------------ the trainer: a population, alone


def test_a_population_members_outcomes_are_those_it_has_alone_at_every_evaluation():
    raws = [{**TINY_LM, "seed": s, "lr": lr} for s, lr in [(2, 1e-2), (0, 3e-2)]]
    rows, kept = [[], []], [[], []]
    train_population([resolve_run(copy.deepcopy(r)) for r in raws], rows, outcomes=kept)
    alone = []
    for raw in raws:
        o = []
        train(resolve_run(copy.deepcopy(raw)), [], o)
        alone.append(o)
    assert kept == alone
    assert [o[3] for o in kept[0]] != [o[3] for o in kept[1]]   # the members' samples differ: a swap would show
    for member, metric_rows in zip(kept, rows):
        steps = sorted({s for s, *_ in member})
        counts = {s: sum(1 for o in member if o[0] == s) for s in steps}
        # step 0 and the final evaluation score all 200 problems, the one between them the first 50
        assert list(counts.values()) == [200, 50, 200] and steps[0] == 0
        assert all([o[1] for o in member if o[0] == s] == list(range(counts[s])) for s in steps)
        accuracy = {s: v for s, k, v in metric_rows if k == "eval/accuracy"}
        assert sorted(accuracy) == steps
        for s in steps:   # every logged accuracy is the mean of the outcomes kept for it
            assert accuracy[s] == np.mean([o[2] for o in member if o[0] == s])
        assert [v for _, k, v in metric_rows if k == "eval/problems"] == [200, 50, 200]
        assert 0 < np.mean([o[2] for o in member]) < 1


def test_without_pass_at_k_the_trainer_keeps_each_outcome_without_k_correct():
    raw = {**copy.deepcopy(TINY_LM), "seed": 0, "epochs": 1}
    raw["task"]["pass_k"] = 0
    kept = []
    train(resolve_run(raw), [], kept)
    assert len(kept) == 400 and {o[3] for o in kept} == {None}   # both evaluations, all 200 problems


def test_a_task_without_outcomes_leaves_none():
    sort = {"task": {"name": "sort", "prompts": None, "num_prompts": 2, "eval_prompts": 4, "n": 2, "vocab": 3},
            "epochs": 2, "inner_steps": 1, "group_size": 2, "delta": "centered", "eval_every": 1, "seed": 0}
    kept, rows = [], []
    train(resolve_run(sort), rows, kept)
    assert kept == [] and any(k.startswith("eval/") for _, k, _ in rows)


# ------------------------------------------------------------------------- the option and run ids


def test_eval_subset_at_its_default_leaves_run_ids_and_saved_configs_as_they_were():
    raw = {"task": copy.deepcopy(SMALL), "seed": 0}
    plain = resolve_run(raw)
    raw["task"]["eval_subset"] = 0
    assert config_hash(resolve_run(raw)) == config_hash(plain) and "eval_subset" not in run_dict(plain)["task"]
    raw["task"]["eval_subset"] = 6
    other = resolve_run(raw)
    assert config_hash(other) != config_hash(plain) and run_dict(other)["task"]["eval_subset"] == 6
    assert resolve_run(run_dict(other)).task.eval_subset == 6   # config.yaml reads back
    for bad in (-1, 13):
        raw["task"]["eval_subset"] = bad
        with pytest.raises(ConfigError) as e:
            resolve_run(raw)
        assert e.value.key == "task.eval_subset" and "eval_size = 12" in str(e.value)


# ------------------------------------------------------------------------------------- storage


def _result(kept, status="ok"):
    return {"seed": 0}, [(0, "eval/accuracy", 0.5)], {"run": "r", "variant": "v", "seed": 0, "status": status}, kept


def test_a_runs_outcomes_are_written_checked_and_gathered(tmp_path):
    spec = RN.RunSpec("r", "v", {}, 0, {"task": copy.deepcopy(SMALL), "seed": 0})
    kept = [(0, j, j % 2, j % 3) for j in range(10)] + [(4, j, 1, None) for j in range(4)]
    RN.write_run(tmp_path, spec, _result(kept))
    d = tmp_path / "runs" / "r"
    o = pd.read_parquet(d / ST.OUTCOMES_FILE)
    assert dict(o.dtypes.astype(str)) == {"step": "int32", "problem": "int32", "greedy": "int8", "k_correct": "Int8"}
    assert [tuple(None if pd.isna(x) else int(x) for x in row) for row in o.itertuples(index=False)] == kept
    record = json.loads((d / "summary.json").read_text())["outcomes_file"]
    assert record["rows"] == 14 and record["name"] == ST.OUTCOMES_FILE and ST.check_run(d) == ("ok", "")
    # collected beside the metrics, labelled with the run
    (tmp_path / "ablation.json").write_text(json.dumps({"runs": ["r"], "axes": []}))
    summary = ST.collect(tmp_path)
    assert "outcomes_file" not in summary.columns
    long = ST.load_outcomes(tmp_path)
    assert list(long.columns) == ["run", "variant", "seed", "step", "problem", "greedy", "k_correct"]
    assert str(long.run.dtype) == "category" and (long.run == "r").all() and len(long) == 14
    assert long[ST.OUTCOME_COLUMNS].equals(o)
    # the file a run recorded, or the run is damaged and its outcomes never gathered
    (d / ST.OUTCOMES_FILE).write_bytes((d / ST.OUTCOMES_FILE).read_bytes()[:-9] + b"\0" * 9)
    assert ST.check_run(d)[0] == "damaged" and "outcomes.parquet" in ST.check_run(d)[1]
    (d / ST.OUTCOMES_FILE).unlink()
    assert ST.check_run(d) == ("damaged", "outcomes.parquet is missing")
    ST.collect(tmp_path)
    assert ST.load_outcomes(tmp_path) is None


@pytest.mark.parametrize("k_correct, dtype", [(None, "Int8"), (200, "Int16")], ids=["no pass@k", "k > 127"])
def test_k_correct_is_null_without_pass_at_k_and_wider_past_127(tmp_path, k_correct, dtype):
    spec = RN.RunSpec("r", "v", {}, 0, {"task": copy.deepcopy(SMALL), "seed": 0})
    RN.write_run(tmp_path, spec, _result([(0, j, 1, k_correct) for j in range(3)]))
    o = pd.read_parquet(tmp_path / "runs" / "r" / ST.OUTCOMES_FILE)
    assert str(o.k_correct.dtype) == dtype and (o.k_correct.isna().all() if k_correct is None else
                                                (o.k_correct == k_correct).all())


def test_a_run_without_outcomes_writes_no_file(tmp_path):
    spec = RN.RunSpec("r", "v", {}, 0, {"task": copy.deepcopy(SMALL), "seed": 0})
    RN.write_run(tmp_path, spec, _result([]))
    d = tmp_path / "runs" / "r"
    assert not (d / ST.OUTCOMES_FILE).exists() and "outcomes_file" not in json.loads((d / "summary.json").read_text())
    assert ST.check_run(d) == ("ok", "")


def test_an_lm_sweep_stores_outcomes_that_match_its_metrics(tmp_path):
    """End to end through the runner: every run's file, the ablation's table, its eval/accuracy rows."""
    base = {"task": copy.deepcopy(SMALL), "group_size": 3, "epochs": 3, "inner_steps": 1, "eval_every": 2}
    p = tmp_path / "abl.yaml"
    p.write_text(yaml.safe_dump({"name": "t", "base": base, "grid": {"lr": [0.01, 0.02]}, "seeds": 2}))
    from grpo_bench.config.ablation import load_ablation
    out = tmp_path / "o"
    RN.run_ablation(load_ablation(p), out, workers=1, progress=False)
    long, metrics = ST.load_outcomes(out), pd.read_parquet(out / "metrics.parquet")
    assert long.run.nunique() == 4 and len(long) == 4 * 3 * 12 and long.k_correct.between(0, 2).all()
    acc = metrics[metrics.metric == "eval/accuracy"].set_index(["run", "step"]).value
    mean = long.groupby(["run", "step"], observed=True).greedy.mean()
    assert np.array_equal(acc.sort_index().to_numpy(), mean.sort_index().to_numpy())
    for run in long.run.unique():
        own = pd.read_parquet(out / "runs" / run / ST.OUTCOMES_FILE)
        assert long[long.run == run][ST.OUTCOME_COLUMNS].reset_index(drop=True).equals(own)


def test_an_lm_ablations_outcomes_stay_small(tmp_path):
    """30 runs x 7 evaluations x 1000 problems (210,000 rows), answers as uncertain as coin flips and k = 8:
    about 120 KiB (a log-odds model with problem difficulty and learning gave about 140); the five numeric
    columns alone as uncompressed int64 would be 8.4 MB."""
    rng = np.random.default_rng(0)
    n = 30 * 7 * 1000
    runs = np.repeat([f"v{r // 5}-s{r % 5}-0123456789" for r in range(30)], 7000)
    table = pd.DataFrame({"run": runs, "variant": [r.split("-")[0] for r in runs],
                          "seed": np.repeat(np.arange(30) % 5, 7000),
                          "step": np.tile(np.repeat([0, 9, 19, 29, 39, 49, 59], 1000), 30),
                          "problem": np.tile(np.arange(1000), 210), "greedy": rng.integers(0, 2, n),
                          "k_correct": rng.binomial(8, 0.5, n)})
    ST._write_outcomes(table, tmp_path / ST.OUTCOMES_FILE)
    assert (tmp_path / ST.OUTCOMES_FILE).stat().st_size < 200 * 1024
    back = pd.read_parquet(tmp_path / ST.OUTCOMES_FILE)
    assert dict(back.dtypes.astype(str)) == {"run": "category", "variant": "category", "seed": "int64",
                                             "step": "int32", "problem": "int32", "greedy": "int8", "k_correct": "Int8"}
    # stored step-major (one evaluation's outcomes on a problem together across runs), the same rows
    assert (back.step.diff().dropna() >= 0).all()
    key = ["run", "step", "problem"]
    back = back.astype({"run": str}).sort_values(key, ignore_index=True)
    assert (back.k_correct.to_numpy() == table.sort_values(key).k_correct.to_numpy()).all()


def test_the_first_evaluation_is_the_base_models_and_a_moved_adapter_is_not():
    """The accuracy gain's base (every adapter off) is read from the first evaluation while the adapters still
    add exactly zero, and computed by its own pass once they do not; either way it is what that pass gives."""
    from grpo_bench.tasks.lm import stacked
    cfgs = [resolve_run({**copy.deepcopy(TINY_LM), "seed": 0})]
    task = get("task", "arithmetic")(cfgs[0].task, cfgs)
    calls = []
    generate = task._generate
    task._generate = lambda *a, **kw: calls.append(a[2] is None) or generate(*a, **kw)
    task.evaluate()
    assert sum(calls) == 1   # greedy: 200 problems, one chunk, and no second pass for the base
    first = task._base_hits
    with stacked.adapters(task.layers, stacked.OFF):
        task.evaluate()
    assert first == task.outcomes[0]["greedy"] and 0 < np.mean(first) < 1
    with torch.no_grad():   # an adapter that moved: its answers are no longer the base's
        for layer in task.layers:
            layer.B.normal_(0, 0.3, generator=torch.Generator().manual_seed(1))
    task._base_hits = None
    row = task.evaluate()[0]
    assert task._base_hits == first and task.outcomes[0]["greedy"] != first
    assert row["eval/accuracy_gain"] == pytest.approx(row["eval/accuracy"] - np.mean(first))
