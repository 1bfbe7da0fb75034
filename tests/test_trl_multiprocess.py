"""GRPOBenchTrainer on two CPU processes (gloo) equals one process on the same global batch.

tests/trl_worker.py trains 4 optimizer steps (2 rollouts of 16 completions, 2 micro-batches of
gradient accumulation, 2 passes per rollout) with RLOO, clip-higher, k1 in the reward, a
reference refreshed every 2 rollouts, mask_truncated, the top_entropy step filter, a positive-example
NLL term and off-policy sequence masking (opsm, which acts on the second pass): once in
one process, once as two under torch.distributed.run (what `accelerate launch` runs for several
processes; `accelerate launch --cpu --num_processes 2` starts one process, not two). The two runs
agree: the advantages of every rollout and the trained weights to fp64 rounding, TRL's log
(its loss and the registry's metrics) at every step to fp32 rounding. Before the registry's
metrics were weighted by each process's tokens, loss/policy here differed by up to 9%. The two-process run
saves a checkpoint at step 3, inside its second generation; a third run resumes from it on two processes, each
with its own part of that generation, and ends bit for bit where the uninterrupted one did (the first version
of the resume could not load the generation there: torch.load cannot map to the processes' device, cpu:0).
"""
import os
import signal
import subprocess
import sys

import pytest
import torch

from helpers import ROOT, needs

needs("trl")
# one xdist worker for the module: its three trainings (40 s) are a module fixture, set up again by each worker
# that ran one of its tests
pytestmark = pytest.mark.xdist_group("trl_multiprocess")
WORKER = ROOT / "tests" / "trl_worker.py"
TIMING = ("step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second")


def _run(cmd):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    # its own session, so that a timeout kills torch.distributed.run's workers with it, not only the launcher
    p = subprocess.Popen(list(map(str, cmd)), cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        pytest.fail(f"{' '.join(map(str, cmd[1:]))} still running after 300 s; its stderr ends:\n{err[-4000:]}")
    assert p.returncode == 0, err[-4000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("trl_procs")
    _run([sys.executable, WORKER, d / "one.pt"])
    two = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", WORKER]
    _run(two + [d / "two.pt", "--save-at", 3])
    _run(two + [d / "resumed.pt", "--resume", d / "trl" / "checkpoint-3"])
    return [torch.load(d / f, weights_only=False) for f in ("one.pt", "two.pt", "resumed.pt")]


def test_two_processes_ran_over_gloo(runs):
    one, two, _ = runs
    assert (one["procs"], one["backend"]) == (1, None) and (two["procs"], two["backend"]) == (2, "gloo")


def test_same_global_batch_and_same_advantages(runs):
    one, two, _ = runs
    assert len(one["seen"]) == len(two["seen"]) == 2          # two rollouts
    from grpo_bench.tasks.lm.tokenizer import build_char_tokenizer
    pad = build_char_tokenizer().pad_token_id
    for a, b in zip(one["seen"], two["seen"]):
        # the test's premise: the same completions, in the same global order
        assert torch.equal(a["completion_ids"], b["completion_ids"])
        torch.testing.assert_close(b["advantages"], a["advantages"], rtol=1e-12, atol=1e-12)
        assert a["advantages"].abs().max() > 0.1
        # and a case where weighting matters: the processes' halves of a micro-batch hold unequal token counts
        tokens = (a["completion_ids"] != pad).sum(1)
        assert tokens[0:4].sum() != tokens[8:12].sum() or tokens[4:8].sum() != tokens[12:16].sum()


def test_every_logged_value_matches(runs):
    one, two, _ = runs
    assert len(one["log"]) == len(two["log"]) == 5            # 4 steps and the run's summary
    registry = {"loss/policy", "clip/frac", "clip/low_frac", "clip/high_frac", "entropy", "kl/value",
                "filter/top_entropy/gated", "loss/nll", "correction/opsm/masked_frac", "mismatch/kl"}
    per_rollout = {"kl/coef", "delta/abs_mean", "reward/penalised", "filter/mask_truncated/removed"}
    for step, (a, b) in enumerate(zip(one["log"], two["log"])):
        assert a.keys() == b.keys(), step
        if step < 4:
            assert registry <= a.keys() and (per_rollout <= a.keys()) == (step % 2 == 0), step
        for k in a.keys() - set(TIMING):
            # fp32 tolerance: TRL's entropies and its running loss are fp32 whatever the model's dtype
            assert b[k] == pytest.approx(a[k], rel=1e-6, abs=1e-9), (step, k)
    logged = lambda k: [row[k] for row in one["log"] if k in row]  # noqa: E731
    # not vacuous: the second pass over a rollout clips, the step filter gates some tokens, KL is on
    assert max(logged("clip/frac")) > 0.01 and all(0 < g < 1 for g in logged("filter/top_entropy/gated"))
    assert min(logged("filter/mask_truncated/removed")) > 0 and max(map(abs, logged("kl/value"))) > 0.01
    # opsm masks some responses of the second pass only (the first is on-policy); no sampler: no mismatch
    masked = logged("correction/opsm/masked_frac")
    assert masked[0] == masked[2] == 0 and masked[1] > 0 and masked[3] > 0 and set(logged("mismatch/kl")) == {0}


def test_the_trained_weights_match(runs):
    one, two, _ = runs
    assert one["weights"].keys() == two["weights"].keys()
    for k, w in one["weights"].items():
        torch.testing.assert_close(two["weights"][k], w, rtol=1e-10, atol=1e-12)
    assert max(w.abs().max() for k, w in one["weights"].items() if "lora_B" in k) > 0.01   # LoRA B starts at 0


def test_two_processes_resumed_inside_a_generation_go_on_bit_for_bit(runs):
    """The two-process run checkpointed at step 3, inside the generation begun there, and resumed from it: step 4
    trains on each process's own part of that generation (no generation in the resumed run) and ends where the
    uninterrupted run ended, bit for bit."""
    _, two, resumed = runs
    assert len(two["seen"]) == 2 and resumed["seen"] == []
    assert len(resumed["log"]) == 5
    for a, b in zip(two["log"][:4], resumed["log"][:4]):
        assert {k: v for k, v in a.items() if k not in TIMING} == {k: v for k, v in b.items() if k not in TIMING}
    assert all(torch.equal(resumed["weights"][k], w) for k, w in two["weights"].items())
