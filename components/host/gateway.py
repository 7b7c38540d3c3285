"""The public entry: Caddy in front of vLLM, which stays on 127.0.0.1.

vLLM's own --api-key guards only paths under /v1, /v2, /inference and /cohere (0.33): /metrics,
/tokenize, /invocations, /docs and others answer without it, and older releases left /pause and
/update_weights open too (docs/facts.md). So the gateway admits
the exact OpenAI routes with `Authorization: Bearer <key>` and `GET /health`, and refuses
everything else, key or not. HTTPS comes from a public ACME CA: by default a certificate for the
Droplet's IPv4 address itself (Let's Encrypt's `shortlived` profile; no DNS, no third party),
else for `access.domain` or, opted in, `<ip-with-dashes>.sslip.io`. Streams pass chunk by chunk,
with no timeout on long generations.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from ..spec import catalog
from ..spec.schema import StackConfig
from . import balancer, router, wake

# The key reaches Caddy from a root-only EnvironmentFile, read by systemd, never the Caddyfile.
API_KEY_ENV = "NEMO_API_KEY"
GATEWAY_ENV_FILE = "/etc/nemotron/gateway.env"
HTTP_PORT = 80
HTTPS_PORT = 443
SSLIP_SUFFIX = "sslip.io"
# Let's Encrypt issues IP-address certificates only through this ACME profile (since January
# 2026), over http-01 or tls-alpn-01; Caddy >= 2.10 selects a profile (acmeissuer.go `profile`).
IP_PROFILE = "shortlived"


def hostname(cfg: StackConfig, ipv4: str) -> str:
    """What the certificate is for: the user's domain, the opt-in sslip.io name, or (the
    default) the Droplet's IPv4 address itself, which needs no DNS and trusts no third party."""
    if cfg.access.domain:
        return cfg.access.domain
    if cfg.access.sslip:
        return f"{ipv4.replace('.', '-')}.{SSLIP_SUFFIX}"
    return ipv4


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def certificate(cfg: StackConfig, host: str) -> str:
    """Where the endpoint's certificate comes from, for the outputs."""
    if not cfg.access.https:
        return "none: access.https is false (plain HTTP, the key crosses the network in clear)"
    if is_ip(host):
        return (
            f"Let's Encrypt, for the IP address {host} ({IP_PROFILE} profile: about 6 days, "
            "renewed by the gateway)"
        )
    return f"Let's Encrypt, else ZeroSSL, for {host} (90 days, renewed by the gateway)"


def api_port(cfg: StackConfig) -> int:
    return HTTPS_PORT if cfg.access.https else HTTP_PORT


def endpoint(cfg: StackConfig, host: str) -> str:
    return f"https://{host}/v1" if cfg.access.https else f"http://{host}/v1"


# The only routes that reach vLLM, exactly as they are forwarded: the OpenAI-compatible routes a
# Nemotron chat model serves (vLLM 0.33's entrypoints/openai/*/api_router.py), and a stored
# response (`{id}`). The gate matches the path (under /v1/) alone, whatever the method (vLLM
# answers another one 405); the method is what vLLM serves there, for the tests that send each.
API_ROUTES = (
    ("GET", "models"),
    ("POST", "chat/completions"),
    ("POST", "completions"),
    ("POST", "responses"),
    ("POST", "embeddings"),
    ("GET", "responses/{id}"),
    ("POST", "responses/{id}/cancel"),
)
RESPONSE_ID = "[A-Za-z0-9_-]+"
_API_URI = (
    "^/v1/("
    + "|".join(path.replace("{id}", RESPONSE_ID) for _, path in API_ROUTES)
    + ")([?][^#]*)?$"
)


@dataclass(frozen=True)
class ReplicaListener:
    """A replica's gateway behind the balancer: plain HTTP on its private address only, its /health
    503 while `drain_dir`/draining exists, its vLLM /metrics for the key from `metrics_reader`
    alone (replica 0's address: its autodown reads every replica's; none when empty), and vLLM's
    render routes for the key from `render_client` alone (the front's private address, with
    balancer.routing cache-aware: its router asks each replica for a prompt's token ids; none
    when empty). With `retry_elsewhere` (behind the Caddy balancer), while draining it answers
    new API requests 503 with balancer.DRAINING_HEADER, which the balancer resends to another
    replica: its checks alone let new requests in after each reload. Requests from its own
    address (the ready phase's probe) still pass. The managed Load Balancer retries nothing, so
    there the replica serves new requests through the drain's notice."""

    bind: str
    port: int = catalog.REPLICA_PORT
    drain_dir: str = catalog.DRAIN_DIR
    metrics_reader: str = ""
    retry_elsewhere: bool = False
    render_client: str = ""


