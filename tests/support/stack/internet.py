"""The outside services a Droplet downloads from, as HTTPS at their real names.

One HTTPS server in the World's namespace at DOWNLOADS (192.0.2.30:443) answers for github.com,
objects.githubusercontent.com, huggingface.co, developer.download.nvidia.com and
files.pythonhosted.org (PyPI's files: the front's uv wheel), chosen by the
Host header (a TLS server name, when the client sends one, must agree with it). Its certificate
names all of them and is signed by a small CA of the emulation (a pki.Authority, or one the test
gives), so a Droplet that trusts that root (`prepare`) downloads from the URLs the program
renders, unchanged: curl and Caddy (Go) check the names as they would on the internet.

`prepare(box, services, roots)` makes a Sandbox (a Droplet's disk) resolve the names to the World's
addresses (/etc/hosts in its overlay) and trust the emulation's roots (appended to its
/etc/ssl/certs/ca-certificates.crt, which curl, Python and Go read).

GitHub answers a release download with a redirect to objects.githubusercontent.com and a signed
query; here github.com serves the file itself (curl --location would follow either way).

The substitutions (`SUBSTITUTED`, `substitute`): the program pins the real Miniforge
installer's sha256 and the real uv wheel's, which no stand-in can match, and Ubuntu 24.04's
Python version, which this machine's python3 (the emulated Droplet's /usr) is not. Nothing else
needs one: the Caddy release
tarball served here packs the real caddy binary of the pinned release (catalog.CADDY_SHA256 is
that binary's), the model phase's NEMO_HF_ENDPOINT is empty (hf uses https://huggingface.co) and
the CUDA keyring has no pinned sha (NEMO_CUDA_KEYRING_SHA256 is empty).
"""

from __future__ import annotations

import collections
import hashlib
import ipaddress
import re
import shlex
import socket
import ssl
import tempfile
import threading
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import loopback
from sandbox import FAKES, Sandbox, caddy_release_tarball, system_python_version, uv_wheel

from components.spec import catalog
from stack.net import ACME_CA, DO_API, DOWNLOADS, GITHUB_API, Netns
from stack.pki import Authority

GITHUB, GITHUB_OBJECTS = "github.com", "objects.githubusercontent.com"
HUGGINGFACE, NVIDIA = "huggingface.co", "developer.download.nvidia.com"
PYPI_FILES = "files.pythonhosted.org"
HOSTS = (GITHUB, GITHUB_OBJECTS, HUGGINGFACE, NVIDIA, PYPI_FILES)
# Every name a Droplet of the emulation reaches, and the World address that answers for it:
# what `prepare` is usually given.
SERVICES: dict[str, str] = {
    **dict.fromkeys(HOSTS, DOWNLOADS),
    "acme-v02.api.letsencrypt.org": ACME_CA,
    "acme.zerossl.com": ACME_CA,
    "api.digitalocean.com": DO_API,
    # What the front's waker calls (a workflow_dispatch): github_api.py.
    "api.github.com": GITHUB_API,
}
SYSTEM_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"  # Debian/Ubuntu's; curl and Go read it
# A Droplet's resolver is systemd-resolved's stub. Nothing listens there in a host's namespace,
# so a name /etc/hosts does not hold fails at once and no DNS query leaves the host.
RESOLV_CONF = "nameserver 127.0.0.53\noptions edns0 trust-ad\n"
HOSTS_BEGIN, HOSTS_END = "# stack emulation: begin", "# stack emulation: end"
MODEL_CONFIG = b'{"architectures": ["NemotronHForCausalLM"]}'

# The settings the emulation replaces in a rendered phase script, and why: nothing else.
SUBSTITUTED: dict[str, str] = {
    "NEMO_MINIFORGE_SHA256": (
        "catalog.MINIFORGE_SHA256 pins the real Miniforge installer, which cannot be had here; "
        "the stand-in (tests/support/fakes/pkg/miniforge.sh) is served at catalog.MINIFORGE_URL "
        "unchanged, so only its checksum differs"
    ),
    "NEMO_UV_WHEEL_SHA256": (
        "catalog.UV_WHEEL_SHA256 pins PyPI's uv wheel; its uv could not install the router here "
        "(no PyPI in the emulation, and this machine's python3 is not the lock's), so a wheel of "
        "the same layout holding the fake uv (sandbox.uv_wheel) is served at catalog.UV_WHEEL_URL "
        "unchanged, so only its checksum differs"
    ),
    "NEMO_ROUTER_PYTHON_VERSION": (
        "catalog.ROUTER_PYTHON is Ubuntu 24.04's python3 (3.12), which the router phase checks; "
        "the emulated Droplet's /usr/bin/python3 is this machine's: its version stands in"
    ),
}


