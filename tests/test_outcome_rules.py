"""The outcome rules (trioq/_core/outcomes.py): one decision per settlement kind, which both
drivers apply; checked here against the state machine's edges and the documented table."""

from __future__ import annotations

import datetime
import pathlib

import pytest

from trioq._core.outcomes import RULES, SETTLE_KINDS, rule_of, settled_state
from trioq._core.states import KEY_HOLDING_STATES, SETTLE, TERMINAL_STATES, TRANSITIONS, JobState

NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
SECOND = datetime.timedelta(seconds=1)


def test_every_settlement_kind_has_one_rule_and_an_unknown_kind_is_refused() -> None:
    assert set(RULES) == SETTLE_KINDS
    with pytest.raises(ValueError, match="settlement kind 'explode'"):
        rule_of("explode")


@pytest.mark.parametrize("kind", sorted(SETTLE_KINDS))
def test_each_rule_makes_only_edges_the_settle_statement_may_make(kind: str) -> None:
    rule = rule_of(kind)
    targets = {rule.state} | ({JobState.READY} if rule.ready_when_due else set())
    for target in targets:
        assert SETTLE in TRANSITIONS[(JobState.RUNNING, target)], (kind, target)


@pytest.mark.parametrize("kind", sorted(SETTLE_KINDS))
def test_a_rule_keeps_the_key_exactly_when_its_state_holds_one(kind: str) -> None:
    rule = rule_of(kind)
    assert rule.releases_key is (rule.state not in KEY_HOLDING_STATES)
    assert rule.final is (rule.state in TERMINAL_STATES)
    # No attempt consumed exactly by the outcomes that did not really run the job to an end.
    assert (rule.attempt_change == -1) is (kind in ("release", "sleep", "wait"))


def test_time_based_outcomes_are_ready_once_due_and_others_ignore_time() -> None:
    retry, sleep, wait = rule_of("retry"), rule_of("sleep"), rule_of("wait")
    assert settled_state(retry, NOW, NOW) is JobState.READY  # a zero-delay retry
    assert settled_state(retry, NOW + SECOND, NOW) is JobState.SCHEDULED
    assert settled_state(sleep, NOW - SECOND, NOW) is JobState.READY
    assert settled_state(sleep, NOW + SECOND, NOW) is JobState.SLEEPING
    assert settled_state(wait, None, NOW) is JobState.WAITING  # no deadline
    assert settled_state(rule_of("complete"), NOW - SECOND, NOW) is JobState.COMPLETED


def test_the_state_machine_doc_lists_every_rule() -> None:
    doc = (pathlib.Path(__file__).parent.parent / "docs" / "state-machine.md").read_text()
    for kind, rule in RULES.items():
        assert f"| `{kind}` | {rule.state.value} |" in doc, kind
