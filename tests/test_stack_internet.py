"""The stack emulation's internet (tests/support/stack/internet.py): a Droplet (a host namespace and its
sandbox) downloads from the URLs the program renders, over HTTPS at their real names, trusting
only its system bundle; and the one setting the emulation substitutes."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pulumi_harness import stack_config
from sandbox import Sandbox, caddy_release_tarball
from stack.internet import (
    MODEL_CONFIG,
    SERVICES,
    SUBSTITUTED,
    SYSTEM_BUNDLE,
    Internet,
    _assignments,
    prepare,
    substitute,
)
from stack.net import ACME_CA, DO_API, DOWNLOADS, Host, World, namespaces, running_world

from components.host import phases
from components.spec import catalog, config

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not all(shutil.which(t) for t in ("ip", "unshare", "curl")),
    reason="needs root, iproute2, unshare and curl (./check installs them)",
)

PUBLIC = "203.0.113.21"
MODEL = catalog.DEFAULT_MODEL
MODEL_BASE = f"https://huggingface.co/{MODEL}/resolve/main"
# This machine's files a Droplet's are made from: they must not change.
MACHINE_FILES = ("/etc/hosts", "/etc/resolv.conf", SYSTEM_BUNDLE)


def dev_config() -> config.StackConfig:
    return config.parse(stack_config("dev"), "dev", frozenset({"autodown"}))


@dataclass
class Droplet:
    world: World
    host: Host
    box: Sandbox
    internet: Internet

    def run(self, script: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """bash with `script` on stdin, in the host's namespace and its sandbox: where sshd runs
        a phase (net.Sshd)."""
        return self.host.run(self.box.command("bash -s"), input=script, timeout=timeout)

    def curl(
        self, url: str, *options: str, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """curl as the phases call it (no -k, the system trust only) into /root/dl/got, then the
        sha256 of what arrived."""
        args = " ".join(options)
        return self.run(
            "mkdir -p /root/dl && rm -f /root/dl/got\n"
            f"curl --fail --silent --show-error --location {args} --output /root/dl/got '{url}'"
            " || exit $?\nsha256sum /root/dl/got | cut -d' ' -f1\n",
            timeout=timeout,
        )


@pytest.fixture
def droplet(tmp_path: Path) -> Iterator[Droplet]:
    before = {p: Path(p).read_bytes() for p in MACHINE_FILES if Path(p).exists()}
    tmp_before = set(Path("/tmp").iterdir())  # noqa: S108 (the shared /tmp the phases also see)
    with running_world() as world:
        internet = Internet(world)
        box = Sandbox(tmp_path / "disk")
        try:
            internet.add_all(MODEL)
            host = world.add_host("a", PUBLIC)
            prepare(box, SERVICES, [internet.root_pem])
            yield Droplet(world, host, box, internet)
        finally:
            box.stop_services()
            internet.close()
    # Nothing left: the run's namespaces, this machine's own files.
    assert not [ns for ns in namespaces() if ns.startswith(world.prefix)]
    assert {p: Path(p).read_bytes() for p in MACHINE_FILES if Path(p).exists()} == before
    left = set(Path("/tmp").iterdir()) - tmp_before  # noqa: S108
    assert not {p for p in left if p.name.startswith(("tmp.", "internet-"))}, left


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@needs_root
def test_the_catalog_urls_answer_over_https_with_the_system_trust_only(droplet: Droplet) -> None:
    internet = droplet.internet
    got = droplet.curl(catalog.MINIFORGE_URL)
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == internet.miniforge_sha256
    got = droplet.curl(catalog.CADDY_URL)
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == sha(caddy_release_tarball())
    assert internet.requests[catalog.MINIFORGE_URL] == internet.requests[catalog.CADDY_URL] == 1

    # What the gateway phase does with it: the binary inside is the pinned one, unchanged.
    caddy = droplet.run("tar -xzf /root/dl/got -C /root/dl caddy && sha256sum /root/dl/caddy")
    assert caddy.returncode == 0, caddy.stderr
    assert caddy.stdout.split()[0] == catalog.CADDY_SHA256

    # It is the appended root that makes it trusted: this machine's own bundle refuses it.
    droplet.box.file("/root/dl/machine.crt", Path(SYSTEM_BUNDLE).read_text())
    got = droplet.curl(catalog.MINIFORGE_URL, "--cacert /root/dl/machine.crt")
    assert got.returncode == 60, got.stderr  # CURLE_PEER_FAILED_VERIFICATION

    # The other services' names resolve to the World's addresses.
    lookup = droplet.run(
        "getent hosts acme-v02.api.letsencrypt.org api.digitalocean.com huggingface.co"
    )
    assert lookup.stdout.split()[::2] == [ACME_CA, DO_API, DOWNLOADS], lookup.stdout


@needs_root
def test_an_unknown_name_or_a_wrong_one_fails(droplet: Droplet) -> None:
    # Not in /etc/hosts: no resolver answers (and no query leaves the host).
    got = droplet.curl("https://pypi.org/simple/", "--connect-timeout 5", timeout=30)
    assert got.returncode == 6, got.stderr  # CURLE_COULDNT_RESOLVE_HOST
    # A name at the downloads address that its certificate does not name.
    got = droplet.curl("https://example.org/", f"--resolve example.org:443:{DOWNLOADS}")
    assert got.returncode == 60, got.stderr  # CURLE_PEER_FAILED_VERIFICATION
    # A Host header that is not the TLS server name: misdirected.
    got = droplet.curl(catalog.CADDY_URL, "-H 'Host: huggingface.co'")
    assert got.returncode == 22 and "421" in got.stderr, got.stderr
    # A path the host does not have.
    got = droplet.curl("https://github.com/no/such/release")
    assert got.returncode == 22 and "404" in got.stderr, got.stderr


@needs_root
def test_rendered_conda_and_model_phases_download_at_the_real_names(droplet: Droplet) -> None:
    """The conda phase with its rendered settings but its one substitution, then the model
    phase exactly as rendered (NEMO_HF_ENDPOINT empty: the fake hf asks https://huggingface.co)."""
    cfg, internet = dev_config(), droplet.internet
    conda = phases.render("conda", phases.settings(cfg, "conda"))

    # Unsubstituted, the real Miniforge's pinned sha refuses the stand-in: the gap is real.
    run = droplet.run(conda)
    assert run.returncode != 0 and "checksum mismatch" in run.stderr, run.stderr

    miniforge = {"NEMO_MINIFORGE_SHA256": internet.substitutions()["NEMO_MINIFORGE_SHA256"]}
    run = droplet.run(substitute(conda, miniforge))
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.splitlines()[-1])["changed"] is True
    assert internet.requests[catalog.MINIFORGE_URL] == 2

    run = droplet.run(phases.render("model", phases.settings(cfg, "model")))
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.splitlines()[-1])["model"] == f"{MODEL}@main"
    for name in ("config.json", "model.safetensors"):
        assert internet.requests[f"{MODEL_BASE}/{name}"] == 1, internet.requests
    repo = droplet.box.upper / "var/lib/nemotron/hf/hub" / f"models--{MODEL.replace('/', '--')}"
    commit = (repo / "refs" / "main").read_text()
    assert (repo / "snapshots" / commit / "config.json").read_bytes() == MODEL_CONFIG
    assert (repo / "snapshots" / commit / "model.safetensors").stat().st_size == 1 << 20


