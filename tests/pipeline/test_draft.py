"""Exact speculative decoding (`workloads/pipeline/draft.py`, `trips.py`): whatever the driver drafts,
right, half right or wrong, and with batches in flight, every member's file is byte for byte the file
of plain decoding (tokens, logprobs, proofs, the frames its seals sign); a right draft takes fewer trips
round the ring."""

from __future__ import annotations

import pytest
import torch

from intellect.identity import Wallet
from tests.pipeline.tiny import WORDS
from workloads.model.loading import load_tokenizer
from workloads.pipeline.draft import ModelDraft, PromptLookup, make_draft
from workloads.pipeline.group import GroupRun, run_thread_group
from workloads.pipeline.member import BatchRequest
from workloads.pipeline.trips import draft_inputs, kept

EOS, PAD = 1, 0


def _requests() -> list[BatchRequest]:
    tok = load_tokenizer("tiny")
    shapes = [(4, 20), (3, 9), (2, 14)]  # (rows, max_new_tokens); every prompt its own
    return [BatchRequest([tok(f"reverse: {WORDS[r]} {b}")["input_ids"] for r in range(rows)],
                         [100 * b + r for r in range(rows)], limit, 1.0, batch=b)
            for b, (rows, limit) in enumerate(shapes, start=1)]  # fmt: skip


class Oracle:
    """Knows each prompt's plain output: proposes it (`wrong`: every third guess off by one, and all of
    the rows whose prompt is of odd length)."""

    def __init__(self, run: GroupRun, requests: list[BatchRequest], wrong: bool = False) -> None:
        self.truth = {tuple(p): out for b, r in enumerate(requests)
                      for p, out in zip(r.prompts, run.batches[b][0].tokens, strict=True)}  # fmt: skip
        self.wrong = wrong

    def propose(self, contexts: list[list[int]], k: int, seeds: list[int], step: int, temperature: float
                ) -> list[list[int]]:  # fmt: skip
        return [self._one(context, k) for context in contexts]

    def _one(self, context: list[int], k: int) -> list[int]:
        prompt = next(p for p in self.truth if tuple(context[: len(p)]) == p)
        guess = list(self.truth[prompt][len(context) - len(prompt) :][:k])
        if self.wrong:
            guess = [(g + 1) % 99 if j % 3 == 2 or len(prompt) % 2 else g for j, g in enumerate(guess)]
        return guess


def _made(run: GroupRun, members: int) -> list[list[tuple]]:
    return [[(o.batch, o.proofs, o.tokens, o.logprobs, o.bundle.header() if o.bundle else None,
              o.received_frames, o.sent_frames) for o in (batch[i] for i in range(members))]
            for batch in run.batches]  # fmt: skip


@pytest.mark.parametrize("members", [2, 3])
def test_a_draft_right_half_right_or_from_the_prompt_changes_nothing_but_the_trips(members: int) -> None:
    requests = _requests()
    keys = [Wallet.create() for _ in range(members)]
    plain = run_thread_group(members, requests, keys=keys)
    assert plain.ok, plain.errors
    steps = sum(max(map(len, o.tokens)) for o in (b[0] for b in plain.batches))
    assert sum(b[0].trips for b in plain.batches) == steps  # one trip a step
    trips = {}
    for name, draft, in_flight in (("oracle", Oracle(plain, requests), 1),
                                   ("half", Oracle(plain, requests, wrong=True), 2),
                                   ("lookup", PromptLookup(), 3),
                                   ("model", ModelDraft("tiny"), 1)):  # fmt: skip
        run = run_thread_group(members, requests, keys=keys, draft=draft, draft_tokens=4, in_flight=in_flight)
        assert run.ok, (name, run.errors)
        assert _made(run, members) == _made(plain, members), name
        trips[name] = sum(b[0].trips for b in run.batches)
        assert all(b[i].trips == b[0].trips for b in run.batches for i in range(members))
    assert trips["oracle"] < trips["half"] < steps  # each right guess saved a trip
    assert 2 * trips["oracle"] <= steps  # up to 5 steps a trip (fewer as a row nears its end)
    assert trips["lookup"] <= steps
    # the target itself as the draft: its own draws, seed for seed (bar bf16 differences in the shapes)
    assert trips["model"] <= trips["oracle"] + len(requests)


def test_prompt_lookup_proposes_what_followed_the_newest_ngram() -> None:
    draft = PromptLookup(ngram=3)
    assert draft.lookup([5, 6, 7, 8, 9, 5, 6, 7], 3) == [8, 9, 5]
    assert draft.lookup([5, 6, 7, 8, 2, 7], 2) == [8, 2]  # only the last token recurs: n = 1
    assert draft.lookup([1, 2, 3], 4) == []
    assert draft.lookup([4, 4, 4], 2) == [4]  # the latest earlier occurrence, up to the context's end
    assert draft.propose([[1, 2, 1], [3]], 2, [0, 0], 0, 1.0) == [[2, 1], []]
    assert make_draft("none") is None and isinstance(make_draft("prompt-lookup"), PromptLookup)
    with pytest.raises(ValueError, match="one of none, prompt-lookup, model:"):
        make_draft("model")


