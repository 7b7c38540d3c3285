"""The waker's journal: one JSON line per event, and its times as people read them."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any


def log(event: str, **fields: Any) -> None:
    """One JSON line per event, on stdout (the journal)."""
    line = {"event": event, "at": round(time.time(), 3), **fields}
    print(json.dumps(line, sort_keys=True), flush=True)


def iso(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
