"""components/render.py (`python -m components.render`): the exact script each phase runs for a
stack, without a cloud account; secrets and deploy-time addresses as placeholders. That every
rendered script passes shellcheck is test_phase_scripts.py's (the scripts'); the cache phase in a
render, test_cache.py's."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pulumi_harness import stack_config

from components import render
from components.host import phase_settings, phases
from components.spec import config

# What `pulumi config set --secret` writes: ciphertext under `secure`, never the value.
CIPHERTEXT = "v1:AAAABBBBciphertextNEVERrendered0000"


def test_the_rendered_replica_gateway_admits_render_from_the_front_only_with_the_router() -> None:
    """scripts rendered for reading (components/render.py) show what a replica's gateway is
    deployed with: the render route for the front's private address when the front runs the
    cache-aware router, and no render route without it."""
    for routing, client in (
        ("cache-aware", render.FRONT_PRIVATE_PLACEHOLDER_IP),
        ("least-conn", ""),
    ):
        raw = {**stack_config("dev"), "replicas": 3, "balancer": {"routing": routing}}
        cfg = config.parse(raw, "dev")
        values = render.placeholders(cfg, False, render.HOST_PLACEHOLDER_IP)
        assert values["render_client"] == client
        row = phases.row("gateway")
        inputs = {name: values[name] for name in phases.wanted(row, 0)}
        caddyfile = str(
            row.settings(cfg, phase_settings.Inputs(**inputs, replica=0))["NEMO_CADDYFILE"]
        )
        assert ("/v1/chat/completions/render" in caddyfile) == bool(client), routing
        front_only = f"@render_client remote_ip {render.FRONT_PRIVATE_PLACEHOLDER_IP}"
        assert (front_only in caddyfile) == bool(client), routing


def secret_stack(folder: Path) -> Path:
    """dev's file with an HF token and an autodown token set as secrets (the second nested)."""
    data = yaml.safe_load((render.ROOT / "stacks" / "Pulumi.dev.yaml").read_text())
    conf = data["config"]
    conf[f"{config.NAMESPACE}:hfToken"] = {"secure": CIPHERTEXT}
    autodown = conf[f"{config.NAMESPACE}:autodown"]
    conf[f"{config.NAMESPACE}:autodown"] = {**autodown, "token": {"secure": CIPHERTEXT}}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "Pulumi.hidden.yaml").write_text(yaml.safe_dump(data))
    return folder


def test_a_secret_at_any_depth_is_a_placeholder_and_its_key_secret(tmp_path: Path) -> None:
    raw, secret = render.stack_raw("hidden", secret_stack(tmp_path / "stacks"))
    assert raw["hfToken"] == phase_settings.SECRET_PLACEHOLDER
    assert raw["autodown"]["token"] == phase_settings.SECRET_PLACEHOLDER
    assert raw["autodown"]["idleMinutes"] == stack_config("dev")["autodown"]["idleMinutes"]
    assert secret == {"hfToken", "autodown"}
    assert CIPHERTEXT not in repr(raw)


def test_a_render_writes_every_phase_in_order_and_no_ciphertext(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each phase of the table once, numbered in its order; a secret of the stack file shows as
    the placeholder, in the phase that takes it, and its ciphertext nowhere."""
    stacks = secret_stack(tmp_path / "stacks")
    read = render.stack_raw
    monkeypatch.setattr(render, "stack_raw", lambda stack: read(stack, stacks))
    written = render.render_stack("hidden", tmp_path / "out")
    assert [p.name for p in written] == [
        f"{i:02d}-{phase.name}.sh" for i, phase in enumerate(phases.BOOTSTRAP, start=1)
    ]
    texts = {p.name.split("-", 1)[1].removesuffix(".sh"): p.read_text() for p in written}
    assert all(CIPHERTEXT not in text for text in texts.values())
    assert phase_settings.SECRET_PLACEHOLDER in texts["model"], "the HF token's phase"
    assert phase_settings.SECRET_PLACEHOLDER in texts["autodown"], "the autodown token's"
    # The Droplet's address, known at deploy time: the documentation range's (dev: no domain).
    assert f"NEMO_HOST={render.HOST_PLACEHOLDER_IP}\n" in texts["gateway"]


def test_the_command_line_writes_the_files_or_names_the_refused_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert render.main(["--stack", "dev", "--replicas", "3", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == sorted(str(p) for p in tmp_path.iterdir())
    assert any(Path(p).name.startswith("balancer-") for p in printed), "the front's phases too"
    assert render.main(["--stack", "dev", "--replicas", "9", "--out", str(tmp_path / "x")]) == 2
    said = capsys.readouterr().err
    assert said.startswith("error: ") and "replicas: 9: accepted: a whole number from 1" in said
    assert not (tmp_path / "x").exists(), "nothing written for a refused stack"
    with pytest.raises(SystemExit, match="no stack file"):
        render.main(["--stack", "nosuchstack", "--out", str(tmp_path / "y")])