def max_body_bytes(cfg: StackConfig) -> int:
    """One unit for the body limit: MB as Caddy reads `16MB` (SI, 1,000,000 bytes), in bytes
    for both the up-front check and the cut-off, so no body passes one and fails the other."""
    return cfg.access.max_request_body_mb * 1_000_000


@dataclass(frozen=True)
class Listen:
    """Where a gateway listens and what it talks to, as on a Droplet. A test that cannot take
    ports 80 and 443, runs its own CA, or keeps the admin socket and the upstream files in its
    own folder gives its own here, in one value; the sites themselves have no test knobs."""

    http_port: int = HTTP_PORT
    https_port: int = HTTPS_PORT
    # The vLLM a lone site proxies to: the Droplet's own on loopback, or (the Kubernetes
    # platform's edge, components/cloud/kube/edge.py) a Service's name inside the cluster.
    upstream_host: str = "127.0.0.1"
    upstream_port: int = catalog.VLLM_PORT
    # Another ACME CA than the public ones, and its root (the tests' own).
    acme_ca: str | None = None
    acme_ca_root: str | None = None
    # The ACME profile an IP certificate is asked with (None: a CA that offers no profiles).
    ip_profile: str | None = IP_PROFILE
    # The admin API's root-only socket (a replica's and the balancer's; None: admin off).
    admin_socket: str | None = catalog.CADDY_ADMIN_SOCKET
    # The files replicas join the balancer's pool by.
    upstreams: str = f"{catalog.BALANCER_UPSTREAMS_DIR}/*.caddy"
    # The front's waker (wake.enabled), on loopback, and the file it keeps while no replica is
    # ready.
    waker: str = wake.ADDRESS
    wake_hold_file: str = wake.HOLD_FILE
    # The front's router (balancer.routing: cache-aware): the file it keeps while it serves,
    # and its address on loopback (this field's name hides the module below it).
    router_serving: str = router.SERVING_FILE
    router: str = router.ADDRESS
    # Who writes the file, for its first line (the Kubernetes edge's is a ConfigMap).
    written_by: str = "the gateway phase"


DROPLET = Listen()


def lone_site(cfg: StackConfig, host: str, listen: Listen = DROPLET) -> str:
    """A lone Droplet's gateway: the public site for `host` (its certificate; with https off,
    every name on the HTTP port) in front of the local vLLM. No admin API: nothing on the
    Droplet may reconfigure it but this file. The Kubernetes platform's edge is this same site
    with the model's (or the router's) Service as `listen.upstream_host`."""
    https = cfg.access.https
    head, sni = _certificate(https, host, listen)
    upstream = f"{listen.upstream_host}:{listen.upstream_port}"
    return _global_options(cfg, listen, None, listen.http_port, sni) + gate(
        cfg,
        site=host if https else f"http://:{listen.http_port}",
        head=head,
        health_proxy=f"reverse_proxy {upstream}",
        proxy=_local_proxy(upstream),
    )


def replica_site(cfg: StackConfig, replica: ReplicaListener, listen: Listen = DROPLET) -> str:
    """A replica's gateway behind the balancer: the same gate again (the key is checked at the
    entry and on every replica), plain HTTP on its private address alone, its /health 503 while
    it drains, its /metrics for replica 0 (replica_site_routes); the admin API on a root-only
    socket, for graceful reloads."""
    upstream = f"127.0.0.1:{listen.upstream_port}"
    proxy = _local_proxy(upstream)
    if replica.retry_elsewhere:
        proxy = f"""{DRAINING_BOUNCE}
			{proxy}"""
    # Only on the private address: nothing of this listener is on the public interface,
    # whatever the firewall says. While draining, the balancer's checks fail and it sends no
    # new request here; the requests already here finish.
    return _global_options(cfg, listen, listen.admin_socket, replica.port, None) + gate(
        cfg,
        site=f"http://:{replica.port}",
        head=f"\n\tbind {replica.bind}\n",
        health_proxy=f"""respond @draining "draining: this replica is being updated" 503
		reverse_proxy {upstream}""",
        proxy=proxy,
        routes=replica_site_routes(replica, upstream),
    )


