"""The balancer's rendered configuration, run in the real Caddy (the release the Droplet runs) in
front of three fake replicas on loopback, under a steady streamed load: a replica stopped and
started again, and replicas of unequal speed."""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import os
import shlex
import shutil
import socket
import subprocess
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
from urllib.parse import urlsplit

import fake_openai
import loopback
import nemodrop_cli
import openai
import pytest
import requests
from pulumi_harness import stack_config
from sandbox import CADDY, free_port
from test_gateway import KEY, Gateway, get_from, replica_gateway, run_caddy, start_gateway

from components.host import balancer, gateway, pool, router
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
            loopback.reset(self)

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
        [*nemodrop_cli.argv("bench"), "--endpoint", gw.base, "--model", "nemotron",
         "--no-progress", "--concurrency", "12", "--requests", "48", "--max-tokens", str(TOKENS),
         "--replicas", str(replicas), "--json", str(out)],
        env={"PATH": os.environ["PATH"], "OPENAI_API_KEY": KEY, "HOME": str(tmp_path)},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    if replicas > 1:
        assert f"{replicas} replicas" in proc.stdout and "/replica" in proc.stdout
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
    # Caddy's own balancing (the drain through the router: the rolling-update test below).
    cfg = routed_cfg("least-conn")
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


# --- The front with its router (balancer.routing: cache-aware), as a Droplet runs it: the real
# Caddy (balancer_site), the locked vllm-router (.router-venv) with router.py's flags on
# loopback, each replica's own gateway (replica_site, its private address, render for the
# front's address alone) in front of a fake vLLM that serves render (--scale-out).

ROUTER_BIN = Path(__file__).resolve().parent.parent / ".router-venv" / "bin" / "vllm-router"
needs_router = pytest.mark.skipif(
    not ROUTER_BIN.exists(), reason=".router-venv is missing: ./check installs the locked router"
)
ROUTINGS = [
    pytest.param("least-conn", id="least-conn"),
    pytest.param("cache-aware", id="cache-aware", marks=needs_router),
]
# The front's address as the replicas see it: the router dials them from loopback's own.
FRONT = "127.0.0.1"


def routed_cfg(routing: str, replicas: int = 3) -> config.StackConfig:
    raw = stack_config("dev")
    raw["replicas"] = replicas
    raw["access"] = {**raw["access"], "https": False}
    raw["balancer"] = {"routing": routing}
    cfg = config.parse(raw, "dev")
    assert cfg.balancer_kind == "caddy" and cfg.routing == routing
    return cfg


@dataclass
class Router:
    url: str
    metrics: str
    proc: subprocess.Popen[bytes]

    def running(self, worker: str) -> float | None:
        """The router's gauge of requests in flight to `worker` (None: not listed)."""
        want = f'{router.RUNNING_GAUGE}{{worker="{worker}"}}'
        for line in requests.get(self.metrics, timeout=5).text.splitlines():
            if line.startswith(want):
                return float(line.rsplit(" ", 1)[1])
        return None


def router_argv(port: int, metrics: int) -> list[str]:
    """router.args() as the unit runs them, with this test's binary and ports."""
    argv = [str(ROUTER_BIN), *router.args()[1:]]
    argv[argv.index("--port") + 1] = str(port)
    argv[argv.index("--prometheus-port") + 1] = str(metrics)
    return argv


@contextmanager
def router_process(
    argv: list[str], folder: Path, port: int
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`argv` (the router, or a script that runs it) in a session of its own, its log in
    `folder`; its URL once its /liveness answers on `port`; its whole group stopped after."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "router.log").open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={"PATH": os.environ["PATH"], "HOME": str(folder)})  # fmt: skip
    url = f"http://{router.HOST}:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{url}/liveness", timeout=2).status_code == 200:
                    break
            assert proc.poll() is None and time.monotonic() < deadline, (
                folder / "router.log"
            ).read_text()[-3000:]
            time.sleep(0.1)
        yield url, proc
    finally:
        # A background helper of the start script's included (it re-adds replicas).
        loopback.stop_group(proc, settle=0.5)


