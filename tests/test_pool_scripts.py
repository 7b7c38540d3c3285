"""A replica's phases for real in the sandbox (the fake vLLM behind the real Caddy release): the
private gateway, the drain before a restart and the return to the pool after ready."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import requests
import sandbox
from pulumi_harness import stack_config
from sandbox import Downloads, PhaseRun, Sandbox, free_port
from test_balancer import needs_router, running_router
from test_balancer import replica as fake_replica
from test_phase_scripts import API_KEY, Phases, box, prepared

from components.host import gateway, phase_settings, phases, pool, router, script_text, wake
from components.host.phase_settings import Inputs
from components.spec import catalog, config

__all__ = ["box"]  # the fixture, used by name

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def replica(box: Sandbox, downloads: Downloads) -> tuple[Phases, str]:
    """Replica phases of a two-replica set; its gateway on the sandbox's HTTP port."""
    p = prepared(box, downloads)
    raw = stack_config("dev")
    raw["replicas"] = 2
    p.cfg = config.parse(raw, "dev", frozenset({"autodown"}))
    url = f"http://127.0.0.1:{box.http_port}"
    # As rendered for a replica behind the Caddy balancer, on the sandbox's port; this host
    # stands for replica 0 too (the reader of /metrics).
    listener = gateway.ReplicaListener(
        "127.0.0.1", box.http_port, metrics_reader="127.0.0.1", retry_elsewhere=True
    )
    p.extra["gateway"] = {
        "NEMO_HOST": "127.0.0.1",
        "NEMO_CADDYFILE": gateway.replica_site(
            p.cfg,
            listener,
            gateway.Listen(upstream_port=box.vllm_port, admin_socket=catalog.CADDY_ADMIN_SOCKET),
        ),
    }
    p.extra["service"] = {
        "NEMO_DRAIN_NOTICE_SECONDS": 1,
        "NEMO_METRICS_URL": f"http://127.0.0.1:{box.vllm_port}/metrics",
    }
    p.extra["ready"] = {
        "NEMO_PROBE_URL": f"{url}/v1/chat/completions",
        "NEMO_PROBE_RESOLVE": f"127.0.0.1:{box.http_port}:127.0.0.1",
        "NEMO_PROBE_CA": "",
        "NEMO_REJOIN_SECONDS": 1,
    }
    return p, url


def test_the_balancers_ready_probes_its_own_public_entry_with_acme_patience() -> None:
    """The balancer has no private listener: ready goes through its public gate, its name
    resolved to itself, with the patience a lone gateway has for an ACME failure that may pass
    (replicas wait for none: they hold no certificate)."""
    raw = stack_config("dev")
    raw["replicas"] = 2
    cfg = config.parse(raw, "dev")
    host = "203-0-113-201.sslip.io"
    ready = phases.balancer_settings(cfg, "ready", api_key=API_KEY, host=host)
    assert ready["NEMO_PROBE_URL"] == f"https://{host}/v1/chat/completions"
    assert ready["NEMO_PROBE_RESOLVE"] == f"{host}:443:127.0.0.1"
    assert ready["NEMO_HOST"] == host
    assert ready["NEMO_ACME_PATIENCE"] == phase_settings.ACME_PATIENCE_SECONDS
    assert ready["NEMO_DRAIN_FILE"] == "" and ready["NEMO_REJOIN_SECONDS"] == 0
    assert ready["NEMO_UNIT"] == "" and ready["NEMO_ENV_FILE"] == gateway.GATEWAY_ENV_FILE
    plain = config.parse({**raw, "access": {**raw["access"], "https": False}}, "dev")
    probe = phases.balancer_settings(plain, "ready", api_key=API_KEY, host="203.0.113.201")
    assert probe["NEMO_PROBE_URL"] == "http://203.0.113.201/v1/chat/completions"
    assert probe["NEMO_ACME_PATIENCE"] == 0


def health(url: str) -> int:
    return requests.get(f"{url}/health", timeout=5).status_code


def phase_settings_for(cfg: config.StackConfig, phase: str) -> dict[str, Any]:
    return dict(
        phases.settings(
            cfg,
            phase,
            api_key=API_KEY,
            host="203.0.113.201",
            replica=1,
            private_ip="10.110.0.3",
        )
    )


def stream(url: str, tokens: int | None = None, timeout: float = 60) -> dict[str, Any]:
    """A streamed chat completion through the replica (at most `tokens`, when given): its
    status, body and when it ended."""
    body: dict[str, Any] = {"model": "nemotron", "stream": True}
    if tokens is not None:
        body["max_tokens"] = tokens
    body["messages"] = [{"role": "user", "content": "hi"}]
    r = requests.post(f"{url}/v1/chat/completions", headers=AUTH, json=body, timeout=timeout)
    return {"status": r.status_code, "body": r.text, "ended": time.monotonic()}


def test_a_replica_drains_before_its_restart_and_rejoins_after_ready(
    box: Sandbox, downloads: Downloads
) -> None:
    p, url = replica(box, downloads)
    conf = box.file("/etc/fake-vllm.conf")
    # Each answer takes 2 s: long enough to be in flight when the update starts.
    conf.write_text(conf.read_text() + "FAKE_OPENAI_ARGS='--ttft 2'\n")
    p.ok("service")
    p.ok("gateway")
    p.ok("ready")
    assert health(url) == 200
    # The replica's vLLM metrics, for the key only (autodown on replica 0 reads them).
    assert requests.get(f"{url}/metrics", timeout=5).status_code == 401
    metrics = requests.get(f"{url}/metrics", headers=AUTH, timeout=5)
    assert "vllm:num_requests_running" in metrics.text

    answer: dict[str, Any] = {}
    client = threading.Thread(target=lambda: answer.update(stream(url, timeout=30)))
    client.start()
    time.sleep(0.5)
    # New weights: the service restarts, and drains first.
    box.file(catalog.MODEL_MARKER, "nvidia/other@main\n")
    update: dict[str, Any] = {}
    service = threading.Thread(target=lambda: update.update(run=p.run("service")))
    service.start()
    seen = []
    while service.is_alive():
        seen.append(health(url))
        time.sleep(0.2)
    client.join()
    run = update["run"]
    assert run.returncode == 0, run.stderr
    assert 503 in seen, "the balancer's checks saw the drain"
    assert "[service] step drain" in run.stderr
    assert "[service] no request in flight" in run.stderr
    # The request already running finished whole: the restart waited for it.
    assert answer["status"] == 200 and "data: [DONE]" in answer["body"], answer
    # Out of the pool until ready has seen it answer again.
    assert (box.run_dir / pool.drain_file().removeprefix("/run/")).exists()
    assert health(url) == 503
    back = p.run("ready")
    assert back.returncode == 0, back.stderr
    assert "[ready] step rejoin" in back.stderr
    assert health(url) == 200
    # An update that does not restart vLLM does not drain.
    again = p.run("service")
    assert again.returncode == 0 and "step drain" not in again.stderr


