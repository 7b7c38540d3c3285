"""The front's cache-aware router as components/host/router.py renders it (its unit, its start
script, its flags), run for real: the locked vllm-router (.router-venv) behind the real Caddy in
front of fake replicas on loopback. The unit's stop lets a long generation finish and sends new
requests past the router; a stop as systemd does it finishes the streams while every route of
the gate answers; with cache-aware, a conversation stays on one replica. The routed set and its
helpers are test_balancer.py's (the front's request path); attacks on the router:
test_router_attacks.py."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

from test_balancer import (
    chat_client,
    every_route,
    needs_router,
    routed_cfg,
    routed_set,
    unit_commands,
)

from components.host import phases, pool, router


def test_the_router_unit_stops_after_a_long_generation_and_sends_new_requests_past_it() -> None:
    """The router's unit as systemd reads it. A stop (a restart for new flags or a new lock
    from `pulumi up`, routing turned off, a reboot) lets the router finish what it holds as
    long as a replica's drain lets a long generation finish (it was 30 s: a reasoning stream
    of minutes was cut at a restart), and first removes the file by which Caddy sends it new
    requests, which its start makes once it answers. The router phase's bound holds the stop."""
    unit = router.unit_text()
    conf = dict(line.split("=", 1) for line in unit.splitlines() if "=" in line)
    assert int(conf["TimeoutStopSec"].removesuffix("s")) >= pool.DRAIN_SECONDS
    script, serving = Path(router.START_SCRIPT), Path(router.SERVING_FILE)
    assert unit_commands("ExecStop", script, serving)[0] == ["/bin/rm", "-f", router.SERVING_FILE]
    assert unit_commands("ExecStartPost", script, serving) == [[router.START_SCRIPT, "--serving"]]
    assert "/run/" + conf["RuntimeDirectory"] == str(serving.parent)
    bound = phases.minutes(routed_cfg("cache-aware"), phases.row("router", phases.BALANCER))
    assert bound * 60 >= router.STOP_SECONDS + 10 * 60, "the phase's own work and the stop"


@needs_router
def test_a_router_stop_finishes_its_streams_while_new_requests_go_past_it(tmp_path: Path) -> None:
    """The router's unit stopped as systemd stops it (its ExecStop commands, then SIGTERM)
    while it relays a long stream: the stream ends whole, the router exits 0 only after it,
    and while it drains every route of the gate through the front answers (before, Caddy sent
    them to the router's closed port: 502 after its 8 s of retries)."""
    tokens = 400  # a 8 s stream at 20 ms a token
    timing = ("--ttft", "0.05", "--itl", "0.02", "--tokens", str(tokens))
    stream: dict[str, Any] = {}
    answers: dict[str, tuple[int, int]] = {}
    with routed_set(tmp_path, "cache-aware", replicas=2, timing=timing) as s:
        assert s.router is not None

        def long_stream() -> None:
            body = {"model": "nemotron", "messages": [{"role": "user", "content": "think long"}],
                    "max_tokens": tokens, "stream": True}  # fmt: skip
            r = s.gw.post("/v1/chat/completions", json=body, timeout=60)
            stream.update(status=r.status_code, ended=time.monotonic(),
                          chunks=r.text.count('"content": " tok"'), done="[DONE]" in r.text)  # fmt: skip

        held = threading.Thread(target=long_stream)
        held.start()
        deadline = time.monotonic() + 10
        while not any(s.router.running(m.url) for m in s.members):
            assert time.monotonic() < deadline, "the stream never reached the router"
            time.sleep(0.1)
        s.router_unit("ExecStop")
        s.router.proc.send_signal(signal.SIGTERM)
        answers.update(every_route(s))
        draining = s.router.proc.poll() is None
        code = s.router.proc.wait(timeout=60)
        exited = time.monotonic()
        held.join(timeout=60)
    print(f"router stop: the stream {stream}, the router exited {code} "
          f"{exited - stream.get('ended', exited):.2f} s after it; meanwhile {answers}")  # fmt: skip
    assert draining, "the router was still finishing the stream while the routes were asked"
    wrong = {route: got for route, got in answers.items() if got[0] != got[1]}
    assert not wrong, f"(front, vLLM itself) while the router drained: {wrong}"
    assert stream["status"] == 200 and stream["done"] and stream["chunks"] == tokens, stream
    assert code == 0 and exited >= stream["ended"] - 0.5


@needs_router
def test_with_cache_aware_a_conversation_stays_on_one_replica(tmp_path: Path) -> None:
    """Multi-turn conversations, each turn its history plus a new message, several at once
    through the official client: every turn of a conversation reaches the replica that served
    its first (the fakes' own record of the messages they got)."""
    with routed_set(tmp_path, "cache-aware") as s:
        client = chat_client(s)
        words = " ".join(f"w{i}" for i in range(200))

        def talk(c: int) -> None:
            messages: list[dict[str, str]] = [
                {"role": "system", "content": f"conversation {c}: {words}"}
            ]
            for turn in range(5):
                messages.append({"role": "user", "content": f"turn {turn} " + words[: 40 * turn]})
                answer = client.chat.completions.create(model="nemotron", messages=messages,
                                                        max_tokens=8)  # type: ignore[arg-type]  # fmt: skip
                messages.append(
                    {"role": "assistant", "content": answer.choices[0].message.content or ""}
                )

        threads = [threading.Thread(target=talk, args=(c,)) for c in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        where: dict[str, set[str]] = {}
        for m in s.members:
            for messages in m.stats()["conversations"]:
                where.setdefault(messages[0]["content"].split(":")[0], set()).add(m.name)
    assert len(where) == 6, where
    split = {c: names for c, names in where.items() if len(names) > 1}
    assert not split, f"conversations split across replicas: {split}"
    assert len(set().union(*where.values())) >= 2, f"all on one replica: {where}"
