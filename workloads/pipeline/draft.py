"""Drafts for exact speculative decoding in a group: cheap guesses of the next tokens that the group
checks in one trip round the ring (`trips.py`, `member.py`).

Why it is exact: the seeded Gumbel-max sampler makes the token at each step a function of the logits
and the row's seed alone. The driver feeds a row's last token and its drafted next tokens; every stage
runs those positions one at a time, with the shapes and cache plain decoding has, and the last stage
draws the token of each step from them. A drafted token counts only while it is the token the row would
have been fed anyway, so what the group keeps is, byte for byte, what it makes without a draft; a bad
draft costs compute, never correctness.

`PromptLookup` is the draft shipped here: no second model, it proposes what followed the last
occurrence of the row's newest n-gram in its prompt and output (prompt lookup decoding). Another draft
(a small model of the same tokenizer) is any object with `propose`.
"""

from __future__ import annotations

from typing import Protocol

DRAFTS = ("none", "prompt-lookup")
MAX_DRAFT_TOKENS = 15  # a trip carries at most 1 + this many positions


class Draft(Protocol):
    def propose(self, context: list[int], k: int) -> list[int]:
        """Up to `k` guesses of the tokens that follow `context` (the row's prompt and output so far)."""
        ...


class PromptLookup:
    """The tokens that followed the latest earlier occurrence of the context's last n tokens, trying
    n = `ngram` down to 1."""

    def __init__(self, ngram: int = 3) -> None:
        if ngram < 1:
            raise ValueError("ngram must be at least 1")
        self.ngram = ngram

    def propose(self, context: list[int], k: int) -> list[int]:
        for n in range(min(self.ngram, len(context) - 1), 0, -1):
            tail = context[-n:]
            for start in range(len(context) - n - 1, -1, -1):  # the latest earlier occurrence first
                if context[start : start + n] == tail:
                    return context[start + n : start + n + k]
        return []


def make_draft(name: str) -> Draft | None:
    """The draft a member is configured with by name (`DRAFTS`); None: no draft."""
    if name == "none":
        return None
    if name == "prompt-lookup":
        return PromptLookup()
    raise ValueError(f"draft {name!r}: one of {', '.join(DRAFTS)}")
