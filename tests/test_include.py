"""A user's own parts and tasks, from their own files, without editing the package.

`include:` in an ablation (paths from the file), `--include` on the CLI, `module:function` on
any axis, and the `grpo_bench.parts` entry-point group of an installed package. The parts
written here are checked by the same parameter typing as the package's, run in spawned
workers (which load the files again from the run's config) and in a population of 4, whose
members must be bitwise the runs alone (CPU).
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pandas as pd
import pytest
import torch
import yaml

from grpo_bench import registry
from grpo_bench.errors import ConfigError
from grpo_bench.config.run import config_hash, resolve_run
from grpo_bench.config.ablation import load_ablation
from helpers import ROOT

PARTS = '''
"""A scratch directory's parts."""
import torch
from grpo_bench.registry import Positive, register
from grpo_bench.tasks.sort import SortConfig, SortTask


@register("loss", "scaled_pg")
def scaled_pg(logp, old_logp, deltas, mask, *, scale: Positive = 1.0):
    """-scale * ratio * A: the unclipped surrogate, scaled.

    Source: a user's scratch directory.
    """
    return -scale * torch.exp(logp - old_logp) * deltas[..., None], {}


@register("task", "sort_mine", config=SortConfig)
class MySort(SortTask):
    """The sorting toy under a name of the user's."""