# ---- the Caddy balancer Droplet: join, reload, leave ------------------------------------------


class Balancer:
    """The balancer Droplet's phases in the sandbox: plain HTTP on the sandbox's port (the
    certificate path is the lone gateway's, tested elsewhere), replicas on loopback."""

    def __init__(
        self, box: Sandbox, downloads: Downloads, routing: str = "least-conn", router: str = ""
    ) -> None:
        self.p = Phases(box, downloads)
        raw = stack_config("dev")
        raw["replicas"] = 2
        raw["access"] = {**raw["access"], "https": False}
        raw["balancer"] = {"routing": routing}
        self.cfg = config.parse(raw, "dev")
        self.p.cfg = self.cfg
        self.box = box
        self.url = f"http://127.0.0.1:{box.http_port}"
        # With the router: its API and metrics addresses (host:port), this test's own ports.
        self.router, self.router_metrics = router, ""

    def settings(self, phase: str, **kwargs: Any) -> dict[str, Any]:
        # The sandbox cannot take ports 80 and 443: its own go in as the one Ports value that
        # both the Caddyfile and ready's probe are rendered from, which stay as rendered.
        ports = phase_settings.Ports(http=self.box.http_port, https=self.box.https_port)
        s = dict(
            phases.balancer_settings(
                self.cfg, phase, api_key=API_KEY, host="127.0.0.1", ports=ports, **kwargs
            )
        )
        s["NEMO_RETRY_DELAY"] = 0
        if self.router:
            # The router on this test's ports instead of router.py's (one test may hold them).
            for name, value in list(s.items()):
                if isinstance(value, str):
                    moved = value.replace(router.ADDRESS, self.router)
                    s[name] = moved.replace(router.METRICS_ADDRESS, self.router_metrics)
        if phase == "ready":
            s["NEMO_READY_TIMEOUT"] = 20
        if phase == "gateway":
            s["NEMO_CADDY_URL"] = self.p.caddy_url
        return s

    def run(self, phase: str, inner: str = "bash -s", **kwargs: Any) -> PhaseRun:
        script = phases.render(phase, self.settings(phase, **kwargs))
        return self.box.run(script, inner=inner)

    def member(self, index: int, port: int) -> dict[str, Any]:
        """Replica `index`'s member settings as the program renders them for a replica at
        127.0.0.1 (its Droplet id: `port`, so each test replica has a file of its own), moved to
        the port the test's replica listens on: every setting that names the rendered address
        (the upstream, its line, the router's worker URL) names the test's one instead, and
        nothing else changes, so what the deployed script derives from the address stays the
        program's."""
        s = self.settings("member", replica=index, private_ip="127.0.0.1", droplet_id=str(port))
        rendered, mine = f"127.0.0.1:{catalog.REPLICA_PORT}", f"127.0.0.1:{port}"
        assert s["NEMO_UPSTREAM"] == rendered
        assert s["NEMO_WORKER_URL"] == router.worker_url(rendered)
        return {k: v.replace(rendered, mine) if isinstance(v, str) else v for k, v in s.items()}

    def join(self, index: int, port: int, leave: bool = False) -> PhaseRun:
        s = self.member(index, port)
        # The Command's delete runs the stored script with NEMO_ACTION=leave (entry.py).
        inner = "NEMO_ACTION=leave timeout 60 bash -s" if leave else "bash -s"
        return self.box.run(phases.render("member", s), inner=inner)


