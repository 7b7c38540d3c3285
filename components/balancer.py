"""The balancer in front of several replicas: Caddy's reverse_proxy load balancing, the same
release and the same public gate as the single-Droplet gateway (gateway.py), routing to the
replicas' gateways on the private network.

Routing suits LLM serving: `least_conn` sends each request to the replica with the fewest
requests in flight (a long generation keeps its replica busy; round robin would stack new
requests behind it). Caddy asks every replica's `/health` on its own (active health checks) and
stops sending new requests to one that fails them; streams already running on the others are
untouched. A request whose replica refuses the connection (stopped, restarting) is tried on
another within `lb_try_duration`: the request never reached the first, so it is safe to resend.
Caddy's selection policies and health checks: modules/caddyhttp/reverseproxy
(selectionpolicies.go LeastConnSelection: fewest NumRequests; healthchecks.go).
"""

from __future__ import annotations

from dataclasses import dataclass

# How fast a stopped replica leaves the pool: a failed check every 2 s, out after 2 failures,
# back after 2 passes (Caddy active health checks: health_interval, health_fails, health_passes).
HEALTH_INTERVAL_SECONDS = 2
HEALTH_FAILS = 2
HEALTH_PASSES = 2
# A request that could not be sent (connection refused) is tried on another replica for this
# long, every 250 ms: longer than a health check takes to notice, so none fails in between.
TRY_SECONDS = 2 * HEALTH_INTERVAL_SECONDS * HEALTH_FAILS


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
    return f"""reverse_proxy {{
	# One file per replica (to <address>:<port>), written as it joins.
	import {import_glob}
	# The replica with the fewest requests in flight takes the next one.
	lb_policy least_conn
	# A request that could not reach a replica (stopped, restarting) goes to another one.
	lb_try_duration {TRY_SECONDS}s
	lb_try_interval 250ms
	# Each replica's own /health, every {HEALTH_INTERVAL_SECONDS}s: out after {HEALTH_FAILS}
	# failures, back after {HEALTH_PASSES} passes.
	health_uri /health
	health_interval {HEALTH_INTERVAL_SECONDS}s
	health_timeout {HEALTH_INTERVAL_SECONDS}s
	health_status 200
	health_fails {HEALTH_FAILS}
	health_passes {HEALTH_PASSES}
	# Server-sent events go out as they come; no response timeout cuts a long answer.
	flush_interval -1
	transport http {{
		dial_timeout {dial_timeout_seconds}s
	}}
}}"""
