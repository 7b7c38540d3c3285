"""`python -m components.validate --stack NAME` (contract): a stack's whole config checked without
deploying, every bad field named, non-zero on any; with a token, what only the account knows,
asked of a fake DigitalOcean on loopback that answers as the API does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import loopback
import pytest
import yaml

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
    assert run.returncode == 2 and "stacks there: dev, prod, super" in run.stderr


# ---- with a token: the account ------------------------------------------------------------------


class FakeAccount:
    """GET /v2/sizes and GET /v2/domains/{name} as DigitalOcean answers them (OpenAPI
    sizes_list.yml, domains_get.yml); 401 for another token. Records what was asked."""

    def __init__(self, regions: list[str], domains: tuple[str, ...] = ()) -> None:
        self.regions, self.domains = regions, domains
        self.asked: list[tuple[str, str]] = []

    def handler(self) -> type[BaseHTTPRequestHandler]:
        account = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                account.asked.append((self.command, self.path))
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    self.answer(
                        401, {"id": "unauthorized", "message": "Unable to authenticate you."}
                    )
                elif self.path.startswith("/v2/sizes"):
                    sizes = [{"slug": "gpu-4000adax1-20gb", "available": True,
                              "regions": account.regions, "price_hourly": 0.76}]  # fmt: skip
                    self.answer(200, {"sizes": sizes, "meta": {"total": 1}})
                elif self.path.startswith("/v2/domains/"):
                    name = self.path.removeprefix("/v2/domains/")
                    if name in account.domains:
                        self.answer(200, {"domain": {"name": name, "ttl": 1800}})
                    else:
                        self.answer(404, {"id": "not_found", "message": "not found"})
                else:
                    self.answer(404, {"id": "not_found", "message": "not found"})

            def refuse(self) -> None:
                """Any other method: recorded (the test holds that none came), then refused."""
                account.asked.append((self.command, self.path))
                self.answer(405, {"id": "method_not_allowed", "message": self.command})

            do_POST = do_PUT = do_PATCH = do_DELETE = refuse  # noqa: N815

            def answer(self, status: int, body: dict[str, Any]) -> None:
                loopback.reply(self, status, json.dumps(body).encode(), "application/json")

            def log_message(self, *_: Any) -> None:
                pass

        return Handler


@pytest.fixture
def account() -> Iterator[tuple[FakeAccount, str]]:
    fake = FakeAccount(["nyc2"], domains=("example.com",))
    server = loopback.serve(fake.handler())
    try:
        yield fake, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        loopback.stop(server)


def test_with_a_token_the_size_must_be_offered_in_one_of_the_stacks_regions(
    account: tuple[FakeAccount, str], tmp_path: Path
) -> None:
    fake, url = account
    ok = validate("--stack", "dev", "--api-url", url, env={"DIGITALOCEAN_TOKEN": TOKEN})
    assert ok.returncode == 0 and "checked with DigitalOcean" in ok.stdout, ok.stderr
    fake.regions = ["sfo3"]
    gone = validate("--stack", "dev", "--api-url", url, env={"DIGITALOCEAN_TOKEN": TOKEN})
    assert gone.returncode == 2
    assert "droplet.regions: gpu-4000adax1-20gb is offered in none of tor1" in gone.stderr
    assert "(it is in: sfo3)" in gone.stderr
    assert all(method == "GET" for method, _ in fake.asked), "it only reads"
    assert TOKEN not in ok.stdout + ok.stderr + gone.stdout + gone.stderr


def test_with_a_token_the_dns_zone_must_be_the_accounts(
    account: tuple[FakeAccount, str], tmp_path: Path
) -> None:
    _, url = account
    config = shipped("dev")
    config["nemotron-droplet:access"] = {
        **config["nemotron-droplet:access"], "domain": "llm.example.org",
        "dnsZone": "example.org", "acmeEmail": "ops@example.org",
    }  # fmt: skip
    stack_file(tmp_path, "named", config)
    run = validate("--stack", "named", "--api-url", url, stacks=tmp_path,
                   env={"DIGITALOCEAN_TOKEN": TOKEN})  # fmt: skip
    assert run.returncode == 2
    assert "access.dnsZone: example.org is not a domain of this DigitalOcean account" in run.stderr


def test_a_token_digitalocean_refuses_is_named_not_printed(
    account: tuple[FakeAccount, str],
) -> None:
    _, url = account
    wrong = "dop_v1_WRONGtoken0000000000000000000000000000"
    run = validate("--stack", "dev", "--api-url", url, env={"DIGITALOCEAN_TOKEN": wrong})
    assert run.returncode == 2
    assert "DIGITALOCEAN_TOKEN: DigitalOcean refused it (HTTP 401)" in run.stderr
    assert wrong not in run.stdout + run.stderr


def test_the_token_goes_only_over_https(tmp_path: Path) -> None:
    run = validate("--stack", "dev", "--api-url", "http://api.example.com",
                   env={"DIGITALOCEAN_TOKEN": TOKEN})  # fmt: skip
    assert run.returncode == 2 and "the token goes over HTTPS only" in run.stderr
    assert TOKEN not in run.stdout + run.stderr


def test_a_stack_file_that_is_not_yaml_says_where_and_quotes_nothing(tmp_path: Path) -> None:
    (tmp_path / "Pulumi.broken.yaml").write_text("config:\n  apiKey: sk-do-not-echo-me: [\n")
    run = validate("--stack", "broken", stacks=tmp_path)
    assert run.returncode == 2 and "not YAML at line 2" in run.stderr, run.stderr
    assert "sk-do-not-echo-me" not in run.stderr
