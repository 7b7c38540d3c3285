"""One emulated deployment: the world, the outside services, the account and a stack of the
real program, put together for a scenario test; and the line each scenario prints (contract:
`stack: <scenario> hosts=<H> ran=<N> unchanged=<U> requests=<R> failed=<F>`, then how long each
phase took)."""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import yaml
from pulumi_harness import DEFAULT_OFFERS

from components.spec import catalog
from stack import do_api, github_api, internet, net
from stack.acme_ca import ACMECA
from stack.cloud import Account
from stack.commands import RemoteCommands
from stack.deploy import ROOT, Result, Stack

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
    # DigitalOcean's API at api.digitalocean.com (do_api.py), on the account's own Droplets:
    # what autodown calls from the hosts. Tokens: api.account.add_token(name, scopes).
    api: do_api.DigitalOceanAPI
    # GitHub's API at api.github.com (github_api.py): the deploy workflow a wake dispatches.
    github: github_api.GitHub
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


# deploy.yml's last step: what a failed or cancelled up made is deleted (lease.py --failed-up).
CLEAN_UP_STEP = "Delete the GPU Droplets this failed up made"


def clean_up_failed_up(
    emu: Emulation, stack: str, since: float, token: str
) -> subprocess.CompletedProcess[str]:
    """deploy.yml's clean-up step as a runner on the internet runs it: the step's own `run:`
    line under bash, its environment as the step sets it (the deploy's token, the stack, the
    run's start), api.digitalocean.com at its world address and trusted as the internet's CA
    signs it (a private /etc/hosts in the command's own mount namespace)."""
    steps = yaml.safe_load((ROOT / ".github" / "workflows" / "deploy.yml").read_text())
    [step] = [s for s in steps["jobs"]["deploy"]["steps"] if s.get("name") == CLEAN_UP_STEP]
    hosts, roots = emu.workdir / "runner-hosts", emu.workdir / "runner-roots.pem"
    hosts.write_text(f"{net.DO_API} api.digitalocean.com\n")
    roots.write_text(emu.downloads.root_pem)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "SSL_CERT_FILE": str(roots),
        "GITHUB_STEP_SUMMARY": str(emu.workdir / "runner-summary.md"),
        "DIGITALOCEAN_TOKEN": token,
        "STACK": stack,
        "SINCE": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(since)),
    }
    script = 'mount --bind "$0" /etc/hosts && exec "$@"'
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(hosts),
            "bash", "-c", step["run"]]  # fmt: skip
    return subprocess.run(emu.world.argv(argv), cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=step["timeout-minutes"] * 60, check=False)  # fmt: skip


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
        downloads.add_uv()
        downloads.add_cuda_keyring()
        model_urls = downloads.add_model(model)
        ca = ACMECA(host=net.ACME_CA, port=443, netns=world.name, names=LETS_ENCRYPT)
        services.callback(ca.stop)
        account = Account(world, workdir, offers or DEFAULT_OFFERS)
        # DigitalOcean issues its Load Balancers' certificates from Let's Encrypt too.
        account.issue_certificate = ca.authority.issue
        roots = [downloads.root_pem, ca.root_pem]
        account.prepare_box.append(lambda box: internet.prepare(box, internet.SERVICES, roots))
        api = serve_api(world, downloads)
        services.callback(api.stop)
        account.serve_api(api.account)
        github = github_api.GitHub("me/llm", "deploy.yml", f"github_pat_{secrets.token_hex(20)}")
        sock, context = tls_listener(world, downloads, "api.github.com", net.GITHUB_API)
        server = github_api.serve(github, sock, context)
        services.callback(server.server_close)
        services.callback(server.shutdown)
        commands = RemoteCommands(world, workdir, downloads.substitutions())
        emu = Emulation(world, account, commands, workdir, downloads, ca, model_urls, api, github)
        try:
            yield emu
        finally:
            for machine in list(account.machines.values()):
                machine.stop.set()
                machine.sshd.stop()
                machine.box.stop_services()


def serve_api(world: net.World, internet_: internet.Internet) -> do_api.DigitalOceanAPI:
    """DigitalOcean's API over HTTPS at its name's world address (net.DO_API)."""
    sock, context = tls_listener(world, internet_, "api.digitalocean.com", net.DO_API)
    try:
        return do_api.DigitalOceanAPI(do_api.Account(), sock=sock, tls=context)
    except BaseException:
        sock.close()
        raise


def tls_listener(
    world: net.World, internet_: internet.Internet, name: str, address: str
) -> tuple[socket.socket, ssl.SSLContext]:
    """A socket listening on `address`:443 in the world, and a server context with a
    certificate for `name` from the CA the hosts trust for the other outside services."""
    chain, key = internet_.ca.issue([name])
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    with tempfile.TemporaryDirectory(prefix="tls-") as tmp:  # read at once, then gone
        (Path(tmp) / "chain.pem").write_text(chain)
        (Path(tmp) / "key.pem").write_bytes(key)
        context.load_cert_chain(Path(tmp) / "chain.pem", Path(tmp) / "key.pem")
    sock = world.call(socket.socket)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, 443))
        sock.listen(64)
    except BaseException:
        sock.close()
        raise
    return sock, context


class Load:
    """A user's client of the endpoint, from the internet: the official OpenAI Python client
    with its defaults (it retries a connection error or a 5xx twice, openai-python
    _base_client.py), sending chat completions one after the other on `streams` threads for as
    long as the block lasts. A call that raises counts as failed, with what it was; `sent`
    counts every HTTP request, so sent - ok - failed is what the client retried."""

    def __init__(self, emu: Emulation, outputs: dict[str, Any], streams: int = 2) -> None:
        self.emu, self.streams = emu, streams
        self.base_url, self.key = str(outputs["endpoint"]), str(outputs["apiKey"])
        self.model = str(outputs["servedModelName"])
        self.bundle = emu.workdir / "load-roots.pem"
        self.bundle.write_text(emu.ca.root_pem)
        self.stop = threading.Event()
        self.ok = self.sent = 0
        self.failed: list[str] = []
        self.reported = (0, 0)  # calls and failures already added to the emulation's counts
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()

    def _count(self, _request: object) -> None:
        with self.lock:
            self.sent += 1

    def _loop(self) -> None:
        hooks = {"request": [self._count]}
        trust = ssl.create_default_context(cafile=str(self.bundle))
        http = openai.DefaultHttpxClient(verify=trust, event_hooks=hooks, timeout=60)
        client = openai.OpenAI(base_url=self.base_url, api_key=self.key, http_client=http)
        while not self.stop.is_set():
            try:
                answer = client.chat.completions.create(
                    model=self.model,
                    max_tokens=8,
                    messages=[{"role": "user", "content": "Say OK."}],
                )
                good, what = bool(answer.choices), "no choices"
            except openai.OpenAIError as err:
                good, what = False, f"{type(err).__name__}: {err}"
            with self.lock:
                if good:
                    self.ok += 1
                else:
                    self.failed.append(what)
        http.close()

    def __enter__(self) -> Load:
        self.stop.clear()
        for _ in range(self.streams):
            thread = threading.Thread(target=self.emu.world.call, args=(self._loop,), daemon=True)
            thread.start()
            self.threads.append(thread)
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=90)
        self.threads.clear()
        # What this block added (a Load may run several blocks).
        done, failed = self.ok + len(self.failed), len(self.failed)
        self.emu.requests += done - self.reported[0]
        self.emu.failed_requests += failed - self.reported[1]
        self.reported = (done, failed)


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
