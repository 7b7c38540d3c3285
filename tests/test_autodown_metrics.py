"""scripts/phases/autodown/metrics.py: the watched totals of a page read through
clients.prometheus (the required ones present, finite and non-negative; a repeated series or a
bad line is no reading), one page read within the run's deadline with the API key sent to the
peers' /metrics alone and no redirect followed, and the set's sum with its unreadable bound."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import script_module
from test_autodown import Catcher, Cloud, metrics_text
from test_clients_prometheus import BAD, LABELS, REPEATED, VALID

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT / "scripts"))  # the clients the package imports

from clients import prometheus  # noqa: E402

KEY = "FAKEreplicaSetApiKey0123456789abcdefghij"
NOW = 1_800_000_000.0


@pytest.fixture(scope="module")
def metrics() -> ModuleType:
    package = script_module.load_package(ROOT / "scripts/phases/autodown", "ad_metrics", "metrics")
    module: ModuleType = package.metrics
    return module


@pytest.fixture
def own() -> Iterator[Cloud]:
    c = Cloud()
    yield c
    c.close()


@pytest.fixture
def peer() -> Iterator[Cloud]:
    c = Cloud(metrics_key=KEY)
    yield c
    c.close()


@pytest.fixture
def catcher() -> Iterator[Catcher]:
    c = Catcher()
    yield c
    c.close()


def deadline(metrics: ModuleType, seconds: float = 30) -> Any:
    return metrics.Deadline(time.time, time.time() + seconds)


def test_autodown_reads_a_vllm_page_through_the_module_and_refuses_what_it_refuses() -> None:
    """autodown (scripts/phases/autodown/metrics.py, shipped with this module) sums a valid vLLM
    page per metric over its label sets, and takes the module's one rule: a page with a bad line
    or a repeated series anywhere, a metric it does not watch included, is no reading at all
    (its own parser skipped such lines and summed a repeated series)."""
    metrics = script_module.load_package(
        ROOT / "scripts" / "phases" / "autodown", "autodown_sums", "metrics"
    ).metrics
    page = VALID["vllm"] + (
        "# TYPE vllm:num_requests_waiting gauge\n"
        f"vllm:num_requests_waiting{{{LABELS}}} 4.0\n"
        f"vllm:generation_tokens_total{{{LABELS}}} 11.0\n"
        f"vllm:prompt_tokens_total{{{LABELS}}} 5.0\n"
    )
    assert metrics.reading(page) == {
        "vllm:num_requests_running": 3.0,
        "vllm:request_success_total": 3.0,
        "vllm:num_requests_waiting": 4.0,
        "vllm:generation_tokens_total": 11.0,
        "vllm:prompt_tokens_total": 5.0,
    }
    for name, bad in {**BAD, **REPEATED}.items():
        damaged = page + bad
        with pytest.raises(prometheus.ParseError):
            prometheus.totals(damaged, ())
        assert metrics.reading(damaged) is None, name


def test_a_reading_holds_the_watched_totals_alone(metrics: ModuleType) -> None:
    """vLLM's page as it serves it: each watched metric summed over its label sets (two
    finished reasons), the metrics it does not watch left out."""
    got = metrics.reading(metrics_text(running=2, waiting=1, finished=4, generated=9))
    assert got == {
        metrics.RUNNING: 2.0,
        metrics.WAITING: 1.0,
        metrics.FINISHED: 4.0,
        metrics.GENERATED: 9.0,
        metrics.PROMPTED: 12.0,
    }


@pytest.mark.parametrize(
    "name",
    ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:request_success_total",
     "vllm:generation_tokens_total"],
)  # fmt: skip
def test_a_page_without_a_required_metric_is_no_reading(metrics: ModuleType, name: str) -> None:
    page = "".join(line + "\n" for line in metrics_text().splitlines() if name not in line)
    assert metrics.reading(page) is None


def test_prompt_tokens_are_optional(metrics: ModuleType) -> None:
    """Only the progress counters vLLM always exports are required."""
    page = "".join(f"{line}\n" for line in metrics_text(finished=2).splitlines()
                   if "prompt_tokens" not in line)  # fmt: skip
    got = metrics.reading(page)
    assert got is not None and metrics.PROMPTED not in got
    assert got[metrics.FINISHED] == 2.0


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf", "-1", "-0.5"])
@pytest.mark.parametrize("name", ["vllm:num_requests_waiting", "vllm:prompt_tokens_total"])
def test_a_value_not_finite_or_negative_is_no_reading(
    metrics: ModuleType, name: str, value: str
) -> None:
    """The optional prompt counter too: a page holding such a value is read whole or not at
    all."""
    page = metrics_text().replace(f'{name}{{engine="0",model_name="nemotron"}} 0.0',
                                  f'{name}{{engine="0",model_name="nemotron"}} {value}')  # fmt: skip
    assert page != metrics_text()
    assert metrics.reading(page) is None


@pytest.mark.parametrize("extra", [*BAD.values(), *REPEATED.values()],
                         ids=[*BAD, *REPEATED])  # fmt: skip
def test_a_served_page_with_a_bad_line_or_a_repeated_series_is_unreadable(
    metrics: ModuleType, own: Cloud, extra: str
) -> None:
    own.metrics = metrics_text() + extra
    assert metrics.read(f"{own.url}/metrics", deadline(metrics)) is None
    own.metrics = metrics_text()
    assert metrics.read(f"{own.url}/metrics", deadline(metrics)) is not None


def test_the_key_goes_to_the_peers_metrics_alone(
    metrics: ModuleType, own: Cloud, peer: Cloud
) -> None:
    """This replica's vLLM on loopback gets no Authorization at all; each peer's private
    gateway gets the set's API key as a Bearer token."""
    state: dict[str, Any] = {"served": False, "unreadable_since": {}}
    metrics.read_set(f"{own.url}/metrics", [f"{peer.url}/metrics"], KEY, deadline(metrics),
                     state, None)  # fmt: skip
    assert own.auth_seen == [""]
    assert peer.auth_seen == [f"Bearer {KEY}"]


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_a_redirect_is_no_reading_and_is_not_followed(
    metrics: ModuleType, peer: Cloud, catcher: Catcher, status: int
) -> None:
    """Even a redirect that carries a valid page is an odd answer: no reading, and neither the
    request nor the key goes on to its target."""
    peer.metrics_status = status
    peer.metrics_headers = {"Location": f"{catcher.url}/metrics"}
    assert metrics.read(f"{peer.url}/metrics", deadline(metrics), KEY) is None
    assert catcher.seen == []


