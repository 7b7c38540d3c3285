"""The bootstrap Commands under mocks: names, edges, re-run rule, secrets, the vLLM env a lock
names, the timeline. How each Command runs on the host (its fixed text, stdin, bounds):
test_remote.py; the vLLM unit it installs: test_vllm_service.py."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from pulumi_harness import (
    FAKE_API_KEY,
    FAKE_DROPLET_ID,
    FAKE_IPV4,
    SECRET_SIG,
    Run,
    fake_stdout,
    plain_strings,
    run_program,
    stack_config,
)
from test_droplet import HF_TOKEN, dev

from components.cloud import bootstrap
from components.host import phase_settings, phases
from components.spec import config, schema

COMMAND = "command:remote:Command"
# The overlap: the cache, conda, the vLLM env and the weights download beside the driver
# install; the one reboot waits for all of them; the gateway comes up beside the service; ready
# needs both.
EDGES = {
    "preflight": set(),
    "driver": {"preflight"},
    "cgroup": {"driver"},
    "cache": {"preflight"},
    "conda": {"cache"},
    "vllm": {"conda"},
    "model": {"conda"},
    "reboot": {"cgroup", "vllm", "model"},
    "reboot-wait": {"reboot"},
    "service": {"reboot-wait"},
    "gateway": {"reboot-wait"},
    # Before anything that can fail for long: a failed bootstrap is still bounded (issue 42).
    "autodown": {"preflight"},
    "ready": {"service", "gateway"},
}


def commands(run: Run) -> dict[str, Any]:
    return {r.name.removeprefix("bootstrap-"): r for r in run.registrations if r.type == COMMAND}


def test_one_command_per_phase_with_the_documented_edges() -> None:
    run = run_program(stack_config("dev"))
    assert run.error is None, run.error
    cmds = commands(run)
    assert set(cmds) == set(EDGES)
    by_urn = {r.urn: name for name, r in cmds.items()}
    lock = run.one("command:remote:CopyToRemote")
    for name, reg in cmds.items():
        upstream = {by_urn[u] for u in reg.dependencies if u in by_urn}
        assert upstream == EDGES[name], name
        # The cascade: a phase's triggers are exactly its parents' results; the first phase's
        # is the Droplet itself.
        parents = sorted(EDGES[name], key=list(EDGES).index)
        expected = [fake_stdout(p) for p in parents] or [FAKE_DROPLET_ID]
        assert reg.inputs.get("triggers", []) == expected, name
    assert lock.urn in cmds["vllm"].dependencies
    # The lock goes over as soon as preflight saw the host ready: the vllm phase runs before the
    # reboot, beside the driver install.
    assert cmds["preflight"].urn in lock.dependencies
    assert cmds["reboot-wait"].urn not in lock.dependencies
    assert lock.inputs["triggers"] == [phase_settings.lock_sha256(config_of(run)), FAKE_DROPLET_ID]


def config_of(run: Run) -> Any:
    return config.parse(stack_config("dev"), "dev")


def test_a_new_droplet_gets_the_lock_and_every_phase_again() -> None:
    """A replaced Droplet (a new id), even at the same address with the same keys: the lock copy
    and the first phase are replaced (triggers), and the cascade re-runs every other phase.
    CopyToRemote alone would not copy again: its update copies only for a new file or path."""
    before = run_program(stack_config("dev"))
    after = run_program(stack_config("dev"), droplet_id="777777")
    lock_a, lock_b = (r.one("command:remote:CopyToRemote") for r in (before, after))
    assert lock_a.inputs["connection"] == lock_b.inputs["connection"]  # same IP, same keys
    assert lock_a.inputs["triggers"] != lock_b.inputs["triggers"]
    assert commands(before)["preflight"].inputs["triggers"] == [FAKE_DROPLET_ID]
    assert commands(after)["preflight"].inputs["triggers"] == ["777777"]
    # preflight is replaced, so its result (unique per run) changes and every phase follows.
    assert {n for n, parents in EDGES.items() if not parents} == {"preflight"}


def test_bootstrap_seconds_are_exported_per_phase() -> None:
    run = run_program(stack_config("dev"))
    assert run.outputs["bootstrapSeconds"].value == {name: 1.5 for name in EDGES}


def reruns(before: Run, after: Run) -> set[str]:
    """Phases whose own inputs changed, plus everything downstream of them (the triggers)."""
    a, b = commands(before), commands(after)
    changed = {n for n in EDGES if a[n].inputs["stdin"] != b[n].inputs["stdin"]}
    lock_changed = (
        before.one("command:remote:CopyToRemote").inputs
        != after.one("command:remote:CopyToRemote").inputs
    )
    if lock_changed:
        changed.add("vllm")
    grew = True
    while grew:
        more = {n for n, parents in EDGES.items() if parents & changed} - changed
        changed |= more
        grew = bool(more)
    return changed


AFTER_SERVICE = {"service", "ready"}
# A download re-runs the (no-op unless asked) reboot and everything after it.
AFTER_REBOOT = {"reboot", "reboot-wait", "service", "gateway", "ready"}
RERUNS = [
    ({"model": {"id": "nvidia/NVIDIA-Nemotron-3-Nano-4B-FP8"}}, {"model", *AFTER_REBOOT}),
    ({"model": {"servedName": "nemo"}}, AFTER_SERVICE),
    ({"vllm": {"maxModelLen": 16384}}, AFTER_SERVICE),
    ({"vllm": {"gpuMemoryUtilization": 0.8}}, AFTER_SERVICE),
    ({"access": {"domain": "llm.example.com", "acmeEmail": "o@example.com"}}, {"gateway", "ready"}),
    ({"access": {"maxRequestBodyMb": 64}}, {"gateway", "ready"}),
    ({"autodown": {"idleMinutes": 45}}, {"autodown"}),
    # A phase's bound is part of autodown's bootstrap deadline (phases.bootstrap_minutes).
    ({"bootstrap": {"readyTimeoutMinutes": 60}}, {"ready", "autodown"}),
    ({"bootstrap": {"driver": {"branch": "590"}}}, {"driver", "cgroup", *AFTER_REBOOT}),
    ({"bootstrap": {"cgroup": {"mode": "legacy"}}}, {"cgroup", *AFTER_REBOOT}),
    ({"vllm": {"install": "source"}}, {"vllm", "autodown", *AFTER_REBOOT}),
]


@pytest.mark.parametrize(("override", "expected"), RERUNS)
def test_a_changed_input_reruns_that_phase_and_later_ones_only(
    override: dict, expected: set[str]
) -> None:
    before = run_program(stack_config("dev"))
    after = run_program(dev(**override))
    assert after.error is None, after.error
    assert reruns(before, after) == expected


def test_the_api_key_reaches_vllm_and_the_gateway_as_a_secret_and_nothing_else() -> None:
    run = run_program(stack_config("dev"))
    cmds = commands(run)
    assert f"VLLM_API_KEY={FAKE_API_KEY}" in cmds["service"].inputs["stdin"]
    assert f"NEMO_API_KEY={FAKE_API_KEY}" in cmds["gateway"].inputs["stdin"]
    for name in ("service", "gateway"):
        assert cmds[name].raw["stdin"][SECRET_SIG], name
    for name, reg in cmds.items():
        if name not in ("service", "gateway"):
            assert FAKE_API_KEY not in str(reg.inputs), name
    gateway_stdin = cmds["gateway"].inputs["stdin"]
    assert f"NEMO_HOST={FAKE_IPV4}" in gateway_stdin
    assert (
        f"\n{FAKE_IPV4} {{\n\ttls {{\n\t\tissuer acme {{\n\t\t\tprofile shortlived" in gateway_stdin
    )
    assert f"default_sni {FAKE_IPV4}" in gateway_stdin
    ready_stdin = cmds["ready"].inputs["stdin"]
    assert f"NEMO_PROBE_URL=https://{FAKE_IPV4}/v1/chat/completions" in ready_stdin


def test_the_hf_token_travels_only_in_the_model_phase_stdin_as_a_secret() -> None:
    run = run_program(stack_config("dev"), secrets={"hfToken": HF_TOKEN})
    cmds = commands(run)
    assert cmds["model"].raw["stdin"][SECRET_SIG]
    assert f"NEMO_HF_TOKEN={HF_TOKEN}" in cmds["model"].inputs["stdin"]
    for name, reg in cmds.items():
        if name != "model":
            assert HF_TOKEN not in str(reg.inputs), name
    # The connection's private key is a secret everywhere.
    for reg in cmds.values():
        assert reg.raw["connection"][SECRET_SIG]


# The committed lock's sha256, read here, not from the program.
LOCK_SHA256 = hashlib.sha256((schema.LOCKS_DIR / "vllm-0.33.0-py3.12.txt").read_bytes()).hexdigest()


def env_lines(stdin: str) -> list[str]:
    """The lines of a phase's stdin that name the vLLM env, in this order."""
    prefixes = ("ExecStart=", "Environment=PATH=", "NEMO_VLLM_ENV=")
    lines = stdin.splitlines()
    return [line for prefix in prefixes for line in lines if line.startswith(prefix)]