@contextmanager
def running_router(folder: Path, workers: list[str]) -> Iterator[Router]:
    port, metrics = free_port(), free_port()
    argv = router_argv(port, metrics) + (["--worker-urls", *workers] if workers else [])
    with router_process(argv, folder, port) as (url, proc):
        yield Router(url, f"http://{router.HOST}:{metrics}/metrics", proc)


def start_script_for(upstreams: Path, port: int, metrics: int, serving: Path) -> str:
    """router.start_script() as the unit runs it, with this test's binary, folder, ports and
    the file the router keeps while it serves."""
    text = router.start_script(str(upstreams))
    for flag, mine, theirs in (("--port", port, catalog.ROUTER_PORT),
                               ("--prometheus-port", metrics, catalog.ROUTER_METRICS_PORT)):  # fmt: skip
        assert f" {flag} {theirs} " in text
        text = text.replace(f" {flag} {theirs} ", f" {flag} {mine} ")
    text = text.replace(router.ADDRESS, f"{router.HOST}:{port}")
    assert router.BIN in text and router.SERVING_FILE in text
    return text.replace(router.BIN, str(ROUTER_BIN)).replace(router.SERVING_FILE, str(serving))


def unit_commands(key: str, script: Path, serving: Path) -> list[list[str]]:
    """The router unit's `key=` lines (ExecStartPost, ExecStop), in order, as this test runs
    them: its start script and serving file for the unit's."""
    found = []
    for line in router.unit_text().splitlines():
        if line.startswith(f"{key}="):
            argv = shlex.split(line.split("=", 1)[1])
            argv = [str(script) if a == router.START_SCRIPT else a for a in argv]
            found.append([a.replace(router.SERVING_FILE, str(serving)) for a in argv])
    return found


@dataclass
class Member:
    """One replica: its fake vLLM's port, its gateway's private address and drain folder."""

    name: str
    vllm_port: int
    listener: gateway.ReplicaListener
    stop: contextlib.ExitStack

    @property
    def dial(self) -> str:
        return f"{self.listener.bind}:{self.listener.port}"

    @property
    def url(self) -> str:
        return f"http://{self.dial}"

    def stats(self) -> dict[str, Any]:
        return stats_of(self.vllm_port)

    def drain(self) -> None:
        (Path(self.listener.drain_dir) / catalog.DRAIN_FILE_NAME).touch()

    def undrain(self) -> None:
        (Path(self.listener.drain_dir) / catalog.DRAIN_FILE_NAME).unlink()


