"""The stack's configuration: what a stack asks for (schema.py, its pydantic models), how it
is checked before anything is created (config.py), what is known regardless of any stack
(catalog.py: sizes, prices, versions, paths, slugs) and the names derived from it (volume.py:
the cache Volume's). Imports no Pulumi at all (cloud/stack_config.py reads the running stack's
keys from the engine) and nothing of host/ or cloud/."""
