"""The tiny model's character-level tokenizer, built with `tokenizers` and saved as tokenizer.json.

Character level keeps the vocabulary tiny (about 100 entries) while still covering every prompt the
verifiers know (digits, letters, LaTeX `\\boxed{}`, Python source), so one model serves all demo tasks.
"""

from __future__ import annotations

import string
from pathlib import Path

from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
SPECIALS = [PAD, EOS, UNK]
# Printable ASCII without the other whitespace characters, plus newline (tabs map to <unk>).
CHARS = [c for c in string.printable if c not in "\t\r\x0b\x0c"]


def build_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
    # BPE without merges and without a pre-tokenizer is a plain character tokenizer.
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    core.add_special_tokens(SPECIALS)
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD, eos_token=EOS, unk_token=UNK, padding_side="left"
    )


def save_tokenizer(directory: Path) -> PreTrainedTokenizerFast:
    tok = build_tokenizer()
    tok.save_pretrained(str(directory))
    return tok
