"""What the fused GRPO-loss kernel implements: the one table, importable without Triton.

Each entry maps a registry part to the kernel's integer code and to the compile-time
constants the kernel reads, computed from the part's resolved parameters. `auto` falls
back to the torch composition for any part not listed here, and `python -m grpo_bench
list` marks the listed ones as fused.
"""
from __future__ import annotations

from dataclasses import dataclass

INF = 1e30  # "no bound": a finite stand-in Triton takes as a constant

# loss name -> (code, constants from params). LO/HI: ratio clip bounds; C: dual-clip cap
# on negative advantages; TP/TN: SAPO gate temperatures for positive/negative advantages.
LOSSES = {
    "naive": (0, lambda p: {}),
    "unclipped": (1, lambda p: {}),
    "clipped": (2, lambda p: {"LO": 1.0 - p["clip_low"], "HI": 1.0 + p["clip_high"]}),
    "gspo": (3, lambda p: {"LO": 1.0 - p["clip_low"], "HI": 1.0 + p["clip_high"]}),
    "dual_clip": (4, lambda p: {"LO": 1.0 - p["clip_low"], "HI": 1.0 + p["clip_high"], "C": p["clip_c"]}),
    "cispo": (5, lambda p: {"LO": 0.0 if p["clip_low"] is None else 1.0 - p["clip_low"],
                           "HI": 1.0 + p["clip_high"]}),
    "sapo": (6, lambda p: {"TP": p["tau_pos"], "TN": p["tau_neg"]}),
}
# the kernel counts three clip regions per token: low, high and this loss's own one
EXTRA_REGION = {"dual_clip": "dual"}
# kl name -> code (0: no KL term)
KLS = {"k1": 1, "k2": 2, "k3": 3, "abs": 4, "k1+": 5, "k3+": 6, "k3_is": 7}
# aggregate name -> how the per-sequence weight w_s is built (see kernels/loss.py)
AGGREGATES = ("token_mean", "token_sum", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm",
              "prompt_mean")


def fused_names(axis: str) -> set[str]:
    return {"loss": set(LOSSES), "kl": set(KLS), "aggregate": set(AGGREGATES)}.get(axis, set())


@dataclass(frozen=True)
class LossSpec:
    """A fused-kernel configuration: part names and their resolved parameters (hashable)."""

    loss: str
    loss_params: tuple
    aggregate: str
    aggregate_params: tuple
    kl: str | None  # None: no KL term (kl_coef is then 0)
    kl_coef: float
    gated: bool
    extra_terms: tuple[str, ...] = ()  # corrections, entropy bonus, NLL term: the kernel has none of them

    def fusable(self) -> bool:
        return (self.loss in LOSSES and self.aggregate in AGGREGATES and (self.kl is None or self.kl in KLS)
                and not self.extra_terms)

    def check(self) -> None:
        if self.extra_terms:
            raise ValueError(f"the fused loss kernel has no {', '.join(self.extra_terms)} term; use backend='torch'")
        for what, name, known in (("loss", self.loss, LOSSES), ("aggregate", self.aggregate, AGGREGATES),
                                  ("kl", self.kl, KLS)):
            if name is not None and name not in known:
                raise ValueError(f"the fused loss kernel has no {what} {name!r} (it has {', '.join(known)}); "
                                 "use backend='torch'")

    def constants(self) -> dict:
        """Compile-time constants of the kernel; unused ones keep neutral values."""
        out = {"LOSS": LOSSES[self.loss][0], "KL": KLS[self.kl] if self.kl else 0,
               "COEF": float(self.kl_coef) if self.kl else 0.0, "GATED": self.gated,
               "LO": 0.0, "HI": INF, "C": INF, "TP": 1.0, "TN": 1.0}
        out.update({k: float(v) for k, v in LOSSES[self.loss][1](dict(self.loss_params)).items()})
        return out

    @property
    def max_len(self) -> int | None:
        return dict(self.aggregate_params).get("max_len")
