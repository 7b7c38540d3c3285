"""Measure the front's autoscaler (issue 33) on loopback: the same bursty trace through the
front, with the set scaling between 1 and 3 replicas, and with 1 and 3 replicas fixed:

    .venv/bin/python tests/support/autoscale_bench.py [--modes autoscale,fixed1,fixed3]
        [--seconds S] [--create-seconds C] [--seed N] [--set NAME=VALUE ...] [--label L]

The pieces, each the project's own where it has one:
- the front: the balancer Caddyfile with wake on (gateway.balancer_site, the pinned Caddy, an
  admin socket for member.sh's graceful reloads) and the real waker (scripts/phases/wake.py)
  with its rendered settings (components/host/wake.py env_text), a github trigger pointed at the
  strict fake GitHub (tests/support/stack/github_api.py on loopback: it checks each dispatch's
  inputs against .github/workflows/deploy.yml), and for `autoscale` the SCALE_* settings;
- the pipeline emulator (Pipeline, a thread): it takes each accepted dispatch in the order
  GitHub runs them, reads inputs.replicas (a wake, which has none, brings 1), and converges the
  pool to that count as `pulumi up` would: a new replica is a fake vLLM (tests/support/
  fake_openai.py with --max-num-seqs, --kv-cache-tokens, a prefill cost per prompt token and
  decode slower per stream: Replica) whose process starts when its Droplet would be created;
  once `--create-seconds` have passed (the Droplet's creation and a warm start, scaled down by
  the time scale below) and its /health answers, its upstream file is written and Caddy
  reloaded (scripts/phases/member.sh's join); a leaving replica (the highest index first) has its
  file removed and Caddy reloaded, then is waited for until its running and waiting gauges read
  0 (member.sh's drain), then killed (member.sh's leave). Then the run ends `success`
  (GitHub.finish_run), and the next one queued behind it starts;
- the load: scripts/bench.py --trace (its trace format: scripts/bench_workload.py) through the
  front with the key, open loop: a quiet phase, a ramp past what one replica carries, a
  plateau, a fall, quiet again (make_trace; the same trace and seed for every mode);
- the modes: `autoscale` (min 1, max 3: the emulator starts 1 replica up front), `fixed1` and
  `fixed3` (N replicas up front, never changed; the waker without SCALE_MAX).

Time: requests run in real time (a replica's TTFT and decode are the fake's real sleeps), the
operations are scaled down: the time scale is REAL_CREATE_SECONDS / --create-seconds (600 s of a
real create against 10 s here: 60), and the autoscaler's windows and cooldown are its defaults
(components/spec/schema.py AutoscaleConfig) divided by it, never under 4 samples; `--set
queueSeconds=1 --set outWindowSeconds=120` (repeatable, the schema's camelCase names, REAL
units, checked as the schema and config.py check them) replaces one, scaled the same way
(queueSeconds is a request's wait, which runs in real time here: not scaled); a trace of S seconds stands for S
times the scale of real operation, and replica-hours are reported scaled back the same way
(replica-seconds here * scale / 3600). Replica-seconds count each replica's process from its
start (its Droplet's creation, what DigitalOcean bills from) to its kill, within the load's
window (a replica started before the load counts from the load's start: the steady state
before it; those alive at the end count to the load's end).

Output: one JSON line per mode, then a markdown table (each row named by --label, or the
mode): replica-hours, TTFT p50/p95, requests sent and failed, pipeline runs (steps), swings (a
step reversing the one before it within the in window) and the per-step timeline (the emulator's own record, and
the waker's GET /nemotron/wake "autoscale" part when the waker has one). A failed request is a
finding: each is printed. Everything listens on 127.0.0.1 in a temporary folder removed at the
end; every process runs in a process group of its own, killed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parent.parent.parent
for _path in (ROOT, ROOT / "tests" / "support", ROOT / "scripts"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import fake_openai  # noqa: E402
import front_bench  # noqa: E402
import loopback  # noqa: E402
import router_bench  # noqa: E402
import script_module  # noqa: E402
from bench_workload import TraceEntry, write_trace  # noqa: E402
from sandbox import CADDY, free_port  # noqa: E402
from stack import github_api  # noqa: E402

from components.host import gateway, wake  # noqa: E402
from components.spec.schema import AutoscaleConfig  # noqa: E402

KEY = front_bench.KEY  # a key for this loopback run alone
MODEL = "nemotron"
GITHUB_TOKEN = "github_pat_autoscale_bench_0123456789"  # the fake GitHub's one token
REPO = "me/llm"
MODES = ("autoscale", "fixed1", "fixed3")
BENCH = ROOT / "scripts" / "bench.py"
# A real replica's arrival, from the step's dispatch to serving: the pipeline's start, the
# Droplet's creation, its driver and reboot, a warm start from the cache Volume (docs/cache.md
# "Where the minutes go": 1-3 + 3-6 min + about a minute, and the runner's own).
REAL_CREATE_SECONDS = 600.0
# The settings --set may change (AutoscaleConfig's fields by their camelCase name); min and max
# are the modes' own, the budget is off (no budget but max).
TUNABLE = {"queueSeconds": "queue_seconds", "outWindowSeconds": "out_window_seconds",
           "inWindowSeconds": "in_window_seconds", "inUtilization": "in_utilization",
           "cooldownMinutes": "cooldown_minutes"}  # fmt: skip


class SettingError(ValueError):
    pass


def policy(sets: list[str] | tuple[str, ...] = ()) -> AutoscaleConfig:
    """The autoscaler's settings in real units: the schema's defaults, each `NAME=VALUE` of
    `sets` (the later of two for one name wins) replacing one, checked as a stack's config is
    (the schema's bounds and types, and config.py's inWindowSeconds >= outWindowSeconds)."""
    given: dict[str, str] = {}
    for text in sets:
        name, eq, value = text.partition("=")
        name, value = name.strip(), value.strip()
        if not eq or not value:
            raise SettingError(f"--set {text!r}: not NAME=VALUE (e.g. --set queueSeconds=1)")
        if name not in TUNABLE:
            raise SettingError(f"--set {text!r}: unknown setting {name!r}; accepted: "
                               f"{', '.join(TUNABLE)}")  # fmt: skip
        given[name] = value
    try:
        config = AutoscaleConfig.model_validate({"max": 3, **given})
    except ValueError as err:  # pydantic's ValidationError: each bad field and why
        errors = getattr(err, "errors", lambda: [])()
        said = "; ".join(f"{'.'.join(map(str, e['loc']))}={e.get('input')!r}: {e['msg']}"
                         for e in errors) or str(err)  # fmt: skip
        raise SettingError(f"--set: {said}") from None
    if config.in_window_seconds < config.out_window_seconds:
        raise SettingError(f"--set: inWindowSeconds ({config.in_window_seconds}) is shorter than "
                           f"outWindowSeconds ({config.out_window_seconds}); a set that scales "
                           "in faster than out swings (components/spec/config.py refuses it)")  # fmt: skip
    return config


def changed(config: AutoscaleConfig) -> dict[str, Any]:
    """The settings of `config` that differ from the schema's defaults, by camelCase name."""
    default = AutoscaleConfig(max=3)
    return {name: getattr(config, f) for name, f in TUNABLE.items()
            if getattr(config, f) != getattr(default, f)}  # fmt: skip


