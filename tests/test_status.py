"""nemodrop/status.py: a stack's Droplets, Volumes, entry, health, waker and cost, read from a
fake DigitalOcean API on loopback (tests/support/stack/do_api.py) and a fake front."""

from __future__ import annotations

import base64
import json
import shutil
import ssl
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
from stack.pki import Authority

from components.cloud.kube import manifests
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


KUBE_TOKEN = "kube-token-of-the-kubeconfig-0123456789abcdef"
STATEFULSET = f"/apis/apps/v1/namespaces/{manifests.NAMESPACE}/statefulsets/{manifests.NAME}"
SCALEDOBJECT = (
    f"/apis/keda.sh/v1alpha1/namespaces/{manifests.NAMESPACE}/scaledobjects/{manifests.NAME}"
)


class Cluster(BaseHTTPRequestHandler):
    """The cluster's API server: the objects at their paths, 401 without the kubeconfig's
    token, 404 for the rest (an object of another name or namespace)."""

    objects: ClassVar[dict[str, Any]] = {}
    seen: ClassVar[list[str]] = []
    token = KUBE_TOKEN  # the one it accepts

    def do_GET(self) -> None:
        type(self).seen.append(self.path)
        if self.headers.get("Authorization") != f"Bearer {self.token}":
            reply(self, 401, b'{"kind":"Status","code":401}', "application/json")
        elif self.path in self.objects:
            reply(self, 200, json.dumps(self.objects[self.path]).encode(), "application/json")
        else:
            reply(self, 404, b'{"kind":"Status","code":404}', "application/json")

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def kube_api(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """The cluster's API over TLS on loopback, its certificate from a CA of its own: (URL,
    the CA's PEM), as a DOKS kubeconfig gives them."""
    ca = Authority("Cluster test")
    chain, key = ca.issue(["127.0.0.1"])
    (tmp_path / "chain.pem").write_text(chain)
    (tmp_path / "key.pem").write_bytes(key)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(tmp_path / "chain.pem", tmp_path / "key.pem")
    Cluster.objects, Cluster.seen, Cluster.token = {}, [], KUBE_TOKEN
    server = serve(Cluster, tls=tls)
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", ca.root_pem
    finally:
        stop(server)


def kube_stack(account: Account, server: str, ca_pem: str) -> None:
    """The kube stack's cluster, and its kubeconfig (responses/kubeconfig.yml's shape)."""
    cluster = account.add_cluster("nemotron-dev", [catalog.PROJECT])
    account.clusters[cluster].update(status={"state": "running"}, created_at=NOW.isoformat(),
                                     node_pools=[])  # fmt: skip
    ca = base64.b64encode(ca_pem.encode()).decode()
    account.kubeconfigs[cluster] = yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "do-tor1-nemotron-dev",
        "clusters": [{"name": "do-tor1-nemotron-dev",
                      "cluster": {"certificate-authority-data": ca, "server": server}}],
        "contexts": [{"name": "do-tor1-nemotron-dev", "context": {
            "cluster": "do-tor1-nemotron-dev", "user": "do-tor1-nemotron-dev-admin"}}],
        "users": [{"name": "do-tor1-nemotron-dev-admin", "user": {"token": KUBE_TOKEN}}],
    })  # fmt: skip


