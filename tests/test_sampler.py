"""The sampler dial: a copy of the policy that samples in another precision and/or some updates old.

Its own log-probs travel with the rollout, as an inference engine's do; the corrections read
them, and mismatch/* say how far it is from the trainer on what it sampled.
"""
import pytest
import torch

from grpo_bench.errors import ConfigError
from grpo_bench.config.run import resolve_run
from grpo_bench.registry import get
from grpo_bench.engine.sampling import Sampler
from grpo_bench.engine.trainer import train

SORT = {"task": {"name": "sort", "prompts": None, "n": 4, "vocab": 6, "num_prompts": 8, "dim": 16},
        "group_size": 4, "epochs": 12, "inner_steps": 3, "lr": 0.05}


pytestmark = pytest.mark.usefixtures("one_thread")


def _rows(**over):
    rows = []
    train(resolve_run({**SORT, **over}), rows)
    by = {}
    for _, m, v in rows:
        by.setdefault(m, []).append(v)
    return by


def test_the_sampler_loads_the_weights_of_k_updates_ago():
    cfg = resolve_run({**SORT, "sampler": {"staleness": 2}})
    task = get("task", "sort")(cfg.task, [cfg])
    params = [p for p in task.policy.parameters() if p.requires_grad]
    sampler = Sampler(task.policy, params, cfg.sampler)
    seen = [[p.detach().clone() for p in params]]
    for step in range(4):
        with torch.no_grad():
            for p in params:
                p.add_(1.0)
        sampler.updated(params)
        seen.append([p.detach().clone() for p in params])
        loaded = [p.detach() for p in sampler.load(params).parameters()]
        want = seen[max(0, len(seen) - 1 - 2)]   # two updates ago, the start until there were two
        assert all(torch.equal(a, b) for a, b in zip(loaded, want)), step
    assert not any(p.requires_grad for p in sampler.model.parameters())


def test_a_sampler_rollout_carries_the_samplers_own_logprobs():
    cfg = resolve_run({**SORT, "sampler": {"precision": "bf16"}})
    task = get("task", "sort")(cfg.task, [cfg])
    params = [p for p in task.policy.parameters() if p.requires_grad]
    model = Sampler(task.policy, params, cfg.sampler).load(params)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    ro = task.rollout(0, 0, 4, model)
    with torch.no_grad():
        want = torch.log_softmax(model(ro.prompts).float(), -1)            # the bf16 policy's distribution
        mine, _ = task.logprobs(ro)                                        # the fp32 trainer's
    p, b, g, n = ro.responses.shape
    for i in range(b):
        for j in range(g):
            for t in range(n):
                assert ro.sampler_logp[0, i, j, t] == want[0, i, t, ro.responses[0, i, j, t]]
    gap = (ro.sampler_logp - mine).abs()
    assert 0 < gap.max() < 0.05          # bf16 rounding: visible, small
    # the same stream: a sampler in fp32 with the current weights draws what the policy draws
    plain = task.rollout(0, 0, 4)
    assert plain.sampler_logp is None and plain.responses.shape == ro.responses.shape


def test_mismatch_rises_with_staleness_and_corrections_see_it():
    k3 = {k: sum(_rows(sampler={"staleness": k})["mismatch/k3"]) for k in (1, 4, 16)}
    assert 0 < k3[1] < k3[4] < k3[16]
    none = _rows()
    assert "mismatch/kl" not in none          # no sampler: nothing to measure
    # fp16 keeps 10 mantissa bits to bf16's 7: a smaller gap (the FP16 paper's point)
    bf16, fp16 = _rows(sampler={"precision": "bf16"}), _rows(sampler={"precision": "fp16"})
    assert 0 < max(fp16["mismatch/ratio_max"]) - 1 < max(bf16["mismatch/ratio_max"]) - 1
    # a token mask at a tight band drops the stale sampler's outliers, and says so
    masked = _rows(sampler={"staleness": 8}, corrections=[{"name": "token_mis", "low": 0.9, "high": 1.1}])
    assert max(masked["correction/token_mis/masked_frac"]) > 0


def test_a_fresh_fp32_sampler_is_no_sampler():
    assert not resolve_run({**SORT, "sampler": {"precision": "fp32", "staleness": 0}}).sampler.active
    rows_default, rows_explicit = [], []
    train(resolve_run(SORT), rows_default)
    train(resolve_run({**SORT, "sampler": {"precision": "fp32", "staleness": 0}}), rows_explicit)
    strip = lambda rows: [r for r in rows if not r[1].startswith("time/")]  # noqa: E731
    assert strip(rows_default) == strip(rows_explicit)