@dataclass(frozen=True)
class Replica:
    """What each fake replica models (fake_openai's flags): a mid GPU's vLLM with
    --max-num-seqs 8. A request of 256 prompt tokens and 64 output tokens in a full batch takes
    about 0.02 + 0.026 (prefill) + 63 * 0.02 * 1.14 (decode, 8 streams) = 1.48 s: one replica
    carries about 8 / 1.48 = 5.4 requests/s of the trace's mean request; past that they queue."""

    max_num_seqs: int = 8
    kv_cache_tokens: int = 4096  # 8 requests of 256 + 64 hold 62% of it
    prefill_per_token: float = 100e-6
    ttft: float = 0.02
    itl: float = 0.02
    decode_slowdown: float = 0.02  # of itl, per other stream decoding on the replica

    def args(self) -> list[str]:
        # --prefix-cache-blocks 1: the prefill cost applies (the trace's prompts share nothing).
        return ["--max-num-seqs", str(self.max_num_seqs),
                "--kv-cache-tokens", str(self.kv_cache_tokens),
                "--prefix-cache-blocks", "1", "--prefill-per-token", str(self.prefill_per_token),
                "--ttft", str(self.ttft), "--itl", str(self.itl), "--tokens", "4096",
                "--decode-slowdown-per-stream", str(self.decode_slowdown),
                "--model", MODEL]  # fmt: skip

    def capacity(self, prompt_tokens: int, max_tokens: int) -> float:
        """Requests/s one replica finishes with a full batch of such requests."""
        n = self.max_num_seqs
        service = (self.ttft + prompt_tokens * self.prefill_per_token
                   + (max_tokens - 1) * self.itl * (1 + self.decode_slowdown * (n - 1)))  # fmt: skip
        return n / service


