"""One frozen causal LM, one LoRA adapter per population member, applied as batched matmuls.

The base weights exist once; member p's adapter (A_p (r, in), B_p (out, r)) adds
(alpha / r) * B_p A_p x to each target layer's output on member p's rows, as peft's LoRA
does (tests/test_population.py holds a population of one to peft's own LoRA layer). Rows
are member-major: a batch of P * n rows holds member p's rows at p n .. (p + 1) n, and each
member's products are one slice of a bmm, the shapes it would have alone (the S-LoRA /
Punica idea, without their CUDA kernels). The reference policy is the adapter switched off,
or, once a reference update came, a second stacked adapter that mixes towards the policy.

Generation is a plain KV-cache loop (prefill, then one token at a time) that samples with
the Gumbel-max trick from each member's own random stream: the same categorical
distribution as sampling softmax(logits / T), with noise that depends on the member's seed
and the draw alone, whoever else is in the batch (and common to variants with that seed).
"""
from __future__ import annotations

import contextlib
import math

import torch
from torch import Tensor, nn

from ...numerics import rng
from .models import mix_low_rank

try:  # transformers 5.2x renamed the KV cache (argument and output field) and warns on the old name
    from transformers.modeling_outputs import CausalLMOutputWithPast as _Out
    _CACHE = "cache" if "cache" in _Out.__dataclass_fields__ else "past_key_values"
except ImportError:
    _CACHE = "past_key_values"

POLICY, OFF, REFERENCE = "policy", "off", "reference"


def _in_out(base: nn.Module) -> tuple[int, int]:
    if isinstance(base, nn.Linear):
        return base.in_features, base.out_features
    if isinstance(base, nn.Embedding):
        return base.num_embeddings, base.embedding_dim
    w = base.weight  # transformers' Conv1D (GPT-2): y = x @ W + b, W (in, out)
    return w.shape[0], w.shape[1]