@dataclass
class RoutedSet:
    """The front (its Caddy, and its router with cache-aware) before its replicas."""

    cfg: config.StackConfig
    folder: Path
    members: list[Member]
    gw: Gateway
    admin: Path
    router: Router | None
    timing: tuple[str, ...]
    # With the router: the file it keeps while it serves (router.SERVING_FILE).
    serving: Path | None = None

    def router_unit(self, key: str) -> None:
        """The router unit's `key=` commands (ExecStartPost, ExecStop), run as systemd runs
        them, against this set's router: its start script on this set's ports and file."""
        assert self.router is not None and self.serving is not None
        script = self.folder / "router-start"
        port = urlsplit(self.router.url).port
        metrics = urlsplit(self.router.metrics).port
        assert port and metrics
        script.write_text(start_script_for(self.folder / "upstreams", port, metrics, self.serving))
        script.chmod(0o755)
        for argv in unit_commands(key, script, self.serving):
            done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=90,
                                  env={"PATH": os.environ["PATH"]})  # fmt: skip
            assert done.returncode == 0, (argv, done.stderr)

    def start_member(self, i: int) -> None:
        """Replica i's fake vLLM (render served, as with --enable-scale-out) and its gateway."""
        m = self.members[i]
        stop = contextlib.ExitStack()
        stop.enter_context(replica(m.name, m.vllm_port, "--scale-out", *self.timing))
        stop.enter_context(
            contextlib.contextmanager(replica_gateway)(
                self.folder / f"gw{i}-{time.monotonic_ns()}", m.vllm_port, m.listener
            )
        )
        m.stop = stop

    def kill_member(self, i: int) -> None:
        """What a crash does: its vLLM and its gateway gone at once, nothing drained."""
        self.members[i].stop.close()

    def upstream_file(self, i: int) -> Path:
        return self.folder / "upstreams" / f"replica-{i}.caddy"

    def join(self, i: int) -> None:
        """member.sh's join: the upstream file, a graceful reload, the router's add_worker,
        then the join mark (the front's waker reads it)."""
        up = balancer.Upstream(self.members[i].listener.bind, self.members[i].listener.port)
        self.upstream_file(i).write_text(balancer.upstream_line(up) + "\n")
        self.reload()
        if self.router:
            r = requests.post(f"{self.router.url}/add_worker",
                              params={"url": router.worker_url(up.dial)}, timeout=70)  # fmt: skip
            assert r.status_code == 200 or "already exists" in r.text, r.text
        self.joined_file(i).write_text(balancer.upstream_line(up) + "\n")

    def joined_file(self, i: int) -> Path:
        return self.folder / "upstreams" / f"replica-{i}.caddy{catalog.BALANCER_JOINED_SUFFIX}"

    def leave(self, i: int) -> None:
        """member.sh's leave: the file removed, a reload, the router's remove_worker, then the
        wait for its requests in flight (the router's gauge, else Caddy's own count). The join
        mark goes first."""
        self.joined_file(i).unlink(missing_ok=True)
        self.upstream_file(i).unlink()
        self.reload()
        worker = router.worker_url(self.members[i].dial)
        if self.router:
            r = requests.post(f"{self.router.url}/remove_worker", params={"url": worker},
                              timeout=10)  # fmt: skip
            assert r.status_code == 200, r.text
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.router:
                n = self.router.running(worker)
            else:
                ups = caddy_upstreams(self.admin)
                n = next((u["num_requests"] for u in ups
                          if u["address"] == self.members[i].dial), None)  # fmt: skip
            if not n:
                return
            time.sleep(0.2)
        raise AssertionError(f"replica {i} still had requests in flight")

    def reload(self) -> None:
        done = subprocess.run(
            [str(CADDY), "reload", "--config", str(self.folder / "front" / "Caddyfile"),
             "--adapter", "caddyfile", "--address", f"unix/{self.admin}"],
            env={"PATH": os.environ["PATH"], "HOME": str(self.folder), gateway.API_KEY_ENV: KEY},
            capture_output=True, text=True, check=False, timeout=30,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr


def caddy_upstreams(admin: Path) -> list[dict[str, Any]]:
    """Caddy's admin API over its unix socket: each upstream and its requests in flight."""

    class Conn(http.client.HTTPConnection):
        def connect(self) -> None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(5)
            self.sock.connect(str(admin))

    conn = Conn("localhost", timeout=5)
    try:
        conn.request("GET", "/reverse_proxy/upstreams")
        found: list[dict[str, Any]] = json.loads(conn.getresponse().read()) or []
        return found
    finally:
        conn.close()


@contextmanager
def routed_set(
    tmp_path: Path,
    routing: str,
    replicas: int = 3,
    timing: tuple[str, ...] = ("--ttft", "0.05", "--itl", "0.02"),
) -> Iterator[RoutedSet]:
    """`replicas` replicas joined, behind the front rendered for `routing`, all checked healthy."""
    cfg = routed_cfg(routing, replicas)
    sock_dir = Path(tempfile.mkdtemp(prefix="nemo-admin-"))  # a socket path under 108 bytes
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, sock_dir, ignore_errors=True)
        folder = tmp_path / "upstreams"
        folder.mkdir()
        members = []
        for i in range(replicas):
            drain = tmp_path / f"drain{i}"
            drain.mkdir()
            listener = gateway.ReplicaListener(
                f"127.0.0.{2 + i}", free_port(), drain_dir=str(drain), retry_elsewhere=True,
                render_client=FRONT if routing == "cache-aware" else "",
            )  # fmt: skip
            members.append(Member(f"r{i}", free_port(), listener, contextlib.ExitStack()))
        http_port = free_port()
        base = f"http://127.0.0.1:{http_port}"
        admin = sock_dir / "admin.sock"
        s = RoutedSet(cfg, tmp_path, members, Gateway(base + "/v1", base, None,
                      tmp_path / "front" / "caddy.log"), admin, None, timing)  # fmt: skip
        for i in range(replicas):
            s.start_member(i)
            stack.callback(lambda i=i: s.members[i].stop.close())
            up = balancer.Upstream(members[i].listener.bind, members[i].listener.port)
            s.upstream_file(i).write_text(balancer.upstream_line(up) + "\n")
        listen = gateway.Listen(http_port=http_port, upstreams=f"{folder}/*.caddy",
                                admin_socket=str(admin))  # fmt: skip
        if routing == "cache-aware":
            s.router = stack.enter_context(
                running_router(tmp_path / "router", [m.url for m in members])
            )
            # What the unit does once the router answers: the file Caddy routes to it by.
            s.serving = tmp_path / "router-run" / "serving"
            s.serving.parent.mkdir()
            s.router_unit("ExecStartPost")
            assert s.serving.exists()
            listen = dataclasses.replace(
                listen, router=s.router.url.removeprefix("http://"), router_serving=str(s.serving)
            )
        text = gateway.balancer_site(cfg, "127.0.0.1", listen)
        stack.enter_context(
            contextlib.contextmanager(run_caddy)(tmp_path / "front", text, f"{base}/health")
        )
        time.sleep(2 * balancer.HEALTH_INTERVAL_SECONDS)  # every replica checked healthy
        yield s


