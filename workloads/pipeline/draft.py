"""Drafts for exact speculative decoding in a group: cheap guesses of the next tokens that the group
checks in one trip round the ring (`trips.py`, `member.py`).

Why it is exact: the seeded Gumbel-max sampler makes the token at each step a function of the logits
and the row's seed alone. The driver feeds a row's last token and its drafted next tokens; every stage
runs those positions one at a time, with the shapes and cache plain decoding has, and the last stage
draws the token of each step from them. A drafted token counts only while it is the token the row would
have been fed anyway, so what the group keeps is, byte for byte, what it makes without a draft; a bad
draft costs compute, never correctness.

Two drafts are shipped. `PromptLookup` needs no second model: it proposes what followed the last
occurrence of the row's newest n-gram in its prompt and output (prompt lookup decoding). `ModelDraft`
is a small model of the same tokenizer run whole at the driver, drawing with the row's own seed and
step: wherever its logits are close to the target's, the same Gumbel noise picks the same token, so a
good draft model is accepted far more often than its top-1 agreement with the target would suggest.
Any object with `propose` (rows together) is a draft.
"""

from __future__ import annotations

from typing import Protocol

DRAFTS = ("none", "prompt-lookup", "model:<name or folder>")
MAX_DRAFT_TOKENS = 15  # a trip carries at most 1 + this many positions


class Draft(Protocol):
    def propose(self, contexts: list[list[int]], k: int, seeds: list[int], step: int, temperature: float
                ) -> list[list[int]]:  # fmt: skip
        """For each row, up to `k` guesses of the tokens that follow its context (its prompt and output so
        far), the first of them the row's token of output step `step`, drawn with the row's seed at
        `temperature`. Rows come together, so a model draft runs them as one batch."""
        ...


class PromptLookup:
    """The tokens that followed the latest earlier occurrence of the context's last n tokens, trying
    n = `ngram` down to 1."""

    def __init__(self, ngram: int = 3) -> None:
        if ngram < 1:
            raise ValueError("ngram must be at least 1")
        self.ngram = ngram

    def lookup(self, context: list[int], k: int) -> list[int]:
        """One row's guesses."""
        for n in range(min(self.ngram, len(context) - 1), 0, -1):
            tail = context[-n:]
            for start in range(len(context) - n - 1, -1, -1):  # the latest earlier occurrence first
                if context[start : start + n] == tail:
                    return context[start + n : start + n + k]
        return []

    def propose(self, contexts: list[list[int]], k: int, seeds: list[int], step: int, temperature: float
                ) -> list[list[int]]:  # fmt: skip
        return [self.lookup(context, k) for context in contexts]


class ModelDraft:
    """A whole (small) model at the driver, drawing `k` tokens with each row's seed from step `step` on,
    as the target's last stage would draw them from its own logits (`workloads.model.sampler`). The rows
    run as one batch, left-padded to the longest context: one prefill and k - 1 one-token steps a trip,
    whatever the batch size (per row, that was a prefill and k - 1 steps for every row)."""

    def __init__(self, model: str) -> None:
        from workloads.model.loading import load_model

        self.name = model
        try:
            self.model = load_model(model)
        except (OSError, ValueError) as exc:  # no such folder, not a model, a hub name with no network
            raise ValueError(f"draft model {model!r} cannot be loaded: {exc}") from None

    def propose(self, contexts: list[list[int]], k: int, seeds: list[int], step: int, temperature: float
                ) -> list[list[int]]:  # fmt: skip
        import torch

        from workloads.model import sampler

        rows = len(contexts)
        if rows == 0 or k < 1 or any(not c for c in contexts):
            return [[] for _ in contexts]
        width = max(len(c) for c in contexts)
        ids = torch.zeros((rows, width), dtype=torch.long)
        mask = torch.zeros((rows, width), dtype=torch.long)
        for i, context in enumerate(contexts):  # left-padded: every row's next token is at the end
            ids[i, width - len(context) :] = torch.tensor(context, dtype=torch.long)
            mask[i, width - len(context) :] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        guesses: list[torch.Tensor] = []
        with torch.inference_mode():
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
            for j in range(k):
                token, _ = sampler.sample(out.logits[:, -1], seeds, [step + j] * rows, temperature)
                guesses.append(token)
                if j == k - 1:
                    break
                mask = torch.cat([mask, torch.ones((rows, 1), dtype=torch.long)], dim=1)
                pos = pos[:, -1:] + 1
                out = self.model(input_ids=token.view(rows, 1), attention_mask=mask, position_ids=pos,
                                 past_key_values=out.past_key_values, use_cache=True)  # fmt: skip
        return [[int(g[i]) for g in guesses] for i in range(rows)]


def check_draft(name: str) -> str:
    """`name` if it names a draft (`DRAFTS`), else ValueError saying which do."""
    if name in ("none", "prompt-lookup") or (name.startswith("model:") and len(name) > len("model:")):
        return name
    raise ValueError(f"draft {name!r}: one of {', '.join(DRAFTS)}")


def trip_guesses(name: str, draft_tokens: int) -> int:
    """The guesses a trip may carry for a task whose draft is `name`: `draft_tokens`, or none without a
    draft. Every member bounds the trips it accepts by it, the followers too (which hold no draft)."""
    return draft_tokens if check_draft(name) != "none" else 0


def make_draft(name: str) -> Draft | None:
    """The draft a member is configured with by name (`DRAFTS`); None: no draft."""
    if check_draft(name) == "none":
        return None
    if name == "prompt-lookup":
        return PromptLookup()
    return ModelDraft(name.removeprefix("model:"))
