"""Measure cache-aware routing at the front (issue 34) on loopback, with the project's own tools:
three fake vLLM replicas (tests/support/fake_openai.py with its prefix-cache model), the front's
own Caddyfile (gateway.balancer_site, the pinned Caddy) and nemodrop/bench.py as the client:

    .venv/bin/python tests/support/router_bench.py [--rate 12] [--seconds 15]
        [--modes least-conn,cache-aware,cache-aware-no-render]
        [--workloads multi-turn,shared-prefix,no-prefix] [--cost-requests 200]
        [--cache-threshold X] [--balance-abs-threshold N] [--balance-rel-threshold X]
        [--decode-slowdown X]

The routing modes, each in front of three fresh replicas (empty caches):
- `least-conn`: the front as it is, its balancer block (balancer.reverse_proxy, `lb_policy
  least_conn`) with one upstream file per replica.
- `cache-aware`: the same front with one upstream file, the real vllm-router (.router-venv, the
  locked 0.1.17) on 127.0.0.1 with `--policy cache_aware`, routing to the replicas. Its policy
  keys a prefix tree on each request's token ids, which it asks every replica for per request
  at POST /v1/chat/completions/render (vllm_router src/backend/preprocess.rs
  prepare_http_token_inputs, 1 s budget); the replicas here serve it, as `vllm serve
  --enable-scale-out` does.
- `cache-aware-no-render`: the same, with replicas that answer render 403, as vLLM 0.33 does
  without --enable-scale-out (our replicas today, whose gateways refuse the path besides:
  gateway.API_ROUTES); the router then has no token ids and picks the least loaded replica
  (cache_aware.rs select_prepared: "missing_tokens").
The router's own settings (Router: --cache-threshold, --balance-abs-threshold,
--balance-rel-threshold) are the front's, chosen by this harness's measurement (Router's
comment); the flags of the same names try others.

The replica model (fake_openai flags, a mid GPU serving Nemotron): a prefix cache of 4096 blocks
of 16 tokens (65,536 tokens) each, least recently used out; a prompt token the replica's cache
does not hold costs 75 us of prefill (a 2,048-token cold prompt: 154 ms, ~13k tokens/s), one
prompt prefilling at a time per replica (the others queue for the GPU: --prefill-slots 1); 20 ms
to the first token besides, then 20 ms per output token for a stream alone (50 tokens/s), 2%
more for each other stream decoding on the same replica (--decode-slowdown-per-stream 0.02: a
GPU's decode step grows with its batch; 26 streams on a replica decode at 30 ms a token, 51 at
40 ms). What sending more requests to one replica costs shows in its prefill queue, in its
streams' decode, and in the requests-per-replica column.

The workloads, each at the same load (--rate requests/s, Poisson arrivals, for --seconds):
- `multi-turn`: sessions of 5 turns, each turn 256 new words after the history (the previous
  turns and their 64-token answers); the sessions start at rate/5 per second.
- `shared-prefix`: a shared system prompt of 1536 words, then 256 words of each request's own.
- `no-prefix`: 1024 words of each request's own: nothing to reuse; what the router costs.
  `--cost-requests` more: the same small chat, one at a time, alternately through the front
  (least-conn straight to the replicas) and through a second front whose upstream is the
  router (front_bench.compare): what the router adds, p50/p95 in ms.

Reported per mode and workload: cached % (bench's prefix_cached_pct: of the prompt tokens, the
share a replica's cache held, from each answer's usage), checked against the sum over the saved
requests and against the replicas' own totals; TTFT p50/p95 and E2E p50 (ms), req/s, failed
requests, requests per replica, the sessions whose turns went to more than one replica, and
the router's own decisions (its Prometheus counters; in the table, requests routed by prefix /
by load for want of a match / by load for an imbalance / by load for want of token ids). One
JSON line on stdout, then a markdown table. Everything listens on 127.0.0.1 and lives in a temporary folder removed at the end; each
process runs in its own process group, killed at the end. The numbers are reported, never
judged here.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import IO, Any

import nemodrop_cli
import requests

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))
sys.path.append(str(ROOT / "scripts"))

import fake_openai  # noqa: E402
import front_bench  # noqa: E402
import loopback  # noqa: E402
from clients import prometheus  # noqa: E402
from pulumi_harness import stack_config  # noqa: E402
from sandbox import free_port  # noqa: E402

from components.host import gateway  # noqa: E402
from components.spec import config  # noqa: E402

KEY = front_bench.KEY  # a key for this loopback run alone (front_bench.compare sends it)
MODEL = "nemotron"
REPLICAS = 3
ROUTER = ROOT / ".router-venv" / "bin" / "vllm-router"
BENCH = nemodrop_cli.argv("bench")
MODES = ("least-conn", "cache-aware", "cache-aware-no-render")


@dataclass(frozen=True)
class Replica:
    """What each fake replica models (fake_openai's flags)."""

    cache_blocks: int = 4096
    block_tokens: int = 16
    prefill_per_token: float = 75e-6
    prefill_slots: int = 1
    ttft: float = 0.02
    itl: float = 0.02
    decode_slowdown: float = 0.02  # of itl, per other stream decoding on the replica

    def args(self, scale_out: bool) -> list[str]:
        return ["--prefix-cache-blocks", str(self.cache_blocks),
                "--block-tokens", str(self.block_tokens),
                "--prefill-per-token", str(self.prefill_per_token),
                "--prefill-slots", str(self.prefill_slots),
                "--ttft", str(self.ttft), "--itl", str(self.itl), "--tokens", "4096",
                "--decode-slowdown-per-stream", str(self.decode_slowdown),
                "--model", MODEL, *(["--scale-out"] if scale_out else [])]  # fmt: skip


@dataclass(frozen=True)
class Router:
    """vllm-router's cache_aware settings, the front's (the router's own defaults:
    py_src/vllm_router/router_args.py:40-42, 0.3, 64 and 1.5).

    How they act (src/policies/cache_aware.rs, 0.1.17): select_prepared (:338-393) follows the
    prefix only while the workers' in-flight requests (the router's own count, up at selection,
    down when the answer ends) are balanced; is_imbalanced (:443-446) is `max - min >
    balance_abs_threshold && max > min * balance_rel_threshold`, both at once. While balanced, a
    request whose best match rate is over `cache_threshold` goes to the least loaded of the
    workers matching best (:365-368); while imbalanced, to the least loaded of all. Either way
    its tokens enter the chosen worker's tree (:371), so once one request with a hot prefix is
    rebalanced the next ones tie over two workers and go to the less loaded: the threshold
    bounds how far one replica runs ahead before a prefix spreads, and how often a conversation
    is moved off the replica holding its history (one cold prefill each time).

    Measured with this harness (3 replicas, decode 2% slower per stream; runs of 15 s at 12
    requests/s, and of 12 s at 20/s, where least_conn's TTFT p95 starts to rise):
    - 64 / 1.5 (the router's): a shared system prompt went 180/0/0 at 12/s (TTFT p95 154 ms, E2E
      p50 1940 ms, against 47 and 1475 through least_conn) and 208/32/0 at 20/s (E2E p50 2563
      ms against 1605): 65 streams on a replica decode at 2.3 times a lone stream's gap.
    - 8 / 1.5 and 4 / 1.25: every workload within 6 requests of 60 a replica (5 of 80 at 20/s),
      multi-turn 65.7% cached (all there is) against 51-52% through least_conn with its TTFT p95
      66-71 ms against 115-117, no conversation moved, no multi-turn request routed by load at
      either rate; shared-prefix and no-prefix as through least_conn within the runs' noise
      (two runs making the same decisions differed by 46 ms of TTFT p95; the router adds 1.5 ms).
    - 2 / 1.1: at 20/s, 27 multi-turn requests routed by load alone and 2 conversations split
      (65.2% cached): the edge, where the natural spread of some 11 in flight a replica reads
      as imbalance.
    Chosen: the tightest that never moved a conversation, 4 / 1.25 (the abs threshold binds
    while the least loaded has up to 16 in flight, the relative one above). The cache threshold
    stays 0.3: a second turn matches 256 of its 576 tokens (0.44), a shared prompt 0.86."""

    cache_threshold: float = 0.3
    balance_abs_threshold: int = 4
    balance_rel_threshold: float = 1.25

    def args(self) -> list[str]:
        return ["--cache-threshold", str(self.cache_threshold),
                "--balance-abs-threshold", str(self.balance_abs_threshold),
                "--balance-rel-threshold", str(self.balance_rel_threshold)]  # fmt: skip


@dataclass(frozen=True)
class Workload:
    """What bench.py sends: its prompt flags, and its unit (a request, or a session of `turns`)."""

    name: str
    flags: tuple[str, ...]
    turns: int = 1


WORKLOADS = {
    "multi-turn": Workload("multi-turn", ("--input-tokens", "256", "--max-tokens", "64"), 5),
    "shared-prefix": Workload(
        "shared-prefix", ("--shared-prefix", "1536", "--input-tokens", "256", "--max-tokens", "64")
    ),
    "no-prefix": Workload("no-prefix", ("--input-tokens", "1024", "--max-tokens", "64")),
}


@dataclass(frozen=True)
class Load:
    """How hard, the same for every mode and workload: requests/s for `seconds`, Poisson."""

    rate: float = 12.0
    seconds: float = 15.0
    max_concurrency: int = 256
    seed: int = 0

    def units(self, workload: Workload) -> tuple[int, float]:
        """bench's --requests and --request-rate: sessions, and sessions/s, for multi-turn."""
        per_s = self.rate / workload.turns
        return max(1, round(per_s * self.seconds)), per_s


class Processes(front_bench.Processes):
    """front_bench's, with each process in a process group of its own, the whole group
    stopped at the end (SIGTERM, then SIGKILL), and each log closed."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder)
        self.logs: list[IO[str]] = []

    def start(self, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        log = (self.folder / f"proc{len(self.procs)}.log").open("w")
        self.logs.append(log)
        proc = subprocess.Popen(argv, env=env or self.env, stdout=log, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)  # fmt: skip
        self.procs.append(proc)
        return proc

    def replicas(self, model: Replica, scale_out: bool) -> list[int]:
        """REPLICAS fakes started at once; each says its port once it listens (--port 0)."""
        argv = [sys.executable, fake_openai.__file__, "--port", "0", *model.args(scale_out)]
        started = []
        for i in range(REPLICAS):
            log = (self.folder / f"replica{i}.log").open("w")
            self.logs.append(log)
            proc = subprocess.Popen([*argv, "--name", f"r{i}"], env=self.env,
                                    stdout=subprocess.PIPE, stderr=log, text=True,
                                    start_new_session=True)  # fmt: skip
            self.procs.append(proc)
            started.append(proc)
        ports = []
        for proc in started:
            assert proc.stdout is not None
            ready, _, _ = select.select([proc.stdout], [], [], 30)
            line = proc.stdout.readline() if ready else ""
            assert line.startswith(fake_openai.READY), f"a replica printed {line!r}"
            ports.append(int(line.rsplit(":", 1)[1]))
        return ports

    def router(self, replicas: list[int], settings: Router) -> tuple[str, str]:
        """vllm-router on 127.0.0.1 with cache_aware over `replicas`: its URL and its metrics'."""
        port, metrics = free_port(), free_port()
        self.start([str(ROUTER), *router_args(port, metrics, replicas, settings)],
                   {"PATH": os.environ["PATH"], "HOME": str(self.folder)})  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        wait_ok(f"{url}/health")
        return url, f"http://127.0.0.1:{metrics}/metrics"

    def front(self, name: str, upstreams: list[str]) -> str:
        """The front's Caddy (its own Caddyfile: the gate, the balancer block) with one upstream
        file per address in `upstreams` (host:port): its URL, once /health passes through it."""
        folder = self.folder / name
        (folder / "upstreams").mkdir(parents=True)
        for i, address in enumerate(upstreams):
            (folder / "upstreams" / f"r{i}.caddy").write_text(f"to {address}\n")
        listen = gateway.Listen(http_port=free_port(), https_port=free_port(), admin_socket=None,
                                upstreams=f"{folder}/upstreams/*.caddy")  # fmt: skip
        url = f"http://127.0.0.1:{listen.http_port}"
        site = gateway.balancer_site(front_cfg(), "front.example", listen)
        self.caddy(name, site, f"{url}/health")
        wait_ok(f"{url}/health")
        return url

    def stop(self) -> None:
        for proc in self.procs:  # every group told at once, then each waited for
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            loopback.stop_group(proc)
            if proc.stdout is not None:
                proc.stdout.close()
        for log in self.logs:
            log.close()


def router_args(port: int, metrics: int, replicas: list[int], settings: Router) -> list[str]:
    """vllm-router's flags (0.1.17; py_src/vllm_router/router_args.py for the defaults)."""
    return [
        "--host", "127.0.0.1", "--port", str(port),
        "--policy", "cache_aware",
        "--worker-urls", *(f"http://127.0.0.1:{p}" for p in replicas),
        # Its Prometheus exporter always listens, whatever --help says (src/lib.rs: port 29000
        # unless given), and panics if the port is taken (src/metrics.rs start_prometheus):
        # a free port of its own, on loopback.
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics),
        # Startup waits this long between looks at the workers' /health (default 30 s).
        "--worker-startup-check-interval", "1",
        *settings.args(),
        # The rest as the router ships: no --api-key (the client's Authorization is forwarded).
    ]  # fmt: skip


