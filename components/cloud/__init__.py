"""The cloud resources, each a Pulumi component: what creates something in the account (and
may bill): the GPU Droplets and their bootstrap Commands, the entry (a Caddy balancer Droplet or
a managed Load Balancer), DNS, the cache Volumes, the placement they share (site.py, region.py)
and the stack's outputs; and the running stack's config as the engine passes it
(stack_config.py). Reads spec/ and host/."""
