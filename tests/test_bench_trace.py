"""bench.py's trace (`--trace`, nemodrop/bench_workload.py) and the fake vLLM's queue it runs
against (fake_openai --max-num-seqs, --kv-cache-tokens: requests past max_num_seqs wait, and
vLLM's gauges say so), which the balancer and router tests load too."""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import fake_openai
import nemodrop_cli
import pytest
import requests

from nemodrop import bench_workload

KEY = "sk-bench-trace-test"
BENCH = nemodrop_cli.argv("bench")


def metrics(url: str) -> dict[str, float]:
    """vLLM's gauges and counters by name (labels dropped: one engine, one model)."""
    out = {}
    for line in requests.get(f"{url}/metrics", timeout=5).text.splitlines():
        if line.startswith("vllm:"):
            name, _, value = line.partition("{")
            out[name] = float(value.rsplit(" ", 1)[1])
    return out


def chat(url: str, words: int, max_tokens: int, stream: bool = True) -> dict[str, float]:
    """One chat: when it was sent and when its first token came (streamed) or its answer (not),
    monotonic seconds."""
    body = {"model": "nemotron", "max_tokens": max_tokens, "stream": stream,
            "messages": [{"role": "user", "content": " ".join(["w"] * words)}]}  # fmt: skip
    sent = time.monotonic()
    with requests.post(f"{url}/v1/chat/completions", json=body, stream=stream, timeout=30,
                       headers={"Authorization": f"Bearer {KEY}"}) as answer:  # fmt: skip
        answer.raise_for_status()
        first = None
        for line in answer.iter_lines():
            if first is None and b'"content": " tok"' in line:
                first = time.monotonic()
    end = time.monotonic()
    return {"sent": sent, "first": first or end, "end": end, "ttft": (first or end) - sent}


def wait_for(check: Any, seconds: float = 5) -> Any:
    end = time.monotonic() + seconds
    while not (found := check()):
        assert time.monotonic() < end, "never happened"
        time.sleep(0.02)
    return found


def test_past_max_num_seqs_requests_wait_in_order_and_their_wait_is_in_their_ttft() -> None:
    """With --max-num-seqs 2, five requests at once (streamed and not): the gauges say 2
    running and 3 waiting; each waiting one's first token comes after a running one ended, in
    arrival order; once all ended the gauges read 0, and every request counted as a success."""
    args = ("--max-num-seqs", "2", "--ttft", "0.05", "--itl", "0.05", "--tokens", "8")
    with fake_openai.running(*args, key=KEY) as fake, \
            concurrent.futures.ThreadPoolExecutor(5) as pool:  # fmt: skip
        futures = []
        for i in range(5):  # one by one, so their order of arrival is known
            futures.append(pool.submit(chat, fake.url, 4, 8, stream=i != 1))
            wait_for(lambda n=i + 1: sum(metrics(fake.url)[k] for k in (
                "vllm:num_requests_running", "vllm:num_requests_waiting")) == n)  # fmt: skip
        seen = metrics(fake.url)
        assert seen["vllm:num_requests_running"] == 2, seen
        assert seen["vllm:num_requests_waiting"] == 3, seen
        done = [f.result() for f in futures]
        end = metrics(fake.url)
    one = 0.05 + 7 * 0.05  # a request alone: its first token, then 7 more
    assert done[0]["ttft"] < 0.05 + one / 2, done
    # 2 and 3 run once 0 and 1 have ended, 4 once 2 has: each waited, and its TTFT says so.
    first_out = min(done[0]["end"], done[1]["end"])
    assert done[2]["first"] >= first_out and done[3]["first"] >= first_out, done
    assert done[4]["first"] >= done[2]["end"], done
    for d in done[2:]:
        assert d["ttft"] >= first_out - d["sent"] + 0.03, done  # its wait, then its own TTFT
    assert end["vllm:num_requests_running"] == 0 and end["vllm:num_requests_waiting"] == 0, end
    assert end["vllm:request_success_total"] == 5, end


def test_a_client_gone_while_waiting_leaves_the_queue() -> None:
    """A waiting request whose client hangs up leaves the queue; the others still run."""
    args = ("--max-num-seqs", "1", "--ttft", "0.3", "--itl", "0.01", "--tokens", "2")
    with fake_openai.running(*args, key=KEY) as fake, \
            concurrent.futures.ThreadPoolExecutor(2) as pool:  # fmt: skip
        first = pool.submit(chat, fake.url, 4, 2)
        wait_for(lambda: metrics(fake.url)["vllm:num_requests_running"] == 1)
        with pytest.raises(requests.Timeout):
            requests.post(f"{fake.url}/v1/chat/completions", timeout=0.1,
                          headers={"Authorization": f"Bearer {KEY}"},
                          json={"model": "nemotron", "messages": [{"role": "user", "content": "x"}]})  # fmt: skip
        first.result()
        wait_for(lambda: metrics(fake.url)["vllm:num_requests_waiting"] == 0)
        assert chat(fake.url, 4, 2)["ttft"] < 0.3 + 0.2
        assert metrics(fake.url)["vllm:num_requests_running"] == 0


