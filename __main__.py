"""nemotron-droplet: a private OpenAI-compatible Nemotron endpoint on DigitalOcean: GPU Droplets
(`platform: droplet`, the default) or a DOKS cluster (`platform: kubernetes`).

Thin wiring only: validate the config (nothing is declared if it is wrong), then build the
stack's platform, which plans, declares and exports what a user needs.
"""

from components.cloud import droplets, stack_config
from components.cloud.kube import platform

cfg = stack_config.load()
if cfg.platform == "kubernetes":
    platform.build(cfg)
else:
    droplets.build(cfg)
