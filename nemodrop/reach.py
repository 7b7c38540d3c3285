"""Whether an endpoint answers at all, and if not, why, in one line with what to do.

smoke.py and bench.py ask GET /v1/models once before their checks or load. In the first hour
the usual answers are not a model list: nothing listens yet (the Droplet is starting), the
firewall drops the connection (the user's address is outside access.apiCidrs; docs/facts.md,
"What a client sees when it cannot reach the endpoint"), the certificate is not trusted, the
key is wrong, or the gateway answers before vLLM does (502) or while the endpoint starts, wakes
or drains (503). Each becomes one line naming the cause and the next step (EndpointError, exit
1) instead of a traceback or a column of failed checks.
"""

from __future__ import annotations

import errno
import socket
import ssl
import sys
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import requests
import urllib3

from nemodrop import target as target_mod

# The most a model list may be: vLLM's is a few hundred bytes a model.
MAX_BODY_BYTES = 4 * 2**20
# How long a probe waits for the TCP (and TLS) connection: a firewall that drops says nothing,
# and waiting the tool's whole --timeout (bench: 600 s) for that is no use.
CONNECT_SECONDS = 15.0


class EndpointError(SystemExit):
    """The endpoint cannot be used: one line that says why and what to do; exit 1."""

    def __init__(self, message: str) -> None:
        print(f"error: {message}", file=sys.stderr)
        super().__init__(1)


def refused_key(status: int, body: str = "") -> str:
    """What a 401 or 403 from the endpoint means, and where the right key comes from."""
    said = f": {body}" if body else ""
    return (
        f"the endpoint refused the API key (HTTP {status}{said}): pass the stack's own, with "
        "--stack NAME (reads its apiKey output), OPENAI_API_KEY or --api-key"
    )


