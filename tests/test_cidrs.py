"""Which source networks can reach the Droplet (components/spec/cidrs.py): public networks and
everywhere accepted by the program, and no placeholder range in the shipped stacks. (The ranges
it refuses, each named: test_config.py's REJECTED.)"""

from __future__ import annotations

from pulumi_harness import (
    run_program,
    stack_config,
)
from test_droplet import EVERYWHERE, OFFICE, dev

from components.spec import cidrs


def test_public_networks_and_anywhere_are_accepted() -> None:
    run = run_program(
        dev(access={"sshCidrs": [OFFICE, "8.8.8.8", "2a00:1450::/32"], "apiCidrs": EVERYWHERE})
    )
    assert run.error is None, run.error


def test_the_shipped_stacks_carry_no_placeholder_ranges() -> None:
    for stack in ("dev", "prod"):
        access = stack_config(stack)["access"]
        for cidr in access["apiCidrs"] + access["sshCidrs"]:
            assert cidrs.unreachable(cidr) is None, (stack, cidr)
