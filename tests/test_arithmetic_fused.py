"""The arithmetic task's fused LM-head log-probs against its materialised-logits path (backend torch).

Same log-probs, entropies and LoRA gradients on GPT-2 (tied head) and on a Qwen2 model with
Qwen2.5's 151,936-token vocabulary (untied head), with and without a temperature, with LoRA
on the head, for the policy and both kinds of reference; the head is never called and no
allocation is anywhere near (N, T, V); a short run gives the same metrics either way.
"""
import copy

import pytest
import torch
from helpers import cpu_allocations, needs

from grpo_bench.config.run import resolve_run
from grpo_bench.config.presets import merge
from grpo_bench.registry import get

SMALL = {"name": "arithmetic", "ops": {"add": [0, 99]}, "model": {"source": "tiny-scratch", "layers": 1, "width": 32,
         "heads": 2}, "prompts_per_step": 4, "sampling": {"max_new_tokens": 5}, "eval_size": 12, "pass_k": 2}
QWEN_VOCAB = 151_936


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_BENCH_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """A saved Qwen2 model with a 151,936-token vocabulary, 1 layer of width 32, over the character tokenizer."""
    from grpo_bench.tasks.lm import models
    from grpo_bench.tasks.lm.tokenizer import build_char_tokenizer

    path = tmp_path_factory.mktemp("wide") / "qwen2"
    tok = models.prepare_tokenizer(build_char_tokenizer(size=QWEN_VOCAB))
    models.build_qwen2(tok, n_layer=1, width=32, n_head=4, seed=3, vocab=QWEN_VOCAB).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def make(task: dict, backend: str):
    cfg = resolve_run({"task": merge(SMALL, task), "group_size": 3, "backend": backend, "device": "cpu"})
    return get("task", "arithmetic")(cfg.task, cfg)


def perturb(task, seed=0, scale=0.3):
    # LoRA's B starts at zero, where every adapter is the base model: move it
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in task.layers:
            layer.B.add_(scale * torch.randn(layer.B.shape, generator=g))


def pair(task: dict, backend: str = "chunked"):
    """(materialised, fused) tasks over the same weights and adapter, and a rollout of the first."""
    ref, fused = make(task, "torch"), make(task, backend)
    assert not ref._fused and fused._fused
    for t in (ref, fused):
        perturb(t)
    ro = ref.rollout(0, 0, 3)
    return ref, fused, ro


def step(task, ro, reference=False):
    """log p, entropy and d(sum w*logp + sum entropy)/d(LoRA params), over unmasked tokens."""
    task.policy.zero_grad(set_to_none=True)
    logp, ent = task.logprobs(ro, reference=reference)
    on = ro.mask > 0
    if reference:
        return logp.detach(), None, {}
    w = torch.linspace(-1, 1, int(on.sum()))
    (logp[on] * w).sum().add(ent[on].sum()).backward()
    grads = {n: p.grad.clone() for n, p in task.policy.named_parameters() if p.grad is not None}
    task.policy.eval()
    return logp.detach(), ent.detach(), grads


def assert_same(ref, fused, ro, reference=False):
    on = ro.mask > 0
    lp_r, ent_r, g_r = step(ref, ro, reference)
    lp_f, ent_f, g_f = step(fused, ro, reference)
    torch.testing.assert_close(lp_f[on], lp_r[on], rtol=1e-5, atol=1e-5)
    if not reference:
        torch.testing.assert_close(ent_f[on], ent_r[on], rtol=1e-5, atol=1e-5)
        assert g_r and g_f.keys() == g_r.keys()
        for name in g_r:
            # relative to the tensor's largest entry; fp32 sums over 151,936 logits in another
            # order differ by ~sqrt(V) * 6e-8 = 2e-5 of it
            scale = g_r[name].abs().max().clamp(min=1e-12)
            torch.testing.assert_close(g_f[name] / scale, g_r[name] / scale, rtol=1e-4, atol=5e-5,
                                       msg=lambda m, name=name: f"{name}: {m}")
    return lp_r[on]


