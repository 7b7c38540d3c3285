"""nemotron-droplet: a private OpenAI-compatible Nemotron endpoint on a DigitalOcean GPU Droplet.

Thin wiring only: validate the config (nothing is declared if it is wrong), plan the site,
build the components, export what a user needs.
"""

import pulumi
import pulumi_random as random

from components.cloud import dns, endpoint, outputs, runner, stack_config
from components.cloud.site import plan_site

cfg = stack_config.load()
dns.check_zone(cfg)
# The machine running `pulumi up` (a GitHub-hosted runner too) must reach the Droplets' SSH.
runner.check(cfg)
# Where it goes, what it keeps, what the entry costs: refused here before anything is created.
site = plan_site(cfg)

# The key every request needs: given as a secret, or made once per stack.
api_key: pulumi.Output[str] = pulumi.Output.secret(
    stack_config.api_key() or random.RandomPassword("api-key", length=48, special=False).result
)

built = endpoint.build(cfg, site.placement, site.cache_plans, site.live, api_key)
outputs.export(cfg, site, built, api_key)
