"""The routing measurement (tests/support/router_bench.py), small: what it must get right whatever
the machine's speed. Its numbers are in its own output (rerun by hand at full size)."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from pathlib import Path
from typing import Any

import fake_openai
import pytest
import requests
import router_bench

# Seconds, not minutes: sessions of 4 turns of 64 words with 8-token answers, 10 of them
# arriving over 2 s; replicas that answer fast (their cache as at full size).
SMALL_LOAD = router_bench.Load(rate=20, seconds=2)
SMALL_REPLICA = router_bench.Replica(prefill_per_token=20e-6, ttft=0.005, itl=0.002)
MULTI_TURN = router_bench.Workload("multi-turn", ("--input-tokens", "64", "--max-tokens", "8"), 4)


needs_router = pytest.mark.skipif(
    not router_bench.ROUTER.exists(),
    reason=f"no {router_bench.ROUTER}: ./check installs it from locks/router-*.txt",
)


def run(mode: str, tmp_path: Path) -> dict[str, Any]:
    return router_bench.run_one(mode, MULTI_TURN, SMALL_LOAD, SMALL_REPLICA, tmp_path / mode)


def assert_counted_right(run: dict[str, Any]) -> None:
    """Every request answered, and the cached % the harness reports is bench's, which is the
    sum over the requests of the replicas' usage (cached_tokens over prompt_tokens), which is
    what the replicas themselves counted."""
    assert run["failed"] == 0 and run["requests"] == 40, run
    assert run["cached_pct"] == pytest.approx(run["cached_pct_from_requests"], abs=1e-3), run
    assert run["cached_pct"] == pytest.approx(run["cached_pct_from_replicas"], abs=1e-3), run


@needs_router
def test_through_the_router_each_conversation_stays_on_one_replica_and_more_is_cached(
    tmp_path: Path,
) -> None:
    """Through the front and vllm-router (cache_aware, the replicas serving render as `vllm
    serve --enable-scale-out` does): every turn of a session goes where its first went, each
    later turn finds its history in that replica's cache, and the router says it routed each
    later turn by its prefix; the client's key reached the replicas through it (render and
    chat alike). Through the front alone (least_conn), turns land anywhere: less is cached."""
    routed, spread = run("cache-aware", tmp_path), run("least-conn", tmp_path)
    assert_counted_right(routed)
    assert_counted_right(spread)
    assert routed["sessions_split"] == 0, routed
    assert routed["later_turns"] == 30 and routed["later_turns_uncached"] == 0, routed
    decisions = routed["router"]["vllm_router_prefix_routing_decisions_total"]
    assert decisions == {"prefix_hit": 30, "prefix_miss": 10}, routed
    assert routed["renders"] == 3 * 40, "each request rendered on every replica"
    assert routed["render_auth"] == [f"Bearer {router_bench.KEY}"], routed
    assert routed["cached_pct"] > spread["cached_pct"], (routed, spread)


def burst(url: str, prefix: str, count: int) -> None:
    """`count` chats starting with `prefix`, each its own after it, sent at once to `url` (the
    router) and all answered."""

    def one(i: int) -> None:
        body = {"model": router_bench.MODEL, "max_tokens": 40,
                "messages": [{"role": "user", "content": f"{prefix} {i} " + "own " * 20}]}  # fmt: skip
        answer = requests.post(f"{url}/v1/chat/completions", json=body, timeout=60,
                               headers={"Authorization": f"Bearer {router_bench.KEY}"})  # fmt: skip
        answer.raise_for_status()

    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        list(pool.map(one, range(count)))


@needs_router
def test_a_burst_on_one_shared_prefix_spreads_over_the_replicas_with_the_fronts_settings(
    tmp_path: Path,
) -> None:
    """A shared prompt the router has seen on one replica, then 15 requests with it at once, each
    in flight for about 2 s (40 tokens 50 ms apart): with the router's own balance thresholds
    (64 in flight more than the least loaded, and 1.5 times) all 15 go where the prompt went;
    with the front's (router_bench.Router) every replica gets some, none more than
    balance_abs_threshold + 1 ahead of another, as is_imbalanced bounds it while none finishes."""
    replica = router_bench.Replica(prefill_per_token=1e-6, ttft=0.005, itl=0.05)
    chosen = router_bench.Router()
    shipped = router_bench.Router(balance_abs_threshold=64, balance_rel_threshold=1.5)
    with router_bench.processes(tmp_path) as p:
        ports = p.replicas(replica, scale_out=True)
        spread = {}
        for name, settings in (("shipped", shipped), ("chosen", chosen)):
            before = [s["chat_requests"] for s in router_bench.replica_stats(ports)]
            url, _ = p.router(ports, settings)
            prefix = " ".join(f"{name}{i}" for i in range(200))
            burst(url, prefix, 1)  # the router's tree now holds the prompt on one replica
            burst(url, prefix, 15)
            after = [s["chat_requests"] for s in router_bench.replica_stats(ports)]
            spread[name] = sorted(a - b for a, b in zip(after, before, strict=True))
    assert spread["shipped"] == [0, 0, 16], spread
    assert spread["chosen"][0] >= 1, spread
    assert spread["chosen"][2] - spread["chosen"][0] <= chosen.balance_abs_threshold + 2, spread


@needs_router
def test_without_render_the_router_has_no_tokens_and_routes_by_load_alone(
    tmp_path: Path,
) -> None:
    """Replicas that answer render 403, as vLLM 0.33 does without --enable-scale-out (ours
    today): the router asks each of them for every request, is refused, and picks the least
    loaded replica every time, the prefix never counted."""
    blind = run("cache-aware-no-render", tmp_path)
    assert_counted_right(blind)
    counters = blind["router"]
    assert counters["vllm_router_prefix_routing_decisions_total"] == {"missing_tokens": 40}
    assert counters["vllm_router_kv_routing_inputs_total"] == {"preparation_rejected": 3 * 40}


def test_the_replicas_prefill_queues_behind_one_slot() -> None:
    """The replica model's --prefill-slots 1: two cold prompts sent at once prefill one after
    the other, so the later first token comes after both prefills (a lower bound: a sleep never
    ends early), where without it both would come after one."""
    words = " ".join(f"w{i}" for i in range(400))  # 400 uncached tokens at 1 ms: 0.4 s each
    body = {"model": "nemotron", "max_tokens": 1,
            "messages": [{"role": "user", "content": words}]}  # fmt: skip
    args = ("--ttft", "0", "--itl", "0", "--prefix-cache-blocks", "100", "--prefill-per-token",
            "0.001", "--prefill-slots", "1")  # fmt: skip
    with fake_openai.running(*args, key="k") as fake:
        # Both sent from one moment (a thread that starts late, on a busy machine, would
        # otherwise time a request that never waited for the other's prefill).
        ready = threading.Barrier(2)
        started: list[float] = []

        def one(i: int) -> float:
            if ready.wait() == 0:
                started.append(time.perf_counter())
            answer = requests.post(f"{fake.url}/v1/chat/completions", timeout=30,
                                   json={**body, "messages": [{"role": "user",
                                                               "content": f"{i} {words}"}]},
                                   headers={"Authorization": "Bearer k"})  # fmt: skip
            answer.raise_for_status()
            return time.perf_counter()

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            ends = list(pool.map(one, range(2)))
    times = sorted(end - started[0] for end in ends)
    assert times[0] >= 0.4 and times[1] >= 0.8, times
