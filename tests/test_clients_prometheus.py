"""scripts/clients/prometheus.py: one reading of Prometheus' text format for every reader of a
/metrics page. prometheus_client's parser (the project's virtualenv has it) and the standard
library port (a host's python3) give the same answer on the same pages, and one rule holds for
both: a page is read whole or not at all (a bad line, or a series given twice, refuses it)."""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT / "scripts"))

from clients import prometheus  # noqa: E402

LABELS = 'engine="0",model_name="nemotron"'


def exposed() -> str:
    """A page as vLLM writes it: prometheus_client's own exposition (counters with _total and
    _created, a histogram's buckets up to +Inf), with label values that hold commas, braces,
    quotes, backslashes and a line feed."""
    registry = CollectorRegistry()
    running = Gauge("vllm:num_requests_running", "Running.", ["engine", "model_name"],
                    registry=registry)  # fmt: skip
    running.labels("0", "nemotron").set(2)
    running.labels("1", 'odd "name", {with} \\ and\nline').set(1)
    done = Counter("vllm:request_success", "Finished.", ["finished_reason"], registry=registry)
    done.labels("stop").inc(7)
    done.labels("length").inc(1)
    latency = Histogram("vllm:e2e_request_latency_seconds", "Latency.", registry=registry,
                        buckets=(0.5, 1.0))  # fmt: skip
    latency.observe(0.7)
    return generate_latest(registry).decode()


VALID = {
    "exposed": exposed(),
    "vllm": (
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        f"vllm:num_requests_running{{{LABELS}}} 1.0\n"
        f'vllm:num_requests_running{{engine="1",model_name="nemotron"}} 2.0\n'
        "# TYPE vllm:request_success_total counter\n"
        f'vllm:request_success_total{{{LABELS},finished_reason="stop"}} 3.0\n'
    ),
    "escapes": 'm{a="quote \\" back \\\\ nl \\n end",b="x,y}z"} 1\n',
    "special values": "a +Inf\nb -Inf\nc NaN\nd 1e3\ne -0.5\nf 12\n",
    "timestamps": 'a 1 1700000000000\nb{x="1"} 2 -5\n',
    "tabs and spaces": "  a\t3  \n\n# a comment\n#not a keyword line\n",
    "counter without _total": "# TYPE foo counter\nfoo 4\nbar_total 5\n",
    "summary family": '# TYPE s summary\ns{quantile="0.5"} 1\ns_sum 2\ns_count 3\n',
    "quoted name": '{"my.metric",a="1"} 2\n{__name__="plain"} 3\n',
    "trailing comma": 'm{a="1",} 1\n',
    "help escapes": "# HELP h a \\\\ b \\n c\n# TYPE h gauge\nh 1\n",
}
BAD = {
    "no value": "vllm:num_requests_running\n",
    "word value": "a one\n",
    "underscore value": "a 1_000\n",
    "unclosed quote": 'a{b="c} 1\n',
    "unquoted label value": "a{b=c} 1\n",
    "bad name": "9a 1\n",
    "reserved label": 'a{__x="1"} 1\n',
    "label twice": 'a{b="1",b="2"} 1\n',
    "double comma": 'a{b="1",,c="2"} 1\n',
    "type without type": "# TYPE a\na 1\n",
    "unknown type": "# TYPE a bogus\na 1\n",
    "bad timestamp": "a 1 soon\n",
    "cut mid line": f"vllm:num_requests_running{{{LABELS[:10]}",
    "name given twice": '{"a",__name__="b"} 1\n',
}
REPEATED = {
    "same series": "a 1\na 2\n",
    "same labels, other order": 'a{x="1",y="2"} 1\na{y="2",x="1"} 2\n',
    "repeat of a labelled vLLM series": VALID["vllm"]
    + f"vllm:num_requests_running{{{LABELS}}} 9\n",
}


Answer = list[tuple[str, tuple[tuple[str, str], ...], str]] | str


def reading(read: Callable[[str], list[prometheus.Sample]], page: str) -> Answer:
    """A comparable answer: the samples (values by repr, so NaN equals NaN), or 'refused'."""
    try:
        return [(s.name, s.labels, repr(s.value)) for s in read(page)]
    except prometheus.ParseError:
        return "refused"