# ---- the server --------------------------------------------------------------------------------


@dataclass
class Stall:
    """A path that answers its headers and the first `after` bytes, then holds the connection
    (a stalled mirror) until `release` is set or the Internet closes. `reached` is set when a
    request is being held: the moment to kill the downloader."""

    after: int
    reached: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)


@dataclass
class Failure:
    status: int
    times: int | None  # None: every request


class Internet:
    """The download hosts. `files[host][path]`: what a GET answers (path with its query, if
    any); `requests[url]`: GETs and HEADs per URL (https://host/path), failed and stalled ones
    included; `fail(url)` and `stall(url)`: the knobs."""

    def __init__(
        self,
        world: Netns,
        ca: Authority | None = None,
        *,
        address: str = DOWNLOADS,
        port: int = 443,
        hosts: Iterable[str] = HOSTS,
    ) -> None:
        self.world = world
        self.ca = ca or Authority("Emulated Internet", intermediate="Emulated Internet CA")
        self.hosts = tuple(hosts)
        self.files: dict[str, dict[str, bytes]] = {h: {} for h in self.hosts}
        self.requests: collections.Counter[str] = collections.Counter()
        self.failures: dict[str, Failure] = {}
        self.stalls: dict[str, Stall] = {}
        self.miniforge_sha256: str | None = None
        self.uv_sha256: str | None = None
        self._lock = threading.Lock()
        # The TLS server name each connection sent (SNI), read by its request handler.
        self._sni: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        chain, key = self.ca.issue(self.hosts)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        with tempfile.TemporaryDirectory(prefix="internet-") as tmp:  # read at once, then gone
            (Path(tmp) / "chain.pem").write_text(chain)
            (Path(tmp) / "key.pem").write_bytes(key)
            context.load_cert_chain(Path(tmp) / "chain.pem", Path(tmp) / "key.pem")
        context.sni_callback = self._on_sni
        sock = loopback.bound(address, port, world.call(socket.socket))
        self.server = loopback.serve(_handler(self), sock, tls=context)

    @property
    def root_pem(self) -> str:
        return self.ca.root_pem

    def _on_sni(self, conn: Any, name: str | None, _: ssl.SSLContext) -> None:
        if name:
            self._sni[conn] = name.lower()

    # -- content ---------------------------------------------------------------------------------

    def add(self, url: str, content: bytes) -> str:
        """Serve `content` at an https URL of one of the hosts; returns the URL."""
        host, path = _split(url)
        if host not in self.files:
            raise ValueError(
                f"{url}: not a host this Internet answers for ({', '.join(self.hosts)})"
            )
        self.files[host][path] = content
        return url

    def add_miniforge(self) -> str:
        """The fake Miniforge installer at catalog.MINIFORGE_URL; returns its sha256 (the one
        substituted value, see SUBSTITUTED)."""
        installer = (FAKES / "pkg" / "miniforge.sh").read_bytes()
        self.add(catalog.MINIFORGE_URL, installer)
        self.miniforge_sha256 = hashlib.sha256(installer).hexdigest()
        return self.miniforge_sha256

    def add_caddy(self) -> str:
        """The pinned Caddy release tarball (the real binary: its sha256 is catalog.CADDY_SHA256)
        at catalog.CADDY_URL."""
        return self.add(catalog.CADDY_URL, caddy_release_tarball())

    def add_uv(self) -> str:
        """A wheel of PyPI's uv wheel's layout holding the fake uv, at catalog.UV_WHEEL_URL;
        returns its sha256 (a substituted value, see SUBSTITUTED)."""
        wheel = uv_wheel(catalog.UV_VERSION)
        self.add(catalog.UV_WHEEL_URL, wheel)
        self.uv_sha256 = hashlib.sha256(wheel).hexdigest()
        return self.uv_sha256

    def add_cuda_keyring(self, distro: str = "ubuntu2404") -> str:
        """A stand-in for NVIDIA's keyring package (the fake dpkg only records it; the program
        pins no sha256 for it)."""
        return self.add(catalog.CUDA_KEYRING_URL.format(distro=distro), b"!<arch>\ncuda-keyring\n")

    def add_model(
        self, model_id: str, revision: str = "main", files: Mapping[str, bytes] | None = None
    ) -> list[str]:
        """A model's files where the fake hf asks for them: /<id>/resolve/<revision>/<file>. By
        default config.json and a 1 MiB model.safetensors (room for a stalled download)."""
        if files is None:
            files = {"config.json": MODEL_CONFIG, "model.safetensors": _weights(model_id, 1 << 20)}
        return [
            self.add(f"https://{HUGGINGFACE}/{model_id}/resolve/{revision}/{name}", content)
            for name, content in files.items()
        ]

    def add_all(self, model_id: str = catalog.DEFAULT_MODEL, revision: str = "main") -> None:
        """Everything a default bootstrap downloads."""
        self.add_miniforge()
        self.add_caddy()
        self.add_uv()
        self.add_cuda_keyring()
        self.add_model(model_id, revision)

    def substitutions(self) -> dict[str, str]:
        """The values `substitute` needs for what this Internet serves."""
        if self.miniforge_sha256 is None:
            raise RuntimeError("add_miniforge() first: nothing to substitute yet")
        values = {
            "NEMO_MINIFORGE_SHA256": self.miniforge_sha256,
            "NEMO_ROUTER_PYTHON_VERSION": system_python_version(),
        }
        if self.uv_sha256 is not None:
            values["NEMO_UV_WHEEL_SHA256"] = self.uv_sha256
        return values

    # -- knobs -----------------------------------------------------------------------------------

    def fail(self, url: str, status: int = 500, times: int | None = None) -> None:
        """Answer `url` with `status` (the next `times` requests; None: until `clear`)."""
        _split(url)
        with self._lock:
            self.failures[url] = Failure(status, times)

    def stall(self, url: str, after: int = 0) -> Stall:
        """Hold every request for `url` after its headers and `after` bytes (see Stall)."""
        _split(url)
        with self._lock:
            self.stalls[url] = Stall(after)
            return self.stalls[url]

    def clear(self, url: str) -> None:
        """End the url's failure and stall (held requests are let go: they end short)."""
        with self._lock:
            self.failures.pop(url, None)
            stall = self.stalls.pop(url, None)
        if stall:
            stall.release.set()

    def close(self) -> None:
        with self._lock:
            for stall in self.stalls.values():
                stall.release.set()
        loopback.stop(self.server)

    # -- answering -------------------------------------------------------------------------------

    def answer(self, conn: Any, host_header: str, path: str) -> tuple[int, bytes, Stall | None]:
        """(status, body, stall) for a request; counts it."""
        host = host_header.rsplit(":", 1)[0].lower() if host_header else ""
        sni = self._sni.get(conn)
        if host not in self.files or (sni is not None and sni != host):
            return 421, b"misdirected request\n", None  # RFC 9110 15.5.20
        url = f"https://{host}{path}"
        with self._lock:
            self.requests[url] += 1
            failure = self.failures.get(url)
            if failure is not None:
                if failure.times is not None:
                    failure.times -= 1
                    if failure.times <= 0:
                        del self.failures[url]
                return failure.status, b"injected failure\n", None
            content = self.files[host].get(path)
            stall = self.stalls.get(url)
        if content is None:
            return 404, b"Not Found\n", None
        return 200, content, stall