def test_too_little_time_left_sends_no_request(metrics: ModuleType, own: Cloud) -> None:
    assert metrics.read(f"{own.url}/metrics", deadline(metrics, 0.5)) is None
    assert own.auth_seen == [], "no request once less than a second is left"


def test_the_set_is_summed_and_busy_while_a_source_is_unreadable_within_its_bound(
    metrics: ModuleType, own: Cloud, peer: Cloud, capsys: pytest.CaptureFixture[str]
) -> None:
    urls = (f"{own.url}/metrics", [f"{peer.url}/metrics"])
    state: dict[str, Any] = {"served": True, "unreadable_since": {}}
    own.metrics = metrics_text(running=1, finished=2)
    peer.metrics = metrics_text(waiting=3, finished=5)
    total = metrics.read_set(*urls, KEY, deadline(metrics), state, 20)
    assert total is not None
    assert (total[metrics.RUNNING], total[metrics.WAITING], total[metrics.FINISHED]) == (1, 3, 7)
    peer.metrics = None
    assert metrics.read_set(*urls, KEY, deadline(metrics), state, 20) is None
    assert f"replica metrics unreadable at {peer.url}/metrics: the set counts as busy" in (
        capsys.readouterr().out
    )
    state["unreadable_since"][f"{peer.url}/metrics"] -= 20 * 60  # 20 minutes in a row
    total = metrics.read_set(*urls, KEY, deadline(metrics), state, 20)
    assert total is not None and total[metrics.FINISHED] == 2, "the peer counts as zeros"
    assert "for 20 min, past 20 (AUTODOWN_UNREADABLE_MINUTES): counted as idle" in (
        capsys.readouterr().out
    )
