"""The overview's last hour (outbox.console.history): rates from the workers' counters, lag,
the hour's window, and the polylines."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from outbox.console.history import Trend, polyline

T0 = datetime(2026, 11, 24, 9, 0, tzinfo=UTC)


def test_rates_come_from_each_workers_counter_steps() -> None:
    trend = Trend()
    trend.add(T0, {"w1": 100, "w2": 50}, 3.0)
    trend.add(T0 + timedelta(seconds=10), {"w1": 300, "w2": 150}, 1.5)
    # w2 restarted (its counter fell) and w3 is new: neither counts for this step.
    trend.add(T0 + timedelta(seconds=20), {"w1": 400, "w2": 20, "w3": 999}, None)
    trend.add(T0 + timedelta(seconds=30), {}, None)  # no live worker: no rate
    rates = [s.applied_per_second for s in trend.samples]
    assert rates == [None, 30.0, 10.0, None]
    assert [s.oldest_claimable_age_seconds for s in trend.samples] == [3.0, 1.5, None, None]


def test_only_the_last_hour_is_kept() -> None:
    trend = Trend()
    for minute in range(0, 130, 5):
        trend.add(T0 + timedelta(minutes=minute), {"w": minute}, float(minute))
    kept = [s.at for s in trend.samples]
    assert kept[0] == T0 + timedelta(minutes=65)
    assert kept[-1] == T0 + timedelta(minutes=125)


def test_polylines_scale_to_the_largest_value_and_skip_gaps() -> None:
    assert polyline([None, 1.0], width=100, height=10) == "100.0,0.0"
    assert polyline([0.0, 5.0, None, 10.0], width=30, height=10) == "0.0,10.0 10.0,5.0 30.0,0.0"
    assert polyline([1.0], width=100, height=10) == ""
    assert polyline([None, None], width=100, height=10) == ""
