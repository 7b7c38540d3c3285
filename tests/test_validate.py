"""`python -m components.validate --stack NAME` (contract): a stack's whole config checked without
deploying, every bad field named, non-zero on any; with a token, what only the account knows,
asked of a fake DigitalOcean on loopback that answers as the API does."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import loopback
import pytest
import yaml
from pulumi_harness import run_program
from stack import github_api
from stack.do_api import Account, DigitalOceanAPI, Size

from components import render
from components.cloud import outputs
from components.spec.config import ConfigError, parse

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "dop_v1_VALIDATEtestTOKEN00000000000000000000"


def validate(
    *args: str, env: dict[str, str] | None = None, stacks: Path | None = None
) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "components.validate", *args]
    if stacks is not None:
        argv += ["--stacks", str(stacks)]
    base = {k: v for k, v in os.environ.items() if k != "DIGITALOCEAN_TOKEN"}
    return subprocess.run(
        argv, cwd=ROOT, env={**base, **(env or {})}, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip


def stack_file(folder: Path, name: str, config: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"Pulumi.{name}.yaml"
    path.write_text(yaml.safe_dump({"config": config}))
    return path


def shipped(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "stacks" / f"Pulumi.{name}.yaml").read_text())
    return dict(data["config"])


@pytest.mark.parametrize("name", ["dev", "prod", "super"])
def test_each_shipped_stack_validates_offline(name: str) -> None:
    run = validate("--stack", name)
    assert run.returncode == 0, run.stderr
    assert (
        run.stdout.startswith(f"{name}: ok:")
        and "not checked (no DIGITALOCEAN_TOKEN)" in run.stdout
    )


def test_every_bad_field_is_named_and_the_exit_is_non_zero(tmp_path: Path) -> None:
    config = shipped("dev")
    config["nemotron-droplet:droplet"] = {**config["nemotron-droplet:droplet"], "size": "gpu-nope"}
    config["nemotron-droplet:vllm"] = {**config["nemotron-droplet:vllm"], "maxModelLen": -5}
    config["nemotron-droplet:accsess"] = {"apiCidrs": ["0.0.0.0/0"]}
    stack_file(tmp_path, "bad", config)
    run = validate("--stack", "bad", stacks=tmp_path)
    assert run.returncode == 2
    for field in ("droplet.size", "vllm.maxModelLen", "accsess"):
        assert field in run.stderr, (field, run.stderr)
    assert "nothing was created" in run.stderr


def test_a_stack_file_with_no_keys_of_ours_is_refused(tmp_path: Path) -> None:
    stack_file(tmp_path, "empty", {"digitalocean:token": "x"})
    run = validate("--stack", "empty", stacks=tmp_path)
    assert run.returncode == 2
    assert "sets no nemotron-droplet: keys" in run.stderr, run.stderr


def test_keys_under_another_namespace_are_refused_naming_ours(tmp_path: Path) -> None:
    config = shipped("dev")
    config["nemotron-droplets:autodown"] = config.pop("nemotron-droplet:autodown")
    stack_file(tmp_path, "typo", config)
    run = validate("--stack", "typo", stacks=tmp_path)
    assert run.returncode == 2
    assert "nemotron-droplets:autodown: 'nemotron-droplets' is not this project's namespace" in (
        run.stderr
    )
    assert "nemotron-droplet:autodown" in run.stderr


def test_a_missing_stack_file_names_the_ones_there() -> None:
    run = validate("--stack", "nope")
    assert run.returncode == 2 and "stacks there: dev, kube, prod, super" in run.stderr


# ---- with a token: the account ------------------------------------------------------------------

# What a stack's deploy token must be able to read, as DigitalOcean's OpenAPI names the scopes:
# the fake API refuses a token without them from its own table (do_api_scopes.json), so these
# lists are checked against the OpenAPI, not against validate's table.
READ_SCOPES = ["sizes:read", "regions:read", "droplet:read", "tag:read", "ssh_key:read",
               "firewall:read", "domain:read"]  # fmt: skip


@pytest.fixture
def api() -> Iterator[DigitalOceanAPI]:
    """The fake DigitalOcean (tests/support/stack/do_api.py) with the dev size offered in nyc2,
    the domain example.com, and TOKEN with the read scopes above."""
    account = Account()
    account.offered["gpu-4000adax1-20gb"] = ["nyc2"]
    account.domains["example.com"] = {}
    account.add_token("deploy", READ_SCOPES, secret=TOKEN)
    with DigitalOceanAPI(account) as fake:
        yield fake


def test_with_a_token_the_size_must_be_offered_in_one_of_the_stacks_regions(
    api: DigitalOceanAPI,
) -> None:
    ok = validate("--stack", "dev", "--api-url", api.url, env={"DIGITALOCEAN_TOKEN": TOKEN})
    assert ok.returncode == 0 and "checked with DigitalOcean" in ok.stdout, ok.stderr
    assert [seen.status for seen in api.requests] == [200] * len(api.requests) != []
    api.account.offered["gpu-4000adax1-20gb"] = ["sfo3"]
    gone = validate("--stack", "dev", "--api-url", api.url, env={"DIGITALOCEAN_TOKEN": TOKEN})
    assert gone.returncode == 2
    assert "droplet.regions: gpu-4000adax1-20gb is offered in none of tor1" in gone.stderr
    assert "(it is in: sfo3)" in gone.stderr
    api.account.offered.clear()
    sold = validate("--stack", "dev", "--api-url", api.url, env={"DIGITALOCEAN_TOKEN": TOKEN})
    assert "droplet.size: gpu-4000adax1-20gb is not offered to this account now" in sold.stderr
    assert {seen.method for seen in api.requests} == {"GET"}, "it only reads"
    assert TOKEN not in ok.stdout + ok.stderr + gone.stdout + gone.stderr


def test_with_a_token_the_sizes_disks_and_memory_are_read_and_checked(
    api: DigitalOceanAPI, tmp_path: Path
) -> None:
    """The sizes API's disk_info is where a size's disks are documented for each size: validate
    shows them, and refuses a boot disk too small for what the stack puts on it."""
    env = {"DIGITALOCEAN_TOKEN": TOKEN}
    ok = validate("--stack", "dev", "--api-url", api.url, env=env)
    assert ok.returncode == 0, ok.stderr
    assert ("note: gpu-4000adax1-20gb: local disk 720 GiB, scratch disk 5120 GiB, memory 240 GiB"
            in ok.stderr)  # fmt: skip
    small = Size("gpu-4000adax1-20gb", 0.76, memory=16 * 1024, disk=25, gpu_count=1)
    api.account.shapes["gpu-4000adax1-20gb"] = small
    full = validate("--stack", "dev", "--api-url", api.url, env=env)
    assert full.returncode == 2
    assert "droplet.size: gpu-4000adax1-20gb's boot disk is 25 GiB; this stack needs about" in (
        full.stderr
    )
    assert "(the vLLM env and the weights; preflight checks it on the Droplet)" in full.stderr
    # With a cache Volume the weights are prefetched into the page cache: 16 GiB is room
    # enough for 8 GB of them, 8 GiB is not.
    cached = stack_file(
        tmp_path, "dev", {**shipped("dev"), "nemotron-droplet:cache": {"sizeGb": 60}}
    )
    api.account.shapes["gpu-4000adax1-20gb"] = Size(
        "gpu-4000adax1-20gb", 0.76, memory=16 * 1024, disk=100, gpu_count=1
    )
    volume = validate("--stack", "dev", "--api-url", api.url, env=env, stacks=cached.parent)
    assert volume.returncode == 0, volume.stderr
    assert "prefetch" not in volume.stderr
    api.account.shapes["gpu-4000adax1-20gb"] = Size(
        "gpu-4000adax1-20gb", 0.76, memory=8 * 1024, disk=100, gpu_count=1
    )
    tight = validate("--stack", "dev", "--api-url", api.url, env=env, stacks=cached.parent)
    assert tight.returncode == 0, tight.stderr
    assert "vllm.safetensorsLoadStrategy: prefetch reads about" in tight.stderr
    assert "more than 90% of gpu-4000adax1-20gb's 8 GiB: set it to lazy" in tight.stderr


def test_the_catalogs_documented_disks_are_held_to_the_sizes_api(api: DigitalOceanAPI) -> None:
    """The H100x1's disks and memory are in the catalog (documented); the live answer agreeing
    says nothing more, a different one says the catalog is out of date."""
    env = {"DIGITALOCEAN_TOKEN": TOKEN}
    api.account.offered["gpu-h100x1-80gb"] = ["tor1"]
    agree = validate("--stack", "prod", "--api-url", api.url, env=env)
    assert agree.returncode == 0, agree.stderr
    assert "local disk 720 GiB, scratch disk 5120 GiB, memory 240 GiB" in agree.stderr
    assert "out of date" not in agree.stderr
    api.account.shapes["gpu-h100x1-80gb"] = Size(
        "gpu-h100x1-80gb", 3.39, memory=240 * 1024, disk=1000, scratch=5120, gpu_count=1
    )
    moved = validate("--stack", "prod", "--api-url", api.url, env=env)
    assert moved.returncode == 0, moved.stderr
    assert (
        "components/spec/catalog.py documents gpu-h100x1-80gb with boot disk 720 GiB (the API: 1000 "
        "GiB): the catalog is out of date"
    ) in moved.stderr


def test_disk_info_reads_boot_or_local_in_its_units_and_falls_back_to_disk() -> None:
    """sizes/models/disk_info.yml: a `local` or a `boot` disk, and a scratch disk on GPU sizes."""
    from components import validate as v  # noqa: PLC0415 (the module under test, in-process)

    def info(kind: str, amount: object, unit: str) -> dict[str, Any]:
        return {"type": kind, "size": {"amount": amount, "unit": unit}}

    both = {"disk": 720, "disk_info": [info("boot", 720, "gib"), info("scratch", 5, "tib")]}
    assert v.disks(both) == {"boot": 720, "scratch": 5120}
    assert v.disks({"disk": 25}) == {"local": 25}
    # A unit it does not know, or no amount, is left out rather than taken for GiB.
    odd = {"disk": 25, "disk_info": [info("local", 25, "gb"), {"type": "scratch"}]}
    assert v.disks(odd) == {"local": 25}


def test_with_a_token_the_dns_zone_must_be_the_accounts(
    api: DigitalOceanAPI, tmp_path: Path
) -> None:
    config = shipped("dev")
    config["nemotron-droplet:access"] = {
        **config["nemotron-droplet:access"], "domain": "llm.example.org",
        "dnsZone": "example.org", "acmeEmail": "ops@example.org",
    }  # fmt: skip
    stack_file(tmp_path, "named", config)
    run = validate("--stack", "named", "--api-url", api.url, stacks=tmp_path,
                   env={"DIGITALOCEAN_TOKEN": TOKEN})  # fmt: skip
    assert run.returncode == 2
    assert "access.dnsZone: example.org is not a domain of this DigitalOcean account" in run.stderr
    api.account.domains["example.org"] = {}
    run = validate("--stack", "named", "--api-url", api.url, stacks=tmp_path,
                   env={"DIGITALOCEAN_TOKEN": TOKEN})  # fmt: skip
    assert run.returncode == 0, run.stderr


def test_a_token_digitalocean_refuses_is_named_not_printed(api: DigitalOceanAPI) -> None:
    wrong = "dop_v1_WRONGtoken0000000000000000000000000000"
    run = validate("--stack", "dev", "--api-url", api.url, env={"DIGITALOCEAN_TOKEN": wrong})
    assert run.returncode == 2
    assert "DIGITALOCEAN_TOKEN: DigitalOcean refused it (HTTP 401)" in run.stderr
    assert wrong not in run.stdout + run.stderr


@pytest.mark.parametrize("missing", ["droplet:read", "tag:read", "ssh_key:read", "firewall:read"])
def test_a_read_scope_the_stack_needs_is_named_when_missing(
    api: DigitalOceanAPI, missing: str
) -> None:
    """The provider reads back every resource it creates: a deploy token without the read scope
    of one kind fails half-way through `pulumi up`; validate says which scope, before."""
    partial = api.account.add_token("partial", [s for s in READ_SCOPES if s != missing])
    run = validate("--stack", "dev", "--api-url", api.url, env={"DIGITALOCEAN_TOKEN": partial})
    assert run.returncode == 2
    lines = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and f"it needs the scope {missing}" in lines[0], run.stderr
    assert partial not in run.stdout + run.stderr


def test_the_entry_adds_its_own_read_scope(api: DigitalOceanAPI, tmp_path: Path) -> None:
    """Replicas behind the Caddy balancer hold a Reserved IP; behind the managed one, a Load
    Balancer: each needs its read scope, and only then."""
    config = shipped("dev")
    config["nemotron-droplet:replicas"] = 2
    stack_file(tmp_path, "pair", config)
    run = validate("--stack", "pair", "--api-url", api.url, stacks=tmp_path,
                   env={"DIGITALOCEAN_TOKEN": TOKEN})  # fmt: skip
    assert run.returncode == 2
    assert "may not read Reserved IPs (HTTP 403): it needs the scope reserved_ip:read" in run.stderr
    wider = api.account.add_token("wider", [*READ_SCOPES, "reserved_ip:read"])
    run = validate("--stack", "pair", "--api-url", api.url, stacks=tmp_path,
                   env={"DIGITALOCEAN_TOKEN": wider})  # fmt: skip
    assert run.returncode == 0, run.stderr


def test_without_sizes_scopes_it_says_which(api: DigitalOceanAPI) -> None:
    narrow = api.account.add_token("narrow", ["droplet:read"])
    run = validate("--stack", "dev", "--api-url", api.url, env={"DIGITALOCEAN_TOKEN": narrow})
    assert run.returncode == 2
    assert "it needs the scopes sizes:read and regions:read" in run.stderr


def test_the_autodown_tokens_scopes_are_named_not_guessed() -> None:
    """No read-only call tells a token's scopes: validate names what autodown.token needs."""
    run = validate("--stack", "dev")
    assert run.returncode == 0, run.stderr
    assert "autodown.token must have exactly droplet:delete" in run.stdout


