"""An endpoint that cannot be used yet (nemodrop/reach.py, what smoke.py and bench.py ask first):
one line naming the cause and what to do, no traceback: a refused key and where the key came
from, nothing listening, a dropped connection, a stalled or cut answer, an untrusted certificate
(and `--cacert`), the gateway's 502 and 503, no route; the stack's name in the commands it
prints. Against real servers on loopback (and a network namespace of its own)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import nemodrop_cli
import pytest
from test_target import dev_stack
from test_tools import (
    KEY,
    fake_server,
    run_tool,
    stats,
)

WRONG_KEY = "sk-not-this-servers-key-7f3a9c"


def test_bench_with_a_wrong_key_says_so_and_where_the_key_comes_from(tmp_path: Path) -> None:
    with fake_server("--ttft", "0.01", "--itl", "0.001") as base:
        found = run_tool("bench", "--endpoint", base, "--api-key", WRONG_KEY, "--no-progress",
                         "--concurrency", "2", "--requests", "4", "--max-tokens", "4")  # fmt: skip
        given = run_tool("bench", "--endpoint", base, "--api-key", WRONG_KEY, "--model",
                         "nemotron", "--no-progress", "--concurrency", "2", "--requests", "40",
                         "--max-tokens", "4", "--json", str(tmp_path / "r.json"))  # fmt: skip
        sent = stats(base)["chat_requests"]
    for proc in (found, given):
        assert proc.returncode == 1, proc.stderr
        assert "the endpoint refused the API key (HTTP 401" in proc.stderr, proc.stderr
        assert "--stack NAME" in proc.stderr
        assert WRONG_KEY not in proc.stdout + proc.stderr
    # With --model too, the key is tried once before any level: no load sent, no result file.
    assert sent == 0 and not (tmp_path / "r.json").exists()


@contextmanager
def answering(status: int, body: str, cert: tuple[Path, Path] | None = None) -> Iterator[str]:
    """A server on loopback that answers every request `status` with `body` (a gateway before
    vLLM, a front that waits, a refused key), over TLS with `cert` (certificate, key) when
    given; yield its /v1 base URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        do_POST = do_GET  # noqa: N815 (http.server calls do_<METHOD>)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if cert is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*cert)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"{'https' if cert else 'http'}://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key."""
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


@contextmanager
def closed_port() -> Iterator[str]:
    """A loopback port nothing listens on: connection refused (the Droplet still starting)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    yield f"http://127.0.0.1:{port}/v1"


@contextmanager
def dropping_port() -> Iterator[str]:
    """A port whose SYNs go unanswered, as a firewall that drops: a listener with a backlog of
    0 that never accepts, its one queue slot taken, drops every further SYN (Linux
    tcp_conn_request: a full accept queue drops)."""
    with socket.socket() as listener, socket.socket() as filler:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        filler.connect(listener.getsockname())
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"


@contextmanager
def sending(pause: float, chunk: bytes, count: int = 0) -> Iterator[str]:
    """A server on loopback that answers 200 and then sends `chunk` every `pause` seconds
    without end (a trickling proxy, or a body that never ends: requests bounds each read, so
    only a deadline on the whole answer stops it), or `count` times and then closes the
    connection short of its Content-Length (a connection cut mid-body)."""
    stop = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn, contextlib.suppress(OSError):
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: 1000000000\r\n\r\n")  # fmt: skip
                sent = 0
                while not stop.is_set() and (count == 0 or sent < count):
                    conn.sendall(chunk)
                    sent += 1
                    time.sleep(pause)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    finally:
        stop.set()
        thread.join()
        listener.close()


UNUSABLE = {
    "refused": (
        closed_port,
        "refused the connection: nothing listens there yet; the Droplet may still be starting",
    ),
    "dropped": (
        dropping_port,
        "no connection to 127.0.0.1:{port} within 2 s: your address may be "
        "outside the stack's access.apiCidrs",
    ),
    "401": (
        lambda: answering(401, "unauthorized: send one Authorization: Bearer <apiKey> header"),
        "the endpoint refused the API key (HTTP 401: unauthorized",
    ),
    "403": (
        lambda: answering(403, "forbidden"),
        "the endpoint refused the API key (HTTP 403: forbidden): pass the stack's own",
    ),
    "502": (
        lambda: answering(502, ""),
        "the gateway answers but vLLM behind it does not (HTTP 502): the model may still be "
        "loading; `nemodrop logs --stack NAME`",
    ),
    "trickle": (
        lambda: sending(0.2, b" "),
        "answered HTTP 200 but its body did not end within 2 s (--timeout)",
    ),
    "cut": (
        lambda: sending(0.0, b"[", count=1),
        "127.0.0.1:{port} closed the connection before its answer ended",
    ),
    "endless": (
        lambda: sending(0.0, b" " * 65536),
        "sent over 4 MiB for a model list (HTTP 200): that is no vLLM",
    ),
    "503": (
        lambda: answering(503, "waking the GPU set: retry in 60 s"),
        "the endpoint is not ready (HTTP 503: waking the GPU set: retry in 60 s): it is "
        "starting, waking or being updated",
    ),
}


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The run failed with exactly one line on stderr, nothing on stdout, no traceback."""
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout == "", proc.stdout
    [line] = proc.stderr.splitlines()
    assert line.startswith("error: ") and KEY not in line, line
    return line


