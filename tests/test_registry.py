"""The registry itself: how the package's parts, an installed package's and a user's load and in what order, what
a part's signature and docstring become, where presets are found, and what `list` prints.

A process loads the registry once, so the loading tests use a second registry module read from the same file
(`fresh`), into which the package's parts are imported afresh, the real one left as it was.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import sys
import types

import pytest

import grpo_bench
from grpo_bench import registry
from grpo_bench.tasks.sort import SortConfig
from helpers import ROOT


@pytest.fixture
def fresh(monkeypatch):
    """A registry module of its own, its `_load` importing grpo_bench.algos again into it; sys.modules and the
    package's attributes restored after (modules the test imported anew outside grpo_bench are kept)."""
    for axis in registry.AXES:   # the real one's entry points read now, not from the fake list below
        registry.names(axis)
    saved = dict(sys.modules)
    attrs = {n: getattr(grpo_bench, n) for n in ("registry", "algos") if hasattr(grpo_bench, n)}
    spec = importlib.util.spec_from_file_location("grpo_bench.registry", registry.__file__)
    mod = importlib.util.module_from_spec(spec)
    for name in [n for n in sys.modules if n == "grpo_bench.algos" or n.startswith("grpo_bench.algos.")]:
        del sys.modules[name]
    sys.modules["grpo_bench.registry"] = mod
    grpo_bench.registry = mod
    spec.loader.exec_module(mod)
    plugins: list = []
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda group=None: [p for p in plugins if group == mod.ENTRY_POINTS])
    mod.plugins = plugins
    try:
        yield mod
    finally:
        for name in [n for n in sys.modules if n.startswith("grpo_bench") and n not in saved]:
            del sys.modules[name]
        sys.modules.update({n: m for n, m in saved.items() if n.startswith("grpo_bench")})
        for n, v in attrs.items():
            setattr(grpo_bench, n, v)


def ours(axis: str) -> set[str]:
    """The package's own parts of an axis (another test in this process may have left a user's part registered)."""
    return {n for n in registry.names(axis) if not registry.origin(registry.entry(axis, n))}


class Plugin:
    """An entry point of the grpo_bench.parts group: load() runs `action` and counts itself."""

    def __init__(self, action, name="plug", value="plug_parts"):
        self.action, self.name, self.value, self.loads = action, name, value, 0

    def load(self):
        self.loads += 1
        return self.action()


def _loss(reg, name, body=lambda logp, deltas: (-logp * deltas[..., None], {})):
    """A user's loss (defined here, so its origin is this file) registered as `name` in registry `reg`."""
    def user_loss(logp, old_logp, deltas, mask):
        """A user's loss.

        Source: tests/test_registry.py: a scratch part.
        """
        return body(logp, deltas)
    return reg.register("loss", name)(user_loss)


def test_the_package_parts_load_into_a_fresh_registry_and_an_installed_package_once_after_them(fresh):
    plug = Plugin(lambda: _loss(fresh, "plug_loss"))
    fresh.plugins.append(plug)
    assert fresh._CONTRACT["check"] is None and not fresh._LOADED
    names = fresh.names("loss")
    assert set(names) == ours("loss") | {"plug_loss"} and plug.loads == 1
    # the contract check is the package's (installed with its parts), and entry points are read once per process
    assert fresh._CONTRACT["check"] is not None and fresh._CONTRACT["axes"]
    assert set(fresh.names("delta")) == ours("delta") and fresh.names("loss") == names
    assert plug.loads == 1 and fresh._LOADED == {"loss", "delta"}


def test_a_broken_installed_package_is_named(fresh):
    fresh.plugins.append(Plugin(lambda: 1 / 0))
    with pytest.raises(fresh.IncludeError, match=r"^entry point plug = plug_parts \(grpo_bench\.parts\): "
                                                 r"ZeroDivisionError: division by zero$"):
        fresh.names("kl")


def test_a_users_file_loads_after_the_package_so_a_clash_names_the_users(fresh, tmp_path):
    f = tmp_path / "clash.py"
    f.write_text("from grpo_bench.registry import register\n\n"
                 "@register('loss', 'clipped')\ndef clipped(logp, old_logp, deltas, mask):\n    return -logp, {}\n")
    with pytest.raises(fresh.IncludeError, match=rf"^{f}: ValueError: loss 'clipped' registered twice$"):
        fresh.include(f)
    assert fresh.origin(fresh.entry("loss", "clipped")) == ""   # the package's still