def test_the_token_goes_only_over_https(tmp_path: Path) -> None:
    run = validate("--stack", "dev", "--api-url", "http://api.example.com",
                   env={"DIGITALOCEAN_TOKEN": TOKEN})  # fmt: skip
    assert run.returncode == 2 and "the token goes over HTTPS only" in run.stderr
    assert TOKEN not in run.stdout + run.stderr


def test_a_stack_file_that_is_not_yaml_says_where_and_quotes_nothing(tmp_path: Path) -> None:
    (tmp_path / "Pulumi.broken.yaml").write_text("config:\n  apiKey: sk-do-not-echo-me: [\n")
    run = validate("--stack", "broken", stacks=tmp_path)
    assert run.returncode == 2 and "Pulumi.broken.yaml:2:" in run.stderr, run.stderr
    assert "sk-do-not-echo-me" not in run.stderr


def test_a_key_given_twice_is_refused_naming_both_lines(tmp_path: Path) -> None:
    """PyYAML keeps the last of a repeated key: the size above it would be dropped unseen."""
    text = (ROOT / "stacks" / "Pulumi.dev.yaml").read_text()
    (tmp_path / "Pulumi.twice.yaml").write_text(
        text + "  nemotron-droplet:replicas: 2\n  nemotron-droplet:replicas: 3\n"
    )
    lines = len(text.splitlines())
    run = validate("--stack", "twice", stacks=tmp_path)
    assert run.returncode == 2, run.stderr
    assert (
        f"Pulumi.twice.yaml:{lines + 2}:3: not YAML: 'nemotron-droplet:replicas' is given twice "
        f"(lines {lines + 1} and {lines + 2})"
    ) in run.stderr, run.stderr


