"""autodown for real, against a fake metrics endpoint, metadata service and DigitalOcean API
on loopback (their addresses injected through its environment, as the phase's env file does):
the folder the phase ships (the package and its clients), installed by lib.sh install_tree and
run as its unit runs it, `python3 -m autodown` in that folder."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from types import ModuleType
from typing import Any

import loopback
import pytest
import script_module
from pulumi_harness import stack_config

from components.host import autodown as autodown_host
from components.host import phase_settings, phases
from components.host.autodown import Peer, env_text, token_scopes
from components.spec import config

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "scripts" / "phases" / "autodown"
sys.path.append(str(ROOT / "scripts"))  # the clients the package imports, in-process
TOKEN = "dop_v1_FAKEautodownTOKEN0123456789"
DROPLET = "424242"

# The scopes DigitalOcean asks of each DELETE autodown might send (its OpenAPI,
# specification/resources: droplets/droplets_destroy.yml, droplets/droplets_destroy_byTag.yml,
# domains/domains_delete_record.yml): any one set of a row will do.
NEEDS: tuple[tuple[re.Pattern[str], tuple[frozenset[str], ...]], ...] = (
    (re.compile(r"/v2/droplets/[0-9]+"), (frozenset({"droplet:delete"}),)),
    (re.compile(r"/v2/droplets\?tag_name=.+"), (frozenset({"droplet:delete", "tag:read"}),)),
    (
        re.compile(r"/v2/domains/[^/]+/records/[0-9]+"),
        (frozenset({"domain:delete"}), frozenset({"domain:update"})),
    ),
)


def readme_scopes(page: str = "README.md") -> set[str]:
    """The token scopes the README's autodown section tells users to pick (or another page's, as
    docs/stop-paying.md's, which says why each): the fake API's token has exactly these, so a
    call needing another fails here as it would on the account."""
    text = (ROOT / page).read_text()
    section = text[text.index("It needs a token that") :]
    section = section[: section.index("```")]
    return set(re.findall(r"`([a-z_]+:[a-z]+)`", section))


def metrics_text(
    running: int = 0, waiting: int = 0, finished: int = 0, generated: int | None = None
) -> str:
    # The shape of vLLM's /metrics: labelled samples, several finished reasons, token counters.
    tokens = 7 * finished if generated is None else generated
    return f"""# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="nemotron"}} {running}.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="nemotron"}} {waiting}.0
# TYPE vllm:request_success_total counter
vllm:request_success_total{{engine="0",finished_reason="stop",model_name="nemotron"}} {finished}.0
vllm:request_success_total{{engine="0",finished_reason="length",model_name="nemotron"}} 0.0
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{{engine="0",model_name="nemotron"}} {3 * finished}.0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{{engine="0",model_name="nemotron"}} {tokens}.0
vllm:kv_cache_usage_perc{{engine="0",model_name="nemotron"}} 0.0
"""


class Cloud:
    """The three services autodown talks to, on one loopback server. With `metrics_key` it is
    another replica's private gateway instead: /metrics for that API key only, as gateway.py
    renders it."""

    def __init__(self, metrics_key: str = "") -> None:
        self.metrics: str | bytes | None = metrics_text()
        self.metrics_key = metrics_key
        self.auth_seen: list[str] = []
        self.metrics_status = 200
        self.metrics_headers: dict[str, str] = {}  # sent with /metrics (a redirect's Location)
        self.hang_seconds = 0.0  # how long /metrics takes to answer
        self.droplet_id = DROPLET
        # Statuses the metadata service answers first, one a request, before the id; and how
        # many times it was asked.
        self.metadata_failures: list[int] = []
        self.metadata_asked = 0
        # What each token may do (DigitalOcean answers 401 to an unknown token, 403 to a scope
        # it lacks), and the account's Droplets when a test names them (None: any id exists;
        # deleting one that does not exist answers 404).
        self.token_scopes: dict[str, set[str]] = {TOKEN: readme_scopes()}
        self.droplets: set[str] | None = None
        # Answers to DELETE (status, headers), before the API's own.
        self.delete_answers: list[tuple[int, dict[str, str]]] = []
        self.deletes: list[dict[str, str]] = []
        self.stop = threading.Event()
        cloud = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                auth = self.headers.get("Authorization", "")
                cloud.auth_seen.append(auth)
                if cloud.metrics_key and auth != f"Bearer {cloud.metrics_key}":
                    self._send(401, "unauthorized")
                elif self.path == "/metrics" and cloud.metrics is not None:
                    cloud.stop.wait(cloud.hang_seconds)
                    self._send(cloud.metrics_status, cloud.metrics, cloud.metrics_headers)
                elif self.path == "/metadata/v1/id":
                    cloud.metadata_asked += 1
                    if cloud.metadata_failures:
                        self._send(cloud.metadata_failures.pop(0), "unavailable")
                    else:
                        self._send(200, cloud.droplet_id)
                else:
                    self._send(503, "unavailable")

            def do_DELETE(self) -> None:
                cloud.deletes.append(
                    {"path": self.path, "auth": self.headers.get("Authorization", "")}
                )
                status, headers = (
                    cloud.delete_answers.pop(0)
                    if cloud.delete_answers
                    else (cloud.answer_delete(self.path, self.headers.get("Authorization", "")), {})
                )
                body = "" if status == 204 else json.dumps({"id": "server_error"})
                self._send(status, body, headers)

            def _send(
                self, status: int, body: str | bytes, headers: dict[str, str] | None = None
            ) -> None:
                data = body.encode() if isinstance(body, str) else body
                self.send_response(status)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_: Any) -> None:
                pass

        self.server = loopback.serve(Handler)
        self.url = loopback.url(self.server)

    def answer_delete(self, path: str, auth: str) -> int:
        """DigitalOcean's answer: 401 without a known token, 403 without a scope the path
        needs, 404 for a Droplet that is not there, else 204 (and the Droplet is gone)."""
        scopes = self.token_scopes.get(auth.removeprefix("Bearer "))
        if scopes is None:
            return 401
        needs = next((n for pattern, n in NEEDS if pattern.fullmatch(path)), None)
        assert needs is not None, f"autodown called an endpoint the fake does not know: {path}"
        if not any(need <= scopes for need in needs):
            return 403
        found = re.fullmatch(r"/v2/droplets/([0-9]+)", path)
        if found and self.droplets is not None:
            if found[1] not in self.droplets:
                return 404
            self.droplets.discard(found[1])
        return 204

    def delete_fails(self, *statuses: int, **headers: str) -> None:
        self.delete_answers = [
            (status, {k.replace("_", "-"): v for k, v in headers.items()}) for status in statuses
        ]

    def close(self) -> None:
        self.stop.set()
        loopback.stop(self.server)


class Garbage:
    """A loopback port that answers anything but HTTP."""

    def __init__(self, reply: bytes) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/metrics"
        self.reply = reply
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.sock.accept()
                with conn:
                    conn.recv(4096)
                    conn.sendall(self.reply)

    def close(self) -> None:
        self.sock.close()


# The folder of the session's `shipped` fixture, for the helpers that make a rule.
SHIPPED: list[Path] = []


@pytest.fixture(scope="session", autouse=True)
def shipped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder the autodown phase installs (autodown.TREE_DIR), as lib.sh install_tree
    writes it from the setting the program sends."""
    folder = tmp_path_factory.mktemp("lib") / autodown_host.PACKAGE
    tree = phase_settings.autodown_phase(
        config.parse(stack_config("dev"), "dev", frozenset()), phase_settings.Inputs()
    )["NEMO_AUTODOWN_TREE"]
    program = f'source {phase_settings.PHASES_DIR / "lib.sh"}\nprintf "%s\\n" "$TREE" | install_tree {folder}'
    subprocess.run(["bash", "-c", program], env={"PATH": os.environ["PATH"], "PHASE": "test",
                   "TREE": str(tree)}, check=True, timeout=60)  # fmt: skip
    SHIPPED[:] = [folder]
    return folder