def test_lm_sampler_logprobs_are_the_models_own():
    """The generation loop's log-probs of its samples equal the task's log-probs of them under the same weights."""
    cfg = resolve_run({"task": {"name": "arithmetic", "ops": {"add": [0, 99]}, "prompts_per_step": 3, "eval_size": 12,
                                "model": {"source": "tiny-scratch", "layers": 1, "width": 32, "heads": 2},
                                "sampling": {"max_new_tokens": 4, "temperature": 0.7}},
                       "group_size": 3, "sampler": {"staleness": 1}})
    task = get("task", "arithmetic")(cfg.task, [cfg])
    with torch.no_grad():
        for layer in task.layers:
            layer.B.add_(0.3 * torch.randn(layer.B.shape, generator=torch.Generator().manual_seed(0)))
    params = [p for p in task.policy.parameters() if p.requires_grad]
    ro = task.rollout(0, 0, 3, Sampler(task.policy, params, cfg.sampler).load(params))
    with torch.no_grad():
        mine, _ = task.logprobs(ro)
    on = ro.mask > 0
    torch.testing.assert_close(ro.sampler_logp[on], mine[on], rtol=1e-5, atol=1e-5)
    assert (ro.sampler_logp[~on] == 0).all()


def test_an_fp32_sampler_head_is_the_upcast_gemm_of_its_bf16_hidden_states():
    """ScaleRL's fp32 head on the generator's side: the bf16 sampler's logits are the fp32 GEMM of its bf16
    hidden states and upcast weights, and its log-probs are those logits' own."""
    cfg = resolve_run({"task": {"name": "arithmetic", "ops": {"add": [0, 99]}, "prompts_per_step": 3, "eval_size": 12,
                                "model": {"source": "tiny-scratch", "layers": 1, "width": 32, "heads": 2},
                                "sampling": {"max_new_tokens": 4, "temperature": 0.7}},
                       "group_size": 3, "sampler": {"precision": "bf16", "head": "fp32"}})
    task = get("task", "arithmetic")(cfg.task, [cfg])
    params = [p for p in task.policy.parameters() if p.requires_grad]
    sampler = Sampler(task.policy, params, cfg.sampler)
    head = sampler.model.get_output_embeddings()
    assert head.weight.dtype == torch.bfloat16          # the weights stay the sampler's; only the GEMM is upcast
    h = torch.randn(5, head.weight.shape[1], generator=torch.Generator().manual_seed(1)).bfloat16()
    with torch.no_grad():
        got = head(h)
        want = h.double() @ head.weight.double().T      # exact products of bf16 values; fp32 sums them
        bf16 = torch.nn.functional.linear(h, head.weight)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)
    assert (bf16.double() - want).abs().max() > 10 * (got.double() - want).abs().max()
    ro = task.rollout(0, 0, 3, sampler.load(params))
    assert ro.sampler_logp is not None and (ro.sampler_logp[ro.mask > 0] < 0).all()
    # the policy's own head is untouched: the trainer's precision is task.model.cast_lm_head_to_fp32's
    policy_head = task.policy.get_output_embeddings()
    assert "forward" not in vars(policy_head) and not policy_head.upcast and head.upcast


def test_an_fp32_sampler_head_needs_an_lm_head():
    with pytest.raises(ValueError, match="sampler.head: fp32 needs a policy whose LM head is a plain linear layer"):
        train(resolve_run({**SORT, "sampler": {"head": "fp32"}}), [])


@pytest.mark.parametrize("key, value, message", [
    ("precision", "fp8", "unknown 'fp8'; valid: fp32, bf16, fp16"),
    ("head", "fp16", "unknown 'fp16'; valid: same, fp32"),
    ("staleness", -1, "must be >= 0"),
])
def test_bad_sampler_settings_are_one_line_errors(key, value, message):
    with pytest.raises(ConfigError, match=f"sampler.{key}: {message}"):
        resolve_run({**SORT, "sampler": {key: value}})


