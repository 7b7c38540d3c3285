"""The numbers bench.py reports: latency summaries with chosen percentiles, goodput against an
SLO, and the arrival schedule of an open-loop run. Pure functions, standard library only."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator, Sequence

DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)
# The metrics an SLO may bound, per request, in ms (as `vllm bench serve --goodput` names them:
# ttft, tpot, e2el; e2e is ours and the same thing).
SLO_METRICS = ("ttft", "tpot", "e2e")


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = (len(sorted_values) - 1) * q / 100
    low, high = math.floor(pos), math.ceil(pos)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (pos - low)


def pkey(q: float) -> str:
    """p50, p99, p99.9: the key a percentile is reported under."""
    return f"p{q:g}"


def summary_ms(
    seconds: Sequence[float], percentiles: Sequence[float] = DEFAULT_PERCENTILES
) -> dict[str, float | None]:
    """mean, std (population), min, max and the chosen percentiles, in ms; None without data."""
    keys = ["mean", "std", "min", "max", *(pkey(q) for q in percentiles)]
    if not seconds:
        return dict.fromkeys(keys)
    ms = sorted(s * 1000 for s in seconds)
    mean = sum(ms) / len(ms)
    out: dict[str, float | None] = {
        "mean": mean,
        "std": math.sqrt(sum((x - mean) ** 2 for x in ms) / len(ms)),
        "min": ms[0],
        "max": ms[-1],
    }
    out.update({pkey(q): percentile(ms, q) for q in percentiles})
    return out


def parse_percentiles(text: str) -> tuple[float, ...]:
    """ "50,90,99.9" -> (50.0, 90.0, 99.9); each in (0, 100]."""
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{text!r}: accepted: percentiles like 50,90,95,99,99.9") from None
    if not values or any(not 0 < v <= 100 for v in values):
        raise ValueError(f"{text!r}: accepted: percentiles between 0 and 100, like 50,90,99")
    return tuple(sorted(set(values)))


def parse_slo(text: str) -> dict[str, float]:
    """ "ttft=500,tpot=50" -> {"ttft": 500.0, "tpot": 50.0} (ms)."""
    slo: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, _, value = part.partition("=")
        name = {"e2el": "e2e"}.get(name.strip(), name.strip())
        if name not in SLO_METRICS:
            raise ValueError(f"{part!r}: accepted: {', '.join(SLO_METRICS)} bounds in ms")
        try:
            bound = float(value)
        except ValueError:
            raise ValueError(f"{part!r}: accepted: {name}=<milliseconds>") from None
        if not math.isfinite(bound) or bound <= 0:
            raise ValueError(f"{part!r}: the bound must be a positive number of ms")
        slo[name] = bound
    if not slo:
        raise ValueError(f"{text!r}: accepted: bounds like ttft=500,tpot=50,e2e=10000")
    return slo


def meets(slo: dict[str, float], values_s: dict[str, float | None]) -> bool:
    """A request meets the SLO when every bounded metric is known and within its bound."""
    for name, bound_ms in slo.items():
        value = values_s.get(name)
        if value is None or value * 1000 > bound_ms:
            return False
    return True


def parse_rates(text: str) -> list[float]:
    """ "5,10,inf" -> [5.0, 10.0, inf] requests/s; inf sends every request at once."""
    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{text!r}: accepted: request rates like 2,5,10 or inf") from None
    if not rates or any(math.isnan(r) or r <= 0 for r in rates):
        raise ValueError(f"{text!r}: accepted: positive request rates like 2,5,10 or inf")
    return rates


def arrivals(rate: float, burstiness: float, seed: int) -> Iterator[float]:
    """When each request starts, in seconds from the first, without end: gaps drawn from a
    gamma distribution of mean 1/rate and shape `burstiness` (1: Poisson arrivals, exponential
    gaps; below 1 burstier, above 1 more even), as `vllm bench serve` draws them. inf: all at 0."""
    rng = random.Random(seed)  # noqa: S311 (load shape, not secrets)
    t = 0.0
    while True:
        yield t
        if not math.isinf(rate):
            t += rng.gammavariate(burstiness, 1.0 / (rate * burstiness))


def arrival_offsets(n: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """The first n of `arrivals`."""
    return list(itertools.islice(arrivals(rate, burstiness, seed), n))


class KneeSearch:
    """The highest request rate that holds an SLO: double the rate from `start` until a level
    fails, then bisect between the last that held and the first that did not, `steps` times.
    A level holds when at least `target_pct` of its requests met every bound."""

    def __init__(self, start: float, target_pct: float, steps: int = 3, doublings: int = 12):
        self.target_pct, self.steps, self.doublings = target_pct, steps, doublings
        self.held: float | None = None  # the highest rate that held so far
        self.failed: float | None = None  # the lowest rate that failed so far
        self._next: float | None = start
        self._bisections = 0

    def next_rate(self) -> float | None:
        """The rate to run next; None when the search is done."""
        return self._next

    def record(self, rate: float, attainment_pct: float | None) -> None:
        holds = attainment_pct is not None and attainment_pct >= self.target_pct
        if holds:
            self.held = rate if self.held is None else max(self.held, rate)
        else:
            self.failed = rate if self.failed is None else min(self.failed, rate)
        if self.failed is None:  # still climbing
            self.doublings -= 1
            self._next = rate * 2 if self.doublings > 0 else None
        elif self.held is None:  # the first rate already failed: halve towards one that holds
            self.doublings -= 1
            self._next = rate / 2 if self.doublings > 0 else None
        elif self._bisections < self.steps:
            self._bisections += 1
            self._next = (self.held + self.failed) / 2
        else:
            self._next = None

    def result(self) -> dict[str, float | None]:
        return {"request_rate": self.held, "first_failing_rate": self.failed}
