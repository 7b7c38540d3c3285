"""One emulated deployment: the world, the outside services, the account and a stack of the
real program, put together for a scenario test; and the line each scenario prints (contract:
`stack: <scenario> hosts=<H> ran=<N> unchanged=<U> requests=<R> failed=<F>`, then how long each
phase took)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pulumi_harness import DEFAULT_OFFERS

from components import catalog
from stack import internet, net
from stack.acme_ca import ACMECA
from stack.cloud import Account
from stack.commands import RemoteCommands
from stack.deploy import Result, Stack

# The names Caddy's default ACME issuers are reached at (Let's Encrypt, then ZeroSSL).
LETS_ENCRYPT = ("acme-v02.api.letsencrypt.org", "acme.zerossl.com")


@dataclass
class Emulation:
    world: net.World
    account: Account
    commands: RemoteCommands
    workdir: Path
    downloads: internet.Internet
    ca: ACMECA
    # Where the Hub serves the stack's model (config.json, the weights).
    model_urls: list[str]
    stacks: dict[str, Stack] = field(default_factory=dict)
    requests: int = 0
    failed_requests: int = 0

    def stack(self, name: str) -> Stack:
        if name not in self.stacks:
            providers = {
                "digitalocean:": self.account,
                "tls:": self.account,
                "random:": self.account,
                "command:": self.commands,
            }
            self.stacks[name] = Stack(name, providers, self.account)
        return self.stacks[name]


@contextlib.contextmanager
def emulation(
    workdir: Path,
    offers: dict[str, dict[str, Any]] | None = None,
    model: str = catalog.DEFAULT_MODEL,
) -> Iterator[Emulation]:
    """A world with the outside services a deployment talks to: the downloads at their real
    names (internet.py), Let's Encrypt (acme_ca.py, validating from the internet), and the
    account. Everything goes when the block ends, whatever happened in it."""
    with net.running_world() as world, contextlib.ExitStack() as services:
        downloads = internet.Internet(world)
        services.callback(downloads.close)
        downloads.add_miniforge()
        downloads.add_caddy()
        downloads.add_cuda_keyring()
        model_urls = downloads.add_model(model)
        ca = ACMECA(host=net.ACME_CA, port=443, netns=world.name, names=LETS_ENCRYPT)
        services.callback(ca.stop)
        account = Account(world, workdir, offers or DEFAULT_OFFERS)
        roots = [downloads.root_pem, ca.root_pem]
        account.prepare_box.append(lambda box: internet.prepare(box, internet.SERVICES, roots))
        commands = RemoteCommands(world, workdir, downloads.substitutions())
        emu = Emulation(world, account, commands, workdir, downloads, ca, model_urls)
        try:
            yield emu
        finally:
            for machine in list(account.machines.values()):
                machine.stop.set()
                machine.sshd.stop()
                machine.box.stop_services()


def summary(scenario: str, emu: Emulation, results: list[Result]) -> str:
    """The scenario's line (hosts: the Droplets it made), then how long each phase took the
    last time it ran."""
    ran = unchanged = 0
    seconds: dict[str, float] = {}
    for r in results:
        for s in r.steps:
            if not s.type.startswith("command:"):
                continue
            if s.op in ("create", "update", "replace"):
                ran += 1
                seconds[s.urn.rsplit("::", 1)[1]] = s.seconds
            elif s.op == "same":
                unchanged += 1
    hosts = sum(1 for r in results for s in r.steps if s.op in ("create", "replace")
                and s.type == "digitalocean:index/droplet:Droplet")  # fmt: skip
    failed = sum(1 for r in results if r.error is not None) + emu.failed_requests
    lines = [
        f"stack: {scenario} hosts={hosts} ran={ran} unchanged={unchanged} "
        f"requests={emu.requests} failed={failed}"
    ]
    lines += [f"  {name}: {sec:.1f}s" for name, sec in seconds.items()]
    return "\n".join(lines)
