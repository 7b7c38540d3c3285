"""The cache Volume's name and where it appears on a Droplet: naming from the config alone.

One source for the cloud Volume (cloud/cache.py creates and finds it by this name), the cache
phase's settings (the device it formats and mounts) and the offline render, which so needs no
Pulumi provider.
"""

from __future__ import annotations

import hashlib
import re

from . import catalog
from .schema import StackConfig

# DigitalOcean's rule for a Volume's name: lowercase letters, digits and "-", a letter first, at
# most 64 characters (digitalocean/openapi specification/resources/volumes/models/
# volume_base.yml, `name`; the provider's digitalocean_volume docs say the same).
VOLUME_NAME_MAX = 64
VOLUME_NAME = re.compile(r"^[a-z][a-z0-9-]{0,63}$")
# Hex digits of sha256(base) in a name whose base had to be cut.
NAME_HASH_CHARS = 8


def volume_name(cfg: StackConfig, replica: int = 0) -> str:
    """Replica `replica`'s cache Volume name: `<droplet.name>[-<replica>]-cache`, lowercased,
    other characters as "-", a letter first. It is how the Volume is found again (and adopted)
    after a destroy, so a name that fits is never changed. One that does not keeps its suffix
    and loses the end of the base instead, which a short hash of the whole base replaces: two
    long names that share a prefix, or two replicas, never get the same Volume."""
    base = re.sub(r"[^a-z0-9-]", "-", cfg.droplet_name.lower())
    if not base[:1].isalpha():
        base = f"n-{base}"
    tail = f"-{replica}-cache" if replica else "-cache"
    if len(base) + len(tail) <= VOLUME_NAME_MAX:
        return base + tail
    digest = hashlib.sha256(base.encode()).hexdigest()[:NAME_HASH_CHARS]
    keep = VOLUME_NAME_MAX - len(tail) - NAME_HASH_CHARS - 1
    return f"{base[:keep]}-{digest}{tail}"


def device_path(cfg: StackConfig, replica: int = 0) -> str:
    """Where the attached Volume appears on the Droplet."""
    return f"{catalog.VOLUME_DEVICE_PREFIX}{volume_name(cfg, replica)}"
