"""The balancer's rendered configuration, run in the real Caddy (the release the Droplet runs) in
front of three fake replicas on loopback, under a steady streamed load: a replica stopped and
started again, and replicas of unequal speed."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import fake_openai
import loopback
import requests
from pulumi_harness import stack_config
from sandbox import CADDY, free_port
from test_gateway import KEY, Gateway, replica_gateway, run_caddy, start_gateway

from components.host import balancer, gateway, pool
from components.spec import catalog, config

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
TOKENS = 20


@contextmanager
def replica(name: str, port: int, *args: str) -> Iterator[subprocess.Popen[str]]:
    """A fake vLLM answering as `name` on `port`."""
    flags = ("--name", name, "--port", str(port), "--tokens", str(TOKENS), *args)
    with fake_openai.running(*flags, key=KEY) as fake:
        yield fake.proc


@dataclass
class Outcome:
    started: float
    ended: float
    upstream: str
    tokens: int
    error: str = ""

    @property
    def whole(self) -> bool:
        return not self.error and self.tokens == TOKENS


def stream_once(gw: Gateway) -> Outcome:
    started = time.monotonic()
    upstream, tokens = "", 0
    try:
        with requests.post(
            gw.base + "/chat/completions",
            headers={"Authorization": f"Bearer {KEY}"},
            json={
                "model": "nemotron",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": TOKENS,
                "stream": True,
            },
            stream=True,
            timeout=30,
        ) as r:
            upstream = r.headers.get("X-Upstream", "")
            if r.status_code != 200:
                return Outcome(started, time.monotonic(), upstream, 0, f"HTTP {r.status_code}")
            for raw in r.iter_lines(decode_unicode=True):
                if raw and raw.startswith("data:") and raw != "data: [DONE]":
                    event = json.loads(raw[5:])
                    tokens += sum(bool(c["delta"].get("content")) for c in event["choices"])
    except (requests.RequestException, ValueError) as err:
        return Outcome(started, time.monotonic(), upstream, tokens, type(err).__name__)
    return Outcome(started, time.monotonic(), upstream, tokens)


def load(gw: Gateway, workers: int, seconds: float) -> tuple[list[Outcome], threading.Thread]:
    """`workers` clients streaming back to back for `seconds`; returns the outcomes list (filled
    as they finish) and a thread to join."""
    outcomes: list[Outcome] = []
    stop = time.monotonic() + seconds

    def worker() -> None:
        while time.monotonic() < stop:
            outcomes.append(stream_once(gw))

    threads = [threading.Thread(target=worker) for _ in range(workers)]
    for t in threads:
        t.start()

    def join() -> None:
        for t in threads:
            t.join()

    return outcomes, threading.Thread(target=join)


def test_a_stopped_replica_leaves_the_pool_without_failing_the_rest_and_comes_back(
    tmp_path: Path,
) -> None:
    ports = [free_port() for _ in range(3)]
    upstreams = [balancer.Upstream("127.0.0.1", p) for p in ports]
    timing = ("--ttft", "0.02", "--itl", "0.02")
    with ExitStack() as stack:
        stack.enter_context(replica("r0", ports[0], *timing))
        r1 = stack.enter_context(replica("r1", ports[1], *timing))
        stack.enter_context(replica("r2", ports[2], *timing))
        gw = next(start := start_gateway(tmp_path, "", https=False, upstreams=upstreams))
        try:
            outcomes, joiner = load(gw, workers=6, seconds=20)
            time.sleep(2)
            stopped = time.monotonic()
            r1.kill()  # not drained: what a crash or a reboot does
            r1.wait()
            time.sleep(4)
            restarted = time.monotonic()
            stack.enter_context(replica("r1", ports[1], *timing))
            joiner.start()
            joiner.join()
        finally:
            start.close()

    served = Counter(o.upstream for o in outcomes)
    failed = [o for o in outcomes if not o.whole]
    # Streams on the replicas that stayed up are all whole.
    assert all(o.whole for o in outcomes if o.upstream in ("r0", "r2")), failed
    # The only failures are streams r1 was serving when it was killed: none started after.
    assert all(o.upstream == "r1" and o.started < stopped for o in failed), failed
    assert len(failed) <= 6
    # New requests kept flowing while r1 was out (retried on another replica, then r1 skipped).
    during = [o for o in outcomes if stopped < o.started < restarted]
    assert during and all(o.whole and o.upstream != "r1" for o in during), during
    # r1 takes requests again once its health checks pass.
    back = restarted + balancer.HEALTH_INTERVAL_SECONDS * (balancer.HEALTH_PASSES + 1)
    assert any(o.upstream == "r1" and o.started > back and o.whole for o in outcomes), served
    assert served["r0"] and served["r2"]


@contextmanager
def dying_replica(port: int) -> Iterator[list[str]]:
    """A replica that passes its health checks and dies on every request before it answers:
    it reads the request whole, then drops the connection (a kill between the request and the
    first byte of its answer, as a crash or a reboot does). Yields the paths it was sent."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            if self.path == "/health":
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self._die()

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self._die()

        def _die(self) -> None:
            seen.append(self.path)
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                       struct.pack("ii", 1, 0))  # fmt: skip
            self.close_connection = True
            self.connection.close()

        def log_message(self, *_: Any) -> None:
            pass

    server = loopback.serve(Handler, loopback.bound("127.0.0.1", port))
    try:
        yield seen
    finally:
        loopback.stop(server)