@pytest.fixture
def cloud() -> Iterator[Cloud]:
    c = Cloud()
    yield c
    c.close()


class Autodown:
    """autodown as the timer runs it: a fresh process each minute, its settings in the
    environment, its state and the first-bootstrap record in files."""

    def __init__(self, cloud: Cloud, state: Path, folder: Path, **env: str) -> None:
        self.folder = folder
        self.state = state
        self.first_bootstrap = state.parent / "first-bootstrap"
        self.first_bootstrap.write_text(f"{int(time.time())}\n")
        self.env = {
            "PATH": "/usr/bin:/bin",
            "AUTODOWN_TOKEN": TOKEN,
            "AUTODOWN_IDLE_MINUTES": "30",
            "AUTODOWN_MAX_HOURS": "8",
            "AUTODOWN_DRY_RUN": "false",
            "AUTODOWN_METRICS_URL": f"{cloud.url}/metrics",
            "AUTODOWN_METADATA_URL": f"{cloud.url}/metadata/v1/id",
            "AUTODOWN_API_URL": cloud.url,
            "AUTODOWN_STATE": str(state),
            "AUTODOWN_FIRST_BOOTSTRAP": str(self.first_bootstrap),
            "AUTODOWN_RUN_SECONDS": "45",
            "AUTODOWN_RETRY_DELAY": "0",
            **env,
        }

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [sys.executable, "-m", autodown_host.PACKAGE, *args],
            cwd=self.folder,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert TOKEN not in proc.stdout + proc.stderr, "the token is never printed"
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc

    def age(self, idle_minutes: float = 0, up_hours: float = 0) -> None:
        """Move the recorded times into the past, as if that much time went by."""
        state = json.loads(self.state.read_text())
        state["last_activity"] -= idle_minutes * 60
        state["started_at"] -= up_hours * 3600
        for url in state.get("unreadable_since", {}):
            state["unreadable_since"][url] -= idle_minutes * 60 + up_hours * 3600
        self.state.write_text(json.dumps(state))
        began = float(self.first_bootstrap.read_text())
        self.first_bootstrap.write_text(f"{began - up_hours * 3600}\n")


@pytest.fixture
def autodown(cloud: Cloud, tmp_path: Path, shipped: Path) -> Autodown:
    return Autodown(cloud, tmp_path / "autodown.json", shipped)


def test_busy_keeps_the_droplet(autodown: Autodown, cloud: Cloud) -> None:
    cloud.metrics = metrics_text(running=1, generated=10)
    autodown.run()
    autodown.age(idle_minutes=45)
    cloud.metrics = metrics_text(running=1, generated=250)  # tokens flowing
    proc = autodown.run()
    assert proc.returncode == 0
    assert proc.stdout.startswith(
        "autodown: keep: busy (running=1 waiting=0 finished=0 generated=250); idle 0/30 min, "
        "up 0.00/8 h since first bootstrap"
    )
    assert cloud.deletes == []


def test_waiting_and_finishing_requests_count_as_busy(autodown: Autodown, cloud: Cloud) -> None:
    autodown.run()
    autodown.age(idle_minutes=45)
    cloud.metrics = metrics_text(finished=3)  # requests finished since the last minute
    assert "keep: busy" in autodown.run().stdout
    autodown.age(idle_minutes=45)
    cloud.metrics = metrics_text(waiting=2, finished=4)
    assert "keep: busy" in autodown.run().stdout
    assert cloud.deletes == []


def test_gauges_stuck_after_aborted_requests_count_as_idle(
    autodown: Autodown, cloud: Cloud
) -> None:
    """vllm-project/vllm#22545: running/waiting can stay non-zero with nothing happening. With a
    reading to compare with, only progress is busy."""
    cloud.metrics = metrics_text(running=2, waiting=1, finished=5)
    first = autodown.run()
    assert "keep: busy (running=2 waiting=1" in first.stdout, "no baseline yet: the gauges count"
    second = autodown.run()
    assert "keep: idle: no progress though the gauges say requests are in flight" in second.stdout
    autodown.age(idle_minutes=31)
    proc = autodown.run()
    assert "idle too long: deleted" in proc.stdout
    assert len(cloud.deletes) == 1


def test_a_vllm_restart_resets_its_counters_and_counts_as_busy(
    autodown: Autodown, cloud: Cloud
) -> None:
    cloud.metrics = metrics_text(finished=50)
    autodown.run()
    autodown.age(idle_minutes=45)
    cloud.metrics = metrics_text(finished=0)
    assert "keep: busy" in autodown.run().stdout


def test_idle_past_the_limit_deletes_exactly_once(autodown: Autodown, cloud: Cloud) -> None:
    first = autodown.run()
    assert "keep: idle (running=0 waiting=0 finished=0 generated=0); idle 0/30 min" in first.stdout
    autodown.age(idle_minutes=31)
    proc = autodown.run()
    assert proc.returncode == 0
    assert (
        f"delete droplet {DROPLET}: idle" in proc.stdout and "idle too long: deleted" in proc.stdout
    )
    assert cloud.deletes == [{"path": f"/v2/droplets/{DROPLET}", "auth": f"Bearer {TOKEN}"}]
    again = autodown.run()
    assert "the delete was accepted earlier" in again.stdout
    assert len(cloud.deletes) == 1