def balancer_site(cfg: StackConfig, host: str, listen: Listen = DROPLET) -> str:
    """The Caddy balancer's gateway: the public site for `host`, the same gate, in front of the
    replicas' gateways (balancer.py, the files they join by) instead of a local vLLM; the admin
    API on a root-only socket, for graceful reloads (replicas joining and leaving, a new
    Caddyfile). With balancer.routing cache-aware the API routes go to the front's router
    (router.py), which picks the replica (but those it would forward without the client's key:
    balancer.routed); `GET /health` still goes straight to the replicas:
    the router's own /health is 503 while ANY replica is unhealthy, which would make the whole
    front look down through a rolling update."""
    https = cfg.access.https
    head, sni = _certificate(https, host, listen)
    block = health = balancer.reverse_proxy(listen.upstreams)
    if cfg.routing == "cache-aware":
        block = balancer.routed(listen.upstreams, listen.router, listen.router_serving)
    routes = ""
    if cfg.wake.enabled:
        # The front that wakes the set: while no replica is ready, keyed requests and /health
        # go to the waker (it holds the first and answers the second, which never wakes).
        block = wake.held(block, listen.waker, listen.wake_hold_file)
        health = wake.held(health, listen.waker, listen.wake_hold_file)
        routes = wake.control_routes(listen.waker)
    options = _global_options(cfg, listen, listen.admin_socket, listen.http_port, sni)
    return options + gate(
        cfg,
        site=host if https else f"http://:{listen.http_port}",
        head=head,
        health_proxy=health.replace("\n", "\n\t\t"),
        proxy=block.replace("\n", "\n\t\t\t"),
        routes=routes,
    )


def _certificate(https: bool, host: str, listen: Listen) -> tuple[str, str | None]:
    """What a public site opens with, and its default SNI: for an IP address, the ACME issuer
    with the IP profile, served to the clients that send no SNI (Caddy gives an IP the ACME
    issuer only when a policy names one: autohttps.go shouldUseInternal)."""
    if not (https and is_ip(host)):
        return "", None
    profile = f"\n\t\t\tprofile {listen.ip_profile}" if listen.ip_profile else ""
    return (
        f"""
	tls {{
		issuer acme {{{profile}
		}}
	}}
""",
        host,
    )


def _local_proxy(upstream: str) -> str:
    return f"""reverse_proxy {upstream} {{
				# Server-sent events go out as they come; no response timeout cuts a long answer.
				flush_interval -1
			}}"""


# The server timeouts, one set for every site: a replica behind the front must wait at least as
# long as the front does, or it cuts a body or an answer the front still lets through. Caddy
# 2.11.7 has idle timeouts besides the hard ones, and gives read_body_idle and write_idle a
# 1-minute default when they are not set (caddyserver/caddy #7913, commit 0cf03d32f:
# modules/caddyhttp/app.go defaultReadIdleTimeout, server.go ReadIdleTimeout and ReadMinRate,
# idletimeout.go IdleDeadline; the names in caddyconfig/httpcaddyfile/serveroptions.go), so each
# is said here:
# - read_header: a request's header block (slow headers, slowloris).
# - read_body, write 0s: no hard deadline, so a 16 MB body on a slow link or a generation of
#   many minutes is never cut while it moves.
# - read_body_idle 5m 10000: a body may pause (a client that writes it as it goes, 70 s through
#   the front got 499 at the default), but after its first 5 minutes it must have averaged
#   10 kB/s (IdleDeadline with MinRate: Start + Timeout + bytes/MinRate), so a body trickled a
#   byte at a time ends (16 MB may take 32 minutes).
# - write_idle 1m: a client that takes none of its answer for a minute is let go.
# - idle 5m: between requests on a kept-alive connection.
# None cuts a request the front's waker holds silently: its body is read whole before the hold,
# net/http clears the read deadline once a body ends (src/net/http/server.go,
# connReader.startBackgroundRead), and nothing is written while it waits (tests/test_wake.py
# holds one past a minute, and one whose body paused past a minute).
TIMEOUTS = {"read_header": "30s", "read_body": "0s", "read_body_idle": "5m 10000",
            "write": "0s", "write_idle": "1m", "idle": "5m"}  # fmt: skip


