"""The front's waker as the autoscaler (scripts/phases/wake.py with SCALE_MAX, issue 33): its
pure decision (decide, parse_metrics, replica_hours) on samples made here, then the real waker
on loopback against the strict fake GitHub (tests/support/stack/github_api.py, which checks the
dispatch's inputs against deploy.yml) and stub replicas whose /health and /metrics the test sets,
so each decision is deterministic. Small windows (sample 0.2 s, out 1 s, in 2 s) through the env."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import front_bench
import loopback
import pytest
import requests
import script_module
from aiohttp import ClientSession
from pulumi_harness import stack_config
from stack import github_api
from test_wake import API_KEY, CHAT, DISPATCH, KEYED, TOKEN, WAKE, FakeGitHub, in_background

from components.host import wake
from components.spec import config

ROOT = Path(__file__).resolve().parent.parent
W = script_module.load(WAKE, "wake_for_autoscale")
POLICY = W.ScalePolicy(min=1, max=3, queue_seconds=2.0, out_window=1.0, in_window=2.0,
                       in_utilization=0.5, capacity=10, cooldown_minutes=5.0,
                       daily_budget_usd=None, price_hourly=1.0, sample_seconds=0.2)  # fmt: skip


def samples(n: int, seconds: float, **gauges: Any) -> list[Any]:
    """A sample every 0.2 s for `seconds`, the pool of n replicas with these totals; `done`
    requests finish per sample on the first replica."""
    done = gauges.pop("done", 0.0)
    out = []
    for i in range(int(seconds / 0.2) + 1):
        readings = {f"r{j}": W.Reading(waiting=gauges.get("waiting", 0) / n,
                                       running=gauges.get("running", 0) / n,
                                       kv=gauges.get("kv", 0.0),
                                       finished=done * i if j == 0 else 0.0)
                    for j in range(n)}  # fmt: skip
        out.append(W.Sample.of(100.0 + i * 0.2, readings))
    return out


# ---- the decision, pure ------------------------------------------------------------------------


def test_vllms_page_is_read_summed_over_engines_the_kv_cache_its_fullest() -> None:
    page = "\n".join([
        "# HELP vllm:num_requests_waiting Number of requests waiting.",
        "# TYPE vllm:num_requests_waiting gauge",
        'vllm:num_requests_waiting{engine="0",model_name="m"} 3.0',
        'vllm:num_requests_waiting{engine="1",model_name="m"} 2.0',
        'vllm:num_requests_running{engine="0",model_name="m"} 7.0',
        'vllm:num_requests_running{engine="1",model_name="m"} 1.0',
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25',
        'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5',
        'vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 10.0',
        'vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 5.0',
        'vllm:request_success_created{engine="0",finished_reason="stop",model_name="m"} 1.7e9',
        'vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 99.0',
    ])  # fmt: skip
    assert W.parse_metrics(page) == W.Reading(waiting=5, running=8, kv=0.5, finished=15)
    assert W.parse_metrics("# nothing of vLLM's\nhttp_requests_total 3\n") is None


def test_a_value_that_is_not_a_finite_count_is_no_reading() -> None:
    """NaN, +Inf and negative values are dropped: a page with no usable queue gauge is stale,
    never an endless queue that would step out."""
    page = "\n".join(["vllm:num_requests_waiting{engine=\"0\"} +Inf",
                      "vllm:num_requests_waiting{engine=\"1\"} NaN",
                      "vllm:num_requests_running{engine=\"0\"} -3",
                      "vllm:kv_cache_usage_perc{engine=\"0\"} Inf"])  # fmt: skip
    assert W.parse_metrics(page) is None
    mixed = page + '\nvllm:num_requests_waiting{engine="2"} 4\nvllm:num_requests_running 1'
    reading = W.parse_metrics(mixed)
    assert (reading.waiting, reading.running, reading.kv) == (4.0, 1.0, 0.0)


def test_a_sustained_queue_steps_out_and_a_burst_shorter_than_the_window_buys_nothing() -> None:
    burst = samples(2, 0.6, waiting=8)
    assert W.decide(burst, POLICY).want is None, "0.6 s of queue against a 1 s window"
    sustained = samples(2, 1.2, waiting=8)
    d = W.decide(sustained, POLICY)
    assert (d.code, d.want) == ("out", 3), d
    assert d.signals["queue_wait_seconds"] is None, "nothing finished: an endless wait"
    assert "the queue decides" in d.why, "the KV cache is low: a prefill-heavy queue"
    # Finishing fast enough, the same queue is short: 8 waiting, 20/s finishing = 0.4 s.
    served = samples(2, 1.2, waiting=8, done=4)
    assert W.decide(served, POLICY).code == "steady"
    assert W.decide(samples(3, 1.2, waiting=8), POLICY).code == "at_max", "never above max"


def test_a_full_cache_with_nothing_waiting_is_no_step_and_idle_room_steps_in() -> None:
    full = W.decide(samples(2, 2.2, kv=0.97), POLICY)
    assert (full.code, full.want) == ("signals_disagree", None), full
    idle = W.decide(samples(2, 2.2, running=4, kv=0.2), POLICY)
    assert (idle.code, idle.want) == ("in", 1), idle
    busy = W.decide(samples(2, 2.2, running=6, kv=0.2), POLICY)
    assert busy.want is None, "6 running > 1 replica x 10 x 0.5"
    floor = W.decide(samples(1, 2.2), W.ScalePolicy(**{**POLICY.__dict__, "min": 0}))
    assert (floor.code, floor.want) == ("at_floor", None), "never below max(min, 1)"


def test_a_restarted_vllms_counter_counts_its_new_value_and_the_day_is_integrated() -> None:
    a = W.Sample.of(0, {"r0": W.Reading(0, 0, 0, 100), "r1": W.Reading(0, 0, 0, 7)})
    b = W.Sample.of(1, {"r0": W.Reading(0, 0, 0, 3), "r1": W.Reading(0, 0, 0, 9),
                        "r2": W.Reading(0, 0, 0, 50)})  # fmt: skip
    assert W.finished_between(a, b) == 3 + 2, "r0 restarted (3 since); r2 is new"
    day = W.DAY
    points = [(0.0, 1), (day + 3600.0, 2)]
    assert W.replica_hours(points, day + 7200.0) == pytest.approx(23 * 1 + 1 * 2), (
        "the day began at 1"
    )


# ---- the real waker on loopback ----------------------------------------------------------------


@dataclass
class Gauges:
    waiting: float = 0.0
    running: float = 0.0
    kv: float = 0.0
    finished: float = 0.0
    health: int = 200
    metrics: int = 200
    scrapes: int = 0
    late: float = 0.0  # seconds /health and /metrics take (a saturated vLLM answers late)


class Replica:
    """A replica's gateway as the waker sees it: /health, and exact GET /metrics with the key,
    two engines' worth of vLLM's series with the gauges the test sets."""

    def __init__(self) -> None:
        self.g = gauges = Gauges()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                time.sleep(gauges.late)
                with contextlib.suppress(OSError):  # the waker stopped waiting: it hung up
                    self.answer()

            def answer(self) -> None:
                if self.path == "/health":
                    loopback.reply(self, gauges.health, b"{}", "application/json")
                    return
                if self.path != "/metrics" or self.headers.get("Authorization") != \
                        f"Bearer {API_KEY}":  # fmt: skip
                    loopback.reply(self, 401, b"unauthorized")
                    return
                gauges.scrapes += 1
                g = gauges
                body = "\n".join([
                    f'vllm:num_requests_waiting{{engine="0"}} {g.waiting / 2}',
                    f'vllm:num_requests_waiting{{engine="1"}} {g.waiting / 2}',
                    f'vllm:num_requests_running{{engine="0"}} {g.running}',
                    f'vllm:kv_cache_usage_perc{{engine="0"}} {g.kv}',
                    f'vllm:kv_cache_usage_perc{{engine="1"}} {g.kv / 2}',
                    f'vllm:request_success_total{{finished_reason="stop"}} {g.finished}',
                ])  # fmt: skip
                loopback.reply(self, g.metrics, body.encode())

            def log_message(self, *_: Any) -> None:
                pass

        self.server = loopback.serve(Handler, socket.create_server(("127.0.0.1", 0)))
        self.port = self.server.server_address[1]

    def stop(self) -> None:
        loopback.stop(self.server)


SCALE = {"SCALE_MIN": "1", "SCALE_MAX": "3", "SCALE_QUEUE_SECONDS": "2",
         "SCALE_OUT_WINDOW_SECONDS": "1", "SCALE_IN_WINDOW_SECONDS": "2",
         "SCALE_IN_UTILIZATION": "0.5", "SCALE_REPLICA_CAPACITY": "10",
         "SCALE_COOLDOWN_MINUTES": "5", "SCALE_DAILY_BUDGET_USD": "",
         "SCALE_REPLICA_PRICE_HOURLY": "1.5", "SCALE_SAMPLE_SECONDS": "0.2"}  # fmt: skip
FAST = {"WAKE_HOLD_SECONDS": "30", "WAKE_EXPECTED_SECONDS": "5", "WAKE_HEALTH_SECONDS": "0.2",
        "WAKE_COMMENT_SECONDS": "0.3", "WAKE_ASLEEP_SECONDS": "0.6", "WAKE_ASLEEP_LOOKS": "2",
        "WAKE_RUN_POLL_SECONDS": "0.2"}  # fmt: skip


@dataclass
class Scaler:
    url: str
    upstreams: Path
    github: FakeGitHub
    proc: subprocess.Popen[str]
    env: dict[str, str]
    lines: list[dict[str, Any]]
    raw: list[str]
    reader: threading.Thread
    owned: list[Replica]  # every stub made, stopped at the end
    replicas: dict[str, Replica] = field(default_factory=dict)

    def add(self, name: str) -> Replica:
        """A replica in the pool (its upstream file, as the member phase writes it)."""
        replica = Replica()
        self.owned.append(replica)
        self.replicas[name] = replica
        (self.upstreams / f"{name}.caddy").write_text(f"to 127.0.0.1:{replica.port}\n")
        return replica

    def set(self, **gauges: Any) -> None:
        for replica in self.replicas.values():
            for k, v in gauges.items():
                setattr(replica.g, k, v)

    def state(self) -> dict[str, Any]:
        data: dict[str, Any] = requests.get(f"{self.url}{wake.CONTROL_PATH}", timeout=5).json()
        return data

    def scale(self) -> dict[str, Any]:
        scale: dict[str, Any] = self.state()["autoscale"]
        return scale

    def events(self, name: str) -> list[dict[str, Any]]:
        return [line for line in list(self.lines) if line["event"] == name]

    def until(self, check: Callable[[], Any], seconds: float = 15) -> Any:
        end = time.monotonic() + seconds
        while not (got := check()):
            assert time.monotonic() < end, (self.state().get("autoscale"), self.lines[-5:])
            time.sleep(0.05)
        return got


@pytest.fixture
def scaler_factory(tmp_path: Path) -> Iterator[Callable[..., Scaler]]:
    made: list[Scaler] = []
    servers: list[loopback.Server] = []
    replicas: list[Replica] = []

    def make(github: FakeGitHub | None = None, replicas_n: int = 0, like: Scaler | None = None,
             **settings: str) -> Scaler:  # fmt: skip
        github = like.github if like else github or FakeGitHub()
        server = github_api.serve(github, socket.create_server(("127.0.0.1", 0)), None)
        servers.append(server)
        upstreams = like.upstreams if like else tmp_path / f"upstreams{len(made)}"
        upstreams.mkdir(exist_ok=True)
        (tmp_path / "token").write_text(TOKEN + "\n")
        key = tmp_path / "apikey"
        key.write_text(API_KEY + "\n")
        key.chmod(0o600)
        env = like.env if like else {
            "PATH": os.environ["PATH"], "WAKE_LISTEN": "127.0.0.1:0",
            "WAKE_UPSTREAMS_DIR": str(upstreams), "WAKE_HOLD_FILE": str(tmp_path / "run" / "hold"),
            "WAKE_TRIGGER": "github", "WAKE_STACK": "dev", "WAKE_TOKEN_FILE": str(tmp_path / "token"),
            "WAKE_API_KEY_FILE": str(key), "WAKE_GITHUB_REPO": "me/llm",
            "WAKE_GITHUB_WORKFLOW": "deploy.yml", "WAKE_STATE_FILE": str(tmp_path / "state.json"),
            **FAST, **SCALE,
        }  # fmt: skip
        env = {**env, "WAKE_GITHUB_API": loopback.url(server), **settings}
        scaler = Scaler("", upstreams, github, None, env, [], [], None, replicas)  # type: ignore[arg-type]
        for i in range(replicas_n):
            scaler.add(f"r{i}")
        if like:
            scaler.replicas = like.replicas
        proc = subprocess.Popen([sys.executable, str(WAKE)], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)  # fmt: skip
        listening = threading.Event()

        def read() -> None:
            assert proc.stdout is not None
            for text in proc.stdout:
                scaler.raw.append(text)
                line = json.loads(text)
                scaler.lines.append(line)
                if line["event"] == "listening":
                    scaler.url = f"http://{line['address']}"
                    listening.set()

        scaler.proc, scaler.reader = proc, threading.Thread(target=read, daemon=True)
        scaler.reader.start()
        assert listening.wait(10), scaler.raw
        made.append(scaler)
        return scaler

    yield make
    for scaler in made:
        scaler.proc.kill()
        scaler.proc.wait(timeout=10)
        scaler.reader.join(timeout=10)
        out = "".join(scaler.raw)
        assert API_KEY not in out, "the API key is never logged"
        assert TOKEN not in out, "nor the pipeline's token"
    for replica in replicas:
        replica.stop()
    for server in servers:
        loopback.stop(server)


def wake_tool(scaler: Scaler) -> str:
    env = {"PATH": os.environ["PATH"], "OPENAI_API_KEY": API_KEY}
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "wake.py"), "--endpoint",
                           f"{scaler.url}/v1"], env=env, capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_sustained_queue_adds_one_replica_once_and_the_step_ends_when_it_joined(
    scaler_factory: Callable[..., Scaler],
) -> None:
    """Prefill-heavy: requests wait with the KV cache low; the queue decides. One dispatch with
    replicas "3"; none more while the step is under way; done once the run succeeded and the
    third replica's upstream file is there. The status and the tool show all of it."""
    s = scaler_factory(replicas_n=2)
    s.until(lambda: s.state()["mode"] == "awake")
    s.set(waiting=6, running=10, kv=0.1)
    s.github.wait_dispatches(1)
    assert s.github.dispatches[0]["inputs"] == {**DISPATCH["inputs"], "replicas": "3"}
    time.sleep(1.5)
    assert len(s.github.dispatches) == 1, "one step at a time"
    scale = s.scale()
    assert (scale["current"], scale["wanted"], scale["step"]["status"]) == (2, 3, "following")
    assert "the queue decides" in scale["step"]["why"]
    s.github.finish_run("success")
    s.until(lambda: "run_succeeded" in [e[0] for e in s.scale()["step"]["events"]])
    assert s.scale()["step"]["status"] == "following", "the run is done, the replica is not"
    s.add("r2").g.waiting = 6
    s.until(lambda: s.scale()["step"]["status"] == "done")
    scale = s.scale()
    assert scale["current"] == 3 and scale["wanted"] == 3
    assert [e[0] for e in scale["step"]["events"]] == [
        "dispatching", "dispatched", "run_succeeded", "replica_joined", "done"]  # fmt: skip
    assert scale["step"]["run_id"] == s.github.runs[0]["id"]
    shown = wake_tool(s)
    assert "autoscale: 3 replica(s), 3 wanted (min 1, max 3)" in shown, shown
    assert "step 2 -> 3: done (run 9001): dispatching " in shown
    assert "signals: " in shown and "KV" in shown
    assert shown.startswith("mode: awake since "), "the existing lines come first, unchanged"
    time.sleep(1.5)
    assert len(s.github.dispatches) == 1, "at max, and in the cooldown: nothing more"