def test_the_balancer_joins_replicas_reloads_gracefully_and_drains_one_that_leaves(
    box: Sandbox, downloads: Downloads
) -> None:
    b = Balancer(box, downloads)
    assert b.run("preflight").returncode == 0
    first = b.run("gateway")
    assert first.returncode == 0, first.stderr
    wait_listening(b.url)
    # No replica yet: the gate stands, and the API answers 503 until one joins.
    chat = {"model": "nemotron", "messages": [{"role": "user", "content": "hi"}]}
    assert requests.post(f"{b.url}/v1/chat/completions", json=chat, timeout=10).status_code == 401
    none = requests.post(f"{b.url}/v1/chat/completions", json=chat, headers=AUTH, timeout=10)
    assert none.status_code == 503
    ports = [free_port(), free_port()]
    with ExitStack() as stack:
        for i, port in enumerate(ports):
            stack.enter_context(fake_replica(f"r{i}", port, "--ttft", "2", "--api-key", API_KEY))
        upstreams = box.upper / catalog.BALANCER_UPSTREAMS_DIR.lstrip("/")
        for i, port in enumerate(ports):
            joined = b.join(i, port)
            assert joined.returncode == 0, joined.stderr
            assert joined.result["changed"] is True
            # The join mark the front's waker waits for comes after Caddy's reload, and is as
            # new as the file.
            steps = re.findall(r"\[member\] step (\w+)", joined.stderr)
            assert steps == ["file", "reload", "mark"], joined.stderr
            (file,) = upstreams.glob(f"replica-{i}-*.caddy")
            mark = file.parent / (file.name + catalog.BALANCER_JOINED_SUFFIX)
            assert mark.stat().st_mtime_ns >= file.stat().st_mtime_ns
        assert b.join(0, ports[0]).result["changed"] is False, "joining again changes nothing"
        # A join cut after its file and before its mark (the front rebooted in its reload):
        # joining again reloads and marks it.
        (mark,) = upstreams.glob(f"replica-0-*.caddy{catalog.BALANCER_JOINED_SUFFIX}")
        mark.unlink()
        rejoined = b.join(0, ports[0])
        assert rejoined.returncode == 0, rejoined.stderr
        assert "its join was not completed: reloading" in rejoined.stderr
        assert re.findall(r"\[member\] step (\w+)", rejoined.stderr) == ["file", "reload", "mark"]
        assert mark.exists() and b.join(0, ports[0]).result["changed"] is False
        time.sleep(2.5)  # the first active health checks
        answer = requests.post(f"{b.url}/v1/chat/completions", json=chat, headers=AUTH, timeout=10)
        assert answer.status_code == 200 and answer.headers["X-Upstream"] in ("r0", "r1")
        # The balancer's ready: a chat completion through it, with the key from its gateway's
        # env file (no vLLM of its own to watch).
        ready = b.run("ready")
        assert ready.returncode == 0, ready.stderr
        assert "[ready] answered after" in ready.stderr

        # A new Caddyfile (a body limit) on a live balancer: reloaded, the stream goes on.
        streams: list[dict[str, Any]] = []
        thread = threading.Thread(target=lambda: streams.append(post(b.url, chat)))
        thread.start()
        time.sleep(0.5)
        b.cfg = config.parse(
            {**stack_config("dev"), "replicas": 2, "balancer": {"routing": "least-conn"}, "access": {
                **stack_config("dev")["access"], "https": False, "maxRequestBodyMb": 8}},
            "dev",
        )  # fmt: skip
        reloaded = b.run("gateway")
        assert reloaded.returncode == 0, reloaded.stderr
        assert "reloaded gracefully" in reloaded.stderr
        thread.join()
        assert streams[0]["status"] == 200 and "data: [DONE]" in streams[0]["body"]
        log = box.file("/var/lib/fake-systemd/log").read_text()
        assert log.count("restart caddy.service") == 1, "a live balancer is never restarted"

        # Replica 1 leaves (its Droplet is about to be replaced) with a stream in flight on it.
        victim = ports[1]
        through: list[dict[str, Any]] = []
        waits = [
            threading.Thread(target=lambda: through.append(post(b.url, chat))) for _ in range(4)
        ]
        for t in waits:
            t.start()
        time.sleep(0.5)
        started = time.monotonic()
        left = b.join(1, victim, leave=True)
        took = time.monotonic() - started
        for t in waits:
            t.join()
        assert left.returncode == 0, left.stderr
        assert left.result["left"] is True
        assert "[member] no request in flight to" in left.stderr
        # Two of the four went to the replica leaving: it waited for them, and all finished.
        assert took > 0.5, "the leave waited for the requests in flight"
        assert all(r["status"] == 200 and "data: [DONE]" in r["body"] for r in through), through
        assert not list((box.upper / catalog.BALANCER_UPSTREAMS_DIR.lstrip("/")).glob("*1-*"))
        for _ in range(5):
            answer = requests.post(
                f"{b.url}/v1/chat/completions", json=chat, headers=AUTH, timeout=10
            )
            assert answer.headers["X-Upstream"] == "r0", "no new request to the replica that left"
        again = b.join(1, victim, leave=True)
        assert again.returncode == 0 and "not in the pool" in again.stderr


def post(base: str, chat: dict[str, Any]) -> dict[str, Any]:
    r = requests.post(
        f"{base}/v1/chat/completions",
        json={**chat, "stream": True},
        headers=AUTH,
        timeout=30,
    )
    return {"status": r.status_code, "body": r.text, "upstream": r.headers.get("X-Upstream")}


def test_a_replica_drains_before_a_reboot_too(box: Sandbox, downloads: Downloads) -> None:
    p, url = replica(box, downloads)
    p.extra["reboot"] = {
        "NEMO_DRAIN_NOTICE_SECONDS": 1,
        "NEMO_METRICS_URL": f"http://127.0.0.1:{box.vllm_port}/metrics",
    }
    p.ok("service")
    p.ok("gateway")
    p.ok("ready")
    assert p.ok("reboot")["rebooting"] is False, "no reason: no drain, no reboot"
    assert health(url) == 200
    reasons = box.run_dir / "nemotron" / "reboot-required.d"
    reasons.mkdir(parents=True, exist_ok=True)
    (reasons / "driver").write_text("driver 580 installed\n")
    run = p.run("reboot")
    assert run.returncode == 0, run.stderr
    assert run.result["rebooting"] is True
    assert "[reboot] step drain" in run.stderr and "[reboot] no request in flight" in run.stderr
    # Out of the pool while it goes down; the reboot empties /run, which ends the drain.
    assert health(url) == 503
    assert (box.run_dir / pool.drain_file().removeprefix("/run/")).exists()


# ---- bounds and the end of a drain -----------------------------------------------------------

# What each phase may wait for, by its rendered settings (seconds): preflight waits for
# cloud-init, then for the package locks, each NEMO_WAIT_SECONDS.
WAITS = {
    "preflight": ("NEMO_WAIT_SECONDS", "NEMO_WAIT_SECONDS"),
    "cache": ("NEMO_CACHE_WAIT_SECONDS",),
    "reboot": ("NEMO_DRAIN_NOTICE_SECONDS", "NEMO_DRAIN_SECONDS"),
    "service": ("NEMO_DRAIN_NOTICE_SECONDS", "NEMO_DRAIN_SECONDS"),
    "ready": ("NEMO_READY_TIMEOUT", "NEMO_REJOIN_SECONDS"),
}
# Past its waits: a drain's last look at the metrics, ready's last probe (curl --max-time 60
# and its 5 s pause), and a minute for the phase's own steps.
OVERSHOOT = {"reboot": 7, "service": 7, "ready": 65}
OWN_WORK_SECONDS = 60