def _global_options(
    cfg: StackConfig, listen: Listen, admin_socket: str | None, http_port: int, sni: str | None
) -> str:
    """The global options every site shares: no trust store, the ports, the ACME account, the
    server timeouts (TIMEOUTS), and the admin API (a root-only socket, or off)."""
    timeouts = "\n\t\t\t".join(f"{name} {value}" for name, value in TIMEOUTS.items())
    options = f"\n\temail {cfg.access.acme_email}" if cfg.access.acme_email else ""
    if listen.acme_ca:
        options += f"\n\tacme_ca {listen.acme_ca}"
    if listen.acme_ca_root:
        options += f"\n\tacme_ca_root {listen.acme_ca_root}"
    if sni:
        options += f"\n\tdefault_sni {sni}"
    admin = (
        f"""# The admin API on a root-only socket alone: replicas join and leave by graceful reload.
	admin unix/{admin_socket}"""
        if admin_socket
        else """# No admin API: nothing on the Droplet may reconfigure the gateway but this file.
	admin off"""
    )
    return f"""# nemotron-droplet gateway: written by {listen.written_by}; edits are overwritten.
{{
	{admin}
	# Never touch the system trust store (Caddy would add its local CA root to it).
	skip_install_trust
	http_port {http_port}
	https_port {listen.https_port}{options}
	servers {{
		timeouts {{
			{timeouts}
		}}
	}}
}}

"""


def gate(
    cfg: StackConfig, *, site: str, head: str, health_proxy: str, proxy: str, routes: str = ""
) -> str:
    """The site block every gateway is: the body limit, `GET /health`, the exact OpenAI routes
    with the key, and nothing else, key or not.

    Every decision is made on what vLLM will see. Caddy's path matchers clean the path first
    (case, dot-segments, `//`, percent-encoding, trailing dots), but the proxy forwards the
    original request URI (docs/facts.md): `GET /metrics/../health` would match `/health`
    and reach vLLM's metrics app. So the routes match `{http.request.uri}`, the raw request
    target, against exact paths; anything else (a dot-segment, `//`, an encoded `/` or `.`, a
    case variant) is refused before it is proxied. The key check compares the whole
    Authorization field, all its values joined: a second Authorization header fails it (the
    header matcher passes when any one matches, and vLLM reads the first)."""
    length = "{http.request.header.Content-Length}"
    limit = max_body_bytes(cfg)
    too_big = f"`{length}.matches('^[0-9]+$') && int({length}) > {limit}`"
    # CEL strings in single quotes: the phase script carries this text shell-quoted, and
    # shellcheck reads double-quoted braces there as a mistaken expansion.
    health = "`{http.request.method} in ['GET', 'HEAD'] && {http.request.uri} == '/health'`"
    api = f"`{{http.request.uri}}.matches('{_API_URI}')`"
    key = f"`{{http.request.header.Authorization}} == 'Bearer ' + {{env.{API_KEY_ENV}}}`"
    return f"""{site} {{{head}
	# A declared length over the limit is refused up front; a chunked body is cut at the limit.
	@too_big expression {too_big}
	handle @too_big {{
		respond "request body over {cfg.access.max_request_body_mb} MB ({limit} bytes)" 413
	}}
	request_body {{
		max_size {limit}
	}}

	@health expression {health}
	handle @health {{
		{health_proxy}
	}}

	@api expression {api}
	@authorized expression {key}{routes}
	handle @api {{
		handle @authorized {{
			{proxy}
		}}
		handle {{
			header WWW-Authenticate "Bearer"
			respond "unauthorized: send one Authorization: Bearer <apiKey> header" 401
		}}
	}}

	# Every other path and spelling: /invocations, /tokenize, /pause, /metrics, /V1/models,
	# /v1/../metrics, /v1/%6Dodels, ...
	handle {{
		respond "not found" 404
	}}
}}
"""


# vLLM's render routes (--enable-scale-out): a chat's or a prompt's token ids, which the front's
# cache-aware router asks every replica for (router.py).
RENDER_PATHS = ("/v1/chat/completions/render", "/v1/completions/render")

# What --enable-scale-out serves that the gate's `responses/<id>` would take for a stored
# response: POST /v1/responses/render (and derender). Refused on a replica, key or not: nothing
# else of scale-out is admitted but RENDER_PATHS from the front.
_SCALE_OUT_LOOKALIKE = "^/v1/responses/(render|derender)([/?].*)?$"

# A new API request while draining, not from this replica itself: 503, for the balancer to resend.
DRAINING_BOUNCE = f"""header @bounce {balancer.DRAINING_HEADER} 1
			respond @bounce "draining: this replica is being updated; try another" 503"""


