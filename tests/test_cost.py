"""nemodrop/cost.py: each resource's hours since it was created (or since the month began)
times its price, from an inventory as nemodrop/inventory.py reads it."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from components.spec import catalog, kube
from nemodrop import cost
from nemodrop.inventory import Cluster, Droplet, Inventory, Volume

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def test_hours_from_created_or_from_the_month_start_whichever_is_later() -> None:
    assert cost.hours("2026-12-06T10:00:00Z", NOW) == 2
    # Created last month: the month's hours start on the 1st at 00:00 UTC.
    start = cost.month_start(NOW)
    assert cost.hours("2026-11-30T12:00:00Z", NOW, start) == 5 * 24 + 12
    assert cost.hours("2026-11-30T12:00:00Z", NOW) == 6 * 24
    assert cost.hours("not a time", NOW) == 0


def test_a_line_per_resource_at_its_price() -> None:
    found = Inventory(
        droplets=[Droplet(1, "gpu", "replica", "active", "2026-12-06T02:00:00Z",
                          "gpu-h100x1-80gb", 3.39, "tor1")],
        volumes=[Volume("v", "gpu-cache", 672, "2026-11-06T12:00:00Z", False)],
        load_balancers=[{"name": "lb", "created_at": "2026-12-06T11:00:00Z", "size_unit": 2}],
        clusters=[Cluster("c", "k", "running", "2026-12-06T11:00:00Z", True, [
            {"name": "k-gpu", "size": "gpu-h100x1-80gb", "count": 1,
             "nodes": [{"name": "n1", "created_at": "2026-12-06T06:00:00Z"}]},
        ])],
        prices={"gpu-h100x1-80gb": 3.39},
    )  # fmt: skip
    lines = {x.what.split(":")[0]: x for x in cost.lines(found, NOW)}
    assert lines["Droplet gpu"].total == pytest.approx(10 * 3.39, abs=0.01)
    # 672 GiB for 30 days (720 h): the catalog's price a GiB-month of 672 hours.
    volume = lines["Volume gpu-cache"]
    assert volume.total == pytest.approx(720 * catalog.VOLUME_PRICE_GIB_MONTH, abs=0.01)
    assert volume.month == pytest.approx(132 * catalog.VOLUME_PRICE_GIB_MONTH, abs=0.01)
    assert lines["Load Balancer lb"].total == pytest.approx(catalog.lb_hourly_price(2), abs=0.01)
    ha = kube.HA_PRICE_MONTH / catalog.HOURS_PER_BILLING_MONTH
    assert lines["cluster k"].total == pytest.approx(ha, abs=0.01)
    assert lines["node n1"].total == pytest.approx(6 * 3.39, abs=0.01)