def test_a_replica_that_dies_before_it_answers_costs_the_client_nothing(tmp_path: Path) -> None:
    """Every request the dying replica took (a chat completion, streamed or not, and the model
    list) is answered by the other one: resent, since nothing came back and the gate's routes
    change nothing on a replica. Before this a POST there got Caddy's 502."""
    ports = [free_port() for _ in range(2)]
    upstreams = [balancer.Upstream("127.0.0.1", p) for p in ports]
    with dying_replica(ports[0]) as seen, replica("r1", ports[1]):
        start = start_gateway(tmp_path, "", https=False, upstreams=upstreams)
        gw = next(start)
        try:
            chat = {"model": "nemotron", "max_tokens": 4,
                    "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
            codes = []
            # Completions until the dying replica has taken one: least_conn breaks a tie at
            # random (selectionpolicies.go), and after its first failure the replica is out
            # for FAIL_SECONDS, so a model list it took first would leave the POST untried (a
            # CI run saw that). Then the model list and streams, all answered.
            for i in range(40):
                codes.append(gw.post("/v1/chat/completions", json={**chat,
                                     "stream": i % 2 == 1}).status_code)  # fmt: skip
                if "/v1/chat/completions" in seen:
                    break
            for i in range(12):
                if i % 3 == 2:
                    codes.append(gw.get("/v1/models").status_code)
                else:
                    codes.append(gw.post("/v1/chat/completions", json={**chat,
                                         "stream": i % 3 == 1}).status_code)  # fmt: skip
        finally:
            start.close()
    assert "/v1/chat/completions" in seen, "the dying replica was tried with a completion"
    assert codes == [200] * len(codes), codes


def test_requests_go_to_the_replica_with_the_fewest_in_flight(tmp_path: Path) -> None:
    """One replica is slow to first token (a long prefill, a busy engine): it holds its
    requests longer, so least_conn sends it fewer; round robin would give all three the same."""
    ports = [free_port() for _ in range(3)]
    upstreams = [balancer.Upstream("127.0.0.1", p) for p in ports]
    fast = ("--ttft", "0.02", "--itl", "0.01")
    with ExitStack() as stack:
        stack.enter_context(replica("slow", ports[0], "--ttft", "1.0", "--itl", "0.01"))
        stack.enter_context(replica("fast1", ports[1], *fast))
        stack.enter_context(replica("fast2", ports[2], *fast))
        gw = next(start := start_gateway(tmp_path, "", https=False, upstreams=upstreams))
        try:
            outcomes, joiner = load(gw, workers=6, seconds=5)
            joiner.start()
            joiner.join()
        finally:
            start.close()
    served = Counter(o.upstream for o in outcomes)
    assert all(o.whole for o in outcomes), [o for o in outcomes if not o.whole]
    assert served["slow"] >= 1, served
    assert served["slow"] * 3 < min(served["fast1"], served["fast2"]), served


def test_the_balancer_keeps_the_gateways_gate(tmp_path: Path) -> None:
    """The key and the route allowlist hold at the public entry, as on one Droplet."""
    port = free_port()
    with replica("r0", port):
        start = start_gateway(
            tmp_path, "", https=False, upstreams=[balancer.Upstream("127.0.0.1", port)]
        )
        gw = next(start)
        try:
            assert gw.get("/v1/models", key=None).status_code == 401
            assert gw.get("/v1/models", key="wrong").status_code == 401
            assert gw.get("/metrics").status_code == 404
            assert gw.get("/v1/../metrics").status_code == 404
            assert gw.get("/v1/models").status_code == 200
            assert gw.get("/health", key=None).status_code == 200
        finally:
            start.close()


def bench_through(gw: Gateway, tmp_path: Path, replicas: int) -> dict[str, Any]:
    """bench.py at concurrency 12 through the balancer; its one level."""
    out = tmp_path / f"bench-{replicas}.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "bench.py"), "--endpoint", gw.base, "--model", "nemotron",
         "--no-progress", "--concurrency", "12", "--requests", "48", "--max-tokens", str(TOKENS),
         "--replicas", str(replicas), "--json", str(out)],
        env={"PATH": os.environ["PATH"], "OPENAI_API_KEY": KEY, "HOME": str(tmp_path)},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    if replicas > 1:
        assert f"{replicas} replicas" in proc.stdout and "out tok/s/replica" in proc.stdout
    level: dict[str, Any] = json.loads(out.read_text())["levels"][0]
    return level


