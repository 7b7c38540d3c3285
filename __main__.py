"""nemotron-droplet: a private OpenAI-compatible Nemotron endpoint on a DigitalOcean GPU Droplet.

Thin wiring only: validate the config (nothing is declared if it is wrong), place the size,
build the components, export what a user needs.
"""

import pulumi

from components import config, region
from components.bootstrap import Bootstrap, BootstrapArgs
from components.droplet import GpuDroplet, GpuDropletArgs, ssh_command

cfg = config.load()
placement = region.choose(cfg.droplet.size, cfg.droplet.regions, region.lookup(cfg.droplet.size))

gpu = GpuDroplet(
    "gpu",
    GpuDropletArgs(
        name=cfg.droplet_name,
        size=cfg.droplet.size,
        region=placement.region,
        image=cfg.image,
        tags=cfg.tags,
        monitoring=cfg.droplet.monitoring,
        ssh_cidrs=cfg.access.ssh_cidrs,
        api_cidrs=cfg.access.api_cidrs,
        extra_ssh_keys=cfg.access.ssh_key_fingerprints,
    ),
)

bootstrap = Bootstrap(
    "bootstrap",
    BootstrapArgs(
        config=cfg,
        host=gpu.ipv4,
        private_key=gpu.private_key_openssh,
        hf_token=config.hf_token(),
    ),
)

pulumi.export("ipv4", gpu.ipv4)
pulumi.export("region", placement.region)
pulumi.export("size", cfg.droplet.size)
pulumi.export("hourlyPriceUsd", placement.offer.price_hourly)
pulumi.export("servedModelName", cfg.model.served_name)
pulumi.export("sshCommand", gpu.ipv4.apply(lambda ip: ssh_command(cfg.stack, ip)))
pulumi.export("sshPrivateKey", gpu.private_key_openssh)
pulumi.export("bootstrapSeconds", bootstrap.seconds)