def chat_client(s: RoutedSet, retries: int = 0) -> openai.OpenAI:
    """The official client; by default with no retry of its own, so a request that fails is
    counted failed. `retries`: the client's own default is 2, which also resends a request that
    got no answer at all: a kept-alive connection the front's Caddy closed at a graceful reload
    (every join and leave makes one) as the client reused it."""
    return openai.OpenAI(base_url=s.gw.base, api_key=KEY, max_retries=retries, timeout=30)


def chat_load(
    s: RoutedSet, workers: int, stop: threading.Event, stream: bool = False, retries: int = 0
) -> tuple[list[str], list[str], threading.Thread]:
    """`workers` clients sending chat completions back to back through the official client until
    `stop`: the replicas that answered (by the fake's name in the answer's model... its id),
    the errors, and a thread to join."""
    served: list[str] = []
    errors: list[str] = []
    client = chat_client(s, retries)

    def one(n: int) -> None:
        # Its own first word: no prefix shared with another request, so the cache-aware
        # router spreads them by load as least_conn does (a shared first word matched a third
        # of each prompt, over its 0.3 threshold, and could keep a replica idle).
        messages = [{"role": "user", "content": f"{n} {time.monotonic_ns()} request"}]
        try:
            if stream:
                chunks = client.chat.completions.create(model="nemotron", messages=messages,
                                                        max_tokens=TOKENS, stream=True)  # fmt: skip
                text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            else:
                answer = client.chat.completions.create(model="nemotron", messages=messages,
                                                        max_tokens=TOKENS)  # fmt: skip
                text = answer.choices[0].message.content or ""
            served.append(text)
        except openai.OpenAIError as err:
            errors.append(f"{type(err).__name__}: {err}")

    def worker(w: int) -> None:
        n = 0
        while not stop.is_set():
            one(w * 100_000 + n)
            n += 1

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(workers)]
    for t in threads:
        t.start()

    def join() -> None:
        for t in threads:
            t.join()

    return served, errors, threading.Thread(target=join)