@needs_root
def test_a_path_can_fail_or_stall(droplet: Droplet) -> None:
    internet, url = droplet.internet, f"{MODEL_BASE}/model.safetensors"
    internet.fail(url, 503, times=1)
    got = droplet.curl(url)
    assert got.returncode == 22 and "503" in got.stderr, got.stderr
    assert droplet.curl(url).returncode == 0, "a failure for one request only"

    stall = internet.stall(url, after=4096)
    got = droplet.curl(url, "--max-time 2")
    assert got.returncode == 28, got.stderr  # CURLE_OPERATION_TIMEDOUT
    assert stall.reached.is_set()
    assert droplet.box.file("/root/dl/got").stat().st_size == 4096
    internet.clear(url)
    got = droplet.curl(url)
    assert got.returncode == 0 and got.stdout.strip() == sha(internet.files["huggingface.co"][
        url.removeprefix("https://huggingface.co")
    ])  # fmt: skip
    assert internet.requests[url] == 4


def test_substitute_changes_only_the_named_line_and_refuses_others() -> None:
    cfg = dev_config()
    conda = phases.render("conda", phases.settings(cfg, "conda"))
    out = substitute(conda, {"NEMO_MINIFORGE_SHA256": "ab" * 32})
    changed = [(a, b) for a, b in zip(conda.splitlines(), out.splitlines(), strict=True) if a != b]
    assert changed == [
        (f"NEMO_MINIFORGE_SHA256={catalog.MINIFORGE_SHA256}", f"NEMO_MINIFORGE_SHA256={'ab' * 32}")
    ]
    assert set(SUBSTITUTED) == {
        "NEMO_MINIFORGE_SHA256",
        "NEMO_UV_WHEEL_SHA256",
        "NEMO_ROUTER_PYTHON_VERSION",
    }
    for key in ("NEMO_MINIFORGE_URL", "NEMO_CADDY_SHA256", "NEMO_HF_ENDPOINT"):
        with pytest.raises(ValueError, match="substitutes only"):
            substitute(conda, {key: "x"})
    model = phases.render("model", phases.settings(cfg, "model"))
    with pytest.raises(ValueError, match="not set in this phase script"):
        substitute(model, {"NEMO_MINIFORGE_SHA256": "ab" * 32})


def test_the_settings_block_is_read_exactly_even_with_multiline_values() -> None:
    """A Caddyfile is a quoted value over many lines, some blank: a line ends an assignment only
    outside quotes, so the parser finds every setting and no other (lib.sh's own KEY=value lines
    come after the block)."""
    cfg = dev_config()
    cases: list[tuple[str, dict[str, Any]]] = [
        ("conda", {}),
        ("model", {"hf_token": 'hf_it\'s "quoted"\n\nand long'}),
        ("gateway", {"api_key": "sk-x", "host": "example.test"}),
    ]
    for phase, kwargs in cases:
        settings = phases.settings(cfg, phase, **kwargs)
        stdin = phases.render(phase, settings)
        spans = _assignments(stdin)
        assert set(spans) == {"PHASE", "PHASE_MINUTES", *settings}, phase
        for key, value in settings.items():
            start, end = spans[key]
            assert stdin[start:end] == f"{key}={phases.shell_value(value)}", key
