"""What every client here that carries a token to an API shares: where the token may go, one
opener that refuses redirects, bounded answers, Retry-After, and an API call's retry rules.

Why no redirect is followed: urllib's HTTPRedirectHandler sends the request's headers on to the
Location, Authorization included (CPython Lib/urllib/request.py, redirect_request copies every
header but the content ones), so a 3xx could carry the token to another host. A 3xx is an
answer here, never followed. Standard library only.
"""

from __future__ import annotations

import email.message
import email.utils
import http.client
import json
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# The one plain-HTTP host a token may go to: the tests' fakes on loopback.
LOOPBACK = "127.0.0.1"
HTTPS_ONLY = "the token goes over HTTPS only (plain HTTP to 127.0.0.1 alone)"
TIMEOUT_SECONDS = 30.0  # one request, unless its caller says less
MAX_ANSWER_BYTES = 32 * 1024 * 1024  # an API's JSON; more is no answer of this API's
SERVER_ERROR_TRIES = 3
# The most one Api waits on Retry-After in total (lease.yml's timeout-minutes fits it).
MAX_WAIT_SECONDS = 180.0

Sleep = Callable[[float], None]


def token_url_problem(url: str) -> str | None:
    """None when a token may be sent to `url`: HTTPS to a host, or plain HTTP to 127.0.0.1 by
    its address (not a name, and not `127.0.0.1:1@elsewhere`, whose host is elsewhere)."""
    split = urllib.parse.urlsplit(url)
    if split.scheme == "https" and split.hostname:
        return None
    if split.scheme == "http" and split.hostname == LOOPBACK:
        return None
    return HTTPS_ONLY


def retry_after_seconds(header: str | None, now: float) -> float | None:
    """Seconds a Retry-After asks for (RFC 9110 10.2.3: delta-seconds or an HTTP-date, which
    DigitalOcean's and GitHub's APIs may send); None when missing or unreadable."""
    if not header:
        return None
    value = header.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now)


class RefusedError(Exception):
    """The token cannot do this (401: the token; 403: a scope): stop, say which."""


class FailedError(Exception):
    """A call that did not succeed after its retries, or an answer too large to be one."""


@dataclass
class Answer:
    """One HTTP answer: its status, headers and body (read and closed)."""

    status_code: int
    headers: email.message.Message
    body: bytes
    # False when the body is cut: over its limit, or still arriving at its deadline
    # (request_cut alone returns such an answer).
    complete: bool = True

    def json(self) -> Any:
        return json.loads(self.body or b"null")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A 3xx is an answer, never followed: urllib would send the Authorization header on."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


def _opener(cadata: str | None) -> urllib.request.OpenerDirector:
    """The opener that follows no redirect; with `cadata`, one whose HTTPS trusts that CA
    alone (ssl.create_default_context: the hostname checked, the certificate required)."""
    if cadata is None:
        return _OPENER
    tls = urllib.request.HTTPSHandler(context=ssl.create_default_context(cadata=cadata))
    return urllib.request.build_opener(_NoRedirect, tls)


def request(
    method: str,
    url: str,
    headers: dict[str, str],
    timeout: float = TIMEOUT_SECONDS,
    limit: int = MAX_ANSWER_BYTES,
    data: bytes | None = None,
    within: float | None = None,
    cadata: str | None = None,
) -> Answer:
    """One HTTP call (with `data` as its body if given); any status is an answer (a 3xx too).
    A dropped connection or a timeout raises OSError (or http.client.HTTPException); a body over
    `limit` bytes, or one still arriving after `within` seconds, FailedError. `cadata`: the PEM
    CA(s) that alone are trusted for HTTPS (a cluster's own CA, from its kubeconfig)."""
    if problem := token_url_problem(url):
        raise ValueError(problem)
    answer = _open(method, url, headers, timeout, limit, data, within, cadata)
    return _whole(method, url, answer, limit, within)


def request_cut(
    method: str, url: str, headers: dict[str, str], timeout: float, limit: int, within: float
) -> Answer:
    """`request` for an answer whose beginning is worth having (a job's log): what came within
    `limit` bytes and `within` seconds, `complete` False when that was not all of it."""
    if problem := token_url_problem(url):
        raise ValueError(problem)
    return _open(method, url, headers, timeout, limit, None, within)


