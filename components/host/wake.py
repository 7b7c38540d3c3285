"""Scale to zero and back, on the front (the Caddy balancer's Droplet): the waker's settings,
its systemd unit, what the gateway's Caddyfile adds to route through it, and the `wake` output.
scripts/phases/wake/ (a package) decides; this module renders its setup (the wake phase installs
it) and every value it reads: the waker has no defaults of its own."""

from __future__ import annotations

import urllib.parse
from pathlib import Path
from typing import Any

from ..spec import catalog
from ..spec.schema import StackConfig

# The waker listens on the front's loopback only; Caddy reaches it, nothing else does.
PORT = 8092
ADDRESS = f"127.0.0.1:{PORT}"
# What the front runs: one folder (lib.sh install_tree) holding two packages side by side, the
# waker (scripts/phases/wake/, as wake/) and the clients it uses (scripts/clients/: GitHub's
# API and the transport), nothing else. The unit runs `python3 -m wake` with the folder as its
# working directory, which `-m` puts first on sys.path: no -P (Python 3.11+) and no PYTHONPATH,
# as autodown's unit does (components/host/autodown.py). The folder is where the package alone
# was before (its parent on PYTHONPATH): install_tree swaps the whole folder, so a front
# upgraded from it keeps none of its files; the single file that was the waker before that
# (OLD_SCRIPT_PATH) goes from a front that still has it.
LIB_DIR = "/usr/local/lib/nemotron"
PACKAGE = "wake"
TREE_DIR = f"{LIB_DIR}/{PACKAGE}"
OLD_SCRIPT_PATH = f"{LIB_DIR}/wake.py"
CLIENTS_DIR = Path(__file__).resolve().parents[2] / "scripts" / "clients"
CLIENTS = ("__init__.py", "github.py", "transport.py")
ENV_FILE = "/etc/nemotron/wake.env"
# The pipeline's token: root-only; the unit reads it as a systemd credential (LoadCredential),
# so the service's own user never needs read access to /etc/nemotron.
TOKEN_FILE = "/etc/nemotron/wake.token"  # noqa: S105 (a path, not a secret)
# Where the retired autoscaler kept the stack's API key (to read each replica's /metrics): the
# wake phase removes it from a front that still has it.
OLD_KEY_FILE = "/etc/nemotron/wake.apikey"
UNIT = "nemotron-wake.service"
# Ubuntu's Python with Ubuntu's aiohttp (python3-aiohttp, which the wake phase installs): the
# waker's HTTP server and client, updated with the image's security updates.
PYTHON = "/usr/bin/python3"
APT_PACKAGE = "python3-aiohttp"
# While no replica is ready the waker keeps this file, and the gateway sends keyed requests to
# the waker (Caddy's `file` matcher, checked per request); awake, it is gone and Caddy proxies to
# the replicas itself. In the unit's RuntimeDirectory, which systemd keeps through a restart and
# removes when the waker stops (unit_text).
HOLD_DIR = "/run/nemotron-wake"
HOLD_FILE = f"{HOLD_DIR}/hold"
# Keyed control of the waker through the gate (nemodrop/wake.py): its state, or wake now.
CONTROL_PATH = "/nemotron/wake"
# A wake's expected length when nothing better is known: the cold path's estimate (docs/cache.md,
# "Where the minutes go": Droplet, driver and reboot, downloads, load and compile).
EXPECTED_SECONDS = 900
# GitHub's REST API root (docs.github.com/en/rest: "api.github.com"), where a wake dispatches.
GITHUB_API = "https://api.github.com"
STATE_FILE = "/var/lib/nemotron-wake/state.json"
# How the waker looks and holds (scripts/phases/wake/settings.py reads them from its env file): a
# look at every replica's /health every HEALTH_SECONDS; a progress comment on a held stream every
# COMMENT_SECONDS; no replica at all for ASLEEP_LOOKS looks in a row over ASLEEP_SECONDS before the
# set counts as asleep (a replica draining for a `pulumi up` answers, so it never does); the deploy
# run looked at every RUN_POLL_SECONDS (90 calls in a 15-minute wake, within GitHub's 5,000 an hour
# for a token); at most MAX_HELD requests and MAX_HELD_BYTES of their bodies held (a 1 GB front: the
# bodies are held whole until a replica is ready). A look at a busy replica waits WAKE_BUSY_SECONDS
# for its answer (catalog.REPLICA_LOOK_TIMEOUT_SECONDS, Caddy's health_timeout): one that gets none
# is hung, and no longer counted ready.
HEALTH_SECONDS = 2
COMMENT_SECONDS = 10
ASLEEP_SECONDS = 10
ASLEEP_LOOKS = 3
RUN_POLL_SECONDS = 10
MAX_HELD = 2000
MAX_HELD_BYTES = 200_000_000


