"""The gateway configuration the program renders, run in the real Caddy (Debian's package) in
front of the fake OpenAI-compatible upstream: key, route allowlist, streaming, body limit, TLS."""

from __future__ import annotations

import dataclasses
import http.client
import itertools
import json
import os
import ssl
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx2 as httpx
import openai
import pytest
import requests
from pulumi_harness import stack_config
from sandbox import CADDY, free_port
from test_tools import fake_server

from components.cloud.kube import edge_manifests
from components.host import balancer, gateway
from components.spec import catalog, config

KEY = "sk-test-0123456789"  # fake_server's key: the upstream checks it too (defence in depth)


class Gateway:
    def __init__(self, base: str, url: str, ca: Path | None, log: Path) -> None:
        self.base, self.url, self.ca, self.log = base, url, ca, log

    @property
    def verify(self) -> str | bool:
        """Caddy's local CA for HTTPS on localhost; the default trust otherwise."""
        return str(self.ca) if self.ca else True

    def request(
        self, method: str, path: str, key: str | None = KEY, **kw: Any
    ) -> requests.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        headers.update(kw.pop("headers", {}))
        timeout = kw.pop("timeout", 30)
        return requests.request(
            method, self.url + path, headers=headers, verify=self.verify, timeout=timeout, **kw
        )

    def get(self, path: str, key: str | None = KEY, **kw: Any) -> requests.Response:
        return self.request("GET", path, key, **kw)

    def post(self, path: str, key: str | None = KEY, **kw: Any) -> requests.Response:
        return self.request("POST", path, key, **kw)


