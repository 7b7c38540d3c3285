"""The balancer in front of several replicas: Caddy's reverse_proxy load balancing, the same
release and the same public gate as the single-Droplet gateway (gateway.py), routing to the
replicas' gateways on the private network.

Routing suits LLM serving: `least_conn` sends each request to the replica with the fewest
requests in flight (a long generation keeps its replica busy; round robin would stack new
requests behind it). Caddy asks every replica's `/health` on its own (active health checks) and
stops sending new requests to one that fails them; streams already running on the others are
untouched. A request whose replica refuses the connection (stopped, restarting), or fails
before any answer comes back, is tried on another within `lb_try_duration` (reverse_proxy
below says when a body may be resent).
Caddy's selection policies and health checks: modules/caddyhttp/reverseproxy
(selectionpolicies.go LeastConnSelection: fewest NumRequests; healthchecks.go).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..spec import catalog
from . import router

# How fast a stopped replica leaves the pool: a failed check every 2 s, out after 2 failures,
# back after 2 passes (Caddy active health checks: health_interval, health_fails, health_passes).
# A check may take catalog.REPLICA_LOOK_TIMEOUT_SECONDS (health_timeout): a busy replica answers
# late, a stopped one fails at once. Caddy 2.11 starts each check on its own (healthchecks.go
# doActiveHealthCheckForAllHosts: a goroutine per upstream per tick), so a slow replica has a
# few in flight, and it counts failures until the replica's state changes or the config
# reloads, not only in a row (hosts.go countHealthFail; a pass does not reset them): a short
# timeout would take out, sooner or later, every replica that is ever busy.
HEALTH_INTERVAL_SECONDS = 2
HEALTH_FAILS = 2
HEALTH_PASSES = 2
LOOK = catalog.REPLICA_LOOK_TIMEOUT_SECONDS
# A request that could not be sent (connection refused) is tried on another replica for this
# long, every 250 ms: longer than a health check takes to notice, so none fails in between.
TRY_SECONDS = 2 * HEALTH_INTERVAL_SECONDS * HEALTH_FAILS
# A draining replica's gateway answers a new API request 503 with this header (gateway.py), and
# the balancer sends it to another replica. Health checks alone do not hold a drain: Caddy
# (2.11.7) starts every upstream healthy on each config load, a member joining or leaving or a
# new Caddyfile, until its checks fail again (caddyserver/caddy PR #7625). The retry is on the
# response (lb_retry_match, Caddy >= 2.11.3: reverseproxy.go retryableResponseError); the
# draining gateway read none of it, so resending is safe.
DRAINING_HEADER = "Nemotron-Draining"
# The 503 also counts as a passive failure, so the retry (and the next requests) pick another
# replica instead of this one again (least_conn would: it has the fewest in flight). A failure
# is forgotten after this long, or at the next reload (healthchecks.go countFailure: the old
# config's context ends it): the next new request then bounces once more. A slow answer is no
# failure (no unhealthy_latency, no response_header_timeout): a busy replica is not skipped.
FAIL_SECONDS = HEALTH_INTERVAL_SECONDS * (HEALTH_FAILS + 1)
# A body is resent only from the balancer's buffer (request_buffers; reverseproxy.go replays a
# wholly buffered body on each try). 1 MB holds a prompt of some 250k tokens of text; a larger
# body is not buffered whole, so its 503 goes to the client (whose SDK retries a 503) instead
# of a cut body to another replica. Held per request in flight on a 1 GB Droplet: a cap, not
# the 16 MB body limit.
RETRY_BUFFER_BYTES = 1_000_000


@dataclass(frozen=True)
class Upstream:
    """One replica's gateway as the balancer reaches it: its private address and port."""

    host: str
    port: int

    @property
    def dial(self) -> str:
        return f"{self.host}:{self.port}"


def upstream_line(upstream: Upstream) -> str:
    """One replica's file in the upstreams folder: a `to` line the balancer's Caddyfile
    imports inside its reverse_proxy block."""
    return f"to {upstream.dial}"


def reverse_proxy(import_glob: str, dial_timeout_seconds: int = 2) -> str:
    """The reverse_proxy block for the replicas (inside a `handle` of the public site): those
    of the files matching `import_glob`, one per replica, which come and go with a graceful
    reload (no file yet: 503 until the first replica joins)."""
    # Resent to another replica when the whole body can be (a GET has none): a draining
    # replica's bounce, and a request whose replica failed before any answer came back (killed
    # or restarted while it held a pooled connection: the round trip fails before the response
    # headers; after them nothing is resent). The routes the gate admits change nothing on a
    # replica (a completion, the model list), so a second try costs compute, never a double
    # effect. A retry match replaces Caddy's own retry of a GET whose upstream failed after
    # connecting (reverseproxy.go tryAgain: RetryMatch set, it alone decides;
    # {rp.is_transport_error} is set there only), so that one stays.
    bounced = f"{{rp.status_code}} == 503 && {{rp.header.{DRAINING_HEADER}}} == '1'"
    retry_when = f"({bounced} || {{rp.is_transport_error}} == true) && {_resendable()}"
    return f"""reverse_proxy {{
	# One file per replica (to <address>:<port>), written as it joins.
	import {import_glob}
	# The replica with the fewest requests in flight takes the next one.
	lb_policy least_conn
	# A request that could not reach a replica (stopped, restarting) goes to another one.
	lb_try_duration {TRY_SECONDS}s
	lb_try_interval 250ms
	# So does one a draining replica turned away (its 503 and {DRAINING_HEADER}), when the
	# whole body is in the buffer to resend.
	lb_retry_match {{
		expression `{retry_when}`
	}}
	request_buffers {RETRY_BUFFER_BYTES}
	# Passive health: a replica that answered 503 (or could not be reached) is skipped for
	# {FAIL_SECONDS}s.
	unhealthy_status 503
	max_fails 1
	fail_duration {FAIL_SECONDS}s
	# Each replica's own /health, every {HEALTH_INTERVAL_SECONDS}s: out after {HEALTH_FAILS}
	# failures, back after {HEALTH_PASSES} passes. A busy replica answers late: only a look
	# past {LOOK}s fails (a stopped one fails at once).
	health_uri /health
	health_interval {HEALTH_INTERVAL_SECONDS}s
	health_timeout {LOOK}s
	health_status 200
	health_fails {HEALTH_FAILS}
	health_passes {HEALTH_PASSES}
	# Server-sent events go out as they come; no response timeout cuts a long answer.
	flush_interval -1
	transport http {{
		dial_timeout {dial_timeout_seconds}s
	}}
}}"""


