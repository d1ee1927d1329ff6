"""The tiny model and the batch the pipeline group tests run through it: one `reverse:` prompt a word."""

from __future__ import annotations

from typing import Any

from workloads.model.loading import load_model, load_tokenizer
from workloads.pipeline.bundle import BatchRequest

WORDS = ["abc", "hello", "pipeline", "stage", "group", "verify", "token", "proof"]


def tiny_batch(max_new_tokens: int) -> tuple[Any, Any, BatchRequest]:
    """The tiny model's tokenizer, the model, and a batch of a prompt a word of WORDS (seeds 100 to 107,
    temperature 1) that decodes up to `max_new_tokens` tokens."""
    tok = load_tokenizer("tiny")
    prompts = [tok(f"reverse: {w}")["input_ids"] for w in WORDS]
    return tok, load_model("tiny"), BatchRequest(prompts, list(range(100, 108)), max_new_tokens, 1.0)