def wait_ok(url: str, seconds: float = 30) -> None:
    """Until `url` answers 200 (the front's /health passes once its upstream is up)."""
    end = time.monotonic() + seconds
    while True:
        with contextlib.suppress(requests.RequestException):
            if requests.get(url, timeout=2).status_code == 200:
                return
        if time.monotonic() > end:
            raise AssertionError(f"{url} never answered 200")
        time.sleep(0.1)


@contextlib.contextmanager
def processes(folder: Path) -> Iterator[Processes]:
    """front_bench's, with this harness's Processes (the replicas and the router)."""
    with front_bench.processes(folder, Processes) as procs:
        assert isinstance(procs, Processes)
        yield procs


def front_cfg() -> config.StackConfig:
    raw = stack_config("dev")
    raw["replicas"] = REPLICAS
    raw["access"] = {**raw["access"], "https": False}
    # Caddy's own balancer block over the upstream files: the modes put either the replicas or
    # this harness's router in them (cache-aware would render the Droplet's router address).
    raw["balancer"] = {"routing": "least-conn"}
    return config.parse(raw, "dev")


def run_bench(
    url: str, workload: Workload, load: Load, folder: Path
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """bench.py through `url`: its level report and its saved requests."""
    units, per_s = load.units(workload)
    out, saved = folder / "bench.json", folder / "requests.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    env["MPLCONFIGDIR"] = str(folder / "mpl")
    argv = [*BENCH, "--endpoint", f"{url}/v1", "--api-key", KEY,
            "--model", MODEL, "--no-progress", "--warmup", "0", "--seed", str(load.seed),
            "--request-rate", f"{per_s:g}", "--max-concurrency", str(load.max_concurrency),
            "--requests", str(units), "--turns", str(workload.turns), "--timeout", "120",
            "--percentiles", "50,95", "--json", str(out), "--save-requests", str(saved),
            *workload.flags]  # fmt: skip
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, check=False)
    if proc.returncode not in (0, 3):  # 3: bench stopped on errors, which it reports
        raise RuntimeError(f"bench.py exited {proc.returncode}: {proc.stderr[-2000:]}")
    [level] = json.loads(out.read_text())["levels"]
    lines = [json.loads(line) for line in saved.read_text().splitlines()]
    return level, lines


