"""The numerics wing: log-probs and the GRPO loss (logprobs.py: the backends), their Triton and chunked
kernels (kernels/), and random streams keyed by purpose (rng.py).
"""