def configs() -> list[config.StackConfig]:
    lone = config.parse(stack_config("dev"), "dev")
    raw = stack_config("dev")
    raw["replicas"] = 3
    caddy = config.parse(raw, "dev")
    raw["access"] = {**raw["access"], "domain": "api.example.com", "dnsZone": "example.com"}
    raw["access"]["acmeEmail"] = "ops@example.com"
    raw["vllm"] = {**raw.get("vllm", {}), "maxModelLen": 131072}
    raw["bootstrap"] = {**raw.get("bootstrap", {}), "readyTimeoutMinutes": 90}
    managed = config.parse(raw, "dev")
    assert (caddy.balancer_kind, managed.balancer_kind) == ("caddy", "managed")
    return [lone, caddy, managed]


def test_every_phase_bound_holds_what_it_waits_for() -> None:
    """A bound shorter than a wait inside it stops the phase mid-wait on every run: the reboot
    phase (5 minutes) was stopped in a drain of up to 10."""
    for cfg in configs():
        for phase in phases.BOOTSTRAP:
            if phase.name not in WAITS:
                continue
            s = phase_settings_for(cfg, phase.name) if cfg.pooled else dict(
                phases.settings(cfg, phase.name, api_key=API_KEY, host="203.0.113.9")
            )  # fmt: skip
            keys = WAITS[phase.name]
            if "NEMO_DRAIN_FILE" in s and not s["NEMO_DRAIN_FILE"]:
                keys = ()  # a lone Droplet drains nothing
            waits = sum(int(s[key]) for key in keys)
            need = waits + OVERSHOOT.get(phase.name, 0) + OWN_WORK_SECONDS
            bound = phases.minutes(cfg, phase) * 60
            assert bound >= need, (cfg.replicas, phase.name, bound, need)
            if phase.drains and cfg.pooled:
                assert bound >= pool.drain_bound_seconds(cfg) + 60 * phase.minutes
    # The balancer's member leaving waits for a replica's requests in flight.
    member = phases.balancer_settings(configs()[1], "member", private_ip="10.110.0.3")
    leave = int(member["NEMO_LEAVE_SECONDS"]) + 7 + OWN_WORK_SECONDS
    assert leave <= phases.LEAVE_MINUTES * 60
    # The drain's bound counts lib.sh's own look and pause.
    lib = (phase_settings.PHASES_DIR / "lib.sh").read_text()
    assert re.search(rf"^METRICS_READ_SECONDS={pool.METRICS_READ_SECONDS}$", lib, re.M)
    assert re.search(rf"^DRAIN_POLL_SECONDS={pool.DRAIN_POLL_SECONDS}$", lib, re.M)


def test_a_drain_ends_on_stuck_gauges_and_a_stopped_drain_ends_itself(
    box: Sandbox, downloads: Downloads
) -> None:
    """vLLM's gauges stay up after aborted requests (vllm-project/vllm#22545): the drain waits
    while tokens move, then ends after the stall window with no token moving, long before
    NEMO_DRAIN_SECONDS (600, as rendered). A reboot phase stopped at its bound in a drain ends
    the drain on its way out (the replica serves on, nothing went down), and a second run goes
    through."""
    p, url = replica(box, downloads)
    conf = box.file("/etc/fake-vllm.conf")
    # Two requests the gauges never let go of; a token every 0.5 s for the real ones.
    conf.write_text(conf.read_text() + "FAKE_OPENAI_ARGS='--stuck-requests 2 --itl 0.5'\n")
    reboot = {
        "NEMO_DRAIN_NOTICE_SECONDS": 1,
        "NEMO_METRICS_URL": f"http://127.0.0.1:{box.vllm_port}/metrics",
    }
    p.extra["reboot"] = reboot
    p.ok("service")
    p.ok("gateway")
    p.ok("ready")
    reasons = box.run_dir / "nemotron" / "reboot-required.d"
    reasons.mkdir(parents=True, exist_ok=True)
    (reasons / "driver").write_text("driver 580 installed\n")
    drain_file = box.run_dir / pool.drain_file().removeprefix("/run/")
    script = phases.render("reboot", p.settings("reboot"), minutes=1)
    assert "NEMO_DRAIN_SECONDS=600" in script

    # Stopped mid-drain (the runner's TERM at the bound; 3 s here, the stall window is 60 s).
    stopped = box.run(script, inner="timeout --kill-after=10 3 bash -s")
    assert stopped.returncode == 124, stopped.stderr
    assert "[reboot] step drain" in stopped.stderr
    assert "stopped while draining, before anything restarted: the drain ends" in stopped.stderr
    assert not drain_file.exists() and health(url) == 200, "back in the pool"
    assert not box.reboot_requested()

    # Run again, with a 3 s stall window, while a stream makes tokens for 6 s.
    reboot["NEMO_DRAIN_STALL_SECONDS"] = 3
    client: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: client.update(stream(url, 12)))
    thread.start()
    time.sleep(0.5)
    started = time.monotonic()
    run = p.run("reboot")
    ended = time.monotonic()
    thread.join()
    assert run.returncode == 0, run.stderr
    assert run.result["rebooting"] is True and box.reboot_requested()
    assert client["status"] == 200 and "data: [DONE]" in client["body"]
    # Tokens moved until the stream ended: the drain waited past it, then 3 s more.
    assert client["ended"] + 2 < ended < started + 30, (client["ended"], started, ended)
    assert "no token generated or prefilled for 3s: stuck gauges" in run.stderr
    assert drain_file.exists() and health(url) == 503, "out of the pool while it goes down"


WAKE_TOKEN = "github_pat_SANDBOXwakeTOKEN0000000000000000"