def replica_stats(ports: list[int]) -> list[dict[str, Any]]:
    return [requests.get(f"http://127.0.0.1:{p}/_stats", timeout=10).json() for p in ports]


def router_counters(metrics_url: str) -> dict[str, dict[str, float]]:
    """The router's decisions: prefix_routing_decisions by outcome, kv_routing_inputs by result
    (the render answers), processed requests by worker."""
    wanted = {"vllm_router_prefix_routing_decisions_total": "outcome",
              "vllm_router_kv_routing_inputs_total": "result",
              "vllm_router_processed_requests_total": "worker"}  # fmt: skip
    out: dict[str, dict[str, float]] = {name: {} for name in wanted}
    for sample in prometheus.samples(requests.get(metrics_url, timeout=10).text):
        if sample.name in wanted:
            label = dict(sample.labels).get(wanted[sample.name], "")
            out[sample.name][label] = out[sample.name].get(label, 0) + sample.value
    return out


def share(cached: float, prompt: float) -> float | None:
    return round(100 * cached / prompt, 3) if prompt else None


def sessions_split(stats: list[dict[str, Any]]) -> int:
    """Sessions (known by their first message) whose requests went to more than one replica."""
    where: dict[str, set[int]] = {}
    for i, replica in enumerate(stats):
        for messages in replica["conversations"]:
            where.setdefault(str(messages[0]["content"]), set()).add(i)
    return sum(1 for replicas in where.values() if len(replicas) > 1)


