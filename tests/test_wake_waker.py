"""scripts/phases/wake/waker.py, the wake state machine, on its own: its looks at the upstream
files against the replicas' answers (a look begun before a join, a replica that just joined, a
join mark as new as its file), the hold file kept to the mode, a failure only of a wake under
way, and the ready replicas taken in turn. tests/test_wake.py runs it through the whole daemon."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import front_bench
import pytest
import script_module
from test_wake import mark_joined, rendered_env

from components.spec import catalog

WAKER = Path(__file__).resolve().parent.parent / "scripts" / "phases" / "wake"


def test_the_hold_file_follows_the_mode_and_only_a_wake_under_way_fails(tmp_path: Path) -> None:
    """Caddy sends keyed requests to the waker while its hold file exists: whenever the set is
    not awake. fail() ends a wake (or one resumed) and is said in the state file; it changes
    nothing in a mode that has no wake to fail."""
    module: Any = script_module.load_package(WAKER, "wake_waker_mode", "waker").waker
    hold = tmp_path / "run" / "hold"
    settings = module.Settings.from_env({**rendered_env(), "WAKE_HOLD_FILE": str(hold),
                                         "WAKE_STATE_FILE": str(tmp_path / "state.json")})  # fmt: skip

    async def scene() -> list[tuple[str, bool]]:
        waker = module.Waker(settings, clock=lambda: 1_800_000_000.0)
        seen = []
        for mode in (module.Mode.ASLEEP, module.Mode.AWAKE, module.Mode.UNREADY):
            waker.set_mode(mode)
            seen.append((str(waker.mode), hold.exists()))
        waker.fail("no wake to fail")
        seen.append((str(waker.mode), hold.exists()))
        waker.set_mode(module.Mode.WAKING)
        waker.fail("the deploy run ended failure")
        seen.append((str(waker.mode), hold.exists()))
        return seen

    assert front_bench.run(scene()) == [("asleep", True), ("awake", False), ("unready", True),
                                        ("unready", True), ("failed", True)]  # fmt: skip
    saved = (tmp_path / "state.json").read_text()
    assert "the deploy run ended failure" in saved and "no wake to fail" not in saved


def test_the_ready_replicas_are_taken_in_turn(tmp_path: Path) -> None:
    """Each held request starts at the next ready replica and falls back on the others."""
    module: Any = script_module.load_package(WAKER, "wake_waker_turn", "waker").waker
    settings = module.Settings.from_env(rendered_env())
    waker = module.Waker(settings)
    assert waker.next_replica() == []
    a, b, c = ("10.0.0.1", 8080), ("10.0.0.2", 8080), ("10.0.0.3", 8080)
    waker.healthy = [a, b, c]
    assert [waker.next_replica() for _ in range(3)] == [[b, c, a], [c, a, b], [a, b, c]]
    assert not waker.serving(), "ready replicas, but not awake: nothing is relayed"
    waker.mode = module.Mode.AWAKE
    assert waker.serving()


def test_a_look_that_began_before_a_replica_joined_does_not_answer_a_request_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deploy's own probe through the front comes right after the member phase writes the
    replica's upstream file. A look that read the files before that and ended after the probe
    arrived must not stand for the probe (it would see no replica and wake the set): the
    probe's look is one that began after it was asked."""
    module: Any = script_module.load_package(WAKER, "wake_race", "waker").waker
    upstreams = tmp_path / "upstreams"
    upstreams.mkdir()
    settings = module.Settings.from_env({**rendered_env(), "WAKE_UPSTREAMS_DIR": str(upstreams),
                                         "WAKE_HOLD_FILE": str(tmp_path / "hold")})  # fmt: skip

    async def slow_look(_: object, __: object, upstream: tuple[str, int]) -> str:
        await asyncio.sleep(0.3)
        return str(module.READY)

    monkeypatch.setattr(module.Waker, "look_one", slow_look)

    async def scene() -> list[tuple[str, int]]:
        waker = module.Waker(settings)
        (upstreams / "old.caddy").write_text("to 127.0.0.9:1\n")  # a look under way reads it
        under_way = asyncio.ensure_future(waker.fresh_look(None))
        await asyncio.sleep(0.1)
        (upstreams / "new.caddy").write_text("to 127.0.0.10:2\n")  # the member phase
        mark_joined(upstreams)  # and its join mark, after Caddy's reload
        await waker.fresh_look(None)  # the probe's own look
        await under_way
        return list(waker.healthy)

    assert ("127.0.0.10", 2) in front_bench.run(scene()), "the probe's look saw the new replica"