def test_the_front_installs_its_waker_with_the_token_root_only_then_removes_it_when_off(
    box: Sandbox, downloads: Downloads
) -> None:
    """The wake phase on the balancer: the waker's package, its settings and the pipeline's
    token (root-only, read by the unit as a credential), its unit; it answers on loopback.
    Turned off, all of it goes, the token first of all."""
    b = Balancer(box, downloads)
    assert b.run("preflight").returncode == 0
    off_cfg = b.cfg
    raw = stack_config("dev")
    raw["access"] = {**raw["access"], "https": False}
    raw["wake"] = {"enabled": True, "githubRepo": "me/llm", "token": WAKE_TOKEN}
    b.cfg = config.parse(raw, "dev", frozenset({"wake"}))
    # A front upgraded from the single-file waker of earlier releases, and from the package
    # alone at the folder's path (its parent on PYTHONPATH), with a module since removed.
    old_script = box.file(wake.OLD_SCRIPT_PATH)
    old_script.parent.mkdir(parents=True, exist_ok=True)
    old_script.write_text("# the single-file waker\n")
    package = box.file(wake.TREE_DIR)
    package.mkdir()
    for stale in ("__init__.py", "__main__.py", "hold.py"):
        (package / stale).write_text("# the package alone, as an earlier release installed it\n")
    on = b.run("wake")
    assert on.returncode == 0, on.stderr
    assert on.result["wake"] == "on" and on.result["changed"] is True
    assert WAKE_TOKEN not in on.stdout + on.stderr
    # The folder: the package and its clients side by side, every module as the program ships
    # it, and no stale file of an earlier layout in or beside it.
    assert not old_script.exists()
    assert sorted(p.name for p in package.iterdir()) == ["clients", "wake"]
    shipped = phase_settings.balancer_wake(b.cfg, Inputs())["NEMO_WAKE_TREE"]
    assert isinstance(shipped, str)
    assert sorted(p.relative_to(package).as_posix() for p in package.rglob("*.py")) == sorted(
        re.findall(r"^file (\S+) \d+$", shipped, re.M)
    )
    assert (package / "wake" / "decision.py").read_text() == script_text.python(
        (phase_settings.PHASES_DIR / "wake" / "decision.py").read_text()
    )
    restarts = box.file("/var/lib/fake-systemd/log")
    token = box.file(wake.TOKEN_FILE)
    assert token.read_text().strip() == WAKE_TOKEN and oct(token.stat().st_mode & 0o777) == "0o600"
    assert oct(box.file(wake.ENV_FILE).stat().st_mode & 0o777) == "0o600"
    unit = box.file(f"/etc/systemd/system/{wake.UNIT}").read_text()
    assert f"LoadCredential=token:{wake.TOKEN_FILE}" in unit and "DynamicUser=yes" in unit
    assert f"WorkingDirectory={wake.TREE_DIR}\n" in unit and "PYTHONPATH" not in unit
    assert WAKE_TOKEN not in unit + box.file(wake.ENV_FILE).read_text()
    assert "the waker answers; the set is asleep" in on.stderr
    # The sandbox has no GitHub: the waker's look at the pipeline is said, and stops nothing.
    assert "[wake] warning: GitHub could not be reached" in on.stderr, on.stderr
    started = restarts.read_text().count(f"restart {wake.UNIT}")
    again = b.run("wake")
    assert again.returncode == 0 and again.result["changed"] is False
    assert restarts.read_text().count(f"restart {wake.UNIT}") == started, (
        "the same tree: no restart"
    )
    # A module that differs from the tree (an upgrade): installed, and the waker restarted.
    (package / "wake" / "log.py").write_text("# another release\n")
    mended = b.run("wake")
    assert mended.returncode == 0 and mended.result["changed"] is True, mended.stderr
    assert restarts.read_text().count(f"restart {wake.UNIT}") == started + 1
    assert "the waker answers; the set is asleep" in mended.stderr
    b.cfg = off_cfg
    off = b.run("wake")
    assert off.returncode == 0 and off.result["wake"] == "off" and off.result["changed"] is True
    journal = box.file("/var/log/fake-nemotron-wake.log").read_text()
    assert WAKE_TOKEN not in off.stdout + off.stderr + journal, "nor in the waker's own log"
    for path in (
        wake.TOKEN_FILE,
        wake.ENV_FILE,
        wake.TREE_DIR,
        f"/etc/systemd/system/{wake.UNIT}",
    ):
        assert not box.file(path).exists(), path


def test_the_wake_phase_marks_the_replicas_that_joined_before_join_marks(
    box: Sandbox, downloads: Downloads
) -> None:
    """A front whose replicas joined before member.sh wrote join marks: the waker counts a
    replica ready only with its mark, so the wake phase marks each file there (after a graceful
    reload of a running Caddy) before the waker starts, and an awake front stays awake; once
    marked, a wake phase again changes nothing."""
    b = Balancer(box, downloads)
    assert b.run("preflight").returncode == 0
    old = box.file(pool.upstream_file(0, "7"))
    old.parent.mkdir(parents=True, exist_ok=True)
    old.write_text("to 127.0.0.1:9\n")
    raw = stack_config("dev")
    raw["access"] = {**raw["access"], "https": False}
    raw["wake"] = {"enabled": True, "githubRepo": "me/llm", "token": WAKE_TOKEN}
    b.cfg = config.parse(raw, "dev", frozenset({"wake"}))
    on = b.run("wake")
    assert on.returncode == 0, on.stderr
    assert f"marked {old.name}: Caddy routes to it" in on.stderr
    assert box.file(pool.joined_file(0, "7")).read_text() == old.read_text()
    again = b.run("wake")
    assert again.returncode == 0 and again.result["changed"] is False, again.stderr
    assert "every replica's join is marked" in again.stderr


