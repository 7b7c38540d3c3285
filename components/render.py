"""Write, for a stack, the exact script each bootstrap phase will run, without a cloud account.

    python -m components.render --stack dev            # into ./rendered/dev/
    python -m components.render --stack prod --out /tmp/prod
    python -m components.render --stack dev --replicas 3  # replica 0's, and the balancer's

Each file is what `pulumi up` sends on stdin to `bash -s` for that phase, except what is known
only at deploy time: the secrets (placeholders), the Droplet's address (203.0.113.10, which the
gateway's certificate is for unless the stack names a domain), for reboot-wait, the boot id
before the reboot, and, with a cache, that the Droplet's region sells Volumes. With replicas the
phases are replica 0's (its private address 10.110.0.2, the others' after it), and with the
Caddy balancer its Droplet's phases follow as balancer-*.sh (replica 0 joining; the front's own
private address, where the cache-aware router asks the replicas' render route, 10.110.0.20).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .host import autodown, gateway, phase_settings, phases
from .spec import config, volume
from .spec.schema import StackConfig

ROOT = Path(__file__).resolve().parent.parent
# The Droplet's address is known only once it exists; renders name the gateway for this one.
HOST_PLACEHOLDER_IP = "203.0.113.10"
# With replicas: their private addresses, in order, and the balancer's Reserved IP.
PRIVATE_PLACEHOLDER_IPS = tuple(f"10.110.0.{2 + i}" for i in range(8))
# The Caddy front's private address: a replica's gateway admits the render route from it alone
# when the front runs the cache-aware router (balancer.routing).
FRONT_PRIVATE_PLACEHOLDER_IP = "10.110.0.20"
RESERVED_PLACEHOLDER_IP = "203.0.113.201"
PLACEHOLDER_DROPLET_ID = "424242"


def stack_raw(stack: str, stacks: Path = ROOT / "stacks") -> tuple[dict[str, Any], frozenset[str]]:
    """A stack file's config under our namespace, and which keys are secrets."""
    path = stacks / f"Pulumi.{stack}.yaml"
    if not path.exists():
        raise SystemExit(f"error: no stack file {path}")
    data = config.read_stack_file(path)
    prefix = f"{config.NAMESPACE}:"
    raw: dict[str, Any] = {}
    secret: set[str] = set()
    for key, value in (data.get("config") or {}).items():
        if key.startswith(prefix):
            name = key[len(prefix) :]
            raw[name], hidden = _without_secrets(value)
            if hidden:
                secret.add(name)
    return raw, frozenset(secret)


def _without_secrets(value: Any) -> tuple[Any, bool]:
    """Replace encrypted values (`secure: ...`, at any depth) with a placeholder."""
    if isinstance(value, dict):
        if set(value) == {"secure"}:
            return phase_settings.SECRET_PLACEHOLDER, True
        items = {k: _without_secrets(v) for k, v in value.items()}
        return {k: v for k, (v, _) in items.items()}, any(h for _, h in items.values())
    return value, False


def placeholders(cfg: StackConfig, has_hf_token: bool, host_ip: str) -> dict[str, Any]:
    """Every deploy-time input a phase may read (Inputs fields), as a render shows it: secrets
    as placeholders, the addresses from the documentation ranges above. Each phase takes the
    ones its row names (phases.py)."""
    values: dict[str, Any] = {
        "hf_token": phase_settings.SECRET_PLACEHOLDER if has_hf_token else "",
        "api_key": phase_settings.SECRET_PLACEHOLDER,
        "host": gateway.hostname(cfg, host_ip),
        "cache_device": volume.device_path(cfg) if cfg.cache.enabled else "",
        "reboot_result": {"rebooting": True, "boot_id": "<boot id before the reboot>"},
        "dns_record": "",
        "private_ip": PRIVATE_PLACEHOLDER_IPS[0] if cfg.pooled else "",
        # Replica 0 reads every replica's /metrics (autodown).
        "metrics_reader": PRIVATE_PLACEHOLDER_IPS[0] if cfg.pooled else "",
        "render_client": FRONT_PRIVATE_PLACEHOLDER_IP if cfg.routing == "cache-aware" else "",
        # Each other replica: its Droplet id (a number, as autodown requires) and address.
        "peers": [
            autodown.Peer(f"{PLACEHOLDER_DROPLET_ID}{i}", PRIVATE_PLACEHOLDER_IPS[i])
            for i in range(1, cfg.replicas)
        ],
        "droplet_id": "<droplet-id>",
    }
    return values


def render_stack(stack: str, out: Path, replicas: int | None = None) -> list[Path]:
    raw, secret = stack_raw(stack)
    if replicas is not None:
        raw["replicas"] = replicas
    cfg = config.parse(raw, stack, secret)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    replica = 0 if cfg.pooled else None
    values = placeholders(cfg, "hfToken" in raw, HOST_PLACEHOLDER_IP)
    for index, phase in enumerate(phases.BOOTSTRAP, start=1):
        inputs = {name: values[name] for name in phases.wanted(phase, replica)}
        settings = phase.settings(cfg, phase_settings.Inputs(**inputs, replica=replica))
        path = out / f"{index:02d}-{phase.name}.sh"
        path.write_text(phases.render(phase.name, settings, phases.minutes(cfg, phase)))
        written.append(path)
    if cfg.pooled and cfg.balancer_kind == "caddy":
        values = placeholders(cfg, "hfToken" in raw, RESERVED_PLACEHOLDER_IP)
        for index, phase in enumerate(phases.BALANCER, start=1):
            inputs = {name: values[name] for name in phase.inputs}
            settings = phase.settings(cfg, phase_settings.Inputs(**inputs, replica=0))
            path = out / f"balancer-{index}-{phase.name}.sh"
            path.write_text(phases.render(phase.name, settings, phases.minutes(cfg, phase)))
            written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--stack", required=True, help="stack name: stacks/Pulumi.<stack>.yaml")
    parser.add_argument("--out", type=Path, help="folder to write into (default rendered/<stack>)")
    parser.add_argument(
        "--replicas", type=int, help="render as with this many replicas (the stack's: unset)"
    )
    args = parser.parse_args(argv)
    try:
        written = render_stack(
            args.stack, args.out or ROOT / "rendered" / args.stack, args.replicas
        )
    except config.ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
