"""The fake apt archive the fake apt-get and apt-cache answer from: which packages exist for this
(fake) Ubuntu 24.04 host, at which versions, newest first."""
import os
import re
from pathlib import Path

HW = Path("/var/lib/fakehw")
KERNEL = os.uname().release


def versions(name: str) -> list[str]:
    driver = re.fullmatch(r"nvidia-driver-(\d+)-server(-open)?", name)
    if driver:
        return [f"{driver.group(1)}.159.04-0ubuntu0.24.04.1"]
    fabric = re.fullmatch(r"nvidia-fabricmanager-(\d+)", name)
    if fabric:
        # An older build beside the current one: only the driver's exact version will do.
        return [f"{fabric.group(1)}.159.04-0ubuntu0.24.04.1", f"{fabric.group(1)}.95.05-0ubuntu0.24.04.1"]
    modules = re.fullmatch(r"linux-modules-nvidia-(\d+)-server(-open)?-(.+)", name)
    if modules:
        if modules.group(3) != KERNEL or (HW / "no_precompiled_modules").exists():
            return []
        return [f"{KERNEL}-1"]
    if name == "caddy":
        if (HW / "caddy_not_packaged").exists() and not Path("/etc/apt/sources.list.d/caddy-stable.list").exists():
            return []
        return ["2.6.2-6ubuntu0.24.04.3"]
    if re.fullmatch(r"[a-z0-9][a-z0-9.+-]*", name):
        return ["1.0-1"]
    return []


def candidate(name: str, version: str | None = None) -> str | None:
    found = versions(name)
    if version is None:
        return found[0] if found else None
    return version if version in found else None