def test_bench_throughput_scales_with_the_replicas_behind_the_balancer(tmp_path: Path) -> None:
    """Each fake replica serves at most 4 streams at once (a full engine): behind the balancer,
    three of them carry about three times the tokens per second of one at the same load, and
    each replica's share stays what one alone does."""
    ports = [free_port() for _ in range(3)]
    levels = {}
    for count in (1, 3):
        with ExitStack() as stack:
            for i in range(count):
                stack.enter_context(
                    replica(f"r{i}", ports[i], "--capacity", "4", "--ttft", "0.05", "--itl", "0.02")
                )
            upstreams = [balancer.Upstream("127.0.0.1", p) for p in ports[:count]]
            (tmp_path / f"gw{count}").mkdir()
            start = start_gateway(tmp_path / f"gw{count}", "", https=False, upstreams=upstreams)
            gw = next(start)
            stack.callback(start.close)
            time.sleep(2 * balancer.HEALTH_INTERVAL_SECONDS)  # every replica checked healthy
            levels[count] = bench_through(gw, tmp_path, count)
    one, three = levels[1], levels[3]
    print(
        f"bench through Caddy: 1 replica {one['output_tokens_per_s']:.0f} tok/s, 3 replicas {three['output_tokens_per_s']:.0f} tok/s ({three['output_tokens_per_s_per_replica']:.0f} per replica)"
    )
    assert one["errors"] == 0 and three["errors"] == 0
    assert three["output_tokens_per_s"] > 2.2 * one["output_tokens_per_s"], (one, three)
    per_replica = three["output_tokens_per_s_per_replica"]
    assert per_replica > 0.7 * one["output_tokens_per_s"], (one, three)


def stats_of(port: int) -> dict[str, Any]:
    return requests.get(f"http://127.0.0.1:{port}/_stats", timeout=5).json()