@pytest.mark.parametrize("page", [*VALID.values(), *BAD.values(), *REPEATED.values()],
                         ids=[*VALID, *BAD, *REPEATED])  # fmt: skip
def test_both_parsers_give_the_same_answer(page: str) -> None:
    assert reading(prometheus.client_samples, page) == reading(prometheus.stdlib_samples, page)


@pytest.mark.parametrize("page", VALID.values(), ids=list(VALID))
def test_a_valid_page_is_read(page: str) -> None:
    assert reading(prometheus.stdlib_samples, page) != "refused"
    assert prometheus.samples(page)


@pytest.mark.parametrize("page", BAD.values(), ids=list(BAD))
def test_a_bad_line_refuses_the_page(page: str) -> None:
    assert reading(prometheus.stdlib_samples, page) == "refused"
    with pytest.raises(prometheus.ParseError):
        prometheus.samples(page)


@pytest.mark.parametrize("page", REPEATED.values(), ids=list(REPEATED))
def test_a_series_given_twice_refuses_the_page(page: str) -> None:
    """prometheus_client keeps both lines; the format has one line per series (the module's
    docstring cites it): neither summed nor the last kept."""
    assert reading(prometheus.stdlib_samples, page) != "refused"
    with pytest.raises(prometheus.ParseError, match="given twice"):
        prometheus.samples(page)


def test_the_values_labels_and_escapes_read_as_the_format_says() -> None:
    [escaped] = prometheus.stdlib_samples(VALID["escapes"])
    assert dict(escaped.labels) == {"a": 'quote " back \\ nl \n end', "b": "x,y}z"}
    special = {s.name: s.value for s in prometheus.samples(VALID["special values"])}
    assert special["a"] == math.inf and special["b"] == -math.inf and math.isnan(special["c"])
    assert (special["d"], special["e"], special["f"]) == (1000.0, -0.5, 12.0)
    munged = [s.name for s in prometheus.samples(VALID["counter without _total"])]
    assert munged == ["foo_total", "bar_total"]  # as prometheus_client names a counter's samples


def test_totals_sum_each_name_over_its_label_sets() -> None:
    page = VALID["vllm"]
    sums = prometheus.totals(page, ["vllm:num_requests_running", "vllm:request_success_total",
                                    "vllm:absent"])  # fmt: skip
    assert sums == {"vllm:num_requests_running": 3.0, "vllm:request_success_total": 3.0}


def test_without_prometheus_client_the_port_reads_the_page(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host's python3 has no prometheus_client: samples() falls back, with the same rule."""
    assert prometheus.client_parser is not None  # the project venv has it
    with_client = prometheus.samples(VALID["exposed"])
    monkeypatch.setattr(prometheus, "client_parser", None)
    assert prometheus.samples(VALID["exposed"]) == with_client
    with pytest.raises(prometheus.ParseError, match="given twice"):
        prometheus.samples(REPEATED["same series"])
    with pytest.raises(RuntimeError):
        prometheus.client_samples(VALID["vllm"])


def mutations(rng: random.Random, page: str) -> str:
    """The page with a few characters of the format's own alphabet cut, doubled or put in."""
    alphabet = ' \t\n{}",=\\#_:+-.0123456789aeINT'
    chars = list(page)
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(len(chars) + 1)
        choice = rng.random()
        if choice < 0.4 and at < len(chars):
            del chars[at]
        elif choice < 0.6 and at < len(chars):
            chars.insert(at, chars[at])
        else:
            chars.insert(at, rng.choice(alphabet))
    return "".join(chars)


def test_both_parsers_agree_on_thousands_of_damaged_pages() -> None:
    """Seeded: each page of the corpus damaged a few characters at a time; whatever the one
    parser answers (samples or a refusal), the other answers the same."""
    rng = random.Random(44)  # noqa: S311 (a seeded corpus, not a secret)
    pages = [*VALID.values(), *BAD.values(), *REPEATED.values()]
    refused = 0
    for _ in range(3000):
        page = mutations(rng, rng.choice(pages))
        answer = reading(prometheus.client_samples, page)
        assert answer == reading(prometheus.stdlib_samples, page), repr(page)
        refused += answer == "refused"
    assert 300 < refused < 2700  # both kinds of answer were compared