def tree_extra() -> dict[str, Path]:
    """The clients the waker imports, at their sub-path of the shipped folder (`clients/`)."""
    return {f"clients/{name}": CLIENTS_DIR / name for name in CLIENTS}


def mode(cfg: StackConfig) -> str:
    return "on" if cfg.wake.enabled else "off"


def env_text(cfg: StackConfig) -> str:
    """The waker's settings, every one it reads but its token's path (a credential: unit_text
    sets it); scripts/phases/wake/settings.py requires each (tests/test_wake_settings.py)."""
    w = cfg.wake
    lines = {
        "WAKE_LISTEN": ADDRESS,
        "WAKE_UPSTREAMS_DIR": catalog.BALANCER_UPSTREAMS_DIR,
        "WAKE_HOLD_FILE": HOLD_FILE,
        "WAKE_TRIGGER": w.trigger,
        "WAKE_STACK": cfg.stack,
        "WAKE_GITHUB_API": GITHUB_API,
        "WAKE_GITHUB_REPO": w.github_repo or "",
        "WAKE_GITHUB_WORKFLOW": w.github_workflow,
        "WAKE_GITHUB_REF": w.github_ref,
        "WAKE_WEBHOOK_URL": w.webhook_url or "",
        "WAKE_WEBHOOK_HEADER": w.webhook_header,
        "WAKE_HOLD_SECONDS": str(w.hold_seconds),
        "WAKE_EXPECTED_SECONDS": str(EXPECTED_SECONDS),
        "WAKE_COOLDOWN_MINUTES": f"{w.cooldown_minutes:g}",
        "WAKE_MAX_PER_DAY": str(w.max_per_day),
        "WAKE_DEADLINE_MINUTES": str(w.deadline_minutes),
        "WAKE_STATE_FILE": STATE_FILE,
        "WAKE_HEALTH_SECONDS": str(HEALTH_SECONDS),
        "WAKE_COMMENT_SECONDS": str(COMMENT_SECONDS),
        "WAKE_ASLEEP_SECONDS": str(ASLEEP_SECONDS),
        "WAKE_ASLEEP_LOOKS": str(ASLEEP_LOOKS),
        "WAKE_BUSY_SECONDS": str(catalog.REPLICA_LOOK_TIMEOUT_SECONDS),
        "WAKE_RUN_POLL_SECONDS": str(RUN_POLL_SECONDS),
        "WAKE_MAX_HELD": str(MAX_HELD),
        "WAKE_MAX_HELD_BYTES": str(MAX_HELD_BYTES),
    }
    return "\n".join(f"{k}={v}" for k, v in lines.items())


def unit_text() -> str:
    """Its own unprivileged user (DynamicUser), the token as a credential, its state kept across
    restarts (the day's wakes, a wake under way), restarted at once if it stops. Caddy sends it
    keyed requests only while its hold file exists (no replica ready). Through a restart (a
    crash, or the wake phase installing a new waker) the file stays: systemd keeps the
    RuntimeDirectory when the unit is restarted, by Restart= or by `systemctl restart`
    (RuntimeDirectoryPreserve=restart, systemd man/systemd.exec.xml), so Caddy keeps sending
    keyed requests here and retries the connection until the next waker listens (held()); the
    requests it held are answered 503 with `x-should-retry: true`. Stopped for good, the folder
    goes and Caddy proxies to the replicas."""
    return f"""[Unit]
Description=Wake the GPU set on a keyed request (nemotron-droplet)
After=network-online.target
Wants=network-online.target

[Service]
DynamicUser=yes
StateDirectory=nemotron-wake
# The hold file's folder: Caddy (user caddy) reads whether it exists. Kept through a restart,
# removed when the waker stops.
RuntimeDirectory=nemotron-wake
RuntimeDirectoryMode=0755
RuntimeDirectoryPreserve=restart
EnvironmentFile={ENV_FILE}
LoadCredential=token:{TOKEN_FILE}
Environment=WAKE_TOKEN_FILE=%d/token
# `-m` puts the working directory first on sys.path: the folder holds the package and its
# clients alone, root's. (-P would leave it out, but Python 3.10 has no -P.)
WorkingDirectory={TREE_DIR}
ExecStart={PYTHON} -m {PACKAGE}
Restart=always
RestartSec=1
# Held requests: one socket each from Caddy and one to a replica when it is ready.
LimitNOFILE=65536
NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
# No metadata service: the waker needs nothing from it.
IPAddressDeny=169.254.169.254

[Install]
WantedBy=multi-user.target"""