'''

TINY = {"task": {"name": "sort", "prompts": None, "num_prompts": 2, "eval_prompts": 4, "n": 2, "vocab": 3},
        "epochs": 3, "inner_steps": 2, "group_size": 3, "delta": "zscore"}


def _cli(*args, env=None, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "grpo_bench", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


@pytest.fixture(autouse=True)
def _registry_restored(registry_restored):
    """Parts registered in this process by a test leave with it (each test's files are its own)."""
    yield
    sys.modules.pop("my_parts", None)


@pytest.fixture
def user(tmp_path):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "my_parts.py").write_text(PARTS)
    return d


def _ablation(tmp_path, include, variants, seeds=4, base=TINY):
    f = tmp_path / "abl.yaml"
    f.write_text(yaml.safe_dump({"name": "mine", "include": include, "base": base, "variants": variants,
                                 "seeds": seeds}))
    return f


def test_list_shows_a_users_part_with_its_file_and_parameters(user):
    r = _cli("list", "--include", str(user))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    i = next(k for k, line in enumerate(lines) if line.strip().startswith("scaled_pg"))
    assert "params: scale=1.0" in lines[i + 1] and "source: a user's scratch directory." in lines[i + 2]
    assert lines[i + 3].strip() == f"file: {user / 'my_parts.py'}"
    assert any(line.strip().startswith("sort_mine") for line in lines)
    # the package's own parts name no file
    j = next(k for k, line in enumerate(lines) if line.strip().startswith("clipped "))
    assert not any("file:" in line for line in lines[j:j + 4])


def test_a_users_loss_runs_in_workers_and_in_a_population_as_alone(tmp_path, user):
    abl = _ablation(tmp_path, ["mine"], {"mine": {"loss": {"name": "scaled_pg", "scale": 0.5}},
                                         "mine_task": {"task.name": "sort_mine"}, "plain": {}})
    alone, pop = tmp_path / "alone", tmp_path / "pop"
    # two spawned workers, one run each: each worker loads the user's file from the run's config
    r = _cli("run", str(abl), "--workers", "2", "--population", "1", "--out", str(alone), "--no-progress")
    assert r.returncode == 0, r.stderr
    r = _cli("run", str(abl), "--workers", "1", "--population", "4", "--out", str(pop), "--no-progress")
    assert r.returncode == 0, r.stderr
    a, p = (pd.read_csv(d / "summary.csv").set_index("run") for d in (alone, pop))
    assert (a.status == "ok").all() and len(a) == 12 and set(p.population) == {4}
    finals = [c for c in a.columns if c.startswith("final/")]
    pd.testing.assert_frame_equal(a.loc[p.index, finals], p[finals])   # bitwise: same seeds, same numbers
    # the user's loss is not the package's unclipped one at scale 1: half the step, other numbers
    assert not a[a.variant == "mine"]["final/reward"].equals(a[a.variant == "plain"]["final/reward"])
    # the user's task is the toy under another name: the same numbers as the toy's own runs
    mine_task = a[a.variant == "mine_task"].set_index("seed")[finals]
    plain = a[a.variant == "plain"].set_index("seed")[finals]
    pd.testing.assert_frame_equal(mine_task, plain)
    saved = yaml.safe_load((alone / "runs" / a.index[0] / "config.yaml").read_text())
    assert saved["include"] == [str(user)]


def test_the_run_id_follows_the_users_code(tmp_path, user):
    abl = _ablation(tmp_path, ["mine"], {"mine": {"loss": "scaled_pg"}})
    before = config_hash(resolve_run(load_ablation(abl).variants[0][2]))
    (user / "my_parts.py").write_text(PARTS.replace("-scale *", "-2 * scale *"))
    # the changed file is not re-imported in this process, but its bytes are in the hash
    assert config_hash(resolve_run(load_ablation(abl).variants[0][2])) != before


def test_module_function_names_a_part_on_any_axis(tmp_path, user, monkeypatch):
    monkeypatch.syspath_prepend(str(user))
    cfg = resolve_run({**TINY, "loss": {"name": "my_parts:scaled_pg", "scale": 2.0}})
    assert cfg.loss == {"name": "my_parts:scaled_pg", "scale": 2.0}
    # typed like the package's parts: a bad value names the key
    with pytest.raises(ConfigError, match=r"loss\.scale"):
        resolve_run({**TINY, "loss": {"name": "my_parts:scaled_pg", "scale": -1.0}})
    with pytest.raises(ConfigError, match=r"cannot load loss 'my_parts:nope'"):
        resolve_run({**TINY, "loss": "my_parts:nope"})


def test_an_installed_packages_entry_point_adds_its_parts(tmp_path):
    site = tmp_path / "site"
    (site / "plug-0.1.dist-info").mkdir(parents=True)
    (site / "plug-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: plug\nVersion: 0.1\n")
    (site / "plug-0.1.dist-info" / "entry_points.txt").write_text("[grpo_bench.parts]\nplug = plug_parts\n")
    (site / "plug_parts.py").write_text(textwrap.dedent('''
        from grpo_bench.registry import register

        @register("aggregate", "plug_sum")
        def plug_sum(per_token, mask):
            """Sum over every token: an installed package's aggregation."""
            return (per_token * mask).sum()
    '''))
    r = _cli("list", env={"PYTHONPATH": f"{ROOT}{os.pathsep}{site}"})
    assert r.returncode == 0, r.stderr
    line = next(line for line in r.stdout.splitlines() if line.strip().startswith("plug_sum"))
    assert "an installed package's aggregation" in line


@pytest.mark.parametrize("case, message", [
    ("missing", "{d}/nope.py: no such file or directory"),
    ("raises", "{d}/bad.py: ZeroDivisionError: division by zero"),
    ("clash", "{d}/clash.py: ValueError: loss 'clipped' registered twice"),
])
def test_bad_includes_are_one_line_errors_naming_the_file(tmp_path, case, message):
    d = tmp_path / "parts"
    d.mkdir()
    (d / "bad.py").write_text("x = 1 / 0\n")
    (d / "clash.py").write_text("from grpo_bench.registry import register\n\n"
                                "@register('loss', 'clipped')\ndef clipped(logp, old_logp, deltas, mask):\n"
                                "    return -logp, {}\n")
    name = {"missing": "nope.py", "raises": "bad.py", "clash": "clash.py"}[case]
    abl = _ablation(tmp_path, [f"parts/{name}"], {"a": {}}, seeds=1)
    r = _cli("run", str(abl), "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line == f"error: {abl}: include: " + message.format(d=d)
    assert not (tmp_path / "out").exists()


def test_registry_include_loads_a_file_once(user):
    first = registry.include(user)
    assert first == [user / "my_parts.py"] and registry.entry("loss", "scaled_pg").name == "scaled_pg"
    assert registry.include(user / "my_parts.py") == first   # no "registered twice" on a second include
    assert registry.origin(registry.entry("loss", "scaled_pg")) == str(user / "my_parts.py")
    assert registry.origin(registry.entry("loss", "clipped")) == ""


def test_the_readme_example_runs_a_users_loss_to_the_verdict_it_quotes(tmp_path):
    """README's "Testing your own variant" as a newcomer runs it (30 toy runs, about 30 s on 2 cores): the
    verdicts README quotes are the ones it gives here, and under the CPU pin on any CPU (a worker pins before
    the user's part is probed: tests/test_cpu_numerics.py)."""
    import re

    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "python -m grpo_bench run examples/my_variant/ablation.yaml --out scratch/my_variant" in readme
    r = _cli("list", "--include", "examples/my_variant")
    assert r.returncode == 0 and f"file: {ROOT / 'examples/my_variant/my_loss.py'}" in r.stdout
    out = tmp_path / "scratch"
    r = _cli("run", "examples/my_variant/ablation.yaml", "--out", str(out / "my_variant"), "--no-progress")
    assert r.returncode == 0, r.stderr
    assert "could be pinned" not in r.stderr, r.stderr
    summary = pd.read_csv(out / "my_variant" / "summary.csv")
    assert sorted(summary.variant.unique()) == ["dapo", "gspo", "soft_clip"] and (summary.status == "ok").all()
    r = _cli("findings", str(out))
    assert r.returncode == 0, r.stderr
    text = (out / "FINDINGS.md").read_text()
    row = {o: next(line for line in text.splitlines() if line.startswith(f"| `{o}` |"))
           for o in ("soft_clip = dapo", "soft_clip > gspo")}
    delta = {o: re.search(r"Δ ([+-][\d.]+)", row[o]).group(1) for o in row}
    pairs = re.search(r"\*\*undecided \(about (\d+) pairs", row["soft_clip = dapo"]).group(1)
    assert (f"`soft_clip = dapo` is undecided (Δ {delta['soft_clip = dapo']}, about {pairs} pairs to detect it), and "
            f"so is `soft_clip > gspo` at the end (Δ {delta['soft_clip > gspo']})") in readme
    assert "**undecided" in row["soft_clip > gspo"].split("<br>")[0]
    area = re.search(r"area \(beside; not the claim's quantity\): Δ ([+-][\d.]+), p_holm [\d.e-]+: holds<br>",
                     row["soft_clip > gspo"]).group(1)
    assert f"soft_clip leads GSPO (area Δ {area}: holds)" in readme


def test_soft_clip_is_the_formula_it_states():
    """The example's loss against its docstring, by hand: ratio e^0.1, tau 0.2, A = 2."""
    import math

    import torch

    registry.include(ROOT / "examples/my_variant")
    fn = registry.get("loss", "soft_clip")
    loss, regions = fn(torch.tensor([[[0.1]]]), torch.tensor([[[0.0]]]), torch.tensor([[2.0]]),
                       torch.ones(1, 1, 1), tau=0.2)
    assert regions == {}
    assert loss.item() == pytest.approx(-2 * (1 + 0.2 * math.tanh((math.exp(0.1) - 1) / 0.2)), rel=1e-6)


# ------------------------------------------- a user's part held to its axis's contract when it loads (issue 45)

CONTRACT_CASES = {
    "loss returns one tensor": ("loss", "def part(logp, old_logp, deltas, mask):\n"
                                "    return -torch.exp(logp - old_logp) * deltas[..., None]\n",
                                "returned a Tensor, not a pair (per-token loss, regions)"),
    "loss of the wrong arity": ("loss", "def part(logp, old_logp, deltas):\n    return -logp, {}\n",
                                "positional arguments must be ('logp', 'old_logp', 'deltas', 'mask'), "
                                "got ('logp', 'old_logp', 'deltas')"),
    "loss per response, not per token": ("loss", "def part(logp, old_logp, deltas, mask):\n"
                                         "    return -(logp * mask).sum(-1) * deltas, {}\n",
                                         "the per-token loss has shape (2, 3), expected (2, 3, 8)"),
    "loss not finite": ("loss", "def part(logp, old_logp, deltas, mask):\n"
                        "    return torch.log(logp) * deltas[..., None], {}\n",
                        "the per-token loss is not finite"),
    "loss raises": ("loss", "def part(logp, old_logp, deltas, mask):\n    return logp @ mask, {}\n",
                    "raised RuntimeError: "),
    "kl returns a float": ("kl", "def part(logp, ref_logp, old_logp):\n    return 0.1\n",
                           "the per-token estimate is a float, not a tensor"),
    "aggregate per response": ("aggregate", "def part(per_token, mask):\n    return (per_token * mask).sum(-1)\n",
                               "the aggregate has shape (2, 3), expected ()"),
    "delta of the wrong shape": ("delta", "def part(rewards, lengths, greedy, components, extra):\n"
                                 "    return rewards.flatten()\n", "the deltas has shape (6,), expected (2, 3)"),
    "ref_update returns None": ("ref_update", "def part(epoch):\n    pass\n", "what it returned is a NoneType"),
    # the other axes and the edges of each check
    "loss returns a triple": ("loss", "def part(logp, old_logp, deltas, mask):\n    return -logp, {}, None\n",
                              "returned a tuple of 3, not a pair (per-token loss, regions)"),
    "loss with one token not finite": ("loss", "def part(logp, old_logp, deltas, mask):\n"
                                       "    out = -logp * deltas[..., None]\n    out[0, 0, 0] = float('nan')\n"
                                       "    return out, {}\n", "the per-token loss is not finite"),
    "loss regions a list": ("loss", "def part(logp, old_logp, deltas, mask):\n    return -logp, []\n",
                            "the regions is a list, not a dict"),
    "loss region per response": ("loss", "def part(logp, old_logp, deltas, mask):\n"
                                 "    return -logp, {'low': deltas > 0}\n",
                                 "the regions['low'] has shape (2, 3), expected (2, 3, 8)"),
    "delta not finite": ("delta", "def part(rewards, lengths, greedy, components, extra):\n"
                         "    return rewards / 0\n", "the deltas is not finite"),
    "correction returns a pair": ("correction", "def part(logp, old_logp, sampler_logp, deltas, mask):\n"
                                  "    return torch.ones_like(logp), mask > 0\n",
                                  "returned a tuple of 2, not a triple (weight, keep, regions)"),
    "correction keeps by float": ("correction", "def part(logp, old_logp, sampler_logp, deltas, mask):\n"
                                  "    return torch.ones_like(logp), mask, {}\n",
                                  "keep has dtype torch.float32, expected torch.bool"),
    "kl_ctrl returns a bool": ("kl_ctrl", "def part(coef, observed_kl, n_samples):\n    return True\n",
                               "what it returned is a bool, not a number"),
    "kl_ctrl not finite": ("kl_ctrl", "def part(coef, observed_kl, n_samples):\n    return coef / 0.0 if False "
                           "else float('inf')\n", "what it returned is inf on finite inputs"),
    "entropy_ctrl returns a number": ("entropy_ctrl", "def part(coef, entropy):\n    return 0.1\n",
                                      "returned a float, not a pair (state, coefficient)"),
    "entropy_ctrl coefficient nan": ("entropy_ctrl", "def part(coef, entropy):\n"
                                     "    return coef, torch.tensor(float('nan'))\n", "the coefficient is nan"),
    "correction weight not finite": ("correction", "def part(logp, old_logp, sampler_logp, deltas, mask):\n"
                                     "    return torch.ones_like(logp) / 0, mask > 0, {}\n",
                                     "the weight is not finite"),
    "filter returns a dict": ("filter", "def part(batch):\n    return {}\n", "returned a dict, not a Batch"),
    "filter cuts the mask": ("filter", "def part(batch):\n    return batch.replace(mask=batch.mask[..., 0])\n",
                             "the batch's mask has shape (2, 3), expected (2, 3, 8)"),
}


@pytest.mark.parametrize("case", list(CONTRACT_CASES))
def test_a_users_part_that_breaks_its_axis_contract_is_refused_when_it_loads(tmp_path, case):
    """Before: it registered, every run of it failed late (`too many values to unpack (expected 2)` in
    REPORT.md) naming neither the part nor what it must return. Now the include itself is one line naming the
    part, its file, what is wrong and the axis's contract; the part is not left registered."""
    axis, body, problem = CONTRACT_CASES[case]
    f = tmp_path / "mine.py"
    f.write_text(f"import torch\nfrom grpo_bench.registry import register\n\n\n@register({axis!r}, 'mine')\n{body}")
    with pytest.raises(registry.IncludeError) as e:
        registry.include(f)
    line = str(e.value)
    assert "\n" not in line and line.startswith(f"{axis} 'mine' in {f}: {problem}"), line
    assert line.endswith(f"; a {axis} part is {registry.CONTRACTS[axis]}"), line
    assert "mine" not in registry.names(axis)


def test_a_users_part_is_called_with_its_defaults_and_max_len_as_the_budget(tmp_path):
    """The check calls a part with its parameters' defaults; a max_len left None (the run fills it) is the
    budget T = 8 there, and no other None default is touched. A part that sees otherwise raises, and is refused."""
    f = tmp_path / "ok.py"
    f.write_text("import torch\nfrom grpo_bench.registry import register\n\n\n@register('filter', 'budgeted')\n"
                 "def part(batch, *, max_len: int | None = None, cap: float | None = None, keep: float = 0.5):\n"
                 "    assert max_len == 8 and cap is None and keep == 0.5, (max_len, cap, keep)\n"
                 "    return batch\n")
    registry.include(f)
    assert "budgeted" in registry.names("filter")


SEEN_PARTS = """
import torch
from grpo_bench.registry import register
SEEN = {}


@register("loss", "seen_loss", needs=("ref_logp",))
def loss(logp, old_logp, deltas, mask):
    SEEN["loss"] = (logp, old_logp, deltas, mask)
    return -logp, {}


@register("delta", "seen_delta", needs=("ids", "logp", "entropy", "sum_pi_sq", "ref_rewards"), token_level=True)
def delta(rewards, lengths, greedy, components, extra):
    SEEN["delta"] = (rewards, lengths, greedy, components, extra)
    return extra.logp


@register("kl_ctrl", "seen_kl_ctrl")
def kl_ctrl(coef, observed_kl, n_samples):
    SEEN["kl_ctrl"] = (coef, observed_kl, n_samples)
    return coef


@register("entropy_ctrl", "seen_entropy_ctrl")
def entropy_ctrl(coef, entropy):
    SEEN.setdefault("entropy_ctrl", []).append((coef, entropy))
    return {"start": coef} if entropy is None else coef, 0.01
"""


def test_a_users_part_is_checked_on_inputs_in_its_axiss_domain(tmp_path):
    """What the check hands a part is what a run would: log-probs below 0, a mask of 0s and 1s with one response
    cut short and none empty, lengths its token counts, the reference's log-probs where the part needs them,
    sum pi^2 in (0, 1], token ids and entropies of their kind, a controller's count of samples a positive int and
    an entropy controller its own state back. Inputs outside it would refuse a correct part."""
    from grpo_bench.algos import contracts

    f = tmp_path / "seen.py"
    f.write_text(SEEN_PARTS)
    registry.include(f)
    import importlib
    seen = importlib.import_module(registry._INCLUDED[str(f.resolve())]).SEEN
    x = contracts._inputs()
    logp, old, deltas, mask = seen["loss"]
    assert torch.equal(old, x["ref_logp"]) and not torch.equal(old, x["old_logp"])   # needs=("ref_logp",)
    assert (logp < 0).all() and (old < 0).all() and deltas.shape == (2, 3)
    lengths = mask.sum(-1)
    assert set(mask.unique().tolist()) == {0.0, 1.0} and (lengths > 0).all() and (lengths < 8).any()
    assert ((mask[..., 1:] <= mask[..., :-1]).all())                                 # tokens, then padding
    rewards, got_lengths, greedy, components, extra = seen["delta"]
    assert torch.equal(got_lengths, lengths) and rewards.shape == (2, 3) and greedy.shape == (2,)
    assert (extra.sum_pi_sq > 0).all() and (extra.sum_pi_sq <= 1).all() and (extra.entropy >= 0).all()
    assert extra.ids.dtype == torch.int64 and (extra.ids >= 0).all() and extra.ref_rewards.shape[0] == 2
    coef, kl, n = seen["kl_ctrl"]
    assert coef > 0 and kl >= 0 and isinstance(n, int) and n == 6
    (c0, e0), (state, e1) = seen["entropy_ctrl"]
    assert e0 is None and state == {"start": c0} and e1 >= 0


def test_the_loss_returning_one_tensor_is_one_line_from_run_and_module_function(tmp_path, monkeypatch):
    """The issue's case end to end: `run` with the include exits 2 on one line naming the loss and its file,
    before any run; `module:function` naming the same function does too, naming the config key."""
    d = tmp_path / "parts"
    d.mkdir()
    (d / "one_tensor.py").write_text("import torch\nfrom grpo_bench.registry import register\n\n\n"
                                     "def loss(logp, old_logp, deltas, mask):\n"
                                     "    return -torch.exp(logp - old_logp) * deltas[..., None]\n\n\n"
                                     "register('loss', 'one_tensor')(loss)\n")
    abl = _ablation(tmp_path, ["parts/one_tensor.py"], {"a": {"loss": "one_tensor"}}, seeds=1)
    r = _cli("run", str(abl), "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"error: {abl}: include: loss 'one_tensor' in {d / 'one_tensor.py'}: returned a Tensor, "
                           "not a pair (per-token loss, regions); a loss part is fn(logp, old_logp (B, G, T)"), line
    assert not (tmp_path / "out").exists()
    (tmp_path / "bare_loss.py").write_text("import torch\n\ndef loss(logp, old_logp, deltas, mask):\n"
                                           "    return -logp * deltas[..., None]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as e:
        resolve_run({**TINY, "loss": "bare_loss:loss"})
    assert e.value.key == "loss" and f"loss 'bare_loss:loss' in {tmp_path / 'bare_loss.py'}: returned a Tensor" \
        in str(e.value), str(e.value)


def test_every_shipped_part_meets_its_axis_contract():
    """The check refuses nothing the package ships: each of its parts, called as a user's would be, passes
    (a check too strict for a real part would refuse users' parts like it)."""
    from grpo_bench.algos import contracts

    checked = 0
    for axis in contracts.CHECKED_AXES:
        for name in registry.names(axis):
            assert contracts.problem(registry.entry(axis, name)) is None, (axis, name)
            checked += 1
    assert checked >= 60
    assert set(contracts.CHECKED_AXES) | {"reward", "task"} == set(registry.AXES) == set(registry.CONTRACTS)


def test_the_include_docs_show_each_axis_contract():
    text = (ROOT / "docs" / "extending.md").read_text()
    for axis, contract in registry.CONTRACTS.items():
        assert f"| `{axis}` | `{contract}` |" in text, axis


def test_a_run_config_loads_its_own_includes(user):
    """A config resolved on its own (a worker, a TRL run, resolve_run by hand) loads the files it names before
    it looks its parts up; nothing had included them in this process."""
    assert "scaled_pg" not in registry.names("loss")
    cfg = resolve_run({**TINY, "include": [str(user)], "loss": {"name": "scaled_pg", "scale": 2.0}})
    assert cfg.loss["name"] == "scaled_pg" and "scaled_pg" in registry.names("loss")
