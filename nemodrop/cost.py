"""The stack's cost so far, from what exists now: each resource's hours (created_at to now, or
from the month's start) times its price, each line saying what it counts.

Prices: a Droplet's and a node's from its size object (price_hourly, the API's own); a Volume
at catalog.VOLUME_PRICE_GIB_MONTH and a Load Balancer at catalog.lb_hourly_price, a month as
catalog.HOURS_PER_BILLING_MONTH hours (the one place the program keeps them). What no longer
exists is not in the API (a Droplet autodown deleted, an earlier wake's replicas): not counted,
and said so. A Reserved IP is left unpriced: the catalog holds no price for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from components.spec import catalog, kube
from nemodrop.inventory import Inventory

NOT_COUNTED = "deleted Droplets' hours (earlier wakes'): the API lists what exists"


@dataclass(frozen=True)
class Line:
    what: str  # the resource, and what its number counts
    month: float  # USD since the month's start (UTC), or since created if later
    total: float  # USD since it was created


def parse_time(text: str) -> datetime | None:
    """An API timestamp (RFC 3339, `Z`) as an aware datetime; None when unreadable."""
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def hours(since: str, now: datetime, floor: datetime | None = None) -> float:
    """Hours from `since` (or `floor`, when later) to `now`; 0 for an unreadable time."""
    start = parse_time(since)
    if start is None:
        return 0.0
    if floor is not None and floor > start:
        start = floor
    return max(0.0, (now - start).total_seconds() / 3600)


def month_start(now: datetime) -> datetime:
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def line(what: str, created_at: str, hourly: float, now: datetime) -> Line:
    month = hours(created_at, now, month_start(now)) * hourly
    return Line(what, round(month, 2), round(hours(created_at, now) * hourly, 2))


def lines(found: Inventory, now: datetime) -> list[Line]:
    """One line per priced resource that exists now."""
    out = [
        line(f"Droplet {d.name}: {d.size} at ${d.price_hourly:g}/h", d.created_at,
             d.price_hourly, now)
        for d in found.droplets
    ]  # fmt: skip
    gib_hour = catalog.VOLUME_PRICE_GIB_MONTH / catalog.HOURS_PER_BILLING_MONTH
    out += [
        line(f"Volume {v.name}: {v.size_gigabytes} GiB at "
             f"${catalog.VOLUME_PRICE_GIB_MONTH:g}/GiB/month", v.created_at,
             v.size_gigabytes * gib_hour, now)
        for v in found.volumes
    ]  # fmt: skip
    out += [
        line(f"Load Balancer {lb['name']}: {lb['size_unit']} node(s)", str(lb["created_at"]),
             catalog.lb_hourly_price(int(lb["size_unit"])), now)
        for lb in found.load_balancers
    ]  # fmt: skip
    for cluster in found.clusters:
        if cluster.ha:  # the control plane's price with HA (spec/kube.py HA_PRICE_MONTH)
            hourly = kube.HA_PRICE_MONTH / catalog.HOURS_PER_BILLING_MONTH
            out.append(line(f"cluster {cluster.name}: HA control plane", cluster.created_at,
                            hourly, now))  # fmt: skip
        for pool in cluster.pools:
            price = found.prices.get(str(pool["size"]), 0.0)
            out += [
                line(f"node {n['name']}: {pool['size']} at ${price:g}/h", str(n["created_at"]),
                     price, now)
                for n in pool["nodes"]
            ]  # fmt: skip
    return out
