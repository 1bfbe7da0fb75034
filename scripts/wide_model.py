"""Save a Qwen2-shaped causal LM with Qwen2.5's 151,936-token vocabulary, for memory checks.

    .venv/bin/python scripts/wide_model.py /tmp/wide          # 2 layers, width 128, random weights
    .venv/bin/python -m grpo_bench run ablations/arithmetic_lora.yaml --set task.model.source=/tmp/wide ...

The weights are random and the tokenizer is the character tokenizer padded to the vocabulary
(every id decodes, most to an unused `<u123>` token), so a run on it shows where a step's
memory goes, not learning: the (N, T, V) logits of 256 completions of 32 tokens would be 5 GB
in fp32, and the fused log-prob path never holds them.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from grpo_bench.tasks.lm import models  # noqa: E402
from grpo_bench.tasks.lm.tokenizer import build_char_tokenizer  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path, help="directory to save_pretrained the model and tokenizer into")
    ap.add_argument("--vocab", type=int, default=151_936, help="vocabulary size (Qwen2.5's by default)")
    ap.add_argument("--width", type=int, default=128, help="hidden size")
    ap.add_argument("--layers", type=int, default=2, help="transformer blocks")
    ap.add_argument("--heads", type=int, default=2, help="attention heads (key/value heads: half)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    args = ap.parse_args()
    tok = models.prepare_tokenizer(build_char_tokenizer(size=args.vocab))
    model = models.build_qwen2(tok, args.layers, args.width, args.heads, seed=args.seed, vocab=args.vocab,
                               n_positions=1024)
    model.save_pretrained(args.out)
    tok.save_pretrained(args.out)
    n = sum(p.numel() for p in model.parameters())
    print(f"{args.out}: qwen2, vocab {args.vocab:,}, width {args.width}, {args.layers} layers, {n / 1e6:.1f}M parameters")


if __name__ == "__main__":
    main()