@dataclass(frozen=True)
class Shape:
    """The trace: phases as shares of its length, rates as multiples of one replica's
    capacity (Replica.capacity of the mean request), Poisson arrivals within each."""

    quiet: float = 0.2  # of one replica's capacity
    peak: float = 2.2  # more than two replicas carry: three within the TTFT target
    phases: tuple[tuple[str, float], ...] = (
        ("quiet", 0.15), ("ramp", 0.15), ("plateau", 0.3), ("fall", 0.1), ("quiet", 0.3),
    )  # fmt: skip
    prompt_tokens: int = 256
    max_tokens: int = 64
    spread: float = 0.25  # lengths uniform within +-this share


def rate_at(t: float, seconds: float, shape: Shape, capacity: float) -> float:
    """The trace's rate (requests/s) at `t` seconds into it."""
    low, high = shape.quiet * capacity, shape.peak * capacity
    start = 0.0
    for name, share in shape.phases:
        end = start + share * seconds
        if t < end or end >= seconds:
            x = (t - start) / (end - start) if end > start else 1.0
            return {"quiet": low, "plateau": high, "ramp": low + (high - low) * x,
                    "fall": high - (high - low) * x}[name]  # fmt: skip
        start = end
    return low


def make_trace(seconds: float, shape: Shape, replica: Replica, seed: int) -> list[TraceEntry]:
    """The bursty trace, the same for the same arguments: arrivals of a Poisson process whose
    rate follows `shape` (by thinning), lengths spread around the shape's."""
    rng = random.Random(seed)  # noqa: S311 (load shape, not secrets)
    capacity = replica.capacity(shape.prompt_tokens, shape.max_tokens)
    top = shape.peak * capacity
    out, t = [], 0.0
    while True:
        t += rng.expovariate(top)
        if t >= seconds:
            return out
        if rng.random() * top <= rate_at(t, seconds, shape, capacity):
            spread = 1 + rng.uniform(-shape.spread, shape.spread)
            out.append(TraceEntry(round(t, 4), max(1, round(shape.prompt_tokens * spread)),
                                  max(1, round(shape.max_tokens * spread))))  # fmt: skip


@dataclass(frozen=True)
class Scale:
    """The operations' time, scaled down; the autoscaler's settings at this scale."""

    create_seconds: float = 10.0
    sample_seconds: float = 0.5  # the waker's look at every replica's /metrics

    @property
    def factor(self) -> float:
        """Real seconds per second here."""
        return REAL_CREATE_SECONDS / self.create_seconds

    def window(self, real_seconds: float) -> float:
        """A window or cooldown of `real_seconds` at this scale: divided by the factor, at
        least 4 samples (a window shorter than that would decide on one or two looks)."""
        return max(real_seconds / self.factor, 4 * self.sample_seconds)

    def env(
        self, low: int, high: int, replica: Replica, hourly_usd: float,
        config: AutoscaleConfig | None = None,
    ) -> dict[str, str]:  # fmt: skip
        """The waker's SCALE_* settings: `config`'s (the schema's defaults when None: policy()),
        windows and cooldown divided by the factor (self.window); queueSeconds is a request's
        wait, which runs in real time here, so it is not scaled; inUtilization is a share."""
        a = config if config is not None else policy()
        # No SCALE_DAILY_BUDGET_USD: the schema's default, no budget but max.
        return {"SCALE_MIN": str(low), "SCALE_MAX": str(high),
                "SCALE_QUEUE_SECONDS": f"{a.queue_seconds:g}",
                "SCALE_OUT_WINDOW_SECONDS": f"{self.window(a.out_window_seconds):g}",
                "SCALE_IN_WINDOW_SECONDS": f"{self.window(a.in_window_seconds):g}",
                "SCALE_IN_UTILIZATION": f"{a.in_utilization:g}",
                "SCALE_REPLICA_CAPACITY": str(replica.max_num_seqs),
                "SCALE_COOLDOWN_MINUTES": f"{self.window(a.cooldown_minutes * 60) / 60:g}",
                "SCALE_REPLICA_PRICE_HOURLY": f"{hourly_usd:g}",
                "SCALE_SAMPLE_SECONDS": f"{self.sample_seconds:g}"}  # fmt: skip