def test_an_fp32_head_on_both_sides_closes_the_bf16_heads_gap_on_the_shipped_start():
    """scripts/head_gap.py's arms on the arithmetic start (seed 0, one rollout, no update): the bf16 sampler-trainer
    gap of a bf16 model is mostly its head's rounding there (52 tokens, two layers), so an fp32 head on both sides
    shrinks it many times; an fp32 head on the trainer alone (the sampler's head left in bf16) would not."""
    import importlib.util
    from helpers import ROOT
    spec = importlib.util.spec_from_file_location("head_gap", ROOT / "scripts" / "head_gap.py")
    hg = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hg)
    k3 = {arm: hg.gap("arithmetic_scratchpad", arm, 4, 4)["mismatch/k3"] for arm in ("bf16_head", "fp32_head")}
    assert 0 < 5 * k3["fp32_head"] < k3["bf16_head"] < 1e-3, k3


def test_a_sampler_section_is_active_when_any_of_its_keys_leaves_the_trainers_own():
    """The trainer builds a separate sampler only then (one setting apart is enough; the default is none)."""
    from grpo_bench.config.run import SamplerSection
    assert not SamplerSection().active
    assert SamplerSection(precision="bf16").active and SamplerSection(staleness=1).active
    assert SamplerSection(head="fp32").active
    assert not SamplerSection(precision="fp32", staleness=0, head="same").active


def test_head_gap_appends_a_machines_rows_beside_the_others_and_runs_the_arms_asked(tmp_path, monkeypatch):
    """--append keeps the rows another processor measured (each row names its machine) and --arms runs only
    those named; without --append the file is replaced."""
    import importlib.util
    from helpers import ROOT
    spec = importlib.util.spec_from_file_location("head_gap", ROOT / "scripts" / "head_gap.py")
    hg = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hg)
    asked = []

    def fake(preset, arm, prompts, group):
        asked.append((preset, arm, prompts, group))
        return {"preset": preset, "arm": arm, "mismatch/k3": 0.5, "mismatch/kl": 0.1, "mismatch/ratio_min": 1.0,
                "mismatch/ratio_max": 1.0, "tokens": 4, "seconds": 0.0, "machine": "here"}

    monkeypatch.setattr(hg, "gap", fake)
    out = tmp_path / "gap.csv"
    assert hg.main(["p1", "--out", str(out)]) == 0
    assert [a for _, a, _, _ in asked] == list(hg.ARMS)
    asked.clear()
    assert hg.main(["p2", "--arms", "bf16_head", "--prompts", "3", "--append", "--out", str(out)]) == 0
    assert asked == [("p2", "bf16_head", 3, 8)]
    rows = out.read_text().splitlines()
    assert len(rows) == 1 + len(hg.ARMS) + 1 and rows[-1].startswith("p2,bf16_head,")
    assert hg.main(["p3", "--arms", "fp32_head", "--out", str(out)]) == 0
    assert len(out.read_text().splitlines()) == 2


def test_rollout_probe_counts_what_dapos_parts_would_act_on(tmp_path):
    """scripts/rollout_probe.py on the arithmetic start, whose shortest responses here have 3 tokens: a budget of 2
    cuts off every one, so every response and token is cut and every response ends in the last 2 tokens; at 60
    none is cut, and the lengths spread (scratchpads of up to 41 tokens beside direct answers).
    The CSV keeps each budget's row, and --append keeps another machine's."""
    import csv
    import importlib.util
    from helpers import ROOT
    spec = importlib.util.spec_from_file_location("rollout_probe", ROOT / "scripts" / "rollout_probe.py")
    rp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rp)
    out = tmp_path / "probe.csv"
    assert rp.main(["arithmetic_scratchpad", "--max-new-tokens", "2", "60", "--prompts", "4", "--group", "4",
                    "--out", str(out)]) == 0
    short, long_ = list(csv.DictReader(out.open()))
    assert (float(short["cut_off"]), float(short["cut_off_tokens"]), float(short["last_2_tokens"])) == (1.0, 1.0, 1.0)
    assert short["lengths"] == "0 0 16" and short["responses"] == "16"
    assert float(long_["cut_off"]) == 0.0 and float(long_["last_2_tokens"]) == 0.0
    assert 0 < float(long_["length_cv"]) and 0 <= float(long_["equal_reward_groups"]) <= 1
    assert sum(map(int, long_["lengths"].split())) == 16
    assert rp.main(["arithmetic_scratchpad", "--max-new-tokens", "3", "--prompts", "2", "--group", "2",
                    "--append", "--out", str(out)]) == 0
    assert len(list(csv.DictReader(out.open()))) == 3


