"""The pure cron maths of `trioq._core.schedule`: fire times, time zones, misfire policies."""

from __future__ import annotations

import datetime

import pytest

from trioq._core.schedule import Cron, Misfire, fire_dedup_key, plan_fires

UTC = datetime.UTC


def at(hour: int, minute: int = 0, second: int = 0, day: int = 1) -> datetime.datetime:
    return datetime.datetime(2026, 1, day, hour, minute, second, tzinfo=UTC)


HOURLY = Cron("0 * * * *")


def test_fire_times_follow_local_time_across_a_dst_change() -> None:
    paris = Cron("0 9 * * *", "Europe/Paris")
    start = datetime.datetime(2026, 3, 28, 12, tzinfo=UTC)
    fires = paris.fire_times_after(start)
    # 09:00 Paris is 08:00 UTC in winter (CET) and 07:00 UTC from 29 March (CEST).
    assert [next(fires) for _ in range(2)] == [
        datetime.datetime(2026, 3, 29, 7, tzinfo=UTC),
        datetime.datetime(2026, 3, 30, 7, tzinfo=UTC),
    ]


def test_six_field_expressions_have_seconds_last() -> None:
    fires = Cron("* * * * * */10").fire_times_after(at(12))
    assert [next(fires) for _ in range(2)] == [at(12, 0, 10), at(12, 0, 20)]


@pytest.mark.parametrize("misfire", list(Misfire))
def test_an_on_time_fire_is_enqueued_by_every_policy(misfire: Misfire) -> None:
    plan = plan_fires(HOURLY, at(10), at(10, 0, 1), misfire)
    assert (plan.fires, plan.missed, plan.next_fire_at) == ((at(10),), 0, at(11))


def test_nothing_is_due_before_the_next_fire_time() -> None:
    assert plan_fires(HOURLY, at(10), at(9, 59), Misfire.ALL).fires == ()


@pytest.mark.parametrize(
    ("misfire", "hours", "missed"),
    [(Misfire.ALL, [10, 11, 12, 13, 14], 0), (Misfire.LATEST, [14], 4), (Misfire.SKIP, [], 5)],
)
def test_policies_after_a_downtime(misfire: Misfire, hours: list[int], missed: int) -> None:
    plan = plan_fires(HOURLY, at(10), at(14, 30), misfire)
    assert plan.fires == tuple(at(hour) for hour in hours)
    assert (plan.missed, plan.next_fire_at) == (missed, at(15))


def test_skip_keeps_fires_within_the_grace_window() -> None:
    plan = plan_fires(Cron("* * * * * */20"), at(10), at(10, 5, 30), Misfire.SKIP)
    assert plan.fires == (at(10, 4, 40), at(10, 5, 0), at(10, 5, 20))


def test_catch_up_is_bounded_and_keeps_the_most_recent_fires() -> None:
    plan = plan_fires(HOURLY, at(0), at(23, 30), Misfire.ALL, catchup_limit=3)
    assert plan.fires == (at(21), at(22), at(23))
    assert plan.missed == 21


def test_a_long_downtime_of_a_per_second_schedule_is_planned_without_walking_it() -> None:
    every_second = Cron("* * * * * *")
    plan = plan_fires(every_second, at(0), at(0, day=8), Misfire.ALL, catchup_limit=5)
    assert len(plan.fires) == 5 and plan.fires[-1] == at(0, day=8)
    assert plan.missed >= 10  # a lower bound: the week was not walked one second at a time
    assert plan.next_fire_at == at(0, 0, 1, day=8)


def test_occurrence_keys_name_the_schedule_and_the_fire_time_in_utc() -> None:
    paris = datetime.timezone(datetime.timedelta(hours=1))
    same = datetime.datetime(2026, 1, 1, 10, tzinfo=paris)
    assert fire_dedup_key("digest", same) == fire_dedup_key("digest", at(9))
    assert fire_dedup_key("digest", at(9)) == "schedule:digest:2026-01-01T09:00:00.000000+00:00"
