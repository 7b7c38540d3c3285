"""The public entry: Caddy in front of vLLM, which stays on 127.0.0.1.

vLLM's own --api-key guards only /v1, /v2 and /inference; /invocations (full inference),
/tokenize, /pause, /update_weights and others stay open (FACTS.md). So the gateway admits
`/v1/*` with `Authorization: Bearer <key>` and `GET /health`, and refuses everything else, key
or not. HTTPS comes from a public ACME CA for `<ip-with-dashes>.sslip.io` (no domain needed) or
`access.domain`. Streams pass chunk by chunk, with no timeout on long generations.
"""

from __future__ import annotations

from . import catalog
from .config import StackConfig

# The key reaches Caddy from a root-only EnvironmentFile, read by systemd, never the Caddyfile.
API_KEY_ENV = "NEMO_API_KEY"
GATEWAY_ENV_FILE = "/etc/nemotron/gateway.env"
HTTP_PORT = 80
HTTPS_PORT = 443
SSLIP_SUFFIX = "sslip.io"


def hostname(cfg: StackConfig, ipv4: str) -> str:
    """The name the certificate is for: the user's domain, or one that needs no DNS setup."""
    return cfg.access.domain or f"{ipv4.replace('.', '-')}.{SSLIP_SUFFIX}"


def api_port(cfg: StackConfig) -> int:
    return HTTPS_PORT if cfg.access.https else HTTP_PORT


def endpoint(cfg: StackConfig, host: str) -> str:
    return f"https://{host}/v1" if cfg.access.https else f"http://{host}/v1"


def caddyfile(
    cfg: StackConfig,
    host: str,
    *,
    upstream_port: int = catalog.VLLM_PORT,
    http_port: int = HTTP_PORT,
    https_port: int = HTTPS_PORT,
) -> str:
    """The whole Caddy configuration. `host` names the site (its certificate); with https off
    the site is every name on the HTTP port."""
    email = f"\n\temail {cfg.access.acme_email}" if cfg.access.acme_email else ""
    site = host if cfg.access.https else f"http://:{http_port}"
    upstream = f"127.0.0.1:{upstream_port}"
    length = "{http.request.header.Content-Length}"
    max_body = cfg.access.max_request_body_mb * 1024 * 1024
    too_big = f"`{length}.matches('^[0-9]+$') && int({length}) > {max_body}`"
    return f"""# nemotron-droplet gateway: written by the gateway phase; edits are overwritten.
{{
	# No admin API: nothing on the Droplet may reconfigure the gateway but this file.
	admin off
	http_port {http_port}
	https_port {https_port}{email}
	servers {{
		timeouts {{
			read_header 30s
			idle 5m
		}}
	}}
}}

{site} {{
	# A declared length over the limit is refused up front; a chunked body is cut at the limit.
	@too_big expression {too_big}
	handle @too_big {{
		respond "request body over {cfg.access.max_request_body_mb} MB" 413
	}}
	request_body {{
		max_size {cfg.access.max_request_body_mb}MB
	}}

	@health {{
		method GET HEAD
		path /health
	}}
	handle @health {{
		reverse_proxy {upstream}
	}}

	@authorized {{
		path /v1/*
		header Authorization "Bearer {{env.{API_KEY_ENV}}}"
	}}
	handle @authorized {{
		reverse_proxy {upstream} {{
			# Server-sent events go out as they come; no response timeout cuts a long answer.
			flush_interval -1
		}}
	}}

	handle /v1/* {{
		header WWW-Authenticate "Bearer"
		respond "unauthorized: send Authorization: Bearer <apiKey>" 401
	}}

	# /invocations, /tokenize, /detokenize, /pause, /resume, /update_weights, /metrics, ...
	handle {{
		respond "not found" 404
	}}
}}
"""


def caddy_dropin() -> str:
    return f"""[Service]
EnvironmentFile={GATEWAY_ENV_FILE}
# The packaged unit runs "caddy run --environ", which prints the environment (the key) to the
# journal: run it without.
ExecStart=
ExecStart=/usr/bin/caddy run --config /etc/caddy/Caddyfile --adapter caddyfile
ExecReload=
"""
