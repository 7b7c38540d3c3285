"""The front's cache-aware router (balancer.routing: cache-aware): vLLM's own router
(`vllm-router` on PyPI, vllm-project/router) on the front's loopback, behind Caddy, in front of
the replicas' private gateways. Caddy stays the public entry (TLS, the exact-URI gate, the key,
the wake hold); the router only picks the replica. This module renders its command line, its
start script and its unit; the router phase (scripts/phases/router.sh) installs them, the
member phase (member.sh) adds and removes replicas through its admin routes.

What its source says (docs/facts.md, "vllm-router 0.1.17 (checked at its source)"), and what
follows from it here:
- cache_aware keys a prefix tree on each replica's own token ids: for every request it POSTs
  the body to every replica's `/v1/chat/completions/render` (`/v1/completions/render`), which
  vLLM 0.33 serves with `--enable-scale-out` alone (vllm_service.py renders it with this
  routing) and each replica's gateway admits from the front's address alone, with the key:
  the router sends the client's Authorization on (no `--api-key` here: the key never goes on a
  command line). Without token ids it routes to the least loaded.
- POST /v1/responses is the one route of the gate it forwards WITHOUT the client's
  Authorization (UNKEYED_ROUTES): Caddy sends it to the replicas itself (balancer.routed).
- Its admin routes (add_worker, remove_worker, /workers, ...) share the API port with no key:
  hence 127.0.0.1 only, and Caddy forwards nothing but the gate's exact API routes to it.
- Its Prometheus listener cannot be turned off: 127.0.0.1 as an IP literal (a name such as
  localhost binds 0.0.0.0). member.sh reads `vllm_router_running_requests{worker=...}` there
  to wait for a leaving replica's requests.
- It retries on the worker it chose (cache_aware ignores the retry's exclusions), so a replica
  that died answers until its health checks (every HEALTH_SECONDS, out after HEALTH_FAILS)
  or its circuit breaker take it out: Caddy's retry in front (balancer.py) covers that window.
- A streamed answer is relayed chunk by chunk; its request timeout also bounds a stream, so it
  is set past any generation the gate lets through.
- On SIGTERM it stops listening and finishes the requests and streams it holds, with no
  deadline of its own (server.rs graceful shutdown). Caddy sends it the API routes only while
  SERVING_FILE exists: the unit makes it once the router answers and removes it first thing
  on a stop, so while the router finishes a long stream (up to STOP_SECONDS) new requests go
  to the replicas past it instead of to a closed port.
- It adds `access-control-allow-origin: *` to every answer: the balancer's site removes it
  (the endpoint is for programs with a key, not for browsers).
"""

from __future__ import annotations

import shlex

from ..spec import catalog

HOST = "127.0.0.1"
ADDRESS = f"{HOST}:{catalog.ROUTER_PORT}"
METRICS_ADDRESS = f"{HOST}:{catalog.ROUTER_METRICS_PORT}"
BIN = f"{catalog.ROUTER_PREFIX}/bin/vllm-router"
START_SCRIPT = "/usr/local/lib/nemotron/router-start"
# The gauge of requests in flight per replica (it keeps a removed replica until its last
# request ends: docs/facts.md), and the label that names the replica.
RUNNING_GAUGE = "vllm_router_running_requests"

# The gate's routes (gateway.API_ROUTES) the router forwards WITHOUT the client's Authorization:
# POST /v1/responses goes through its route_transparent, which sends a worker none of the
# client's headers, only the router's own --api-key (vllm_router 0.1.17 src/server.rs
# v1_responses; src/routers/http/router.rs route_transparent: client headers only with EPD).
# The router holds no key (the flag would put it on its command line), so a replica's gate
# answered that route 401. Chat, completions, embeddings (route_typed_request), models
# (proxy_get_request) and a stored response's lookup and cancel (route_simple_request) pass the
# client's headers on. Caddy sends these routes to the replicas itself, least_conn
# (balancer.routed): they are placed by load, not by prefix, and the router does not count them.
UNKEYED_ROUTES = (("POST", "responses"),)

# While this file exists the router serves, and Caddy sends it the API routes (balancer.routed,
# Caddy's `file` matcher, checked per request); otherwise Caddy sends them to the replicas
# itself, least_conn. In the unit's RuntimeDirectory: the unit's ExecStartPost makes it once
# the router answers; its ExecStop removes it before the stop's SIGTERM (systemd.service(5):
# ExecStop runs first, then the remaining processes get KillSignal, systemd.kill(5) KillMode),
# and systemd removes the folder when the unit stops, a crash included.
RUN_DIR = "/run/nemotron-router"
SERVING_FILE = f"{RUN_DIR}/serving"
# After ExecStop removes the file, the requests Caddy routed a moment before still reach the
# router while it listens: this long, then SIGTERM.
STOP_GRACE_SECONDS = 1
# How long a stop (systemctl restart for new flags or a new lock, routing turned off, a reboot)
# lets the router finish what it holds before systemd kills it (TimeoutStopSec): a long
# generation, as a replica's drain waits for one. No new request waits on it meanwhile.
STOP_SECONDS = catalog.LONG_GENERATION_SECONDS

