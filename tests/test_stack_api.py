"""The stack emulation's DigitalOcean API (stack/do_api.py) over real HTTP: the rules a caller
meets on the real API (paging, GPU Droplets left out of plain lists, filters that refuse to
combine, scopes, rate limits), and the knobs the tests of its callers turn."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from stack.do_api import (
    FORBIDDEN,
    NOT_FOUND,
    SCOPES_FILE,
    SNAPSHOT,
    UNAUTHORIZED,
    Account,
    DigitalOceanAPI,
    extract_from_snapshot,
)

GPU = "gpu-h100x1-80gb"
CPU = "s-1vcpu-1gb"


class Clock:
    def __init__(self) -> None:
        self.t = 1_800_000_000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def account() -> Account:
    return Account()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def api(account: Account, clock: Clock) -> Iterator[DigitalOceanAPI]:
    with DigitalOceanAPI(account, clock=clock) as server:
        yield server


def call(
    api: DigitalOceanAPI, method: str, path: str, token: str | None = None
) -> tuple[int, dict[str, str], Any]:
    """One request as a client sends it: (status, lower-cased headers, parsed body or None)."""
    url = path if path.startswith("http") else f"{api.url}{path}"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, method=method, headers=headers)  # noqa: S310 (loopback)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
            status, raw, data = response.status, response.headers, response.read()
    except urllib.error.HTTPError as err:
        status, raw, data = err.code, err.headers, err.read()
    return status, {k.lower(): v for k, v in raw.items()}, json.loads(data) if data else None


def test_paging_past_one_page_follows_the_links_to_every_droplet(
    account: Account, api: DigitalOceanAPI
) -> None:
    made = [account.add_droplet(f"web-{i}", CPU).id for i in range(205)]
    token = account.add_token("reader", ["droplet:read"])
    status, _, body = call(api, "GET", "/v2/droplets", token)
    assert status == 200
    assert len(body["droplets"]) == 20, "20 per page by default"
    assert body["meta"] == {"total": 205}
    pages = body["links"]["pages"]
    assert set(pages) == {"next", "last"}, "no first/prev on the first page"
    assert "page=2" in pages["next"] and "page=11" in pages["last"]
    seen = [d["id"] for d in body["droplets"]]
    while "next" in body["links"].get("pages", {}):
        status, _, body = call(api, "GET", body["links"]["pages"]["next"], token)
        seen += [d["id"] for d in body["droplets"]]
    assert seen == made, "every Droplet once, in order"
    assert set(body["links"]["pages"]) == {"first", "prev"}
    assert len(body["droplets"]) == 5
    # At most 200 a page: more is clamped; a single page has no page links.
    _, _, body = call(api, "GET", "/v2/droplets?per_page=500", token)
    assert len(body["droplets"]) == 200
    assert "page=2" in body["links"]["pages"]["last"]
    _, _, body = call(api, "GET", "/v2/droplets?name=web-3", token)
    assert body["links"] == {} and body["meta"] == {"total": 1}
    _, _, body = call(api, "GET", "/v2/droplets?per_page=7&page=2", token)
    assert [d["id"] for d in body["droplets"]] == made[7:14]
    assert "per_page=7" in body["links"]["pages"]["next"], "links keep the page size"
    assert call(api, "GET", "/v2/droplets?per_page=0", token)[0] == 400


def test_gpu_droplets_are_left_out_unless_type_is_gpus(
    account: Account, api: DigitalOceanAPI
) -> None:
    gpus = [account.add_droplet(f"Nemotron-{i}", GPU, tags=["nemo"]).id for i in range(2)]
    plain = account.add_droplet("cpu", CPU, tags=["nemo"]).id
    token = account.add_token("reader", ["droplet:read", "tag:read"])
    _, _, body = call(api, "GET", "/v2/droplets", token)
    assert [d["id"] for d in body["droplets"]] == [plain]
    assert body["meta"]["total"] == 1
    _, _, body = call(api, "GET", "/v2/droplets?type=gpus", token)
    assert [d["id"] for d in body["droplets"]] == gpus
    droplet = body["droplets"][0]
    assert droplet["gpu_info"]["count"] == 1
    assert droplet["size"]["gpu_info"]["vram"] == {"amount": 80, "unit": "gib"}
    assert droplet["size_slug"] == GPU and droplet["size"]["price_hourly"] > 1
    assert {n["type"] for n in droplet["networks"]["v4"]} == {"public", "private"}
    _, _, body = call(api, "GET", "/v2/droplets?type=droplets", token)
    assert [d["id"] for d in body["droplets"]] == [plain]
    # `name` is exact and case-insensitive, and combines with `type`.
    _, _, body = call(api, "GET", "/v2/droplets?type=gpus&name=nemotron-1", token)
    assert [d["id"] for d in body["droplets"]] == [gpus[1]]
    # By tag, only the non-GPU ones: a GPU Droplet can never be found by tag.
    _, _, body = call(api, "GET", "/v2/droplets?tag_name=nemo", token)
    assert [d["id"] for d in body["droplets"]] == [plain]
    # One by id is found whatever its kind.
    status, _, body = call(api, "GET", f"/v2/droplets/{gpus[0]}", token)
    assert status == 200 and body["droplet"]["name"] == "Nemotron-0"


def test_tag_name_refuses_type_and_name_as_the_openapi_says(
    account: Account, api: DigitalOceanAPI
) -> None:
    account.add_droplet("gpu", GPU, tags=["nemo"])
    token = account.add_token("reader", ["droplet:read", "tag:read"])
    for query in (
        "type=gpus&tag_name=nemo",
        "tag_name=nemo&type=droplets",
        "tag_name=nemo&name=gpu",
    ):
        status, _, body = call(api, "GET", f"/v2/droplets?{query}", token)
        assert status == 400, query
        assert body["id"] == "bad_request"
        assert "can not be combined" in body["message"]
    assert call(api, "GET", "/v2/droplets?type=all", token)[0] == 400
    # tag_name needs tag:read besides droplet:read (droplets/parameters.yml).
    reader = account.add_token("no-tags", ["droplet:read"])
    assert call(api, "GET", "/v2/droplets?tag_name=nemo", reader)[:1] == (403,)
    assert call(api, "GET", "/v2/droplets", reader)[0] == 200


def test_scopes_are_enforced_on_delete(account: Account, api: DigitalOceanAPI) -> None:
    droplet = account.add_droplet("nemotron-0", GPU).id
    reader = account.add_token("reader", ["droplet:read"])
    deleter = account.add_token("deleter", ["droplet:delete"])
    status, headers, body = call(api, "DELETE", f"/v2/droplets/{droplet}", reader)
    assert (status, body) == (403, FORBIDDEN)
    assert droplet in account.droplets
    assert call(api, "DELETE", f"/v2/droplets/{droplet}", "dop_v1_unknown")[::2] == (
        401,
        UNAUTHORIZED,
    )
    assert call(api, "DELETE", f"/v2/droplets/{droplet}")[::2] == (401, UNAUTHORIZED)
    status, headers, body = call(api, "DELETE", f"/v2/droplets/{droplet}", deleter)
    assert (status, body) == (204, None)
    assert headers["content-type"].startswith("application/json")
    assert droplet not in account.droplets
    assert call(api, "DELETE", f"/v2/droplets/{droplet}", deleter)[::2] == (404, NOT_FOUND)
    assert call(api, "GET", f"/v2/droplets/{droplet}", reader)[0] == 404
    assert call(api, "GET", f"/v2/droplets/{droplet}", deleter)[0] == 403, "delete is not read"
    assert call(api, "GET", "/v2/account", reader)[0] == 403, "account:read"
    # The log names tokens, never their secrets.
    assert [(r.method, r.token, r.status) for r in api.requests] == [
        ("DELETE", "reader", 403),
        ("DELETE", "?", 401),
        ("DELETE", None, 401),
        ("DELETE", "deleter", 204),
        ("DELETE", "deleter", 404),
        ("GET", "reader", 404),
        ("GET", "deleter", 403),
        ("GET", "reader", 403),
    ]
    assert not any(secret in repr(api.requests) for secret in (reader, deleter))


def test_delete_by_tag_needs_tag_read_and_leaves_gpu_droplets(
    account: Account, api: DigitalOceanAPI
) -> None:
    tagged = account.add_droplet("a", CPU, tags=["lease"]).id
    untagged = account.add_droplet("b", CPU).id
    gpu = account.add_droplet("c", GPU, tags=["lease"]).id
    volume = account.add_volume("cache", 100, droplet_id=tagged)
    only_delete = account.add_token("only-delete", ["droplet:delete"])
    both = account.add_token("both", ["droplet:delete", "tag:read"])
    assert call(api, "DELETE", "/v2/droplets?tag_name=lease", only_delete)[0] == 403
    assert set(account.droplets) == {tagged, untagged, gpu}
    assert call(api, "DELETE", "/v2/droplets?tag_name=nosuch", both)[0] == 404
    assert call(api, "DELETE", "/v2/droplets", both)[0] == 400, "tag_name is required"
    assert call(api, "DELETE", "/v2/droplets?tag_name=lease", both)[0] == 204
    assert set(account.droplets) == {untagged, gpu}, "undocumented for GPUs: assumed not"
    assert account.volumes[volume.id].droplet_ids == [], "the Volume stays, detached"
    api.tag_delete_reaches_gpus = True
    assert call(api, "DELETE", "/v2/droplets?tag_name=lease", both)[0] == 204
    assert set(account.droplets) == {untagged}


def test_tag_counts_only_what_the_token_may_see(account: Account, api: DigitalOceanAPI) -> None:
    account.add_droplet("a", CPU, tags=["lease"])
    tags_only = account.add_token("tags", ["tag:read"])
    with_droplets = account.add_token("tags-droplets", ["tag:read", "droplet:read"])
    _, _, body = call(api, "GET", "/v2/tags/lease", with_droplets)
    assert body["tag"]["resources"]["droplets"]["count"] == 1
    _, _, body = call(api, "GET", "/v2/tags/lease", tags_only)
    assert body["tag"]["resources"]["count"] == 0
    assert call(api, "GET", "/v2/tags/Lease", tags_only)[0] == 404, "tags are case stable"


def test_records_list_and_delete(account: Account, api: DigitalOceanAPI) -> None:
    keep = account.add_record("example.com", "TXT", "@", "v=spf1 -all")
    record = account.add_record("example.com", "A", "llm", "203.0.113.10")
    reader = account.add_token("dns-read", ["domain:read"])
    updater = account.add_token("dns-update", ["domain:update"])  # the OpenAPI's alternative
    _, _, body = call(api, "GET", "/v2/domains/example.com/records?name=llm.example.com", reader)
    assert [r["id"] for r in body["domain_records"]] == [record.id]
    assert body["meta"]["total"] == 1
    assert call(api, "GET", "/v2/domains/other.com/records", reader)[0] == 404
    path = f"/v2/domains/example.com/records/{record.id}"
    assert call(api, "DELETE", path, reader)[0] == 403
    status, headers, _ = call(api, "DELETE", path, updater)
    assert status == 204 and "content-type" not in headers
    assert list(account.domains["example.com"]) == [keep.id]
    assert call(api, "DELETE", path, updater)[0] == 404


def test_rate_limit_headers_and_the_budget_per_minute(
    account: Account, api: DigitalOceanAPI, clock: Clock
) -> None:
    token = account.add_token("busy", ["droplet:read"])
    api.per_minute = 3
    start = clock.t
    seen = []
    for _ in range(3):
        status, headers, _ = call(api, "GET", "/v2/droplets", token)
        seen.append((status, headers["ratelimit-remaining"]))
        clock.t += 10
    assert seen == [(200, "4999"), (200, "4998"), (200, "4997")]
    assert headers["ratelimit-limit"] == "5000"
    assert headers["ratelimit-reset"] == str(int(start + 3600)), "when the oldest expires"
    status, headers, body = call(api, "GET", "/v2/droplets", token)
    assert (status, body["id"]) == (429, "too_many_requests")
    assert headers["retry-after"] == "30", "the first of the minute expires in 30 s"
    assert headers["ratelimit-remaining"] == "0"
    clock.t += 31
    assert call(api, "GET", "/v2/droplets", token)[0] == 200, "the first left the minute"
    clock.t += 60
    # Headers on every answer, errors too; a 404 counts, an unknown token's 401 does not.
    assert "ratelimit-limit" in call(api, "GET", "/v2/nothing", token)[1]
    assert "ratelimit-remaining" in call(api, "GET", "/v2/droplets", "unknown")[1]
    # The hourly budget: each request counts for an hour from when it was made.
    api.per_minute, api.per_hour = 250, 6
    assert call(api, "GET", "/v2/droplets", token)[0] == 200
    status, headers, _ = call(api, "GET", "/v2/droplets", token)
    assert status == 429
    assert headers["retry-after"] == str(int(start + 3600 - clock.t)), "the oldest's hour"


def test_throttle_and_fail_knobs(account: Account, api: DigitalOceanAPI) -> None:
    token = account.add_token("t", ["droplet:read"])
    api.throttle(2, retry_after=7)
    api.fail(1, status=503)
    answers = [call(api, "GET", "/v2/droplets", token) for _ in range(4)]
    assert [(s, h.get("retry-after")) for s, h, _ in answers] == [
        (429, "7"),
        (429, "7"),
        (503, None),
        (200, None),
    ]
    assert answers[2][2]["id"] == "server_error"


def test_a_droplet_deleted_between_list_and_delete(account: Account, api: DigitalOceanAPI) -> None:
    racer = account.add_droplet("expired", GPU).id
    token = account.add_token("lease", ["droplet:read", "droplet:delete"])
    api.vanish_after_list(racer)
    _, _, body = call(api, "GET", "/v2/droplets?type=gpus", token)
    assert [d["id"] for d in body["droplets"]] == [racer], "listed while it existed"
    assert racer not in account.droplets
    assert call(api, "DELETE", f"/v2/droplets/{racer}", token)[0] == 404
    _, _, body = call(api, "GET", "/v2/droplets?type=gpus", token)
    assert body["droplets"] == []


def test_serves_a_socket_it_is_given(account: Account) -> None:
    """How a caller serves it from inside a network namespace: bind there, hand the socket."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    token = account.add_full_access_token("full")
    with DigitalOceanAPI(account, sock=sock) as api:
        assert api.url == f"http://127.0.0.1:{sock.getsockname()[1]}"
        status, _, body = call(api, "GET", "/v2/account", token)
    assert status == 200 and body["account"]["status"] == "active"


def test_the_vendored_scopes_table_is_the_openapi_s() -> None:
    """Re-extract the table from the OpenAPI snapshot when it is on this machine (not in CI)."""
    if not SNAPSHOT.exists():
        pytest.skip(f"no OpenAPI snapshot at {SNAPSHOT}")
    vendored = json.loads(SCOPES_FILE.read_text())
    fresh = extract_from_snapshot()
    assert fresh["operations"] == vendored["operations"], (
        f"the OpenAPI at {fresh['commit']} differs from the table read at {vendored['commit']}: "
        "PYTHONPATH=tests/support python -m stack.do_api"
    )
    assert vendored["operations"]["DELETE /v2/droplets"]["scopes"] == [
        ["droplet:delete", "tag:read"]
    ]