# ---- wake: the deploy workflow must take the wake's dispatch (GitHub answers 422 otherwise) ----

WAKE_TOKEN = "github_pat_VALIDATEwakeTOKEN00000000000000000"


def wake_stack(tmp_path: Path, name: str, ref: str = "main") -> Path:
    config = shipped("dev")
    config["nemotron-droplet:wake"] = {"enabled": True, "githubRepo": "me/llm", "githubRef": ref,
                                       "token": {"secure": "v1:AAAAsecret"}}  # fmt: skip
    folder = tmp_path / "stacks"
    stack_file(folder, name, config)
    return folder


def test_a_stack_the_deploy_workflow_does_not_offer_is_refused_before_the_first_wake(
    tmp_path: Path,
) -> None:
    """deploy.yml's `stack` is a choice: a wake for a stack outside its options gets 422 from
    GitHub. validate (and pulumi up: the same config.parse) says so first, naming the fix."""
    run = validate("--stack", "staging", stacks=wake_stack(tmp_path, "staging"))
    assert run.returncode == 2
    assert "wake: deploy.yml does not offer the stack `staging`" in run.stderr
    assert "its `stack` options: dev, prod, super, kube" in run.stderr
    ok = validate("--stack", "dev", stacks=wake_stack(tmp_path, "dev"))
    assert ok.returncode == 0, ok.stderr


