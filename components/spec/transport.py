"""Two rules of every client here that carries a token to an API: where the token may go, and
how long a 429 or 503 asks it to wait. Standard library only: scripts/ci/lease.py runs it with
the runner image's python3 from a sparse checkout (lease.yml lists this file).

The scripts a host runs keep their own copies, since a phase sends one file (scripts/phases/
wake.py's URL guard, scripts/phases/autodown.py's retry_after): tests/test_layout.py holds
them to the same answers as these.
"""

from __future__ import annotations

import email.utils
import urllib.parse

# The one plain-HTTP host a token may go to: the tests' fakes on loopback.
LOOPBACK = "127.0.0.1"
HTTPS_ONLY = "the token goes over HTTPS only (plain HTTP to 127.0.0.1 alone)"


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