def spawn_caddy(folder: Path, conf: Path) -> subprocess.Popen[bytes]:
    """The pinned Caddy running `conf`, its home, data and config under `folder` and the key in
    its environment (as the unit gives it); its output in folder/caddy.log."""
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(folder),
        "XDG_DATA_HOME": str(folder / "data"),
        "XDG_CONFIG_HOME": str(folder / "config"),
        gateway.API_KEY_ENV: KEY,
    }
    with (folder / "caddy.log").open("wb") as out:
        return subprocess.Popen(
            [str(CADDY), "run", "--config", str(conf), "--adapter", "caddyfile"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def stop_caddy(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def start_gateway(
    tmp_path: Path,
    upstream: str,
    https: bool,
    max_body_mb: int = 16,
    upstreams: Sequence[balancer.Upstream] = (),
    front: str | None = None,
    edge: bool = False,
) -> Iterator[Gateway]:
    """Caddy with the rendered gateway config in front of `upstream` (a fake vLLM), or (`edge`)
    the Kubernetes platform's edge config (kube/edge_manifests.caddyfile) with `upstream` as
    the Service it forwards to, or with
    `upstreams` the balancer's config in front of those, each joined by its own file. With
    `front` (asleep or awake), the wake front's config with `upstream` both as its one replica
    and as its waker: asleep, the waker's hold file exists and no replica has joined, so what
    the gate lets through goes to the waker; awake, the replica has joined and there is no hold
    file."""
    raw = stack_config("dev")
    raw["access"] = {**raw["access"], "https": https, "maxRequestBodyMb": max_body_mb}
    if front:
        raw["wake"] = {"enabled": True, "githubRepo": "me/llm", "token": "github_pat_x"}
        host, port = upstream.removeprefix("http://").rsplit(":", 1)
        upstreams = [] if front == "asleep" else [balancer.Upstream(host, int(port))]
    cfg = config.parse(raw, "dev", frozenset({"wake"}) if front else frozenset())
    upstream_port = int(upstream.rsplit(":", 1)[1].split("/", maxsplit=1)[0]) if upstream else 0
    http_port, https_port = free_port(), free_port()
    conf = tmp_path / "Caddyfile"
    # "localhost" makes Caddy use its own local CA instead of a public one: same config path.
    listen = gateway.Listen(
        upstream_port=upstream_port, http_port=http_port, https_port=https_port, admin_socket=None
    )
    if upstreams or front:
        # The balancer as deployed: one file per replica in a folder its Caddyfile imports.
        folder = tmp_path / "upstreams"
        folder.mkdir()
        for i, up in enumerate(upstreams):
            (folder / f"replica-{i}.caddy").write_text(balancer.upstream_line(up) + "\n")
        listen = dataclasses.replace(listen, upstreams=f"{folder}/*.caddy")
        if front:
            hold = tmp_path / "wake" / "hold"
            hold.parent.mkdir()
            if front == "asleep":
                hold.write_text("hold\n")
            listen = dataclasses.replace(listen, waker=upstream.removeprefix("http://"),
                                         wake_hold_file=str(hold))  # fmt: skip
        conf.write_text(gateway.balancer_site(cfg, "localhost", listen))
    elif edge:
        service = edge_manifests.Upstream("127.0.0.1", upstream_port)
        ports = dataclasses.replace(
            edge_manifests.LISTEN, http_port=http_port, https_port=https_port
        )
        conf.write_text(edge_manifests.caddyfile(cfg, "localhost", service, ports))
    else:
        conf.write_text(gateway.lone_site(cfg, "localhost", listen))
    data = tmp_path / "data"
    log = tmp_path / "caddy.log"
    proc = spawn_caddy(tmp_path, conf)
    url = f"https://localhost:{https_port}" if https else f"http://127.0.0.1:{http_port}"
    ca = data / "caddy" / "pki" / "authorities" / "local" / "root.crt" if https else None
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                requests.get(
                    url + "/health", verify=str(ca) if ca and ca.exists() else False, timeout=2
                )
                if ca is None or ca.exists():
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        yield Gateway(url + "/v1", url, ca, log)
    finally:
        stop_caddy(proc)


@pytest.fixture(
    params=[(True, False), (False, False), (True, True)], ids=["https", "http", "kube-edge"]
)
def gw(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Gateway]:
    """The lone Droplet's gateway (HTTPS and plain), and the Kubernetes platform's edge."""
    https, edge = request.param
    with fake_server("--ttft", "0.05", "--itl", "0.15", "--tokens", "6") as upstream:
        yield from start_gateway(tmp_path, upstream, https=https, edge=edge)


def test_no_key_and_wrong_key_get_401(gw: Gateway) -> None:
    for key in (None, "wrong-key"):
        assert gw.get("/v1/models", key=key).status_code == 401
        r = gw.post("/v1/chat/completions", key=key, json={"model": "nemotron", "messages": []})
        assert r.status_code == 401
        assert r.headers.get("WWW-Authenticate") == "Bearer"


def test_the_right_key_gets_through(gw: Gateway) -> None:
    assert gw.get("/v1/models").status_code == 200
    r = gw.post(
        "/v1/chat/completions",
        json={
            "model": "nemotron",
            "max_tokens": 2,
            "messages": [{"role": "user", "content": "hi"}],
        },
    )
    assert r.status_code == 200 and r.json()["choices"]


def test_health_needs_no_key(gw: Gateway) -> None:
    assert gw.get("/health", key=None).status_code == 200


@pytest.mark.parametrize(
    "path",
    [
        "/invocations",
        "/tokenize",
        "/detokenize",
        "/pause",
        "/resume",
        "/update_weights",
        "/metrics",
        "/v2/models",
        "/inference/v1/generate",
        "/v1/../invocations",
        "/V1/models",
    ],
)
def test_routes_outside_v1_are_refused_even_with_the_key(gw: Gateway, path: str) -> None:
    r = gw.post(path, json={})
    assert r.status_code == 404, (path, r.status_code)
    assert "choices" not in r.text


def test_a_stream_arrives_chunk_by_chunk_at_the_upstream_pace(gw: Gateway) -> None:
    body = {
        "model": "nemotron",
        "max_tokens": 6,
        "stream": True,
        "messages": [{"role": "user", "content": "count"}],
    }
    arrivals = []
    start = time.perf_counter()
    with gw.post("/v1/chat/completions", json=body, stream=True) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith(b"data: {") and b'" tok"' in line:
                arrivals.append(time.perf_counter() - start)
    assert len(arrivals) == 6
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    # The upstream sends a token every 150 ms: buffered, they would arrive together at the end.
    assert all(0.07 < g < 0.40 for g in gaps), gaps


@pytest.mark.parametrize("expect", [True, False], ids=["expect-100", "no-expect"])
def test_a_declared_body_over_the_limit_is_refused_before_it_is_uploaded(
    gw: Gateway, tmp_path: Path, expect: bool
) -> None:
    """The 413 comes from the declared length, long before the body is in. curl reads while it
    uploads, as real clients do (over HTTP/1.1 the server reads a little of the body first, as
    Go's server does to keep the connection)."""
    body = tmp_path / "body.json"
    declared = 20_000_000
    body.write_bytes(b" " * declared)
    tls = ["--cacert", str(gw.ca)] if gw.ca else []
    out = subprocess.run(
        ["curl", "--silent", "--http1.1", "--max-time", "20", *tls,
         "--header", f"Authorization: Bearer {KEY}", "--header", "Content-Type: application/json",
         *([] if expect else ["--header", "Expect:"]),
         "--data-binary", f"@{body}", "--output", "-",
         "--write-out", "\n%{http_code} %{size_upload}", f"{gw.url}/chat/completions"],
        capture_output=True, text=True, check=False, timeout=30,
    )  # fmt: skip
    text, status_line = out.stdout.rsplit("\n", 1)
    status, uploaded = status_line.split()
    assert status == "413", out
    assert "request body over 16 MB" in text
    assert int(uploaded) < declared // 4, f"the client uploaded {uploaded} bytes before the 413"


def test_a_chunked_body_over_the_limit_is_cut(gw: Gateway) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(17):
            yield b"x" * (1024 * 1024)

    try:
        r = gw.post(
            "/v1/chat/completions", data=chunks(), headers={"Content-Type": "application/json"}
        )
        outcome: int | str = r.status_code
    except requests.ConnectionError:
        outcome = "closed while sending"  # the gateway stopped reading at the limit
    assert outcome in (413, 502, "closed while sending"), outcome


def test_the_official_openai_client_works_through_the_gateway(gw: Gateway) -> None:
    http_client = (
        httpx.Client(verify=ssl.create_default_context(cafile=str(gw.ca))) if gw.ca else None
    )
    client = openai.OpenAI(base_url=gw.base, api_key=KEY, http_client=http_client)
    assert [m.id for m in client.models.list()] == ["nemotron"]
    chunks = list(
        client.chat.completions.create(
            model="nemotron",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=3,
            stream=True,
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == " tok" * 3
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=gw.base, api_key="nope", http_client=http_client).models.list()


def test_the_key_is_in_no_gateway_log_line(gw: Gateway) -> None:
    gw.get("/v1/models")
    gw.get("/v1/models", key="wrong")
    assert KEY not in gw.log.read_text()


def adapt(tmp_path: Path, caddyfile: str) -> tuple[dict[str, Any], str]:
    """The pinned Caddy's JSON for a rendered Caddyfile (`caddy adapt`), parsed and as text."""
    conf = tmp_path / "Caddyfile"
    conf.write_text(caddyfile)
    out = subprocess.run(
        [str(CADDY), "adapt", "--config", str(conf), "--adapter", "caddyfile"],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), gateway.API_KEY_ENV: KEY},
    )
    return json.loads(out.stdout), out.stdout


def test_the_ip_certificate_config_is_what_caddy_runs(tmp_path: Path) -> None:
    """The pinned Caddy adapts the default (IP) gateway: an ACME issuer with Let's Encrypt's
    `shortlived` profile for the address (the only way it issues IP certificates), and the
    certificate served to a handshake without SNI, as a client connecting to an IP sends."""
    cfg = config.parse(stack_config("dev"), "dev")
    adapted, _ = adapt(tmp_path, gateway.lone_site(cfg, "203.0.113.10"))
    [policy] = adapted["apps"]["tls"]["automation"]["policies"]
    assert policy["subjects"] == ["203.0.113.10"]
    [issuer] = policy["issuers"]
    assert issuer["module"] == "acme" and issuer["profile"] == "shortlived"
    assert "ca" not in issuer, "the public CA (Let's Encrypt), not a test one"
    policies = adapted["apps"]["http"]["servers"]["srv0"]["tls_connection_policies"]
    assert policies[0]["match"]["sni"] == ["", "203.0.113.10"]
    assert all(p["default_sni"] == "203.0.113.10" for p in policies)


def test_a_named_endpoint_keeps_caddys_two_default_cas(tmp_path: Path) -> None:
    """With an email and no issuer of ours, Caddy uses Let's Encrypt, then ZeroSSL
    (modules/caddytls/automation.go DefaultIssuers)."""
    raw = stack_config("dev")
    raw["access"] = {**raw["access"], "domain": "llm.example.com", "acmeEmail": "o@example.com"}
    cfg = config.parse(raw, "dev")
    adapted, text = adapt(tmp_path, gateway.lone_site(cfg, "llm.example.com"))
    assert "default_sni" not in text
    [policy] = adapted["apps"]["tls"]["automation"]["policies"]
    assert policy["subjects"] == ["llm.example.com"]
    lets_encrypt, zerossl = policy["issuers"]
    assert lets_encrypt["module"] == "acme" and "ca" not in lets_encrypt
    assert zerossl["module"] == "acme" and zerossl["ca"] == "https://acme.zerossl.com/v2/DV90"
    assert lets_encrypt["email"] == zerossl["email"] == "o@example.com"


# ---- a replica's gateway (replicas >= 2): its private site ------------------------------------


def run_caddy(folder: Path, caddyfile: str, probe: str) -> Iterator[subprocess.Popen[bytes]]:
    """The pinned Caddy running `caddyfile` (the key in its environment, as the unit gives it),
    once `probe` answers; stopped after."""
    folder.mkdir(parents=True, exist_ok=True)
    conf = folder / "Caddyfile"
    conf.write_text(caddyfile)
    log = folder / "caddy.log"
    proc = spawn_caddy(folder, conf)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                requests.get(probe, timeout=2)
                break
            except requests.RequestException:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
        yield proc
    finally:
        stop_caddy(proc)


def replica_gateway(
    folder: Path, upstream_port: int, listener: gateway.ReplicaListener, https: bool = False
) -> Iterator[str]:
    """A replica's gateway as the gateway phase renders it (its private site), in front of a
    fake vLLM on `upstream_port`; yields its base URL."""
    raw = stack_config("dev")
    raw["replicas"] = 2
    raw["access"] = {**raw["access"], "https": https}
    cfg = config.parse(raw, "dev")
    text = gateway.replica_site(
        cfg, listener, gateway.Listen(upstream_port=upstream_port, admin_socket=None)
    )
    url = f"http://{listener.bind}:{listener.port}"
    for _ in run_caddy(folder, text, f"{url}/health"):
        yield url


def get_from(source: str, url: str, path: str, key: str | None = KEY) -> tuple[int, str]:
    """GET `path` with the connection's source address `source` (a loopback address)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(
        parts.hostname or "", parts.port, timeout=10, source_address=(source, 0)
    )
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {key}"} if key else {})
        r = conn.getresponse()
        return r.status, r.read().decode(errors="replace")
    finally:
        conn.close()


def test_a_replicas_metrics_answer_replica_0_alone_even_to_the_key(tmp_path: Path) -> None:
    """Replica 0's autodown reads every replica's /metrics from its private address. From any
    other source (the managed Load Balancer's, carrying a client's request with the key) the
    replica refuses it; from replica 0's, the key is still needed."""
    replica_0, other = "127.0.0.2", "127.0.0.1"
    listener = gateway.ReplicaListener("127.0.0.1", free_port(), metrics_reader=replica_0)
    with fake_server() as upstream:
        port = int(upstream.rsplit(":", 1)[1].split("/", 1)[0])
        for url in replica_gateway(tmp_path, port, listener):
            status, text = get_from(replica_0, url, "/metrics")
            assert status == 200 and "vllm:num_requests_running" in text
            assert get_from(replica_0, url, "/metrics", key=None)[0] == 401
            assert get_from(other, url, "/metrics")[0] == 403
            assert get_from(other, url, "/metrics", key=None)[0] == 403
            assert get_from(other, url, "/v1/models")[0] == 200, "the API is not restricted"
    # Rendered without a reader (none known), nobody reads them.
    assert "@metrics_reader expression false" in gateway.replica_site(
        config.parse({**stack_config("dev"), "replicas": 2}, "dev"),
        gateway.ReplicaListener("10.0.0.3"),
        gateway.Listen(admin_socket=None),
    )


@pytest.mark.parametrize("retry_elsewhere", [True, False], ids=["caddy-entry", "managed-entry"])
def test_a_draining_replica_turns_new_requests_away_only_for_a_balancer_that_retries(
    tmp_path: Path, retry_elsewhere: bool
) -> None:
    """Behind the Caddy balancer a draining replica answers a new request 503 with the marker
    the balancer retries elsewhere; its own ready probe (from its own address) still passes.
    Behind the managed Load Balancer (no retries) it serves new requests through the notice."""
    drain_dir = tmp_path / "drain"
    drain_dir.mkdir()
    own, balancer_source = "127.0.0.3", "127.0.0.1"
    listener = gateway.ReplicaListener(
        own, free_port(), drain_dir=str(drain_dir), retry_elsewhere=retry_elsewhere
    )
    with fake_server() as upstream:
        port = int(upstream.rsplit(":", 1)[1].split("/", 1)[0])
        for url in replica_gateway(tmp_path / "gw", port, listener):
            assert get_from(balancer_source, url, "/v1/models")[0] == 200
            (drain_dir / catalog.DRAIN_FILE_NAME).touch()
            assert get_from(balancer_source, url, "/health", key=None)[0] == 503
            r = requests.get(
                f"{url}/v1/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=10
            )
            if retry_elsewhere:
                assert r.status_code == 503
                assert r.headers.get(balancer.DRAINING_HEADER) == "1"
            else:
                assert r.status_code == 200 and balancer.DRAINING_HEADER not in r.headers
            assert get_from(own, url, "/v1/models")[0] == 200, "the ready probe passes"
            assert get_from(balancer_source, url, "/v1/models", key="wrong")[0] == 401


# ---- the three sites as rendered, held to golden files ------------------------------------------

GOLDEN_SITES = Path(__file__).resolve().parent / "golden" / "caddyfiles"


def golden_sites() -> dict[str, str]:
    """Each site as a Droplet gets it (the dev stack's settings): the lone Droplet's for its IP
    address and for a domain, the Kubernetes edge's (the lone site, before the model Service), a replica's private one (replica 0 reads the metrics, the front's
    router renders), the balancer's with its router (cache-aware) and without (least-conn)."""
    dev = stack_config("dev")
    lone = config.parse(dev, "dev")
    named = config.parse(
        {**dev, "access": {**dev["access"], "domain": "llm.example.com",
                           "acmeEmail": "ops@example.com"}}, "dev",
    )  # fmt: skip
    pooled = config.parse({**dev, "replicas": 2}, "dev")
    cache_aware = config.parse(
        {**dev, "replicas": 2, "balancer": {"routing": "cache-aware"}}, "dev"
    )  # fmt: skip
    waking = config.parse(
        {**dev, "wake": {"enabled": True, "githubRepo": "me/llm", "token": "x"}}, "dev",
        frozenset({"wake"}),
    )  # fmt: skip
    listener = gateway.ReplicaListener("10.110.0.3", metrics_reader="10.110.0.2",
                                       retry_elsewhere=True, render_client="10.110.0.9")  # fmt: skip
    return {
        "lone-ip": gateway.lone_site(lone, "203.0.113.10"),
        "lone-domain": gateway.lone_site(named, "llm.example.com"),
        "replica": gateway.replica_site(pooled, listener),
        "balancer": gateway.balancer_site(pooled, "203.0.113.201"),
        "balancer-cache-aware": gateway.balancer_site(cache_aware, "203.0.113.201"),
        "balancer-wake": gateway.balancer_site(waking, "203.0.113.201"),
        # The Kubernetes platform's edge, for its Load Balancer's address.
        "kube-edge": edge_manifests.caddyfile(lone, "203.0.113.77"),
    }


@pytest.mark.parametrize("name", sorted(golden_sites()))
def test_each_site_is_its_golden_caddyfile(name: str, update_golden: bool) -> None:
    """The security gate, read whole in review: a change to a site shows as a diff of
    tests/golden/caddyfiles/ (`./check --update-golden` rewrites them)."""
    text = golden_sites()[name]
    path = GOLDEN_SITES / f"{name}.caddyfile"
    if update_golden:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"{name}: differs from {path}"
