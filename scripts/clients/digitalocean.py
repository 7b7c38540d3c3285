"""DigitalOcean's API with a token: one GET, an Api with the retry rules, and its pages.

The token goes as `Authorization: Bearer` (DigitalOcean OpenAPI, specification/DigitalOcean-
public.v2.yaml, securitySchemes bearer_auth), over HTTPS only (transport.token_url_problem). A
list is read page by page: each answer's `links.pages.next` names the next page until the last
has none (description.yml, "Links & Pagination"; at most 200 a page). The next link names
api.digitalocean.com: it is followed on the API the client was given, so a test's fake on
loopback (or a proxy) gets every page.
"""

from __future__ import annotations

import time
import urllib.parse
from typing import Any

from . import transport

API_URL = "https://api.digitalocean.com"
# More pages than any list of one account (PER_PAGE each) could fill: a bound on a loop.
MAX_PAGES = 1000
PER_PAGE = 200  # the most DigitalOcean gives per page (description.yml, "Links & Pagination")


def get(api_url: str, path: str, token: str, timeout: float, **params: Any) -> transport.Answer:
    """One GET of `path` with `params` as its query, not tried again (the caller names what a
    401 or 403 means for it); any status is an answer."""
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    url = f"{api_url.rstrip('/')}{path}{query}"
    return transport.request("GET", url, {"Authorization": f"Bearer {token}"}, timeout)


def delete(api_url: str, path: str, token: str, timeout: float) -> transport.Answer:
    """One DELETE of `path`, not tried again (the caller keeps its own retry rules and names
    what a 401 or 403 means for it); any status is an answer, a 3xx too."""
    url = f"{api_url.rstrip('/')}{path}"
    return transport.request("DELETE", url, {"Authorization": f"Bearer {token}"}, timeout)


def api(url: str, token: str, sleep: transport.Sleep = time.sleep) -> transport.Api:
    """The API at `url` with the retry rules of transport.Api; a refusal names
    DIGITALOCEAN_TOKEN."""
    return transport.Api(url.rstrip("/"), token, sleep)


def pages(api: transport.Api, path: str, key: str, scope: str) -> list[dict[str, Any]]:
    """Every item under `key` of the list at `path`, page by page (PER_PAGE a page). `scope`:
    what a 403 names. FailedError for an answer that is not 200."""
    items: list[dict[str, Any]] = []
    split = urllib.parse.urlsplit(path)
    query = [*urllib.parse.parse_qsl(split.query), ("per_page", str(PER_PAGE))]
    target: str | None = f"{split.path}?{urllib.parse.urlencode(query)}"
    seen: set[str] = set()
    while target:
        # A next link that comes round again would loop for ever: FailedError instead.
        if target in seen or len(seen) >= MAX_PAGES:
            raise transport.FailedError(f"GET {split.path}: its pages do not end")
        seen.add(target)
        answer = api.call("GET", target, scope)
        if answer.status_code != 200:
            raise transport.FailedError(f"GET {split.path}: HTTP {answer.status_code}")
        body = answer.json() or {}
        if not isinstance(body, dict) or not isinstance(body.get(key) or [], list):
            raise transport.FailedError(f"GET {split.path}: not a page of {key}")
        items += body.get(key) or []
        target = ((body.get("links") or {}).get("pages") or {}).get("next")
        if target:
            # Follow the next page on the API we were given (a link names api.digitalocean.com).
            following = urllib.parse.urlsplit(target)
            target = f"{following.path}?{following.query}"
    return items
