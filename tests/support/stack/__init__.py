"""The stack emulation: an offline `pulumi up` of whole stacks (issue 22)."""
