"""Write, for a stack, the exact script each bootstrap phase will run, without a cloud account.

    python -m components.render --stack dev            # into ./rendered/dev/
    python -m components.render --stack prod --out /tmp/prod

Each file is what `pulumi up` sends on stdin to `bash -s` for that phase, except what is known
only at deploy time: the secrets (placeholders), the Droplet's address (203.0.113.10, which the
gateway's certificate is for unless the stack names a domain), for reboot-wait, the boot id
before the reboot, and, with a cache, that the Droplet's region sells Volumes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from . import bootstrap, cache, config, gateway, phase_settings

ROOT = Path(__file__).resolve().parent.parent
# The Droplet's address is known only once it exists; renders name the gateway for this one.
HOST_PLACEHOLDER_IP = "203.0.113.10"


def stack_raw(stack: str) -> tuple[dict[str, Any], frozenset[str]]:
    """A stack file's config under our namespace, and which keys are secrets."""
    path = ROOT / "stacks" / f"Pulumi.{stack}.yaml"
    if not path.exists():
        raise SystemExit(f"error: no stack file {path.relative_to(ROOT)}")
    data = yaml.safe_load(path.read_text()) or {}
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


def render_stack(stack: str, out: Path) -> list[Path]:
    raw, secret = stack_raw(stack)
    cfg = config.parse(raw, stack, secret)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for index, phase in enumerate(bootstrap.PHASES, start=1):
        name = phase.name
        extra: dict[str, Any] = {}
        if name == "model":
            extra["hf_token"] = phase_settings.SECRET_PLACEHOLDER if "hfToken" in raw else ""
        if name in ("service", "gateway"):
            extra["api_key"] = phase_settings.SECRET_PLACEHOLDER
        if name in ("gateway", "ready"):
            extra["host"] = gateway.hostname(cfg, HOST_PLACEHOLDER_IP)
        if name in bootstrap.STATIC_INPUTS and cfg.cache.enabled:
            extra["cache_device"] = cache.device_path(cfg)
        if name == "reboot-wait":
            extra["reboot_result"] = {"rebooting": True, "boot_id": "<boot id before the reboot>"}
        path = out / f"{index:02d}-{name}.sh"
        minutes = bootstrap.phase_minutes(cfg, phase)
        path.write_text(
            bootstrap.render(name, phase_settings.settings(cfg, name, **extra), minutes)
        )
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--stack", required=True, help="stack name: stacks/Pulumi.<stack>.yaml")
    parser.add_argument("--out", type=Path, help="folder to write into (default rendered/<stack>)")
    args = parser.parse_args(argv)
    try:
        written = render_stack(args.stack, args.out or ROOT / "rendered" / args.stack)
    except config.ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
