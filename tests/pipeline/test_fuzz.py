"""The fuzzer's budgeted run (issue 55): one member of 2- and 3-member groups changes one field of one
frame it sends (values and metadata, frame count and order, non-finite numbers, truncation,
duplication), drawn from a fixed seed. Properties, per case: no honest member's file is `invalidate`;
a batch whose tokens differ from the honest group's is never paid. The long run by hand:
`.venv/bin/python bench/pipeline_fuzz.py --cases 2000` (docs/pipeline.md); each failure it finds
becomes a named case in test_partners.py."""

from __future__ import annotations

import os

import pytest

from workloads.pipeline.adversary import Fuzzer

pytestmark = pytest.mark.slow  # ~60 s: the full suite, not the fast tier

CASES = int(os.environ.get("INTELLECT_FUZZ_CASES", "40"))


def test_no_partner_mutation_invalidates_an_honest_member_or_pays_a_changed_batch() -> None:
    cases = Fuzzer().run(CASES, seed=20261129)
    failures = [f"{case}: {case.failures}" for case in cases if case.failures]
    assert not failures, failures
    # The run is a search, not a stub: it reached every kind of outcome.
    assert any(case.stopped for case in cases)
    assert any("accept" in case.verdicts.values() for case in cases)
    assert len({str(case.mutation).split(":")[0] for case in cases}) >= 3  # values, headers, order…