def run_one(
    mode: str,
    workload: Workload,
    load: Load,
    model: Replica,
    folder: Path,
    settings: Router = Router(),
) -> dict[str, Any]:
    """One mode and one workload, on fresh replicas: what bench and the replicas saw."""
    folder.mkdir(parents=True)
    with processes(folder) as p:
        ports = p.replicas(model, scale_out=mode != "cache-aware-no-render")
        metrics = None
        upstreams = [f"127.0.0.1:{port}" for port in ports]
        if mode != "least-conn":
            router, metrics = p.router(ports, settings)
            upstreams = [router.removeprefix("http://")]
        url = p.front("front", upstreams)
        level, lines = run_bench(url, workload, load, folder)
        stats = replica_stats(ports)
        counters = router_counters(metrics) if metrics else None
    ok = [x for x in lines if x["status"] == "ok"]
    later = [x for x in ok if x["turn"] > 0]
    cached, prompt = (sum(x[k] or 0 for x in ok) for k in ("cached_tokens", "prompt_tokens"))
    return {
        "mode": mode,
        "workload": workload.name,
        "requests": level["requests"],
        "failed": level["errors"],
        "errors_by_kind": level["errors_by_kind"],
        "cached_pct": level["prefix_cached_pct"],
        "cached_pct_from_requests": share(cached, prompt),
        "cached_pct_from_replicas": share(
            sum(s["cached_tokens"] for s in stats), sum(s["prompt_tokens"] for s in stats)
        ),
        "ttft_p50_ms": level["ttft_ms"].get("p50"),
        "ttft_p95_ms": level["ttft_ms"].get("p95"),
        "e2e_p50_ms": level["e2e_ms"].get("p50"),
        "requests_per_s": level["requests_per_s"],
        "mean_prompt_tokens": level["mean_prompt_tokens"],
        "requests_per_replica": [s["chat_requests"] for s in stats],
        "sessions_split": sessions_split(stats) if workload.turns > 1 else None,
        "later_turns": len(later),
        "later_turns_uncached": sum(1 for x in later if not x["cached_tokens"]),
        "renders": sum(s["renders"] for s in stats),
        "render_auth": sorted({str(a) for s in stats for a in s["render_auth"]}),
        "router": counters,
    }