@pytest.mark.parametrize("routing", ROUTINGS)
def test_a_replica_killed_under_load_fails_no_request(tmp_path: Path, routing: str) -> None:
    """A replica's Droplet dies (its vLLM and its gateway at once, nothing drained) while the
    official client sends chat completions through the front: every request it held before
    any byte came back is resent (the router's retries stay on it: Caddy resends to the
    router, which has taken it out by then), and new ones go to the others. Zero failures."""
    with routed_set(tmp_path, routing) as s:
        stop = threading.Event()
        served, errors, joiner = chat_load(s, workers=6, stop=stop)
        time.sleep(3)
        # The busiest replica dies (cache-aware may have kept these prompts off one replica).
        before, victim = max((m.stats()["chat_requests"], i) for i, m in enumerate(s.members))
        s.kill_member(victim)
        killed = len(served) + len(errors)
        time.sleep(10)
        stop.set()
        joiner.start()
        joiner.join()
    print(f"kill under load ({routing}): {len(served) + len(errors)} requests, {len(errors)} "
          f"failed, {killed} before the kill; the one killed had served {before}")  # fmt: skip
    assert before > 0, "the replica killed was serving"
    assert len(served) + len(errors) > killed + 20, "requests kept flowing after the kill"
    assert not errors, errors[:5]


@pytest.mark.parametrize("routing", ROUTINGS)
def test_a_rolling_update_through_the_front_fails_no_request(tmp_path: Path, routing: str) -> None:
    """Each replica in turn, as the pipeline rolls them: it drains (its gateway's /health 503,
    new requests bounced), leaves (member.sh: its file, a reload, the router's remove_worker,
    the wait for its requests in flight), stops, starts again and joins (file, reload,
    add_worker). Streams through the official client meanwhile: none fails, and a draining
    replica's vLLM gets no new request from the moment it drains."""
    with routed_set(tmp_path, routing) as s:
        stop = threading.Event()
        # Streams, through the client as users run it (its 2 retries of a request that got
        # no answer: the reloads of each join and leave close kept-alive connections, and the
        # full suite under load once saw a "Connection error" with retries off, most likely that). A
        # stream cut once its answer began is never retried by the client: it counts failed.
        served, errors, joiner = chat_load(s, workers=6, stop=stop, stream=True, retries=2)
        late: dict[str, list[float]] = {}
        for i in (1, 2):
            time.sleep(2)
            m = s.members[i]
            assert m.stats()["chat_requests"] > 0, f"{m.name} served before its drain"
            m.drain()
            drained = time.monotonic()
            time.sleep(pool.notice_seconds(s.cfg))
            s.leave(i)
            arrivals = m.stats()["arrivals"]
            late[m.name] = [round(t - drained, 2) for t in arrivals if t > drained + 0.1]
            s.kill_member(i)
            time.sleep(1)
            s.start_member(i)
            m.undrain()
            s.join(i)
        time.sleep(4)
        stop.set()
        joiner.start()
        joiner.join()
        after = {m.name: m.stats()["chat_requests"] for m in s.members}
        listed = requests.get(f"{s.router.url}/list_workers", timeout=5).text if s.router else ""
    total = len(served) + len(errors)
    print(f"rolling update ({routing}): {total} streamed requests, {len(errors)} failed; "
          f"served since each restart {after}")  # fmt: skip
    assert not errors, errors[:5]
    assert total > 100
    assert all(not t for t in late.values()), f"new requests reached a draining vLLM: {late}"
    # Both restarted replicas are back in: Caddy's upstreams, the router's workers.
    assert after["r1"] > 0 and after["r2"] > 0, after
    if routing == "cache-aware":
        assert all(m.url in listed for m in s.members), listed