def test_idle_with_room_steps_in_to_one_fewer_never_below_the_floor(
    scaler_factory: Callable[..., Scaler],
) -> None:
    s = scaler_factory(replicas_n=2, SCALE_MIN="0")
    s.set(running=2, kv=0.2)  # 4 running in all: 1 replica x 10 x 0.5 has room
    s.github.wait_dispatches(1)
    assert s.github.dispatches[0]["inputs"]["replicas"] == "1", "max(min, 1): never 0"
    assert s.scale()["step"]["from"] == 2
    s.github.finish_run("success")
    (s.upstreams / "r1.caddy").unlink()  # drained by member.sh's leave, then deleted
    s.until(lambda: s.scale()["step"]["status"] == "done")
    assert "replica_left" in [e[0] for e in s.scale()["step"]["events"]]
    scaler = scaler_factory(replicas_n=1, SCALE_MIN="0", SCALE_COOLDOWN_MINUTES="1")
    time.sleep(3)
    assert scaler.scale()["last_decision"]["code"] == "at_floor"
    assert scaler.github.dispatches == [], "going to none is autodown's and the wake's"


def test_a_stale_replica_blocks_both_ways_and_each_reason_is_logged_once(
    scaler_factory: Callable[..., Scaler],
) -> None:
    s = scaler_factory(replicas_n=2)
    s.until(lambda: s.state()["mode"] == "awake")
    s.set(waiting=9)
    s.replicas["r1"].g.metrics = 500
    time.sleep(2)
    s.replicas["r1"].g.health = 503  # draining for an update
    time.sleep(1)
    s.replicas["r1"].stop()  # connection refused
    time.sleep(1.5)
    assert s.github.dispatches == []
    whys = [line["why"] for line in s.events("scale_stale")]
    port = s.replicas["r1"].port
    assert whys == [
        f"127.0.0.1:{port}: /metrics answered HTTP 500",
        f"127.0.0.1:{port} is draining (/health 503)",
        f"127.0.0.1:{port}: /metrics could not be read (ClientConnectorError)",
    ], whys
    assert s.scale()["last_decision"]["code"] == "stale"