def private_get(url: str, key: str, timeout: float, limit: int) -> Answer:
    """One GET of a page on this host or its private network: vLLM's /metrics on loopback, a
    replica's through its private gateway (with `key`, the stack's API key, which that gateway
    asks for; "": none), the metadata service. Plain HTTP is allowed here, as no API token goes
    here; the opener is the same: a redirect is an answer, never followed with the key. Raises
    as `request` does."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return _whole("GET", url, _open("GET", url, headers, timeout, limit), limit, None)


def _whole(method: str, url: str, answer: Answer, limit: int, within: float | None) -> Answer:
    """The answer when it came whole; FailedError when it was cut."""
    if not answer.complete:
        slow = f", or still coming after {within:g} s" if within is not None else ""
        raise FailedError(f"{method} {path_of(url)}: an answer over {limit} bytes{slow}")
    return answer


def _open(
    method: str,
    url: str,
    headers: dict[str, str],
    timeout: float,
    limit: int,
    data: bytes | None = None,
    within: float | None = None,
    cadata: str | None = None,
) -> Answer:
    """The call itself, through the opener that follows no redirect; the body read to `limit`
    (and until `within` seconds from now, when given)."""
    # A value with a line break or NUL (a token pasted with its line ending) is refused here, in
    # words that hold no value: http.client's own ValueError quotes the whole header, the token
    # with it, and callers print what they catch.
    for name, value in headers.items():
        if any(ch in value for ch in "\r\n\0"):
            raise FailedError(f"{method} {path_of(url)}: the {name} header holds a line break or "
                              "NUL (a token copied with its line ending?)")  # fmt: skip
    call = urllib.request.Request(url, data=data, method=method, headers=headers)  # noqa: S310 (callers' rules)
    deadline = None if within is None else time.monotonic() + within
    try:
        with _opener(cadata).open(call, timeout=timeout) as answer:
            status, got = answer.status, answer.headers
            body, in_time = read_bounded(answer, limit, deadline)
    except urllib.error.HTTPError as err:
        with err:
            status, got = err.code, err.headers
            body, in_time = read_bounded(err, limit, deadline)
    return Answer(status, got, body[:limit], complete=in_time and len(body) <= limit)


def read_bounded(answer: Any, limit: int, deadline: float | None) -> tuple[bytes, bool]:
    """At most `limit` + 1 bytes of an answer (one more says it was over), read in chunks until
    `deadline` (time.monotonic) when given: a socket timeout bounds one read only, and an answer
    that trickles would never end. Whether it was read before the deadline."""
    if deadline is None:
        return answer.read(limit + 1), True
    # read1: what one read of the socket brings (read(n) would wait for all n bytes).
    read = getattr(answer, "read1", answer.read)
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        if time.monotonic() >= deadline:
            return b"".join(chunks), False
        chunk = read(min(65536, limit + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks), True


def path_of(url: str) -> str:
    """The URL's path alone: what a message may name (never a query's or a host's secrets)."""
    return urllib.parse.urlsplit(url).path


def retry_after(header: str | None) -> float:
    """Seconds to wait on a Retry-After; 60 when it is missing or unreadable, 1 at least."""
    seconds = retry_after_seconds(header, time.time())
    return 60.0 if seconds is None else max(1.0, seconds)


@dataclass
class Api:
    """An API with a token, and the retry rules of each call: 429 (and GitHub's rate-limit
    403) waits for Retry-After within MAX_WAIT_SECONDS in all, a 5xx and a dropped connection
    are tried again (SERVER_ERROR_TRIES in all), 401 and any other 403 stop."""

    url: str
    token: str
    sleep: Sleep = time.sleep
    waited: float = 0.0
    # For the messages: the variable the token came from, the service; and the API's headers.
    env_name: str = "DIGITALOCEAN_TOKEN"
    service: str = "DigitalOcean"
    headers: dict[str, str] = field(default_factory=dict)
    timeout: float = TIMEOUT_SECONDS

    def call(self, method: str, target: str, scope: str) -> Answer:
        """One call to `target` (a path on the API, or a whole URL); `scope`: what a 403 names."""
        url = target if target.startswith(("http://", "https://")) else f"{self.url}{target}"
        headers = {**self.headers, "Authorization": f"Bearer {self.token}"}
        failed = 0  # 5xx answers and dropped connections; a 429 is not a failure, only a wait
        while True:
            try:
                answer = request(method, url, headers, self.timeout)
            except (OSError, http.client.HTTPException) as err:
                failed += 1
                if failed == SERVER_ERROR_TRIES:
                    raise FailedError(f"{method} {path_of(url)}: {type(err).__name__}") from None
                self.sleep(2.0**failed)
                continue
            self.refused(method, url, answer, scope)
            if answer.status_code in (403, 429):  # 403 here: GitHub's rate limit
                wait = retry_after(answer.headers.get("retry-after"))
                if self.waited + wait > MAX_WAIT_SECONDS:
                    raise FailedError(f"{method} {path_of(url)}: rate limited "
                                      f"(HTTP {answer.status_code}) too long")  # fmt: skip
                self.waited += wait
                self.sleep(wait)
                continue
            if answer.status_code >= 500:
                failed += 1
                if failed < SERVER_ERROR_TRIES:
                    self.sleep(2.0**failed)
                    continue
            return answer

    def refused(self, method: str, url: str, answer: Answer, scope: str) -> None:
        """RefusedError for a 401, and for a 403 that is not a rate limit (it names the scope)."""
        if answer.status_code == 401:
            raise RefusedError(f"{self.env_name}: {self.service} refused it (HTTP 401)")
        if answer.status_code == 403 and answer.headers.get("x-ratelimit-remaining") != "0":
            raise RefusedError(
                f"{self.env_name}: {method} {path_of(url)} refused (HTTP 403): the token "
                f"needs the scope {scope}"
            )
