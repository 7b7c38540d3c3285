"""The replica set (replicas >= 2): what each replica does differently from a lone Droplet, and
how a replica leaves and rejoins the balancer's pool during an update.

A replica's gateway listens on its private address only (gateway.ReplicaListener); the
balancer (the Caddy Droplet or DigitalOcean's Load Balancer, entry.py) is the public entry and
asks each replica's /health. An update that restarts vLLM or reboots drains first (lib.sh
drain, from the service and reboot phases): /health answers 503, the phase waits until the
balancer has seen it (its checks' interval times their failure threshold) and until vLLM has no
request in flight, then goes on; the ready phase, once vLLM answers again, ends the drain and
waits until the balancer has seen the replica healthy again. Only then may the next replica
start (endpoint.py chains them). Replica 0 runs the set's autodown.
"""

from __future__ import annotations

from . import balancer, catalog
from .schema import StackConfig

# How long a drain may wait for the requests in flight to finish before it restarts anyway:
# a long generation at the largest context runs minutes.
DRAIN_SECONDS = 600


def drain_file() -> str:
    return f"{catalog.DRAIN_DIR}/{catalog.DRAIN_FILE_NAME}"


def check_seconds(cfg: StackConfig) -> tuple[int, int, int]:
    """The balancer's health checks: interval, failures to go out, passes to come back."""
    if cfg.balancer_kind == "managed":
        return (
            catalog.LB_CHECK_INTERVAL_SECONDS,
            catalog.LB_UNHEALTHY_THRESHOLD,
            catalog.LB_HEALTHY_THRESHOLD,
        )
    return balancer.HEALTH_INTERVAL_SECONDS, balancer.HEALTH_FAILS, balancer.HEALTH_PASSES


def notice_seconds(cfg: StackConfig) -> int:
    """From the first 503 until the balancer sends no new request: its failures in a row,
    plus one interval for where in its cycle the drain began."""
    interval, fails, _ = check_seconds(cfg)
    return interval * (fails + 1)


def rejoin_seconds(cfg: StackConfig) -> int:
    """From the drain's end until the balancer sends requests again."""
    interval, _, passes = check_seconds(cfg)
    return interval * (passes + 1)


def upstream(private_ip: str) -> balancer.Upstream:
    return balancer.Upstream(private_ip, catalog.REPLICA_PORT)


def upstream_file(index: int, droplet_id: str) -> str:
    """A replica's file in the balancer's upstreams folder, named by its Droplet too: a new
    Droplet's file is never an old one's, even should it get the freed private address back,
    so a leave removes only what its own join wrote."""
    return f"{catalog.BALANCER_UPSTREAMS_DIR}/replica-{index}-{droplet_id}.caddy"


def metrics_url(private_ip: str) -> str:
    return f"http://{private_ip}:{catalog.REPLICA_PORT}/metrics"