def test_a_part_registered_before_the_package_loaded_is_checked_when_looked_up(fresh):
    # registered before the package's parts (and their contract check) load: nothing has checked them yet
    _loss(fresh, "early", lambda logp, deltas: (-logp, {}))
    _loss(fresh, "one_tensor", lambda logp, deltas: -logp)    # not a pair
    assert "early" in fresh._REGISTRY["loss"] and "one_tensor" in fresh._REGISTRY["loss"]
    assert fresh.entry("loss", "early").name == "early"
    with pytest.raises(fresh.PartContractError, match=r"^loss 'one_tensor' in .*test_registry\.py: "):
        fresh.entry("loss", "one_tensor")
    assert "one_tensor" not in fresh._REGISTRY["loss"]   # refused, not left behind


def test_a_users_part_is_checked_once(fresh):
    fresh.names("loss")
    calls = []
    check = fresh._CONTRACT["check"]
    fresh._CONTRACT["check"] = lambda e: calls.append(e.name) or check(e)
    _loss(fresh, "mine")
    fresh.entry("loss", "mine")
    fresh.entry("loss", "mine")
    assert calls == ["mine"]
    # a check that finds a problem refuses the part at registration, in the words of its axis's contract
    fresh._CONTRACT["check"] = lambda e: "returned nothing useful"
    with pytest.raises(fresh.PartContractError, match=r"^loss 'other' in .*: returned nothing useful; a loss part is "
                                                      r"fn\(logp, old_logp"):
        _loss(fresh, "other")
    assert "other" not in fresh._REGISTRY["loss"]


def test_signatures_a_part_must_have():
    def reward_no_kwargs(prompts, completions):
        return [0.0] * len(completions)

    def reward_swapped(completions, prompts, **kwargs):
        return [0.0] * len(completions)

    def reward_ok(prompts, completions, extra=None, **kwargs):
        return [0.0] * len(completions)

    for bad in (reward_no_kwargs, reward_swapped):
        with pytest.raises(TypeError, match=r"signature must be \(prompts, completions, \*\*kwargs\)"):
            registry._params("reward", "r", bad)
    assert registry._params("reward", "r", reward_ok) == {}

    def no_default(logp, old_logp, deltas, mask, *, eps: float): ...
    def no_annotation(logp, old_logp, deltas, mask, *, eps=0.1): ...
    for bad in (no_default, no_annotation):
        with pytest.raises(TypeError, match="parameter 'eps' needs a type annotation and a default"):
            registry._params("loss", "x", bad)

    def ok(logp, old_logp, deltas, mask, *, eps: registry.Positive = 0.1): ...
    (p,) = registry._params("loss", "x", ok).values()
    assert (p.name, p.default, p.type, p.constraint) == ("eps", 0.1, float, registry.Range(0, None, lo_open=True))


def test_a_docstrings_source_line_keeps_its_own_colons():
    def part(per_token, mask):
        """Sum.

        Source: arXiv 2402.03300: DeepSeekMath, eq. 3
        """
        return (per_token * mask).sum()
    saved = dict(registry._REGISTRY["aggregate"])
    try:
        registry.register("aggregate", "colons")(part)
        got = registry._REGISTRY["aggregate"]["colons"]
    finally:
        registry._REGISTRY["aggregate"].clear()
        registry._REGISTRY["aggregate"].update(saved)
    assert (got.doc, got.source) == ("Sum.", "arXiv 2402.03300: DeepSeekMath, eq. 3")


def test_what_the_registry_holds_cannot_be_changed_in_place():
    e = registry.entry("loss", "clipped")
    for obj, attr in ((e, "name"), (e.params["clip_low"], "default"), (e.params["clip_low"].constraint, "lo"),
                      (registry.Choice(("a",)), "options")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, attr, None)


def test_a_digest_is_the_first_16_hex_of_sha256_over_names_and_bytes(tmp_path):
    (tmp_path / "b.py").write_bytes(b"B = 2\n")
    (tmp_path / "a.py").write_bytes(b"A = 1\n")
    (tmp_path / "_private.py").write_bytes(b"skipped\n")
    (tmp_path / "other").mkdir()
    one = tmp_path / "other" / "one.py"
    one.write_bytes(b"X = 0\n")
    want = hashlib.sha256(b"a.py\0A = 1\nb.py\0B = 2\none.py\0X = 0\n").hexdigest()[:16]
    assert registry.digest([str(tmp_path), str(one)]) == want and len(want) == 16
    one.write_bytes(b"X = 1\n")
    assert registry.digest([str(tmp_path), str(one)]) != want


