"""Measure the scale-to-zero front on loopback (issue 35), with the program's own Caddyfiles, the
pinned Caddy, the real waker and tests/support/fake_openai.py as vLLM:

    .venv/bin/python tests/support/front_bench.py latency [--requests 300]
    .venv/bin/python tests/support/front_bench.py memory [--held 500] [--body-bytes 8000]

`latency`: the front awake (the balancer site with wake on, no hold file, the waker running)
in front of one replica's gateway (the replica site) in front of the fake vLLM; the same small
keyed chat completion, one at a time on a kept-alive connection, alternately straight to the
replica's gateway and through the front. Prints p50/p95 of each and what the front adds.

`memory`: the front asleep (the hold file, the waker with a webhook trigger that answers and
brings no replica), `--held` keyed requests with bodies of about `--body-bytes` sent at once
through Caddy; once the waker says it holds them all, the resident memory of the waker and of
Caddy, against their resident memory before.

One JSON line on stdout. Everything listens on 127.0.0.1 and lives in a temporary folder that
is removed at the end, processes included. The numbers depend on the machine: they are reported,
never judged here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Coroutine, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import requests

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from pulumi_harness import stack_config  # noqa: E402
from sandbox import CADDY, free_port  # noqa: E402
from script_module import package_command  # noqa: E402

from components.host import gateway, wake  # noqa: E402
from components.spec import catalog, config  # noqa: E402

KEY = "sk-front-bench-0123456789"  # a key for this loopback run alone
CHAT = {"model": "nemotron", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
FAKE = ROOT / "tests" / "support" / "fake_openai.py"
WAKER = ROOT / "scripts" / "phases" / "wake"
T = TypeVar("T")


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) by the nearest-rank method."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))]


def compare(direct: str, via: str, requests_each: int) -> dict[str, Any]:
    """The same keyed chat completion, alternately to `direct` and `via` (base URLs), one at a
    time on a kept-alive connection each: their latencies (ms) and what `via` adds."""
    times: dict[str, list[float]] = {"direct": [], "via": []}
    with requests.Session() as near, requests.Session() as far:
        for session, url in ((near, direct), (far, via)):  # warm: a connection each
            session.post(f"{url}/v1/chat/completions", json=CHAT, timeout=30,
                         headers={"Authorization": f"Bearer {KEY}"}).raise_for_status()  # fmt: skip
        for _ in range(requests_each):
            for name, session, url in (("direct", near, direct), ("via", far, via)):
                started = time.perf_counter()
                answer = session.post(f"{url}/v1/chat/completions", json=CHAT, timeout=30,
                                      headers={"Authorization": f"Bearer {KEY}"})  # fmt: skip
                answer.raise_for_status()
                times[name].append((time.perf_counter() - started) * 1000)
    out: dict[str, Any] = {"requests": requests_each}
    for name, values in times.items():
        out[name] = {"p50_ms": round(percentile(values, 50), 2),
                     "p95_ms": round(percentile(values, 95), 2),
                     "mean_ms": round(statistics.fmean(values), 2)}  # fmt: skip
    out["added"] = {k: round(out["via"][k] - out["direct"][k], 2) for k in out["via"]}
    return out


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class Processes:
    """The processes of one run, stopped (and waited for) at the end, whatever happens."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.procs: list[subprocess.Popen[str]] = []
        self.env = {"PATH": os.environ["PATH"], "HOME": str(folder), gateway.API_KEY_ENV: KEY,
                    "XDG_DATA_HOME": str(folder / "data"),
                    "XDG_CONFIG_HOME": str(folder / "config"),
                    "FAKE_OPENAI_API_KEY": KEY}  # fmt: skip

    def start(self, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        log = (self.folder / f"proc{len(self.procs)}.log").open("w")
        proc = subprocess.Popen(argv, env=env or self.env, stdout=log, stderr=subprocess.STDOUT,
                                text=True)  # fmt: skip
        self.procs.append(proc)
        return proc

    def fake_vllm(self, ttft: float = 0) -> int:
        """The fake vLLM, answering a one-token completion after `ttft` seconds: its port."""
        port = free_port()
        self.start([sys.executable, str(FAKE), "--port", str(port), "--ttft", str(ttft),
                    "--itl", "0", "--tokens", "1"])  # fmt: skip
        wait_http(f"http://127.0.0.1:{port}/health")
        return port

    def caddy(self, name: str, caddyfile: str, probe: str) -> subprocess.Popen[str]:
        conf = self.folder / f"{name}.caddyfile"
        conf.write_text(caddyfile)
        proc = self.start([str(CADDY), "run", "--config", str(conf), "--adapter", "caddyfile"])
        wait_http(probe)
        return proc

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_http(url: str, seconds: float = 20) -> None:
    end = time.monotonic() + seconds
    while True:
        try:
            requests.get(url, timeout=2)
            return
        except requests.RequestException:
            if time.monotonic() > end:
                raise
            time.sleep(0.1)


@contextlib.contextmanager
def processes(
    folder: Path | None = None, kind: type[Processes] | None = None
) -> Iterator[Processes]:
    """A run's processes and files, in `folder` (a test's own) or a temporary one; `kind`: a
    Processes of another harness's (router_bench's)."""
    with contextlib.ExitStack() as stack:
        if folder is None:
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="front-bench-")))
        procs = (kind or Processes)(folder)
        try:
            yield procs
        finally:
            procs.stop()