def test_max_hours_deletes_even_while_busy(autodown: Autodown, cloud: Cloud) -> None:
    cloud.metrics = metrics_text(running=4, waiting=9)
    autodown.run()
    autodown.age(up_hours=8.1)
    cloud.metrics = metrics_text(running=4, waiting=9, finished=2)
    proc = autodown.run()
    assert "busy" in proc.stdout and "past max hours: deleted" in proc.stdout
    assert len(cloud.deletes) == 1


def test_max_hours_counts_from_the_first_bootstrap_and_survives_a_lost_state(
    autodown: Autodown, cloud: Cloud
) -> None:
    """The timer starts after the bootstrap (the model download can take hours); maxHours counts
    from the bootstrap's record, which a lost or reset state file does not move."""
    autodown.first_bootstrap.write_text(f"{int(time.time() - 8.5 * 3600)}\n")
    autodown.state.unlink(missing_ok=True)
    cloud.metrics = metrics_text(running=1, generated=99)
    proc = autodown.run()
    assert "up 8.50/8 h since first bootstrap: past max hours: deleted" in proc.stdout
    assert len(cloud.deletes) == 1


@pytest.mark.parametrize("record", ["", "yesterday", "nan", "-5", "99999999999", None])
def test_without_a_usable_bootstrap_record_max_hours_counts_from_the_first_run(
    autodown: Autodown, cloud: Cloud, record: str | None
) -> None:
    if record is None:
        autodown.first_bootstrap.unlink()
    else:
        autodown.first_bootstrap.write_text(record)
    assert "up 0.00/8 h since first autodown run" in autodown.run().stdout
    state = json.loads(autodown.state.read_text())
    state["started_at"] -= 9 * 3600
    autodown.state.write_text(json.dumps(state))
    assert "past max hours: deleted" in autodown.run().stdout


def test_api_errors_are_retried(autodown: Autodown, cloud: Cloud) -> None:
    cloud.delete_fails(500, 502)
    autodown.run()
    autodown.age(idle_minutes=31)
    proc = autodown.run()
    assert "delete attempt 1/4 failed (error: HTTP 500)" in proc.stdout
    assert "delete attempt 2/4 failed (error: HTTP 502)" in proc.stdout
    assert proc.stdout.rstrip().endswith("deleted")
    assert len(cloud.deletes) == 3


def test_an_api_that_keeps_failing_is_tried_again_next_minute(
    autodown: Autodown, cloud: Cloud
) -> None:
    cloud.delete_fails(503, 503, 503, 503)
    autodown.run()
    autodown.age(idle_minutes=31)
    assert autodown.run().returncode == 1
    assert len(cloud.deletes) == 4
    assert autodown.run().returncode == 0, "next minute: the API answers 204"
    assert len(cloud.deletes) == 5


def test_a_token_that_may_not_delete_says_so(autodown: Autodown, cloud: Cloud) -> None:
    cloud.token_scopes[TOKEN] = {"droplet:read"}
    autodown.run()
    autodown.age(idle_minutes=31)
    proc = autodown.run()
    assert proc.returncode == 1
    assert (
        "error: HTTP 403: the token may not delete Droplets: it needs the scope droplet:delete"
        in proc.stdout
    )
    assert len(cloud.deletes) == 1, "no retries on a refused token"


def test_a_token_that_is_not_accepted_says_so(autodown: Autodown, cloud: Cloud) -> None:
    cloud.token_scopes.clear()  # revoked: DigitalOcean answers 401
    autodown.run()
    autodown.age(idle_minutes=31)
    proc = autodown.run()
    assert proc.returncode == 1
    assert "HTTP 401: DigitalOcean does not accept the token (expired or revoked?)" in proc.stdout
    assert "scope" not in proc.stdout


def test_the_readme_names_exactly_the_scopes_the_rule_uses() -> None:
    """The fake API's token has the README's scopes: the other tests prove they suffice; this
    one that the README asks for no more than autodown.token_scopes says, for any stack."""
    lone = config.parse({**stack_config("dev"), "access": _zone_access()}, "dev", frozenset())
    pooled = config.parse({**stack_config("dev"), "replicas": 2}, "dev", frozenset())
    assert readme_scopes() == set(token_scopes(lone)) | set(token_scopes(pooled))
    assert readme_scopes("docs/stop-paying.md") == readme_scopes(), "the page that says why"
    assert token_scopes(pooled) == ["droplet:delete"]
    assert token_scopes(lone) == ["droplet:delete", "domain:delete"]


def _zone_access() -> dict[str, Any]:
    access = stack_config("dev")["access"]
    return {
        **access,
        "dnsZone": "example.com",
        "domain": "llm.example.com",
        "acmeEmail": "ops@example.com",
    }


def test_unreadable_metrics_count_as_busy_but_not_past_max_hours(
    autodown: Autodown, cloud: Cloud
) -> None:
    autodown.run()  # it served
    cloud.metrics = None  # then vLLM went down or broke
    autodown.run()
    autodown.age(idle_minutes=120)
    proc = autodown.run()
    assert "keep: metrics unreadable, counted as busy" in proc.stdout
    assert cloud.deletes == []
    autodown.age(up_hours=8)
    assert "past max hours: deleted" in autodown.run().stdout
    assert len(cloud.deletes) == 1


