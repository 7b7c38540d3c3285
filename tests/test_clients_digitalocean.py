"""scripts/clients/digitalocean.py: the token as a Bearer header over HTTPS (or to 127.0.0.1), one
GET with a query, an Api with the retry rules (429 waits its Retry-After, 5xx is tried again,
401 and 403 stop naming the token and the scope), every page of a list; against the fake
DigitalOcean API (tests/support/stack/do_api.py), which answers as the OpenAPI says."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from loopback import reply, serve, stop, url
from stack.do_api import Account, DigitalOceanAPI

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT / "scripts"))

from clients import digitalocean, transport  # noqa: E402

GPU = "gpu-4000adax1-20gb"


@pytest.fixture
def api() -> Iterator[DigitalOceanAPI]:
    with DigitalOceanAPI(Account()) as fake:
        yield fake


def test_pages_reads_every_page_with_the_token(api: DigitalOceanAPI) -> None:
    for i in range(205):
        api.account.add_droplet(f"d-{i:03d}", GPU, tags=["x"])
    token = api.account.add_token("reader", ["droplet:read"])
    client = digitalocean.api(api.url + "/", token, sleep=lambda _: None)
    found = digitalocean.pages(client, "/v2/droplets?type=gpus", "droplets", "droplet:read")
    assert sorted(d["name"] for d in found) == [f"d-{i:03d}" for i in range(205)]
    asked = [(s.query.get("page", ["1"])[0], s.query["per_page"][0], s.query["type"][0], s.token)
             for s in api.requests]  # fmt: skip
    assert asked == [("1", "200", "gpus", "reader"), ("2", "200", "gpus", "reader")]


def test_a_next_link_to_api_digitalocean_com_is_followed_on_the_api_given() -> None:
    """DigitalOcean's links name api.digitalocean.com: a client given a fake (or a proxy) reads
    the next page there, not from the host the link names."""
    asked: list[str] = []

    class Paged(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            asked.append(self.path)
            page = parse_qs(urlsplit(self.path).query).get("page", ["1"])[0]
            nxt = "https://api.digitalocean.com/v2/kubernetes/clusters?page=2&per_page=200"
            body = {"kubernetes_clusters": [{"id": page}],
                    "links": {"pages": {"next": nxt}} if page == "1" else {}}  # fmt: skip
            reply(self, 200, json.dumps(body).encode(), "application/json")

    server = serve(Paged)
    try:
        client = digitalocean.api(url(server), "dop_v1_x")
        found = digitalocean.pages(client, "/v2/kubernetes/clusters", "kubernetes_clusters", "k")
    finally:
        stop(server)
    assert found == [{"id": "1"}, {"id": "2"}]
    assert asked == ["/v2/kubernetes/clusters?per_page=200",
                     "/v2/kubernetes/clusters?page=2&per_page=200"]  # fmt: skip


def test_a_rate_limit_is_waited_out_and_server_errors_tried_again(api: DigitalOceanAPI) -> None:
    token = api.account.add_token("reader", ["droplet:read"])
    slept: list[float] = []
    client = digitalocean.api(api.url, token, sleep=slept.append)
    api.throttle(2, retry_after=7)
    api.fail(2, status=503)
    assert digitalocean.pages(client, "/v2/droplets", "droplets", "droplet:read") == []
    assert slept == [7.0, 7.0, 2.0, 4.0]
    api.fail(3, status=500)
    with pytest.raises(transport.FailedError, match=r"GET /v2/droplets: HTTP 500"):
        digitalocean.pages(client, "/v2/droplets", "droplets", "droplet:read")


def test_a_refusal_names_the_token_or_the_scope_it_lacks(api: DigitalOceanAPI) -> None:
    with pytest.raises(transport.RefusedError, match=r"DIGITALOCEAN_TOKEN: DigitalOcean refused"):
        digitalocean.pages(digitalocean.api(api.url, "dop_v1_unknown"), "/v2/droplets",
                           "droplets", "droplet:read")  # fmt: skip
    token = api.account.add_token("sizes-only", ["sizes:read"])
    with pytest.raises(transport.RefusedError, match="needs the scope droplet:read"):
        digitalocean.pages(digitalocean.api(api.url, token), "/v2/droplets", "droplets",
                           "droplet:read")  # fmt: skip


def test_get_sends_its_query_once_and_any_status_is_an_answer(api: DigitalOceanAPI) -> None:
    token = api.account.add_token("reader", ["sizes:read", "regions:read"])
    api.account.offered[GPU] = ["nyc2"]
    sizes = digitalocean.get(api.url, "/v2/sizes", token, 5, per_page=200)
    assert sizes.status_code == 200 and GPU in {s["slug"] for s in sizes.json()["sizes"]}
    assert api.requests[-1].query == {"per_page": ["200"]}
    api.fail(1, status=503)
    assert digitalocean.get(api.url, "/v2/sizes", token, 5).status_code == 503, "not tried again"
    assert digitalocean.get(api.url, "/v2/sizes", "dop_v1_unknown", 5).status_code == 401


def test_the_token_goes_over_https_or_to_127_0_0_1_only(api: DigitalOceanAPI) -> None:
    local = api.url.replace("127.0.0.1", "localhost")
    with pytest.raises(ValueError, match="HTTPS only"):
        digitalocean.get(local, "/v2/sizes", "dop_v1_secret", 5)
    assert api.requests == []


def test_delete_is_one_call_with_the_token_and_any_status_an_answer(api: DigitalOceanAPI) -> None:
    """autodown's DELETE: one call (its caller keeps its own retries within its run), 204 then
    404 for a Droplet already gone, 403 for a token without the scope; HTTPS or 127.0.0.1."""
    droplet = api.account.add_droplet("gpu", GPU).id
    token = api.account.add_token("autodown", ["droplet:delete"])
    reader = api.account.add_token("reader", ["droplet:read"])
    assert digitalocean.delete(api.url, f"/v2/droplets/{droplet}", reader, 5).status_code == 403
    assert digitalocean.delete(api.url, f"/v2/droplets/{droplet}", token, 5).status_code == 204
    assert digitalocean.delete(api.url, f"/v2/droplets/{droplet}", token, 5).status_code == 404
    api.fail(1, status=503)
    assert digitalocean.delete(api.url, "/v2/droplets/1", token, 5).status_code == 503
    with pytest.raises(ValueError, match="HTTPS only"):
        digitalocean.delete(api.url.replace("127.0.0.1", "localhost"), "/v2/droplets/1", token, 5)


def test_a_private_page_is_read_over_plain_http_and_a_redirect_takes_no_key_on() -> None:
    """transport.private_get (a host's /metrics and metadata reads): plain HTTP to a private
    name is allowed, as no API token goes there; a 3xx is the answer, and its target never
    sees the key."""
    seen: list[tuple[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append((self.path, self.headers.get("Authorization", "")))
            if self.path == "/metrics":
                self.send_response(307)
                self.send_header("Location", "/elsewhere")
                self.send_header("Content-Length", "0")
                self.end_headers()
            else:
                reply(self, 200, b"elsewhere")

        def log_message(self, *_: object) -> None:
            pass

    server = serve(Handler)
    try:
        base = url(server).replace("127.0.0.1", "localhost")
        answer = transport.private_get(f"{base}/metrics", "the-api-key", 5, 1024)
        assert answer.status_code == 307
        assert seen == [("/metrics", "Bearer the-api-key")], "the redirect was not followed"
        with pytest.raises(transport.FailedError):
            transport.private_get(f"{base}/elsewhere", "", 5, 4)  # over its bound
    finally:
        stop(server)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"droplets": [{"id": 1}], "links": {"pages": {"next": "/v2/droplets?page=1"}}},
         "its pages do not end"),
        ([{"id": 1}], "not a page of droplets"),
        ({"droplets": {"id": 1}}, "not a page of droplets"),
    ],
)  # fmt: skip
def test_a_page_that_comes_round_again_or_is_no_page_is_refused(body: Any, says: str) -> None:
    """A next link that names a page already read would loop for ever; a body that is not the
    list asked for would end in an AttributeError no caller catches."""

    class Odd(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            reply(self, 200, json.dumps(body).encode(), "application/json")

    server = serve(Odd)
    try:
        client = digitalocean.api(url(server), "dop_v1_x")
        with pytest.raises(transport.FailedError, match=says):
            digitalocean.pages(client, "/v2/droplets?page=1", "droplets", "droplet:read")
    finally:
        stop(server)
