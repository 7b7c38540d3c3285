"""bench.py's numbers (nemodrop/bench_stats.py): the knee search's bisection between the last level
that held and the first that failed."""

from __future__ import annotations

from nemodrop import bench_stats


def test_knee_search_bisects_between_the_last_that_held_and_the_first_that_failed() -> None:
    search = bench_stats.KneeSearch(start=4, target_pct=90, steps=2)
    seen = []
    while (rate := search.next_rate()) is not None:
        seen.append(rate)
        search.record(rate, 100.0 if rate <= 13 else 50.0)  # the truth: 13 requests/s
    assert seen == [4, 8, 16, 12, 14]
    assert search.result() == {"request_rate": 12, "first_failing_rate": 14}
    failing = bench_stats.KneeSearch(start=8, target_pct=90, steps=1)
    failing.record(8, 10.0)
    assert failing.next_rate() == 4, "the start already fails: halve towards one that holds"
