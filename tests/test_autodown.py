"""autodown.py for real, against a fake metrics endpoint, metadata service and DigitalOcean API
on loopback (their addresses injected through its environment, as the phase's env file does)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from pulumi_harness import stack_config

from components import bootstrap, config

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "phases" / "autodown.py"
TOKEN = "dop_v1_FAKEautodownTOKEN0123456789"
DROPLET = "424242"


def metrics_text(running: int = 0, waiting: int = 0, finished: int = 0) -> str:
    # The shape of vLLM's /metrics: labelled samples, several finished reasons.
    return f"""# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="nemotron"}} {running}.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="nemotron"}} {waiting}.0
# TYPE vllm:request_success_total counter
vllm:request_success_total{{engine="0",finished_reason="stop",model_name="nemotron"}} {finished}.0
vllm:request_success_total{{engine="0",finished_reason="length",model_name="nemotron"}} 0.0
vllm:kv_cache_usage_perc{{engine="0",model_name="nemotron"}} 0.0
"""


class Cloud:
    """The three services autodown talks to, on one loopback server."""

    def __init__(self) -> None:
        self.metrics: str | None = metrics_text()
        self.delete_statuses: list[int] = []  # answers to DELETE, then 204
        self.deletes: list[dict[str, str]] = []
        cloud = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/metrics" and cloud.metrics is not None:
                    self._send(200, cloud.metrics)
                elif self.path == "/metadata/v1/id":
                    self._send(200, DROPLET)
                else:
                    self._send(503, "unavailable")

            def do_DELETE(self) -> None:
                cloud.deletes.append(
                    {"path": self.path, "auth": self.headers.get("Authorization", "")}
                )
                status = cloud.delete_statuses.pop(0) if cloud.delete_statuses else 204
                self._send(status, "" if status == 204 else json.dumps({"id": "server_error"}))

            def _send(self, status: int, body: str) -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def cloud() -> Iterator[Cloud]:
    c = Cloud()
    yield c
    c.close()


class Autodown:
    def __init__(self, cloud: Cloud, state: Path, **env: str) -> None:
        self.state = state
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
            "AUTODOWN_RETRY_DELAY": "0",
            **env,
        }

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [sys.executable, str(SCRIPT), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert TOKEN not in proc.stdout + proc.stderr, "the token is never printed"
        return proc

    def age(self, idle_minutes: float = 0, up_hours: float = 0) -> None:
        """Move the recorded times into the past, as if that much time went by."""
        state = json.loads(self.state.read_text())
        state["last_activity"] -= idle_minutes * 60
        state["installed_at"] -= up_hours * 3600
        self.state.write_text(json.dumps(state))


@pytest.fixture
def autodown(cloud: Cloud, tmp_path: Path) -> Autodown:
    return Autodown(cloud, tmp_path / "autodown.json")


def test_busy_keeps_the_droplet(autodown: Autodown, cloud: Cloud) -> None:
    cloud.metrics = metrics_text(running=1)
    autodown.run()
    autodown.age(idle_minutes=45)
    proc = autodown.run()
    assert proc.returncode == 0
    assert proc.stdout.startswith(
        "autodown: keep: busy (running=1 waiting=0 finished=0); idle 0/30 min, up 0.00/8 h"
    )
    assert cloud.deletes == []


def test_waiting_and_finishing_requests_count_as_busy(autodown: Autodown, cloud: Cloud) -> None:
    autodown.run()
    autodown.age(idle_minutes=45)
    cloud.metrics = metrics_text(finished=3)  # requests finished since the last minute
    assert "keep: busy" in autodown.run().stdout
    autodown.age(idle_minutes=45)
    cloud.metrics = metrics_text(waiting=2, finished=3)
    assert "keep: busy" in autodown.run().stdout
    assert cloud.deletes == []


def test_idle_past_the_limit_deletes_exactly_once(autodown: Autodown, cloud: Cloud) -> None:
    first = autodown.run()
    assert "keep: idle (running=0 waiting=0 finished=0); idle 0/30 min" in first.stdout
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
    proc = autodown.run()
    assert "past max hours: deleted" in proc.stdout
    assert len(cloud.deletes) == 1


def test_api_errors_are_retried(autodown: Autodown, cloud: Cloud) -> None:
    cloud.delete_statuses = [500, 429]
    autodown.run()
    autodown.age(idle_minutes=31)
    proc = autodown.run()
    assert "delete attempt 1/4 failed (error: HTTP 500)" in proc.stdout
    assert "delete attempt 2/4 failed (error: HTTP 429)" in proc.stdout
    assert proc.stdout.rstrip().endswith("deleted")
    assert len(cloud.deletes) == 3


def test_an_api_that_keeps_failing_is_tried_again_next_minute(
    autodown: Autodown, cloud: Cloud
) -> None:
    cloud.delete_statuses = [503] * 4
    autodown.run()
    autodown.age(idle_minutes=31)
    assert autodown.run().returncode == 1
    assert len(cloud.deletes) == 4
    assert autodown.run().returncode == 0, "next minute: the API answers 204"
    assert len(cloud.deletes) == 5


def test_a_token_that_may_not_delete_says_so(autodown: Autodown, cloud: Cloud) -> None:
    cloud.delete_statuses = [403]
    autodown.run()
    autodown.age(idle_minutes=31)
    proc = autodown.run()
    assert "error: HTTP 403: the token may not delete Droplets (droplet:delete)" in proc.stdout
    assert len(cloud.deletes) == 1, "no retries on a refused token"


def test_unreadable_metrics_count_as_busy_but_not_past_max_hours(
    autodown: Autodown, cloud: Cloud
) -> None:
    cloud.metrics = None  # vLLM down or broken
    autodown.run()
    autodown.age(idle_minutes=120)
    proc = autodown.run()
    assert "keep: metrics unreadable, counted as busy" in proc.stdout
    assert cloud.deletes == []
    autodown.age(up_hours=8)
    assert "past max hours: deleted" in autodown.run().stdout
    assert len(cloud.deletes) == 1


def test_dry_run_logs_and_deletes_nothing(autodown: Autodown, cloud: Cloud) -> None:
    autodown.run()
    autodown.age(idle_minutes=31)
    proc = autodown.run("--dry-run")
    assert "dry run: would delete this Droplet" in proc.stdout
    no_token = Autodown(cloud, autodown.state, AUTODOWN_TOKEN="")
    assert "dry run: would delete this Droplet" in no_token.run().stdout
    assert cloud.deletes == []


# ---- the program's side -----------------------------------------------------------------------


def test_env_file_renders_the_rule_with_the_token() -> None:
    raw = stack_config("dev")
    raw["autodown"] = {"idleMinutes": 20, "token": TOKEN}
    cfg = config.parse(raw, "dev", frozenset({"autodown"}))
    text = bootstrap.autodown_env_text(cfg)
    assert f"AUTODOWN_TOKEN={TOKEN}\n" in text
    assert "AUTODOWN_IDLE_MINUTES=20\nAUTODOWN_MAX_HOURS=\nAUTODOWN_DRY_RUN=false\n" in text
    assert "AUTODOWN_METADATA_URL=http://169.254.169.254/metadata/v1/id" in text
    assert TOKEN not in repr(cfg), "the config model masks the token"