def replica_site_routes(replica: ReplicaListener, upstream: str) -> str:
    """What a replica's site adds: the drain's matchers, vLLM's /metrics (its counters, for replica
    0's autodown) with the key and from `metrics_reader` only, and vLLM's two render routes (a
    prompt's token ids, for the front's cache-aware router) with the key and from
    `render_client` only (none, 404, without it). Through the managed Load Balancer a request's
    source is the balancer, so both are refused there, key or not. Render is exactly `POST` to
    the two paths, no query: vLLM's --enable-scale-out also opens /inference/v1/generate and
    /inference/v1/abort_requests (and other render and derender routes), which stay 404 here. It
    passes while the replica drains: it uses no engine, and a refusal would make the router
    route that request without the prompt's ids."""
    metrics = "`{http.request.method} == 'GET' && {http.request.uri} == '/metrics'`"
    reader = f"remote_ip {replica.metrics_reader}" if replica.metrics_reader else "expression false"
    return f"""
	@draining file {{
		root {replica.drain_dir}
		try_files /{catalog.DRAIN_FILE_NAME}
	}}
	@bounce {{
		file {{
			root {replica.drain_dir}
			try_files /{catalog.DRAIN_FILE_NAME}
		}}
		not remote_ip {replica.bind}
	}}
	@metrics expression {metrics}
	@metrics_reader {reader}
	handle @metrics {{
		handle @metrics_reader {{
			handle @authorized {{
				reverse_proxy {upstream}
			}}
			handle {{
				respond "unauthorized" 401
			}}
		}}
		handle {{
			respond "forbidden: only replica 0 reads a replica's metrics" 403
		}}
	}}
{_render_routes(replica, upstream) if replica.render_client else ""}"""


def _render_routes(replica: ReplicaListener, upstream: str) -> str:
    """vLLM's two render routes for the front's router alone (a replica whose vLLM runs
    --enable-scale-out: balancer.routing cache-aware), and what else scale-out serves that the
    gate would admit, refused."""
    render_paths = ", ".join(f"'{p}'" for p in RENDER_PATHS)
    render = f"`{{http.request.method}} == 'POST' && {{http.request.uri}} in [{render_paths}]`"
    return f"""	@scale_out expression `{{http.request.uri}}.matches('{_SCALE_OUT_LOOKALIKE}')`
	handle @scale_out {{
		respond "not found" 404
	}}
	@render expression {render}
	@render_client remote_ip {replica.render_client}
	handle @render {{
		handle @render_client {{
			handle @authorized {{
				reverse_proxy {upstream}
			}}
			handle {{
				respond "unauthorized" 401
			}}
		}}
		handle {{
			respond "forbidden: only the front's router renders a prompt here" 403
		}}
	}}
"""


def caddy_unit(admin_socket: str | None = None) -> str:
    """Caddy's unit, after the one Caddy ships (dist/init/caddy.service), with the key from a
    root-only file, no `--environ` (it would print the key to the journal), no metadata service.
    It takes the name of the Ubuntu package's unit, and /etc/systemd/system wins over it on a
    Droplet that had the package from an earlier version. With `admin_socket` (the balancer and
    the replicas of a set), systemd makes its folder, the caddy user's alone, and reload is
    graceful (in-flight requests finish on the old configuration)."""
    runtime = ""
    if admin_socket:
        folder = admin_socket.rsplit("/", 1)[0].removeprefix("/run/")
        reload = (
            f"{catalog.CADDY_BIN} reload --config /etc/caddy/Caddyfile --adapter caddyfile "
            f"--address unix/{admin_socket}"
        )
        runtime = f"""
RuntimeDirectory={folder}
RuntimeDirectoryMode=0700
ExecReload={reload}"""
    return f"""[Unit]
Description=nemotron-droplet gateway (Caddy {catalog.CADDY_VERSION})
After=network-online.target
Wants=network-online.target

[Service]
Type=notify
User={catalog.CADDY_USER}
Group={catalog.CADDY_USER}
Environment=HOME={catalog.CADDY_HOME}
EnvironmentFile={GATEWAY_ENV_FILE}
ExecStart={catalog.CADDY_BIN} run --config /etc/caddy/Caddyfile --adapter caddyfile{runtime}
TimeoutStopSec=5s
LimitNOFILE=1048576
PrivateTmp=true
ProtectSystem=full
AmbientCapabilities=CAP_NET_BIND_SERVICE
Restart=on-failure
RestartSec=5
{catalog.METADATA_DENY}

[Install]
WantedBy=multi-user.target
"""