def test_a_front_the_retired_autoscaler_ran_loses_its_copy_of_the_api_key(
    box: Sandbox, downloads: Downloads
) -> None:
    """The Droplet autoscaler kept the stack's API key on the front (root-only, a second
    credential of the waker's unit) to read the replicas' /metrics. The waker reads none now:
    the wake phase removes the key wherever a front still has it, on or off, and installs the
    unit without it (the waker restarted); the token stays while wake is on."""
    b = Balancer(box, downloads)
    assert b.run("preflight").returncode == 0
    off_cfg = b.cfg
    raw = stack_config("dev")
    raw["access"] = {**raw["access"], "https": False}
    raw["wake"] = {"enabled": True, "githubRepo": "me/llm", "token": WAKE_TOKEN}
    b.cfg = config.parse(raw, "dev", frozenset({"wake"}))
    assert b.run("wake").returncode == 0
    unit_path = box.file(f"/etc/systemd/system/{wake.UNIT}")
    unit = unit_path.read_text()
    assert "apikey" not in unit and "WAKE_API_KEY" not in box.file(wake.ENV_FILE).read_text()
    # What the autoscaler's wake phase left: the key, and the unit that loaded it.
    key = box.file(wake.OLD_KEY_FILE)
    key.write_text(API_KEY + "\n")
    key.chmod(0o600)
    old = f"LoadCredential=apikey:{wake.OLD_KEY_FILE}\nEnvironment=WAKE_API_KEY_FILE=%d/apikey\n"
    unit_path.write_text(unit.replace("ExecStart=", old + "ExecStart=", 1))
    again = b.run("wake")
    assert again.returncode == 0 and again.result["changed"] is True, again.stderr
    assert not key.exists(), "the key goes"
    assert unit_path.read_text() == unit, "the unit loads the token alone"
    assert box.file(wake.TOKEN_FILE).exists()
    assert API_KEY not in again.stdout + again.stderr
    # Off, too: a front whose waker is removed keeps no key.
    key.write_text(API_KEY + "\n")
    b.cfg = off_cfg
    off = b.run("wake")
    assert off.returncode == 0 and off.result["wake"] == "off", off.stderr
    assert not key.exists() and not box.file(wake.TOKEN_FILE).exists()


# ---- the front's cache-aware router ---------------------------------------------------------


class Front(Balancer):
    """The router phase on the front: uv from a wheel shaped as PyPI's (the fake uv inside), the
    real router (.router-venv) behind the fake uv's entry point, on ports of its own."""

    def __init__(self, box: Sandbox, downloads: Downloads) -> None:
        super().__init__(box, downloads, "cache-aware")
        assert self.cfg.routing == "cache-aware"
        wheel = sandbox.uv_wheel(catalog.UV_VERSION)
        self.uv_url = downloads.add(f"/uv/{catalog.UV_WHEEL_URL.rsplit('/', 1)[1]}", wheel)
        self.uv_sha = hashlib.sha256(wheel).hexdigest()
        self.port, self.metrics_port = free_port(), free_port()
        self.lock = phase_settings.router_lock_text()

    def settings(self, phase: str, **kwargs: Any) -> dict[str, Any]:
        s = super().settings(phase, **kwargs)
        if phase != "router" or s["NEMO_ROUTER_MODE"] != "on":
            return s
        start = str(s["NEMO_ROUTER_START_TEXT"])
        for flag, port in (
            ("--port", catalog.ROUTER_PORT),
            ("--prometheus-port", catalog.ROUTER_METRICS_PORT),
        ):
            assert f" {flag} {port} " in start
        start = start.replace(f" --port {catalog.ROUTER_PORT} ", f" --port {self.port} ")
        start = start.replace(
            f" --prometheus-port {catalog.ROUTER_METRICS_PORT} ",
            f" --prometheus-port {self.metrics_port} ",
        )
        # Where the script itself asks the router (the unit's ExecStartPost, its late joins).
        start = start.replace(router.ADDRESS, f"127.0.0.1:{self.port}")
        s.update(
            NEMO_UV_WHEEL_URL=self.uv_url,
            NEMO_UV_WHEEL_SHA256=self.uv_sha,
            NEMO_ROUTER_PYTHON_VERSION=sandbox.system_python_version(),
            NEMO_ROUTER_LOCK_TEXT=self.lock,
            NEMO_ROUTER_START_TEXT=start,
            NEMO_ROUTER_ADDRESS=f"127.0.0.1:{self.port}",
            NEMO_ROUTER_METRICS_ADDRESS=f"127.0.0.1:{self.metrics_port}",
        )
        return s


def listeners(*ports: int) -> list[str]:
    """The local addresses listening on these TCP ports (this machine's namespace: the sandbox's)."""
    out = subprocess.run(["ss", "-Hltn"], capture_output=True, text=True, check=True).stdout
    return sorted(
        line.split()[3]
        for line in out.splitlines()
        if int(line.split()[3].rsplit(":", 1)[1]) in ports
    )


ROUTER_PATHS = (
    catalog.ROUTER_LOCK_PATH,
    router.START_SCRIPT,
    f"/etc/systemd/system/{catalog.ROUTER_UNIT}",
    catalog.ROUTER_PREFIX,
    catalog.UV_BIN,
)


