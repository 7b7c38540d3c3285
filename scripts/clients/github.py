"""GitHub's REST API with a token: its headers, one GET, and an Api with the retry rules.

Every call sends `Accept: application/vnd.github+json` and `X-GitHub-Api-Version: 2022-11-28`
(docs.github.com/en/rest/overview/api-versions: breaking changes come only in a new version, so
the one named keeps the answers' shapes), a User-Agent ("Requests with no User-Agent header will
be rejected": docs.github.com/en/rest/using-the-rest-api/getting-started-with-the-rest-api) and
the token as `Authorization: Bearer`. No redirect is followed
(transport.py says why): a 3xx is an answer, which a caller reads as "not this". The front's
waker (scripts/phases/wake.py) keeps its own copy until a host can be sent this folder.
"""

from __future__ import annotations

import time

from . import transport

API_URL = "https://api.github.com"
API_VERSION = "2022-11-28"


def headers(user_agent: str, token: str = "") -> dict[str, str]:
    """GitHub's headers for one caller (its User-Agent names it), with the token if given."""
    sent = {
        "Accept": "application/vnd.github+json",
        "X-GitHub-Api-Version": API_VERSION,
        "User-Agent": user_agent,
    }
    return {**sent, "Authorization": f"Bearer {token}"} if token else sent


def get(url: str, token: str, user_agent: str, timeout: float) -> transport.Answer:
    """One GET, not tried again (its caller bounds the whole); any status is an answer. A
    dropped connection or a timeout raises OSError (or http.client.HTTPException)."""
    return transport.request("GET", url, headers(user_agent, token), timeout)


def api(
    url: str, token: str, user_agent: str, sleep: transport.Sleep = time.sleep
) -> transport.Api:
    """The API at `url` (the runner's GITHUB_API_URL, or api.github.com) with the retry rules
    of transport.Api; a refusal names GITHUB_TOKEN."""
    return transport.Api(
        url.rstrip("/"), token, sleep, env_name="GITHUB_TOKEN", service="GitHub",
        headers=headers(user_agent),
    )  # fmt: skip