def test_kv_cache_usage_is_the_share_of_the_budget_the_running_requests_hold() -> None:
    """--kv-cache-tokens 1000: a running request of 100 prompt words holds 100 tokens and one
    more per token generated; the gauge is their share, back to 0 once it ends. Without a
    budget the gauge reads 0.0, and without --max-num-seqs the gauges are as before (waiting
    0, running counts every request in flight)."""
    args = ("--max-num-seqs", "4", "--kv-cache-tokens", "1000", "--ttft", "0.05",
            "--itl", "0.05", "--tokens", "40")  # fmt: skip
    with fake_openai.running(*args, key=KEY) as fake, \
            concurrent.futures.ThreadPoolExecutor(1) as pool:  # fmt: skip
        done = pool.submit(chat, fake.url, 100, 40)
        early = wait_for(lambda: (m := metrics(fake.url))["vllm:kv_cache_usage_perc"] and m)
        time.sleep(0.5)
        later = metrics(fake.url)["vllm:kv_cache_usage_perc"]
        done.result()
        assert 0.1 <= early["vllm:kv_cache_usage_perc"] <= 0.11, early
        assert 0.1 + 0.005 < later <= 0.14, later
        assert metrics(fake.url)["vllm:kv_cache_usage_perc"] == 0.0
    with fake_openai.running("--ttft", "0.3", key=KEY) as fake, \
            concurrent.futures.ThreadPoolExecutor(3) as pool:  # fmt: skip
        futures = [pool.submit(chat, fake.url, 4, 2) for _ in range(3)]
        seen = wait_for(lambda: (m := metrics(fake.url))["vllm:num_requests_running"] == 3 and m)
        assert seen["vllm:num_requests_waiting"] == 0 and seen["vllm:kv_cache_usage_perc"] == 0
        for f in futures:
            f.result()


# ---- bench's trace format ----------------------------------------------------------------------


def test_a_trace_is_read_back_as_written_and_drives_bench_at_its_times(tmp_path: Path) -> None:
    """write_trace and load_trace agree; bench.py --trace starts each request at its line's
    time (open loop) with its line's lengths, one level whose rate is the trace's mean."""
    entries = [bench_workload.TraceEntry(0.0, 12, 3), bench_workload.TraceEntry(0.4, 30, 5),
               bench_workload.TraceEntry(0.4, 7, 2), bench_workload.TraceEntry(1.0, 20, 4)]  # fmt: skip
    trace = tmp_path / "trace.jsonl"
    bench_workload.write_trace(trace, entries)
    assert bench_workload.load_trace(str(trace)) == entries
    out, saved = tmp_path / "bench.json", tmp_path / "requests.jsonl"
    with fake_openai.running("--ttft", "0.01", "--itl", "0.001", "--tokens", "100",
                             key=KEY) as fake:  # fmt: skip
        proc = subprocess.run(
            [*BENCH, "--endpoint", f"{fake.url}/v1",
             "--api-key", KEY, "--model", "nemotron", "--no-progress", "--warmup", "0",
             "--trace", str(trace), "--json", str(out), "--save-requests", str(saved)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    [level] = json.loads(out.read_text())["levels"]
    assert level["mode"] == "open" and level["requests"] == 4 and level["errors"] == 0
    assert level["request_rate"] == pytest.approx(4.0)
    lines = sorted((json.loads(x) for x in saved.read_text().splitlines()),
                   key=lambda x: x["index"])  # fmt: skip
    for line, entry in zip(lines, entries, strict=True):
        assert line["start_s"] == pytest.approx(entry.at, abs=0.05), lines
        assert line["prompt_tokens"] == entry.prompt_tokens, lines
        assert line["completion_tokens"] == entry.max_tokens, lines


@pytest.mark.parametrize(
    ("lines", "said"),
    [
        (['{"at": 0, "prompt_tokens": 5, "max_tokens": 2}', "{oops"], "line 2: not JSON"),
        (['{"at": 0, "prompt_tokens": 5}'], "line 1: missing ['max_tokens']"),
        (['{"at": 0, "prompt_tokens": 5, "max_tokens": 2, "x": 1}'], "line 1: unknown ['x']"),
        (['{"at": -1, "prompt_tokens": 5, "max_tokens": 2}'], "line 1: at=-1"),
        (['{"at": 2, "prompt_tokens": 5, "max_tokens": 2}', "",
          '{"at": 1, "prompt_tokens": 5, "max_tokens": 2}'], "line 3: at=1 is before"),
        (['{"at": 0, "prompt_tokens": 0, "max_tokens": 2}'], "line 1: prompt_tokens=0"),
        (['{"at": 0, "prompt_tokens": 5, "max_tokens": 2.5}'], "line 1: max_tokens=2.5"),
        (["[1, 2]"], "line 1: not a JSON object"),
        ([""], "no request in it"),
    ],
)  # fmt: skip
def test_a_malformed_trace_is_refused_naming_its_line(
    tmp_path: Path, lines: list[str], said: str
) -> None:
    """load_trace names the file, the first bad line and what is wrong; bench.py refuses it
    (exit 2) before sending anything."""
    trace = tmp_path / "bad.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    with pytest.raises(bench_workload.WorkloadError) as refused:
        bench_workload.load_trace(str(trace))
    assert f"--trace {trace}: " in str(refused.value) and said in str(refused.value)
    assert '{"at": seconds >= 0' in str(refused.value), "says the accepted form"
    proc = subprocess.run(
        [*BENCH, "--endpoint", "http://127.0.0.1:9/v1",
         "--api-key", KEY, "--trace", str(trace)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and said in proc.stderr, proc.stderr


def test_bench_refuses_a_trace_with_what_it_replaces(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"at": 0, "prompt_tokens": 5, "max_tokens": 2}\n')
    for extra in (["--duration", "5"], ["--turns", "2"], ["--request-rate", "3"]):
        proc = subprocess.run(
            [*BENCH, "--endpoint", "http://127.0.0.1:9/v1",
             "--api-key", KEY, "--trace", str(trace), *extra],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert proc.returncode == 2 and "--trace" in proc.stderr, (extra, proc.stderr)
