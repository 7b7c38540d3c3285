"""Real issuance, offline: the gateway Caddy the Droplet runs, with the Caddyfile the program
renders for the default (IP) endpoint, gets its certificate from pebble (Let's Encrypt's ACME
test server, Debian's package) over http-01 for an IP address, and serves it to the official
`openai` client, which trusts nothing but pebble's root and sends no SNI (it connects to an IP).

Caddy hands loopback (and private) addresses to its internal CA even with an ACME issuer, so the
gateway gets a test address of its own: a network namespace with a veth pair, made here and
removed after. The Kubernetes edge's Caddyfile runs the same way, behind a stand-in for its Load
Balancer's port mapping. pebble 2.4.0 serves no ACME profiles (Caddy refuses `profile shortlived` against
it), so this run leaves the profile out; test_gateway proves it is in the adapted config."""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2 as httpx
import openai
import pytest
from pulumi_harness import stack_config
from sandbox import CADDY

from components.cloud.kube import edge_manifests
from components.host import gateway
from components.spec import config

PEBBLE = shutil.which("pebble") or "/usr/bin/pebble"
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None,
    reason="network namespaces need root and iproute2 (CI and the dev machines have both)",
)
FAKE_OPENAI = Path(__file__).resolve().parent / "support" / "fake_openai.py"
KEY = "sk-acme-test-0123456789abcdef0123456789"
# TEST-NET-2 (RFC 5737): not loopback or private, so Caddy takes it to the ACME issuer; it never
# leaves the veth pair.
HOST_SIDE, GATEWAY_IP = "198.51.100.1", "198.51.100.10"


@dataclass
class Net:
    ns: str
    host_if: str


@pytest.fixture
def net() -> Iterator[Net]:
    tag = secrets.token_hex(3)
    n = Net(ns=f"nemo-acme-{tag}", host_if=f"nvh{tag}")
    peer = f"nvp{tag}"

    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True)

    ip("netns", "add", n.ns)
    try:
        ip("link", "add", n.host_if, "type", "veth", "peer", "name", peer)
        ip("link", "set", peer, "netns", n.ns)
        ip("addr", "add", f"{HOST_SIDE}/24", "dev", n.host_if)
        ip("link", "set", n.host_if, "up")
        ip("-n", n.ns, "addr", "add", f"{GATEWAY_IP}/24", "dev", peer)
        ip("-n", n.ns, "link", "set", peer, "up")
        ip("-n", n.ns, "link", "set", "lo", "up")
        yield n
    finally:
        subprocess.run(["ip", "link", "del", n.host_if], check=False, capture_output=True)
        subprocess.run(["ip", "netns", "del", n.ns], check=False, capture_output=True)


class Processes:
    """Everything the test starts, stopped (with its children) however the test ends."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
        with log.open("wb") as out:
            proc = subprocess.Popen(
                argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


@pytest.fixture
def procs() -> Iterator[Processes]:
    p = Processes()
    yield p
    p.stop()


def wait_for(what: str, check: object, log: Path, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            if check():  # type: ignore[operator]
                return
        except (OSError, httpx.HTTPError, ssl.SSLError):
            pass
        assert time.monotonic() < deadline, f"{what}: not after {seconds}s\n{log.read_text()}"
        time.sleep(0.3)


def start_pebble(tmp: Path, procs: Processes) -> tuple[str, Path]:
    """pebble on the host side of the veth; returns its directory URL and its listener's cert."""
    cert, key = tmp / "pebble-cert.pem", tmp / "pebble-key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-nodes", "-days", "1", "-subj", "/CN=pebble", "-keyout", str(key), "-out", str(cert),
         "-addext", f"subjectAltName=IP:{HOST_SIDE}"],
        check=True, capture_output=True,
    )  # fmt: skip
    conf = tmp / "pebble.json"
    conf.write_text(
        json.dumps({
            "pebble": {
                "listenAddress": f"{HOST_SIDE}:14000",
                "managementListenAddress": f"{HOST_SIDE}:15000",
                "certificate": str(cert),
                "privateKey": str(key),
                "httpPort": gateway.HTTP_PORT,
                "tlsPort": gateway.HTTPS_PORT,
                "ocspResponderURL": "",
                "externalAccountBindingRequired": False,
            }
        })
    )  # fmt: skip
    log = tmp / "pebble.log"
    env = {"PATH": os.environ["PATH"], "PEBBLE_VA_NOSLEEP": "1", "PEBBLE_WFE_NONCEREJECT": "0"}
    procs.start([PEBBLE, "-config", str(conf), "-strict"], log, env)
    directory = f"https://{HOST_SIDE}:14000/dir"
    wait_for(
        "pebble",
        lambda: (
            httpx.get(directory, verify=ssl.create_default_context(cafile=str(cert))).is_success
        ),
        log,
    )
    return directory, cert


