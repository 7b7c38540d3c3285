"""The fake apt archive the fake apt-get and apt-cache answer from: which packages exist for this
(fake) Ubuntu 24.04 host, at which versions, newest first."""

import os
import re
from pathlib import Path

HW = Path("/var/lib/fakehw")
KERNEL = os.uname().release


def _driver(m: re.Match[str]) -> list[str]:
    return [f"{m.group(1)}.159.04-0ubuntu0.24.04.1"]


def _fabric_manager(m: re.Match[str]) -> list[str]:
    # An older build beside the current one: only the driver's exact version will do.
    return [f"{m.group(1)}.159.04-0ubuntu0.24.04.1", f"{m.group(1)}.95.05-0ubuntu0.24.04.1"]


def _precompiled_modules(m: re.Match[str]) -> list[str]:
    if m.group(3) != KERNEL or (HW / "no_precompiled_modules").exists():
        return []
    return [f"{KERNEL}-1"]


FAMILIES = (
    (r"nvidia-driver-(\d+)-server(-open)?", _driver),
    (r"nvidia-fabricmanager-(\d+)", _fabric_manager),
    (r"linux-modules-nvidia-(\d+)-server(-open)?-(.+)", _precompiled_modules),
    (r"[a-z0-9][a-z0-9.+-]*", lambda _: ["1.0-1"]),
)


def versions(name: str) -> list[str]:
    for pattern, answer in FAMILIES:
        match = re.fullmatch(pattern, name)
        if match:
            return answer(match)
    return []


def candidate(name: str, version: str | None = None) -> str | None:
    found = versions(name)
    if version is None:
        return found[0] if found else None
    return version if version in found else None