def test_a_replica_too_busy_to_answer_in_time_is_load_never_idle(
    scaler_factory: Callable[..., Scaler],
) -> None:
    """A saturated vLLM answers /health and /metrics late, past LOOK_TIMEOUT, while it accepts
    connections: busy. Its idle numbers, had they come, would step in; unread, the set is
    never idle: no step, the reason says busy (not a dead replica's), logged once, and the
    replicas stay ready (the front awake). Once they answer in time, the in window starts
    from then: the step in comes a whole window later, not at once."""
    s = scaler_factory(replicas_n=2)
    s.set(running=8)  # no room for one fewer: no step
    s.until(lambda: (s.scale()["last_decision"] or {}).get("code") == "steady")
    s.set(late=2.5)
    s.set(running=1)  # room for one fewer, if it were read
    time.sleep(5)  # two in windows
    assert s.github.dispatches == [], "a busy set is never idle"
    assert s.state()["mode"] == "awake", "busy replicas stay ready"
    whys = [line["why"] for line in s.events("scale_busy")]
    busy = re.compile(r"127\.0\.0\.1:\d+ is busy: its /(health|metrics) did not answer within "
                      r"2 s \(it accepts connections\)")  # fmt: skip
    assert whys and all(busy.fullmatch(why) for why in whys), whys
    port = s.replicas["r0"].port  # once both are late, the first of the pool says why
    assert whys[-1] == (f"127.0.0.1:{port} is busy: its /health did not answer within 2 s (it "
                        "accepts connections)"), whys  # fmt: skip
    assert s.scale()["last_decision"]["code"] == "busy"
    assert s.events("scale_stale") == []
    s.set(late=0.0)
    calm = time.monotonic()
    s.github.wait_dispatches(1)
    assert time.monotonic() - calm >= 2.0, "the in window (2 s) began once it answered"
    assert s.github.dispatches[0]["inputs"]["replicas"] == "1"