class Ledger:
    """Replica-seconds: each replica's process from its start to its kill, as DigitalOcean bills
    a Droplet from its creation to its deletion; `clock` injectable for the tests."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.lives: list[tuple[str, float, float | None]] = []  # name, start, stop

    def running(self, name: str) -> int | None:
        """The index of `name`'s life still running, or None."""
        return next((i for i, (n, _, stop) in enumerate(self.lives)
                     if n == name and stop is None), None)  # fmt: skip

    def start(self, name: str) -> None:
        assert self.running(name) is None, f"{name} is already running"
        self.lives.append((name, self.clock(), None))

    def stop(self, name: str) -> None:
        i = self.running(name)
        assert i is not None, f"{name} is not running"
        self.lives[i] = (name, self.lives[i][1], self.clock())

    def seconds(self, start: float, end: float) -> float:
        """Replica-seconds within [start, end]: each life cut to that window, one still running
        counted to `end`."""
        total = 0.0
        for _, began, ended in self.lives:
            stop = end if ended is None else min(ended, end)
            total += max(0.0, stop - max(began, start))
        return total


class Processes(router_bench.Processes):
    """router_bench's (each process in a group of its own, stopped at the end), with one
    process stopped by itself (a leaving replica)."""

    def stop_one(self, proc: subprocess.Popen[str]) -> None:
        loopback.stop_group(proc, seconds=5)


@dataclass
class Member:
    """One replica of the pool: its slot, fake's port and process."""

    index: int
    port: int
    proc: subprocess.Popen[str]

    @property
    def name(self) -> str:
        return f"r{self.index}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


# The waker's own reading of a vLLM metrics page (scripts/phases/wake.py parse_metrics): the
# drain below waits on the same numbers the autoscaler decides on.
WAKER = script_module.load(front_bench.WAKER, "wake_for_autoscale_bench")


def in_flight(url: str) -> float | None:
    """A replica's requests running and waiting, as the waker reads them (None: no reading)."""
    reading = WAKER.parse_metrics(requests.get(f"{url}/metrics", timeout=5).text)
    return None if reading is None else float(reading.running + reading.waiting)