def test_with_a_github_token_the_wake_branch_must_exist(tmp_path: Path) -> None:
    """The strict fake GitHub (tests/support/stack/github_api.py) knows only `main`."""
    github = github_api.GitHub(repo="me/llm", workflow="deploy.yml", token=WAKE_TOKEN)
    server = github_api.serve(github, socket.create_server(("127.0.0.1", 0)), None)
    try:
        url = ["--github-api-url", loopback.url(server)]
        env = {"GITHUB_TOKEN": WAKE_TOKEN}
        bad = validate("--stack", "dev", *url, env=env, stacks=wake_stack(tmp_path, "dev", "rel"))
        assert bad.returncode == 2
        assert "wake.githubRef: me/llm has no branch 'rel'" in bad.stderr
        good = validate("--stack", "dev", *url, env=env, stacks=wake_stack(tmp_path / "g", "dev"))
        assert good.returncode == 0, good.stderr
        refused = validate("--stack", "dev", *url, env={"GITHUB_TOKEN": "nope"},
                           stacks=wake_stack(tmp_path / "r", "dev"))  # fmt: skip
        assert "GITHUB_TOKEN: GitHub refused it (HTTP 401)" in refused.stderr
        assert WAKE_TOKEN not in bad.stdout + bad.stderr + good.stdout + good.stderr
    finally:
        loopback.stop(server)