def front_cfg() -> config.StackConfig:
    raw = stack_config("dev")
    raw["access"] = {**raw["access"], "https": False}
    raw["wake"] = {"enabled": True, "githubRepo": "me/llm", "token": "x"}
    return config.parse(raw, "dev", frozenset({"wake"}))


def start_front(p: Processes, upstreams: list[int], hook: str) -> dict[str, Any]:
    """The waker (its settings as rendered, a webhook trigger to `hook`, loopback paths) and the
    front's Caddy; `upstreams`: the replica gateways' ports that have joined."""
    folder = p.folder / "front"
    (folder / "upstreams").mkdir(parents=True)
    for i, port in enumerate(upstreams):
        # Joined before the front's Caddy starts (as after a reboot): each file and its join
        # mark (member.sh), which the Caddy started below reads.
        for name in (f"r{i}.caddy", f"r{i}.caddy{catalog.BALANCER_JOINED_SUFFIX}"):
            (folder / "upstreams" / name).write_text(f"to 127.0.0.1:{port}\n")
    (folder / "token").write_text("front-bench-token\n")
    waker_port = free_port()
    rendered = dict(line.split("=", 1) for line in wake.env_text(front_cfg()).splitlines())
    command, run_env = package_command(WAKER)
    env = {**rendered, **run_env, "PATH": os.environ["PATH"], "WAKE_LISTEN": f"127.0.0.1:{waker_port}",
           "WAKE_UPSTREAMS_DIR": str(folder / "upstreams"), "WAKE_HOLD_FILE": str(folder / "hold"),
           "WAKE_STATE_FILE": str(folder / "state.json"), "WAKE_TRIGGER": "webhook",
           "WAKE_WEBHOOK_URL": hook, "WAKE_WEBHOOK_HEADER": "X-Wake-Token",
           "WAKE_TOKEN_FILE": str(folder / "token")}  # fmt: skip
    waker = p.start(command, env)
    wait_http(f"http://127.0.0.1:{waker_port}/health")
    listen = gateway.Listen(http_port=free_port(), https_port=free_port(), admin_socket=None,
                            upstreams=f"{folder}/upstreams/*.caddy",
                            waker=f"127.0.0.1:{waker_port}", wake_hold_file=str(folder / "hold"))  # fmt: skip
    url = f"http://127.0.0.1:{listen.http_port}"
    caddy = p.caddy("front", gateway.balancer_site(front_cfg(), "front.example", listen),
                    f"{url}/health")  # fmt: skip
    return {"url": url, "waker": waker, "waker_url": f"http://127.0.0.1:{waker_port}",
            "caddy": caddy}  # fmt: skip


