"""engine.clock: the wall clock and datetimes as exact epoch milliseconds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from hypothesis import given
from hypothesis import strategies as st

from filechannel.engine.clock import datetime_ms, now_ms

ZONES = st.sampled_from([UTC, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-8))])


@given(st.integers(min_value=-(10**13), max_value=10**14), st.integers(min_value=0, max_value=999), ZONES)
def test_an_aware_datetime_is_its_exact_millisecond(ms: int, micros: int, zone: timezone) -> None:
    """No float rounding: the millisecond a datetime names is the one returned, sub-millisecond parts floored."""
    when = (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms, microseconds=micros)).astimezone(zone)
    assert datetime_ms(when) == ms


def test_a_naive_datetime_is_local_or_utc_as_asked() -> None:
    naive = datetime(2026, 1, 31, 12, 0, 0, 123000)
    assert datetime_ms(naive, naive_is_utc=True) == datetime_ms(naive.replace(tzinfo=UTC))
    assert datetime_ms(naive) == datetime_ms(naive.astimezone())


def test_now_is_between_two_readings_of_the_clock() -> None:
    before = datetime_ms(datetime.now(UTC))
    now = now_ms()
    assert before <= now <= datetime_ms(datetime.now(UTC)) + 1
