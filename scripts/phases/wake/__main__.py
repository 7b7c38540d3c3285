"""wake: the front's waker (`python3 -m wake` in the folder that holds this package and the
clients it imports, clients/: the unit components/host/wake.py renders). While no replica
answers, it holds the keyed requests Caddy sends it, wakes the GPU set (once) when none exists,
and relays each held request to the first replica that is ready.

Runs on the balancer Droplet (the front that holds the endpoint's address) as its own service,
on loopback, on Ubuntu's Python and aiohttp (stdlib and aiohttp only). It is in the data path
only while no replica is ready: it keeps the file WAKE_HOLD_FILE while that is so, and Caddy's
gateway sends a keyed request here only while that file exists (a `file` matcher, after the
gate has checked the key); awake, Caddy proxies to the replicas and no request passes through
Python. Unkeyed requests never reach it, but `GET /health`, which it answers itself and which
never wakes anything. Stopped (SIGTERM), it answers what it holds with 503 and
`x-should-retry: true` and leaves the file: through a restart Caddy keeps sending keyed
requests here, retrying the connection until the next waker listens, which takes up a wake
under way (its run, no second dispatch); stopped for good, systemd removes the file's folder.

Its parts: settings (every key required), state (the mode, the ledger kept across restarts),
decision (the wake decision, pure), looks (the replicas), pipeline (GitHub or a webhook),
waker (the decisions acted on), relay (the hold and relay, the HTTP app). Every event is one
JSON log line (the journal); no token and no request line is ever printed. It wakes and holds,
and never scales: the set's count is the stack's fixed `replicas`."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from aiohttp import web

from .log import log
from .relay import Front, cancel_on_disconnect, sessions
from .settings import Settings
from .state import Mode
from .waker import Waker


async def serve(settings: Settings) -> None:
    waker = Waker(settings)
    waker.load()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    relays, looks = sessions(settings)
    async with relays, looks:
        await waker.look(looks)  # the hold file matches the replicas before the first request
        waker.route_file()
        if waker.mode == Mode.WAKING and settings.trigger == "github":
            waker.spawn(waker.watch_github_run(waker.since, waker.ledger.timeline.run_id))
        runner = web.AppRunner(
            Front(waker, relays, looks).app(),
            access_log=None,
            handle_signals=False,
            **cancel_on_disconnect(),
        )
        await runner.setup()
        # Many held requests may arrive at once while the set wakes: a deep accept queue.
        site = web.TCPSite(runner, settings.listen[0], settings.listen[1], backlog=4096)
        await site.start()
        bound = runner.addresses[0][1] if runner.addresses else settings.listen[1]
        log(
            "listening",
            address=f"{settings.listen[0]}:{bound}",
            trigger=settings.trigger,
            stack=settings.stack,
            mode=waker.mode,
        )
        monitor = asyncio.ensure_future(waker.monitor(looks))
        checks = asyncio.ensure_future(waker.pipeline_checks())
        await stop.wait()
        monitor.cancel()
        checks.cancel()
        # Held requests are answered (retry now), and the hold file stays: through a restart
        # systemd keeps its folder (RuntimeDirectoryPreserve=restart) and Caddy, still sending
        # keyed requests here, retries the connection until the next waker listens; a stop
        # removes the folder, and Caddy proxies to the replicas (components/host/wake.py).
        waker.stopping = True
        waker.notify()
        await runner.cleanup()


def main() -> int:
    asyncio.run(serve(Settings.from_env(dict(os.environ))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