@dataclass
class Pipeline:
    """deploy.yml's runs, emulated: each dispatch GitHub starts converges the pool to its
    inputs.replicas (a wake: 1), as the program's `pulumi up` and member.sh would, then ends
    its run `success`. Its record is the per-step timeline."""

    p: Processes
    github: github_api.GitHub
    upstreams: Path
    admin: Path
    caddyfile: Path
    replica: Replica
    scale: Scale
    ledger: Ledger
    origin: float = field(default_factory=time.monotonic)  # the record's zero (the load's start)
    members: dict[int, Member] = field(default_factory=dict)
    record: list[dict[str, Any]] = field(default_factory=list)
    done: set[int] = field(default_factory=set)
    halt: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    problems: list[str] = field(default_factory=list)

    def at(self) -> float:
        return round(time.monotonic() - self.origin, 2)

    # ---- member.sh ---------------------------------------------------------------------------
    def reload(self) -> None:
        """Caddy's graceful reload, as member.sh's reload_caddy."""
        done = subprocess.run(
            [str(CADDY), "reload", "--config", str(self.caddyfile), "--adapter", "caddyfile",
             "--address", f"unix/{self.admin}"],
            env=self.p.env, capture_output=True, text=True, check=False, timeout=30,
        )  # fmt: skip
        if done.returncode:
            raise RuntimeError(f"caddy reload: {done.stderr[-1000:]}")

    def create(self, index: int) -> Member:
        """A replica's Droplet is created: its process starts (billed from now)."""
        port = free_port()
        proc = self.p.start([sys.executable, fake_openai.__file__, "--port", str(port),
                             "--name", f"r{index}", *self.replica.args()])  # fmt: skip
        member = Member(index, port, proc)
        self.ledger.start(member.name)
        return member

    def join(self, member: Member, ready_at: float) -> bool:
        """Once its create time has passed and its /health answers: its upstream file, a
        reload. False if the run was halted first."""
        while time.monotonic() < ready_at or not self._healthy(member):
            if self.halt.wait(0.05):
                return False
        (self.upstreams / f"{member.name}.caddy").write_text(f"to 127.0.0.1:{member.port}\n")
        self.reload()
        self.members[member.index] = member
        return True

    @staticmethod
    def _healthy(member: Member) -> bool:
        with contextlib.suppress(requests.RequestException):
            return requests.get(f"{member.url}/health", timeout=2).status_code == 200
        return False

    def leave(self, member: Member, drain_seconds: float = 300) -> None:
        """Its file removed, a reload, the wait until it runs and holds nothing, the kill."""
        (self.upstreams / f"{member.name}.caddy").unlink()
        self.reload()
        del self.members[member.index]
        end = time.monotonic() + drain_seconds
        while time.monotonic() < end:
            with contextlib.suppress(requests.RequestException):
                if in_flight(member.url) == 0:
                    break
            time.sleep(0.1)
        else:
            self.problems.append(f"{member.name} still had requests after {drain_seconds}s: cut")
        self.p.stop_one(member.proc)
        self.ledger.stop(member.name)

    # ---- a run -------------------------------------------------------------------------------
    def converge(self, want: int) -> dict[str, Any]:
        """The pool to `want` replicas: new ones created at once, each joining when ready;
        leaving ones the highest index first, one after another."""
        step: dict[str, Any] = {"from": len(self.members), "to": want, "joined": {}, "left": {}}
        free = [i for i in range(want + len(self.members)) if i not in self.members]
        new = [self.create(i) for i in free[: max(0, want - len(self.members))]]
        ready_at = time.monotonic() + self.scale.create_seconds
        for member in new:
            if not self.join(member, ready_at):
                return step
            step["joined"][member.name] = self.at()
        for index in sorted(self.members, reverse=True)[: max(0, len(self.members) - want)]:
            name = self.members[index].name
            self.leave(self.members[index])
            step["left"][name] = self.at()
        return step

    def next_run(self) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """The run GitHub has in progress that this has not run yet, and its dispatch (runs
        and dispatches are recorded together, in order: github_api._dispatch)."""
        with self.github.lock:
            for run, dispatch in zip(self.github.runs, self.github.dispatches, strict=False):
                if run["status"] == "in_progress" and run["id"] not in self.done:
                    return dict(run), dict(dispatch)
        return None

    def serve(self) -> None:
        while not self.halt.is_set():
            found = self.next_run()
            if found is None:
                self.halt.wait(0.05)
                continue
            run, dispatch = found
            inputs = dispatch.get("inputs") or {}
            want = int(inputs.get("replicas") or 0) or max(len(self.members), 1)
            entry = {"run": run["id"], "started": self.at(), "replicas_input":
                     inputs.get("replicas")}  # fmt: skip
            self.done.add(run["id"])
            try:
                entry.update(self.converge(want))
            except Exception as err:  # noqa: BLE001 (the run fails, as a broken up would)
                self.problems.append(f"run {run['id']}: {err!r}")
                self.github.finish_run("failure", run_id=run["id"])
                entry.update(finished=self.at(), conclusion="failure")
                self.record.append(entry)
                continue
            if self.halt.is_set():
                entry.update(finished=None, conclusion="halted at the load's end")
                self.record.append(entry)
                return
            self.github.finish_run("success", run_id=run["id"])
            entry.update(finished=self.at(), conclusion="success")
            self.record.append(entry)

    def start(self) -> None:
        self.thread = threading.Thread(target=self.serve, name="pipeline", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.halt.set()
        if self.thread is not None:
            self.thread.join(timeout=60)


# ---- the front -------------------------------------------------------------------------------


def waker_env(
    folder: Path, github_url: str, port: int, scale_env: dict[str, str]
) -> dict[str, str]:
    """The waker's settings as the program renders them (github trigger), with loopback paths
    and ports, the fake GitHub, fast looks, and `scale_env` (SCALE_*: the autoscaler)."""
    rendered = dict(line.split("=", 1) for line in
                    wake.env_text(front_bench.front_cfg()).splitlines())  # fmt: skip
    (folder / "token").write_text(f"{GITHUB_TOKEN}\n")
    (folder / "api-key").write_text(f"{KEY}\n")
    return {**rendered, "PATH": os.environ["PATH"], "WAKE_LISTEN": f"127.0.0.1:{port}",
            "WAKE_UPSTREAMS_DIR": str(folder / "upstreams"),
            "WAKE_HOLD_FILE": str(folder / "hold"), "WAKE_STATE_FILE": str(folder / "state.json"),
            "WAKE_TRIGGER": "github", "WAKE_GITHUB_API": github_url, "WAKE_GITHUB_REPO": REPO,
            "WAKE_TOKEN_FILE": str(folder / "token"), "WAKE_API_KEY_FILE": str(folder / "api-key"),
            "WAKE_RUN_POLL_SECONDS": "0.5", "WAKE_HEALTH_SECONDS": "0.5",
            **scale_env}  # fmt: skip


@dataclass
class Front:
    url: str
    waker_url: str
    caddyfile: Path
    admin: Path
    upstreams: Path


def start_front(p: Processes, github_url: str, scale_env: dict[str, str]) -> Front:
    """The waker and the front's Caddy (the balancer site, wake on, an admin socket for the
    reloads), with no replica yet."""
    folder = p.folder / "front"
    (folder / "upstreams").mkdir(parents=True)
    waker_port = free_port()
    p.start([sys.executable, str(front_bench.WAKER)],
            waker_env(folder, github_url, waker_port, scale_env))  # fmt: skip
    waker_url = f"http://127.0.0.1:{waker_port}"
    front_bench.wait_http(f"{waker_url}/health")
    admin = folder / "admin.sock"
    listen = gateway.Listen(http_port=free_port(), https_port=free_port(),
                            admin_socket=str(admin), upstreams=f"{folder}/upstreams/*.caddy",
                            waker=f"127.0.0.1:{waker_port}", wake_hold_file=str(folder / "hold"))  # fmt: skip
    url = f"http://127.0.0.1:{listen.http_port}"
    p.caddy("Caddyfile", gateway.balancer_site(front_bench.front_cfg(), "front.example", listen),
            f"{url}/health")  # fmt: skip
    return Front(url, waker_url, p.folder / "Caddyfile.caddyfile", admin, folder / "upstreams")


def waker_status(front: Front) -> dict[str, Any]:
    with contextlib.suppress(requests.RequestException, ValueError):
        answer: dict[str, Any] = requests.get(f"{front.waker_url}{wake.CONTROL_PATH}",
                                              timeout=5).json()  # fmt: skip
        return answer
    return {}


def run_bench(url: str, trace: Path, folder: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """bench.py --trace through `url`: its level report and its saved requests."""
    out, saved = folder / "bench.json", folder / "requests.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    env["MPLCONFIGDIR"] = str(folder / "mpl")
    argv = [sys.executable, str(BENCH), "--endpoint", f"{url}/v1", "--api-key", KEY,
            "--model", MODEL, "--no-progress", "--warmup", "0", "--trace", str(trace),
            "--timeout", "600", "--percentiles", "50,95", "--json", str(out),
            "--save-requests", str(saved)]  # fmt: skip
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=3600, check=False)
    if proc.returncode not in (0, 3):  # 3: bench stopped on errors, which it reports
        raise RuntimeError(f"bench.py exited {proc.returncode}: {proc.stderr[-2000:]}")
    [level] = json.loads(out.read_text())["levels"]
    return level, [json.loads(line) for line in saved.read_text().splitlines()]


def ms(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def run_mode(
    mode: str, trace: Path, seconds: float, replica: Replica, scale: Scale, folder: Path,
    hourly_usd: float, config: AutoscaleConfig | None = None, label: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One mode on a fresh front and pool: what bench, the pipeline and the waker saw."""
    folder.mkdir(parents=True)
    fixed = {"fixed1": 1, "fixed3": 3}.get(mode)
    scale_env = {} if fixed else scale.env(1, 3, replica, hourly_usd, config)
    github = github_api.GitHub(REPO, "deploy.yml", GITHUB_TOKEN)
    server = github_api.serve(github, socket.create_server(("127.0.0.1", 0)), None)
    try:
        with front_bench.processes(folder, Processes) as p:
            assert isinstance(p, Processes)
            front = start_front(p, loopback.url(server), scale_env)
            ledger = Ledger()
            pipeline = Pipeline(p, github, front.upstreams, front.admin, front.caddyfile,
                                replica, scale, ledger)  # fmt: skip
            pipeline.converge(fixed or 1)  # up front, before the load: no run
            router_bench.wait_ok(f"{front.url}/health")
            status = waker_status(front)
            blocked = None
            if not fixed and "autoscale" not in status:
                blocked = ("the waker has no autoscaler (no \"autoscale\" in its GET "
                           f"{wake.CONTROL_PATH}): merge wt-scaler first")  # fmt: skip
                return {"mode": mode, "blocked": blocked}
            pipeline.origin = start = time.monotonic()
            pipeline.start()
            try:
                level, lines = run_bench(front.url, trace, folder)
            finally:
                end = time.monotonic()
                status = waker_status(front)
                pipeline.stop()
            for member in list(pipeline.members.values()):
                p.stop_one(member.proc)
                ledger.stop(member.name)
    finally:
        loopback.stop(server)
    failed = [x for x in lines if x["status"] != "ok"]
    replica_seconds = ledger.seconds(start, end)
    in_window = float(scale_env.get("SCALE_IN_WINDOW_SECONDS") or 0)
    return {
        "mode": mode,
        "label": label or mode,
        "settings": None if fixed else changed(config or policy()),
        "replicas": f"{fixed} fixed" if fixed else "1-3",
        "load_seconds": round(end - start, 1),
        "replica_seconds": round(replica_seconds, 1),
        "replica_hours_scaled": round(replica_seconds * scale.factor / 3600, 2),
        "ttft_p50_ms": ms(level["ttft_ms"].get("p50")),
        "ttft_p95_ms": ms(level["ttft_ms"].get("p95")),
        "e2e_p50_ms": ms(level["e2e_ms"].get("p50")),
        "requests": level["requests"],
        "failed": level["errors"],
        "errors_by_kind": level["errors_by_kind"],
        "failures": [
            {"index": x["index"], "start_s": round(x["start_s"], 2), "status": x["status"]}
            for x in failed
        ],
        "runs": len(github.dispatches),
        "dispatches": [d.get("inputs") for d in github.dispatches],
        "steps": pipeline.record,
        "swings": swings(pipeline.record, in_window),
        "pipeline_problems": pipeline.problems,
        "waker_autoscale": status.get("autoscale"),
    }


def measure(
    modes: list[str], seconds: float, scale: Scale, seed: int, replica: Replica = Replica(),
    shape: Shape = Shape(), hourly_usd: float = 3.39, folder: Path | None = None,
    config: AutoscaleConfig | None = None, label: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    with contextlib.ExitStack() as stack:
        if folder is None:
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="scale-bench-")))
        entries = make_trace(seconds, shape, replica, seed)
        trace = folder / "trace.jsonl"
        write_trace(trace, entries)
        runs = []
        for mode in modes:
            named = None if label is None else label if len(modes) == 1 else f"{label} {mode}"
            result = run_mode(mode, trace, seconds, replica, scale, folder / mode, hourly_usd,
                              config, named)  # fmt: skip
            print(json.dumps(result), flush=True)
            runs.append(result)
    capacity = replica.capacity(shape.prompt_tokens, shape.max_tokens)
    return {"measure": "autoscale", "seconds": seconds, "seed": seed,
            "requests_in_trace": len(entries), "replica_model": asdict(replica),
            "one_replica_rps": round(capacity, 2), "shape": asdict(shape),
            "scale": {"create_seconds": scale.create_seconds, "factor": scale.factor,
                      "real_create_seconds": REAL_CREATE_SECONDS,
                      "sample_seconds": scale.sample_seconds,
                      "settings": changed(config or policy()),
                      "env": scale.env(1, 3, replica, hourly_usd, config)},
            "runs": runs}  # fmt: skip


def swings(steps: list[dict[str, Any]], in_window: float) -> list[str]:
    """Each step that reversed the one before it (out then in, or in then out) starting within
    `in_window` seconds (the scaled SCALE_IN_WINDOW_SECONDS) of that one's end: the set swung."""
    out = []
    for before, step in itertools.pairwise(steps):
        turn = (before["to"] - before["from"]) * (step["to"] - step["from"]) < 0
        end = before.get("finished")
        if turn and end is not None and step["started"] - end < in_window:
            out.append(f"run {step['run']} ({step['from']}->{step['to']}) "
                       f"{step['started'] - end:.1f} s after run {before['run']} "
                       f"({before['from']}->{before['to']})")  # fmt: skip
    return out


def timeline(run: dict[str, Any]) -> str:
    """Each step: its run, from -> to replicas, when it started, joined/left, ended (s from the
    load's start)."""
    parts = []
    for s in run.get("steps") or []:
        moved = {**s.get("joined", {}), **s.get("left", {})}
        what = ", ".join(f"{'+' if n in s.get('joined', {}) else '-'}{n}@{t}"
                         for n, t in moved.items())  # fmt: skip
        parts.append(f"run {s['run']}: {s.get('from')}->{s.get('to')} at {s['started']}s"
                     f" ({what or 'no change'}; {s.get('conclusion')} at {s.get('finished')}s)")  # fmt: skip
    return "; ".join(parts) or "-"


def table(result: dict[str, Any]) -> str:
    def cell(value: Any) -> str:
        return "-" if value is None else f"{value:.1f}" if isinstance(value, float) else str(value)

    rows = ["| label | replicas | replica-hours (scaled) | replica-s | TTFT p50 ms | TTFT p95 ms "
            "| E2E p50 ms | requests | failed | runs | swings | steps |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in result["runs"]:
        if r.get("blocked"):
            rows.append(f"| {r.get('label', r['mode'])} | blocked: {r['blocked']} |" + " |" * 10)
            continue
        rows.append("| " + " | ".join(cell(v) for v in (
            r.get("label", r["mode"]), r["replicas"], r["replica_hours_scaled"],
            r["replica_seconds"], r["ttft_p50_ms"], r["ttft_p95_ms"], r["e2e_p50_ms"],
            r["requests"], r["failed"], r["runs"], "; ".join(r.get("swings") or []) or "none",
            timeline(r))) + " |")  # fmt: skip
    sc = result["scale"]
    rows += ["", f"trace: {result['seconds']} s, {result['requests_in_trace']} requests, seed "
             f"{result['seed']}; one replica carries about {result['one_replica_rps']} req/s "
             f"(max-num-seqs {result['replica_model']['max_num_seqs']}); time scale "
             f"{sc['factor']:g} (create {sc['create_seconds']} s here for "
             f"{sc['real_create_seconds']:g} s real): the trace stands for "
             f"{result['seconds'] * sc['factor'] / 3600:.2f} h, replica-hours = replica-s * "
             f"{sc['factor']:g} / 3600; autoscaler: " + " ".join(
                 f"{k}={v}" for k, v in sc["env"].items() if v)]  # fmt: skip
    for r in result["runs"]:
        for f in r.get("failures") or []:
            rows.append(f"FAILED ({r['mode']}): request {f['index']} at {f['start_s']} s: "
                        f"{f['status']}")  # fmt: skip
        for problem in r.get("pipeline_problems") or []:
            rows.append(f"PIPELINE ({r['mode']}): {problem}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--seconds", type=float, default=180.0, help="the trace's length")
    parser.add_argument("--create-seconds", type=float, default=Scale.create_seconds,
                        help=f"a new replica's arrival here (real: {REAL_CREATE_SECONDS:g} s)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="an autoscale setting in real units, scaled as the defaults are "
                        f"(repeatable): {', '.join(TUNABLE)}")  # fmt: skip
    parser.add_argument("--label", help="the row's name in the table (default: the mode)")
    args = parser.parse_args(argv)
    try:
        config = policy(args.set)
    except SettingError as err:
        parser.error(str(err))
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"unknown modes: {', '.join(unknown)}; accepted: {', '.join(MODES)}")
    if args.seconds <= 0 or args.create_seconds <= 0:
        parser.error("--seconds and --create-seconds are positive")
    result = measure(modes, args.seconds, Scale(args.create_seconds), args.seed, config=config,
                     label=args.label)  # fmt: skip
    print(json.dumps(result), flush=True)
    print(table(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