def test_a_draining_replica_gets_no_new_request_across_balancer_reloads(tmp_path: Path) -> None:
    """Each reload makes Caddy take every upstream for healthy again until its checks fail twice
    (caddyserver/caddy PR #7625). Replica r1 drains under a steady stream of new requests; the
    balancer reloads twice (replica r2 joining, then a plain reload, as the gateway phase
    does): no request fails, and r1's vLLM sees no new request from the moment it drains, while
    those it was serving finish whole."""
    sock_dir = Path(tempfile.mkdtemp(prefix="nemo-admin-"))  # a socket path under 108 bytes
    ports = [free_port() for _ in range(3)]
    binds = [f"127.0.0.{2 + i}" for i in range(3)]  # each replica its own private address
    drains = [tmp_path / f"drain{i}" for i in range(3)]
    timing = ("--ttft", "0.05", "--itl", "0.02")
    raw = stack_config("dev")
    raw["replicas"] = 3
    raw["access"] = {**raw["access"], "https": False}
    cfg = config.parse(raw, "dev")
    assert cfg.balancer_kind == "caddy"
    folder = tmp_path / "upstreams"
    folder.mkdir()
    http_port = free_port()
    admin = sock_dir / "admin.sock"
    conf_text = gateway.balancer_site(
        cfg,
        "127.0.0.1",
        gateway.Listen(http_port=http_port, upstreams=f"{folder}/*.caddy", admin_socket=str(admin)),
    )
    base = f"http://127.0.0.1:{http_port}"

    def join(i: int, gw_port: int) -> None:
        up = balancer.Upstream(binds[i], gw_port)
        (folder / f"replica-{i}.caddy").write_text(balancer.upstream_line(up) + "\n")

    def reload() -> float:
        done = subprocess.run(
            [str(CADDY), "reload", "--config", str(tmp_path / "balancer" / "Caddyfile"),
             "--adapter", "caddyfile", "--address", f"unix/{admin}"],
            env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), gateway.API_KEY_ENV: KEY},
            capture_output=True, text=True, check=False, timeout=30,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return time.monotonic()

    with ExitStack() as stack:
        stack.callback(shutil.rmtree, sock_dir, ignore_errors=True)
        gw_ports = []
        for i in range(3):
            stack.enter_context(replica(f"r{i}", ports[i], *timing))
            drains[i].mkdir()
            listener = gateway.ReplicaListener(
                binds[i], free_port(), drain_dir=str(drains[i]), retry_elsewhere=True
            )
            stack.enter_context(
                contextlib.contextmanager(replica_gateway)(tmp_path / f"gw{i}", ports[i], listener)
            )
            gw_ports.append(listener.port)
        join(0, gw_ports[0])
        join(1, gw_ports[1])
        stack.enter_context(
            contextlib.contextmanager(run_caddy)(tmp_path / "balancer", conf_text, f"{base}/health")
        )
        time.sleep(2 * balancer.HEALTH_INTERVAL_SECONDS)  # both checked healthy
        gw = Gateway(base + "/v1", base, None, tmp_path / "balancer" / "caddy.log")
        outcomes, joiner = load(gw, workers=6, seconds=16)
        joiner.start()
        time.sleep(3)
        assert stats_of(ports[1])["chat_requests"] > 0, "r1 served before its drain"
        (drains[1] / catalog.DRAIN_FILE_NAME).touch()
        drained = time.monotonic()
        # After the checks saw it: a member joins (r2), then the gateway phase's reload.
        time.sleep(pool.notice_seconds(cfg))
        join(2, gw_ports[2])
        joined = reload()
        time.sleep(3)
        reloaded = reload()
        joiner.join()
        arrivals = stats_of(ports[1])["arrivals"]

    failed = [o for o in outcomes if not o.whole]
    assert not failed, failed
    # A request r1's gateway let in just before the file existed reaches its vLLM just after.
    late = [round(t - drained, 2) for t in arrivals if t > drained + 0.1]
    assert not late, f"r1's vLLM got new requests while draining, at +{late} s"
    after = [o for o in outcomes if o.started > joined]
    assert after and {o.upstream for o in after} <= {"r0", "r2"}, Counter(o.upstream for o in after)
    assert any(o.upstream == "r2" for o in after), "the replica that joined serves"
    assert any(o.started > reloaded for o in outcomes)
    # r1's streams already running when it drained finished whole (none failed above).
    assert any(o.upstream == "r1" and o.started < drained for o in outcomes)
