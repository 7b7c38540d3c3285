"""GitHub's REST API with a token: its headers, one GET, and an Api with the retry rules.

Every call sends `Accept: application/vnd.github+json` and `X-GitHub-Api-Version: 2022-11-28`
(docs.github.com/en/rest/overview/api-versions: breaking changes come only in a new version, so
the one named keeps the answers' shapes), a User-Agent ("Requests with no User-Agent header will
be rejected": docs.github.com/en/rest/using-the-rest-api/getting-started-with-the-rest-api) and
the token as `Authorization: Bearer`. No redirect is followed
(transport.py says why): a 3xx is an answer, which a caller reads as "not this"; the one
redirect GitHub's API sends on purpose, a job log's to its signed storage URL, is fetched
without the token (job_log).
"""

from __future__ import annotations

import json
import time
from typing import Any

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


def post(url: str, token: str, user_agent: str, timeout: float, body: Any) -> transport.Answer:
    """One POST of `body` as JSON, not tried again (a workflow_dispatch sent twice is two
    runs); any status is an answer. Raises as `get` does."""
    sent = {**headers(user_agent, token), "Content-Type": "application/json"}
    return transport.request("POST", url, sent, timeout, data=json.dumps(body).encode())


# The statuses a job log's download answers with its storage URL in Location (docs.github.com
# /en/rest/actions/workflow-jobs "Download job logs for a workflow job": 302; the others are
# read the same way should GitHub move to them).
LOG_REDIRECTS = (301, 302, 307, 308)


def job_log(
    url: str, token: str, user_agent: str, timeout: float, limit: int, within: float
) -> str | None:
    """A job's log (GET .../actions/jobs/{id}/logs), at most `limit` bytes read within `within`
    seconds (what came by then: the beginning of a long log is still worth reading); None when
    GitHub did not give it. GitHub answers 302 to a storage URL signed for a minute, fetched
    WITHOUT the token, which belongs to GitHub's API alone (and over HTTPS: transport's rule);
    a GitHub Enterprise Server may answer 200 with the log in place."""
    answer = transport.request_cut("GET", url, headers(user_agent, token), timeout, limit, within)
    location = answer.headers.get("Location", "")
    if answer.status_code in LOG_REDIRECTS and location:
        plain = {"User-Agent": user_agent}
        answer = transport.request_cut("GET", location, plain, timeout, limit, within)
    if answer.status_code != 200:
        return None
    return answer.body.decode("utf-8", "replace")


def api(
    url: str, token: str, user_agent: str, sleep: transport.Sleep = time.sleep
) -> transport.Api:
    """The API at `url` (the runner's GITHUB_API_URL, or api.github.com) with the retry rules
    of transport.Api; a refusal names GITHUB_TOKEN."""
    return transport.Api(
        url.rstrip("/"), token, sleep, env_name="GITHUB_TOKEN", service="GitHub",
        headers=headers(user_agent),
    )  # fmt: skip
