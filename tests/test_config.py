"""Config loading: dotted --set keys reach the task and the run, strict types, the grid, hashes.

Error messages seen through the CLI are in test_cli.py; here the values a user's config
turns into, in-process.
"""
import dataclasses
import json

import pandas as pd
import pytest
import yaml

from grpo_bench.errors import ConfigError
from grpo_bench.config.run import RunConfig, build_dataclass, config_hash, parse_set, resolve_part, resolve_run, run_dict, set_dotted
from grpo_bench.config.ablation import load_ablation
from grpo_bench.sweep.runner import run_ablation
from helpers import ROOT

TINY = {"task": "sort", "epochs": 2, "inner_steps": 1, "group_size": 2}


def write(tmp_path, doc, name="abl.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(doc))
    return p


def resolved(abl):
    return {label: resolve_run(raw) for label, _, raw in abl.variants}


# ------------------------------------------------------------------ dotted --set


@pytest.mark.parametrize("task", ["sort", {"name": "sort", "n": 2, "prompts": None}, "sort_hard", {"name": "sort_lecture"}],
                         ids=["name", "mapping", "preset", "preset-mapping"])
def test_dotted_set_reaches_the_task_of_every_variant(tmp_path, task):
    # a task given as a name, a mapping or a preset: `--set task.x=...` reaches its resolved config
    path = write(tmp_path, {"base": {**TINY, "task": task, "loss": {"name": "clipped", "clip_low": 0.1}},
                            "grid": {"task.vocab": [5, 6], "lr": [0.01, 0.02]}})
    abl = load_ablation(path, sets=["task.n=4", "task.vocab=7", "loss.clip_high=0.3", "task.prompts=null"])
    cfgs = resolved(abl)
    assert len(cfgs) == 4
    for cfg in cfgs.values():
        assert (cfg.task.n, cfg.task.vocab, cfg.task.prompts) == (4, 7, None)   # --set wins over the grid
        assert cfg.loss == {"name": "clipped", "clip_low": 0.1, "clip_high": 0.3}
    assert sorted(c.lr for c in cfgs.values()) == [0.01, 0.01, 0.02, 0.02]
    # without --set the grid's task.vocab reaches each variant
    assert sorted(c.task.vocab for c in resolved(load_ablation(path)).values()) == [5, 5, 6, 6]


def test_dotted_set_reaches_nested_task_sections(tmp_path):
    # README: `--set task.model.source=DIR` runs arithmetic_lora.yaml unchanged on another checkpoint
    import shutil

    from grpo_bench.tasks.lm import shipped
    elsewhere = str(shutil.copytree(shipped.directory(), tmp_path / "gpt2"))  # a local model is checked at load
    abl = load_ablation(ROOT / "ablations" / "arithmetic_lora.yaml",
                        sets=[f"task.model.source={elsewhere}", "task.sampling.temperature=0.5", "lr=0.003"])
    for cfg in resolved(abl).values():
        assert cfg.task.model.source == elsewhere and cfg.task.sampling.temperature == 0.5
        assert cfg.lr == 0.003
    default = resolved(load_ablation(ROOT / "ablations" / "arithmetic_lora.yaml"))
    assert {c.task.model.source for c in default.values()} != {elsewhere}
    assert len({c.task.sampling.temperature for c in default.values()}) > 1   # cold/hot sampling variants


def test_dotted_set_reaches_the_run(tmp_path):
    # past the config: the run trains on the task the override describes and saves it beside itself
    path = write(tmp_path, {"name": "t", "base": {**TINY, "task": {"name": "sort", "prompts": None, "num_prompts": 4,
                                                                     "eval_prompts": 8}},
                            "grid": {"loss": ["naive", "clipped"]}, "seeds": 1})
    abl = load_ablation(path, sets=["task.n=5", "task.vocab=9"])
    summary = run_ablation(abl, tmp_path / "o", workers=1, progress=False)
    assert (summary.status == "ok").all() and len(summary) == 2
    for run in summary.run:
        saved = yaml.safe_load((tmp_path / "o" / "runs" / run / "config.yaml").read_text())
        assert saved["task"]["n"] == 5 and saved["task"]["vocab"] == 9
    m = pd.read_parquet(tmp_path / "o" / "metrics.parquet")
    assert set(m[m.metric == "response/length"].value) == {5.0}   # every toy response is n tokens long


def test_set_dotted_rules():
    d = {"loss": "clipped", "task": {"name": "sort"}}
    set_dotted(d, "loss.clip_high", 0.3, "--set")            # a part named by a string becomes a mapping
    set_dotted(d, "task.sampling.temperature", 2.0, "--set")  # a missing section is created
    set_dotted(d, "epochs", 3, "--set")
    assert d == {"loss": {"name": "clipped", "clip_high": 0.3}, "task": {"name": "sort", "sampling": {"temperature": 2.0}},
                 "epochs": 3}
    with pytest.raises(ConfigError, match=r"^--set: epochs.x: 'epochs' is not a mapping$"):
        set_dotted(d, "epochs.x", 1, "--set")


def test_parse_set_reads_yaml_values():
    assert parse_set(["a=1", "b.c=0.5", "d=[1, 2]", "e=null", "f=x=y", " g =true"]) == [
        ("a", 1), ("b.c", 0.5), ("d", [1, 2]), ("e", None), ("f", "x=y"), ("g", True)]
    for bad in ["novalue", "=3"]:
        with pytest.raises(ConfigError, match="expected key=value"):
            parse_set([bad])


# ------------------------------------------------------------------ strict types


def test_types_are_strict_and_ints_become_floats():
    cfg = build_dataclass(RunConfig, {"lr": 1, "epochs": 3, "kl_coef": 0}, "f.yaml")
    assert cfg.lr == 1.0 and isinstance(cfg.lr, float) and isinstance(cfg.kl_coef, float)
    for key, value, expected in [("epochs", 2.5, "int"), ("epochs", True, "int"), ("lr", "0.1", "float"),
                                 ("lr", False, "float"), ("filters", "x", "list")]:
        with pytest.raises(ConfigError, match=rf"^f.yaml: {key}: expected {expected}"):
            build_dataclass(RunConfig, {key: value}, "f.yaml")
    with pytest.raises(ConfigError, match=r"^f.yaml: epoch: unknown key; valid: task, delta"):
        build_dataclass(RunConfig, {"epoch": 3}, "f.yaml")
    with pytest.raises(ConfigError, match=r"^f.yaml: <root>: expected a mapping, got list"):
        build_dataclass(RunConfig, [1], "f.yaml")


def test_part_parameters_are_typed_and_resolved():
    assert resolve_part("loss", "clipped", "f", "loss") == {"name": "clipped", "clip_low": 0.2, "clip_high": 0.2}
    assert resolve_part("loss", {"name": "clipped", "clip_high": 1}, "f", "loss")["clip_high"] == 1.0
    assert resolve_part("aggregate", "seq_mean_token_sum_norm", "f", "aggregate", {"max_len": 7})["max_len"] == 7
    for value, key, words in [({"clip_high": 0.3}, "loss.name", "missing; valid: a2po, cispo"),
                              (3, "loss", "expected a loss name or a mapping with `name`, got 3"),
                              ({"name": "clipped", "clip_high": "x"}, "loss.clip_high", "expected float, got 'x'"),
                              ({"name": "clipped", "clip_high": -1}, "loss.clip_high", "must be > 0"),
                              ({"name": "nope"}, "loss.name", "unknown loss 'nope'")]:
        with pytest.raises(ConfigError, match=rf"^f: {key}: .*{words}"):
            resolve_part("loss", value, "f", "loss")


def test_resolved_run_holds_every_parameter():
    cfg = resolve_run({"task": {"name": "sort", "n": 4, "prompts": None}, "aggregate": "seq_mean_token_sum_norm",
                       "filters": ["dynamic_sampling", {"name": "overlong_punish", "cache": 2}]})
    assert cfg.aggregate == {"name": "seq_mean_token_sum_norm", "max_len": 4}   # the task's budget fills max_len
    assert cfg.filters == [{"name": "dynamic_sampling", "max_draws": 4},
                           {"name": "overlong_punish", "cache": 2, "max_len": 4}]
    assert cfg.delta == {"name": "zscore", "eps": 1e-6}
    d = run_dict(cfg)
    assert d["task"]["name"] == "sort" and d["task"]["n"] == 4 and d["epochs"] == 100
    assert resolve_run(d) == cfg   # what is saved beside a run resolves to the same run
    assert resolve_run({"task": cfg.task}).task == cfg.task   # a task config object, as the Python API passes it


@pytest.mark.parametrize("over,key,words", [
    ({"kl_placement": "logits"}, "kl_placement", "valid: loss, reward"),
    ({"backend": "cuda"}, "backend", "valid: auto, torch, chunked, triton"),
    ({"optimizer": "lion"}, "optimizer", "valid: adam, adamw, sgd"),
    ({"device": "tpu"}, "device", "valid: cpu, cuda, auto"),
    ({"kl_coef": -0.1}, "kl_coef", "must be >= 0"),
    ({"group_size": 1}, "group_size", "must be >= 2 with delta 'zscore'"),
    ({"group_size": 1, "delta": "raw", "filters": ["dynamic_sampling"]}, "group_size", "filters.0 'dynamic_sampling'"),
    ({"group_size": 0, "delta": "raw"}, "group_size", "must be >= 1, got 0"),
    ({"epochs": 0}, "epochs", "must be >= 1"),
    ({"inner_steps": 0}, "inner_steps", "must be >= 1"),
    ({"lr": 0.0}, "lr", "must be > 0"),
    ({"weight_decay": -1.0}, "weight_decay", "must be >= 0"),
    ({"max_grad_norm": -1.0}, "max_grad_norm", "must be >= 0"),
    ({"log_every": 0}, "log_every", "must be >= 1"),
    ({"eval_every": -1}, "eval_every", "must be >= 0"),
    ({"task": {"name": "sort", "n": 0}}, "task.n", "must be >= 1"),
    ({"task": {"name": "sort", "n": "3"}}, "task.n", "expected int"),
    ({"task": {"n": 3}}, "task.name", "missing; valid: arithmetic, gym, sort"),
    ({"task": "chess"}, "task.name", "unknown task 'chess'"),
])
def test_bad_values_name_their_key(over, key, words):
    with pytest.raises(ConfigError, match=rf"^run.yaml: {key.replace('.', '[.]')}: .*{words}"):
        resolve_run({"task": "sort", **over}, "run.yaml")


def test_boundary_values_are_accepted():
    cfg = resolve_run({"task": "sort", "group_size": 1, "delta": "raw", "kl_coef": 0, "eval_every": 0,
                       "weight_decay": 0, "max_grad_norm": 0, "epochs": 1, "inner_steps": 1, "log_every": 1})
    assert cfg.group_size == 1
    assert resolve_run({"task": "sort", "group_size": 2}).group_size == 2


def test_config_hash_follows_the_resolved_config():
    a = resolve_run({"task": "sort", "loss": "clipped"})
    b = resolve_run({"task": {"name": "sort"}, "loss": {"name": "clipped", "clip_low": 0.2}})
    assert config_hash(a) == config_hash(b) and len(config_hash(a)) == 10   # the same run however written
    assert config_hash(a) != config_hash(dataclasses.replace(a, lr=0.002))
    assert config_hash(a) != config_hash(resolve_run({"task": {"name": "sort", "vocab": 6}, "loss": "clipped"}))
    # a part's parameters in another order are the same run
    c = resolve_run({"task": "sort", "loss": {"name": "clipped", "clip_high": 0.28, "clip_low": 0.2}})
    d = resolve_run({"task": "sort", "loss": {"name": "clipped", "clip_low": 0.2, "clip_high": 0.28}})
    assert config_hash(c) == config_hash(d)


def test_with_seed_is_the_config_for_another_seed_and_a_copy():
    from grpo_bench.config.run import with_seed
    a = resolve_run({"task": "sort", "seed": 3, "loss": {"name": "clipped", "clip_high": 0.28}})
    b = with_seed(a, 11)
    assert (a.seed, b.seed) == (3, 11) and b == dataclasses.replace(a, seed=11)
    assert b.loss is not a.loss and b.task is not a.task   # runs never share a part's mapping


# ------------------------------------------------------------------ ablations


def test_grid_and_named_variants(tmp_path):
    path = write(tmp_path, {"name": "g-1", "description": " Why.  ", "base": TINY,
                            "variants": {"a": {"lr": 0.01}, "b": {"loss": "naive"}},
                            "grid": {"delta": ["centered", "rloo"], "task.vocab": [6]}, "seeds": [3, 5]})
    abl = load_ablation(path)
    assert abl.name == "g-1" and abl.description == "Why." and abl.seeds == [3, 5]
    assert abl.axes == ["variant_name", "delta", "task.vocab"]
    assert [label for label, _, _ in abl.variants] == ["a,delta=centered,task.vocab=6", "a,delta=rloo,task.vocab=6",
                                                         "b,delta=centered,task.vocab=6", "b,delta=rloo,task.vocab=6"]
    assert abl.variants[3][1] == {"variant_name": "b", "delta": "rloo", "task.vocab": 6}
    cfgs = list(resolved(abl).values())
    assert [c.lr for c in cfgs] == [0.01, 0.01, 1e-3, 1e-3] and cfgs[2].loss["name"] == "naive"
    assert load_ablation(path, seeds=2).seeds == [0, 1]
    # a grid of parts given as mappings: the label spells the mapping out
    path = write(tmp_path, {"base": TINY, "grid": {"loss": [{"name": "clipped", "clip_high": 0.28}]}}, "m.yaml")
    abl = load_ablation(path)
    assert abl.name == "m" and abl.seeds == [0, 1, 2] and abl.resources == {"cpus": 1, "gpus": 0}
    assert abl.variants[0][0] == 'loss={"clip_high": 0.28, "name": "clipped"}'  # yaml.safe_dump sorted the keys


@pytest.mark.parametrize("doc,key,words", [
    ({"base": TINY, "grid": {"lr": [0.1]}, "seeds": 0}, "seeds", "positive int or a list of ints, got 0"),
    ({"base": TINY, "grid": {"lr": [0.1]}, "seeds": True}, "seeds", "got True"),
    ({"base": TINY, "grid": {"lr": [0.1]}, "seeds": []}, "seeds", "got []"),
    ({"base": TINY, "grid": {"lr": [0.1]}, "seeds": [0, "a"]}, "seeds", "got [0, 'a']"),
    ({"base": TINY, "grid": {"lr": [0.1]}, "resources": {"gpu": 1}}, "resources.gpu", "unknown key; valid: cpus, gpus"),
    ({"base": TINY, "grid": {"lr": [0.1]}, "name": "a b"}, "name", "plain name"),
    ({"base": TINY, "grid": {"lr": []}}, "grid.lr", "non-empty list"),
    ({"base": TINY, "grid": {"lr": 0.1}}, "grid.lr", "non-empty list"),
    ({"base": TINY, "grid": [1]}, "grid", "expected a mapping key -> list"),
    ({"base": TINY, "variants": [1]}, "variants", "expected a mapping name"),
    ({"base": TINY, "variants": {"a": 1}}, "variants.a", "expected a mapping of run config keys"),
    ({"base": TINY}, "grid", "empty"),
    ({"base": [1], "grid": {"lr": [0.1]}}, "base", "expected a mapping"),
    ({"base": TINY, "grid": {"lr": [0.1]}, "extra": 1}, "extra", "unknown key; valid: name"),
    ({"base": TINY, "grid": {"lr": [-0.1]}}, "lr", "must be > 0"),
])
def test_bad_ablation_names_file_and_key(tmp_path, doc, key, words):
    path = write(tmp_path, doc)
    with pytest.raises(ConfigError) as e:
        load_ablation(path)
    assert (e.value.source, e.value.key) == (str(path), key) and words in e.value.message


def test_bad_yaml_and_missing_file(tmp_path):
    (tmp_path / "bad.yaml").write_text("base:\n  lr: [1\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: line \d+: invalid YAML"):
        load_ablation(tmp_path / "bad.yaml")
    with pytest.raises(ConfigError, match=r"nope.yaml: <file>: No such file"):
        load_ablation(tmp_path / "nope.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(ConfigError, match=r"list.yaml: <root>: expected a mapping"):
        load_ablation(tmp_path / "list.yaml")
    with pytest.raises(ConfigError, match=r"^--seeds: seeds: "):
        load_ablation(write(tmp_path, {"base": TINY, "grid": {"lr": [0.1]}}), seeds=0)


def test_resources(tmp_path):
    path = write(tmp_path, {"base": TINY, "grid": {"lr": [0.1]}, "resources": {"cpus": 0.5, "gpus": 2}})
    assert load_ablation(path).resources == {"cpus": 0.5, "gpus": 2}
    assert load_ablation(path, sets=["resources.gpus=0"]).resources == {"cpus": 0.5, "gpus": 0}
    for bad in ["resources.cpus=0", "resources.cpus=1.5", "resources.gpus=-1", "resources.cpus=.inf",
                "resources.cpus=true"]:
        with pytest.raises(ConfigError, match="^--set: resources"):
            load_ablation(path, sets=[bad])
    assert json.loads(json.dumps(load_ablation(path, sets=["resources.cpus=1"]).resources)) == {"cpus": 1, "gpus": 2}


def test_run_defaults_are_the_documented_ones():
    # README and the field docstrings: what a run is when the config says nothing
    cfg = resolve_run({})
    assert run_dict(cfg) | {"task": None} == {
        "task": None, "delta": {"name": "zscore", "eps": 1e-6}, "loss": {"name": "clipped", "clip_low": 0.2, "clip_high": 0.2},
        "aggregate": {"name": "seq_mean_token_mean"}, "kl": {"name": "k3"}, "kl_coef": 0.0, "kl_placement": "loss", "kl_track": False,
        "kl_ctrl": {"name": "fixed"}, "ref_update": {"name": "frozen"}, "filters": [], "group_size": 10, "epochs": 100,
        "inner_steps": 10, "optimizer": "adam", "lr": 1e-3, "weight_decay": 0.0, "max_grad_norm": 0.0, "seed": 0,
        "log_every": 1, "eval_every": 0, "backend": "auto", "device": "auto", "corrections": [], "entropy_coef": 0.0,
        "entropy_ctrl": {"name": "fixed"}, "nll_coef": 0.0, "adv_clip": None,
        "sampler": {"precision": "fp32", "staleness": 0}}
    assert run_dict(cfg)["task"]["name"] == "sort"


def test_type_check_of_each_kind():
    from grpo_bench.config.run import _type_ok
    assert _type_ok(1, float) == (True, 1.0) and _type_ok(True, float)[0] is False and _type_ok(1.5, int)[0] is False
    assert _type_ok(None, int | None) == (True, None) and _type_ok(3, int | None) == (True, 3)
    assert _type_ok(2, float | None) == (True, 2.0) and _type_ok("x", int | None)[0] is False
    assert _type_ok([1], list) == (True, [1]) and _type_ok({}, dict)[0] and not _type_ok([], dict)[0]
    assert _type_ok({}, dict[str, float])[0] and not _type_ok([], dict[str, float])[0]
    assert _type_ok([1], list[int])[0] and not _type_ok({}, list[int])[0]
    assert _type_ok("a", str)[0] and not _type_ok(1, str)[0] and _type_ok(object(), "anything")[0]
    with pytest.raises(ConfigError, match=r"^f: aggregate.max_len: expected int \| None, got 'x'"):
        resolve_part("aggregate", {"name": "seq_mean_token_sum_norm", "max_len": "x"}, "f", "aggregate")
    assert resolve_part("aggregate", {"name": "seq_mean_token_sum_norm", "max_len": None}, "f", "aggregate",
                        {"max_len": 6})["max_len"] == 6   # null: the task's budget


def _reproduce_sh_runs() -> dict[str, tuple[str, str | None, list[str]]]:
    """results directory -> (ablation file, setting, --set values) for every CPU sweep scripts/reproduce.sh makes."""
    import re
    text = (ROOT / "scripts/reproduce.sh").read_text()
    names = {k: re.search(rf"^{k}=\(([^)]*)\)", text, re.M).group(1).split()
             for k in ("sort_ablations", "lm_ablations", "claims")}
    out = {a: (a, None, []) for a in names["sort_ablations"] + names["lm_ablations"]}
    special = re.search(r"run \\\n\s*ablations/(\w+)\.yaml((?: --set \S+)+) --out results/(\S+)", text)
    out[special.group(3)] = (special.group(1), None, special.group(2).split()[1::2])
    for claim in names["claims"]:
        for setting in yaml.safe_load((ROOT / f"ablations/{claim}.yaml").read_text())["settings"]:
            if setting != "lm_acts":   # a GPU's (results/gpu/, gpu_run.sh), as reproduce.sh says
                out[f"{claim}_{setting}"] = (claim, setting, [])
    return out


def test_every_committed_sweep_is_what_its_file_plans_today():
    """Each results directory scripts/reproduce.sh makes holds the run ids (config hashes) its command plans today
    from its ablation file: a default, a preset, a file or the hash that changed since would leave a committed
    result that no longer says what it ran (and reproduce.sh, or README's main job on results/loss_modes, would
    start other runs). Every CPU sweep under results/ is one of them."""
    from grpo_bench.sweep.runner import plan
    runs = _reproduce_sh_runs()
    assert len([o for o in runs if (ROOT / "results" / o).is_dir()]) >= 50
    assert {"loss_modes", "spell_backward_grpo_lr1e-4", "dapo_ladder_sort", "kl_gradients_lm_seed2"} <= set(runs)
    stale = {}
    for out, (name, setting, sets) in runs.items():
        meta = ROOT / "results" / out / "ablation.json"
        if setting is not None and not meta.exists():
            continue   # a setting not run (FINDINGS' table says so: "not run")
        committed = json.loads(meta.read_text())["runs"]
        planned = [s.run_id for s in plan(load_ablation(ROOT / f"ablations/{name}.yaml", sets=sets, setting=setting))]
        if sorted(planned) != sorted(committed):
            stale[out] = sorted(set(committed) - set(planned))[:2]
    assert not stale, stale
    made = {p.parent.name for p in (ROOT / "results").glob("*/ablation.json")}
    # the headroom search's record (its files are checked to load, not run: tests/test_runner.py)
    assert made - set(runs) == {"headroom_search_start"}


def test_seeds_includes_and_graphs_at_their_bounds():
    """A seed is an int64 (torch.Generator's range); `include` is a list of path strings, said in one line
    otherwise; CUDA graphs are opt-in."""
    assert resolve_run({"seed": 2**63 - 1}).seed == 2**63 - 1
    with pytest.raises(ConfigError, match=r"seed: must be 0 <= seed < 2\*\*63"):
        resolve_run({"seed": 2**63})
    for bad in ("x.py", [1], ["a.py", 2]):
        with pytest.raises(ConfigError, match="include: expected a list of paths"):
            resolve_run({"include": bad})
    assert resolve_run({"task": "sort"}).cuda_graphs is False


def test_the_task_name_is_kept_beside_its_section():
    assert resolve_run({"task": {"name": "sort", "vocab": 6}}).task_name == "sort"
    assert resolve_run({"task": "sort"}).task_name == "sort"


# ------------------------------------------------------------------ an ablation file at its edges


def test_set_reaches_into_a_part_the_file_leaves_at_its_default(tmp_path):
    # the file names no loss, delta or task: --set reaches into the defaults rather than into an empty mapping
    # (which was refused as "<file>: loss.name: missing", blaming a file that never named a loss)
    path = write(tmp_path, {"base": {"epochs": 2}, "grid": {"lr": [0.1, 0.2]}})
    abl = load_ablation(path, sets=["loss.clip_high=0.28", "delta.eps=0.01", "task.vocab=7"])
    for cfg in abl.configs:
        assert cfg.loss == {"name": "clipped", "clip_low": 0.2, "clip_high": 0.28}
        assert cfg.delta == {"name": "zscore", "eps": 0.01} and (cfg.task_name, cfg.task.vocab) == ("sort", 7)
    d = {}
    set_dotted(d, "kl_ctrl.target", 0.1, "x")
    set_dotted(d, "sampler.staleness", 4, "x")   # not a part: no default name to reach into
    assert d == {"kl_ctrl": {"name": "fixed", "target": 0.1}, "sampler": {"staleness": 4}}
    with pytest.raises(ConfigError) as e:
        load_ablation(path, sets=["kl_ctrl.target=0.1"])
    assert (e.value.source, e.value.key) == ("--set", "kl_ctrl.target") and "'fixed' has no parameter" in e.value.message


def test_an_error_is_blamed_on_set_only_where_set_gave_that_key(tmp_path):
    path = write(tmp_path, {"base": TINY, "grid": {"loss": [{"name": "clipped", "clip_low": -1}]}})

    def blamed(sets):
        with pytest.raises(ConfigError) as e:
            load_ablation(path, sets=sets)
        return e.value.source, e.value.key

    assert blamed(["lr=0.01"]) == (str(path), "loss.clip_low")           # an unrelated --set: the file's value
    assert blamed(["loss.clip_low=-2"]) == ("--set", "loss.clip_low")    # the same key
    assert blamed(["loss={name: clipped, clip_low: -3}"]) == ("--set", "loss.clip_low")   # a key inside what --set gave
    # a --set whose value is fine alone but not with what the file leaves at its default (sort's 3-token prompts
    # for n = 1): the file alone loads, so --set is named
    good = write(tmp_path, {"base": TINY, "grid": {"lr": [0.1]}}, "good.yaml")
    with pytest.raises(ConfigError) as e:
        load_ablation(good, sets=["task.n=1"])
    assert (e.value.source, e.value.key) == ("--set", "task.prompts")


@pytest.mark.parametrize("doc,key,words", [
    ({"grid": {"lr": [0.1, 0.1]}}, "grid.lr", "value '0.1' is listed twice"),
    ({"grid": {"lr": [1, 1.0]}}, "grid.lr", "is listed twice"),                 # one float parameter
    ({"grid": {"seed": [0, 1]}}, "grid.seed", "seeds come from `seeds`"),
    ({"grid": {"lr": [0.1]}, "seeds": [1, 1]}, "seeds", "seed 1 is listed twice"),
    ({"grid": {"lr": [0.1]}, "seeds": [-1]}, "seeds", "0 <= seed < 2**63, got -1"),
    ({"grid": {"lr": [0.1]}, "seeds": [2**63]}, "seeds", "got 9223372036854775808"),
    ({"grid": {"lr": [0.1]}, "seeds": 100_001}, "seeds", "at most 100000 seeds, got 100001"),
    ({"grid": {"lr": [0.1]}, "include": 5}, "include", "expected a path or a list of paths"),
    ({"grid": {"lr": [0.1]}, "include": ["a.py", 2]}, "include", "got ['a.py', 2]"),
    ({"variants": {"x": {}, "y": {"lr": 0.01}}, "claim": {"text": "t", "source": "s", "expect": ["x > y", 3]}},
     "claim.expect", "got ['x > y', 3]"),
])
def test_more_bad_ablations_name_file_and_key(tmp_path, doc, key, words):
    path = write(tmp_path, {"base": TINY, **doc})
    with pytest.raises(ConfigError) as e:
        load_ablation(path)
    assert (e.value.source, e.value.key) == (str(path), key) and words in e.value.message


def test_grid_values_are_one_variant_whatever_their_keys_order_and_seeds_reach_their_bounds(tmp_path):
    path = tmp_path / "m.yaml"   # written by hand: yaml.safe_dump would sort the mappings' keys
    path.write_text("base: {task: sort, epochs: 2}\ngrid:\n  loss:\n    - {name: clipped, clip_high: 0.28}\n"
                    "    - {clip_high: 0.28, name: clipped}\n")
    with pytest.raises(ConfigError, match=r"grid\.loss: value .* is listed twice"):
        load_ablation(path)
    one = load_ablation(write(tmp_path, {"base": TINY, "grid": {"seed": [4]}, "seeds": [7]}, "one.yaml"))
    assert [label for label, _, _ in one.variants] == ["seed=4"] and one.seeds == [7]   # a file of one variant
    ok = write(tmp_path, {"base": TINY, "grid": {"lr": [0.1]}, "seeds": [0, 2**63 - 1]}, "ok.yaml")
    assert load_ablation(ok).seeds == [0, 2**63 - 1]
    assert len(load_ablation(ok, seeds=100_000).seeds) == 100_000
    assert load_ablation(ok, seeds=list(range(100_000))).seeds[-1] == 99_999
    with pytest.raises(ConfigError, match=r"^--seeds: seeds: expected at most 100000 seeds, got 100001$"):
        load_ablation(ok, seeds=list(range(100_001)))


def test_a_setting_that_retunes_or_narrows_badly_is_named(tmp_path):
    doc = {"base": TINY, "variants": {"a": {}, "b": {"lr": 0.01}},
           "settings": {"s": {"epochs": 3, "variants": {"a": {"lr": 0.02}, "b": 5}}}}
    with pytest.raises(ConfigError, match=r"settings\.s\.variants: expected a mapping variant name"):
        load_ablation(write(tmp_path, doc), setting="s")
    doc["settings"]["s"] = {"only": ["a", "zzz"]}
    with pytest.raises(ConfigError, match=r"settings\.s\.only: expected a list of the file's variants; valid: a, b, "
                                          r"got \['a', 'zzz'\]"):
        load_ablation(write(tmp_path, doc), setting="s")


def test_a_mechanism_threshold_must_be_above_zero(tmp_path):
    mech = {"acts": "clip", "metric": "clip/frac", "why": "w", "min": 0}
    doc = {"base": TINY, "variants": {"x": {}, "y": {"lr": 0.01}},
           "claim": {"text": "t", "source": "s", "expect": ["x > y"], "mechanism": {"default": mech}}}
    with pytest.raises(ConfigError, match=r"claim\.mechanism\.default\.min: expected a positive number"):
        load_ablation(write(tmp_path, doc))
    doc["claim"]["mechanism"]["default"] = {**mech, "min": float("inf")}
    with pytest.raises(ConfigError, match=r"claim\.mechanism\.default\.min: expected a positive number"):
        load_ablation(write(tmp_path, doc))
    doc["claim"]["mechanism"]["default"] = {**mech, "min": 1e-9}
    assert load_ablation(write(tmp_path, doc)).claim["mechanism"]["default"]["min"] == 1e-9


def test_a_claims_metric_is_checked_against_every_task_its_variants_train(tmp_path):
    doc = {"base": {"epochs": 2}, "variants": {"lm": {"task": "arithmetic"}, "toy": {"task": "sort"}},
           "claim": {"text": "t", "source": "s", "expect": ["lm > toy"], "metric": "response/length_correct"}}
    with pytest.raises(ConfigError, match=r"claim\.metric: 'response/length_correct': no run of task sort writes "
                                          r"final/response/length_correct; valid: final/reward"):
        load_ablation(write(tmp_path, doc))
    doc["claim"]["metric"] = "eval/accuracy"   # both write it
    assert load_ablation(write(tmp_path, doc)).claim["metric"] == "eval/accuracy"


def test_includes_are_blamed_on_where_they_were_given(tmp_path):
    good, bad = tmp_path / "good.py", tmp_path / "bad.py"
    good.write_text("X = 1\n")
    bad.write_text("raise RuntimeError('broken on purpose')\n")

    def blamed(own, given):
        doc = {"base": TINY, "grid": {"lr": [0.1]}} | ({"include": own} if own else {})
        with pytest.raises(ConfigError, match="broken on purpose") as e:
            load_ablation(write(tmp_path, doc), include=given)
        return e.value.source

    path = str(tmp_path / "abl.yaml")
    assert blamed(None, [str(bad)]) == "--include"
    assert blamed(["bad.py"], None) == path
    assert blamed(["good.py"], [str(bad)]) == "--include"
    assert blamed(["bad.py"], [str(good)]) == path
    # loaded, both reach every run (the file's own relative to the file), each once
    abl = load_ablation(write(tmp_path, {"base": TINY, "grid": {"lr": [0.1]}, "include": "good.py"}),
                        include=[str(good), str(good)])
    assert abl.configs[0].include == [str(good.resolve())]


def test_what_the_runner_records_for_an_ablation(tmp_path):
    from grpo_bench.config.ablation import ablation_record, variant_dicts
    doc = {"base": TINY, "variants": {"a": {}, "b": {"lr": 0.01}}, "settings": {"s1": {"epochs": 3}, "s2": {}}}
    abl = load_ablation(write(tmp_path, doc), setting="s1")
    configs = variant_dicts(abl)
    assert list(configs) == ["a", "b"] and configs["b"]["lr"] == 0.01 and configs["a"]["epochs"] == 3
    assert all("seed" not in c for c in configs.values())   # the variant's, for every seed
    record = ablation_record(abl)
    assert record["settings"] == ["s1", "s2"] and record["configs"] == configs and record["task"]["name"] == "sort"
    plain = load_ablation(write(tmp_path, {"base": TINY, "grid": {"lr": [0.1]}}, "plain.yaml"))
    assert ablation_record(plain)["settings"] is None
    two = load_ablation(write(tmp_path, {"base": {"epochs": 2}, "variants": {"lm": {"task": "arithmetic"},
                                                                            "toy": {"task": "sort"}}}, "two.yaml"))
    assert ablation_record(two)["task"] is None   # variants on two tasks: no one task to record


def test_check_orderings_without_configs_or_task_leaves_an_equivalence_to_findings():
    from grpo_bench.config.ablation import check_orderings
    claim = {"text": "t", "source": "s", "expect": ["a = b"]}
    check_orderings(claim, None, None, "w")   # nothing says what the metric is: findings checks it with the runs
    # the task a caller names wins over the one the configs' section declares (findings: the recorded one)
    import dataclasses
    from grpo_bench.store import metrics
    sort = metrics.declared_task("sort", {"name": "sort"})
    configs = {v: {"task": {"name": "sort"}, "lr": lr} for v, lr in (("a", 0.1), ("b", 0.2))}
    check_orderings(claim, configs, None, "w")   # sort's own margin, 0.01
    with pytest.raises(ConfigError, match="an '=' needs an equivalence margin"):
        check_orderings(claim, configs, None, "w", dataclasses.replace(sort, margin=None))
    with pytest.raises(ConfigError, match=r"^w: claim\.expect: 'a = b': an '=' needs an equivalence margin"):
        check_orderings({**claim, "metric": "final/kl/seq"}, None, None, "w")


# ------------------------------------------------------------------ YAML as every user file is read


def test_strict_yaml_finds_a_repeated_key_anywhere_and_says_where(tmp_path):
    from grpo_bench.config import strict_yaml
    with pytest.raises(strict_yaml.DuplicateKey) as e:
        strict_yaml.load("v:\n  a: 1\n  a: 2\n")
    assert str(e.value) == "v.a: duplicate key (lines 2 and 3); YAML would keep only the last"
    # inside a list's items too, named by the item's index
    with pytest.raises(strict_yaml.DuplicateKey, match=r"^filters\.1\.name: duplicate key \(lines 3 and 3\)"):
        strict_yaml.load("filters:\n  - {name: a}\n  - {name: b, name: c}\n")
    # an alias is checked where its anchor stands, once: a list that holds itself loads
    doc = strict_yaml.load("a: &x [1, *x]\n")
    assert doc["a"][1] is doc["a"]
    assert strict_yaml.load("lr: 1e-3\nn: 3e2\n") == {"lr": 0.001, "n": 300.0}
    # a byte that is not UTF-8 is named by its line
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"base:\n  lr: 0.1\n  task: sort\xff\n")
    with pytest.raises(ConfigError) as e:
        strict_yaml.read_yaml(bad)
    assert (e.value.key, e.value.message) == ("line 3", "not UTF-8 text: byte 0xff at offset 28; save the file as UTF-8")


def test_a_preset_without_a_named_task_section_is_refused(tmp_path, monkeypatch):
    from grpo_bench.config import presets
    monkeypatch.setattr(presets, "tasks_dir", lambda: tmp_path)
    (tmp_path / "fine_preset_t.yaml").write_text("description: ok\ntask: {name: sort, vocab: 7}\n")
    assert presets.section("fine_preset_t") == {"name": "sort", "vocab": 7} and presets.description("fine_preset_t") == "ok"
    for name, text in (("no_task_t", "description: x\n"), ("no_name_t", "task: {vocab: 3}\n"), ("a_list_t", "- 1\n"),
                       ("task_text_t", "task: sort\n")):
        (tmp_path / f"{name}.yaml").write_text(text)
        with pytest.raises(ValueError, match=rf"{name}\.yaml: a preset needs `description` and `task: "):
            presets.section(name)


# the GPU sweeps made before a file changed what they plan: what their runs recorded (ablation.json's configs)
GPU_MADE_BEFORE = {"adv_norm_countdown": ["task.eval_subset=250"], "ref_policy_countdown": ["task.eval_subset=250"],
                   "dapo_ladder_lm": ["eval_every=10"], "policy_losses_lm": ["eval_every=10"]}


def test_every_gpu_sweep_is_what_its_file_plans_with_the_gpu_stages_settings():
    """results/gpu/: 10 seeds, device cuda, backend torch (SmolLM2's: chunked, its fused head), as gpu_run.sh runs
    them; four were made before their files' evaluations changed (every evaluation on every problem, every 5
    rollouts), and plan their committed ids only with what those runs recorded."""
    from grpo_bench.sweep.runner import plan
    text = (ROOT / "scripts/gpu_run.sh").read_text()
    assert "--set device=cuda --set backend=torch" in text and "--set device=cuda --set backend=chunked" in text
    dirs = sorted((ROOT / "results/gpu").glob("*/ablation.json"))
    assert len(dirs) >= 15
    for meta_file in dirs:
        meta, out = json.loads(meta_file.read_text()), meta_file.parent.name
        sets = ["device=cuda", "backend=chunked" if meta["setting"] == "smollm2" else "backend=torch"]
        abl = load_ablation(ROOT / meta["source"], seeds=10, setting=meta["setting"], sets=sets + GPU_MADE_BEFORE.get(out, []))
        assert sorted(s.run_id for s in plan(abl)) == sorted(meta["runs"]), out
        if out in GPU_MADE_BEFORE:   # and today's file plans other runs
            assert not {s.run_id for s in plan(load_ablation(ROOT / meta["source"], seeds=10, setting=meta["setting"],
                                                             sets=sets))} & set(meta["runs"]), out
