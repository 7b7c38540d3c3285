"""nemodrop/status.py: a stack's Droplets, Volumes, entry, health, waker and cost, read from a
fake DigitalOcean API on loopback (tests/support/stack/do_api.py) and a fake front."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, ClassVar

import nemodrop_cli
import pytest
import yaml
from loopback import reply, serve, stop, url
from stack.do_api import Account, DigitalOceanAPI

from components.spec import catalog
from nemodrop import cli, status, target
from nemodrop.clients import digitalocean, transport

ROOT = Path(__file__).resolve().parent.parent
API_KEY = "sk-status-test-key-0123456789abcdef"
WAKE = '  nemotron-droplet:wake: {enabled: true, githubRepo: me/llm, token: {secure: "v1:abc"}}\n'
NOW = datetime.now(UTC)
DAY_AGO = NOW - timedelta(hours=24)
DIGEST = "sha256:" + "0" * 64


def stacks(tmp_path: Path, *, wake: bool = False, kube: bool = False) -> Path:
    """A stacks folder holding `dev` (the shipped dev stack, with wake on when asked) or the
    shipped kube stack as `dev`."""
    folder = tmp_path / "stacks"
    folder.mkdir()
    text = (ROOT / "stacks" / f"Pulumi.{'kube' if kube else 'dev'}.yaml").read_text()
    if kube:  # the image digests a user sets before the first up (the file's own comments)
        data = yaml.safe_load(text)
        k = data["config"]["nemotron-droplet:kubernetes"]
        k["imageDigest"] = k["edge"]["imageDigest"] = DIGEST
        k["router"].update(eppImageDigest=DIGEST, proxyImageDigest=DIGEST)
        text = yaml.safe_dump(data)
    (folder / "Pulumi.dev.yaml").write_text(text + (WAKE if wake else ""))
    return folder


class Front(BaseHTTPRequestHandler):
    """The endpoint's front: /health without the key, the waker's control with it."""

    health = 200
    state: ClassVar[dict[str, Any]] = {}
    seen: ClassVar[list[tuple[str, str]]] = []

    def do_GET(self) -> None:
        type(self).seen.append((self.path, self.headers.get("Authorization", "")))
        if self.path == "/health":
            reply(self, self.health, b"ok")
        elif self.path == "/nemotron/wake":
            ok = self.headers.get("Authorization") == f"Bearer {API_KEY}"
            body = json.dumps(self.state).encode() if ok else b"{}"
            reply(self, 200 if ok else 401, body, "application/json")
        else:
            reply(self, 404, b"")

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def front() -> Iterator[str]:
    Front.seen, Front.health, Front.state = [], 200, {}
    server = serve(Front)
    try:
        yield url(server)
    finally:
        stop(server)


@pytest.fixture
def account() -> Account:
    a = Account()
    a.month_to_date_usage = "123.45"
    return a


@pytest.fixture(autouse=True)
def no_pulumi(monkeypatch: pytest.MonkeyPatch) -> None:
    """No pulumi CLI on this machine's PATH, as on a user's without one (DESIGN.md)."""
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


class _Frozen(datetime):
    """status's clock at the module's NOW: the hours a test expects do not grow while the
    suite runs (a day's 24 h x $3.39 is 81.36 only within 5 s of NOW)."""

    @classmethod
    def now(cls, tz: Any = None) -> datetime:  # type: ignore[override]
        return NOW


@pytest.fixture(autouse=True)
def frozen_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(status, "datetime", _Frozen)


def run(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    token: str | None,
) -> tuple[int, str, str]:  # fmt: skip
    if token is None:
        monkeypatch.delenv(status.TOKEN_ENV, raising=False)
    else:
        monkeypatch.setenv(status.TOKEN_ENV, token)
    code = cli.main(["status", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def awake(account: Account) -> None:
    """dev awake: its GPU Droplet, the front, the cache Volume, the front's Reserved IP."""
    gpu = account.add_droplet(
        "nemotron-dev", "gpu-4000adax1-20gb",
        tags=[catalog.PROJECT, "stack:dev", "nemotron-dev:replica"], created_at=DAY_AGO,
    )  # fmt: skip
    front = account.add_droplet(
        "nemotron-dev-lb", "s-1vcpu-1gb",
        tags=[catalog.PROJECT, "stack:dev", "nemotron-dev:balancer"], created_at=DAY_AGO,
    )  # fmt: skip
    account.add_volume("nemotron-dev-cache", 100, droplet_id=gpu.id,
                       tags=[catalog.PROJECT, "stack:dev"], created_at=DAY_AGO)  # fmt: skip
    account.reserved_ips.append({"ip": "203.0.113.99", "droplet": {"id": front.id}})
    # Another stack's, and an untagged GPU Droplet: never this stack's.
    account.add_droplet("nemotron-prod", "gpu-h100x1-80gb", tags=["stack:prod"])
    account.add_droplet("someone-else", "gpu-h100x1-80gb")


def test_awake_stack_droplets_volume_health_and_cost(
    tmp_path: Path, account: Account, front: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    awake(account)
    token = account.add_full_access_token("user")
    with DigitalOceanAPI(account) as api:
        code, out, err = run(
            ["--stack", "dev", "--stacks", str(stacks(tmp_path)), "--api-url", api.url,
             "--endpoint", f"{front}/v1"], capsys, monkeypatch, token,
        )  # fmt: skip
    assert (code, err) == (0, "")
    assert "replica nemotron-dev active gpu-4000adax1-20gb since" in out
    assert "front   nemotron-dev-lb active s-1vcpu-1gb" in out
    assert "nemotron-prod" not in out and "someone-else" not in out
    assert "nemotron-dev-cache 100 GiB attached" in out
    assert "203.0.113.99" in out
    assert "Pulumi's state: not read (no pulumi CLI)" in out
    assert "differs" not in out
    assert f"health: HTTP 200 ({front}/health)" in out
    # 24 hours at the size's hourly price (the fake's is the catalog's list price).
    price = catalog.SIZES["gpu-4000adax1-20gb"].list_price_usd_hour
    assert price is not None
    assert f"{24 * price:.2f}" in out
    assert "the whole account (DigitalOcean billing)" in out and "123.45" in out
    assert "not counted: deleted Droplets' hours" in out
    assert all(len(line) <= status.WIDTH for line in out.splitlines()), out


def test_json_is_one_document_with_each_costs_count(
    tmp_path: Path, account: Account, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    awake(account)
    token = account.add_full_access_token("user")
    with DigitalOceanAPI(account) as api:
        code, out, _ = run(["--stack", "dev", "--stacks", str(stacks(tmp_path)),
                            "--api-url", api.url, "--json"], capsys, monkeypatch, token)  # fmt: skip
    assert code == 0
    doc = json.loads(out)
    assert [d["role"] for d in doc["droplets"]] == ["front", "replica"]
    lines = doc["cost"]["lines"]
    assert len(lines) == 3  # two Droplets and the Volume
    assert doc["cost"]["stackTotal"] == pytest.approx(sum(x["total"] for x in lines), abs=0.01)
    # The Volume: 100 GiB for 24 h at the catalog's price per GiB-month of 672 hours.
    volume = next(x for x in lines if x["what"].startswith("Volume"))
    want = 100 * catalog.VOLUME_PRICE_GIB_MONTH / catalog.HOURS_PER_BILLING_MONTH * 24
    assert volume["total"] == pytest.approx(want, abs=0.01)
    assert doc["cost"]["accountMonth"] == 123.45
    assert doc["health"]["said"].startswith("not asked")


def test_asleep_stack_says_asleep_and_asks_the_waker_with_the_key(
    tmp_path: Path, account: Account, front: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Autodown deleted the GPU Droplet: the front and the Volume stay; wake is on."""
    awake(account)
    gpu = next(d for d in account.droplets.values() if d.name == "nemotron-dev")
    account.remove_droplet(gpu.id)
    Front.state = {
        "mode": "asleep",
        "since": "2026-12-05T22:00:00Z",
        "last_wake": {"request_in": "2026-12-05T09:00:00Z", "ready": "09:07"},
    }
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    token = account.add_full_access_token("user")
    with DigitalOceanAPI(account) as api:
        code, out, _ = run(
            ["--stack", "dev", "--stacks", str(stacks(tmp_path, wake=True)), "--api-url",
             api.url, "--endpoint", f"{front}/v1"], capsys, monkeypatch, token,
        )  # fmt: skip
    assert code == 0
    assert "nemotron-dev: in the config, not in DigitalOcean: asleep" in out
    assert "nemotron-dev-cache 100 GiB detached" in out
    assert "waker: asleep since 2026-12-05T22:00:00Z" in out
    assert "request_in 2026-12-05T09:00:00Z" in out
    assert ("/nemotron/wake", f"Bearer {API_KEY}") in Front.seen
    assert ("/health", "") in Front.seen  # the health look carries no key
    assert API_KEY not in out and token not in out


def test_stray_droplet_is_named(
    tmp_path: Path, account: Account, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    awake(account)
    stray = "nemotron-dev-old-" + "x" * 90  # a long name: the lines still fit 80 columns
    account.add_droplet(stray, "gpu-4000adax1-20gb",
                        tags=[catalog.PROJECT, "stack:dev", "nemotron-dev:replica"])  # fmt: skip
    token = account.add_full_access_token("user")
    folder = str(stacks(tmp_path))
    with DigitalOceanAPI(account) as api:
        _, out, _ = run(["--stack", "dev", "--stacks", folder, "--api-url", api.url], capsys,
                        monkeypatch, token)  # fmt: skip
        _, doc, _ = run(["--stack", "dev", "--stacks", folder, "--api-url", api.url, "--json"],
                        capsys, monkeypatch, token)  # fmt: skip
    assert "  differs: nemotron-dev-old-xxx" in out
    assert all(len(line) <= status.WIDTH for line in out.splitlines()), out
    said = f"{stray}: tagged stack:dev, not in the config"
    assert said in json.loads(doc)["disagree"]


def test_pulumi_state_lists_a_droplet_the_cloud_lost(
    tmp_path: Path, account: Account, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """With the pulumi CLI: its outputs name a replica DigitalOcean no longer has (no wake)."""
    outputs = {"replicas": [{"name": "nemotron-dev"}, {"name": "nemotron-dev-1"}],
               "balancer": {"kind": "caddy"}, "apiKey": API_KEY}  # fmt: skip
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/pulumi")
    monkeypatch.setattr(target, "stack_outputs", lambda *a, **k: outputs)
    awake(account)
    token = account.add_full_access_token("user")
    with DigitalOceanAPI(account) as api:
        _, out, _ = run(["--stack", "dev", "--stacks", str(stacks(tmp_path)),
                         "--api-url", api.url], capsys, monkeypatch, token)  # fmt: skip
    assert "Pulumi's state: pulumi stack output --stack dev" in out
    assert "nemotron-dev-1: in Pulumi's state, not in DigitalOcean: gone" in out
    assert "nemotron-dev-lb: the front" not in out
    front = next(d for d in account.droplets.values() if d.name == "nemotron-dev-lb")
    account.remove_droplet(front.id)
    with DigitalOceanAPI(account) as api:
        _, out, _ = run(["--stack", "dev", "--stacks", str(tmp_path / "stacks"),
                         "--api-url", api.url, "--json"], capsys, monkeypatch, token)  # fmt: skip
    said = "nemotron-dev-lb: the front, in Pulumi's state, not in DigitalOcean"
    assert said in json.loads(out)["disagree"]
    assert API_KEY not in out and token not in out
    assert API_KEY not in out


def test_kube_stack_cluster_and_pools(
    tmp_path: Path, account: Account, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    cluster = account.add_cluster("nemotron-dev", [catalog.PROJECT])
    node = {"name": "gpu-1", "status": {"state": "running"},
            "created_at": DAY_AGO.strftime("%Y-%m-%dT%H:%M:%SZ")}  # fmt: skip
    account.clusters[cluster].update(
        status={"state": "running"}, created_at=node["created_at"], ha=False,
        node_pools=[{"name": "nemotron-dev-cpu", "size": "s-2vcpu-4gb", "count": 0, "nodes": []},
                    {"name": "nemotron-dev-gpu", "size": "gpu-h100x1-80gb", "count": 1,
                     "nodes": [node]}],
    )  # fmt: skip
    account.offered = {"gpu-h100x1-80gb": ["tor1"]}
    account.add_cluster("another", [catalog.PROJECT])
    token = account.add_full_access_token("user")
    with DigitalOceanAPI(account) as api:
        code, out, _ = run(["--stack", "dev", "--stacks", str(stacks(tmp_path, kube=True)),
                            "--api-url", api.url], capsys, monkeypatch, token)  # fmt: skip
    assert code == 0
    assert "cluster nemotron-dev running since" in out
    assert "pool nemotron-dev-gpu: gpu-h100x1-80gb x 1" in out
    assert "another" not in out
    price = catalog.SIZES["gpu-h100x1-80gb"].list_price_usd_hour
    assert price is not None and f"{24 * price:.2f}" in out


def test_no_token_is_one_line_naming_the_variable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, err = run(["--stack", "dev", "--stacks", str(stacks(tmp_path))], capsys,
                         monkeypatch, None)  # fmt: skip
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "DIGITALOCEAN_TOKEN" in err


@pytest.mark.parametrize("case", ["bad token", "no scope", "server errors"])
def test_api_refusing_is_one_line_exit_1(
    case: str, tmp_path: Path, account: Account, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    token = "dop_v1_not-a-token-of-this-account"
    if case == "no scope":
        token = account.add_token("narrow", ["account:read"])
    # The retries' waits (transport.Api: 2 s, 4 s) made instant; the tries themselves kept.
    instant = lambda url, tok: transport.Api(url, tok, lambda seconds: None)  # noqa: E731
    monkeypatch.setattr(digitalocean, "api", instant)
    with DigitalOceanAPI(account) as api:
        if case == "server errors":
            token = account.add_full_access_token("user")
            api.fail(10)
        code, out, err = run(["--stack", "dev", "--stacks", str(stacks(tmp_path)),
                              "--api-url", api.url], capsys, monkeypatch, token)  # fmt: skip
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: DigitalOcean: ")
    assert token not in err


def test_token_without_billing_read_still_reports_the_rest(
    tmp_path: Path, account: Account, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    awake(account)
    scopes = ["droplet:read", "tag:read", "block_storage:read", "api:read", "api:write",
              "reserved_ip:read", "load_balancer:read"]  # fmt: skip
    token = account.add_token("no-billing", scopes)
    with DigitalOceanAPI(account) as api:
        code, out, _ = run(["--stack", "dev", "--stacks", str(stacks(tmp_path)),
                            "--api-url", api.url], capsys, monkeypatch, token)  # fmt: skip
    assert code == 0
    assert "nemotron-dev" in out
    assert "the whole account: not read (the token lacks billing:read)" in out
    assert all(len(line) <= status.WIDTH for line in out.splitlines()), out


def test_the_command_without_a_token_is_one_line_and_exit_2() -> None:
    """Through the command as a user runs it (a process, tests/support/nemodrop_cli.py)."""
    env = {"PATH": "/usr/bin:/bin", "MPLCONFIGDIR": "/nonexistent"}
    proc = subprocess.run(
        [*nemodrop_cli.argv("status"), "--stack", "dev"],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
    assert proc.stderr.splitlines() == [
        "error: no DigitalOcean token: set DIGITALOCEAN_TOKEN (read scopes suffice)"
    ]