def measure_router_cost(
    requests_each: int, model: Replica, folder: Path, settings: Router
) -> dict[str, Any]:
    """What the router adds: the same small chat, one at a time, alternately through a front
    straight to the replicas and a front whose upstream is the router (cache_aware, render
    served), both in front of the same three replicas."""
    folder.mkdir(parents=True)
    with processes(folder) as p:
        ports = p.replicas(model, scale_out=True)
        router, _ = p.router(ports, settings)
        plain = p.front("front-least-conn", [f"127.0.0.1:{port}" for port in ports])
        routed = p.front("front-router", [router.removeprefix("http://")])
        result = front_bench.compare(plain, routed, requests_each)
    return {"measure": "router_cost", "caddy_only": result["direct"],
            "caddy_router": result["via"], "added_ms": result["added"],
            "requests": requests_each}  # fmt: skip


def measure(
    modes: list[str],
    workloads: list[str],
    load: Load,
    model: Replica,
    cost_requests: int,
    settings: Router,
    folder: Path | None = None,
) -> dict[str, Any]:
    with contextlib.ExitStack() as stack:
        if folder is None:
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="router-bench-")))
        runs = [run_one(mode, WORKLOADS[name], load, model, folder / f"{name}-{mode}", settings)
                for name in workloads for mode in modes]  # fmt: skip
        cost = (measure_router_cost(cost_requests, model, folder / "cost", settings)
                if cost_requests else None)  # fmt: skip
    return {"measure": "routing", "replicas": REPLICAS, "replica_model": asdict(model),
            "router_settings": asdict(settings), "load": asdict(load), "runs": runs,
            "router_cost": cost}  # fmt: skip