def test_the_vllm_env_follows_the_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new lock names a new env: the vllm phase installs there, the unit (ExecStart, PATH)
    runs from there, so the unit changes and the service phase switches. conda does not re-run."""
    locks = tmp_path / "locks"
    shutil.copytree(schema.LOCKS_DIR, locks)
    new_lock = (
        (locks / "vllm-0.33.0-py3.12.txt").read_text().replace("vllm==0.33.0", "vllm==0.33.1")
    )
    (locks / "vllm-0.33.1-py3.12.txt").write_text(new_lock)
    sha = hashlib.sha256(new_lock.encode()).hexdigest()
    monkeypatch.setattr(schema, "LOCKS_DIR", locks)
    monkeypatch.setattr(config, "LOCKS_DIR", locks)
    before = run_program(stack_config("dev"))
    after = run_program(dev(vllm={"version": "0.33.1"}))
    for run, env in (
        (before, f"/opt/conda/envs/vllm-0.33.0-{LOCK_SHA256[:12]}"),
        (after, f"/opt/conda/envs/vllm-0.33.1-{sha[:12]}"),
    ):
        cmds = commands(run)
        execs, paths, settings = env_lines(cmds["service"].inputs["stdin"])
        assert execs.startswith(f"ExecStart={env}/bin/vllm serve ")
        assert paths.startswith(f"Environment=PATH={env}/bin:")
        assert settings == f"NEMO_VLLM_ENV={env}"
        assert env_lines(cmds["vllm"].inputs["stdin"]) == [f"NEMO_VLLM_ENV={env}"]
    assert "conda" not in reruns(before, after) and {"vllm", "service"} <= reruns(before, after)
    # A source build is named by its git ref.
    source = commands(run_program(dev(vllm={"install": "source", "gitRef": "releases/v0.33"})))
    assert env_lines(source["vllm"].inputs["stdin"]) == [
        f"NEMO_VLLM_ENV=/opt/conda/envs/vllm-src-releases_v0.33-{LOCK_SHA256[:12]}"
    ]


def test_the_gateway_unit_may_not_reach_the_metadata_service_either() -> None:
    stdin = commands(run_program(stack_config("dev")))["gateway"].inputs["stdin"]
    assert "\nIPAddressDeny=169.254.169.254/32\n" in stdin
    assert "iptables" not in stdin, "the per-unit firewall replaces the iptables guard"


def test_missing_lock_is_a_config_error_naming_the_command_to_write_it() -> None:
    run = run_program(dev(bootstrap={"python": "3.11"}))
    assert run.error is not None
    assert any("scripts/lock-vllm.sh 0.33.0 3.11" in p for p in run.error.problems)  # type: ignore[attr-defined]
    assert run.registrations == []


AUTODOWN_TOKEN = "dop_v1_FAKEprogramTOKEN000111222333"


def test_autodown_phase_follows_preflight_and_its_token_is_secret() -> None:
    rule = {"idleMinutes": 30, "maxHours": 8, "token": AUTODOWN_TOKEN}
    raw = stack_config("dev")
    raw.pop("autodown", None)
    run = run_program(raw, secrets={"autodown": json.dumps(rule)})
    assert run.error is None, run.error
    cmds = commands(run)
    # Installed before the driver, the downloads and vLLM, so that a bootstrap failing in any
    # of them is still bounded by the rule's bootstrap deadline (issue 42).
    assert [u for u in cmds["autodown"].dependencies if u in {c.urn for c in cmds.values()}] == [
        cmds["preflight"].urn
    ]
    assert "AUTODOWN_BOOTSTRAP_MINUTES=350\n" in cmds["autodown"].inputs["stdin"]
    assert "AUTODOWN_UNREADABLE_MINUTES=350" in cmds["autodown"].inputs["stdin"]
    assert cmds["autodown"].raw["stdin"][SECRET_SIG]
    assert f"AUTODOWN_TOKEN={AUTODOWN_TOKEN}" in cmds["autodown"].inputs["stdin"]
    for reg in run.registrations:
        for path, text in plain_strings(reg.raw):
            assert AUTODOWN_TOKEN not in text, (reg.name, path)
    assert run.outputs["autodown"].value == {
        "mode": "delete", "idleMinutes": 30, "maxHours": 8.0, "bootstrapMinutes": 350
    }  # fmt: skip
    assert AUTODOWN_TOKEN not in str(run.outputs)


def test_autodown_without_a_token_is_a_dry_run_and_off_by_default() -> None:
    run = run_program(stack_config("dev"))
    assert run.outputs["autodown"].value == {
        "mode": "dry-run", "idleMinutes": 30, "maxHours": 8.0, "bootstrapMinutes": 350
    }  # fmt: skip
    assert "NEMO_AUTODOWN_MODE=dry-run" in commands(run)["autodown"].inputs["stdin"]
    prod = run_program(stack_config("prod"), stack="prod")
    assert prod.outputs["autodown"].value == {
        "mode": "off", "idleMinutes": None, "maxHours": None, "bootstrapMinutes": None
    }  # fmt: skip


def test_the_bootstrap_deadline_is_the_longest_path_of_the_phases_bounds_or_the_users() -> None:
    """What `pulumi up` itself may wait from preflight to ready (preflight 30, cache 60, conda
    30, model 150, reboot 5, reboot-wait 20, gateway 20, ready 30 + 5 = 350 minutes): a
    shorter default would delete a slow bootstrap that was going to succeed."""
    cfg = config.parse(stack_config("dev"), "dev", frozenset())
    assert phases.bootstrap_minutes(cfg) == 350
    source = config.parse(dev(vllm={"install": "source"}), "dev", frozenset())
    assert phases.bootstrap_minutes(source) == 30 + 60 + 30 + 300 + 5 + 20 + 20 + 35
    mine = config.parse(dev(autodown={"maxHours": 8, "bootstrapMinutes": 45}), "dev", frozenset())
    assert phases.bootstrap_minutes(mine) == 45
    assert "AUTODOWN_BOOTSTRAP_MINUTES=45\n" in str(
        phases.settings(mine, "autodown")["NEMO_AUTODOWN_ENV_TEXT"]
    )


def test_autodown_token_in_plain_text_is_refused() -> None:
    run = run_program(dev(autodown={"idleMinutes": 30, "token": AUTODOWN_TOKEN}))
    assert run.error is not None
    assert run.error.problems == [  # type: ignore[attr-defined]
        "autodown.token: stored in plain text; set it as a secret: "
        "`pulumi config set --secret --path autodown.token` (no value after it: Pulumi asks for it without echo, or reads it from a file: `... < FILE`)"
    ]
    assert AUTODOWN_TOKEN not in str(run.error)


def test_the_timeline_output_carries_each_phases_times_and_what_it_waited_for() -> None:
    run = run_program(stack_config("dev"))
    timeline = run.outputs["bootstrapTimeline"].value
    assert list(timeline) == list(phases.PHASE_NAMES)
    assert timeline["preflight"] == {
        "start": 1_000_000_000.0, "end": 1_000_000_001.5, "seconds": 1.5, "after": [],
    }  # fmt: skip
    assert timeline["vllm"]["after"] == ["conda"], "the lock copy is not a phase"
    assert timeline["ready"]["after"] == ["service", "gateway"]
    assert timeline["reboot"]["after"] == ["cgroup", "vllm", "model"]
    assert run.outputs["bootstrapSeconds"].value["ready"] == 1.5


def test_the_timeline_keeps_results_of_earlier_versions_without_times() -> None:
    old = {"phase": "model", "changed": False, "seconds": 2.0, "boot_id": "b", "run": "r"}
    stdouts = {name: json.dumps(old | {"phase": name}) for name in phases.PHASE_NAMES}
    timeline = bootstrap.timeline(stdouts)
    assert timeline["model"] == {"start": None, "end": None, "seconds": 2.0, "after": ["conda"]}


def test_the_timeline_keeps_what_the_model_phase_fetched() -> None:
    """The model phase's bytes over the network and their seconds: timeline.py's rate."""
    result = {"phase": "model", "changed": True, "seconds": 95.0, "started_at": 1.0,
              "ended_at": 96.0, "download_bytes": 8_000_000_000, "download_seconds": 90.5}  # fmt: skip
    stdouts = {name: json.dumps(result | {"phase": name}) for name in phases.PHASE_NAMES}
    entry = bootstrap.timeline(stdouts)["model"]
    assert entry["download_bytes"] == 8_000_000_000 and entry["download_seconds"] == 90.5