# The Load Balancer in front of the Kubernetes edge, as far as Caddy can tell: TCP to the
# address's ports 80 and 443 arrives, unchanged, on the pod's 8080 and 8443 (the Service's
# targetPorts; kube-proxy's DNAT on the node). The rules live in the test's namespace alone.
LOAD_BALANCER = f"""table ip lb {{
	chain prerouting {{
		type nat hook prerouting priority dstnat; policy accept;
		tcp dport {gateway.HTTP_PORT} redirect to :{edge_manifests.HTTP_PORT}
		tcp dport {gateway.HTTPS_PORT} redirect to :{edge_manifests.HTTPS_PORT}
	}}
}}
"""


def site(cfg: config.StackConfig, where: str, directory: str, pebble_cert: Path) -> str:
    """The Droplet's gateway, or the Kubernetes edge's (its ports behind the Load Balancer, its
    upstream a Service: here the stand-in's address), each for the address, with pebble."""
    test_ca = {"acme_ca": directory, "acme_ca_root": str(pebble_cert), "ip_profile": None}
    if where == "kube-edge":
        listen = dataclasses.replace(edge_manifests.LISTEN, **test_ca)  # type: ignore[arg-type]
        upstream = edge_manifests.Upstream("127.0.0.1", 18000)
        return edge_manifests.caddyfile(cfg, GATEWAY_IP, upstream, listen)
    return gateway.lone_site(cfg, GATEWAY_IP, gateway.Listen(upstream_port=18000, **test_ca))


@pytest.mark.parametrize("where", ["droplet", "kube-edge"])
def test_the_gateway_gets_an_ip_certificate_over_http01_and_serves_it_without_sni(
    net: Net, procs: Processes, tmp_path: Path, where: str
) -> None:
    """The Droplet's gateway, and the Kubernetes edge behind its Load Balancer's port mapping:
    the CA's http-01 check to the address's port 80 reaches Caddy's http_port."""
    directory, pebble_cert = start_pebble(tmp_path, procs)
    if where == "kube-edge":
        subprocess.run(["ip", "netns", "exec", net.ns, "nft", "-f", "-"], input=LOAD_BALANCER,
                       text=True, check=True, capture_output=True)  # fmt: skip

    # vLLM's stand-in on the namespace's loopback, where the gateway proxies.
    upstream_log = tmp_path / "upstream.log"
    upstream = procs.start(
        ["ip", "netns", "exec", net.ns, sys.executable, str(FAKE_OPENAI), "--port", "18000",
         "--api-key", KEY, "--model", "nemotron"],
        upstream_log, {"PATH": os.environ["PATH"]},
    )  # fmt: skip
    assert upstream.poll() is None

    cfg = config.parse(stack_config("dev"), "dev")
    caddyfile = tmp_path / "Caddyfile"
    caddyfile.write_text(site(cfg, where, directory, pebble_cert))
    caddy_log = tmp_path / "caddy.log"
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        gateway.API_KEY_ENV: KEY,
    }
    procs.start(
        ["ip", "netns", "exec", net.ns, str(CADDY), "run", "--config", str(caddyfile),
         "--adapter", "caddyfile"],
        caddy_log, env,
    )  # fmt: skip

    # Only pebble's root (fetched from its management port) is trusted: not the system's, not
    # Caddy's local CA.
    root = httpx.get(
        f"https://{HOST_SIDE}:15000/roots/0",
        verify=ssl.create_default_context(cafile=str(pebble_cert)),
    ).text
    trust = ssl.create_default_context(cadata=root)
    base = f"https://{GATEWAY_IP}/v1"
    wait_for(
        "a certificate from pebble",
        lambda: httpx.get(f"https://{GATEWAY_IP}/health", verify=trust).is_success,
        caddy_log,
    )
    log = caddy_log.read_text()
    assert '"msg":"certificate obtained successfully"' in log and GATEWAY_IP in log
    assert '"issuer":"local"' not in log, "the ACME issuer, not Caddy's internal CA"

    client = openai.OpenAI(
        base_url=base, api_key=KEY, http_client=httpx.Client(verify=trust), max_retries=0
    )
    assert [m.id for m in client.models.list()] == ["nemotron"]
    answer = client.chat.completions.create(
        model="nemotron", messages=[{"role": "user", "content": "Say OK."}], max_tokens=4
    )
    assert answer.choices[0].message.content

    # What was served: a certificate for the IP (no SNI was sent: Python sends none for an IP
    # literal), issued by pebble's chain, not by Caddy's local CA.
    with (
        httpx.Client(verify=trust) as c,
        c.stream("GET", f"https://{GATEWAY_IP}/health") as r,
    ):
        peer = r.extensions["network_stream"].get_extra_info("ssl_object").getpeercert()
    assert ("IP Address", GATEWAY_IP) in peer["subjectAltName"]
    issuer = dict(x[0] for x in peer["issuer"])
    assert "Pebble" in issuer.get("commonName", ""), peer["issuer"]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(
            base_url=base, api_key="wrong", http_client=httpx.Client(verify=trust), max_retries=0
        ).models.list()
