"""metav1.Condition upkeep: lastTransitionTime moves with status only."""

from __future__ import annotations

import pytest

from tests.support.builders import T0, at
from vigil.api import MAX_CONDITION_MESSAGE, Condition
from vigil.core.conditions import set_condition, truncate_message

pytestmark = pytest.mark.unit


def running(status: str, reason: str, when=T0, generation: int = 1) -> Condition:
    return Condition(
        type="Running",
        status=status,
        reason=reason,
        message=f"{reason} message",
        last_transition_time=when,
        observed_generation=generation,
    )


def test_a_new_condition_is_appended_with_now_as_its_transition_time() -> None:
    other = running("True", "A").model_copy(update={"type": "Other"})
    result = set_condition([other], type="Running", status="True", reason="Go", message="m", now=at(5), generation=2)
    assert result == [other, running("True", "Go", at(5), 2).model_copy(update={"message": "m"})]


def test_the_same_status_keeps_its_transition_time_but_takes_the_new_reason() -> None:
    result = set_condition(
        [running("False", "Queued")],
        type="Running",
        status="False",
        reason="BackingOff",
        message="b",
        now=at(9),
        generation=3,
    )
    (condition,) = result
    assert condition.last_transition_time == T0
    assert (condition.reason, condition.message, condition.observed_generation) == ("BackingOff", "b", 3)


def test_a_new_status_moves_the_transition_time() -> None:
    before = [running("False", "Queued"), running("True", "X").model_copy(update={"type": "Succeeded"})]
    result = set_condition(before, type="Running", status="True", reason="Go", message="", now=at(9), generation=1)
    assert result[0].last_transition_time == at(9)
    assert result[1] == before[1]  # others untouched, order kept


def test_a_message_over_the_limit_is_cut_with_a_visible_ellipsis() -> None:
    (condition,) = set_condition(
        [], type="Running", status="False", reason="R", message="x" * 40_000, now=T0, generation=1
    )
    assert len(condition.message) == MAX_CONDITION_MESSAGE
    assert condition.message.endswith("x…")


def test_a_message_at_the_limit_is_kept_whole_and_characters_are_counted_not_bytes() -> None:
    exact = "é" * MAX_CONDITION_MESSAGE  # two bytes each in UTF-8; the API server counts characters
    assert truncate_message(exact) == exact
    assert truncate_message(exact + "é") == "é" * (MAX_CONDITION_MESSAGE - 1) + "…"