def held(replicas: str, waker: str = ADDRESS, hold_file: str = HOLD_FILE) -> str:
    """A request's route on the front, after the gate: while the waker's hold file exists (no
    replica is ready), to the waker, which holds it while the set wakes (or a replica finishes
    starting or draining) and answers /health itself; otherwise to the replicas, with no Python
    in the path. Caddy's `file` matcher stats the file for each request
    (caddyserver/caddy modules/caddyhttp/fileserver/matcher.go)."""
    folder, name = hold_file.rsplit("/", 1)
    return f"""@held file {{
	root {folder}
	try_files /{name}
}}
handle @held {{
	reverse_proxy {waker} {{
		# The waker's progress comments and the replica's stream go out as they come.
		flush_interval -1
		# A waker restarting refuses the connection: the request, not sent yet, is tried
		# again until the next one listens: systemd's RestartSec (1 s), its start, and its first
		# look (2 s for a replica's /health, 2 more for a bare connect: scripts/phases/wake/looks.py
		# LOOK_TIMEOUT).
		lb_try_duration 10s
		lb_try_interval 250ms
	}}
}}
handle {{
	{replicas.replace(chr(10), chr(10) + chr(9))}
}}"""


def control_routes(waker: str = ADDRESS) -> str:
    """The keyed control of the waker through the gate (nemodrop/wake.py): GET its state, POST to
    wake now. Proxied as it came: the waker answers CONTROL_PATH itself."""
    uri = f"{{http.request.uri}} == '{CONTROL_PATH}'"
    methods = "{http.request.method} in ['GET', 'POST']"
    return f"""
	@wake_control expression `{uri} && {methods}`
	handle @wake_control {{
		handle @authorized {{
			reverse_proxy {waker}
		}}
		handle {{
			header WWW-Authenticate "Bearer"
			respond "unauthorized: send one Authorization: Bearer <apiKey> header" 401
		}}
	}}"""


def output(cfg: StackConfig, front_price_hourly: float, volumes_monthly: float) -> dict[str, Any]:
    """The `wake` output: what wakes the set, within what, and what sleeping costs."""
    if not cfg.wake.enabled:
        return {"mode": "off"}
    w = cfg.wake
    front = round(front_price_hourly * catalog.HOURS_PER_BILLING_MONTH, 2)
    trigger = (
        f"github: {w.github_repo} {w.github_workflow}@{w.github_ref}"
        if w.trigger == "github"
        # Scheme and host only: a CI's trigger URL may carry its own token in the path or query.
        else f"webhook: {_origin(w.webhook_url or '')}"
    )
    return {
        "mode": "on",
        "trigger": trigger,
        "holdSeconds": w.hold_seconds,
        "maxPerDay": w.max_per_day,
        "cooldownMinutes": w.cooldown_minutes,
        "idleMonthlyPriceUsd": round(front + volumes_monthly, 2),
        "idleCost": f"${front:.2f}/month the front (Droplet; its Reserved IP is free while "
        f"assigned) + ${volumes_monthly:.2f}/month the cache Volumes, while the GPU set sleeps",
        "state": f"nemodrop wake --stack {cfg.stack}",
    }


def _origin(url: str) -> str:
    """Scheme, host and port: never a userinfo, a path or a query (the schema refuses a
    userinfo; this holds even so)."""
    parts = urllib.parse.urlsplit(url)
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{parts.hostname}{port}"
