"""The nemotron-droplet Pulumi program: config, catalog and one component per real thing."""