def test_presets_are_the_checkouts_else_the_installed_packages(monkeypatch, tmp_path):
    find = registry.tasks_dir.__wrapped__   # lru_cache'd: its answer for this process is already made
    assert find() == ROOT / "tasks"
    monkeypatch.setattr(registry, "__file__", str(tmp_path / "site" / "grpo_bench" / "registry.py"))
    specs = {"grpo_bench_tasks": types.SimpleNamespace(submodule_search_locations=[str(tmp_path / "pkg"), "/other"])}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: specs.get(name))
    assert find() == tmp_path / "pkg"
    for missing in (None, types.SimpleNamespace(submodule_search_locations=[])):
        specs["grpo_bench_tasks"] = missing
        with pytest.raises(FileNotFoundError, match=r"no task presets: neither .*site/tasks nor an installed "
                                                    r"grpo_bench_tasks package"):
            find()
    # a checkout's tasks/ is one with its __init__.py
    (tmp_path / "site" / "tasks").mkdir(parents=True)
    with pytest.raises(FileNotFoundError):
        find()
    (tmp_path / "site" / "tasks" / "__init__.py").write_text("")
    assert find() == tmp_path / "site" / "tasks"


def test_module_function_beside_the_presets_and_a_task_class_keeps_its_config(monkeypatch, tmp_path):
    (tmp_path / "beside.py").write_text(
        "import torch\nfrom grpo_bench.tasks.sort import SortConfig, SortTask\n\n"
        "def plain(per_token, mask):\n    \"\"\"Plain sum.\"\"\"\n    return (per_token * mask).sum()\n\n"
        "class Mine(SortTask):\n    \"\"\"Sorting, the user's.\"\"\"\n    config = SortConfig\n")
    monkeypatch.setattr(registry, "tasks_dir", lambda: tmp_path)
    saved = {axis: dict(parts) for axis, parts in registry._REGISTRY.items()}
    included = dict(registry._INCLUDED)
    try:
        e = registry.entry("aggregate", "beside:plain")
        assert e.name == "beside:plain" and registry.origin(e) == str(tmp_path / "beside.py") and e.config is None
        t = registry.entry("task", "beside:Mine")
        assert t.config is SortConfig and registry.parameters(t)["vocab"] == 5
        for half in ("beside:", ":plain"):   # not module:function: an unknown name, with the valid ones
            with pytest.raises(registry.UnknownPart, match=rf"unknown aggregate '{half}'; valid: "):
                registry.entry("aggregate", half)
    finally:
        for axis, parts in saved.items():
            registry._REGISTRY[axis].clear()
            registry._REGISTRY[axis].update(parts)
        for key in set(registry._INCLUDED) - set(included):
            sys.modules.pop(registry._INCLUDED.pop(key), None)


def test_a_tasks_parameters_are_its_configs_fields():
    want = {f.name: getattr(SortConfig(), f.name) for f in dataclasses.fields(SortConfig)}
    assert registry.parameters(registry.entry("task", "sort")) == want and "vocab" in want
    assert registry.parameters(registry.entry("loss", "clipped")) == {"clip_low": 0.2, "clip_high": 0.2}


def test_list_prints_each_axis_its_flags_sources_files_and_why_a_part_runs_per_member(monkeypatch):
    text = registry.describe(lambda axis: ("clipped",) if axis == "loss" else ())
    lines = text.splitlines()
    assert [line for line in lines if not line.startswith(" ")] == [f"{axis}:" for axis in registry.AXES]
    clipped = next(i for i, line in enumerate(lines) if line.startswith("  clipped "))
    assert lines[clipped].endswith("[fused]") and lines[clipped + 1].strip() == "params: clip_low=0.2, clip_high=0.2"
    assert lines[clipped + 2].strip() == f"source: {registry.entry('loss', 'clipped').source}"
    assert not any(line.startswith("  cispo ") and "fused" in line for line in lines)
    cov = next(i for i, line in enumerate(lines) if line.startswith("  clip_cov "))
    assert "[per_member]" in lines[cov] and any(
        line.strip() == f"per member: {registry.entry('loss', 'clip_cov').traits['per_member']}"
        for line in lines[cov:cov + 4])
    assert sum(line.strip().startswith("source: ") for line in lines) == sum(
        bool(registry.entry(axis, n).source) for axis in registry.AXES for n in registry.names(axis))
    # a file line for each part of a user's (another test may have left one registered), none for the package's
    assert sum(line.strip().startswith("file: ") for line in lines) == sum(
        bool(registry.origin(registry.entry(axis, n))) for axis in registry.AXES for n in registry.names(axis))
    saved = dict(registry._REGISTRY["loss"])
    try:
        _loss(registry, "users_own")
        lines = registry.describe().splitlines()
    finally:
        registry._REGISTRY["loss"].clear()
        registry._REGISTRY["loss"].update(saved)
    i = next(i for i, line in enumerate(lines) if line.startswith("  users_own "))
    assert lines[i + 1].strip() == "source: tests/test_registry.py: a scratch part."
    assert lines[i + 2].strip() == f"file: {__file__}"