def table(result: dict[str, Any]) -> str:
    def cell(value: Any) -> str:
        if value is None:
            return "-"
        return f"{value:.1f}" if isinstance(value, float) else str(value)

    def decisions(run: dict[str, Any]) -> str | None:
        """The router's prefix decisions: by prefix / least loaded (no good match) / least
        loaded (imbalance) / least loaded (no token ids)."""
        if not run["router"]:
            return None
        made = run["router"]["vllm_router_prefix_routing_decisions_total"]
        outcomes = ("prefix_hit", "prefix_miss", "load_imbalance", "missing_tokens")
        return "/".join(str(round(made.get(k, 0))) for k in outcomes)

    rows = ["| workload | mode | cached % | TTFT p50 ms | TTFT p95 ms | E2E p50 ms | req/s "
            "| failed | requests per replica | split sessions | hit/miss/imbalance/no-tokens |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in result["runs"]:
        rows.append("| " + " | ".join(cell(v) for v in (
            r["workload"], r["mode"], r["cached_pct"], r["ttft_p50_ms"], r["ttft_p95_ms"],
            r["e2e_p50_ms"], r["requests_per_s"], r["failed"],
            "/".join(map(str, r["requests_per_replica"])), r["sessions_split"],
            decisions(r))) + " |")  # fmt: skip
    settings = result["router_settings"]
    rows.append("")
    rows.append(f"router: --cache-threshold {settings['cache_threshold']} "
                f"--balance-abs-threshold {settings['balance_abs_threshold']} "
                f"--balance-rel-threshold {settings['balance_rel_threshold']}; rate "
                f"{result['load']['rate']}/s for {result['load']['seconds']} s; decode slowdown "
                f"{result['replica_model']['decode_slowdown']} per stream")  # fmt: skip
    cost = result["router_cost"]
    if cost:
        rows.append("")
        rows.append(f"router cost ({cost['requests']} small chats each, one at a time): "
                    f"Caddy only p50 {cost['caddy_only']['p50_ms']} / p95 "
                    f"{cost['caddy_only']['p95_ms']} ms; Caddy + router p50 "
                    f"{cost['caddy_router']['p50_ms']} / p95 {cost['caddy_router']['p95_ms']} ms; "
                    f"added p50 {cost['added_ms']['p50_ms']} / p95 {cost['added_ms']['p95_ms']} ms")  # fmt: skip
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--rate", type=float, default=Load.rate, help="requests/s, every run")
    parser.add_argument("--seconds", type=float, default=Load.seconds, help="of arrivals a run")
    parser.add_argument("--cost-requests", type=int, default=200,
                        help="small chats each way for the router's cost (0: none)")  # fmt: skip
    parser.add_argument("--cache-threshold", type=float, default=Router.cache_threshold,
                        help="the router's (best match share over which it follows the prefix)")  # fmt: skip
    parser.add_argument("--balance-abs-threshold", type=int,
                        default=Router.balance_abs_threshold,
                        help="the router's (in flight: max - min over which it may rebalance)")  # fmt: skip
    parser.add_argument("--balance-rel-threshold", type=float,
                        default=Router.balance_rel_threshold,
                        help="the router's (in flight: max / min over which it may rebalance)")  # fmt: skip
    parser.add_argument("--decode-slowdown", type=float, default=Replica.decode_slowdown,
                        help="each replica's --decode-slowdown-per-stream (0: decode never slows)")  # fmt: skip
    args = parser.parse_args(argv)
    modes, workloads = args.modes.split(","), args.workloads.split(",")
    unknown = [m for m in modes if m not in MODES] + [w for w in workloads if w not in WORKLOADS]
    if unknown:
        parser.error(f"unknown: {', '.join(unknown)}")
    if not ROUTER.exists():
        parser.error(f"no {ROUTER}: ./check installs it (locks/router-0.1.17-py3.12.txt)")
    load = replace(Load(), rate=args.rate, seconds=args.seconds)
    settings = Router(args.cache_threshold, args.balance_abs_threshold, args.balance_rel_threshold)
    model = replace(Replica(), decode_slowdown=args.decode_slowdown)
    result = measure(modes, workloads, load, model, args.cost_requests, settings)
    print(json.dumps(result), flush=True)
    print(table(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