def replica(p: Processes) -> str:
    """One replica's gateway (the replica site, as the gateway phase renders it for a set
    behind the Caddy balancer) in front of the fake vLLM: its base URL."""
    raw = stack_config("dev")
    raw["replicas"] = 2
    raw["access"] = {**raw["access"], "https": False}
    listener = gateway.ReplicaListener("127.0.0.1", free_port(), drain_dir=str(p.folder),
                                       retry_elsewhere=True)  # fmt: skip
    text = gateway.replica_site(config.parse(raw, "dev"), listener,
                                gateway.Listen(upstream_port=p.fake_vllm(), admin_socket=None))  # fmt: skip
    url = f"http://127.0.0.1:{listener.port}"
    p.caddy("replica", text, f"{url}/health")
    return url


def measure_latency(requests_each: int, folder: Path | None = None) -> dict[str, Any]:
    with processes(folder) as p:
        direct = replica(p)
        front = start_front(p, [int(direct.rsplit(":", 1)[1])], "http://127.0.0.1:9/unused")
        end = time.monotonic() + 20  # the front's active health checks pass the replica
        while requests.get(f"{front['url']}/health", timeout=5).status_code != 200:
            assert time.monotonic() < end, "the front never found its replica ready"
            time.sleep(0.2)
        return {"measure": "latency", **compare(direct, front["url"], requests_each)}


class Hook(BaseHTTPRequestHandler):
    """The wake's webhook: accepted, and no replica ever comes."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *_: Any) -> None:
        pass


async def held_rss(front: dict[str, Any], count: int, body_bytes: int) -> dict[str, int]:
    """`count` keyed requests at once through the front; once the waker holds them all, the
    resident memory (KiB) of the waker and of Caddy; then they are let go."""
    body = json.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * body_bytes}]})
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one() -> None:
            with contextlib.suppress(aiohttp.ClientError):
                async with session.post(f"{front['url']}/v1/chat/completions", data=body,
                                        headers=headers) as answer:  # fmt: skip
                    await answer.read()

        tasks = [asyncio.ensure_future(one()) for _ in range(count)]
        state = f"{front['waker_url']}{wake.CONTROL_PATH}"
        end = time.monotonic() + 60
        while (await asyncio.to_thread(requests.get, state, timeout=5)).json()["held"] < count:
            assert time.monotonic() < end, "the waker never held them all"
            await asyncio.sleep(0.2)
        rss = {"waker": rss_kib(front["waker"].pid), "caddy": rss_kib(front["caddy"].pid)}
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return rss


def run(coro: Coroutine[Any, Any, T]) -> T:
    """`coro` on a loop of its own: unlike asyncio.run, it leaves the thread's current loop as
    it was (Pulumi's mocks, in the same test process, ask for it)."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


def measure_memory(count: int, body_bytes: int, folder: Path | None = None) -> dict[str, Any]:
    hook = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    try:
        with processes(folder) as p:
            front = start_front(p, [], f"http://127.0.0.1:{hook.server_address[1]}/wake")
            before = {"waker": rss_kib(front["waker"].pid), "caddy": rss_kib(front["caddy"].pid)}
            held = run(held_rss(front, count, body_bytes))
    finally:
        hook.shutdown()
        hook.server_close()
    return {"measure": "memory", "held": count, "body_bytes": body_bytes,
            "rss_kib_before": before, "rss_kib_held": held,
            "rss_kib_added": {k: held[k] - before[k] for k in held}}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="measure", required=True)
    lat = sub.add_parser("latency", help="what the awake front adds to a request")
    lat.add_argument("--requests", type=int, default=300)
    mem = sub.add_parser("memory", help="the waker's and Caddy's memory with requests held")
    mem.add_argument("--held", type=int, default=500)
    mem.add_argument("--body-bytes", type=int, default=8000)
    args = parser.parse_args(argv)
    if args.measure == "latency":
        result = measure_latency(args.requests)
    else:
        result = measure_memory(args.held, args.body_bytes)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
