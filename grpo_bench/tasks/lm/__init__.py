"""Causal-LM pieces of the LM tasks: char tokenizer, model loading and LoRA, problems, rewards, warm-start.

Imported only when an LM task is built, so listing tasks never pays for transformers.
"""
