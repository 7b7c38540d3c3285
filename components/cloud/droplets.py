"""The Droplet platform's wiring (`platform: droplet`, the default): the checks that refuse
before anything is created, the site, the endpoint, the outputs. __main__.py calls
`build()` for such a stack, as it calls kube/platform.py for a Kubernetes one."""

from __future__ import annotations

from ..spec.schema import StackConfig
from . import dns, endpoint, outputs, runner, stack_config
from .site import plan_site


def build(cfg: StackConfig) -> None:
    """Declare the GPU Droplets and their entry (a fixed `replicas` count), and export the
    outputs."""
    dns.check_zone(cfg)
    # The machine running `pulumi up` (a GitHub-hosted runner too) must reach the Droplets' SSH.
    runner.check(cfg)
    # Where it goes, what it keeps, what the entry costs: refused here before anything is created.
    site = plan_site(cfg)
    # The key every request needs: given as a secret, or made once per stack.
    api_key = stack_config.api_key_or_new()
    built = endpoint.build(cfg, site.placement, site.cache_plans, site.live, api_key)
    outputs.export(cfg, site, built, api_key)