CASES = {
    "gpt2": {},
    "gpt2-T0.7": {"sampling": {"temperature": 0.7}},
    "gpt2-lora-on-head": {"lora": {"targets": ["c_attn", "lm_head"]}},
    "qwen2-151936": {"model": {"source": "WIDE"}},
    "qwen2-151936-T1.5-lora-on-head": {"model": {"source": "WIDE"}, "sampling": {"temperature": 1.5},
                                       "lora": {"targets": ["q_proj", "v_proj", "lm_head"]}},
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_fused_equals_materialised(case, wide):
    task = copy.deepcopy(CASES[case])
    if task.get("model", {}).get("source") == "WIDE":
        task["model"]["source"] = wide
    ref, fused, ro = pair(task)
    lp = assert_same(ref, fused, ro)
    assert (lp < -1e-3).any()  # a real distribution, not all-certain tokens
    if "lm_head" in str(task.get("lora")):
        assert any(n.startswith("lm_head.") and n.endswith(".B") for n, _ in fused.policy.named_parameters())
    # the reference policy goes through the same path: the adapter switched off ...
    base = assert_same(ref, fused, ro, reference=True)
    assert (base - lp).abs().max() > 1e-3
    # ... and a snapshot adapter
    for t in (ref, fused):
        t.mix_reference([1.0])
        perturb(t, seed=1)
    assert_same(ref, fused, ro, reference=True)


def test_triton_backend_through_the_task():
    # the Triton row ops (in the interpreter off-GPU) behind the same task path, tempered
    needs("triton")
    from grpo_bench.numerics.kernels import triton_usable

    if not triton_usable(torch.zeros(1)):
        pytest.skip("CPU tensors run Triton only under TRITON_INTERPRET=1")
    ref, fused, ro = pair({"sampling": {"temperature": 0.7}}, backend="triton")
    assert_same(ref, fused, ro)


def head_calls(task, ro):
    shapes = []
    head = task.policy.get_output_embeddings()
    handle = head.register_forward_hook(lambda m, i, o: shapes.append(tuple(o.shape)))
    try:
        logp, ent = task.logprobs(ro)
        (logp.sum() + ent.sum()).backward()
        with torch.no_grad():
            task.logprobs(ro, reference=True)
    finally:
        handle.remove()
    return shapes


def test_fused_path_never_calls_the_head_nor_allocates_logits(wide):
    ref, fused, ro = pair({"model": {"source": wide}})
    p, b, g, t = ro.responses.shape
    logits_bytes = p * b * g * t * QWEN_VOCAB * 4
    assert head_calls(ref, ro)[0] == (b * g, t + 1, QWEN_VOCAB)  # the hook sees the materialised path
    assert head_calls(fused, ro) == []

    def sizes(task):
        def run():
            logp, ent = task.logprobs(ro)
            (logp.sum() + ent.sum()).backward()
        return [n for n, _ in cpu_allocations(run) if n > 0]

    assert max(sizes(ref)) >= logits_bytes
    # the fused path's largest buffer is one chunk of rows: here at most N / 16 of them
    assert max(sizes(fused)) <= logits_bytes / 16 + 4096


def test_unknown_architecture_keeps_the_materialised_path(monkeypatch):
    from grpo_bench.tasks.lm import models

    monkeypatch.setattr(models, "PLAIN_HEADS", ("llama",))
    with pytest.warns(UserWarning, match="materialised"):
        task = make({}, "chunked")
    assert not task._fused


def test_short_run_same_metrics_fused_and_materialised():
    from grpo_bench.engine.trainer import train

    # the shipped warm-started model: rewards differ within groups, so the policy moves
    raw = {"task": {"name": "arithmetic_tiny", "prompts_per_step": 4, "pass_k": 0, "sampling": {"temperature": 0.8}},
           "group_size": 4, "epochs": 2, "inner_steps": 2, "kl": "k3", "kl_coef": 0.05,
           "ref_update": {"name": "hard", "every": 2}, "eval_every": 0, "optimizer": "sgd", "lr": 0.5}
    runs = {}
    for backend in ("torch", "chunked"):
        rows = []
        summary = train(resolve_run(copy.deepcopy({**raw, "backend": backend})), rows=rows)
        runs[backend] = (summary, {(s, m): v for s, m, v in rows if not m.startswith("time/") and "per_s" not in m})
    (s_ref, m_ref), (s_fused, m_fused) = runs["torch"], runs["chunked"]
    assert m_ref.keys() == m_fused.keys() and len(m_ref) > 20
    for key, value in m_ref.items():
        assert m_fused[key] == pytest.approx(value, rel=1e-4, abs=1e-5), key
    assert s_fused == pytest.approx(s_ref, rel=1e-4, abs=1e-5)
    # the policy actually moved: the reference's KL to it and the loss are not zero
    assert any(m == "kl/value" and v > 1e-6 for (_, m), v in m_ref.items())
    assert any(m == "loss/policy" and v != 0 for (_, m), v in m_ref.items())


# ------------------------------------------------ sum of pi^2 (the Optimal Token Baseline's statistic)


@pytest.mark.parametrize("case", ["gpt2-T0.7", "qwen2-151936-T1.5-lora-on-head"])
def test_sum_pi_squared_fused_equals_materialised_and_the_softmax(case, wide):
    task = copy.deepcopy(CASES[case])
    if task.get("model", {}).get("source") == "WIDE":
        task["model"]["source"] = wide
    ref, fused, ro = pair(task)
    on = ro.mask > 0
    want = ref.sum_pi_squared(ro)
    got = fused.sum_pi_squared(ro)
    assert got.shape == ro.responses.shape and got.dtype == torch.float32
    torch.testing.assert_close(got[on], want[on], rtol=1e-5, atol=1e-7)
    # the tempered softmax of the model's own logits, in fp64
    tau = ref.cfg.sampling.temperature
    with torch.no_grad():
        p = ref._through_head(*ref._flat(ro), None, lambda logits: torch.softmax(logits.double() / tau, -1),
                              ro.responses.shape[2])
    brute = p.square().sum(-1).view(ro.responses.shape)
    torch.testing.assert_close(got[on].double(), brute[on], rtol=1e-5, atol=1e-7)
    # a statistic of the whole distribution, not of the sampled token alone
    with torch.no_grad():
        lp, _ = ref.logprobs(ro)
    assert (got[on] >= lp.exp()[on] ** 2 - 1e-6).all() and (got[on] > 1.5 * lp.exp()[on] ** 2).any()


def test_sum_pi_squared_never_calls_the_head_nor_allocates_logits(wide):
    ref, fused, ro = pair({"model": {"source": wide}})
    p, b, g, t = ro.responses.shape
    logits_bytes = p * b * g * t * QWEN_VOCAB * 4
    shapes = []
    handle = fused.policy.get_output_embeddings().register_forward_hook(lambda m, i, o: shapes.append(o.shape))
    try:
        fused.sum_pi_squared(ro)
    finally:
        handle.remove()
    assert shapes == []

    def largest(task):
        return max(n for n, _ in cpu_allocations(lambda: task.sum_pi_squared(ro)) if n > 0)

    assert largest(ref) >= logits_bytes                       # the materialised path does make them
    assert largest(fused) <= logits_bytes / 16 + 4096         # one chunk of at most N / 16 rows


def test_optimal_token_baseline_short_run_same_metrics_fused_and_materialised():
    from grpo_bench.engine.trainer import train

    raw = {"task": {"name": "arithmetic_tiny", "prompts_per_step": 4, "pass_k": 0, "sampling": {"temperature": 0.8}},
           "group_size": 4, "epochs": 2, "eval_every": 0, "optimizer": "sgd", "lr": 0.5,
           "delta": "optimal_token_baseline"}
    runs = {}
    for backend in ("torch", "chunked"):
        rows = []
        train(resolve_run(copy.deepcopy({**raw, "backend": backend})), rows=rows)
        runs[backend] = {(s, m): v for s, m, v in rows if not m.startswith("time/") and "per_s" not in m}
    assert runs["torch"].keys() == runs["chunked"].keys()
    for key, value in runs["torch"].items():
        assert runs["chunked"][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    assert any(m == "delta/abs_mean" and v > 1e-3 for (_, m), v in runs["torch"].items())
