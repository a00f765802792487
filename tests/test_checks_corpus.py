"""PitfallChecks on the corpus of public training steps (tests/checks_corpus, issue 34 item 2): every correct module
without a finding, every buggy one with exactly its sections, no crash; and the corpus fails the check of 5a6abb2
(crashes, false alarms and misses), so it can fail."""

from __future__ import annotations

import pytest
from checks_corpus import all_cases, run_case
from checks_corpus.compare import checks_at, judge

from mpguide.checks import PitfallChecks

CASES = all_cases()


def test_the_corpus_has_its_size_and_names_its_sources():
    correct = [c for c in CASES if not c.expect and not c.known_miss]
    buggy = [c for c in CASES if c.expect]
    assert len(correct) >= 20 and len(buggy) >= 12
    assert len({c.name for c in CASES}) == len(CASES)
    assert all(c.source and c.condition for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_each_case_gets_exactly_its_sections(case):
    result = run_case(case, PitfallChecks)
    assert result["error"] is None, result["error"]
    assert result["sections"] == set(case.expect), result["messages"]


def test_the_corpus_fails_the_checks_of_5a6abb2():
    try:
        old = checks_at("5a6abb2")
    except LookupError as err:  # a shallow clone without that commit
        pytest.skip(str(err))
    counts = judge(old)["counts"]
    print(counts)
    assert counts["crashes"] >= 1 and counts["false_alarms"] >= 1 and counts["misses"] >= 1, counts