def _resendable() -> str:
    """A request whose body Caddy can resend whole: a GET (none), or one wholly in its buffer
    (request_buffers set its length: reverseproxy.go prepareRequest)."""
    length = "{http.request.header.Content-Length}"
    buffered = f"{length}.matches('^[0-9]+$') && int({length}) <= {RETRY_BUFFER_BYTES}"
    return f"({{http.request.method}} == 'GET' || {buffered})"


def routed(
    import_glob: str, address: str = router.ADDRESS, serving_file: str = router.SERVING_FILE
) -> str:
    """The API routes with balancer.routing cache-aware: to the front's router (router_proxy)
    while it serves (`serving_file` exists: router.SERVING_FILE), but the routes it would
    forward without the client's key (router.UNKEYED_ROUTES); those, and all of them while the
    router starts or stops, straight to the replicas, least_conn (reverse_proxy), as with
    routing least-conn. Caddy's `file` matcher stats the file for each request
    (fileserver/matcher.go), so a stop of the router takes effect with no reload."""
    assert all("{" not in path for _, path in router.UNKEYED_ROUTES), "exact paths only"
    unkeyed = " || ".join(
        f"({{http.request.method}} == '{method}' && "
        f"{{http.request.uri}}.matches('^/v1/{path}([?][^#]*)?$'))"
        for method, path in router.UNKEYED_ROUTES
    )
    tab = "\n\t"
    folder, name = serving_file.rsplit("/", 1)
    return f"""# The router picks the replica while it serves, for every route it passes the key on.
@routed {{
	file {{
		root {folder}
		try_files /{name}
	}}
	not expression `{unkeyed}`
}}
handle @routed {{
	{router_proxy(address).replace(chr(10), tab)}
}}
# The others, and all while the router starts or stops: to the replicas, as least-conn.
handle {{
	{reverse_proxy(import_glob).replace(chr(10), tab)}
}}"""


def router_proxy(address: str = router.ADDRESS, dial_timeout_seconds: int = 2) -> str:
    """The reverse_proxy block for the front's router (balancer.routing: cache-aware, router.py):
    one upstream, the router on loopback, which picks the replica.

    Why Caddy resends here: the router retries a failed request only on the replica it chose
    (cache_aware ignores the retry's exclusions: router.rs select_worker_for_model), so a
    replica that died, or drains, answers until the router's own health checks (every
    router.HEALTH_SECONDS, out after router.HEALTH_FAILS) or its circuit breaker take it out:
    then the router answers 500 (its own "Request failed", text/plain, after a send error),
    or relays the replica's 502/503/504 (a draining gateway's 503). Caddy sends such a request
    to the router again within TRY_SECONDS (longer than the router's checks take), which by
    then routes it to a replica that answers: no request fails because a replica died before
    sending a byte. After the first byte of an answer nothing is resent (a stream cut
    mid-way is cut for the client). As with reverse_proxy(), only a body Caddy holds whole
    (or a GET) is resent, never a cut one.

    What a resend costs: compute (the router renders the prompt on every replica again, and
    a replica may have prefilled it), never a second effect: the gate admits only routes that
    change nothing on a replica (a completion, the model list, a stored response). A replica's
    own 500 (vLLM's JSON, or a stream's text/event-stream label) is not resent: a request
    that fails by itself would fail again.

    No health checks and no passive failures on this one upstream: the router's /health is 503
    while ANY replica is unhealthy (a rolling update), and marking the router down would fail
    every request; the public /health goes to the replicas (gateway.balancer_site)."""
    own_500 = "{rp.status_code} == 500 && {rp.header.Content-Type}.startsWith('text/plain')"
    relayed = "{rp.status_code} in [502, 503, 504]"
    failed = f"{relayed} || ({own_500}) || {{rp.is_transport_error}} == true"
    retry_when = f"({failed}) && {_resendable()}"
    return f"""reverse_proxy {address} {{
	# The router on the front's loopback picks the replica (router.py); it alone is upstream.
	# A request that failed there before any answer (a replica killed or draining, which the
	# router retries only on itself until its checks take it out; the router restarting) is
	# sent again, when the whole body is in the buffer to resend: it costs compute, no effect.
	lb_try_duration {TRY_SECONDS}s
	lb_try_interval 250ms
	lb_retry_match {{
		expression `{retry_when}`
	}}
	request_buffers {RETRY_BUFFER_BYTES}
	# The router allows every origin (access-control-allow-origin: *); the endpoint is for
	# programs with a key, not for browsers.
	header_down -Access-Control-Allow-Origin
	# Server-sent events go out as they come; no response timeout cuts a long answer.
	flush_interval -1
	transport http {{
		dial_timeout {dial_timeout_seconds}s
	}}
}}"""
