"""The tools users run (smoke, bench, logs) against real local servers on loopback."""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import fake_openai
import openai
import pytest
import requests
from fake_pulumi import FakePulumi

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


bench_stats = _load("bench_stats")
bench_workload = _load("bench_workload")
KEY = "sk-test-0123456789"


@contextmanager
def fake_server(*args: str, key: str = KEY) -> Iterator[str]:
    """tests/support/fake_openai.py in its own process (asking for `key`); yield its /v1 base
    URL."""
    with fake_openai.running(*args, key=key) as fake:
        yield fake.url + "/v1"


def stats(base: str) -> dict[str, Any]:
    return requests.get(base.removesuffix("/v1") + "/_stats", timeout=5).json()


def run_tool(
    name: str, *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, str(SCRIPTS / name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        check=False,
    )


def bench(base: str, tmp_path: Path, **flags: object) -> list[dict[str, Any]]:
    """Run bench.py; `max_tokens=4` becomes `--max-tokens 4`; return its levels."""
    return bench_result(base, tmp_path, **flags)["levels"]


def bench_result(base: str, tmp_path: Path, **flags: object) -> dict[str, Any]:
    """Run bench.py and return its whole result file."""
    args = [
        a
        for k, v in flags.items()
        for a in (
            (f"--{k.replace('_', '-')}",) if v is True else (f"--{k.replace('_', '-')}", str(v))
        )
    ]
    out = tmp_path / "bench.json"
    proc = run_tool(
        "bench.py",
        "--endpoint",
        base,
        "--api-key",
        KEY,
        "--model",
        "nemotron",
        "--no-progress",
        "--json",
        str(out),
        *args,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(out.read_text())
    assert KEY not in out.read_text(), "the key never reaches the result file"
    return result


# ---- the fake speaks the protocol -----------------------------------------------------------


def test_fake_server_passes_with_the_official_openai_client() -> None:
    with fake_server("--ttft", "0.01", "--itl", "0.005", "--tokens", "5") as base:
        client = openai.OpenAI(base_url=base, api_key=KEY)
        assert [m.id for m in client.models.list()] == ["nemotron"]
        reply = client.chat.completions.create(
            model="nemotron", messages=[{"role": "user", "content": "hi there"}], max_tokens=5
        )
        assert reply.choices[0].message.content == " tok" * 5
        assert reply.usage is not None and reply.usage.completion_tokens == 5
        chunks = list(
            client.chat.completions.create(
                model="nemotron",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=5,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == " tok" * 5
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=base, api_key="wrong").models.list()


# ---- bench -----------------------------------------------------------------------------------


def near_injected(measured: float, injected_s: float) -> bool:
    """A latency the client measured against what the fake server waits: the server's sleep is
    a floor (5% below it: where chunks arrive bunched), and a busy machine (the suite runs on
    four workers on two cores) adds scheduling on top: a third of it, plus 20 ms that a short
    gap cannot absorb (a clean CI run measured a 30 ms gap at 39 ms). This bound alone would
    not tell a first-token wait folded into the mean: the formula is held exactly where the
    requests are saved (the gaps' number per request, and the mean of exactly those gaps)."""
    return injected_s * 1000 * 0.95 <= measured <= injected_s * 1000 * 1.3 + 20


def test_bench_reads_the_injected_ttft_and_itl(tmp_path: Path) -> None:
    ttft, itl, tokens = 0.200, 0.030, 12
    saved = tmp_path / "requests.jsonl"
    with fake_server("--ttft", str(ttft), "--itl", str(itl), "--tokens", "64") as base:
        reports = bench(
            base, tmp_path, concurrency="1,4", requests=8, input_tokens=40, max_tokens=str(tokens),
            save_requests=str(saved),
        )  # fmt: skip
    # Exactly the gaps between tokens: not the first token's wait, not one too many or few.
    lines = [json.loads(line) for line in saved.read_text().splitlines()]
    assert len(lines) == 16 and all(len(x["itl_s"]) == tokens - 1 for x in lines), lines[0]
    assert [r["concurrency"] for r in reports] == [1, 4]
    for r in reports:
        assert r["requests"] == 8 and r["errors"] == 0
        assert near_injected(r["ttft_ms"]["mean"], ttft), r["ttft_ms"]
        assert near_injected(r["itl_ms"]["mean"], itl), r["itl_ms"]
        # Exactly the mean of the gaps its requests saved: no first-token wait folded in.
        gaps = [g for x in lines if x["concurrency"] == r["concurrency"] for g in x["itl_s"]]
        assert r["itl_ms"]["mean"] == pytest.approx(1000 * sum(gaps) / len(gaps))
        assert near_injected(r["tpot_ms"]["p50"], itl), r["tpot_ms"]
        assert near_injected(r["e2e_ms"]["mean"], ttft + itl * (tokens - 1)), r["e2e_ms"]
        # Token counts are the server's usage: the fake counts prompt words, and sends max_tokens.
        assert r["mean_output_tokens"] == tokens
        assert r["mean_prompt_tokens"] == 40
        assert r["output_tokens_per_s"] == pytest.approx(8 * tokens / r["duration_s"])
        assert r["total_tokens_per_s"] == pytest.approx(8 * (tokens + 40) / r["duration_s"])
        for key in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
            assert set(r[key]) == {"mean", "std", "min", "max", "p50", "p90", "p99"}
        assert r["ttft_ms"]["min"] <= r["ttft_ms"]["p50"] <= r["ttft_ms"]["max"]
        assert r["requests_per_s"] == pytest.approx(8 / r["duration_s"])


def test_bench_counts_tokens_from_usage_not_chunks(tmp_path: Path) -> None:
    with fake_server("--mode", "one-chunk", "--tokens", "64", "--ttft", "0.01") as base:
        [r] = bench(base, tmp_path, concurrency=2, requests=4, max_tokens=20, input_tokens=10)
    assert r["errors"] == 0
    assert r["mean_output_tokens"] == 20
    assert r["itl_ms"]["mean"] is None  # one chunk: no gap between chunks to measure


def test_bench_counts_injected_failures_and_timeouts_without_crashing(tmp_path: Path) -> None:
    with fake_server("--fail-every", "4", "--ttft", "0.01", "--itl", "0.001") as base:
        [r] = bench(
            base, tmp_path, concurrency=1, requests=16, warmup=0, max_tokens=4, input_tokens=8
        )
    assert r["requests"] == 16
    assert r["errors"] == 4
    assert r["errors_by_kind"] == {"http_500": 4}
    assert r["mean_output_tokens"] == 4

    with fake_server("--stall-every", "3", "--ttft", "0.01", "--itl", "0.001") as base:
        [r] = bench(
            base,
            tmp_path,
            concurrency=2,
            requests=6,
            warmup=0,
            max_tokens=4,
            input_tokens=8,
            timeout=1,
        )
    assert r["errors_by_kind"] == {"timeout": 2}
    assert r["requests"] == 6


def test_bench_keeps_256_streams_in_flight_from_one_process(tmp_path: Path) -> None:
    with fake_server("--ttft", "0.3", "--itl", "0.02", "--tokens", "32") as base:
        [r] = bench(
            base, tmp_path, concurrency=256, requests=256, warmup=0, max_tokens=32, input_tokens=64
        )
        seen = stats(base)
    assert r["errors"] == 0, r["errors_by_kind"]
    assert seen["max_in_flight"] == 256


def test_bench_open_loop_sends_poisson_arrivals_at_the_rate_asked(tmp_path: Path) -> None:
    """Open loop: the server sees requests arrive at the rate, with exponential gaps (their
    standard deviation equals their mean), whatever its own pace."""
    rate, n = 40.0, 240
    with fake_server("--ttft", "0.05", "--itl", "0.005", "--tokens", "4") as base:
        [r] = bench(
            base, tmp_path, request_rate=rate, requests=n, warmup=0, max_tokens=4, input_tokens=8
        )
        arrivals = stats(base)["arrivals"]
    assert r["mode"] == "open" and r["request_rate"] == rate and r["errors"] == 0
    gaps = [b - a for a, b in itertools.pairwise(sorted(arrivals))]
    mean = sum(gaps) / len(gaps)
    std = (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5
    # 239 exponential gaps: the mean within about 4 standard errors, the CV near 1.
    assert mean == pytest.approx(1 / rate, rel=0.25)
    assert std / mean == pytest.approx(1.0, abs=0.3)
    assert r["achieved_request_rate"] == pytest.approx(rate, rel=0.25)


def test_bench_burstiness_below_one_bunches_the_arrivals(tmp_path: Path) -> None:
    with fake_server("--ttft", "0.01", "--itl", "0.001", "--tokens", "2") as base:
        bench(
            base, tmp_path, request_rate=50, burstiness=0.25, requests=200, warmup=0,
            max_tokens=2, input_tokens=4,
        )  # fmt: skip
        arrivals = stats(base)["arrivals"]
    gaps = [b - a for a, b in itertools.pairwise(sorted(arrivals))]
    mean = sum(gaps) / len(gaps)
    std = (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5
    assert std / mean > 1.4, "gamma shape 0.25: a CV of 2, far burstier than Poisson"


def test_bench_max_concurrency_caps_an_open_loop(tmp_path: Path) -> None:
    with fake_server("--ttft", "0.2", "--itl", "0.01", "--tokens", "4") as base:
        [r] = bench(
            base, tmp_path, request_rate="inf", max_concurrency=3, requests=12, warmup=0,
            max_tokens=4, input_tokens=8,
        )  # fmt: skip
        seen = stats(base)
    assert r["request_rate"] == "inf" and r["concurrency"] == 3 and r["errors"] == 0
    assert seen["max_in_flight"] == 3


def test_bench_goodput_counts_exactly_the_requests_within_the_slo(tmp_path: Path) -> None:
    """Every 4th request is slow (TTFT 400 ms against 20 ms): with a 150 ms TTFT bound, 3 in 4
    meet it."""
    flags = ("--ttft", "0.02", "--itl", "0.002", "--slow-every", "4", "--slow-ttft", "0.4")
    with fake_server(*flags) as base:
        [r] = bench(
            base, tmp_path, concurrency=2, requests=16, warmup=0, max_tokens=4, input_tokens=8,
            slo="ttft=150,e2e=5000",
        )  # fmt: skip
    assert r["slo_ms"] == {"ttft": 150.0, "e2e": 5000.0}
    assert r["slo_attainment_pct"] == 75.0
    assert r["goodput_requests_per_s"] == pytest.approx(12 / r["duration_s"])
    assert r["requests_per_s"] == pytest.approx(16 / r["duration_s"])


@pytest.mark.parametrize("mode", ["reasoning", "reasoning-content", "tool-call"])
def test_bench_times_reasoning_and_tool_call_chunks_as_tokens(tmp_path: Path, mode: str) -> None:
    """Nemotron streams its reasoning first, and a tool call streams no content at all: both
    are tokens, so TTFT is the first of them, not the first content."""
    ttft, itl = 0.1, 0.03
    with fake_server("--mode", mode, "--ttft", str(ttft), "--itl", str(itl)) as base:
        [r] = bench(base, tmp_path, concurrency=1, requests=4, max_tokens=10, input_tokens=8)
    assert r["errors"] == 0, r["errors_by_kind"]
    assert near_injected(r["ttft_ms"]["mean"], ttft), r["ttft_ms"]
    assert near_injected(r["itl_ms"]["mean"], itl), r["itl_ms"]
    assert r["mean_output_tokens"] == 10 and r["token_counts"] == "server"


def test_bench_counts_a_stream_without_usage_from_its_chunks_and_says_so(tmp_path: Path) -> None:
    with fake_server("--mode", "no-usage", "--ttft", "0.01", "--itl", "0.002") as base:
        result = bench_result(
            base, tmp_path, concurrency=2, requests=4, max_tokens=6, input_tokens=8
        )
    [r] = result["levels"]
    assert r["errors"] == 0
    assert r["token_counts"] == "client"
    assert r["mean_output_tokens"] == 6
    assert r["mean_prompt_tokens"] is None and r["total_tokens_per_s"] is None


def test_bench_saves_one_line_per_request_and_describes_the_run(tmp_path: Path) -> None:
    saved = tmp_path / "requests.jsonl"
    with fake_server("--ttft", "0.01", "--itl", "0.002") as base:
        result = bench_result(
            base, tmp_path, concurrency="1,2", requests=5, max_tokens=3, input_tokens=8, seed=7,
            percentiles="50,95,99.9", save_requests=str(saved),
        )  # fmt: skip
    lines = [json.loads(line) for line in saved.read_text().splitlines()]
    assert len(lines) == 10
    assert [(x["level"], x["index"]) for x in lines] == [(lv, i) for lv in (0, 1) for i in range(5)]
    first = lines[0]
    assert first["status"] == "ok" and first["completion_tokens"] == 3
    assert len(first["itl_s"]) == 2 and first["ttft_s"] > 0 and first["e2e_s"] >= first["ttft_s"]
    assert result["version"] and result["tool"].endswith("bench.py")
    assert result["endpoint"] == base and result["model"] == "nemotron" and result["seed"] == 7
    assert result["date"].startswith(("20",))
    settings = result["settings"]
    assert settings["concurrency"] == [1, 2] and settings["max_tokens"] == 3
    assert "api_key" not in settings
    assert set(result["levels"][0]["ttft_ms"]) >= {"p50", "p95", "p99.9", "std", "max"}


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--slo", "ttft=fast"), "ttft=<milliseconds>"),
        (("--slo", "latency=5"), "accepted: ttft, tpot, e2e"),
        (("--request-rate", "0"), "positive request rates"),
        (("--request-rate", "5", "--concurrency", "2"), "not allowed with argument"),
        (("--percentiles", "50,120"), "between 0 and 100"),
        (("--concurrency", "2", "--max-concurrency", "2"), "use it with --request-rate"),
        (("--request-rate", "5", "--burstiness", "0"), "--burstiness must be a positive"),
        (("--request-rate", "5", "--find-knee"), "--find-knee needs --slo"),
        (("--request-rate", "5,10", "--find-knee", "--slo", "ttft=5"), "one finite rate"),
    ],
)
def test_bench_refuses_bad_load_settings_with_the_accepted_form(
    flags: tuple[str, ...], message: str
) -> None:
    proc = run_tool("bench.py", "--endpoint", "http://127.0.0.1:9/v1", "--api-key", KEY, *flags)
    assert proc.returncode == 2
    assert message in proc.stderr


def test_bench_finds_the_knee_of_a_server_of_known_capacity(tmp_path: Path) -> None:
    """2 slots of 90 ms each (TTFT 50 ms, then 4 tokens 10 ms apart): 22 requests/s at most.
    Evenly spaced arrivals below that never wait; above it the queue grows and TTFT passes the
    150 ms bound. The search doubles from 10/s, then bisects: the knee is within a step of 22."""
    flags = ("--ttft", "0.05", "--itl", "0.01", "--tokens", "5", "--capacity", "2")
    with fake_server(*flags) as base:
        result = bench_result(
            base, tmp_path, request_rate=10, find_knee=True, slo="ttft=150", burstiness=50,
            requests=40, warmup=0, max_tokens=5, input_tokens=8, plot=tmp_path / "knee.png",
        )  # fmt: skip
    assert (tmp_path / "knee.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    knee = result["knee"]
    assert 16 <= knee["request_rate"] <= 27, knee
    assert knee["first_failing_rate"] > knee["request_rate"]
    # Doubling from 10/s until a rate fails, then three bisections between the last that held
    # and the first that failed. Where the doubling stops depends on this machine's load (20/s
    # is within 10% of the capacity); the search itself is tested exactly below.
    rates = [r["request_rate"] for r in result["levels"]]
    k = next((i for i, rate in enumerate(rates) if rate != 10 * 2**i), len(rates))
    doubling, bisections = rates[:k], rates[k:]
    assert len(doubling) >= 2 and len(bisections) == 3, rates
    held, first_failing = doubling[-2], doubling[-1]
    assert all(held < r < first_failing for r in bisections), rates


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


def test_bench_writes_vllm_bench_serve_field_names(tmp_path: Path) -> None:
    out = tmp_path / "vllm.jsonl"
    with fake_server("--ttft", "0.02", "--itl", "0.002") as base:
        run_tool(
            "bench.py", "--endpoint", base, "--api-key", KEY, "--model", "nemotron",
            "--no-progress", "--request-rate", "20,inf", "--requests", "6", "--max-tokens", "4",
            "--input-tokens", "8", "--slo", "ttft=500", "--format", "vllm", "--json", str(out),
        )  # fmt: skip
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [x["request_rate"] for x in lines] == [20.0, "inf"]
    first = lines[0]
    for key in (
        "date", "backend", "model_id", "num_prompts", "burstiness", "max_concurrency", "duration",
        "completed", "failed", "total_input_tokens", "total_output_tokens",
        "request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
        "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
        "median_itl_ms", "p99_e2el_ms",
    ):  # fmt: skip
        assert key in first, key
    assert first["completed"] == 6 and first["total_output_tokens"] == 24
    assert first["num_prompts"] == 6 and first["model_id"] == "nemotron"
    assert KEY not in out.read_text()


def test_bench_compares_earlier_runs_side_by_side(tmp_path: Path) -> None:
    runs = []
    for name, ttft in (("before", "0.08"), ("after", "0.02")):
        path = tmp_path / f"{name}.json"
        with fake_server("--ttft", ttft, "--itl", "0.002") as base:
            proc = run_tool(
                "bench.py", "--endpoint", base, "--api-key", KEY, "--model", "nemotron",
                "--no-progress", "--concurrency", "1,2", "--requests", "4", "--max-tokens", "3",
                "--input-tokens", "8", "--json", str(path),
            )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        runs.append(str(path))
    png = tmp_path / "compare.png"
    proc = run_tool("bench.py", "--compare", *runs, "--plot", str(png))
    assert proc.returncode == 0, proc.stderr
    assert "before" in proc.stdout and "after" in proc.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    broken = tmp_path / "broken.json"
    broken.write_text("[]")
    bad = run_tool("bench.py", "--compare", str(broken))
    assert bad.returncode == 2 and "not a bench.py result file" in bad.stderr


# ---- bench: workloads and run control --------------------------------------------------------


def test_synthetic_lengths_spread_over_the_range_ratio_the_same_for_the_same_seed() -> None:
    workload = bench_workload.Workload(100, 40, seed=3, range_ratio=0.5)
    samples = [workload.sample(i) for i in range(200)]
    words = [len(s.prompt.split()) for s in samples]
    outs = [s.max_tokens for s in samples]
    assert min(words) >= 50 and max(words) <= 150 and len(set(words)) > 30
    assert min(outs) >= 20 and max(outs) <= 60 and len(set(outs)) > 15
    again = bench_workload.Workload(100, 40, seed=3, range_ratio=0.5)
    assert [again.sample(i) for i in range(200)] == samples
    fixed = bench_workload.Workload(100, 40, seed=3)
    assert {len(fixed.sample(i).prompt.split()) for i in range(20)} == {100}


def test_a_shared_prefix_is_the_same_for_every_prompt_and_only_it() -> None:
    workload = bench_workload.Workload(50, 8, seed=1, shared_prefix=30)
    prompts = [workload.sample(i).prompt.split() for i in range(10)]
    assert all(p[:30] == prompts[0][:30] for p in prompts)
    assert len({p[30] for p in prompts}) == 10, "unique from the first word after the prefix"
    plain = bench_workload.Workload(50, 8, seed=1)
    assert len({plain.sample(i).prompt.split()[0] for i in range(10)}) == 10


def sharegpt(tmp_path: Path) -> Path:
    path = tmp_path / "sharegpt.json"
    path.write_text(
        json.dumps([
            {"conversations": [
                {"from": "human", "value": "tell me about the sea and the ships on it " * 2},
                {"from": "gpt", "value": "word " * 30},
            ]},
            {"conversations": [{"from": "human", "value": "too short"}, {"from": "gpt", "value": "ok"}]},
            {"conversations": [
                {"from": "system", "value": "be brief"},
                {"from": "human", "value": "list the planets of the solar system please now"},
                {"from": "gpt", "value": "word " * 60},
            ]},
            {"id": "no conversation here"},
        ])
    )  # fmt: skip
    return path


def test_a_sharegpt_dataset_gives_prompts_and_answer_lengths(tmp_path: Path) -> None:
    samples = bench_workload.load_dataset(str(sharegpt(tmp_path)))
    assert [s.max_tokens for s in samples] == [40, 80], "30 and 60 words as tokens; short skipped"
    assert samples[1].prompt.startswith("list the planets")
    jsonl = tmp_path / "openai.jsonl"
    jsonl.write_text(
        json.dumps({"messages": [
            {"role": "user", "content": "what is the capital city of france again"},
            {"role": "assistant", "content": "word " * 15},
        ]}) + "\n"
    )  # fmt: skip
    [sample] = bench_workload.load_dataset(str(jsonl))
    assert sample.max_tokens == 20


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not JSON or JSONL"),
        ("[]", "no usable conversation"),
        ('[{"a": 1}]', "ShareGPT"),
    ],
)
def test_a_dataset_that_cannot_be_used_is_refused_before_any_request(
    tmp_path: Path, content: str, message: str
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    proc = run_tool(
        "bench.py", "--endpoint", "http://127.0.0.1:9/v1", "--api-key", KEY, "--dataset", str(bad)
    )
    assert proc.returncode == 2 and message in proc.stderr


def test_bench_sends_the_datasets_prompts_and_lengths(tmp_path: Path) -> None:
    with fake_server("--ttft", "0.01", "--itl", "0.001", "--tokens", "500") as base:
        [r] = bench(base, tmp_path, concurrency=2, requests=4, warmup=0, dataset=sharegpt(tmp_path))
    assert r["errors"] == 0
    assert r["mean_output_tokens"] == 60, "40 and 80 tokens, each sent twice"


def test_bench_multi_turn_sessions_send_the_history_with_the_servers_answers(
    tmp_path: Path,
) -> None:
    saved = tmp_path / "requests.jsonl"
    with fake_server("--ttft", "0.01", "--itl", "0.001", "--tokens", "3") as base:
        [r] = bench(
            base, tmp_path, concurrency=2, requests=2, turns=3, warmup=0, max_tokens=3,
            input_tokens=6, save_requests=saved,
        )  # fmt: skip
        conversations = stats(base)["conversations"]
    assert r["requests"] == 6 and r["errors"] == 0
    assert sorted(len(c) for c in conversations) == [1, 1, 3, 3, 5, 5]
    for conversation in conversations:
        roles = [m["role"] for m in conversation]
        assert roles == ["user", "assistant"] * (len(roles) // 2) + ["user"]
        assert all(m["content"] == " tok" * 3 for m in conversation if m["role"] == "assistant")
    lines = [json.loads(line) for line in saved.read_text().splitlines()]
    assert sorted(x["turn"] for x in lines) == [0, 0, 1, 1, 2, 2]


def test_bench_runs_a_level_for_a_duration_and_leaves_out_the_windows(tmp_path: Path) -> None:
    saved = tmp_path / "requests.jsonl"
    with fake_server("--ttft", "0.02", "--itl", "0.002", "--tokens", "4") as base:
        [r] = bench(
            base, tmp_path, request_rate=40, duration=1.5, warmup=0, max_tokens=4,
            input_tokens=8, warmup_seconds=0.5, cooldown_seconds=0.25, save_requests=saved,
        )  # fmt: skip
    lines = [json.loads(line) for line in saved.read_text().splitlines()]
    assert 30 <= len(lines) <= 90, "about 40/s for 1.5 s"
    assert max(x["start_s"] for x in lines) < 1.5, "no request starts after the duration"
    kept = [x for x in lines if 0.5 <= x["start_s"] <= r["duration_s"] + 0.5]
    assert r["excluded_requests"] == len(lines) - r["requests"] > 0
    assert r["requests"] <= len(kept)


def test_bench_stops_when_the_error_rate_passes_its_bound(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    with fake_server("--fail-every", "2", "--ttft", "0.01", "--itl", "0.001") as base:
        proc = run_tool(
            "bench.py", "--endpoint", base, "--api-key", KEY, "--model", "nemotron",
            "--no-progress", "--concurrency", "1,4", "--requests", "200", "--warmup", "0",
            "--max-tokens", "2", "--input-tokens", "4", "--max-error-rate", "0.2",
            "--json", str(out),
        )  # fmt: skip
    assert proc.returncode == 3
    assert "past --max-error-rate 0.2" in proc.stderr
    [r] = json.loads(out.read_text())["levels"]
    assert r["aborted"] and r["requests"] < 200, "stopped early; the next level never ran"


def test_bench_plots_an_open_loop_with_goodput(tmp_path: Path) -> None:
    png = tmp_path / "open.png"
    with fake_server("--ttft", "0.01", "--itl", "0.001") as base:
        bench(
            base, tmp_path, request_rate="20,40", requests=6, max_tokens=4, input_tokens=8,
            slo="ttft=100", plot=str(png),
        )  # fmt: skip
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_plots_throughput_and_ttft(tmp_path: Path) -> None:
    png = tmp_path / "bench.png"
    with fake_server("--ttft", "0.01", "--itl", "0.001") as base:
        bench(
            base,
            tmp_path,
            concurrency="1,2",
            requests=2,
            max_tokens=4,
            input_tokens=8,
            plot=str(png),
        )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_rejects_bad_levels() -> None:
    proc = run_tool(
        "bench.py", "--endpoint", "http://127.0.0.1:9/v1", "--api-key", KEY, "--concurrency", "1,x"
    )
    assert proc.returncode == 2
    assert "accepted: a list like 1,8,32" in proc.stderr


# ---- smoke -----------------------------------------------------------------------------------


def smoke(
    base: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return run_tool("smoke.py", "--endpoint", base, *args, env=env)


def test_smoke_passes_against_a_healthy_endpoint_reading_the_key_from_env() -> None:
    with fake_server("--ttft", "0.01", "--itl", "0.001") as base:
        proc = smoke(base, env={"OPENAI_API_KEY": KEY})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split()[:2] for line in lines[:4]] == [
        ["PASS", "models"],
        ["PASS", "chat"],
        ["PASS", "stream"],
        ["PASS", "auth"],
    ]
    assert all(" ms " in line for line in lines[:4])
    assert KEY not in proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("server_args", "smoke_args", "failed", "reason"),
    [
        (["--mode", "empty-deltas"], [], "stream", "the stream carried 0 non-empty delta(s)"),
        ([], ["--model", "not-served"], "models", "not the served model 'not-served'"),
        (["--mode", "no-auth"], [], "auth", "a wrong key got HTTP 200"),
    ],
)
def test_smoke_fails_naming_the_check(
    server_args: list[str], smoke_args: list[str], failed: str, reason: str
) -> None:
    with fake_server("--ttft", "0.01", "--itl", "0.001", *server_args) as base:
        proc = smoke(base, "--api-key", KEY, *smoke_args)
    assert proc.returncode == 1
    fails = [line for line in proc.stdout.splitlines() if line.startswith("FAIL")]
    assert fails and fails[0].split()[1] == failed, proc.stdout
    assert reason in fails[0]


def smoke_lines(proc: subprocess.CompletedProcess[str]) -> dict[str, tuple[str, str]]:
    """check name -> (status, the line)."""
    out = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) > 2 and parts[0] in ("PASS", "FAIL", "OFF"):
            out[parts[1]] = (parts[0], line)
    return out


def test_smoke_checks_reasoning_and_tool_calls_the_way_vllm_returns_them() -> None:
    """A Nemotron 3 server with its parsers: reasoning in `reasoning` when on, none when off;
    a tool call parsed into tool_calls, whole and streamed."""
    with fake_server(
        "--ttft", "0.01", "--itl", "0.001", "--thinking", "parsed", "--tools", "parsed"
    ) as base:
        proc = smoke(base, "--api-key", KEY, "--strict")
        asked = stats(base)["conversations"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = smoke_lines(proc)
    assert {name: status for name, (status, _) in lines.items()} == dict.fromkeys(
        ["models", "chat", "stream", "auth", "think-on", "think-off", "tools", "tools-stream"],
        "PASS",
    )
    assert "characters of reasoning, none in content" in lines["think-on"][1]
    assert 'get_weather({"city": "Paris"})' in lines["tools"][1]
    assert 'get_weather({"city": "Paris"}) in' in lines["tools-stream"][1]
    assert all(" ms " in line for _, line in lines.values())
    assert any("get_weather" in str(c) for c in asked)


@pytest.mark.parametrize(
    ("server_args", "check", "reason"),
    [
        (
            ["--thinking", "raw"],
            "think-on",
            "the reasoning came back inside content, between think tags",
        ),
        (["--tools", "raw"], "tools", "the tool call came back as text in content"),
        (["--tools", "raw"], "tools-stream", "the tool call came back as text in content"),
    ],
)
def test_smoke_fails_a_server_whose_parsers_do_not_match(
    server_args: list[str], check: str, reason: str
) -> None:
    with fake_server("--ttft", "0.01", "--itl", "0.001", *server_args) as base:
        proc = smoke(base, "--api-key", KEY)
    assert proc.returncode == 1
    status, line = smoke_lines(proc)[check]
    assert status == "FAIL" and reason in line, proc.stdout


def test_smoke_says_off_for_features_the_server_does_not_offer_and_strict_fails_them() -> None:
    with fake_server("--ttft", "0.01", "--itl", "0.001") as base:
        lenient = smoke(base, "--api-key", KEY)
        strict = smoke(base, "--api-key", KEY, "--strict")
    assert lenient.returncode == 0, lenient.stdout + lenient.stderr
    lines = smoke_lines(lenient)
    assert lines["think-on"][0] == "OFF" and "no reasoning came back" in lines["think-on"][1]
    assert lines["think-off"][0] == "PASS"
    for check in ("tools", "tools-stream"):
        status, line = lines[check]
        assert status == "OFF" and "runs without --enable-auto-tool-choice" in line, line
    assert "Traceback" not in lenient.stdout + lenient.stderr
    assert strict.returncode == 1
    assert smoke_lines(strict)["tools"][0] == "OFF"
    # The summary names them, and why they failed.
    summary = strict.stdout.strip().splitlines()[-1]
    assert "checks failed: think-on, tools, tools-stream" in summary, summary
    assert "not offered by the server, failed by --strict: think-on, tools, tools-stream" in summary


def test_tools_explain_a_missing_endpoint() -> None:
    proc = run_tool("smoke.py", "--api-key", KEY)
    assert proc.returncode == 2
    assert "no endpoint: pass --endpoint URL, --stack NAME or set OPENAI_BASE_URL" in proc.stderr


# ---- --stack: outputs read through the Pulumi CLI (a fake here: the CLI is not installable) ---


def dev_stack(tmp_path: Path, outputs: dict[str, Any]) -> FakePulumi:
    """A fake `pulumi` (tests/support/fake_pulumi.py) with a deployed stack dev: `outputs`."""
    fake = FakePulumi(tmp_path, outputs=outputs)
    fake.add_stack("dev")
    return fake


def test_smoke_reads_endpoint_key_and_model_from_the_stack(tmp_path: Path) -> None:
    with fake_server("--ttft", "0.01", "--itl", "0.001", "--model", "nemo-x") as base:
        fake = dev_stack(tmp_path, {"endpoint": base, "apiKey": KEY, "servedModelName": "nemo-x"})
        proc = run_tool("smoke.py", "--stack", "dev", env=fake.env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "lists nemo-x" in proc.stdout
    # The key comes through --show-secrets (the fake hides it otherwise), read once.
    assert [c["argv"] for c in fake.data["calls"]] == [
        ["stack", "output", "--json", "--show-secrets", "--stack", "dev"]
    ]


def test_stack_without_an_endpoint_says_to_deploy_first(tmp_path: Path) -> None:
    proc = run_tool(
        "bench.py", "--stack", "dev", env=dev_stack(tmp_path, {"ipv4": "203.0.113.10"}).env()
    )
    assert proc.returncode == 2
    assert (
        "stack dev has no endpoint, apiKey output yet: run `pulumi up` for it first" in proc.stderr
    )


# ---- logs: a real OpenSSH server on loopback -------------------------------------------------

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """sshd on 127.0.0.1 with its own host key; every session runs the client's command through
    a recorder with a fake `journalctl` first on PATH, so nothing touches this machine's journal."""
    if not os.path.exists(SSHD):
        pytest.skip("openssh-server is not installed (./check installs it)")
    d = tmp_path / "sshd"
    (d / "bin").mkdir(parents=True)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "host")], check=True
    )
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "client")], check=True
    )
    (d / "authorized_keys").write_text((d / "client.pub").read_text())
    (d / "bin" / "journalctl").write_text(
        '#!/bin/sh\necho "2026-12-02T10:00:00+0000 droplet vllm[42]: INFO Started server process"\n'
        'echo "2026-12-02T10:00:01+0000 droplet vllm[42]: INFO Application startup complete."\n'
    )
    (d / "bin" / "journalctl").chmod(0o755)
    recorder = d / "session.sh"
    recorder.write_text(
        f'#!/bin/sh\nprintf "%s\\n" "$SSH_ORIGINAL_COMMAND" > {d}/command\n'
        f'PATH={d}/bin:/usr/bin:/bin exec /bin/sh -c "$SSH_ORIGINAL_COMMAND"\n'
    )
    recorder.chmod(0o755)
    port = _free_port()
    (d / "sshd_config").write_text(
        textwrap.dedent(f"""\
        ListenAddress 127.0.0.1
        Port {port}
        HostKey {d}/host
        AuthorizedKeysFile {d}/authorized_keys
        PasswordAuthentication no
        KbdInteractiveAuthentication no
        PermitRootLogin prohibit-password
        StrictModes no
        UsePAM no
        PidFile none
        ForceCommand {recorder}
    """)
    )
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    proc = subprocess.Popen(
        [SSHD, "-D", "-e", "-f", str(d / "sshd_config")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            time.sleep(0.05)
    try:
        yield {
            "port": port,
            "dir": d,
            "client_key": (d / "client").read_text(),
            "host_pub": " ".join((d / "host.pub").read_text().split()[:2]),
        }
    finally:
        proc.kill()
        proc.wait()


def run_logs(
    tmp_path: Path, sshd: dict[str, Any], outputs: dict[str, Any], *args: str
) -> subprocess.CompletedProcess[str]:
    env = dev_stack(tmp_path, outputs).env()
    env["HOME"] = str(tmp_path / "home")
    # Its own temporary folder: what it leaves there is this run's alone (tests run side by
    # side, and another's logs.py may be running).
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env["TMPDIR"] = str(tmp_path / "tmp")
    return run_tool(
        "logs.py", "--stack", "dev", "--port", str(sshd["port"]), *args, env=env, timeout=60
    )


def test_logs_reads_the_journal_over_ssh_with_the_stack_key_and_pinned_host_key(
    tmp_path: Path, sshd: dict[str, Any]
) -> None:
    outputs = {
        "ipv4": "127.0.0.1",
        "sshPrivateKey": sshd["client_key"],
        "sshHostPublicKey": sshd["host_pub"],
    }
    proc = run_logs(tmp_path, sshd, outputs, "-n", "50")
    assert proc.returncode == 0, proc.stderr
    assert "Application startup complete." in proc.stdout
    command = (sshd["dir"] / "command").read_text().strip()
    assert (
        command
        == "journalctl --unit vllm.service --lines 50 --no-pager --output short-iso --follow"
    )
    leftovers = list((tmp_path / "tmp").glob("nemotron-logs-*"))
    assert not [p for p in leftovers if (p / "id").exists()], "the key file is removed on exit"


def test_logs_refuses_a_host_whose_key_is_not_the_pinned_one(
    tmp_path: Path, sshd: dict[str, Any]
) -> None:
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    outputs = {
        "ipv4": "127.0.0.1",
        "sshPrivateKey": sshd["client_key"],
        "sshHostPublicKey": " ".join(other.with_suffix(".pub").read_text().split()[:2]),
    }
    proc = run_logs(tmp_path, sshd, outputs, "--no-follow")
    assert proc.returncode == 255
    assert "Host key verification failed" in proc.stderr
    assert not (sshd["dir"] / "command").exists(), "no command ran on an unverified host"


def test_logs_remembers_the_first_host_key_when_the_stack_exports_none(
    tmp_path: Path, sshd: dict[str, Any]
) -> None:
    outputs = {"ipv4": "127.0.0.1", "sshPrivateKey": sshd["client_key"]}
    proc = run_logs(tmp_path, sshd, outputs, "--no-follow")
    assert proc.returncode == 0, proc.stderr
    known = (tmp_path / "home" / ".ssh" / "nemotron-droplet-dev.known_hosts").read_text()
    assert sshd["host_pub"].split()[1] in known
    assert "--follow" not in (sshd["dir"] / "command").read_text()


def test_logs_follows_one_replica_of_a_set_or_the_balancer_each_with_its_own_host_key(
    tmp_path: Path, sshd: dict[str, Any]
) -> None:
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    stranger = " ".join(other.with_suffix(".pub").read_text().split()[:2])
    outputs = {
        # Replica 0 is elsewhere (a documentation address): only the chosen one is dialled.
        "ipv4": "192.0.2.1",
        "sshPrivateKey": sshd["client_key"],
        "sshHostPublicKey": stranger,
        "replicas": [
            {"ipv4": "192.0.2.1", "sshHostPublicKey": stranger},
            {"ipv4": "127.0.0.1", "sshHostPublicKey": sshd["host_pub"]},
            {"ipv4": "127.0.0.1", "sshHostPublicKey": stranger},
        ],
        "balancer": {"dropletIpv4": "127.0.0.1", "sshHostPublicKey": sshd["host_pub"]},
    }
    proc = run_logs(tmp_path, sshd, outputs, "--replica", "1", "--no-follow")
    assert proc.returncode == 0, proc.stderr
    assert "--unit vllm.service" in (sshd["dir"] / "command").read_text()
    (sshd["dir"] / "command").unlink()
    # Replica 2's host key is not the one at that address: refused, nothing runs.
    refused = run_logs(tmp_path, sshd, outputs, "--replica", "2", "--no-follow")
    assert refused.returncode == 255 and "Host key verification failed" in refused.stderr
    assert not (sshd["dir"] / "command").exists()
    balancer = run_logs(tmp_path, sshd, outputs, "--balancer", "--no-follow")
    assert balancer.returncode == 0, balancer.stderr
    assert "--unit caddy.service" in (sshd["dir"] / "command").read_text()
    missing = run_logs(tmp_path, sshd, outputs, "--replica", "3")
    assert missing.returncode == 2
    assert "has replicas 0 to 2; --replica 3 is not one of them" in missing.stderr
    lone = {k: v for k, v in outputs.items() if k not in ("replicas", "balancer")}
    alone = run_logs(tmp_path, sshd, lone, "--replica", "1")
    assert alone.returncode == 2 and "has one Droplet (replicas: 1)" in alone.stderr
    assert "has no balancer Droplet" in run_logs(tmp_path, sshd, lone, "--balancer").stderr


# ---- timeline --------------------------------------------------------------------------------

# A bootstrap whose downloads ran beside the driver (seconds from 1e9): the critical path runs
# through conda and vllm, not the driver; the gateway is off it.
TIMELINE = {
    name: {"start": 1e9 + start, "end": 1e9 + end, "seconds": end - start, "after": after}
    for name, start, end, after in (
        ("preflight", 0, 10, []),
        ("driver", 10, 110, ["preflight"]),
        ("cgroup", 110, 115, ["driver"]),
        ("conda", 10, 70, ["preflight"]),
        ("vllm", 70, 200, ["conda"]),
        ("model", 70, 160, ["conda"]),
        ("gateway", 10, 40, ["preflight"]),
        ("reboot", 200, 205, ["cgroup", "vllm", "model"]),
        ("reboot-wait", 205, 260, ["reboot"]),
        ("service", 260, 270, ["reboot-wait"]),
        ("autodown", 270, 275, ["service"]),
        ("ready", 270, 400, ["service", "gateway"]),
    )
}


def test_timeline_finds_the_critical_path_and_draws_it(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs.json"
    timeline = {**TIMELINE, "old": {"start": None, "end": None, "seconds": 3.0, "after": []}}
    outputs.write_text(json.dumps({"endpoint": "https://x/v1", "bootstrapTimeline": timeline}))
    png = tmp_path / "timeline.png"
    proc = run_tool("timeline.py", "--outputs", str(outputs), "--png", str(png))
    assert proc.returncode == 0, proc.stderr
    assert "bootstrap: 400 s from the first phase's start" in proc.stdout
    path_lines = proc.stdout.split("critical path (share of the wall time):\n")[1].splitlines()
    path = [line.split()[0] for line in path_lines if line.startswith("  ")]
    assert path == ["preflight", "conda", "vllm", "reboot", "reboot-wait", "service", "ready"]
    assert "  vllm             130.0 s   32.5%" in proc.stdout
    assert "no times recorded for: old" in proc.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_timeline_puts_a_download_next_to_its_floor(tmp_path: Path) -> None:
    """8 GB in 90 s is 89 MB/s; at 10 Gbit/s the same bytes take 6.4 s: 14x, marked. A cached
    run (nothing fetched) is not compared with anything."""
    outputs = tmp_path / "outputs.json"
    timeline = {**TIMELINE}
    timeline["model"] = {**TIMELINE["model"], "download_bytes": 8_000_000_000,
                         "download_seconds": 90.0}  # fmt: skip
    timeline["conda"] = {**TIMELINE["conda"], "download_bytes": 0, "download_seconds": 0.0}
    outputs.write_text(json.dumps({"bootstrapTimeline": timeline}))
    proc = run_tool("timeline.py", "--outputs", str(outputs))
    assert proc.returncode == 0, proc.stderr
    assert ("  model        fetched 8.00 GB in 90.0 s (89 MB/s); at 10 Gbit/s: 6.4 s  <- 14x its "
            "floor") in proc.stdout  # fmt: skip
    assert "conda        fetched" not in proc.stdout
    slower = run_tool("timeline.py", "--outputs", str(outputs), "--link-gbps", "2")
    assert "at 2 Gbit/s: 32.0 s" in slower.stdout and "its floor" not in slower.stdout
    outputs.write_text(json.dumps({"bootstrapTimeline": TIMELINE}))
    cached = run_tool("timeline.py", "--outputs", str(outputs))
    assert "downloads: nothing fetched on the runs recorded" in cached.stdout


def test_timeline_lists_the_disks_preflight_saw(tmp_path: Path) -> None:
    """Where a GPU size's scratch disk appears is not documented: preflight's list says it."""
    outputs = tmp_path / "outputs.json"
    timeline = {**TIMELINE}
    timeline["preflight"] = {**TIMELINE["preflight"], "disks": [
        {"name": "vda", "gib": 720, "mounts": "/,/boot/efi", "volume": False},
        {"name": "vdb", "gib": 5120, "mounts": "", "volume": False},
        {"name": "sda", "gib": 60, "mounts": "/mnt/nemotron-cache", "volume": True},
    ]}  # fmt: skip
    outputs.write_text(json.dumps({"bootstrapTimeline": timeline}))
    proc = run_tool("timeline.py", "--outputs", str(outputs))
    assert proc.returncode == 0, proc.stderr
    assert "disks the Droplet saw:" in proc.stdout
    assert "  preflight    vda            720 GiB  mounted at /,/boot/efi\n" in proc.stdout
    assert "  preflight    vdb          5,120 GiB  not mounted\n" in proc.stdout
    assert "  preflight    sda             60 GiB  mounted at /mnt/nemotron-cache, a Volume" in (
        proc.stdout
    )
    outputs.write_text(json.dumps({"bootstrapTimeline": TIMELINE}))
    assert "disks the Droplet saw" not in run_tool("timeline.py", "--outputs", str(outputs)).stdout


def test_timeline_without_the_output_says_what_to_do(tmp_path: Path) -> None:
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps({"endpoint": "https://x/v1"}))
    proc = run_tool("timeline.py", "--outputs", str(outputs))
    assert proc.returncode == 2
    assert "no bootstrapTimeline output: pulumi up with this version first" in proc.stderr


WRONG_KEY = "sk-not-this-servers-key-7f3a9c"


def test_bench_with_a_wrong_key_says_so_and_where_the_key_comes_from(tmp_path: Path) -> None:
    with fake_server("--ttft", "0.01", "--itl", "0.001") as base:
        found = run_tool("bench.py", "--endpoint", base, "--api-key", WRONG_KEY, "--no-progress",
                         "--concurrency", "2", "--requests", "4", "--max-tokens", "4")  # fmt: skip
        given = run_tool("bench.py", "--endpoint", base, "--api-key", WRONG_KEY, "--model",
                         "nemotron", "--no-progress", "--concurrency", "2", "--requests", "40",
                         "--max-tokens", "4", "--json", str(tmp_path / "r.json"))  # fmt: skip
        sent = stats(base)["chat_requests"]
    for proc in (found, given):
        assert proc.returncode == 1, proc.stderr
        assert "the endpoint refused the API key (HTTP 401" in proc.stderr, proc.stderr
        assert "--stack NAME" in proc.stderr
        assert WRONG_KEY not in proc.stdout + proc.stderr
    # With --model too, the key is tried once before any level: no load sent, no result file.
    assert sent == 0 and not (tmp_path / "r.json").exists()


def test_the_fakes_prefix_cache_reuses_leading_blocks_only_and_forgets_the_oldest() -> None:
    """fake_openai.PrefixCache, the model bench's cache-aware measurements run against: full
    blocks of 4 tokens, a chain (a block counts only behind the same blocks), least recently
    used out."""
    cache = fake_openai.PrefixCache(blocks=4, block_tokens=4)
    system = ["you", "are", "a", "careful", "assistant", "who", "answers"]  # one full block
    assert cache.serve([*system, "hi", "there"]) == 0, "a cold cache holds nothing"
    assert cache.serve([*system, "hi", "there"]) == 8, "both full blocks, not the last word"
    assert cache.serve([*system, "bye"]) == 4, "the shared block, not what follows"
    assert cache.serve(["oh", *system]) == 0, "the same words behind another first block"
    for i in range(4):  # four new blocks push the oldest out
        cache.serve([f"w{i}"] * 4)
    assert cache.serve([*system, "hi", "there"]) == 0, "forgotten: least recently used"


def test_bench_reads_the_prefix_cache_share_and_the_prefill_it_saves(tmp_path: Path) -> None:
    """With a shared system prompt of 64 words and 2 ms per uncached token, every request after
    the first finds the prefix in the fake's cache (usage.prompt_tokens_details.cached_tokens):
    bench's `cached %` is that share, each saved line says its cached tokens, and the first
    request's TTFT carries the injected prefill of its whole prompt."""
    saved = tmp_path / "requests.jsonl"
    fake = ("--ttft", "0.01", "--itl", "0.002", "--prefix-cache-blocks", "1000",
            "--block-tokens", "16", "--prefill-per-token", "0.002")  # fmt: skip
    with fake_server(*fake) as base:
        result = bench_result(
            base, tmp_path, concurrency=1, requests=6, max_tokens=2, input_tokens=16,
            shared_prefix=64, seed=3, save_requests=str(saved),
        )  # fmt: skip
        served = stats(base)
    lines = [json.loads(line) for line in saved.read_text().splitlines()]
    assert lines[0]["cached_tokens"] == 0 and all(x["cached_tokens"] >= 64 for x in lines[1:])
    share = 100 * sum(x["cached_tokens"] for x in lines) / sum(x["prompt_tokens"] for x in lines)
    assert result["levels"][0]["prefix_cached_pct"] == pytest.approx(share)
    assert served["cached_tokens"] == sum(x["cached_tokens"] for x in lines)
    cold = 0.01 + lines[0]["prompt_tokens"] * 0.002
    assert cold <= lines[0]["ttft_s"] < cold + 0.1, "the injected prefill, read as TTFT"
    assert max(x["ttft_s"] for x in lines[1:]) < lines[0]["ttft_s"], "a cached prefix is faster"


def test_bench_shows_a_cached_column_only_when_the_server_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(SCRIPTS))  # bench_report imports its siblings by name
    report = importlib.import_module("bench_report")
    with fake_server("--ttft", "0.01", "--itl", "0.002") as base:
        plain = bench(base, tmp_path, concurrency=1, requests=2, max_tokens=2)
    with fake_server("--prefix-cache-blocks", "100") as base:
        cached = bench(base, tmp_path, concurrency=1, requests=2, max_tokens=2, shared_prefix=32)
    assert plain[0]["prefix_cached_pct"] is None
    assert "cached %" not in report.rows(plain, ["p50"])[0]
    columns, cells = report.rows(cached, ["p50"])
    assert columns[-1] == "cached %" and float(cells[0][-1]) > 0


def sized_bench(base: str, tmp_path: Path, *flags: str) -> tuple[dict[str, Any], str]:
    """bench.py with 300-token prompts at concurrency 2: its one level and its stdout."""
    out = tmp_path / "sized.json"
    proc = run_tool(
        "bench.py", "--endpoint", base, "--api-key", KEY, "--model", "nemotron", "--no-progress",
        "--concurrency", "2", "--requests", "4", "--max-tokens", "4", "--input-tokens", "300",
        "--json", str(out), *flags,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    [level] = json.loads(out.read_text())["levels"]
    return level, proc.stdout


# A tokenizer unlike bench's one-token-a-word (two characters a token: "the" is 2), and a chat
# template of 5 tokens, as the GPU kit's byte-level tokenizer made 1024 words about 2,820 tokens.
UNLIKE_WORDS = ("--chars-per-token", "2", "--template-tokens", "5", "--ttft", "0.01")


def test_bench_sizes_prompts_in_the_servers_tokens_by_its_tokenize(tmp_path: Path) -> None:
    with fake_server(*UNLIKE_WORDS, "--tokenize") as base:
        level, stdout = sized_bench(base, tmp_path)
        asked = stats(base)["tokenize_requests"]
    sizing = level["prompt_sizing"]
    assert sizing["method"] == "tokenize" and asked >= 3
    assert 0.4 < sizing["words_per_token"] < 0.8, sizing
    # The server counted 300 tokens of content and its template's 5: within 3%, as each prompt
    # is its own random words at the words a token of the samples (their mean ratio).
    assert level["mean_prompt_tokens"] == pytest.approx(305, rel=0.03), level["mean_prompt_tokens"]
    assert all(abs(c["tokens"] - 300) <= 3 for c in sizing["checked"]), sizing
    assert "prompts: 300 tokens each by the server's /tokenize" in stdout, stdout


def test_bench_without_a_tokenize_says_its_prompts_are_words(tmp_path: Path) -> None:
    """Behind the gateway (only /v1/* passes) there is no /tokenize: the prompts stay words
    and the report says so, beside the server's own count of what was sent."""
    with fake_server(*UNLIKE_WORDS) as base:
        level, stdout = sized_bench(base, tmp_path)
    assert level["prompt_sizing"]["method"] == "words"
    assert level["mean_prompt_tokens"] > 400, "300 words of this tokenizer are more tokens"
    assert "prompts: 300 words each, not measured in tokens (no /tokenize here" in stdout, stdout


def test_bench_sizes_prompts_by_the_usage_when_asked(tmp_path: Path) -> None:
    with fake_server(*UNLIKE_WORDS) as base:
        level, stdout = sized_bench(base, tmp_path, "--prompt-sizing", "usage")
    assert level["prompt_sizing"]["method"] == "usage"
    assert level["mean_prompt_tokens"] == pytest.approx(305, rel=0.03), level["mean_prompt_tokens"]
    assert "prompts: 300 tokens each by the server's usage" in stdout, stdout


def test_bench_asked_to_tokenize_where_it_cannot_stops_and_says_so(tmp_path: Path) -> None:
    with fake_server(*UNLIKE_WORDS) as base:
        proc = run_tool(
            "bench.py", "--endpoint", base, "--api-key", KEY, "--model", "nemotron",
            "--no-progress", "--requests", "2", "--prompt-sizing", "tokenize",
        )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "--prompt-sizing tokenize: the server gave no token count" in proc.stderr


# ---- a Python without the tools' requirements --------------------------------------------------


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A fresh virtualenv with nothing installed: what `python3` is on a user's machine."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    return str(venv / "bin" / "python")


@pytest.mark.parametrize(
    ("tool", "args", "package"),
    [
        ("smoke.py", ("--endpoint", "http://127.0.0.1:9/v1"), "requests"),
        ("bench.py", ("--endpoint", "http://127.0.0.1:9/v1"), "aiohttp"),
        ("wake.py", ("--stack", "dev"), "requests"),
        ("timeline.py", ("--outputs", "{outputs}", "--png", "{png}"), "matplotlib"),
    ],
)
def test_a_tool_run_without_its_packages_names_the_one_missing_and_the_install_command(
    tmp_path: Path, bare_python: str, tool: str, args: tuple[str, ...], package: str
) -> None:
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps({"bootstrapTimeline": TIMELINE}))
    argv = [a.format(outputs=outputs, png=tmp_path / "t.png") for a in args]
    proc = subprocess.run(
        [bare_python, str(SCRIPTS / tool), *argv],
        capture_output=True, text=True, timeout=60, check=False, env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    [line] = proc.stderr.splitlines()
    assert f"error: {tool} needs the Python package {package!r}" in line, line
    assert (
        f"(cd {ROOT} && python3 -m venv .venv && .venv/bin/pip install -r requirements.txt "
        f"-r requirements-tools.txt), then .venv/bin/python scripts/{tool} ..."
    ) in line, line


def test_logs_and_timeline_need_no_package_for_their_text(tmp_path: Path, bare_python: str) -> None:
    """The journal and the timeline as text run on any Python 3.11: only --png needs one."""
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps({"bootstrapTimeline": TIMELINE}))
    for argv in (["timeline.py", "--outputs", str(outputs)], ["logs.py", "--help"]):
        proc = subprocess.run([bare_python, str(SCRIPTS / argv[0]), *argv[1:]],
                              capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
        assert proc.returncode == 0, proc.stderr


# ---- an endpoint that cannot be used yet: one line, the cause and what to do -------------------


@contextmanager
def answering(status: int, body: str, cert: tuple[Path, Path] | None = None) -> Iterator[str]:
    """A server on loopback that answers every request `status` with `body` (a gateway before
    vLLM, a front that waits, a refused key), over TLS with `cert` (certificate, key) when
    given; yield its /v1 base URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        do_POST = do_GET  # noqa: N815 (http.server calls do_<METHOD>)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if cert is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*cert)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"{'https' if cert else 'http'}://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key."""
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


@contextmanager
def closed_port() -> Iterator[str]:
    """A loopback port nothing listens on: connection refused (the Droplet still starting)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    yield f"http://127.0.0.1:{port}/v1"


@contextmanager
def dropping_port() -> Iterator[str]:
    """A port whose SYNs go unanswered, as a firewall that drops: a listener with a backlog of
    0 that never accepts, its one queue slot taken, drops every further SYN (Linux
    tcp_conn_request: a full accept queue drops)."""
    with socket.socket() as listener, socket.socket() as filler:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        filler.connect(listener.getsockname())
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"


@contextmanager
def sending(pause: float, chunk: bytes, count: int = 0) -> Iterator[str]:
    """A server on loopback that answers 200 and then sends `chunk` every `pause` seconds
    without end (a trickling proxy, or a body that never ends: requests bounds each read, so
    only a deadline on the whole answer stops it), or `count` times and then closes the
    connection short of its Content-Length (a connection cut mid-body)."""
    stop = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn, contextlib.suppress(OSError):
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: 1000000000\r\n\r\n")  # fmt: skip
                sent = 0
                while not stop.is_set() and (count == 0 or sent < count):
                    conn.sendall(chunk)
                    sent += 1
                    time.sleep(pause)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    finally:
        stop.set()
        thread.join()
        listener.close()


UNUSABLE = {
    "refused": (
        closed_port,
        "refused the connection: nothing listens there yet; the Droplet may still be starting",
    ),
    "dropped": (
        dropping_port,
        "no connection to 127.0.0.1:{port} within 2 s: your address may be "
        "outside the stack's access.apiCidrs",
    ),
    "401": (
        lambda: answering(401, "unauthorized: send one Authorization: Bearer <apiKey> header"),
        "the endpoint refused the API key (HTTP 401: unauthorized",
    ),
    "403": (
        lambda: answering(403, "forbidden"),
        "the endpoint refused the API key (HTTP 403: forbidden): pass the stack's own",
    ),
    "502": (
        lambda: answering(502, ""),
        "the gateway answers but vLLM behind it does not (HTTP 502): the model may still be "
        "loading; `python scripts/logs.py --stack NAME`",
    ),
    "trickle": (
        lambda: sending(0.2, b" "),
        "answered HTTP 200 but its body did not end within 2 s (--timeout)",
    ),
    "cut": (
        lambda: sending(0.0, b"[", count=1),
        "127.0.0.1:{port} closed the connection before its answer ended",
    ),
    "endless": (
        lambda: sending(0.0, b" " * 65536),
        "sent over 4 MiB for a model list (HTTP 200): that is no vLLM",
    ),
    "503": (
        lambda: answering(503, "waking the GPU set: retry in 60 s"),
        "the endpoint is not ready (HTTP 503: waking the GPU set: retry in 60 s): it is "
        "starting, waking or being updated",
    ),
}


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The run failed with exactly one line on stderr, nothing on stdout, no traceback."""
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout == "", proc.stdout
    [line] = proc.stderr.splitlines()
    assert line.startswith("error: ") and KEY not in line, line
    return line


@pytest.mark.parametrize("case", UNUSABLE)
@pytest.mark.parametrize("tool", ["smoke.py", "bench.py"])
def test_an_endpoint_that_cannot_serve_is_one_line_naming_the_cause(tool: str, case: str) -> None:
    server, expected = UNUSABLE[case]
    with server() as base:
        port = base.rsplit(":", 1)[1].split("/")[0]
        started = time.monotonic()
        proc = run_tool(tool, "--endpoint", base, "--model", "nemotron", "--timeout", "2",
                        *(["--no-progress"] if tool == "bench.py" else []),
                        env={"OPENAI_API_KEY": KEY}, timeout=60)  # fmt: skip
    assert expected.format(port=port) in one_error_line(proc)
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("tool", ["smoke.py", "bench.py"])
def test_an_untrusted_certificate_is_one_line_and_cacert_trusts_it(
    tool: str, self_signed: tuple[Path, Path]
) -> None:
    extra = ["--no-progress"] if tool == "bench.py" else []
    with answering(401, "unauthorized", cert=self_signed) as base:
        port = base.rsplit(":", 1)[1].split("/")[0]
        untrusted = run_tool(tool, "--endpoint", base, *extra, env={"OPENAI_API_KEY": KEY})
        trusted = run_tool(tool, "--endpoint", base, "--cacert", str(self_signed[0]), *extra,
                           env={"OPENAI_API_KEY": KEY})  # fmt: skip
    line = one_error_line(untrusted)
    assert f"TLS with 127.0.0.1:{port} failed (self-signed certificate)" in line, line
    assert "one of your own CA needs --cacert FILE" in line
    # Trusted, the TLS holds and the next cause shows: the key.
    assert "the endpoint refused the API key (HTTP 401" in one_error_line(trusted)


def test_bench_where_every_request_failed_exits_non_zero(tmp_path: Path) -> None:
    with fake_server("--fail-every", "1", "--ttft", "0.01", "--itl", "0.001") as base:
        proc = run_tool("bench.py", "--endpoint", base, "--api-key", KEY, "--no-progress",
                        "--concurrency", "2", "--requests", "4", "--warmup", "0",
                        "--max-tokens", "4")  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "error: all 4 requests of concurrency 2 failed ({'http_500': 4})" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_line_names_the_stack_in_its_commands(tmp_path: Path) -> None:
    with closed_port() as base:
        fake = dev_stack(tmp_path, {"endpoint": base, "apiKey": KEY, "servedModelName": "n"})
        proc = run_tool("smoke.py", "--stack", "dev", env=fake.env())
    assert "`pulumi refresh --stack dev --yes && pulumi up --stack dev`" in one_error_line(proc)


# ---- the table at 80 columns, the plots --------------------------------------------------------


def heavy_level(level: float, mode: str = "open") -> dict[str, Any]:
    """A level report at its widest: seconds-long latencies, five percentiles, an SLO, the
    prefix cache, replicas."""
    scale = level / 10
    summary = {k: v * scale for k, v in (("mean", 1516.4), ("std", 80.0), ("min", 151.2),
               ("max", 98765.4), ("p50", 1512.3), ("p90", 12345.6), ("p95", 23456.7),
               ("p99", 54321.9), ("p99.9", 98765.4))}  # fmt: skip
    return {
        "mode": mode, "concurrency": None if mode == "open" else int(level),
        "request_rate": level if mode == "open" else None, "achieved_request_rate": level * 0.98,
        "requests": 1000, "errors": 12, "errors_by_kind": {"timeout": 12}, "excluded_requests": 0,
        "aborted": None, "duration_s": 100.0, "ttft_ms": summary,
        "itl_ms": {k: v / 100 for k, v in summary.items()},
        "tpot_ms": {k: v / 90 for k, v in summary.items()},
        "e2e_ms": {k: v * 10 for k, v in summary.items()},
        "requests_per_s": 9.87 * scale, "output_tokens_per_s": 12345.6 * scale,
        "total_tokens_per_s": 123456.7 * scale, "mean_prompt_tokens": 512.0,
        "mean_output_tokens": 128.0, "prefix_cached_pct": 87.5, "token_counts": "server",
        "slo_ms": {"ttft": 500.0, "tpot": 50.0}, "goodput_requests_per_s": 8.1 * scale,
        "slo_attainment_pct": 91.2, "replicas": 3,
        "output_tokens_per_s_per_replica": 4115.2 * scale,
    }  # fmt: skip


def render(renderables: list[Any], width: int) -> str:
    from rich.console import Console  # noqa: PLC0415

    console = Console(width=width, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    for r in renderables:
        console.print(r)
    return console.export_text()


def test_the_bench_tables_fit_80_columns_without_eliding_a_number(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(SCRIPTS))
    report = importlib.import_module("bench_report")
    levels = [heavy_level(40), {**heavy_level(40), "request_rate": "inf"}, heavy_level(10),
              heavy_level(20)]  # fmt: skip
    text = render(report.tables(levels, (50, 90, 95, 99, 99.9)), width=80)
    assert "…" not in text, text
    assert max(len(line) for line in text.splitlines()) <= 80, text
    # Every number whole: the p99.9 of E2E at 40/s, the widest cell, and the throughput.
    for number in ("3,950,616", "494", "49,382", "87.5", "91.2"):
        assert number in text, (number, text)
    # Levels in the order of the offered rate, each with its four latencies.
    rows = [
        line.split()[0]
        for line in text.splitlines()
        if line.split()[:1] in (["10"], ["20"], ["40"], ["inf"])
    ]
    assert rows == ["10", "20", "40", "inf"] * 2, text
    assert text.count("TTFT") == 4 and text.count("E2E") == 4
    # Runs compared: each level's runs together, concurrency and rate levels apart.
    closed = [heavy_level(c, mode="closed") for c in (8, 1)]
    runs = [("before", {}, closed), ("after-change", {}, [*closed, heavy_level(20)])]
    text = render(report.compare_tables(runs), width=80)
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80, text
    assert "1,086,438" in text and "24,691" in text
    levels = [
        line.split()[:2] for line in text.splitlines() if line.split()[:1] in (["conc"], ["rate"])
    ]
    assert levels == [["conc", "1"], ["conc", "8"], ["rate", "20"]] * 2, text


def lines_of(axis: Any) -> dict[str, tuple[list[float], list[float]]]:
    """label -> (x data, y data) of each line an axis holds."""
    return {
        str(line.get_label()): ([float(x) for x in line.get_xdata()],
                                [float(y) for y in line.get_ydata()])
        for line in axis.get_lines()
    }  # fmt: skip


def test_the_plot_orders_levels_by_offered_rate_and_marks_the_knee_and_the_slo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Levels as a knee search runs them (10, 20, 40, then bisecting back), one at rate inf."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path / "mpl"))
    report = importlib.import_module("bench_report")
    levels = [heavy_level(rate) for rate in (10, 20, 40, 30, 25)]
    levels.append({**heavy_level(50), "request_rate": "inf"})
    fig = report.figure(levels, {"request_rate": 25, "first_failing_rate": 30})
    panels = {axis.get_title(): axis for axis in fig.axes}
    throughput, served = panels["Throughput"], panels["Requests served, and within the SLO"]
    ttft, tpot = panels["Time to first token"], panels["Time per output token"]
    xs, _ = lines_of(throughput)["output"]
    assert xs == [10, 20, 25, 30, 40], "the offered rates, in order; inf left off the axis"
    assert lines_of(served)["within the SLO (goodput)"][0] == xs
    for axis in (throughput, served, ttft, tpot):
        assert axis.get_xlabel() == "offered request rate (requests/s)"
        assert lines_of(axis)["knee 25/s"][0] == [25, 25], "the knee: a vertical line"
    assert lines_of(ttft)["SLO 500 ms"][1] == [500, 500], "the TTFT bound: a horizontal line"
    assert lines_of(tpot)["SLO 50 ms"][1] == [50, 50]
    assert lines_of(ttft)["p99.9"][1] == sorted(lines_of(ttft)["p99.9"][1])
    png = tmp_path / "knee.png"
    fig.savefig(png, dpi=120)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_comparison_never_puts_concurrency_and_rate_on_one_axis(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(SCRIPTS))
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path / "mpl"))
    report = importlib.import_module("bench_report")
    closed = [heavy_level(c, mode="closed") for c in (8, 1, 32)]
    rated = [heavy_level(r) for r in (20, 5)]
    fig = report.compare_figure([("conc", {}, closed), ("rate", {}, rated), ("both", {}, [
        *closed, *rated])])  # fmt: skip
    by_label: dict[str, list[set[str]]] = {}
    for axis in fig.axes:
        by_label.setdefault(axis.get_xlabel(), []).append(set(lines_of(axis)))
        xs = {x for line_xs, _ in lines_of(axis).values() for x in line_xs}
        if axis.get_xlabel().startswith("concurrency"):
            assert xs == {1, 8, 32}, xs
        else:
            assert xs == {5, 20}, xs
        for x, _ in lines_of(axis).values():
            assert x == sorted(x)
    assert by_label == {
        "concurrency (streams in flight)": [{"conc", "both"}] * 2,
        "offered request rate (requests/s)": [{"rate", "both"}] * 2,
    }


def test_bench_with_warmup_0_and_a_model_sends_nothing_before_its_levels() -> None:
    """No question first (a sleeping set would wake before the measured requests): against a
    closed port the level itself fails, whole, and says so."""
    with closed_port() as base:
        proc = run_tool("bench.py", "--endpoint", base, "--api-key", KEY, "--model", "nemotron",
                        "--no-progress", "--warmup", "0", "--concurrency", "2", "--requests", "3")  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "error: all 3 requests of concurrency 2 failed ({'connection:" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="a network namespace of its own needs root and unshare",
)
@pytest.mark.parametrize("tool", ["smoke.py", "bench.py"])
def test_no_route_to_the_endpoint_is_one_line(tool: str) -> None:
    """In a network namespace of its own (only a loopback, down: no route anywhere), the
    documentation address 192.0.2.1 is unreachable; nothing leaves the namespace."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    env["OPENAI_API_KEY"] = KEY
    proc = subprocess.run(
        ["unshare", "--net", sys.executable, str(SCRIPTS / tool), "--endpoint",
         "http://192.0.2.1:8443/v1", "--model", "nemotron", "--timeout", "5",
         *(["--no-progress"] if tool == "bench.py" else [])],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip
    line = one_error_line(proc)
    assert "no route from this machine to 192.0.2.1:8443: its network cannot reach" in line


@pytest.mark.parametrize(
    "body",
    ["[]", "null", '{"data": ["nemotron"]}', '{"data": [{"id": "nemotron"}], "choices": [1]}'],
)
def test_smoke_against_a_200_of_the_wrong_shape_fails_its_checks_without_a_traceback(
    body: str,
) -> None:
    """A server that answers 200 with JSON that is not OpenAI's shape (a list, null, a model
    list of strings, a choice that is a number: a proxy's page, another API on the port):
    smoke crashed on the first `.get` (AttributeError, a traceback, the other checks never
    run). Each check fails saying what came back, and the run exits 1."""
    with answering(200, body) as base:
        proc = smoke(base, "--model", "nemotron", "--timeout", "3", env={"OPENAI_API_KEY": KEY})
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = smoke_lines(proc)
    assert len(lines) == 8, proc.stdout
    assert any("not in the OpenAI shape" in line for _, line in lines.values()), proc.stdout
