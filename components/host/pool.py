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

from ..spec import catalog
from ..spec.schema import StackConfig
from . import balancer

# How long a drain may wait for the requests in flight to finish before it restarts anyway:
# a long generation at the largest context runs minutes.
DRAIN_SECONDS = catalog.LONG_GENERATION_SECONDS
# One look at vLLM's /metrics (curl --max-time) and the pause between looks (lib.sh drain): the
# last look may start just before DRAIN_SECONDS is up and end this much later.
DRAIN_POLL_SECONDS = 2
METRICS_READ_SECONDS = 5
# A drain ends early when the gauges say requests are in flight but no token moved for the
# stall window: the gauges can stay up after requests are aborted (vllm-project/vllm#22545),
# while vllm:generation_tokens_total and vllm:prompt_tokens_total show real work (docs/facts.md).
# vLLM 0.33 counts a request's prompt tokens once, when its prefill ends and the first token
# comes out, not per chunked-prefill step (v1/core/sched/scheduler.py: prefill_stats go out
# with a request's first output, take_prefill_stats; v1/metrics/stats.py update_from_output):
# a long prefill alone moves nothing until it ends. So the window covers the longest prompt
# at a slow prefill rate (a floor below what a data-center GPU does; an assumption, not a
# measurement), and at least a minute.
STALL_MIN_SECONDS = 60
PREFILL_FLOOR_TOKENS_PER_SECOND = 2000


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


def stall_seconds(cfg: StackConfig) -> int:
    """How long a drain waits with requests in flight but no token generated or prefilled:
    the longest prompt's prefill at the floor rate, at least a minute, at most the drain."""
    prefill = -(-cfg.vllm.max_model_len // PREFILL_FLOOR_TOKENS_PER_SECOND)
    return min(max(STALL_MIN_SECONDS, prefill), DRAIN_SECONDS)


def drain_bound_seconds(cfg: StackConfig) -> int:
    """The longest a drain takes (lib.sh drain): the notice, DRAIN_SECONDS, and the last look
    at the metrics that began just before it was up. The phases that drain add it to their
    bound (phases.minutes)."""
    return notice_seconds(cfg) + DRAIN_SECONDS + METRICS_READ_SECONDS + DRAIN_POLL_SECONDS


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


def joined_file(index: int, droplet_id: str) -> str:
    """The replica's join mark (catalog.BALANCER_JOINED_SUFFIX): Caddy routes to it."""
    return upstream_file(index, droplet_id) + catalog.BALANCER_JOINED_SUFFIX


def metrics_url(private_ip: str) -> str:
    return f"http://{private_ip}:{catalog.REPLICA_PORT}/metrics"