def test_a_wake_repository_that_moved_is_named_and_the_token_follows_no_redirect(
    tmp_path: Path,
) -> None:
    """GitHub answers a renamed repository with a redirect; validate follows none (the token
    would go with it: scripts/clients/transport.py) and names wake.githubRepo instead."""
    elsewhere: list[str] = []

    class Moved(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            elsewhere.append(self.headers.get("Authorization", ""))
            self.send_response(301)
            self.send_header("Location", f"http://127.0.0.1:9{self.path}")
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = loopback.serve(Moved)
    try:
        run = validate("--stack", "dev", "--github-api-url", loopback.url(server),
                       env={"GITHUB_TOKEN": WAKE_TOKEN}, stacks=wake_stack(tmp_path, "dev"))  # fmt: skip
    finally:
        loopback.stop(server)
    assert run.returncode == 2
    assert "wake.githubRepo: GitHub answers me/llm with a redirect (HTTP 301)" in run.stderr
    assert len(elsewhere) == 1 and WAKE_TOKEN not in run.stdout + run.stderr


# ---- the config check's gaps: each through validate and through the program's loading ----------
# `pulumi up` hands the program the stack file's values JSON-encoded (what run_program does);
# validate reads the file itself. Both call config.parse, and both must say the same thing.


def _both(tmp_path: Path, override: dict[str, Any]) -> tuple[str, list[str]]:
    """validate's stderr and the program's problems for the dev stack with `override`."""
    config = {key.split(":", 1)[1]: value for key, value in shipped("dev").items()}
    for section, fields in override.items():
        config[section] = {**config.get(section, {}), **fields}
    stack_file(tmp_path, "gap", {f"nemotron-droplet:{k}": v for k, v in config.items()})
    run = validate("--stack", "gap", stacks=tmp_path)
    program = run_program(config)
    problems = list(getattr(program.error, "problems", []))
    return (run.stderr if run.returncode == 2 else ""), problems


GAPS = [
    (
        {"model": {"id": "nvidia/NVIDIA-Nemotron-3-Nano-4B-BF61"}},
        "model.id: nvidia/NVIDIA-Nemotron-3-Nano-4B-BF61 is not in the catalog; did you mean "
        "nvidia/NVIDIA-Nemotron-3-Nano-4B-BF16?",
    ),
    (
        {"droplet": {"regions": ["tor1", "nyc4"]}},
        "droplet.regions: 'nyc4' is not a DigitalOcean region (did you mean nyc2?)",
    ),
    (
        {"droplet": {"regions": ["tor", "nyc2"]}},
        "droplet.regions: 'tor' is not a DigitalOcean region (did you mean tor1?)",
    ),
    (
        {"vllm": {"version": 0.33}},
        "vllm.version: 0.33 is a number here, and this field takes text: write it quoted: '0.33'",
    ),
    (
        {"bootstrap": {"driver": {"branch": 580}}},
        "bootstrap.driver.branch: 580 is a number here, and this field takes text: write it "
        "quoted: '580'",
    ),
]


@pytest.mark.parametrize(("override", "message"), GAPS, ids=[m.split(":")[0] for _, m in GAPS])
def test_each_gap_is_refused_alike_by_validate_and_the_program(
    tmp_path: Path, override: dict[str, Any], message: str
) -> None:
    said, problems = _both(tmp_path, override)
    assert message in said, said
    assert any(p.startswith(message) for p in problems), problems


def test_an_unquoted_version_says_yaml_drops_its_trailing_zero(tmp_path: Path) -> None:
    """`version: 0.30` is the float 0.3 by the time anyone reads it (YAML, then Pulumi's JSON):
    the message says a digit may be lost, so the user writes back what they meant."""
    text = (ROOT / "stacks" / "Pulumi.dev.yaml").read_text()
    assert 'version: "0.33.0"' in text
    (tmp_path / "Pulumi.zero.yaml").write_text(text.replace('version: "0.33.0"', "version: 0.30"))
    run = validate("--stack", "zero", stacks=tmp_path)
    assert run.returncode == 2
    assert "vllm.version: 0.3 is a number here" in run.stderr, run.stderr
    assert "0.30 reads as 0.3" in run.stderr, run.stderr


def test_a_cidr_errors_own_examples_are_accepted(tmp_path: Path) -> None:
    """The message for a malformed CIDR shows what to write: each example must pass the very
    check that printed it (a documentation range there would be refused next)."""
    said, problems = _both(tmp_path, {"access": {"apiCidrs": ["10.0.0.300/24"]}})
    (message,) = [p for p in problems if p.startswith("access.apiCidrs:")]
    assert message in said
    examples = message.split("such as ", 1)[1].split(";")[0].replace(" and ", ", ")
    cidrs = [c.strip(" .`") for c in examples.split(",") if c.strip(" .`")]
    assert len(cidrs) >= 3, message
    said, problems = _both(tmp_path / "empty", {"access": {"sshCidrs": []}})
    (empty,) = [p for p in problems if p.startswith("access.sshCidrs:")]
    assert empty in said
    cidrs.append(empty.split("e.g. ", 1)[1].split(")")[0])
    for i, cidr in enumerate(cidrs):
        ok, problems = _both(
            tmp_path / str(i), {"access": {"apiCidrs": [cidr], "sshCidrs": [cidr]}}
        )
        assert ok == "" and problems == [], (cidr, ok, problems)


def test_a_yaml_error_points_at_its_file_line_and_column(tmp_path: Path) -> None:
    """file:line:column, as compilers say it (editors jump there); the same from render, the
    other reader of stack files."""
    text = (ROOT / "stacks" / "Pulumi.dev.yaml").read_text()
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip() == "monitoring: true")
    lines[at] = "   monitoring: true"  # one space short of its siblings
    path = tmp_path / "Pulumi.indent.yaml"
    path.write_text("\n".join(lines) + "\n")
    run = validate("--stack", "indent", stacks=tmp_path)
    assert run.returncode == 2
    assert f"error: {path}:{at + 1}:4: not YAML: " in run.stderr, run.stderr
    with pytest.raises(ConfigError) as err:
        render.stack_raw("indent", tmp_path)
    assert err.value.problems == [run.stderr.split("error: ", 1)[1].splitlines()[0]]