def test_a_busy_sample_keeps_the_queue_that_waited_and_starts_the_in_window_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No reading from a busy replica: the samples that waited up to it stay (a queue too busy
    to be read has not emptied), those before them go (the in window starts again). A stale
    one (a dead or draining replica) breaks both windows."""
    waker = in_process(tmp_path)
    waker.mode = "awake"
    for name in ("r0", "r1"):
        (tmp_path / "ups" / f"{name}.caddy").write_text(f"to 127.0.0.1:{len(name)}\n")
    quiet = samples(2, 1.0, running=2)
    waited = [dataclasses.replace(x, at=x.at + 1.2) for x in samples(2, 0.6, waiting=6)]

    async def unread(_: Any, ups: list[Any]) -> tuple[dict[str, Any], str, bool]:
        return {}, "127.0.0.1:2 is busy", busy

    monkeypatch.setattr(waker, "read_pool", unread)
    busy = True
    waker.samples = quiet + waited
    tick(waker)
    assert waker.samples == waited
    assert waker.last_decision["code"] == "busy"
    waker.samples = waited + quiet
    tick(waker)
    assert waker.samples == [], "nothing waits at the end: nothing of the windows is kept"
    busy = False
    waker.samples = quiet + waited
    tick(waker)
    assert waker.samples == [] and waker.last_decision["code"] == "stale"


def test_a_replica_that_dies_mid_scale_in_ends_the_step_and_leaves_a_stable_count(
    scaler_factory: Callable[..., Scaler],
) -> None:
    """Three replicas, idle with room: a step in asks for 2. While its run goes, replica 1 dies
    (its gateway refuses connections; its upstream file stays: nothing removed it). The run
    deletes replica 2 and the pool is 2: the step is done. Then every sample is stale (replica
    1 cannot be read, which counts as busy): no step either way, the reason logged once, and
    nothing dispatched again however long it lasts."""
    s = scaler_factory(replicas_n=3, SCALE_COOLDOWN_MINUTES="1")
    s.set(running=1)
    s.github.wait_dispatches(1)
    assert s.github.dispatches[0]["inputs"]["replicas"] == "2"
    s.replicas["r1"].stop()
    s.github.finish_run("success")
    (s.upstreams / "r2.caddy").unlink()
    s.until(lambda: s.scale()["step"]["status"] == "done")
    s.until(lambda: s.events("scale_stale"))
    s.set(waiting=9)  # the others queue: still no step on a pool that cannot be read whole
    time.sleep(3)
    assert len(s.github.dispatches) == 1, "a stable count, never a loop"
    port = s.replicas["r1"].port
    assert [line["why"] for line in s.events("scale_stale")] == [
        f"127.0.0.1:{port}: /metrics could not be read (ClientConnectorError)"]  # fmt: skip
    scale = s.scale()
    assert (scale["current"], scale["last_decision"]["code"]) == (2, "stale"), scale


def test_a_full_cache_with_nothing_waiting_is_said_and_not_stepped_on(
    scaler_factory: Callable[..., Scaler],
) -> None:
    s = scaler_factory(replicas_n=2)
    s.set(kv=0.97)
    s.until(lambda: s.events("signals_disagree"))
    time.sleep(1.5)
    assert s.github.dispatches == []
    said = s.events("signals_disagree")
    assert len(said) == 1 and said[0]["kv"] >= 0.95 and said[0]["waiting"] == 0, said


@pytest.mark.parametrize("how", ["failure", "refused"])
def test_a_failed_step_says_why_cools_down_and_is_not_retried(
    scaler_factory: Callable[..., Scaler], how: str
) -> None:
    github = FakeGitHub(refuse=403 if how == "refused" else None)
    s = scaler_factory(github, replicas_n=2)
    s.set(waiting=6)
    if how == "failure":
        github.wait_dispatches(1)
        github.finish_run("failure")
    s.until(lambda: (s.scale()["step"] or {}).get("status") == "failed")
    reason = s.scale()["step"]["reason"]
    if how == "failure":
        assert reason.startswith("the deploy run ended failure in job deploy"), reason
    else:
        assert reason.startswith("GitHub refused the scale step (HTTP 403"), reason
    time.sleep(2)
    assert len(github.dispatches) == (1 if how == "failure" else 0), "no retry by itself"
    refusal = s.scale()["last_refusal"]
    assert refusal["code"] == "cooldown" and "autoscale.cooldownMinutes: 5" in refusal["why"]
    assert len(s.events("scale_refused")) == 1, "said once, not every sample"


def test_the_daily_budget_refuses_a_step_out_naming_the_setting(
    scaler_factory: Callable[..., Scaler],
) -> None:
    s = scaler_factory(replicas_n=2, SCALE_DAILY_BUDGET_USD="4")
    s.set(waiting=6)
    s.until(lambda: s.scale()["last_refusal"])
    refusal = s.scale()["last_refusal"]
    assert refusal["code"] == "budget" and refusal["why"].startswith(
        "autoscale.dailyBudgetUsd (4): $0.00 spent in the last 24 h + 3 replicas x $1.50/h"
    ), refusal
    assert s.github.dispatches == []
    assert s.scale()["budget"]["daily_usd"] == 4 and s.scale()["budget"]["left_usd"] <= 4
    assert "budget: $" in wake_tool(s)


def test_no_step_while_an_update_of_the_stack_runs(scaler_factory: Callable[..., Scaler]) -> None:
    github = FakeGitHub()
    push = github.push()  # deploy dev up, in progress
    s = scaler_factory(github, replicas_n=2)
    s.set(waiting=6)
    s.until(lambda: s.scale()["last_refusal"])
    assert s.scale()["last_refusal"]["code"] == "update_running"
    assert push["html_url"] in s.scale()["last_refusal"]["why"]
    time.sleep(1)
    assert github.dispatches == []
    github.finish_run("success", run_id=push["id"])
    github.wait_dispatches(1)


def test_a_waker_killed_after_its_dispatch_follows_the_same_run_when_it_restarts(
    scaler_factory: Callable[..., Scaler],
) -> None:
    github = FakeGitHub(dispatch_delay=3.0)
    s = scaler_factory(github, replicas_n=2)
    s.set(waiting=6)
    github.wait_dispatches(1)
    s.proc.send_signal(signal.SIGKILL)
    s.proc.wait(timeout=10)
    saved = json.loads(Path(s.env["WAKE_STATE_FILE"]).read_text())["autoscale"]["steps"][-1]
    assert saved["status"] == "dispatching" and saved["run_id"] is None, saved
    github.dispatch_delay = 0.0
    again = scaler_factory(like=s)
    assert again.events("scale_resumed")
    again.until(lambda: again.scale()["step"]["run_id"] == github.runs[0]["id"])
    github.finish_run("success")
    again.add("r2")
    again.until(lambda: again.scale()["step"]["status"] == "done")
    assert len(github.dispatches) == 1, "never a second dispatch"


def test_with_autoscale_a_wake_asks_for_the_floor_and_without_it_nothing_changes(
    scaler_factory: Callable[..., Scaler],
) -> None:
    github = FakeGitHub()
    s = scaler_factory(github, SCALE_MIN="0")
    held = in_background(lambda: requests.post(f"{s.url}/v1/chat/completions", json=CHAT,
                                               headers=KEYED, timeout=30))  # fmt: skip
    github.wait_dispatches(1)
    assert github.dispatches[0]["inputs"] == {**DISPATCH["inputs"], "replicas": "1"}
    del held  # still held when the test ends: its lost answer is nobody's failure
    plain = FakeGitHub()
    off = {k: "" for k in SCALE}
    quiet = scaler_factory(plain, replicas_n=2, **off)
    quiet.set(waiting=50)
    time.sleep(1.5)
    assert quiet.state()["autoscale"] is None and plain.dispatches == []
    assert not [line for line in quiet.lines if line["event"].startswith("scale_")]
    assert [r.g.scrapes for r in quiet.replicas.values()] == [0, 0], "no metrics read"
    assert "autoscale" not in wake_tool(quiet)


def autoscale_cfg(**autoscale: Any) -> config.StackConfig:
    raw = stack_config("dev")
    raw["access"] = {**raw["access"], "https": False}
    raw["wake"] = {"enabled": True, "githubRepo": "me/llm", "token": TOKEN}
    sections = {"wake"}
    if autoscale:
        raw["autoscale"] = autoscale
        sections.add("autoscale")
    return config.parse(raw, "dev", frozenset(sections))


def test_the_program_renders_the_settings_the_waker_reads() -> None:
    cfg = autoscale_cfg(max=3, dailyBudgetUsd=40, queueSeconds=1.5)
    rendered = dict(line.split("=", 1) for line in wake.env_text(cfg, 3.39).splitlines())
    scale = {k: v for k, v in rendered.items() if k.startswith("SCALE_")}
    assert scale == {
        "SCALE_MIN": "1", "SCALE_MAX": "3", "SCALE_QUEUE_SECONDS": "1.5",
        "SCALE_OUT_WINDOW_SECONDS": "60", "SCALE_IN_WINDOW_SECONDS": "600",
        "SCALE_IN_UTILIZATION": "0.5", "SCALE_REPLICA_CAPACITY": str(cfg.replica_capacity),
        "SCALE_COOLDOWN_MINUTES": "5", "SCALE_DAILY_BUDGET_USD": "40",
        "SCALE_REPLICA_PRICE_HOURLY": "3.39", "SCALE_SAMPLE_SECONDS": "5",
    }  # fmt: skip
    policy, off, key = W.ScalePolicy.from_env({**rendered, "WAKE_API_KEY_FILE": "/nonexistent"})
    assert policy is None and "no API key" in off and key == ""
    assert "SCALE_" not in wake.env_text(autoscale_cfg())
    listed = wake.env_text(cfg).splitlines()
    assert f"SCALE_REPLICA_PRICE_HOURLY={cfg.size.list_price_usd_hour or 0:g}" in listed
    unit = wake.unit_text(autoscale=True)
    assert f"LoadCredential=apikey:{wake.API_KEY_FILE}" in unit
    assert "Environment=WAKE_API_KEY_FILE=%d/apikey" in unit
    assert "apikey" not in wake.unit_text(), "without autoscale the unit is as it was"


# ---- hostile inputs, in process ------------------------------------------------------------------


def in_process(tmp_path: Path, **env: str) -> Any:
    """A Waker with autoscale on, its state file and upstream folder in tmp_path (no server)."""
    key = tmp_path / "apikey"
    key.write_text(API_KEY + "\n")
    ups = tmp_path / "ups"
    ups.mkdir(exist_ok=True)
    settings = W.Settings.from_env({
        "WAKE_UPSTREAMS_DIR": str(ups), "WAKE_HOLD_FILE": str(tmp_path / "hold"),
        "WAKE_STACK": "dev", "WAKE_API_KEY_FILE": str(key), "WAKE_GITHUB_REPO": "me/llm",
        "WAKE_STATE_FILE": str(tmp_path / "state.json"), "WAKE_GITHUB_API": "http://127.0.0.1:9",
        **SCALE, **env})  # fmt: skip
    return W.Waker(settings)


class RawReplica:
    """A gateway that answers /health 200 and /metrics with `body`, written in pieces of
    `piece` bytes `pause` seconds apart (as a page larger than a TCP window arrives)."""

    def __init__(self, body: bytes, piece: int = 1 << 30, pause: float = 0.0) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.body, self.piece, self.pause = body, piece, pause
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self.one, args=(conn,), daemon=True).start()

    def one(self, conn: socket.socket) -> None:
        with conn:
            try:
                while True:
                    head = b""
                    while b"\r\n\r\n" not in head:
                        got = conn.recv(65536)
                        if not got:
                            return
                        head += got
                    if head.startswith(b"GET /health "):
                        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
                        continue
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                                 b"Content-Length: %d\r\n\r\n" % len(self.body))  # fmt: skip
                    for i in range(0, len(self.body), self.piece):
                        conn.sendall(self.body[i : i + self.piece])
                        time.sleep(self.pause)
            except OSError:
                return

    def stop(self) -> None:
        self.sock.close()


def read_one(waker: Any, port: int) -> tuple[Any, str]:
    async def go() -> tuple[Any, str]:
        async with ClientSession(auto_decompress=False) as session:
            reading, why, _ = await waker.read_replica(session, ("127.0.0.1", port))
            return reading, why

    return front_bench.run(go())


FILLER = "".join(f'vllm:generation_tokens_total{{engine="0",n="{i}"}} {i}\n'
                 for i in range(3000)).encode()  # fmt: skip


def test_a_page_that_arrives_in_pieces_is_read_whole(tmp_path: Path) -> None:
    """vLLM's page is tens of kB: it arrives over several reads. The sample is the whole page's
    (engine 1's gauges after the filler count), not what the first read happened to hold."""
    body = (b'vllm:num_requests_waiting{engine="0"} 1\nvllm:num_requests_running{engine="0"} 2\n'
            + FILLER + b'vllm:num_requests_waiting{engine="1"} 5\n'
            b'vllm:num_requests_running{engine="1"} 7\n')  # fmt: skip
    replica = RawReplica(body, piece=16384, pause=0.05)
    try:
        reading, why = read_one(in_process(tmp_path), replica.port)
    finally:
        replica.stop()
    assert why == "" and (reading.waiting, reading.running) == (6, 9), (reading, why)


def test_a_page_larger_than_the_limit_is_stale_not_a_partial_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page cut at METRICS_LIMIT would count some engines and not others (fewer running: a
    step in on a busy set): it is stale instead."""
    monkeypatch.setattr(W, "METRICS_LIMIT", 20_000)
    body = (b'vllm:num_requests_waiting{engine="0"} 0\nvllm:num_requests_running{engine="0"} 1\n'
            + FILLER + b'vllm:num_requests_running{engine="1"} 90\n')  # fmt: skip
    replica = RawReplica(body)
    try:
        reading, why = read_one(in_process(tmp_path), replica.port)
    finally:
        replica.stop()
    assert reading is None and "/metrics is larger than" in why, (reading, why)


def test_a_page_that_trickles_is_busy_within_the_look_timeout(tmp_path: Path) -> None:
    """A page that does not arrive within LOOK_TIMEOUT is no reading; the replica accepts
    connections, so it is busy (load), not a dead one."""
    replica = RawReplica(b"vllm:num_requests_waiting 1\n" * 200, piece=1, pause=0.05)
    began = time.monotonic()
    try:
        reading, why = read_one(in_process(tmp_path), replica.port)
    finally:
        replica.stop()
    assert reading is None and why == (
        f"127.0.0.1:{replica.port} is busy: its /metrics did "
        "not answer within 2 s (it accepts connections)"
    ), why
    assert time.monotonic() - began < W.LOOK_TIMEOUT + 1.5


def loaded(tmp_path: Path, state: Any, now: float = 1_000_000.0, **env: str) -> Any:
    waker = in_process(tmp_path, **env)
    waker.clock = lambda: now
    (tmp_path / "state.json").write_text(state if isinstance(state, str) else json.dumps(state))
    waker.load()
    return waker


def tick(waker: Any) -> None:
    """One scale_tick with no replica to read (the pool's files as they are)."""

    async def go() -> None:
        async with ClientSession() as session:
            await waker.scale_tick(session)

    front_bench.run(go())


@pytest.mark.parametrize("step", [
    {"status": "following", "wanted": 3},  # no _t
    {"status": "following", "wanted": 3, "_t": "soon", "pool": "two"},
    {"status": "failed", "wanted": 3, "_t": 1.0, "_end": "later"},
    {"status": "following", "wanted": "3", "_t": None, "events": "x"},
])  # fmt: skip
def test_a_step_with_fields_of_the_wrong_type_does_not_wedge_autoscale(
    tmp_path: Path, step: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step whose times or counts do not parse is repaired at load: under way, it ends at
    wake.deadlineMinutes from now; ended, its cooldown runs from now. Never an exception at
    every sample, for ever."""
    failed: list[str] = []
    monkeypatch.setattr(W, "log", lambda event, **f: failed.append(event))
    now = 1_000_000.0
    waker = loaded(tmp_path, {"wakes": [], "timeline": {}, "autoscale": {"steps": [step]}}, now)
    tick(waker)
    waker.clock = lambda: now + 46 * 60  # past wake.deadlineMinutes (45) and any cooldown
    waker.mode = "awake"
    tick(waker)
    d = W.Decision("out", 3, "test", {})
    refusal = front_bench.run(waker.step_refusal(d, 2, now + 46 * 60 + 600))
    assert "scale_tick_failed" not in failed and "state_reset" not in failed, failed
    assert waker.current_step() is None, waker.steps
    assert refusal is None or refusal[0] == "update_running", refusal


def test_a_step_that_is_not_an_object_is_dropped_and_the_rest_of_the_state_kept(
    tmp_path: Path,
) -> None:
    now = 1_000_000.0
    state = {"wakes": [now - 60], "timeline": {}, "failed_at": now - 30, "reason": "r",
             "autoscale": {"steps": ["x", 5, None, {"status": "done", "wanted": 2, "_t": now - 99,
                                                     "_end": now - 90}],
                           "points": [[now - 100, 2]], "last_decision": "oops"}}  # fmt: skip
    waker = loaded(tmp_path, state, now)
    assert waker.failed_at == now - 30, "the wake's cooldown survives a bad step"
    assert [s["wanted"] for s in waker.steps] == [2]
    assert waker.points == [(now - 100, 2)]
    assert waker.last_decision is None


def test_the_count_history_is_bounded_and_ignores_points_from_the_future(tmp_path: Path) -> None:
    """A state file with a huge history (or one written while the clock ran ahead) keeps the
    last day's points only, the one before the day's start saying its count: the list cannot
    grow for ever, and pruning it is not quadratic."""
    now = 10 * W.DAY
    points = [[now - 3 * W.DAY + i, i % 2 + 1] for i in range(50_000)]
    points += [[now - 3600, 3], [now + 7 * W.DAY, 1], [float("nan"), 2]]
    waker = loaded(tmp_path, {"autoscale": {"points": points}}, now)
    began = (now - 3 * W.DAY + 49_999, 2)  # the count the day began with
    assert waker.points == [began, (now - 3600, 3)], waker.points[:5]
    assert W.replica_hours(waker.points, now) == pytest.approx(23 * 2 + 3)
    # The clock jumps back an hour: the points after it are dropped, not kept ahead of it.
    waker.count_point(now, 2)
    waker.count_point(now - 3600 + 60, 1)
    assert waker.points == [began, (now - 3600, 3), (now - 3600 + 60, 1)], waker.points


def test_a_step_dated_in_the_future_ends_at_its_deadline_from_now(tmp_path: Path) -> None:
    """A step saved while the clock ran ahead (a front booted before NTP) would wait out its
    deadline and its cooldown from that future: its times are taken as now at most."""
    now = 1_000_000.0
    ahead = now + 3650 * W.DAY
    state = {"autoscale": {"steps": [{"status": "following", "wanted": 3, "from": 2, "pool": 2,
                                      "run": "success", "_t": ahead, "_end": None}]}}  # fmt: skip
    waker = loaded(tmp_path, state, now)
    waker.step_progress(waker.current_step(), 2, now + 46 * 60)
    assert waker.steps[-1]["status"] == "failed", waker.steps[-1]
    ended = {"autoscale": {"steps": [{"status": "done", "wanted": 3, "_t": ahead,
                                      "_end": ahead}]}}  # fmt: skip
    waker = loaded(tmp_path, ended, now)
    d = W.Decision("out", 3, "test", {})
    refusal = front_bench.run(waker.step_refusal(d, 2, now + 6 * 60))
    assert refusal is None or refusal[0] != "cooldown", refusal


def test_github_answering_garbage_is_no_answer_never_a_dead_follow(tmp_path: Path) -> None:
    """A runs list that is not GitHub's shape (a number, strings, an id that is no number, not
    an object) is as if GitHub had not answered: the update check says one may run, and the
    step's follow goes on to the next look instead of dying with its task."""
    waker = in_process(tmp_path, WAKE_RUN_POLL_SECONDS="0")
    made = "2026-01-01T00:00:00Z"
    ours = {"id": 9001, "display_title": "deploy dev up", "created_at": made,
            "status": "completed", "conclusion": "success"}  # fmt: skip
    answers = iter([
        (200, {"workflow_runs": 5}),  # recent_runs
        (200, {"workflow_runs": 5}), (200, {"workflow_runs": ["x", 7]}), (200, "garbage"),
        (200, {"workflow_runs": [{**ours, "id": "abc"}]}),
        (200, {"workflow_runs": [{**ours, "created_at": 17}]}),
        (200, {"workflow_runs": [ours]}),
    ])  # fmt: skip
    waker._request = lambda *_: next(answers)
    assert waker.recent_runs() is None
    found: list[int] = []
    ended = front_bench.run(waker.follow_run(0.0, None, lambda: True, found.append, lambda _: None))
    assert ended == (True, "") and found == [9001], (ended, found)


def test_another_stack_whose_name_starts_alike_is_not_an_update_of_this_one(
    tmp_path: Path,
) -> None:
    waker = in_process(tmp_path)
    runs = [{"id": 1, "display_title": "deploy dev2 up", "status": "in_progress"},
            {"id": 2, "display_title": "deploy development up", "status": "queued"},
            {"id": 3, "display_title": "deploy dev", "status": "queued"}]  # fmt: skip
    waker._request = lambda *_: (200, {"workflow_runs": runs})
    assert front_bench.run(waker.update_under_way(0.0)) == ""
    waker.update_seen = None
    runs.append({"id": 4, "display_title": "deploy dev up", "status": "waiting"})
    assert front_bench.run(waker.update_under_way(0.0)) == "4"


def test_a_series_repeated_on_a_page_counts_once_and_lookalike_names_never() -> None:
    """Prometheus' format allows one sample per series: a repeated label set (a page served
    twice over, a buggy exporter) is the same series, its last value, not twice the queue.
    Timestamps and exemplars after the value, and names that merely start like ours, change
    nothing."""
    page = "\n".join([
        'vllm:num_requests_waiting{engine="0"} 4',
        'vllm:num_requests_waiting{engine="0"} 4',
        'vllm:num_requests_waiting{engine="1"} 1 1700000000000',
        'vllm:num_requests_running{engine="0"} 2',
        'vllm:num_requests_running{engine="0"} 3',
        'vllm:request_success_total{engine="0",finished_reason="stop"} 10 # {trace_id="a"} 1.0',
        'vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 99',
        'vllm:num_requests_waiting:sum 50',
        'vllm:num_requests_running_total 70',
    ])  # fmt: skip
    assert W.parse_metrics(page) == W.Reading(waiting=5, running=3, kv=0, finished=10)


def test_an_upstream_listed_twice_is_one_replica(tmp_path: Path) -> None:
    """Two files naming the same address (a file left behind, an address reused) are one
    replica: the pool's count, the sample and the step's `from` agree."""
    waker = in_process(tmp_path)
    ups = tmp_path / "ups"
    (ups / "r0.caddy").write_text("to 10.0.0.2:8080\n")
    (ups / "r1.caddy").write_text("to 10.0.0.3:8080\n")
    (ups / "old.caddy").write_text("to 10.0.0.3:8080\n")
    assert sorted(waker.upstreams()) == [("10.0.0.2", 8080), ("10.0.0.3", 8080)]


def test_a_pool_outside_the_bounds_steps_to_a_count_the_program_keeps() -> None:
    """autoscale.max lowered (or min raised) under a live set: the pool is outside the bounds
    until the next run moves it. A step asks for a count within them (the program would keep
    any other within them, and a step waiting for a count it can never reach fails at its
    deadline)."""
    idle = W.decide(samples(5, 2.2, running=1), POLICY)
    assert (idle.code, idle.want) == ("in", 3), idle
    high = W.ScalePolicy(**{**POLICY.__dict__, "min": 3, "max": 5})
    queued = W.decide(samples(1, 1.2, waiting=8), high)
    assert (queued.code, queued.want) == ("out", 3), queued


@pytest.mark.parametrize("wake_part", [
    {"wakes": ["soon", None, 999_990.0]},
    {"wakes": 5},
    {"timeline": "x", "wakes": [999_990.0]},
    {"failed_at": "x", "wakes": [999_990.0]},
])  # fmt: skip
def test_a_bad_wake_field_keeps_the_step_under_way(
    tmp_path: Path, wake_part: dict[str, Any]
) -> None:
    """A field of the wake's that does not parse loses that field, not the step under way: a
    step forgotten is a second one dispatched beside it (through a webhook nothing shows the
    first one's run)."""
    now = 1_000_000.0
    step = {"status": "following", "wanted": 3, "from": 2, "pool": 2, "_t": now - 60}
    waker = loaded(tmp_path, {"autoscale": {"steps": [step]}, **wake_part}, now)
    assert waker.current_step() is not None, waker.steps
    assert waker.wakes == ([999_990.0] if wake_part["wakes"] != 5 else [])