def failed_looks(log: Path) -> Counter[str]:
    """The front's Caddy's active health checks that failed, per replica (host:port), from its
    log (healthchecks.go logs each at INFO: a request that failed or timed out, a status)."""
    failed: Counter[str] = Counter()
    for line in log.read_text().splitlines():
        if "health_checker.active" in line:
            entry = json.loads(line)
            if entry.get("msg") in ("HTTP request failed", "unexpected status code"):
                failed[entry["host"]] += 1
    return failed


def router_health(r: Router) -> dict[str, bool]:
    """The router's view of each replica: healthy by its own checks (GET /workers)."""
    workers = requests.get(f"{r.url}/workers", timeout=5).json()["workers"]
    return {w["url"]: w["is_healthy"] for w in workers}


def generate_long(m: Member) -> None:
    """A generation of 40 s sent to replica `m`'s vLLM itself (ended early when it stops)."""
    body = {"model": "nemotron", "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 2000}  # fmt: skip
    with contextlib.suppress(requests.RequestException):
        requests.post(f"http://127.0.0.1:{m.vllm_port}/v1/chat/completions", json=body,
                      headers={"Authorization": f"Bearer {KEY}"}, timeout=60)  # fmt: skip


# How long a busy replica's /health takes here: over the 2 s the checks allowed before.
SLOW_LOOK_SECONDS = 4


@pytest.mark.parametrize("routing", ROUTINGS)
def test_a_replica_slow_under_load_stays_in_and_a_dead_one_leaves(
    tmp_path: Path, routing: str
) -> None:
    """A saturated vLLM answers /health late (its API server busy: llm-d-benchmark PR #1734, a
    saturated vLLM missing 1 s probes; ray-project/ray #54070, over 10 s): a slow look must not
    read as gone, or the front ejects every busy replica at once. Replicas whose /health takes
    SLOW_LOOK_SECONDS while they serve, under steady load through the front: no look of the
    front's Caddy fails, the router keeps every replica healthy, no request fails. Then one
    dies: its looks fail at once (refused), and Caddy and the router both take it out."""
    timing = ("--ttft", "0.05", "--itl", "0.02", "--tokens", "2000",
              "--busy-answer-delay", str(SLOW_LOOK_SECONDS))  # fmt: skip
    with routed_set(tmp_path, routing, timing=timing) as s:
        # Each replica busy with a long generation of its own (40 s) whatever the front sends
        # it: its /health stays slow (a saturated engine does not empty when the front stops).
        busy = [threading.Thread(target=generate_long, args=(m,), daemon=True) for m in s.members]
        for t in busy:
            t.start()
        stop = threading.Event()
        served, errors, joiner = chat_load(s, workers=6, stop=stop)
        # The router's view of the replicas, every half second while they are slow.
        seen_out: set[str] = set()
        until = time.monotonic() + 4 * SLOW_LOOK_SECONDS
        while time.monotonic() < until:
            if s.router:
                seen_out |= {url for url, ok in router_health(s.router).items() if not ok}
            time.sleep(0.5)
        slow_failed = failed_looks(s.gw.log)
        served_slow, failed_slow = len(served), len(errors)
        dead = s.members[2]
        s.kill_member(2)
        killed = time.monotonic()
        out_after = None
        while out_after is None and time.monotonic() < killed + 45:
            time.sleep(0.5)
            failed = failed_looks(s.gw.log)[dead.dial] - slow_failed[dead.dial]
            out_of_caddy = failed >= balancer.HEALTH_FAILS
            out_of_router = s.router is None or router_health(s.router)[dead.url] is False
            if out_of_caddy and out_of_router:
                out_after = round(time.monotonic() - killed, 1)
        stop.set()
        joiner.start()
        joiner.join()
    print(f"slow looks ({routing}): {served_slow} served, {failed_slow} failed while slow; "
          f"the dead replica out after {out_after} s; {len(errors)} failed in all")  # fmt: skip
    assert not slow_failed, f"slow looks read as failures: {slow_failed}"
    assert not seen_out, f"the router took slow replicas out: {seen_out}"
    assert served_slow > 50 and not errors, errors[:5]
    assert out_after is not None, "the dead replica was not taken out within 45 s"


# A valid body for each POST route of the gate (the model's name added).
ROUTE_BODIES: dict[str, dict[str, Any]] = {
    "chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    "completions": {"prompt": "hi", "max_tokens": 2},
    "responses": {"input": "hi", "max_output_tokens": 2},
    "embeddings": {"input": "hi"},
}


@pytest.mark.parametrize("routing", ROUTINGS)
def test_every_route_the_gate_admits_answers_through_the_front(
    tmp_path: Path, routing: str
) -> None:
    """Each route of the gate (gateway.API_ROUTES, which its URI pattern is made of), sent with
    the key through the front to replicas whose gateways require it, answers as a replica's
    vLLM itself answers it with the key (a stored response's lookup and cancel: vLLM's 404, it
    keeps none by default), never a 401, and no replica saw it without the key. With
    cache-aware, vllm-router 0.1.17 forwards POST /v1/responses without the client's
    Authorization (server.rs v1_responses -> route_transparent): the replica's gate said 401."""
    with routed_set(tmp_path, routing, replicas=2) as s:
        answers = every_route(s)
        unkeyed = [c for m in s.members for c in m.stats()["api_calls"] if not c[2]]
    wrong = {route: got for route, got in answers.items() if got[0] != got[1] or got[0] == 401}
    assert not wrong, f"(front, vLLM itself) per route: {wrong}"
    assert not unkeyed, unkeyed


def every_route(s: Any) -> dict[str, tuple[int, int]]:
    """Each route the gate admits (gateway.API_ROUTES), with the key, through the front and to
    the first replica's vLLM itself: "METHOD path" -> (the front's status, vLLM's)."""
    auth = {"Authorization": f"Bearer {KEY}"}
    vllm = f"http://127.0.0.1:{s.members[0].vllm_port}"
    answers = {}
    for method, template in gateway.API_ROUTES:
        path, body = route_request(method, template)
        direct = requests.request(method, vllm + path, headers=auth, json=body, timeout=30)
        front = s.gw.request(method, path, json=body)
        answers[f"{method} {path}"] = (front.status_code, direct.status_code)
    return answers


def route_request(method: str, template: str) -> tuple[str, dict[str, Any] | None]:
    """A gate's route (gateway.API_ROUTES) as a request: its path and its body."""
    path = "/v1/" + template.replace("{id}", "resp_0123abc")
    if method == "POST" and "{id}" not in template:
        return path, {"model": "nemotron", **ROUTE_BODIES[template]}
    return path, None


ROUTER_ADMIN = [
    ("POST", "/add_worker?url=http://203.0.113.9:80"),
    ("POST", "/remove_worker?url=http://127.0.0.2:1"),
    ("GET", "/list_workers"),
    ("GET", "/workers"),
    ("POST", "/workers"),
    ("POST", "/flush_cache"),
    ("GET", "/get_loads"),
    ("GET", "/metrics"),
    ("GET", "/scheduling/diagnostics"),
    ("POST", "/finish_session?session_id=x"),
    ("GET", "/readiness"),
    ("GET", "/liveness"),
    ("GET", "/get_server_info"),
    ("GET", "/health_generate"),
]


@needs_router
def test_the_router_path_keeps_the_gate_at_both_hops(tmp_path: Path) -> None:
    """Through the front with its router: no key is the front's 401, the router's admin routes
    are the front's 404 (key or not) and none reached the router; a wrong key sent straight to
    a replica's gateway is refused there too; render answers the front's address alone, with
    the key; what --enable-scale-out opens besides stays 404 at the replica; no
    Access-Control-Allow-Origin reaches a client."""
    with routed_set(tmp_path, "cache-aware", replicas=2) as s:
        assert s.router is not None
        gw, r0 = s.gw, s.members[0]
        workers_before = requests.get(f"{s.router.url}/list_workers", timeout=5).text
        assert gw.get("/v1/models", key=None).status_code == 401
        assert gw.get("/v1/models", key="wrong").status_code == 401
        assert gw.post("/v1/chat/completions", key=None, json={}).status_code == 401
        for method, target in ROUTER_ADMIN:
            for key in (None, KEY):
                status = requests.request(
                    method, gw.url + target, timeout=10,
                    headers={"Authorization": f"Bearer {key}"} if key else {},
                ).status_code  # fmt: skip
                assert status == 404, (method, target, key, status)
        assert requests.get(f"{s.router.url}/list_workers", timeout=5).text == workers_before
        # The replica's own gate: a wrong key or none refused even on its private address.
        for key in (None, "wrong"):
            status, _ = get_from(FRONT, r0.url, "/v1/models", key=key)
            assert status == 401, (key, status)
        # Render: the front's address with the key; from elsewhere 403, key or not.
        chat = {"model": "nemotron", "messages": [{"role": "user", "content": "hi"}]}
        for path in gateway.RENDER_PATHS:
            body = chat if "chat" in path else {"model": "nemotron", "prompt": "hi"}
            assert post_from("127.0.0.9", r0.url, path, body)[0] == 403
            assert post_from("127.0.0.9", r0.url, path, body, key=None)[0] == 403
            assert post_from(FRONT, r0.url, path, body, key="wrong")[0] == 401
            assert gw.post(path, json=body).status_code == 404
        status, text = post_from(FRONT, r0.url, "/v1/chat/completions/render", chat)
        assert status == 200 and "token_ids" in text, (status, text)
        for path in ("/v1/chat/completions/render?x=1", "/inference/v1/generate",
                     "/inference/v1/abort_requests", "/v1/chat/completions/derender",
                     "/v1/responses/render", "/v1/responses/derender",
                     "/v1/messages/render", "/tokenize"):  # fmt: skip
            assert post_from(FRONT, r0.url, path, chat)[0] == 404, path
            # At the front /v1/responses/render looks like a stored response's id to the gate:
            # it reaches the router, which has no such POST route (405), never a replica.
            assert gw.post(path, json=chat).status_code in (404, 405), path
        # The router allows any origin; the front removes it from every answer.
        direct = requests.get(f"{s.router.url}/liveness", timeout=5)
        assert direct.headers.get("Access-Control-Allow-Origin") == "*", "the router adds it"
        for r in (
            gw.get("/v1/models", headers={"Origin": "https://evil.example"}),
            gw.post(
                "/v1/chat/completions",
                json={**chat, "max_tokens": 2},
                headers={"Origin": "https://evil.example"},
            ),
            gw.post("/v1/chat/completions", json={**chat, "max_tokens": 2, "stream": True}),
        ):
            assert r.status_code == 200, r.text
            assert "Access-Control-Allow-Origin" not in r.headers, r.headers
        # Both hops saw the request: the router asked each replica to render it, with the key.
        renders = [m.stats()["render_auth"] for m in s.members]
        assert all(f"Bearer {KEY}" in seen for seen in renders), renders


def post_from(
    source: str, url: str, path: str, body: dict[str, Any], key: str | None = KEY
) -> tuple[int, str]:
    """POST `body` as JSON to `path` with the connection's source address `source`."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(
        parts.hostname or "", parts.port, timeout=10, source_address=(source, 0)
    )
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    try:
        conn.request("POST", path, body=json.dumps(body), headers=headers)
        r = conn.getresponse()
        return r.status, r.read().decode(errors="replace")
    finally:
        conn.close()