# ---- ok, and still billing: the words `pulumi up` warns with, from the same code ----------------


def test_ok_says_when_nothing_will_stop_the_bill(tmp_path: Path) -> None:
    """dev without its autodown token only logs, prod has no autodown: both are valid, and both
    bill until `pulumi destroy`. validate says so as `pulumi up` does (outputs.bill_warning,
    test_droplet.py's test_pulumi_up_says_when_nothing_will_stop_the_bill), at the list price;
    a dev stack whose rule has its token deletes the Droplet, and nothing is said."""
    for stack, price, why in (
        ("dev", 0.76, "autodown only logs"),
        ("prod", 3.39, "autodown is off"),
    ):
        run = validate("--stack", stack)
        assert run.returncode == 0, run.stderr
        raw, secret = render.stack_raw(stack)
        expected = outputs.bill_warning(parse(raw, stack, secret), price, " (list price)")
        assert why in expected and f"${price:.2f}/hour (list price) until `pulumi" in expected
        assert f"{stack}: {expected}" in run.stdout.splitlines(), run.stdout
    config = shipped("dev")
    config["nemotron-droplet:autodown"] = {**config["nemotron-droplet:autodown"],
                                           "token": {"secure": "v1:AAAAsecret"}}  # fmt: skip
    stack_file(tmp_path, "deletes", config)
    run = validate("--stack", "deletes", stacks=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "nothing will stop the bill" not in run.stdout


@pytest.mark.parametrize("section", ["autodown", "wake"])
def test_the_unquoted_number_hint_never_quotes_a_secret_token(section: str) -> None:
    """A token set as a secret that is all digits (a webhook's shared secret may well be) is a
    number to YAML; the hint that says to quote it echoed the value, into `pulumi up`'s output
    and validate's: it names the field and keeps the value out."""
    token = 918273645546372819918273645546  # digits only: YAML reads a number
    with pytest.raises(ConfigError) as err:
        parse({section: {"token": token}}, "dev", secret_keys=frozenset({section}))
    said = "\n".join(err.value.problems)
    assert f"{section}.token: a number here, and this field takes text: quote it" in said, said
    assert str(token) not in said, said


def test_a_stack_file_that_is_not_utf8_is_one_line_naming_the_file(tmp_path: Path) -> None:
    """A stack file saved in Latin-1 (a comment with an accented letter) is not text Pulumi
    reads either: validate says so, naming the file, with no traceback."""
    path = stack_file(tmp_path, "latin", {"nemotron-droplet:droplet": {"size": "gpu-h100x1-80gb"}})
    path.write_bytes(b"# r\xe9gion: nyc2\n" + path.read_bytes())
    run = validate("--stack", "latin", stacks=tmp_path)
    assert run.returncode == 2, (run.returncode, run.stderr)
    assert "Traceback" not in run.stderr, run.stderr
    assert f"{path}: not UTF-8 text" in run.stderr, run.stderr


def test_an_alias_bomb_is_refused_in_a_short_line(tmp_path: Path) -> None:
    """YAML aliases share one list, a few hundred bytes for a million leaves (the "billion
    laughs"). PyYAML loads it shared, but the refusal quoted the value with repr(), which
    expands it: 7 MB of message here, 7 GB at nine levels (validate and `pulumi up` out of
    memory). A quoted value is cut short."""
    levels = ['b0: &b0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    levels += [f"b{i}: &b{i} [{', '.join([f'*b{i - 1}'] * 10)}]" for i in range(1, 6)]
    dev = (ROOT / "stacks" / "Pulumi.dev.yaml").read_text()
    bombs = "\n".join(f"  {line}" for line in levels)
    text = dev.replace("config:\n", f"x-bombs:\n{bombs}\nconfig:\n", 1)
    for shape, bomb in (("section", "  nemotron-droplet:balancer: *b5\n"),
                        ("list", "  nemotron-droplet:replicas: *b5\n")):  # fmt: skip
        (tmp_path / f"Pulumi.{shape}.yaml").write_text(text + bomb)
        run = validate("--stack", shape, stacks=tmp_path)
        assert run.returncode == 2, run.stderr[:2000]
        assert len(run.stderr) < 4000, f"{shape}: {len(run.stderr)} characters of refusal"


# ---- platform: kubernetes ------------------------------------------------------------------------

DIGESTS = {
    "imageDigest": "sha256:" + "ab" * 32,
    "edge": {"imageDigest": "sha256:" + "cd" * 32},
    "router": {"eppImageDigest": "sha256:" + "ef" * 32, "proxyImageDigest": "sha256:" + "12" * 32},
}


def kube_stack(folder: Path, **kube: Any) -> Path:
    """The shipped Kubernetes example with its digests set (and `kube` over its section)."""
    config = shipped("kube")
    section = config["nemotron-droplet:kubernetes"]
    edge = {**section["edge"], **DIGESTS["edge"]}
    config["nemotron-droplet:kubernetes"] = {**section, **DIGESTS, "edge": edge, **kube}
    stack_file(folder, "kube", config)
    return folder


def test_the_kubernetes_example_is_refused_until_its_digests_are_set(tmp_path: Path) -> None:
    shipped_run = validate("--stack", "kube")
    assert shipped_run.returncode == 2
    errors = [line for line in shipped_run.stderr.splitlines() if line.startswith("error: ")]
    assert [e.split(": ", 3)[2] for e in errors] == [
        "kubernetes.imageDigest", "kubernetes.edge.imageDigest",
        "kubernetes.router.eppImageDigest", "kubernetes.router.proxyImageDigest",
    ], shipped_run.stderr  # fmt: skip
    ok = validate("--stack", "kube", stacks=kube_stack(tmp_path))
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("kube: ok: kubernetes: DOKS 1.36 in tor1, 0 to 2 x gpu-h100x1-80gb")


@pytest.fixture
def doks() -> Iterator[DigitalOceanAPI]:
    """The fake DigitalOcean offering DOKS 1.36 and 1.35 in tor1 with both pools' sizes, and
    those sizes as Droplets in tor1; TOKEN may read them (kubernetes:read, sizes:read)."""
    account = Account()
    account.offered |= {"gpu-h100x1-80gb": ["tor1", "nyc2"], "s-2vcpu-4gb": ["tor1", "nyc2"]}
    account.kube_versions = ["1.36.2-do.1", "1.35.4-do.2"]
    account.kube_sizes = ["s-2vcpu-4gb", "gpu-h100x1-80gb", "gpu-l40sx1-48gb"]
    account.kube_regions = ["tor1", "nyc2"]
    account.add_token("deploy", [*READ_SCOPES, "kubernetes:read"], secret=TOKEN)
    with DigitalOceanAPI(account) as fake:
        yield fake


def test_with_a_token_doks_must_offer_the_minor_the_region_and_the_pools_sizes(
    doks: DigitalOceanAPI, tmp_path: Path
) -> None:
    env = {"DIGITALOCEAN_TOKEN": TOKEN}
    stacks = kube_stack(tmp_path)
    ok = validate("--stack", "kube", "--api-url", doks.url, env=env, stacks=stacks)
    assert ok.returncode == 0 and "checked with DigitalOcean" in ok.stdout, ok.stderr
    asked = {seen.path for seen in doks.requests}
    assert "/v2/kubernetes/options" in asked and {s.method for s in doks.requests} == {"GET"}
    assert all(seen.status == 200 for seen in doks.requests)
    doks.account.kube_versions = ["1.35.4-do.2", "1.37.0-do.0"]
    doks.account.kube_sizes.remove("gpu-h100x1-80gb")
    doks.account.kube_regions = ["nyc2"]
    gone = validate("--stack", "kube", "--api-url", doks.url, env=env, stacks=stacks)
    assert gone.returncode == 2
    assert (
        "kubernetes: the program pins Kubernetes 1.36 (spec/kube.py DOKS_MINOR), which DOKS "
        "does not offer now (it offers: 1.35, 1.37)"
    ) in gone.stderr
    assert "kubernetes.region: DOKS does not offer tor1 now (it offers: nyc2)" in gone.stderr
    assert "kubernetes.gpuPool.size: gpu-h100x1-80gb is not a node size DOKS offers" in gone.stderr
    doks.account.offered["gpu-h100x1-80gb"] = ["nyc2"]
    where = validate("--stack", "kube", "--api-url", doks.url, env=env, stacks=stacks)
    assert (
        "kubernetes.region: gpu-h100x1-80gb (kubernetes.gpuPool.size) is not offered in tor1 "
        "now (it is in: nyc2)"
    ) in where.stderr
    assert TOKEN not in ok.stdout + ok.stderr + gone.stdout + gone.stderr


def test_a_token_without_kubernetes_read_is_named(doks: DigitalOceanAPI, tmp_path: Path) -> None:
    other = "dop_v1_VALIDATEnoKUBEtoken0000000000000000000"
    doks.account.add_token("no-kube", READ_SCOPES, secret=other)
    run = validate("--stack", "kube", "--api-url", doks.url,
                   env={"DIGITALOCEAN_TOKEN": other}, stacks=kube_stack(tmp_path))  # fmt: skip
    assert run.returncode == 2
    assert "may not read DOKS's options (HTTP 403): it needs the scope kubernetes:read" in (
        run.stderr
    )


def test_a_gpu_pool_over_the_policy_packs_budget_is_refused_offline(tmp_path: Path) -> None:
    """Five H100 nodes list at $16.95/h, over the default $16/h: the preview's policy pack
    would refuse it (policy/rules.py set_outside_budget counts the pool's maxNodes)."""
    pool = {"size": "gpu-h100x1-80gb", "minNodes": 0, "maxNodes": 5}
    run = validate("--stack", "kube", stacks=kube_stack(tmp_path, gpuPool=pool))
    assert run.returncode == 2
    assert "kubernetes.gpuPool.maxNodes: 5 x gpu-h100x1-80gb lists at $16.95/h, over the " in (
        run.stderr
    )
