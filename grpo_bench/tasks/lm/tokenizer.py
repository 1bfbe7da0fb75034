"""Character-level tokenizer of the embedded tiny model, as a real PreTrainedTokenizerFast.

Every character is one token, so the tiny model sees digits one by one (a BPE
vocabulary would merge "123" into one opaque token and make carries unlearnable
for a 2-layer model). Built from a `tokenizers` WordLevel model with a
split-every-character pre-tokenizer and a Fuse decoder, it round-trips through
`save_pretrained` / `from_pretrained` like any hub tokenizer, so the rest of the
task never knows which kind of tokenizer it has.
"""
from __future__ import annotations

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIALS = (PAD, BOS, EOS, UNK)
# Arithmetic needs digits, operators, '=' and space; the letters let the tiny model's
# tokenizer encode short words (e.g. a user's template) without collapsing them to <unk>.
CHARS = "0123456789+-*/=() .,:?" + "abcdefghijklmnopqrstuvwxyz"


def build_char_tokenizer(chars: str = CHARS, size: int | None = None):
    """The character tokenizer; `size` pads its vocabulary with unused tokens `<u123>` up to a
    model's vocabulary (e.g. Qwen2.5's 151,936), so that every id such a model can sample
    decodes to something (an id the vocabulary lacks would decode to nothing at all)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for ch in chars:
        vocab.setdefault(ch, len(vocab))
    for i in range(len(vocab), size or 0):
        vocab[f"<u{i}>"] = i  # never produced by the one-character pre-tokenizer
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()  # concatenate, no spaces between characters
    bos_id = vocab[BOS]
    # BOS anchors absolute positions for left-padded batches and gives the first
    # character a context to be predicted from.
    core.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, bos_id)])
    return PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK,
        padding_side="left", model_max_length=256,
    )