IDLE = metrics_text()
MALFORMED: dict[str, tuple[int, str | bytes]] = {
    "garbage": (200, "<html><body>502 Bad Gateway</body></html>"),
    "empty": (200, ""),
    "truncated": (200, IDLE[: IDLE.index("# TYPE vllm:generation_tokens_total")]),
    "cut-mid-line": (200, IDLE[: IDLE.index("vllm:num_requests_waiting{") + 30]),
    "not-a-number": (
        200,
        IDLE.replace(
            'num_requests_running{engine="0",model_name="nemotron"} 0.0',
            'num_requests_running{engine="0",model_name="nemotron"} e',
        ),
    ),
    "NaN-value": (
        200,
        IDLE.replace(
            'generation_tokens_total{engine="0",model_name="nemotron"} 0.0',
            'generation_tokens_total{engine="0",model_name="nemotron"} NaN',
        ),
    ),
    "infinite": (
        200,
        IDLE.replace(
            'generation_tokens_total{engine="0",model_name="nemotron"} 0.0',
            'generation_tokens_total{engine="0",model_name="nemotron"} +Inf',
        ),
    ),
    "negative": (
        200,
        IDLE.replace(
            'num_requests_waiting{engine="0",model_name="nemotron"} 0.0',
            'num_requests_waiting{engine="0",model_name="nemotron"} -1',
        ),
    ),
    "not-utf8": (200, IDLE.encode() + b"\xff\xfe\n"),
    "server-error": (500, IDLE),
    "redirect-less-3xx": (304, ""),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_metrics_count_as_busy_without_crashing(
    autodown: Autodown, cloud: Cloud, name: str
) -> None:
    autodown.run()
    cloud.metrics_status, cloud.metrics = MALFORMED[name]
    autodown.age(idle_minutes=120)
    proc = autodown.run()
    assert proc.returncode == 0, proc.stderr
    assert "keep: metrics unreadable, counted as busy" in proc.stdout
    assert cloud.deletes == []


@pytest.mark.parametrize(
    "reply",
    [b"SSH-2.0-OpenSSH_9.6\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 99999\r\n\r\nvllm:", b""],
    ids=["not-http", "short-body", "closed"],
)
def test_a_port_that_does_not_speak_http_counts_as_busy(
    autodown: Autodown, cloud: Cloud, reply: bytes
) -> None:
    garbage = Garbage(reply)
    try:
        autodown.run()
        autodown.age(idle_minutes=120)
        autodown.env["AUTODOWN_METRICS_URL"] = garbage.url
        proc = autodown.run()
    finally:
        garbage.close()
    assert proc.returncode == 0, proc.stderr
    assert "keep: metrics unreadable, counted as busy" in proc.stdout


def test_a_hung_metrics_endpoint_cannot_hold_the_run_past_its_deadline(
    autodown: Autodown, cloud: Cloud
) -> None:
    autodown.run()  # it served
    cloud.hang_seconds = 50
    autodown.env["AUTODOWN_RUN_SECONDS"] = "3"
    began = time.monotonic()
    proc = autodown.run()
    assert "keep: metrics unreadable, counted as busy" in proc.stdout
    # The hang is 50 s: returning long before it shows the deadline bounded the request.
    assert time.monotonic() - began < 40


@pytest.mark.parametrize(
    "state",
    [
        "null",
        "[]",
        '"text"',
        "42",
        "{",
        "",
        '{"started_at": "x", "last_activity": null, "counters": [1], "deleted": "yes"}',
        '{"started_at": 1e400, "last_activity": -1e999, "counters": {"a": "b"}}',
        '{"last_activity": 99999999999, "counters": {"vllm:generation_tokens_total": true}}',
    ],
)
def test_a_state_file_of_any_shape_is_reset_not_fatal(
    autodown: Autodown, cloud: Cloud, state: str
) -> None:
    autodown.state.write_text(state)
    proc = autodown.run()
    assert proc.returncode == 0, proc.stderr
    assert "keep: idle" in proc.stdout
    assert cloud.deletes == []
    saved = json.loads(autodown.state.read_text())
    assert isinstance(saved, dict) and saved["deleted"] is False
    assert saved["last_activity"] <= time.time(), "a time in the future would hold idle off"
    autodown.age(idle_minutes=31)
    assert "idle too long: deleted" in autodown.run().stdout


def test_a_state_file_from_an_earlier_release_keeps_its_start(
    autodown: Autodown, cloud: Cloud
) -> None:
    autodown.first_bootstrap.unlink()
    now = time.time()
    autodown.state.write_text(
        json.dumps({"installed_at": now - 9 * 3600, "last_activity": now, "finished": 0.0})
    )
    assert "past max hours: deleted" in autodown.run().stdout


def test_a_serving_droplet_upgraded_from_an_earlier_release_is_not_taken_for_a_bootstrap(
    autodown: Autodown, cloud: Cloud
) -> None:
    """The state an earlier release wrote has no `served`; one holding a reading served. After
    the upgrade, a vLLM that is down for a minute is a broken one (bounded), not a bootstrap past
    its deadline (deleted at once)."""
    autodown.env["AUTODOWN_BOOTSTRAP_MINUTES"] = "60"
    now = time.time()
    autodown.first_bootstrap.write_text(f"{now - 5 * 3600}\n")
    counters = {"vllm:request_success_total": 3.0, "vllm:generation_tokens_total": 21.0}
    autodown.state.write_text(json.dumps({"started_at": now - 5 * 3600, "last_activity": now,
                                          "counters": counters}))  # fmt: skip
    cloud.metrics = None
    proc = autodown.run()
    assert "keep: metrics unreadable, counted as busy" in proc.stdout, proc.stdout
    assert cloud.deletes == []
    # One that never read a reading (it never served) is held to its deadline.
    autodown.state.write_text(json.dumps({"started_at": now - 5 * 3600, "last_activity": now}))
    assert "not serving by its bootstrap deadline: deleted" in autodown.run().stdout


@pytest.mark.parametrize("answer", ["", "   ", "abc", "12/../34", "1 2", "-5", "4242x", "9" * 30])
def test_a_droplet_id_that_is_not_a_number_is_never_deleted(
    autodown: Autodown, cloud: Cloud, answer: str
) -> None:
    cloud.droplet_id = answer
    autodown.run()
    autodown.age(idle_minutes=31)
    proc = autodown.run()
    assert proc.returncode == 1
    assert "the metadata service gave no numeric Droplet id; not deleting" in proc.stdout
    assert cloud.deletes == [], "never DELETE /v2/droplets/ with an empty or odd id"
    cloud.droplet_id = DROPLET
    assert "deleted" in autodown.run().stdout, "the next run tries again"


def test_a_metadata_service_that_fails_a_moment_is_asked_again_within_the_run(
    autodown: Autodown, cloud: Cloud
) -> None:
    """Issue 42: one failed look at the metadata service (a 5xx, a reset or a timeout) cost the
    whole run ("idle ...: but the metadata service gave no numeric Droplet id"). It is asked
    again within the run's deadline, and each miss is logged with its reason."""
    autodown.run()
    autodown.age(idle_minutes=31)
    cloud.metadata_failures = [503, 500]
    proc = autodown.run()
    assert proc.returncode == 0, proc.stdout
    assert "metadata service, attempt 1/4: HTTP 503; asking again" in proc.stdout
    assert "metadata service, attempt 2/4: HTTP 500; asking again" in proc.stdout
    assert f"delete droplet {DROPLET}: " in proc.stdout and cloud.metadata_asked == 3
    assert [d["path"] for d in cloud.deletes] == [f"/v2/droplets/{DROPLET}"]


@pytest.mark.parametrize(("status", "asked"), [(404, 1), (503, 4)])
def test_a_metadata_service_that_keeps_failing_deletes_nothing_and_says_why(
    autodown: Autodown, cloud: Cloud, status: int, asked: int
) -> None:
    """A 404 (no such Droplet as far as the service knows) is an answer, asked once; a 5xx that
    lasts is asked a few times. Either way nothing is deleted, the journal says why, and the
    next minute's run tries again."""
    autodown.run()
    autodown.age(idle_minutes=31)
    cloud.metadata_failures = [status] * 10
    proc = autodown.run()
    assert proc.returncode == 1
    assert f"HTTP {status}" in proc.stdout
    assert "the metadata service gave no numeric Droplet id; not deleting" in proc.stdout
    assert cloud.metadata_asked == asked and cloud.deletes == []


@pytest.mark.parametrize("setting", ["AUTODOWN_IDLE_MINUTES", "AUTODOWN_MAX_HOURS"])
@pytest.mark.parametrize("value", ["abc", "-1", "0", "nan", "inf"])
def test_a_broken_setting_is_named_not_a_traceback(
    autodown: Autodown, cloud: Cloud, setting: str, value: str
) -> None:
    autodown.env[setting] = value
    proc = autodown.run()
    assert proc.returncode == 2
    assert f"bad setting: {setting}" in proc.stdout
    assert cloud.deletes == []


RECORD = "example.com 31415926"


def test_the_endpoints_dns_record_goes_before_the_droplet(autodown: Autodown, cloud: Cloud) -> None:
    """Its address goes back to DigitalOcean's pool: a name still pointing there would let its
    next owner get a certificate for it."""
    autodown.env["AUTODOWN_DNS_RECORD"] = RECORD
    autodown.run()
    autodown.age(idle_minutes=31)
    proc = autodown.run()
    assert proc.returncode == 0
    assert [d["path"] for d in cloud.deletes] == [
        "/v2/domains/example.com/records/31415926",
        f"/v2/droplets/{DROPLET}",
    ]
    assert "delete DNS record 31415926 in example.com: deleted" in proc.stdout
    assert all(d["auth"] == f"Bearer {TOKEN}" for d in cloud.deletes)


def test_a_record_the_token_may_not_delete_does_not_keep_the_droplet_billing(
    autodown: Autodown, cloud: Cloud
) -> None:
    autodown.env["AUTODOWN_DNS_RECORD"] = RECORD
    cloud.token_scopes[TOKEN] = {"droplet:delete"}  # no domain:delete
    autodown.run()
    autodown.age(idle_minutes=31)
    proc = autodown.run()
    assert proc.returncode == 0
    assert "the token may not delete DNS records: it needs the scope domain:delete" in proc.stdout
    assert "run pulumi refresh, then pulumi up or pulumi destroy, to fix the record" in proc.stdout
    assert cloud.deletes[-1]["path"] == f"/v2/droplets/{DROPLET}"


def test_a_deleted_record_is_not_deleted_again_when_the_droplet_delete_is_retried(
    autodown: Autodown, cloud: Cloud
) -> None:
    autodown.env["AUTODOWN_DNS_RECORD"] = RECORD
    cloud.delete_fails(204, 503, 503, 503, 503)  # the record goes; the Droplet's API is down
    autodown.run()
    autodown.age(idle_minutes=31)
    assert autodown.run().returncode == 1
    assert autodown.run().returncode == 0
    paths = [d["path"] for d in cloud.deletes]
    assert paths.count("/v2/domains/example.com/records/31415926") == 1
    assert paths[-1] == f"/v2/droplets/{DROPLET}"


@pytest.mark.parametrize(
    "value", ["example.com", "example.com abc", "../x 1", "example.com 1 2", "EXAMPLE.com 1", " "]
)
def test_an_odd_record_setting_never_builds_a_delete_path(
    autodown: Autodown, cloud: Cloud, value: str
) -> None:
    autodown.env["AUTODOWN_DNS_RECORD"] = value
    autodown.run()
    autodown.age(idle_minutes=31)
    proc = autodown.run()
    assert proc.returncode == 0
    assert [d["path"] for d in cloud.deletes] == [f"/v2/droplets/{DROPLET}"]


def test_dry_run_logs_and_deletes_nothing(autodown: Autodown, cloud: Cloud) -> None:
    autodown.run()
    autodown.age(idle_minutes=31)
    proc = autodown.run("--dry-run")
    assert "dry run: would delete this Droplet" in proc.stdout
    no_token = Autodown(cloud, autodown.state, autodown.folder, AUTODOWN_TOKEN="")
    assert "dry run: would delete this Droplet" in no_token.run().stdout
    assert cloud.deletes == []


# ---- hours in seconds: the module in-process with an injected clock ---------------------------


class FakeClock:
    """Wall time that moves only when told to, or when the code under test sleeps."""

    def __init__(self) -> None:
        self.t = 1_800_000_000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t += seconds


def load_script() -> ModuleType:
    """The package's run (__main__.py), imported from the repository as a fresh package."""
    main: ModuleType = script_module.load_package(PACKAGE, "nemotron_autodown", "__main__").__main__
    return main


@pytest.fixture
def in_process(autodown: Autodown, monkeypatch: pytest.MonkeyPatch) -> tuple[ModuleType, FakeClock]:
    for name, value in autodown.env.items():
        monkeypatch.setenv(name, value)
    clock = FakeClock()
    autodown.first_bootstrap.write_text(f"{clock.t}\n")
    return load_script(), clock


def test_a_busy_day_runs_to_max_hours_and_no_further(
    in_process: tuple[ModuleType, FakeClock],
    cloud: Cloud,
    capsys: pytest.CaptureFixture[str],
) -> None:
    script, clock = in_process
    minutes = 0
    while not cloud.deletes:
        minutes += 5
        clock.t += 300
        cloud.metrics = metrics_text(running=1, finished=minutes)  # steady traffic
        assert script.main([], now=clock, sleep=clock.sleep) == 0
        assert minutes <= 8 * 60 + 5, "max hours never fired"
    assert minutes == 8 * 60, "deleted at the first run past 8 h, not before"
    assert "up 8.00/8 h since first bootstrap: past max hours: deleted" in capsys.readouterr().out


def test_idle_fires_after_idle_minutes_of_no_progress_on_a_fake_clock(
    in_process: tuple[ModuleType, FakeClock], cloud: Cloud
) -> None:
    script, clock = in_process
    cloud.metrics = metrics_text(running=1, finished=3)  # stuck gauges from the start
    minutes = 0
    while not cloud.deletes and minutes < 60:
        minutes += 1
        clock.t += 60
        script.main([], now=clock, sleep=clock.sleep)
    assert minutes == 31, "the first reading is busy (no baseline), then 30 idle minutes"


def test_a_droplet_that_never_serves_goes_at_its_bootstrap_deadline_not_before(
    in_process: tuple[ModuleType, FakeClock],
    cloud: Cloud,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 42: a bootstrap that fails (the driver, a download, vLLM out of memory) leaves
    vLLM unreadable for ever. Before, that counted as busy until maxHours (8 h of an H100);
    now the rule, installed right after preflight, deletes it at its bootstrap deadline. The
    idle rule does not cut a bootstrap short: nothing serves yet, so nothing is idle."""
    script, clock = in_process
    monkeypatch.setenv("AUTODOWN_BOOTSTRAP_MINUTES", "90")
    cloud.metrics = None
    minutes = 0
    while not cloud.deletes and minutes < 8 * 60:
        minutes += 1
        clock.t += 60
        script.main([], now=clock, sleep=clock.sleep)
    assert minutes == 90, "deleted at its bootstrap deadline, not at idleMinutes nor maxHours"
    out = capsys.readouterr().out
    assert "keep: bootstrapping: this replica has not served yet; bootstrap 30/90 min" in out
    assert "not serving by its bootstrap deadline: deleted" in out
    assert [d["path"] for d in cloud.deletes] == [f"/v2/droplets/{DROPLET}"]


def test_once_it_served_the_bootstrap_deadline_is_over(
    in_process: tuple[ModuleType, FakeClock],
    cloud: Cloud,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    script, clock = in_process
    monkeypatch.setenv("AUTODOWN_BOOTSTRAP_MINUTES", "90")
    cloud.metrics = None
    for minute in range(1, 181):
        clock.t += 60
        if minute == 60:
            cloud.metrics = metrics_text()  # vLLM answers at last
        if minute > 60:
            cloud.metrics = metrics_text(running=1, finished=minute)  # and works
        script.main([], now=clock, sleep=clock.sleep)
    assert cloud.deletes == [], "a replica that serves is kept past its bootstrap deadline"


def test_a_replica_unreadable_past_its_bound_no_longer_keeps_the_set_busy(
    in_process: tuple[ModuleType, FakeClock],
    cloud: Cloud,
    monkeypatch: pytest.MonkeyPatch,
    peers: list[Cloud],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 42: a peer whose metrics cannot be read (its bootstrap failed, its gateway is down)
    counted as busy for ever, holding the whole set. Now it counts as busy for
    AUTODOWN_UNREADABLE_MINUTES in a row, then as idle: the set idles down and every replica,
    the dead one too, is deleted."""
    script, clock = in_process
    monkeypatch.setenv("AUTODOWN_MAX_HOURS", "")  # only the idle rule: no ceiling to hide behind
    monkeypatch.setenv("AUTODOWN_UNREADABLE_MINUTES", "20")
    monkeypatch.setenv("AUTODOWN_PEER_METRICS_URLS", " ".join(f"{p.url}/metrics" for p in peers))
    monkeypatch.setenv("AUTODOWN_PEER_METRICS_KEY", PEER_KEY)
    monkeypatch.setenv("AUTODOWN_PEER_DROPLET_IDS", " ".join(PEER_IDS))
    peers[1].metrics = None  # replica 2 never answers
    minutes = 0
    while not cloud.deletes and minutes < 24 * 60:
        minutes += 1
        clock.t += 60
        script.main([], now=clock, sleep=clock.sleep)
    assert minutes == 20 + 30, "busy for the bound, then idle for idleMinutes"
    out = capsys.readouterr().out
    assert f"metrics unreadable at {peers[1].url}/metrics for 20 min, past 20" in out
    assert [d["path"] for d in cloud.deletes] == [f"/v2/droplets/{i}" for i in [*PEER_IDS, DROPLET]]


def test_a_replica_that_answers_again_starts_its_bound_afresh(
    in_process: tuple[ModuleType, FakeClock],
    cloud: Cloud,
    monkeypatch: pytest.MonkeyPatch,
    peers: list[Cloud],
) -> None:
    """A replica restarting vLLM for an update is unreadable for minutes, then serves: each
    outage is counted on its own, so two short ones never add up to the bound."""
    script, clock = in_process
    monkeypatch.setenv("AUTODOWN_UNREADABLE_MINUTES", "20")
    monkeypatch.setenv("AUTODOWN_PEER_METRICS_URLS", f"{peers[0].url}/metrics")
    monkeypatch.setenv("AUTODOWN_PEER_METRICS_KEY", PEER_KEY)
    monkeypatch.setenv("AUTODOWN_PEER_DROPLET_IDS", PEER_IDS[0])
    for minute in range(1, 41):
        clock.t += 60
        # Down 15 minutes, up 1 (and busy), down 15 again: never 20 in a row.
        peers[0].metrics = metrics_text(finished=minute) if minute in (16, 32) else None
        script.main([], now=clock, sleep=clock.sleep)
    state = json.loads(Path(script.os.environ["AUTODOWN_STATE"]).read_text())
    assert list(state["unreadable_since"].values()) == [clock.t - 7 * 60], "since minute 33"
    assert cloud.deletes == []


def test_retry_after_is_honoured_within_the_run(
    in_process: tuple[ModuleType, FakeClock], cloud: Cloud
) -> None:
    script, clock = in_process
    script.main([], now=clock, sleep=clock.sleep)
    clock.t += 31 * 60
    cloud.delete_fails(429, Retry_After="7")
    assert script.main([], now=clock, sleep=clock.sleep) == 0
    assert clock.slept == [7.0], "waited as long as the API asked"
    assert len(cloud.deletes) == 2


def test_a_retry_after_past_the_deadline_is_left_to_the_next_run(
    in_process: tuple[ModuleType, FakeClock],
    cloud: Cloud,
    capsys: pytest.CaptureFixture[str],
) -> None:
    script, clock = in_process
    script.main([], now=clock, sleep=clock.sleep)
    clock.t += 31 * 60
    cloud.delete_fails(429, Retry_After="600")
    assert script.main([], now=clock, sleep=clock.sleep) == 1
    assert clock.slept == [], "no sleep past the run's deadline"
    assert "retry after 600s" in capsys.readouterr().out
    clock.t += 600
    assert script.main([], now=clock, sleep=clock.sleep) == 0
    assert len(cloud.deletes) == 2


# ---- the program's side -----------------------------------------------------------------------


def test_env_file_renders_the_rule_with_the_token() -> None:
    raw = stack_config("dev")
    raw["autodown"] = {"idleMinutes": 20, "token": TOKEN}
    cfg = config.parse(raw, "dev", frozenset({"autodown"}))
    text = env_text(cfg)
    assert f"AUTODOWN_TOKEN={TOKEN}\n" in text
    assert "AUTODOWN_IDLE_MINUTES=20\nAUTODOWN_MAX_HOURS=\nAUTODOWN_DRY_RUN=false\n" in text
    assert "AUTODOWN_METADATA_URL=http://169.254.169.254/metadata/v1/id" in text
    assert "\nAUTODOWN_DNS_RECORD=\n" in text
    assert f"\nAUTODOWN_DNS_RECORD={RECORD}\n" in env_text(cfg, RECORD)
    # A lone Droplet watches itself and deletes itself only.
    assert (
        "\nAUTODOWN_PEER_METRICS_URLS=\nAUTODOWN_PEER_METRICS_KEY=\nAUTODOWN_PEER_DROPLET_IDS=\n"
        in text
    )
    assert TOKEN not in repr(cfg), "the config model masks the token"


# ---- the replica set: one rule on replica 0 for every replica ----------------------------------

PEER_KEY = "FAKEreplicaSetApiKey0123456789abcdefghij"
PEER_IDS = ["424243", "424244"]


@pytest.fixture
def peers() -> Iterator[list[Cloud]]:
    made = [Cloud(metrics_key=PEER_KEY), Cloud(metrics_key=PEER_KEY)]
    yield made
    for p in made:
        p.close()


def set_rule(cloud: Cloud, tmp_path: Path, peers: list[Cloud], key: str = PEER_KEY) -> Autodown:
    return Autodown(
        cloud,
        tmp_path / "autodown.json",
        SHIPPED[0],
        AUTODOWN_PEER_METRICS_URLS=" ".join(f"{p.url}/metrics" for p in peers),
        AUTODOWN_PEER_METRICS_KEY=key,
        AUTODOWN_PEER_DROPLET_IDS=" ".join(PEER_IDS),
    )


def set_cloud(cloud: Cloud) -> Cloud:
    """The account holds the set: replica 0 (this Droplet) and its two peers."""
    cloud.droplets = {DROPLET, *PEER_IDS}
    return cloud


def test_the_set_is_busy_while_any_replica_works_and_goes_at_once_when_all_are_idle(
    cloud: Cloud, tmp_path: Path, peers: list[Cloud]
) -> None:
    rule = set_rule(cloud, tmp_path, peers)
    rule.run()
    rule.age(idle_minutes=45)
    peers[1].metrics = metrics_text(finished=4)  # replica 2 served; replica 0 did nothing
    proc = rule.run()
    assert "keep: busy (running=0 waiting=0 finished=4" in proc.stdout, proc.stdout
    assert all(a == f"Bearer {PEER_KEY}" for p in peers for a in p.auth_seen)
    assert PEER_KEY not in proc.stdout + proc.stderr, "the API key is never printed"
    rule.age(idle_minutes=31)
    set_cloud(cloud)
    proc = rule.run()
    assert proc.returncode == 0, proc.stdout
    # Each replica by its id (never by tag: that needs tag:read, and GPU Droplets may not be
    # reached by it), this one last; the token has exactly the README's scopes.
    assert [d["path"] for d in cloud.deletes] == [
        f"/v2/droplets/{PEER_IDS[0]}",
        f"/v2/droplets/{PEER_IDS[1]}",
        f"/v2/droplets/{DROPLET}",
    ]
    assert all(d["auth"] == f"Bearer {TOKEN}" for d in cloud.deletes)
    assert cloud.droplets == set(), "every replica is gone"
    assert f"delete replica droplet {PEER_IDS[0]}: " in proc.stdout


def test_a_replica_whose_delete_fails_keeps_replica_0_until_the_next_run(
    cloud: Cloud, tmp_path: Path, peers: list[Cloud]
) -> None:
    """Replica 0 runs the rule: it must outlive every peer, or a peer left behind bills with
    nothing to delete it."""
    rule = set_rule(set_cloud(cloud), tmp_path, peers)
    rule.run()
    rule.age(idle_minutes=31)
    cloud.delete_fails(204, 503, 503, 503, 503)  # the first peer goes, the second fails
    proc = rule.run()
    assert proc.returncode == 1
    assert f"this Droplet stays until replicas {PEER_IDS[1]} are gone" in proc.stdout
    assert f"/v2/droplets/{DROPLET}" not in [d["path"] for d in cloud.deletes]
    # The first peer is gone: its metrics can no longer be read, which alone would count as
    # busy. The delete that began goes on regardless.
    peers[0].metrics = None
    cloud.deletes.clear()
    proc = rule.run()
    assert "finishing the delete that began earlier" in proc.stdout
    assert proc.returncode == 0, proc.stdout
    # Only what is left: the first peer is not asked again.
    assert [d["path"] for d in cloud.deletes] == [
        f"/v2/droplets/{PEER_IDS[1]}",
        f"/v2/droplets/{DROPLET}",
    ]


def test_a_token_missing_its_scope_deletes_no_replica_and_says_which_scope(
    cloud: Cloud, tmp_path: Path, peers: list[Cloud]
) -> None:
    cloud.token_scopes[TOKEN] = {"droplet:read", "tag:read"}
    rule = set_rule(set_cloud(cloud), tmp_path, peers)
    rule.run()
    rule.age(idle_minutes=31)
    for _ in range(2):  # every minute the same line, never a crash
        proc = rule.run()
        assert proc.returncode == 1
        assert "it needs the scope droplet:delete" in proc.stdout
    assert cloud.droplets == {DROPLET, *PEER_IDS}, "nothing deleted"


def test_odd_peer_ids_delete_nothing(cloud: Cloud, tmp_path: Path, peers: list[Cloud]) -> None:
    rule = set_rule(set_cloud(cloud), tmp_path, peers)
    rule.env["AUTODOWN_PEER_DROPLET_IDS"] = "424243 ../droplets"
    rule.run()
    rule.age(idle_minutes=31)
    proc = rule.run()
    assert proc.returncode == 1
    assert "AUTODOWN_PEER_DROPLET_IDS holds a value that is not a Droplet id" in proc.stdout
    assert cloud.deletes == []


def test_a_replica_that_cannot_be_read_keeps_the_set_but_max_hours_still_applies(
    cloud: Cloud, tmp_path: Path, peers: list[Cloud]
) -> None:
    rule = set_rule(cloud, tmp_path, peers, key="not-the-key")
    rule.run()
    rule.age(idle_minutes=120)
    proc = rule.run()
    unreadable = f"replica metrics unreadable at {peers[0].url}/metrics: the set counts as busy"
    assert unreadable in proc.stdout
    assert "keep: metrics unreadable, counted as busy" in proc.stdout
    rule.age(up_hours=9)
    proc = rule.run()
    assert "past max hours" in proc.stdout
    assert [d["path"] for d in cloud.deletes] == [f"/v2/droplets/{i}" for i in [*PEER_IDS, DROPLET]]


def test_the_set_rule_renders_on_replica_0_only() -> None:
    raw = stack_config("dev")
    raw["replicas"] = 3
    raw["autodown"] = {"idleMinutes": 20, "token": TOKEN}
    cfg = config.parse(raw, "dev", frozenset({"autodown"}))
    peers = [Peer(PEER_IDS[0], "10.110.0.3"), Peer(PEER_IDS[1], "10.110.0.4")]
    first = phases.settings(cfg, "autodown", api_key=PEER_KEY, replica=0, peers=peers)
    text = str(first["NEMO_AUTODOWN_ENV_TEXT"])
    assert first["NEMO_AUTODOWN_MODE"] == "delete"
    assert (
        "AUTODOWN_PEER_METRICS_URLS=http://10.110.0.3:8080/metrics http://10.110.0.4:8080/metrics"
        in text
    )
    assert f"AUTODOWN_PEER_METRICS_KEY={PEER_KEY}\n" in text
    assert f"\nAUTODOWN_PEER_DROPLET_IDS={' '.join(PEER_IDS)}\n" in text
    # The endpoint's name is the balancer's: autodown leaves its record alone.
    assert "\nAUTODOWN_DNS_RECORD=\n" in text
    other = phases.settings(cfg, "autodown", api_key=PEER_KEY, replica=1)
    assert other["NEMO_AUTODOWN_MODE"] == "off"


def test_the_set_goes_on_the_stack_api_with_a_token_of_exactly_its_scopes(
    cloud: Cloud, tmp_path: Path, peers: list[Cloud]
) -> None:
    """Against the stack emulation's DigitalOcean API (stack/do_api.py: the OpenAPI's scopes
    per endpoint, 404s, GPU Droplets) instead of this file's fake: the token holds exactly
    autodown.token_scopes, every replica goes by its id, this one last, and the account's other
    Droplets stay, one of them carrying the set's tag."""
    from stack.do_api import Account, DigitalOceanAPI  # noqa: PLC0415 (appended test)

    raw = stack_config("dev")
    raw["replicas"] = 3
    raw["autodown"] = {"idleMinutes": 20, "token": TOKEN}
    cfg = config.parse(raw, "dev", frozenset({"autodown"}))
    account = Account()
    for i, rid in enumerate([DROPLET, *PEER_IDS]):
        account.add_droplet(
            f"nemotron-dev-{i}", "gpu-h100x1-80gb", tags=["nemotron-dev"], id=int(rid)
        )
    others = {
        account.add_droplet("someone-else", "gpu-h100x1-80gb").id,
        account.add_droplet("web", "s-1vcpu-1gb", tags=["nemotron-dev"]).id,
    }
    account.add_token("autodown", token_scopes(cfg), secret=TOKEN)
    rule = set_rule(cloud, tmp_path, peers)
    with DigitalOceanAPI(account) as api:
        rule.env["AUTODOWN_API_URL"] = api.url
        rule.run()
        rule.age(idle_minutes=31)
        proc = rule.run()
        assert proc.returncode == 0, proc.stdout
        assert "the delete was accepted earlier" in rule.run().stdout, "and no more calls"
    assert [(r.method, r.path, r.token, r.status) for r in api.requests] == [
        ("DELETE", f"/v2/droplets/{i}", "autodown", 204) for i in [*PEER_IDS, DROPLET]
    ]
    assert set(account.droplets) == others
    assert cloud.deletes == [], "nothing went to this file's fake"


def test_a_rule_new_to_a_serving_droplet_gives_it_a_bootstrap_window_of_its_own(
    autodown: Autodown, cloud: Cloud
) -> None:
    """A Droplet that has served for days, with no state of this rule's (autodown turned on
    later, or its state file lost): its first run cannot know that it served. Its vLLM
    unreadable that minute (restarted by the same `pulumi up`, or too busy to answer) made it
    a bootstrap 5 h past its 60-minute deadline, deleted at once. The deadline counts from
    the rule's own first run then: it is kept, and deleted only if vLLM never answers within
    the window."""
    autodown.env["AUTODOWN_BOOTSTRAP_MINUTES"] = "60"
    now = time.time()
    autodown.first_bootstrap.write_text(f"{now - 5 * 3600}\n")
    assert not autodown.state.exists()
    cloud.metrics = None
    proc = autodown.run()
    assert cloud.deletes == [], proc.stdout
    assert "keep: bootstrapping: this replica has not served yet; bootstrap 0/60 min" in \
        proc.stdout, proc.stdout  # fmt: skip
    # Never answering for the whole window, it is deleted at its end.
    state = json.loads(autodown.state.read_text())
    state["started_at"] -= 61 * 60
    autodown.state.write_text(json.dumps(state))
    assert "not serving by its bootstrap deadline: deleted" in autodown.run().stdout


# ---- where a secret may go: never on along a redirect -------------------------------------------


class Catcher:
    """Another loopback port, where a redirect points: it records what reaches it."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []
        catcher = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                auth = self.headers.get("Authorization", "")
                catcher.seen.append((self.command, self.path, auth))
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_DELETE(self) -> None:
                self.do_GET()

            def log_message(self, *_: Any) -> None:
                pass

        self.server = loopback.serve(Handler)
        self.url = loopback.url(self.server)

    def close(self) -> None:
        loopback.stop(self.server)


@pytest.fixture
def catcher() -> Iterator[Catcher]:
    c = Catcher()
    yield c
    c.close()


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_a_delete_answered_with_a_redirect_sends_the_token_nowhere_else(
    autodown: Autodown, cloud: Cloud, catcher: Catcher, status: int
) -> None:
    """The DigitalOcean token goes to the API it was given and nowhere else: a DELETE answered
    with a redirect to another port is an answer (an error the next run tries again), never
    followed there with the token."""
    autodown.run()
    autodown.age(idle_minutes=31)
    cloud.delete_fails(*[status] * 4, Location=f"{catcher.url}/v2/droplets/{DROPLET}")
    proc = autodown.run()
    assert proc.returncode == 1, proc.stdout
    assert catcher.seen == [], "nothing reached the redirect's target"
    assert f"HTTP {status}" in proc.stdout
    assert autodown.run().returncode == 0, "the next run deletes it through the API"
    assert all(d["auth"] == f"Bearer {TOKEN}" for d in cloud.deletes)


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_a_replica_answering_its_metrics_with_a_redirect_gets_no_key_sent_on(
    cloud: Cloud, tmp_path: Path, peers: list[Cloud], catcher: Catcher, status: int
) -> None:
    """A replica's /metrics is read with the stack's API key: a redirect from there is no
    reading (the set counts as busy, within its bound), and the key never goes to its target."""
    rule = set_rule(cloud, tmp_path, peers)
    rule.run()
    rule.age(idle_minutes=120)
    peers[0].metrics_status = status
    peers[0].metrics = ""
    peers[0].metrics_headers = {"Location": f"{catcher.url}/metrics"}
    proc = rule.run()
    assert catcher.seen == [], "the API key went on to the redirect's target"
    assert f"replica metrics unreadable at {peers[0].url}/metrics" in proc.stdout
    assert "keep: metrics unreadable, counted as busy" in proc.stdout