class StackedLoRA(nn.Module):
    """A frozen linear layer (nn.Linear, GPT-2's Conv1D) or embedding plus P LoRA adapters, one per row block."""

    def __init__(self, base: nn.Module, rank: int, alpha: float, dropout: float, gens: list[torch.Generator]):
        super().__init__()
        self.base = base.requires_grad_(False)
        n_in, n_out = _in_out(base)
        w = base.weight
        self.embedding = isinstance(base, nn.Embedding)
        if self.embedding:  # peft's initialisation of an embedding's adapter: A = 0, B ~ N(0, 1)
            a = torch.zeros(len(gens), rank, n_in)
            b = torch.stack([torch.randn(n_out, rank, generator=g) for g in gens])
        else:  # of a linear layer's: A ~ kaiming_uniform(a=sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in)), B = 0
            bound = 1.0 / math.sqrt(n_in)
            a = torch.stack([(torch.rand(rank, n_in, generator=g) * 2 - 1) * bound for g in gens])
            b = torch.zeros(len(gens), n_out, rank)
        # adapters in fp32 over a bf16/fp16 base, as peft keeps them (autocast_adapter_dtype): master weights
        dtype = torch.float32 if w.dtype in (torch.bfloat16, torch.float16) else w.dtype
        self.A = nn.Parameter(a.to(w.device, dtype))                              # (P, r, in)
        self.B = nn.Parameter(b.to(w.device, dtype))                              # (P, out, r)
        self.scale, self.dropout = alpha / rank, dropout
        self.ref_A: Tensor | None = None   # the reference's adapter, once a reference update made one
        self.ref_B: Tensor | None = None
        self.mode = POLICY
        self.dropout_gens: list[torch.Generator] | None = None  # set by the task for a gradient pass

    @property
    def weight(self) -> Tensor:  # what code that reads a layer's weight expects (a tied LM head, say)
        return self.base.weight

    def factors(self) -> tuple[Tensor, Tensor] | None:
        """The (A, B) acting now, or None when the adapter is off (or the reference is still the base model)."""
        if self.mode == OFF or (self.mode == REFERENCE and self.ref_A is None):
            return None
        return (self.A, self.B) if self.mode == POLICY else (self.ref_A, self.ref_B)

    def forward(self, x: Tensor) -> Tensor:
        members = self.A.shape[0]
        if not rng.device_paths(x.device) and members > 1 and x.shape[0] % members == 0:
            # member by member: the pinned MKL path (numerics/cpu.py) picks a GEMM's kernel by its row count
            # (5 rows alone and the same 5 inside 15 differ in the last bit), so a stacked product would round
            # a member's rows otherwise than its run alone; a CPU gains nothing from stacking the LM anyway
            y = torch.cat([self.base(c) for c in x.chunk(members)])
        else:
            y = self.base(x)
        ab = self.factors()
        if ab is None:
            return y
        a, b = ab
        p = a.shape[0]
        if self.embedding:  # the rows of A^T at the token ids: peft's F.embedding(x, A^T) @ B^T
            ids = x.reshape(p, -1, 1).expand(-1, -1, a.shape[1])
            low = torch.gather(a.transpose(1, 2), 1, ids)                          # (P, rows, r)
        else:
            xs = x.reshape(p, -1, x.shape[-1]).to(a.dtype)                         # (P, rows, in)
            if self.training and self.dropout > 0 and self.mode == POLICY and self.dropout_gens is not None:
                keep = torch.stack([torch.rand(xs.shape[1:], generator=g) >= self.dropout for g in self.dropout_gens])
                xs = xs * keep.to(xs.device, xs.dtype) / (1 - self.dropout)
            low = torch.bmm(xs, a.transpose(1, 2))                                 # (P, rows, r)
        d = torch.bmm(low, b.transpose(1, 2))                                      # (P, rows, out)
        return y + (self.scale * d).view_as(y).to(y.dtype)

    @torch.no_grad()
    def mix(self, weights: list[float]) -> list[float]:
        """reference_p <- w_p * policy_p + (1 - w_p) * reference_p on the weight updates B A; each member's rank-cut
        error (0 where it copied or kept its reference: both exact)."""
        if self.ref_A is None:  # the reference so far is the adapter switched off: a zero update
            self.ref_A, self.ref_B = self.A.clone(), torch.zeros_like(self.B)   # no_grad: no graph to cut
        cut = [0.0] * len(weights)
        for i, w in enumerate(weights):
            if w == 1.0:  # a copy: exact, whatever the ranks
                self.ref_A[i].copy_(self.A[i])
                self.ref_B[i].copy_(self.B[i])
            elif w:
                a, b, residual = mix_low_rank(self.A[i], self.B[i], self.ref_A[i], self.ref_B[i], w)
                self.ref_A[i].copy_(a)
                self.ref_B[i].copy_(b)
                cut[i] = residual
        return cut

    def keep(self, idx: list[int]) -> None:
        # indexing by a list copies, and a Parameter is a leaf of its own: nothing links back to the old stack
        self.A = nn.Parameter(self.A[idx])
        self.B = nn.Parameter(self.B[idx])
        if self.ref_A is not None:
            self.ref_A, self.ref_B = self.ref_A[idx], self.ref_B[idx]


def attach(model: nn.Module, targets: list[str], rank: int, alpha: float, dropout: float,
           seeds: list[int]) -> list[StackedLoRA]:
    """Freeze model and put a StackedLoRA on every module whose name is, or ends with, a target (peft's rule)."""
    model.requires_grad_(False)
    layers = []
    named = [(n, m) for n, m in model.named_modules() if n and any(n == t or n.endswith("." + t) for t in targets)]
    if not named:
        raise ValueError(f"lora.targets: no module of this model is named {targets}")
    for i, (name, module) in enumerate(named):
        parent = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
        gens = [rng.stream(s, "lora", name) for s in seeds]
        layer = StackedLoRA(module, rank, alpha, dropout, gens)
        setattr(parent, name.rpartition(".")[2], layer)
        layers.append(layer)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if type(head) is nn.Linear:  # generation's logits come from it (the fused path has its own split)
        head.__class__ = MemberHead
        object.__setattr__(head, "members_of", layers[0])  # not a submodule: a deepcopy maps it to the copy's
    return layers


class MemberHead(nn.Linear):
    """A frozen LM head that on a CPU runs each population member's rows as their own GEMM, for the reason
    StackedLoRA.forward gives; its weight stays the module's (a tied embedding stays tied)."""

    upcast = False  # the sampler's fp32 head (engine/sampling._fp32_head): the GEMM from upcast x and weights

    def _one(self, x: Tensor) -> Tensor:
        if self.upcast:
            return nn.functional.linear(x.float(), self.weight.float(), None if self.bias is None else self.bias.float())
        return super().forward(x)

    def forward(self, x: Tensor) -> Tensor:
        members = self.members_of.A.shape[0]
        if not rng.device_paths(x.device) and members > 1 and x.shape[0] % members == 0:
            return torch.cat([self._one(c) for c in x.chunk(members)])
        return self._one(x)