# Its health checks of the replicas (GET /health, no key: a replica's gateway answers it):
# like Caddy's (balancer.py), a replica that is stopped (refused, 502) or drains (503) is out
# within HEALTH_SECONDS * HEALTH_FAILS, and back after HEALTH_PASSES answers. A look may take
# catalog.REPLICA_LOOK_TIMEOUT_SECONDS (--health-check-timeout-secs): a busy vLLM answers late,
# and at 2 s the router took every saturated replica out at once (no worker: 503 for all).
# It looks at the replicas one after another (core/worker_registry.rs start_health_checker),
# so while some are slow a round takes longer: a replica that refuses or fails its requests
# leaves sooner by its circuit breaker (BREAKER_FAILS), and Caddy resends what it failed.
HEALTH_SECONDS = 2
HEALTH_FAILS = 2
HEALTH_PASSES = 2
# A request is tried this many times on the replica chosen, then answered: Caddy resends it
# (balancer.router_proxy) once the health checks or the breaker have taken a dead replica out.
RETRIES = 2
# Failures in a row that take a replica out until BREAKER_SECONDS have passed (each retry
# counts): two requests' worth, so a replica killed under load leaves before its checks fail.
BREAKER_FAILS = 4
BREAKER_SECONDS = 10
# No generation is cut by the router: a day, past any answer the gate lets through (the
# router's own 1800 s default also bounds a stream: server.rs, reqwest's total timeout).
REQUEST_TIMEOUT_SECONDS = 86_400
# How uneven the load may get before a prefix match stops deciding: the router rebalances to
# the least loaded replica only when the busiest has more than BALANCE_ABS requests in flight
# over the least AND more than BALANCE_REL times its load (cache_aware.rs is_imbalanced).
# Its defaults (64, 1.5) let one shared system prompt put every request on one replica in
# tests/support/router_bench.py (0/0/180); 4 and 1.25 are the tightest of the settings run
# there that never moved a conversation off its replica (docs/routing.md, "Bounded load").
BALANCE_ABS = 4
BALANCE_REL = 1.25
# A prefix match below this share of the prompt routes to the least loaded (its default).
CACHE_THRESHOLD = 0.3
# add_worker waits for the replica's /health every second, at most this long (a joining
# replica is ready already: the member phase runs after its ready phase).
WORKER_STARTUP_SECONDS = 60


def worker_url(dial: str) -> str:
    """A replica's gateway (host:port, as its upstream file names it) as the router's worker."""
    return f"http://{dial}"


def args() -> list[str]:
    """The router's command line, without its workers (the start script adds them). Nothing
    secret is on it."""
    return [
        BIN,
        "--host", HOST,
        "--port", str(catalog.ROUTER_PORT),
        "--policy", "cache_aware",
        "--cache-threshold", f"{CACHE_THRESHOLD:g}",
        "--balance-abs-threshold", str(BALANCE_ABS),
        "--balance-rel-threshold", f"{BALANCE_REL:g}",
        "--prometheus-host", HOST,
        "--prometheus-port", str(catalog.ROUTER_METRICS_PORT),
        "--health-check-endpoint", "/health",
        "--health-check-interval-secs", str(HEALTH_SECONDS),
        "--health-check-timeout-secs", str(catalog.REPLICA_LOOK_TIMEOUT_SECONDS),
        "--health-failure-threshold", str(HEALTH_FAILS),
        "--health-success-threshold", str(HEALTH_PASSES),
        "--worker-startup-check-interval", "1",
        "--worker-startup-timeout-secs", str(WORKER_STARTUP_SECONDS),
        "--retry-max-retries", str(RETRIES),
        "--cb-failure-threshold", str(BREAKER_FAILS),
        "--cb-timeout-duration-secs", str(BREAKER_SECONDS),
        "--request-timeout-secs", str(REQUEST_TIMEOUT_SECONDS),
        "--log-level", "info",
    ]  # fmt: skip


def join_later_text() -> str:
    """The start script's join_later: a replica left out of the command line joins the router
    (add_worker, which waits for its /health WORKER_STARTUP_SECONDS at a time) once it answers,
    while its upstream file still names it. It calls the router at $api, set by the script."""
    join_seconds = WORKER_STARTUP_SECONDS + 10
    return f"""\
# join_later FILE DIAL: the router takes http://DIAL once it answers, while FILE still names
# it (a replica that left is not added back; one added as it left is taken out again).
join_later() {{
  local file=$1 dial=$2 out
  while [[ $(cat "$file" 2>/dev/null) == "to $dial" ]]; do
    out=$(curl --silent --max-time {join_seconds} --request POST --get \
            --data-urlencode "url=http://$dial" --write-out '\n%{{http_code}}' \
            "$api/add_worker" 2>/dev/null) || true
    if [[ ${{out##*$'\n'}} == 200 || $out == *"already exists"* ]]; then
      if [[ $(cat "$file" 2>/dev/null) != "to $dial" ]]; then
        curl --silent --max-time 10 --request POST --get --data-urlencode "url=http://$dial" \
          --output /dev/null "$api/remove_worker" || true
      fi
      return 0
    fi
    sleep 2
  done
}}"""