def test_a_drafted_position_counts_only_while_every_row_was_fed_its_own_next_token() -> None:
    class Fixed:
        def __init__(self, guesses: dict[int, list[int]]) -> None:
            self.guesses = guesses

        def propose(self, contexts: list[list[int]], k: int, seeds: list[int], step: int, temperature: float
                    ) -> list[list[int]]:  # fmt: skip
            return [self.guesses[context[0]][:k] for context in contexts]

    last, contexts = torch.tensor([7, 8, 9]), [[10], [11], [12]]
    draft = Fixed({10: [3, EOS, 4], 11: [5, 6], 12: [2, 2, 2]})
    inputs = draft_inputs(last, [False, False, True], contexts, draft, 3, EOS, PAD)
    # the fewest guesses of a row still decoding (2); after a drafted end of sequence, pad; an ended row: pad
    assert inputs.tolist() == [[7, 3, PAD], [8, 5, 6], [PAD, PAD, PAD]]
    sampled = [torch.tensor([3, 5, 0]), torch.tensor([EOS, 6, 0]), torch.tensor([4, 4, 0])]
    assert kept(inputs, sampled, [False, False, True], EOS, PAD) == 3  # every row got what it would have
    sampled[1] = torch.tensor([2, 6, 0])  # row 0 did not end at its second token: pad was the wrong input
    assert kept(inputs, sampled, [False, False, True], EOS, PAD) == 2
    sampled[0] = torch.tensor([3, 4, 0])  # row 1 drew 4, not its guess 5
    assert kept(inputs, sampled, [False, False, True], EOS, PAD) == 1
    unsure = Fixed({10: [], 11: [1], 12: [1]})  # a row with no guess: the trip runs one position
    assert draft_inputs(last, [False] * 3, contexts, unsure, 3, EOS, PAD).shape == (3, 1)


def test_a_driver_keeping_a_wrong_guess_is_blamed_and_no_follower_is() -> None:
    """The driver says one drafted position more counts than did: every member commits it, the tokens are
    no longer plain decoding's, and the validator's local replay blames the driver alone (its activations
    there came from its guess, not from the token the bundle says it was fed)."""
    from workloads.model.loading import load_model
    from workloads.pipeline.judge.replay import judge_member
    from workloads.pipeline.stages import plan_stages

    requests, members = _requests(), 3
    plain = run_thread_group(members, requests)
    assert plain.ok, plain.errors
    tok, model, plans = load_tokenizer("tiny"), load_model("tiny"), plan_stages("tiny", members)
    run = run_thread_group(members, requests, draft=Oracle(plain, requests, wrong=True), draft_tokens=4,
                           cheats={0: "over-keep"})  # fmt: skip
    assert run.ok, run.errors
    guilty = 0
    for b, request in enumerate(requests):
        lied = run.batches[b][0].tokens != plain.batches[b][0].tokens
        verdicts = [judge_member(model, plans, k, run.batches[b][k].bundle, run.batches[b][k].received_frames,
                                 run.batches[b][k].sent_frames, task_id="local", group_id="local",
                                 batch=request.batch, eos=int(tok.eos_token_id), pad=int(tok.pad_token_id))
                    for k in range(members)]  # fmt: skip
        assert all(v.proven and not v.guilty for v in verdicts[1:]), [v.reasons for v in verdicts]
        assert verdicts[0].guilty == lied, (b, verdicts[0].reasons)
        guilty += lied
    assert guilty >= 1


def test_followers_refuse_a_trip_wider_than_the_task_drafts() -> None:
    """A driver sending more positions than `draft_tokens` + 1 would make its followers run positions the
    task never asked for (and nobody pays): the first follower stops the batch, naming the driver."""
    requests, keys = _requests()[:1], [Wallet.create() for _ in range(2)]
    plain = run_thread_group(2, requests, keys=keys)
    run = run_thread_group(2, requests, keys=keys, draft=Oracle(plain, requests), draft_tokens=2,
                           cheats={0: "over-draft"}, timeout=5.0)  # fmt: skip
    assert run.errors[1]["member"] == 0 and "activations of step 1" in run.errors[1]["error"], run.errors
    honest = run_thread_group(2, requests, keys=keys, draft=Oracle(plain, requests), draft_tokens=4)
    assert honest.ok and _made(honest, 2) == _made(plain, 2)