def _causes(err: BaseException) -> Iterator[BaseException]:
    """The exception and what it wraps: requests -> urllib3 (`reason`) -> the OSError."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [err]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        wrapped = [getattr(e, "reason", None), e.__cause__, e.__context__, *e.args]
        todo += [w for w in wrapped if isinstance(w, BaseException)]


def _where(target: target_mod.Target) -> tuple[str, str]:
    """host:port of the endpoint, and the stack name for the commands a message names."""
    url = urlsplit(target.endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    return f"{url.hostname}:{port}", target.stack or "NAME"


def describe_failure(
    err: requests.RequestException, target: target_mod.Target, seconds: float
) -> str:
    """One line for a request that got no HTTP answer."""
    where, stack = _where(target)
    connect = min(CONNECT_SECONDS, seconds)
    starting = (
        "the Droplet may still be starting (`pulumi up` returns once it answers) or be gone "
        f"(autodown deleted it: `pulumi refresh --stack {stack} --yes && pulumi up --stack "
        f"{stack}` makes a new one)"
    )
    outside = (
        "your address may be outside the stack's access.apiCidrs (the firewall drops, it does "
        f"not refuse: `pulumi config get --path access.apiCidrs --stack {stack}`)"
    )
    causes = list(_causes(err))
    tls = next((c for c in causes if isinstance(c, ssl.SSLError)), None)
    reason = getattr(tls, "verify_message", None) or getattr(tls, "reason", None) or "TLS"
    unreachable = (errno.EHOSTUNREACH, errno.ENETUNREACH)
    # The first that holds names the cause: TLS and DNS before refused, refused before timeout.
    cases = (
        (
            # requests' own message quotes the whole header, the key with it: never shown.
            isinstance(err, requests.exceptions.InvalidHeader),
            "the API key holds a line break or another character a header cannot carry (copied "
            "with its line ending?): set it again (OPENAI_API_KEY, or the stack's apiKey output)",
        ),
        (
            isinstance(err, requests.exceptions.SSLError) or tls is not None,
            f"TLS with {where} failed ({reason}): the endpoint's certificate is not one this "
            "machine trusts, or not there yet (a fresh Droplet gets its own while `pulumi up` "
            "runs: wait for it); one of your own CA needs --cacert FILE",
        ),
        (
            any(isinstance(c, socket.gaierror) for c in causes),
            f"cannot resolve {where.rsplit(':', 1)[0]}: check --endpoint or the stack's output",
        ),
        (
            any(isinstance(c, ConnectionRefusedError) for c in causes),
            f"{where} refused the connection: nothing listens there yet; {starting}",
        ),
        (
            any(isinstance(c, OSError) and c.errno in unreachable for c in causes),
            f"no route from this machine to {where}: its network cannot reach that address "
            "(an IPv6 address without an IPv6 route, a VPN?); check --endpoint or the stack's "
            "endpoint output",
        ),
        (
            isinstance(err, requests.exceptions.ConnectTimeout),
            f"no connection to {where} within {connect:g} s: {outside}, or {starting}",
        ),
        (
            isinstance(err, requests.exceptions.ReadTimeout),
            f"{where} took the request but sent no answer within {seconds:g} s (a sleeping "
            f"endpoint holds requests while it wakes: `nemodrop wake --stack {stack}`)",
        ),
        (
            any(isinstance(c, urllib3.exceptions.ProtocolError) for c in causes),
            f"{where} closed the connection before its answer ended (a proxy, or the server "
            "restarting mid-request): try again; if it lasts, read the endpoint's logs "
            f"(`nemodrop logs --stack {stack}`)",
        ),
    )
    return next((message for holds, message in cases if holds), f"no answer from {where}: {err}")


def describe_status(response: requests.Response, target: target_mod.Target) -> str | None:
    """One line for an answer that says the endpoint cannot serve (yet); None for others."""
    _, stack = _where(target)
    status = response.status_code
    body = " ".join(response.text.split())[:120]
    if status in (401, 403):
        return refused_key(status, body)
    if status in (502, 504):
        return (
            f"the gateway answers but vLLM behind it does not (HTTP {status}): the model may "
            f"still be loading; `nemodrop logs --stack {stack}` shows vLLM's start"
        )
    if status == 503:
        return (
            f"the endpoint is not ready (HTTP 503: {body or 'no reason given'}): it is starting, "
            f"waking or being updated; try again in a minute (`nemodrop wake --stack "
            f"{stack}` shows a sleeping set's state)"
        )
    return None


def probe(target: target_mod.Target, seconds: float) -> requests.Response:
    """GET /v1/models with the key, once, its whole answer within `seconds`. Raises
    EndpointError when there is no answer or one that says the endpoint cannot serve (401, 403,
    502, 503, 504); returns any other answer, its body read."""
    deadline = time.monotonic() + seconds
    try:
        response = requests.get(
            target.url("models"),
            headers=target.headers,
            timeout=(min(CONNECT_SECONDS, seconds), seconds),
            verify=target.verify,
            stream=True,
        )
        _read_by(response, deadline, seconds)
    except requests.RequestException as err:
        raise EndpointError(describe_failure(err, target, seconds)) from None
    problem = describe_status(response, target)
    if problem:
        raise EndpointError(problem)
    return response


def _read_by(response: requests.Response, deadline: float, seconds: float) -> None:
    """The body, whole by `deadline` and at most MAX_BODY_BYTES: requests bounds each read, not
    the answer, so a server that sends a byte at a time (or without end) held the tool for ever."""
    chunks, size = [], 0
    # urllib3 2's read1 returns what has come; its read(n), under iter_content, waits for all n.
    read1 = getattr(response.raw, "read1", None)
    with response:
        while True:
            try:
                if read1 is not None:
                    chunk = read1(64 * 1024, decode_content=True)
                else:
                    chunk = response.raw.read(1024, decode_content=True)
            except urllib3.exceptions.ReadTimeoutError as err:  # as requests' own reads say it
                raise requests.exceptions.ReadTimeout(err, response=response) from err
            except urllib3.exceptions.HTTPError as err:  # cut mid-body, a bad chunk, decoding
                raise requests.exceptions.ConnectionError(err, response=response) from err
            if not chunk:
                break
            size += len(chunk)
            chunks.append(chunk)
            if size > MAX_BODY_BYTES:
                raise EndpointError(
                    f"{response.url} sent over {MAX_BODY_BYTES // 2**20} MiB for a model list "
                    f"(HTTP {response.status_code}): that is no vLLM; check --endpoint"
                )
            if time.monotonic() > deadline:
                raise EndpointError(
                    f"{response.url} answered HTTP {response.status_code} but its body did not "
                    f"end within {seconds:g} s (--timeout): a proxy or a server that trickles"
                )
    response._content = b"".join(chunks)  # what .content and .json() read (requests models.py)