def start_script(upstreams_dir: str = catalog.BALANCER_UPSTREAMS_DIR) -> str:
    """The unit's ExecStart: the router with the replicas whose upstream files the member phase
    wrote and whose /health answers within a look's time (catalog.REPLICA_LOOK_TIMEOUT_SECONDS,
    all looked at together). One that does not answer is left out of the command
    line: the router would wait for a listed replica before it listens (router.rs startup), and
    a set asleep has none. It joins once it answers: a helper the script leaves behind calls
    add_worker for it (which waits for its /health, WORKER_STARTUP_SECONDS at a time) until the
    router takes it or its file goes (member.sh's leave). Without it a replica that was down
    or draining when the router (re)started (systemd's Restart after a crash, a new lock, a
    switch to cache-aware while the replicas restart with --enable-scale-out, a reboot) got
    no request again: member.sh adds a replica only when its Droplet or address changes."""
    command = " ".join(shlex.quote(a) for a in args())
    look_seconds = catalog.REPLICA_LOOK_TIMEOUT_SECONDS
    return f"""#!/bin/bash
# nemotron-droplet: the front's router, with the replicas in {upstreams_dir} that answer;
# the others join once they do.
set -euo pipefail
api=http://{ADDRESS}

# The unit's ExecStartPost (--serving): once the router answers, the file that has Caddy send
# it the API routes (until then they go to the replicas); the unit's start waits for it.
if [[ ${{1:-}} == --serving ]]; then
  until curl --silent --fail --max-time 2 --output /dev/null "$api/liveness"; do sleep 0.5; done
  : > {SERVING_FILE}
  exit 0
fi

{join_later_text()}

# Every listed replica's /health at once, each given a look's time: a busy vLLM answers late,
# and one left to the late join meant a router that served (its serving file made) with no
# worker, every request 503, until the join came.
files=()
dials=()
checks=()
for file in {upstreams_dir}/*.caddy; do
  [[ -f $file ]] || continue
  read -r _ dial < "$file" || continue
  files+=("$file")
  dials+=("$dial")
  curl --silent --fail --max-time {look_seconds} --output /dev/null "http://$dial/health" &
  checks+=("$!")
done
workers=()
later=()
for i in "${{!dials[@]}}"; do
  if wait "${{checks[i]}}"; then
    workers+=("http://${{dials[i]}}")
  else
    later+=("${{files[i]}}" "${{dials[i]}}")
  fi
done
if (( ${{#later[@]}} )); then
  # Detached (the subshell that starts it ends at once): it outlives this script's exec, in
  # the unit's cgroup, so a stop or restart of the unit ends it too.
  (
    for ((i = 0; i < ${{#later[@]}}; i += 2)); do
      join_later "${{later[i]}}" "${{later[i + 1]}}" </dev/null >/dev/null 2>&1 &
    done
  )
fi
if (( ${{#workers[@]}} )); then
  exec {command} --worker-urls "${{workers[@]}}"
fi
exec {command}
"""


def unit_text() -> str:
    """Its own unprivileged user (DynamicUser), restarted at once if it stops. Caddy routes to
    it while SERVING_FILE exists: made once it answers (ExecStartPost), removed first on a stop
    (ExecStop), before SIGTERM, on which it finishes the requests and streams in flight and
    exits 0 (server.rs), within STOP_SECONDS."""
    folder = RUN_DIR.removeprefix("/run/")
    # ExecStart looks at the replicas (REPLICA_LOOK_TIMEOUT_SECONDS, all at once), then waits
    # for a listed replica's /health before it listens (WORKER_STARTUP_SECONDS).
    start_seconds = catalog.REPLICA_LOOK_TIMEOUT_SECONDS + WORKER_STARTUP_SECONDS + 30
    return f"""[Unit]
Description=nemotron-droplet cache-aware router (vllm-router {catalog.ROUTER_VERSION})
After=network-online.target
Wants=network-online.target

[Service]
DynamicUser=yes
# {SERVING_FILE}: Caddy sends the router the API routes while it exists (Caddy's user reads it).
RuntimeDirectory={folder}
RuntimeDirectoryMode=0755
ExecStart={START_SCRIPT}
ExecStartPost={START_SCRIPT} --serving
TimeoutStartSec={start_seconds}s
# A stop: new requests go past the router to the replicas first, then SIGTERM, and the router
# finishes what it holds (a long generation) before it exits.
ExecStop=/bin/rm -f {SERVING_FILE}
ExecStop=/bin/sleep {STOP_GRACE_SECONDS}
TimeoutStopSec={STOP_SECONDS}s
Restart=always
RestartSec=1
# One socket from Caddy and one to a replica per request in flight, and its render calls.
LimitNOFILE=65536
NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
# No metadata service: the router needs nothing from it.
IPAddressDeny=169.254.169.254

[Install]
WantedBy=multi-user.target"""