@pytest.mark.parametrize(
    ("wanted", "ready", "said"),
    [(1, 1, "servers: 1 of 1 ready"), (0, 0, "servers: 0 of 0 ready (asleep: 0 wanted)"),
     (1, 0, "servers: 0 of 1 ready (waking)")],
)  # fmt: skip
def test_kube_stack_model_servers_ready_of_wanted(
    wanted: int, ready: int, said: str, tmp_path: Path, account: Account,
    kube_api: tuple[str, str], capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    kube_stack(account, *kube_api)
    Cluster.objects[STATEFULSET] = {
        "spec": {"replicas": wanted},
        "status": {"replicas": wanted, "readyReplicas": ready},
    }
    if ready == 0:  # the API leaves readyReplicas out at 0
        del Cluster.objects[STATEFULSET]["status"]["readyReplicas"]
    Cluster.objects[SCALEDOBJECT] = {"status": {
        "lastActiveTime": "2026-12-05T22:00:00Z",
        "conditions": [{"type": "Ready", "status": "True"},
                       {"type": "Active", "status": "True" if wanted else "False"}]}}  # fmt: skip
    token = account.add_full_access_token("user")
    argv = ["--stack", "dev", "--stacks", str(stacks(tmp_path, kube=True))]
    with DigitalOceanAPI(account) as api:
        code, out, _ = run([*argv, "--api-url", api.url], capsys, monkeypatch, token)
        code_json, doc, _ = run([*argv, "--api-url", api.url, "--json"], capsys, monkeypatch,
                                token)  # fmt: skip
    assert (code, code_json) == (0, 0)
    assert said in out.splitlines()
    active = "True" if wanted else "False"
    assert f"  scaler: Ready True, Active {active}, last active 2026-12-05T22:00:00Z" in out
    servers = json.loads(doc)["servers"]
    assert (servers["wanted"], servers["ready"], servers["said"]) == (
        wanted, ready, said.removeprefix("servers: "))  # fmt: skip
    assert Cluster.seen[:2] == [STATEFULSET, SCALEDOBJECT]
    assert all(len(line) <= status.WIDTH for line in out.splitlines()), out
    assert KUBE_TOKEN not in out + doc


@pytest.mark.parametrize("case", ["401", "no statefulset", "untrusted CA", "no kubeconfig",
                                  "no access_cluster scope", "unreachable"])  # fmt: skip
def test_kube_servers_not_read_is_one_line_and_the_rest_holds(
    case: str, tmp_path: Path, account: Account, kube_api: tuple[str, str],
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    server, ca = kube_api
    if case == "untrusted CA":
        ca = Authority("Another").root_pem
    if case == "unreachable":
        server = "https://127.0.0.1:1"
    kube_stack(account, server, ca)
    if case != "no statefulset":
        Cluster.objects[STATEFULSET] = {"spec": {"replicas": 1}, "status": {"readyReplicas": 1}}
    if case == "401":  # the kubeconfig's token expired (7 days, kubernetes_get_kubeconfig.yml)
        Cluster.token = "another-token"
    if case == "no kubeconfig":
        account.kubeconfigs.clear()
    token = account.add_full_access_token("user")
    if case == "no access_cluster scope":
        token = account.add_token("read", ["droplet:read", "tag:read", "block_storage:read",
                                           "reserved_ip:read", "load_balancer:read",
                                           "kubernetes:read", "sizes:read", "billing:read",
                                           "regions:read", "api:read", "api:write"])  # fmt: skip
    with DigitalOceanAPI(account) as api:
        code, out, err = run(["--stack", "dev", "--stacks", str(stacks(tmp_path, kube=True)),
                              "--api-url", api.url], capsys, monkeypatch, token)  # fmt: skip
    assert code == 0, err
    lines = [x for x in out.splitlines() if x.startswith("servers:")]
    assert len(lines) == 1 and lines[0].startswith("servers: not read: "), out
    why = {
        "401": "the cluster's API: HTTP 401 (statefulsets)",
        "no statefulset": "the cluster's API: HTTP 404 (statefulsets)",
        "untrusted CA": "CERTIFICATE_VERIFY_FAILED",
        "no kubeconfig": "the kubeconfig: HTTP 404",
        "no access_cluster scope": "the token lacks kubernetes:access_cluster",
        "unreachable": "Connection refused",
    }[case]
    assert why in lines[0], lines[0]
    assert "cluster nemotron-dev running" in out
    assert KUBE_TOKEN not in out + err
    assert "scaler" not in out


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