def _script(name):
    import importlib.util
    from helpers import ROOT
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_clip_probe_marks_where_gspos_sequence_clip_would_bind():
    """scripts/clip_probe.py's loss is DAPO's, and its region per candidate range is GSPO's clip on the masked mean
    log-ratio, worked by hand: a response with A > 0 and token log-ratios 0.1, 0.3 has s = e^0.2 = 1.221, past
    1 + 4/3 * 0.1 but inside 1 + 4/3 * 0.2; one with A < 0 and log-ratio -0.5 (its second token masked, whatever
    its value) has s = 0.607, under 1 - 0.3."""
    from grpo_bench import registry
    from grpo_bench.algos.losses import clipped
    cp = _script("clip_probe")
    loss_fn = registry.entry("loss", cp._register([0.1, 0.2, 0.3])).obj
    old = torch.zeros(1, 2, 2)
    logp = torch.tensor([[[0.1, 0.3], [-0.5, 9.0]]])
    mask = torch.tensor([[[1.0, 1.0], [1.0, 0.0]]])
    deltas = torch.tensor([[1.0, -1.0]])
    loss, regions = loss_fn(logp, old, deltas, mask)
    want, _ = clipped(logp, old, deltas, mask, clip_low=0.2, clip_high=0.28)
    assert torch.equal(loss, want)
    assert regions["gspo_0p1"][0, 0].tolist() == [True, True] and not regions["gspo_0p2"][0, 0].any()
    assert regions["gspo_0p3"][0, 1].all() and regions["gspo_0p1"][0, 1].all()


def test_clip_probe_rows_fall_as_the_range_widens_and_match_dapo_between_two(tmp_path):
    """On the arithmetic start, one rollout of DAPO's updates: the published range clips more than DAPO, a wider range
    never clips more (its region is a subset), and the matched range interpolates the two that bracket DAPO's share."""
    import csv
    import math
    cp = _script("clip_probe")
    out = tmp_path / "clip.csv"
    assert cp.main(["arithmetic_scratchpad", "--rollouts", "1", "--prompts", "4", "--group", "4", "--inner-steps", "3",
                    "--lr", "0.003", "--out", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    dapo, cands, matched = rows[0], [r for r in rows if r["loss"] == "gspo"], [r for r in rows if r["loss"].startswith("gspo matched")]
    assert dapo["loss"] == "dapo" and dapo["updates"] == "3" and len(cands) == 7
    shares = [float(r["clipped"]) for r in cands]
    assert shares == sorted(shares, reverse=True) and shares[0] > float(dapo["clipped"]) > 0
    (m,) = matched
    lows = [float(r["clip_low"]) for r in cands]
    i = next(i for i in range(6) if shares[i] >= float(dapo["clipped"]) >= shares[i + 1])
    assert lows[i] <= float(m["clip_low"]) <= lows[i + 1]
    assert math.isclose(float(m["clip_high"]), round(4 / 3 * float(m["clip_low"]), 3))


def test_mechanism_probe_averages_each_rollouts_updates_and_tracks_the_kl_to_its_start(tmp_path):
    """scripts/mechanism_probe.py on the arithmetic start, 2 rollouts of 3 updates: a row per diagnostic and rollout,
    each the mean of that rollout's 3 logged updates (rollout-level numbers repeat in each), `all` the mean of
    them; the KL to the start is tracked (none in the loss): 0 while the sampler is the start, not after; the spread of
    reward/std over steps is its cv."""
    import csv
    import statistics
    mp = _script("mechanism_probe")
    out = tmp_path / "probe.csv"
    assert mp.main(["arithmetic_scratchpad", "--rollouts", "2", "--prompts", "4", "--group", "4", "--inner-steps", "3",
                    "--lr", "0.003", "--out", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    by = {(r["metric"], r["rollout"]): float(r["value"]) for r in rows}
    for metric in ("entropy", "kl/seq", "response/length_cv", "reward/std", "clip/frac"):
        assert {k[1] for k in by if k[0] == metric} == {"0", "1", "all"}, metric
        assert by[metric, "all"] == pytest.approx(statistics.fmean([by[metric, "0"], by[metric, "1"]]), abs=2e-6)
    assert by["kl/seq", "0"] == 0 != by["kl/seq", "1"]   # the first rollout's sampler is the start itself
    stds = [by["reward/std", "0"], by["reward/std", "1"]]   # constant within a rollout: the steps' cv is the rollouts'
    assert by["cv over steps of reward/std", "all"] == pytest.approx(statistics.pstdev(stds) / statistics.fmean(stds),
                                                                     abs=2e-6)
    assert {r["inner_steps"] for r in rows} == {"3"}
