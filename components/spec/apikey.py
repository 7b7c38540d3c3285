"""What an API key given in the config must look like.

The key travels in an `Authorization: Bearer` header, an EnvironmentFile line read by systemd,
and the gateway's key check (a Caddy placeholder compared in an expression). Letters, digits,
`-`, `_` and `.` mean nothing to any of them; `*` is a wildcard to Caddy's header matcher, `{}`
a placeholder, `$`, `%`, quotes and `\\` are special to systemd, `,` joins header values, and
white space ends a token. A short key can be guessed: 32 characters of this set are about 190
bits. The generated key is 48 letters and digits.
"""

from __future__ import annotations

import re

MIN_LENGTH = 32
CHARSET_TEXT = "letters, digits, `-`, `_` and `.`"
_ALLOWED = re.compile(r"[A-Za-z0-9._-]")


def problems(key: str) -> list[str]:
    """What is wrong with a given key; never quotes the key or any part of it."""
    found = []
    if len(key) < MIN_LENGTH:
        found.append(f"{len(key)} characters; accepted: at least {MIN_LENGTH}")
    if any(not _ALLOWED.fullmatch(c) for c in key):
        # Which ones is not said: that would be a piece of the secret in a log line.
        found.append(
            f"holds other characters than {CHARSET_TEXT} (the gateway, the HTTP header or "
            f"systemd give them a meaning); accepted: only {CHARSET_TEXT}"
        )
    return found
