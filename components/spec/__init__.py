"""The stack's configuration: what a stack asks for (schema.py, its pydantic models), how it
is read and checked before anything is created (config.py), and what is known regardless of
any stack (catalog.py: sizes, prices, versions, paths, slugs). Imports neither Pulumi resources
nor anything of host/ or cloud/."""