def test_a_replica_that_just_joined_is_not_called_gone_by_the_looks_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asleep after many looks found nothing; the deploy's member phase writes a replica's file
    and its probe follows. The new replica does not answer the first look (a gateway still
    reloading): that one look is not the WAKE_ASLEEP_LOOKS in a row that make the set asleep,
    so the probe is held (unready), not a wake."""
    module: Any = script_module.load_package(WAKER, "wake_join", "waker").waker
    upstreams = tmp_path / "upstreams"
    upstreams.mkdir()
    settings = module.Settings.from_env({**rendered_env(), "WAKE_UPSTREAMS_DIR": str(upstreams),
                                         "WAKE_HOLD_FILE": str(tmp_path / "hold"),
                                         "WAKE_ASLEEP_SECONDS": "0"})  # fmt: skip

    async def gone(_: object, __: object, upstream: tuple[str, int]) -> str:
        return str(module.GONE)

    monkeypatch.setattr(module.Waker, "look_one", gone)

    async def scene() -> list[str]:
        waker = module.Waker(settings)
        (upstreams / "old.caddy").write_text("to 127.0.0.9:1\n")  # the replica autodown deleted
        for _ in range(5):
            await waker.look(None)
        modes = [waker.mode]
        (upstreams / "new.caddy").write_text("to 127.0.0.10:2\n")  # the member phase
        await waker.look(None)
        modes.append(waker.mode)
        for _ in range(int(settings.asleep_looks)):
            await waker.look(None)
        modes.append(waker.mode)
        return modes

    assert front_bench.run(scene()) == ["asleep", "unready", "asleep"], "a new count, then asleep"


def test_a_replica_counts_ready_only_once_its_join_is_marked_after_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica that answers its /health but whose file has no join mark yet (Caddy's reload
    under way), or a mark older than its file (joined again: a new file, its reload to come),
    exists but is not ready: the front is unready (held, nothing woken), never awake; with a
    mark as new as its file it is awake. A mark without its file (a leave) counts nothing."""
    module: Any = script_module.load_package(WAKER, "wake_mark", "waker").waker
    upstreams = tmp_path / "upstreams"
    upstreams.mkdir()
    settings = module.Settings.from_env({**rendered_env(), "WAKE_UPSTREAMS_DIR": str(upstreams),
                                         "WAKE_HOLD_FILE": str(tmp_path / "hold")})  # fmt: skip

    async def ready(_: object, __: object, upstream: tuple[str, int]) -> str:
        return str(module.READY)

    monkeypatch.setattr(module.Waker, "look_one", ready)
    file = upstreams / "r0.caddy"
    mark = upstreams / f"r0.caddy{catalog.BALANCER_JOINED_SUFFIX}"

    async def scene() -> list[tuple[str, bool]]:
        waker = module.Waker(settings)
        seen = []

        async def look() -> None:
            await waker.look(None)
            seen.append((waker.mode, waker.s.hold_file.exists()))

        file.write_text("to 127.0.0.10:2\n")  # the member phase's file; its reload to come
        await look()
        mark_joined(upstreams)  # reloaded: the mark
        await look()
        time.sleep(0.01)
        file.write_text("to 127.0.0.10:3\n")  # joined again: the old mark is older
        await look()
        mark_joined(upstreams)
        await look()
        file.unlink()  # a leave cut before it removed the mark: no file, nothing counted
        (upstreams / "r1.caddy").write_text("to 127.0.0.11:2\n")
        await look()
        return seen

    assert front_bench.run(scene()) == [("unready", True), ("awake", False), ("unready", True),
                                        ("awake", False), ("unready", True)]  # fmt: skip
    assert mark.exists()
