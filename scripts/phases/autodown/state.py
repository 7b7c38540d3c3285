"""The state file (one JSON object, saved each run) and the first-bootstrap record. A file of
any shape is reset, never fatal; times in the future (a clock that jumped back) are clamped."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .run import log

DROPLET_ID = re.compile(r"[0-9]{1,20}")
# A first-bootstrap time further ahead than this is a broken clock or file, not a time.
CLOCK_SKEW = 300.0


def fresh(now: float) -> dict[str, Any]:
    return {
        "started_at": now,
        "last_activity": now,
        "counters": None,
        "deleted": False,
        # A delete began (the rule decided it, not a dry run): later runs finish it whatever the
        # metrics say (a deleted peer's metrics can no longer be read, which counts as busy).
        "deleting": False,
        "record_deleted": False,
        # The other replicas this rule has deleted (by id): a later run deletes only the rest.
        "peers_deleted": [],
        # This replica's own metrics were read once: its bootstrap is over.
        "served": False,
        # Per metrics URL, when it began to be unreadable (cleared when it answers).
        "unreadable_since": {},
    }


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _flag(value: object) -> bool:
    return isinstance(value, bool)


def _ids(value: object) -> bool:
    return isinstance(value, list) and all(
        isinstance(i, str) and DROPLET_ID.fullmatch(i) for i in value
    )


def _numbers(value: object) -> bool:
    """A JSON object of numbers: the saved counters, or per URL when it became unreadable."""
    return isinstance(value, dict) and all(
        isinstance(k, str) and _number(v) for k, v in value.items()
    )


KINDS: dict[str, Callable[[object], bool]] = {
    "deleted": _flag,
    "record_deleted": _flag,
    "deleting": _flag,
    "peers_deleted": _ids,
    "served": _flag,
    "unreadable_since": _numbers,
}


def load(path: Path, now: float) -> tuple[dict[str, Any], str | None]:
    """The saved state, or a fresh one with the reason when the file is missing or odd. Times in
    the future (a clock that jumped back) are clamped to now: they would hold the idle rule off."""
    try:
        raw: object = json.loads(path.read_text())
    except FileNotFoundError:
        return fresh(now), None
    except (OSError, ValueError) as err:
        return fresh(now), f"state file unreadable ({type(err).__name__}), reset"
    state = fresh(now)
    if not isinstance(raw, dict):
        return state, f"state file held {type(raw).__name__}, not an object: reset"
    odd = []
    if "started_at" not in raw and "installed_at" in raw:
        raw["started_at"] = raw["installed_at"]  # written by earlier releases
    for key in ("started_at", "last_activity"):
        if _number(raw.get(key)):
            state[key] = min(float(raw[key]), now)
        else:
            odd.append(key)
    counters = raw.get("counters")
    if isinstance(counters, dict) and _numbers(counters):
        state["counters"] = {k: float(v) for k, v in counters.items()}
    elif counters is not None:
        odd.append("counters")
    for key, valid in KINDS.items():
        if key in raw and valid(raw[key]):
            state[key] = raw[key]
        elif key in raw:
            odd.append(key)
    # Clamped like the times above; an earlier release's state with a reading had served.
    state["unreadable_since"] = {k: min(v, now) for k, v in state["unreadable_since"].items()}
    state["served"] = state["served"] or ("served" not in raw and state["counters"] is not None)
    return state, (f"state file had odd {', '.join(odd)}: reset" if odd else None)


def save(path: Path, state: dict[str, Any]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(path)
    except OSError as err:
        log(f"could not save the state ({type(err).__name__}); the next run starts afresh")


def first_bootstrap(path: Path, state: dict[str, Any], now: float) -> tuple[float, str]:
    """When this Droplet's first bootstrap ran: max hours counts from it. The file survives a
    lost state file; without it, the earliest time this rule has seen."""
    try:
        value = float(path.read_text().strip())
        if math.isfinite(value) and 0 < value <= now + CLOCK_SKEW:
            return min(value, now), "first bootstrap"
    except (OSError, ValueError):
        pass
    return float(state["started_at"]), "first autodown run"