def _split(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    if parts.scheme != "https" or not parts.hostname or parts.port not in (None, 443):
        raise ValueError(f"{url}: an https URL at port 443")
    return parts.hostname.lower(), (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


def _weights(seed: str, size: int) -> bytes:
    """Deterministic stand-in bytes (blocks of a hash chain): the same model, the same files."""
    out, block = bytearray(), hashlib.sha256(seed.encode()).digest()
    while len(out) < size:
        block = hashlib.sha256(block).digest()
        out += block * 32
    return bytes(out[:size])


def _handler(internet: Internet) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the real hosts; Content-Length on all

        def _serve(self, head: bool) -> None:
            status, body, stall = internet.answer(
                self.connection, self.headers.get("Host", ""), self.path
            )
            self.send_response(status)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if head:
                return
            if stall is None:
                self.wfile.write(body)
                return
            self.wfile.write(body[: stall.after])
            self.wfile.flush()
            stall.reached.set()
            stall.release.wait()
            self.close_connection = True  # the rest never comes: the client sees a short body

        def do_GET(self) -> None:
            self._serve(head=False)

        def do_HEAD(self) -> None:
            self._serve(head=True)

        def log_message(self, *_: Any) -> None:
            pass

    return Handler


# ---- a Droplet's side --------------------------------------------------------------------------


def prepare(box: Sandbox, services: Mapping[str, str], roots: Iterable[str]) -> None:
    """Make the sandbox resolve `services` (name -> World address) and trust `roots` (PEM), all
    in its overlay: /etc/hosts (a marked block, replaced on a second call), /etc/resolv.conf
    (the stub resolver with nothing behind it) and the system bundle (this machine's, which a
    Droplet's Mozilla bundle stands for, plus each root once)."""
    for name, address in services.items():
        ipaddress.ip_address(address)
        if not re.fullmatch(r"[a-z0-9.-]+", name):
            raise ValueError(f"{name!r}: not a host name")
    hosts = box.file("/etc/hosts")
    text = hosts.read_text() if hosts.exists() else "127.0.0.1 localhost\n::1 localhost\n"
    text = re.sub(rf"{HOSTS_BEGIN}\n.*?{HOSTS_END}\n", "", text, flags=re.DOTALL)
    block = "".join(f"{address} {name}\n" for name, address in services.items())
    box.file("/etc/hosts", f"{text}{HOSTS_BEGIN}\n{block}{HOSTS_END}\n")
    box.file("/etc/resolv.conf", RESOLV_CONF)
    bundle = box.file(SYSTEM_BUNDLE)
    source = bundle if bundle.exists() else Path(SYSTEM_BUNDLE)
    text = source.read_text() if source.exists() else ""
    for pem in roots:
        if pem.strip() not in text:
            text = text.rstrip("\n") + ("\n" if text else "") + pem.strip() + "\n"
    box.file(SYSTEM_BUNDLE, text)


# ---- the one substitution ----------------------------------------------------------------------


def substitute(stdin: str, values: Mapping[str, str]) -> str:
    """The rendered phase script (phases.render) with exactly these settings' lines replaced;
    a key not in SUBSTITUTED, or not set in the script, is refused."""
    refused = sorted(set(values) - set(SUBSTITUTED))
    if refused:
        raise ValueError(f"the emulation substitutes only {sorted(SUBSTITUTED)}, not {refused}")
    spans = _assignments(stdin)
    missing = sorted(set(values) - set(spans))
    if missing:
        raise ValueError(f"{missing} not set in this phase script")
    out = stdin
    # From the end backwards, so that earlier spans keep their offsets.
    for key in sorted(values, key=lambda k: -spans[k][0]):
        start, end = spans[key]
        out = out[:start] + f"{key}={shlex.quote(values[key])}" + out[end:]
    return out


def _assignments(stdin: str) -> dict[str, tuple[int, int]]:
    """Where each `KEY=value` of the settings block starts and ends. The block is the lines
    before the first blank one (lib.sh follows it), but a quoted value may span lines (a
    Caddyfile): a line ends an assignment only outside quotes."""
    spans: dict[str, tuple[int, int]] = {}
    i, n = 0, len(stdin)
    while i < n and stdin[i] != "\n":  # a blank line: the end of the settings
        if stdin[i] == "#":
            i = stdin.index("\n", i) + 1
            continue
        match = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=").match(stdin, i)
        if not match:
            raise ValueError(f"not a rendered phase script: {stdin[i : i + 40]!r}")
        start, j, quote = i, match.end(), ""
        while j < n and (quote or stdin[j] != "\n"):
            if quote and stdin[j] == quote:
                quote = ""
            elif not quote and stdin[j] in "'\"":
                quote = stdin[j]
            elif not quote and stdin[j] == "\\":
                j += 1
            j += 1
        key = match.group()[:-1]
        if key in spans:
            raise ValueError(f"{key} is set twice")
        spans[key] = (start, j)
        i = j + 1
    return spans