@pytest.mark.parametrize("case", UNUSABLE)
@pytest.mark.parametrize("tool", ["smoke", "bench"])
def test_an_endpoint_that_cannot_serve_is_one_line_naming_the_cause(tool: str, case: str) -> None:
    server, expected = UNUSABLE[case]
    with server() as base:
        port = base.rsplit(":", 1)[1].split("/")[0]
        started = time.monotonic()
        proc = run_tool(tool, "--endpoint", base, "--model", "nemotron", "--timeout", "2",
                        *(["--no-progress"] if tool == "bench" else []),
                        env={"OPENAI_API_KEY": KEY}, timeout=60)  # fmt: skip
    assert expected.format(port=port) in one_error_line(proc)
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("tool", ["smoke", "bench"])
def test_an_untrusted_certificate_is_one_line_and_cacert_trusts_it(
    tool: str, self_signed: tuple[Path, Path]
) -> None:
    extra = ["--no-progress"] if tool == "bench" else []
    with answering(401, "unauthorized", cert=self_signed) as base:
        port = base.rsplit(":", 1)[1].split("/")[0]
        untrusted = run_tool(tool, "--endpoint", base, *extra, env={"OPENAI_API_KEY": KEY})
        trusted = run_tool(tool, "--endpoint", base, "--cacert", str(self_signed[0]), *extra,
                           env={"OPENAI_API_KEY": KEY})  # fmt: skip
    line = one_error_line(untrusted)
    assert f"TLS with 127.0.0.1:{port} failed (self-signed certificate)" in line, line
    assert "one of your own CA needs --cacert FILE" in line
    # Trusted, the TLS holds and the next cause shows: the key.
    assert "the endpoint refused the API key (HTTP 401" in one_error_line(trusted)


def test_the_line_names_the_stack_in_its_commands(tmp_path: Path) -> None:
    with closed_port() as base:
        fake = dev_stack(tmp_path, {"endpoint": base, "apiKey": KEY, "servedModelName": "n"})
        proc = run_tool("smoke", "--stack", "dev", env=fake.env())
    assert "`pulumi refresh --stack dev --yes && pulumi up --stack dev`" in one_error_line(proc)


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="a network namespace of its own needs root and unshare",
)
@pytest.mark.parametrize("tool", ["smoke", "bench"])
def test_no_route_to_the_endpoint_is_one_line(tool: str) -> None:
    """In a network namespace of its own (only a loopback, down: no route anywhere), the
    documentation address 192.0.2.1 is unreachable; nothing leaves the namespace."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    env["OPENAI_API_KEY"] = KEY
    proc = subprocess.run(
        ["unshare", "--net", *nemodrop_cli.argv(tool), "--endpoint",
         "http://192.0.2.1:8443/v1", "--model", "nemotron", "--timeout", "5",
         *(["--no-progress"] if tool == "bench" else [])],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip
    line = one_error_line(proc)
    assert "no route from this machine to 192.0.2.1:8443: its network cannot reach" in line


@pytest.mark.parametrize("tool", ["smoke", "bench"])
def test_a_key_with_a_line_break_is_one_line_that_holds_no_key(tmp_path: Path, tool: str) -> None:
    """requests refuses such a header with a message that quotes it whole: the key stays out."""
    with closed_port() as base:
        fake = dev_stack(
            tmp_path, {"endpoint": base, "apiKey": KEY + "\rX", "servedModelName": "n"}
        )
        proc = run_tool(tool, "--stack", "dev", env=fake.env())
    line = one_error_line(proc)
    assert "the API key holds a line break" in line and KEY not in proc.stdout + proc.stderr, line
