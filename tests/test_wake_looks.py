"""scripts/phases/wake/looks.py, the replicas as the front sees them, on its own: the upstream
files Caddy reads and their join marks, what a look at each /health finds (ready, there, busy,
gone) on loopback, what a busy replica counts as (`heard`), and the looks in a row that found
none. tests/test_wake.py runs them through the whole daemon."""

from __future__ import annotations

import os
import socket
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import front_bench
import loopback
import script_module
from aiohttp import ClientSession

from components.spec import catalog

WAKER = Path(__file__).resolve().parent.parent / "scripts" / "phases" / "wake"
looks: Any = script_module.load_package(WAKER, "wake_looks_test", "looks").looks
READY, THERE, BUSY, GONE = looks.READY, looks.THERE, looks.BUSY, looks.GONE


def test_the_join_mark_is_the_programs_suffix() -> None:
    assert looks.JOINED_SUFFIX == catalog.BALANCER_JOINED_SUFFIX


def joined(path: Path, at: int) -> None:
    """`path`'s join mark, dated `at` (seconds; the file itself at 1000)."""
    mark = path.parent / (path.name + looks.JOINED_SUFFIX)
    mark.write_text(path.read_text())
    os.utime(path, ns=(1000 * 10**9, 1000 * 10**9))
    os.utime(mark, ns=(at * 10**9, at * 10**9))


def test_the_upstream_files_give_each_replica_once_and_the_routed_ones(tmp_path: Path) -> None:
    """One replica per `to host:port` line (IPv6 in brackets), an address in two files looked
    at once; routed: those whose file's join mark is as new as the file (not older: a join
    that rewrote the file starts over); a mark without its file, or another name, is nothing."""
    (tmp_path / "a.caddy").write_text("to 10.110.0.2:8080\n")
    (tmp_path / "b.caddy").write_text("to [fd00::5]:8080\n")
    (tmp_path / "c.caddy").write_text("  to 10.110.0.2:8080  \n")  # left behind: the same one
    (tmp_path / "d.caddy").write_text("reverse_proxy 10.110.0.9:8080\n")  # not an upstream line
    (tmp_path / "notes.txt").write_text("to 10.110.0.7:8080\n")
    (tmp_path / f"gone.caddy{looks.JOINED_SUFFIX}").write_text("to 10.110.0.8:8080\n")
    joined(tmp_path / "a.caddy", at=1000)
    joined(tmp_path / "b.caddy", at=999)
    found, routed = looks.upstreams(tmp_path)
    assert found == [("10.110.0.2", 8080), ("fd00::5", 8080)]
    assert routed == {("10.110.0.2", 8080)}
    assert looks.joined_since(tmp_path, 999.0) and not looks.joined_since(tmp_path, 2e9)
    assert looks.upstreams(tmp_path / "none") == ([], set())


class Health(BaseHTTPRequestHandler):
    """/health answering `status` (class attribute) at once."""

    status = 200

    def do_GET(self) -> None:
        loopback.reply(self, self.status, b"{}")

    def log_message(self, *_: Any) -> None:
        pass


def test_a_look_finds_ready_there_busy_or_gone(tmp_path: Path) -> None:
    """200: ready; any other answer: there (it exists: a draining replica answers 503); a
    listener that never answers: busy, its look kept for the next; nothing listening: gone."""
    ok = loopback.serve(type("Ok", (Health,), {"status": 200}))
    draining = loopback.serve(type("Draining", (Health,), {"status": 503}))
    silent = socket.create_server(("127.0.0.1", 0))  # accepts (the kernel does), never answers
    closed = socket.create_server(("127.0.0.1", 0))
    gone_port = closed.getsockname()[1]
    closed.close()
    ups = [("127.0.0.1", ok.server_address[1]), ("127.0.0.1", draining.server_address[1]),
           ("127.0.0.1", silent.getsockname()[1]), ("127.0.0.1", gone_port)]  # fmt: skip

    async def scene() -> tuple[list[str], list[str], bool]:
        replicas = looks.Replicas()
        async with ClientSession() as session:
            found = [await replicas.look_one(session, u, busy=30.0) for u in ups]
            waiting = ups[2] in replicas.late_looks
            counted = replicas.heard(ups, found)
            for late in replicas.late_looks.values():
                late.cancel()
        return found, counted, waiting

    try:
        found, counted, waiting = front_bench.run(scene())
    finally:
        loopback.stop(ok)
        loopback.stop(draining)
        silent.close()
    assert found == [READY, THERE, BUSY, GONE]
    assert waiting, "the busy replica's look goes on, for the next look to wait on"
    assert counted == [READY, THERE, THERE, GONE], "busy and never heard: there, not gone"


def test_a_busy_replica_counts_as_its_last_answer_and_gone_forgets_it() -> None:
    a, b = ("10.0.0.1", 8080), ("10.0.0.2", 8080)
    replicas = looks.Replicas()
    assert replicas.heard([a, b], [READY, THERE]) == [READY, THERE]
    assert replicas.heard([a, b], [BUSY, BUSY]) == [READY, THERE], "as each last answered"
    assert replicas.busy == [a, b]
    assert replicas.heard([a, b], [GONE, READY]) == [GONE, READY]
    assert replicas.heard([a, b], [BUSY, BUSY]) == [THERE, READY], "gone forgot a's ready"
    assert replicas.heard([b], [BUSY]) == [READY] and set(replicas.answered) == {b}


def test_the_looks_in_a_row_that_found_none_start_over_when_a_replica_joins() -> None:
    a, b = ("10.0.0.1", 8080), ("10.0.0.2", 8080)
    replicas = looks.Replicas()
    replicas.count([a], [GONE], now=10.0)
    replicas.count([a], [GONE], now=12.0)
    assert (replicas.gone_looks, replicas.gone_since) == (2, 10.0)
    replicas.count([a, b], [GONE, GONE], now=14.0)
    assert (replicas.gone_looks, replicas.gone_since) == (1, 14.0), "b joined: its count starts"
    replicas.count([a, b], [GONE, THERE], now=16.0)
    assert (replicas.gone_looks, replicas.gone_since) == (0, None)
    replicas.count([], [], now=18.0)
    assert replicas.gone_looks == 1, "no replica at all counts as none answering"