@pytest.mark.skipif(
    not sandbox.ROUTER.exists(),
    reason="no .router-venv: ./check installs the locked vllm-router there",
)
def test_the_front_installs_the_router_from_its_lock_runs_it_on_loopback_then_removes_it(
    box: Sandbox, downloads: Downloads
) -> None:
    """The router phase: uv from its wheel (sha256 checked), a venv, the router from the lock,
    its start script and unit; the real router answers on loopback only, API and metrics. A
    second run changes nothing; a new lock installs again; off removes all of it."""
    f = Front(box, downloads)
    assert f.run("preflight").returncode == 0
    on = f.run("router")
    assert on.returncode == 0, on.stderr
    assert on.result["router"] == "on" and on.result["changed"] is True
    assert f"installed uv {catalog.UV_VERSION}" in on.stderr
    assert downloads.requests.count(f.uv_url.removeprefix(downloads.url)) == 1
    assert box.file(catalog.ROUTER_LOCK_PATH).read_text() == f.lock + "\n"
    lock_sha = hashlib.sha256(box.file(catalog.ROUTER_LOCK_PATH).read_bytes()).hexdigest()
    assert box.file(f"{catalog.ROUTER_PREFIX}/.nemotron-lock").read_text().strip() == lock_sha
    assert (
        box.file(f"{catalog.ROUTER_PREFIX}/router-version").read_text().strip()
        == catalog.ROUTER_VERSION
    )
    unit = box.file(f"/etc/systemd/system/{catalog.ROUTER_UNIT}").read_text()
    start = box.file(router.START_SCRIPT).read_text()
    assert unit == router.unit_text() + "\n"
    # Its unit's start made the file by which Caddy routes to it, once it answered.
    serving = box.run_dir / router.SERVING_FILE.removeprefix("/run/")
    assert serving.exists()
    # Nothing secret on its command line: no key in its unit or start script, nor a key flag.
    for text in (unit, start):
        assert API_KEY not in text and "--api-key" not in text and "api_key" not in text.lower()
    assert "the router answers" in on.stderr
    # The real router answers on loopback: its liveness and its metrics, on 127.0.0.1 alone.
    assert requests.get(f"http://127.0.0.1:{f.port}/liveness", timeout=5).status_code == 200
    assert listeners(f.port, f.metrics_port) == sorted(
        [f"127.0.0.1:{f.port}", f"127.0.0.1:{f.metrics_port}"]
    )
    log = box.file("/var/log/fake-nemotron-router.log").read_text()
    assert API_KEY not in log

    again = f.run("router")
    assert again.returncode == 0, again.stderr
    assert again.result["changed"] is False, again.stderr
    assert downloads.requests.count(f.uv_url.removeprefix(downloads.url)) == 1, (
        "uv is not fetched again"
    )

    # A new lock (a comment is enough to change its hash) installs again and restarts.
    f.lock += "\n# a new lock"
    new = f.run("router")
    assert new.returncode == 0, new.stderr
    assert new.result["changed"] is True
    assert "step install" in new.stderr and "installed from this lock already" not in new.stderr
    assert requests.get(f"http://127.0.0.1:{f.port}/liveness", timeout=5).status_code == 200

    # Off: Caddy no longer proxies to it (the gateway ran first): all of it goes.
    raw = stack_config("dev")
    raw["access"] = {**raw["access"], "https": False}
    raw["replicas"] = 2
    raw["balancer"] = {"routing": "least-conn"}
    f.cfg = config.parse(raw, "dev")
    assert f.cfg.routing == "least-conn"
    off = f.run("router")
    assert off.returncode == 0, off.stderr
    assert off.result["router"] == "off" and off.result["changed"] is True
    assert "removed the router" in off.stderr
    for path in ROUTER_PATHS:
        assert not box.file(path).exists(), path
    assert listeners(f.port, f.metrics_port) == [], "the router stopped"
    assert not serving.exists(), "its stop removed the file first"
    quiet = f.run("router")
    assert quiet.returncode == 0 and quiet.result["changed"] is False
    assert "no router installed" in quiet.stderr


def test_the_router_phase_fails_before_anything_on_a_wrong_uv_or_python_and_names_the_install(
    box: Sandbox, downloads: Downloads
) -> None:
    """A uv wheel whose sha256 is not the pinned one is refused before it is used: nothing of
    the router is installed. The rendered Python version (Ubuntu 24.04's 3.12) refuses another
    python3 with the fix. An install that fails names its step."""
    f = Front(box, downloads)
    assert f.run("preflight").returncode == 0
    rendered = dict(phases.balancer_settings(f.cfg, "router"))
    rendered["NEMO_RETRY_DELAY"] = 0
    python = box.run(phases.render("router", rendered))
    if sandbox.system_python_version() != catalog.ROUTER_PYTHON:
        assert python.returncode == 1
        assert "FAILED at step python" in python.failure
        assert (
            f"lock is for {catalog.ROUTER_PYTHON}" in python.failure
            and "Ubuntu 24.04" in python.failure
        )

    f.uv_sha = "0" * 64
    wrong = f.run("router")
    assert wrong.returncode == 1
    assert "FAILED at step uv: checksum mismatch" in wrong.failure, wrong.stderr
    assert "pin the release whose checksum you trust" in wrong.failure
    for path in ROUTER_PATHS:
        assert not box.file(path).exists(), path

    f.uv_sha = hashlib.sha256(sandbox.uv_wheel(catalog.UV_VERSION)).hexdigest()
    box.hw("uv_fails", "Failed to fetch: files.pythonhosted.org")
    failing = f.run("router")
    assert failing.returncode == 1
    assert (
        "FAILED at step install: uv could not install the router's locked packages"
        in failing.failure
    )
    assert "files.pythonhosted.org" in failing.failure
    assert failing.stderr.count("Failed to fetch") == 3, "retried, then failed"
    assert not box.file(f"/etc/systemd/system/{catalog.ROUTER_UNIT}").exists()


