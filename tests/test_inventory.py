"""nemodrop/inventory.py: which of an account's resources are a stack's, by the program's own
names and tags, read from the fake DigitalOcean API on loopback."""

from __future__ import annotations

from pathlib import Path

from stack.do_api import Account, DigitalOceanAPI

from components import validate
from components.spec import catalog
from components.spec.schema import StackConfig
from nemodrop import inventory
from nemodrop.clients import digitalocean

ROOT = Path(__file__).resolve().parent.parent


def dev() -> StackConfig:
    problems, cfg = validate.file_problems("dev", ROOT / "stacks")
    assert cfg is not None, problems
    return cfg


def test_the_stacks_droplets_by_tag_with_their_roles() -> None:
    cfg = dev()
    account = Account()
    replica = [catalog.PROJECT, cfg.stack_tag, cfg.replica_tag]
    account.add_droplet(cfg.replica_name(0), "gpu-h100x1-80gb", tags=replica)
    account.add_droplet(cfg.balancer_name, "s-1vcpu-1gb",
                        tags=[cfg.stack_tag, cfg.balancer_tag])  # fmt: skip
    account.add_droplet("by-hand", "s-1vcpu-1gb", tags=[cfg.stack_tag])
    account.add_droplet("other-stack", "gpu-h100x1-80gb", tags=["stack:prod"])
    token = account.add_full_access_token("user")
    with DigitalOceanAPI(account) as api:
        found = inventory.droplets(digitalocean.api(api.url, token), cfg)
        asked = [(r.path, r.query) for r in api.requests]
    roles = {d.name: d.role for d in found}
    assert roles == {"nemotron-dev": "replica", "nemotron-dev-lb": "front", "by-hand": "other"}
    # GPU Droplets are listed only with type=gpus, which takes no tag_name (droplets/
    # parameters.yml droplet_type); the tag, with its colon, goes as it is.
    assert ("/v2/droplets", {"type": ["gpus"], "per_page": ["200"]}) in asked
    assert ("/v2/droplets", {"tag_name": ["stack:dev"], "per_page": ["200"]}) in asked


def test_volumes_by_the_stacks_tag_or_the_programs_name() -> None:
    cfg = dev()
    account = Account()
    account.add_volume("nemotron-dev-cache", 50)  # adopted from before the tag: by its name
    account.add_volume("tagged", 10, tags=["stack:dev"])
    account.add_volume("nemotron-prod-cache", 50, tags=["stack:prod"])
    account.month_to_date_usage = "7.50"
    token = account.add_full_access_token("user")
    with DigitalOceanAPI(account) as api:
        do = digitalocean.api(api.url, token)
        names = {v.name for v in inventory.volumes(do, cfg)}
        usage = inventory.balance(do)
    assert names == {"nemotron-dev-cache", "tagged"}
    assert usage == (7.5, "")