@contextlib.contextmanager
def adapters(layers: list[StackedLoRA], mode: str):
    """Every adapter in `mode` (policy, off, reference) for the duration."""
    before = [layer.mode for layer in layers]
    for layer in layers:
        layer.mode = mode
    try:
        yield
    finally:
        for layer, m in zip(layers, before):
            layer.mode = m


def _next_tokens(logits: Tensor, gens: list[torch.Generator] | "rng.DeviceStreams" | None, temperature: float,
                 top_p: float) -> Tensor:
    """(N,) next tokens from fp32 logits (N, V): argmax without gens, else a sample per member's stream."""
    if gens is None:
        return logits.argmax(-1)
    scaled = logits / temperature
    if top_p < 1.0:
        # the nucleus (Holtzman et al.): the fewest most probable tokens whose mass reaches top_p, so a token is
        # out once the mass before it has reached top_p (the first one always kept)
        probs, order = torch.softmax(scaled, -1).sort(-1, descending=True)
        outside = probs.cumsum(-1) - probs >= top_p
        scaled = scaled.masked_fill(torch.zeros_like(outside).scatter(-1, order, outside), -math.inf)
    n = logits.shape[0] // len(gens)
    if isinstance(gens, rng.DeviceStreams):  # on a GPU: every member's draw at once, on the device
        u = gens.rand(n, logits.shape[-1]).view(-1, logits.shape[-1])
    else:
        u = torch.cat([torch.rand(n, logits.shape[-1], generator=g) for g in gens]).to(logits.device)
    gumbel = -torch.log(-torch.log(u))  # u = 0 gives -inf: never chosen
    return (scaled + gumbel).argmax(-1)


@torch.no_grad()
def generate(model: nn.Module, ids: Tensor, attention: Tensor, steps: int, eos: Tensor, pad: int,
             gens: list[torch.Generator] | None, temperature: float, top_p: float,
             with_logprobs: bool = False, repeat: int = 1) -> Tensor | tuple[Tensor, Tensor]:
    """(N, steps) completions of left-padded prompts (N, L), pad after each row's first EOS.

    gens None: greedy. Else one generator per member, rows member-major: member p's noise
    comes from gens[p] alone, one (rows, V) draw per step. with_logprobs: also the sampler's
    own log-probs (N, steps) of its tokens under softmax(fp32(logits) / T) (0 after EOS), as an
    inference engine returns them. repeat: each prompt row stands for `repeat` consecutive rows
    (N = rows x repeat), its prompt run once and its KV cache copied: k samples of a prompt without
    k times its prefill, most of the work where prompts are long and completions short.
    """
    positions = (attention.long().cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=True, logits_to_keep=1)
    if repeat > 1:
        ids, attention, positions = (t.repeat_interleave(repeat, 0) for t in (ids, attention, positions))
        getattr(out, _CACHE).batch_repeat_interleave(repeat)
        out.logits = out.logits.repeat_interleave(repeat, 0)
    tokens = torch.full((ids.shape[0], steps), pad, dtype=ids.dtype, device=ids.device)
    logprobs = torch.zeros(ids.shape[0], steps, device=ids.device)
    done = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
    mask, pos = attention, positions[:, -1:]
    for t in range(steps):
        logits = out.logits[:, -1].float()
        nxt = _next_tokens(logits, gens, temperature, top_p)
        nxt = torch.where(done, torch.full_like(nxt, pad), nxt)
        tokens[:, t] = nxt
        if with_logprobs:
            lp = torch.log_softmax(logits / temperature, -1).gather(-1, nxt[:, None])[:, 0]
            logprobs[:, t] = torch.where(done, torch.zeros_like(lp), lp)
        done |= torch.isin(nxt, eos)
        if t == steps - 1 or bool(done.all()):  # later tokens of a finished row are pad whatever comes
            break
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
        pos = pos + 1
        out = model(input_ids=nxt[:, None], attention_mask=mask, position_ids=pos, use_cache=True,
                    **{_CACHE: getattr(out, _CACHE)})
    return (tokens, logprobs) if with_logprobs else tokens