@needs_router
def test_with_the_router_a_replica_joins_it_and_leaves_it_drained(
    box: Sandbox, downloads: Downloads, tmp_path: Path
) -> None:
    """member.sh with balancer.routing cache-aware, against the real router (its flags from
    router.py, on this test's ports) and the front's real Caddy from the gateway phase: a
    join writes the file, reloads and adds the replica to the router (again: already in,
    nothing changes); requests go through Caddy and the router; a leave removes it from both
    and waits for its requests in flight by the router's gauge, after which no new request
    reaches it."""
    with running_router(tmp_path / "router", []) as r:
        b = Balancer(box, downloads, "cache-aware", r.url.removeprefix("http://"))
        b.router_metrics = r.metrics.removeprefix("http://").removesuffix("/metrics")
        member = b.settings("member", replica=0, private_ip="127.0.0.1")
        assert member["NEMO_ROUTER"] == "on"
        assert b.run("preflight").returncode == 0
        # What the router's unit makes once it answers (its ExecStartPost): Caddy routes to it.
        serving = box.run_dir / router.SERVING_FILE.removeprefix("/run/")
        serving.parent.mkdir(parents=True, exist_ok=True)
        serving.touch()
        first = b.run("gateway")
        assert first.returncode == 0, first.stderr
        wait_listening(b.url)
        chat = {"model": "nemotron", "messages": [{"role": "user", "content": "hi"}]}
        ports = [free_port(), free_port()]
        with ExitStack() as stack:
            for i, port in enumerate(ports):
                stack.enter_context(fake_replica(f"r{i}", port, "--ttft", "2", "--scale-out",
                                                 "--api-key", API_KEY))  # fmt: skip
            for i, port in enumerate(ports):
                joined = b.join(i, port)
                assert joined.returncode == 0, joined.stderr
                assert "[member] the router routes to" in joined.stderr
                # The waker's join mark once the router routes to it too (Caddy's upstream).
                steps = re.findall(r"\[member\] step (\w+)", joined.stderr)
                assert steps == ["file", "reload", "router", "mark"], joined.stderr
            again = b.join(0, ports[0])
            assert again.returncode == 0 and again.result["changed"] is False
            assert "the router already routes to" in again.stderr
            listed = requests.get(f"{r.url}/list_workers", timeout=5).text
            assert all(f"127.0.0.1:{p}" in listed for p in ports), listed
            time.sleep(2.5)  # Caddy's first checks of the replicas (the public /health)
            assert requests.get(f"{b.url}/health", timeout=5).status_code == 200
            answer = requests.post(f"{b.url}/v1/chat/completions", json=chat, headers=AUTH,
                                   timeout=10)  # fmt: skip
            assert answer.status_code == 200 and answer.headers["X-Upstream"] in ("r0", "r1")
            assert "Access-Control-Allow-Origin" not in answer.headers

            # Replica 1 leaves with requests in flight on it (each takes 2 s to its first token).
            through: list[dict[str, Any]] = []
            waits = [threading.Thread(target=lambda: through.append(post(b.url, chat)))
                     for _ in range(4)]  # fmt: skip
            for t in waits:
                t.start()
            time.sleep(0.5)
            # The one the router sent them to leaves (cache-aware keeps one prompt on one).
            held, victim = max((r.running(router.worker_url(f"127.0.0.1:{p}")) or 0, i)
                               for i, p in enumerate(ports))  # fmt: skip
            stays = 1 - victim
            started = time.monotonic()
            left = b.join(victim, ports[victim], leave=True)
            took = time.monotonic() - started
            for t in waits:
                t.join()
            assert left.returncode == 0, left.stderr
            assert "[member] the router sends no new request to" in left.stderr
            assert "[member] no request in flight to" in left.stderr
            assert held > 0, "requests were in flight to the replica that left"
            assert took > 0.5, "the leave waited for them (the router's gauge)"
            assert all(x["status"] == 200 and "data: [DONE]" in x["body"] for x in through)
            assert f"127.0.0.1:{ports[victim]}" not in requests.get(f"{r.url}/list_workers",
                                                               timeout=5).text  # fmt: skip
            for _ in range(5):
                answer = requests.post(f"{b.url}/v1/chat/completions", json=chat, headers=AUTH,
                                       timeout=10)  # fmt: skip
                assert answer.headers["X-Upstream"] == f"r{stays}", "none to the one that left"
            gone = b.join(victim, ports[victim], leave=True)
            assert gone.returncode == 0 and "not in the pool" in gone.stderr


def wait_listening(url: str) -> None:
    """The fake systemctl returns once Caddy is started, not once it listens (Type=notify)."""
    deadline = time.monotonic() + 15
    while True:
        try:
            requests.get(f"{url}/not-a-route", timeout=5)
            return
        except requests.ConnectionError:
            assert time.monotonic() < deadline, "the balancer's Caddy never listened"
            time.sleep(0.1)


def test_a_leave_whose_in_flight_count_cannot_be_read_waits_unless_nothing_runs(
    box: Sandbox, downloads: Downloads
) -> None:
    """The router's metrics do not answer while its unit runs (a busy front): the leave keeps
    waiting, to its bound, and says it could not read the count; it never takes an unanswered
    read for "nothing in flight", which would let the replica be deleted under its streams. A
    router that is not running holds nothing: the leave goes on at once."""
    b = Balancer(box, downloads, "cache-aware", f"127.0.0.1:{free_port()}")
    b.router_metrics = f"127.0.0.1:{free_port()}"  # nothing answers there
    assert b.run("preflight").returncode == 0
    port = free_port()
    s = {**b.member(1, port), "NEMO_LEAVE_SECONDS": 4}
    box.file(str(s["NEMO_UPSTREAM_FILE"]), f"{s['NEMO_UPSTREAM_LINE']}\n")
    # The router's unit runs (the fake systemctl reads its pid: this test's own, alive).
    box.file(f"/var/lib/fake-systemd/pid/{catalog.ROUTER_UNIT}", f"{os.getpid()}\n")
    started = time.monotonic()
    waited = box.run(phases.render("member", s), inner="NEMO_ACTION=leave timeout 60 bash -s")
    assert waited.returncode == 0, waited.stderr
    # Its bound, less up to a second: bash's SECONDS counts whole seconds.
    assert time.monotonic() - started >= 3, "it waited to its bound"
    assert "could not read the requests in flight" in waited.stderr, waited.stderr
    assert "no request in flight" not in waited.stderr

    box.file(f"/var/lib/fake-systemd/pid/{catalog.ROUTER_UNIT}").unlink()
    again = box.run(phases.render("member", s), inner="NEMO_ACTION=leave timeout 60 bash -s")
    assert again.returncode == 0, again.stderr
    assert "no request in flight to" in again.stderr, again.stderr
