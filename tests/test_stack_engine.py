"""The emulation's engine on the real program, with providers that only record: the order Pulumi
would carry the plan out in, what a changed config re-runs, replacements and deletes. (The hosts
that then really run the phases are the emulation's other half.)"""

from __future__ import annotations

import itertools
import json
import threading
import time
from typing import Any

import pytest
from pulumi.runtime import mocks as pulumi_mocks
from pulumi_harness import DEFAULT_OFFERS, FakeCloud, fake_stdout, stack_config
from stack.deploy import Stack
from stack.engine import Engine, Resource

# The DigitalOcean provider's ForceNew Droplet inputs (terraform-provider-digitalocean
# droplet/resource_droplet.go; docs/facts.md, corrected: size is not among them).
DROPLET_FORCE_NEW = frozenset(
    {"image", "region", "sshKeys", "userData", "monitoring", "dropletAgent", "vpcUuid"}
)
COMMAND = "command:remote:Command"


class RecordingCloud:
    """DigitalOcean, TLS and random resources: made by the program harness's fake, each create
    with an id of its own (a replacement is a new Droplet)."""

    def __init__(self, fake: FakeCloud) -> None:
        self.fake = fake
        self.ids = itertools.count(1)
        self.deleted: list[str] = []

    def force_new(self, type_: str) -> frozenset[str]:
        return DROPLET_FORCE_NEW if type_.endswith("droplet:Droplet") else frozenset()

    def create(self, new: Resource) -> tuple[str, dict[str, Any]]:
        args = pulumi_mocks.MockResourceArgs(new.type, new.name, dict(new.inputs), "", "", True)
        made, outputs = self.fake.new_resource(args)
        # DigitalOcean's ids are numbers where the provider reads them as such (a Droplet's).
        return (
            f"{made}{next(self.ids)}" if made.isdigit() else f"{made}-{next(self.ids)}"
        ), outputs

    def update(self, old: Resource, new: Resource) -> dict[str, Any]:
        return {**old.outputs, **new.inputs}

    def delete(self, old: Resource) -> None:
        self.deleted.append(old.name)

    def read(self, new: Resource, import_id: str) -> dict[str, Any]:
        return dict(new.inputs)

    def refresh(self, old: Resource) -> dict[str, Any] | None:
        return old.outputs


class RecordingCommands:
    """Remote Commands that run nothing but say what ran, when, and print what a phase prints
    last (its JSON line, unique per run as lib.sh's `run` makes it)."""

    def __init__(self, seconds: float = 0.0, fail: tuple[str, ...] = ()) -> None:
        self.seconds, self.fail = seconds, fail
        self.runs: list[tuple[str, str, float, float]] = []  # op, name, start, end
        self.lock = threading.Lock()
        self.count = itertools.count(1)

    def force_new(self, type_: str) -> frozenset[str]:
        return frozenset({"triggers"})

    def _run(self, op: str, res: Resource) -> dict[str, Any]:
        start = time.monotonic()
        time.sleep(self.seconds)
        if res.name in self.fail:
            raise RuntimeError(f"[{res.name}] FAILED at step download: the download stalled")
        with self.lock:
            self.runs.append((op, res.name, start, time.monotonic()))
        phase = res.name.removeprefix("balancer-").removeprefix("bootstrap-").lstrip("-0123456789")
        line = json.loads(fake_stdout(phase if phase in FAKE_PHASES else "preflight"))
        line["run"] = f"run-{next(self.count)}"
        return {**res.inputs, "stdout": json.dumps(line), "stderr": ""}

    def create(self, new: Resource) -> tuple[str, dict[str, Any]]:
        return f"{new.name}-{next(self.count)}", self._run("create", new)

    def update(self, old: Resource, new: Resource) -> dict[str, Any]:
        return self._run("update", new)

    def delete(self, old: Resource) -> None:
        if old.inputs.get("delete"):
            with self.lock:
                self.runs.append(("delete", old.name, time.monotonic(), time.monotonic()))

    def read(self, new: Resource, import_id: str) -> dict[str, Any]:
        raise AssertionError("a Command is never imported")

    def refresh(self, old: Resource) -> dict[str, Any] | None:
        return old.outputs

    def ran(self, op: str = "") -> list[str]:
        return [name for o, name, _, _ in self.runs if op in ("", o)]


FAKE_PHASES = ("preflight", "driver", "cgroup", "reboot", "reboot-wait", "cache", "conda", "vllm",
               "model", "service", "gateway", "autodown", "ready", "member")  # fmt: skip


def dev(**changes: Any) -> dict[str, Any]:
    config = stack_config("dev")
    for key, value in changes.items():
        config[key] = {**config.get(key, {}), **value}
    return config


def make_stack(commands: RecordingCommands) -> tuple[Stack, RecordingCloud]:
    fake = FakeCloud(DEFAULT_OFFERS)
    cloud = RecordingCloud(fake)
    providers = {"digitalocean:": cloud, "tls:": cloud, "random:": cloud, "command:": commands}
    return Stack("dev", providers, fake), cloud


def test_a_first_up_runs_every_phase_once_in_dependency_order_with_the_independent_in_parallel() -> (
    None
):
    commands = RecordingCommands(seconds=0.3)
    stack, _ = make_stack(commands)
    result = stack.up(dev())
    assert result.error is None, result.error
    ran = commands.ran("create")
    phases = [n.removeprefix("bootstrap-") for n in ran]
    assert sorted(phases) == sorted(["preflight", "lock", "driver", "cgroup", "cache", "conda",
        "vllm", "model", "reboot", "reboot-wait", "service", "gateway", "autodown", "ready"])  # fmt: skip
    before = [("preflight", "driver"), ("conda", "vllm"), ("conda", "model"),
        ("vllm", "reboot"), ("model", "reboot"), ("reboot-wait", "service"),
        ("service", "ready"), ("gateway", "ready")]  # fmt: skip
    when = {n.removeprefix("bootstrap-"): (s, e) for _, n, s, e in commands.runs}
    for first, then in before:
        assert when[first][1] <= when[then][0], f"{first} ends before {then} starts"
    # The driver installs beside the cache and the downloads: they overlap in time.
    assert when["driver"][0] < when["cache"][1] and when["cache"][0] < when["driver"][1]
    assert when["vllm"][0] < when["model"][1] and when["model"][0] < when["vllm"][1]
    assert result.outputs["endpoint"].startswith("https://")


def test_an_unchanged_second_up_runs_nothing_and_a_new_flag_reruns_from_service() -> None:
    commands = RecordingCommands()
    stack, _ = make_stack(commands)
    assert stack.up(dev()).error is None
    commands.runs.clear()
    again = stack.up(dev())
    assert again.error is None and commands.runs == []
    assert set(again.ops("same")) >= {"bootstrap-preflight", "gpu"}
    newer = stack.up(dev(vllm={"maxModelLen": 8192}))
    assert newer.error is None, newer.error
    # The service's settings changed (its stdin): it updates; ready's trigger is the service's
    # new result, so it runs again; nothing before the service does.
    assert commands.ran("update") == ["bootstrap-service"]
    assert "bootstrap-ready" in commands.ran("create")
    assert not {"bootstrap-preflight", "bootstrap-driver", "bootstrap-model"} & set(commands.ran())


def test_a_new_size_replaces_the_droplet_deleting_it_and_its_phases_first() -> None:
    commands = RecordingCommands()
    stack, cloud = make_stack(commands)
    assert stack.up(dev()).error is None
    first = stack.state[next(u for u in stack.state if u.endswith("::gpu"))].id
    commands.runs.clear()
    result = stack.up(dev(droplet={"size": "gpu-l40sx1-48gb", "regions": ["tor1"]}))
    assert result.error is None, result.error
    assert result.ops("replace", "droplet:Droplet") == ["gpu"]
    # Deleted before its replacement was made (delete_before_replace), with the phases whose
    # triggers held its id, and never two Droplets at once.
    gpu_steps = [s for s in result.steps if s.urn.endswith("::gpu")]
    assert [s.op for s in gpu_steps] == ["delete", "replace"], gpu_steps
    gone, made = gpu_steps
    assert gone.started + gone.seconds <= made.started, "the old Droplet went first"
    assert "gpu" in cloud.deleted
    deletes = [s.urn.rsplit("::", 1)[1] for s in result.steps if s.op == "delete"]
    assert "bootstrap-preflight" in deletes and deletes.index(
        "bootstrap-preflight"
    ) < deletes.index("gpu")
    second = stack.state[next(u for u in stack.state if u.endswith("::gpu"))].id
    assert second != first
    assert "bootstrap-preflight" in commands.ran("create"), "every phase on the new Droplet"


def test_a_failed_phase_stops_what_depends_on_it_and_the_next_up_converges() -> None:
    commands = RecordingCommands(fail=("bootstrap-model",))
    stack, _ = make_stack(commands)
    result = stack.up(dev())
    assert result.failed is not None, result.error
    assert result.failed.resource.name == "bootstrap-model"
    assert "download stalled" in str(result.failed)
    assert not {"bootstrap-reboot", "bootstrap-service", "bootstrap-ready"} & set(commands.ran())
    done = set(commands.ran())
    assert {"bootstrap-driver", "bootstrap-vllm"} <= done, "what does not need the model ran"
    commands.fail = ()
    commands.runs.clear()
    again = stack.up(dev())
    assert again.error is None, again.error
    rerun = set(commands.ran())
    assert {"bootstrap-model", "bootstrap-reboot", "bootstrap-service", "bootstrap-ready"} <= rerun
    assert not rerun & done, "what succeeded is not run again"


def test_destroy_deletes_everything_dependents_first() -> None:
    commands = RecordingCommands()
    stack, _ = make_stack(commands)
    assert stack.up(dev()).error is None
    result = stack.destroy()
    assert result.error is None
    assert stack.state == {}
    deletes = result.ops("delete")
    assert deletes.index("gpu-fw") < deletes.index("gpu")
    assert deletes.index("bootstrap-ready") < deletes.index("bootstrap-service")
    assert deletes.index("bootstrap-preflight") < deletes.index("gpu")


@pytest.mark.parametrize("stack_name", ["dev"])
def test_the_engine_needs_no_more_than_the_program_registers(stack_name: str) -> None:
    """Every type the dev stack registers has a provider here: a new type fails loudly."""
    commands = RecordingCommands()
    stack, _ = make_stack(commands)
    assert stack.up(stack_config(stack_name)).error is None
    assert {r.type.split(":")[0] for r in stack.state.values()} <= {
        "digitalocean",
        "tls",
        "random",
        "command",
    }


def test_a_dependent_that_holds_the_replaced_id_as_a_number_goes_first() -> None:
    """A Volume attachment holds its Droplet's id as a number, and numbers reach the monitor as
    floats (protobuf's Value): 424242001.0 still names Droplet 424242001, so a delete-before-
    replace of the Droplet takes the attachment first (the attachment's dropletId forces it)."""

    class Volumes(RecordingCloud):
        def force_new(self, type_: str) -> frozenset[str]:
            if type_.endswith("volumeAttachment:VolumeAttachment"):
                return frozenset({"dropletId", "volumeId"})
            return super().force_new(type_)

    droplet = Resource("urn:d", "digitalocean:index/droplet:Droplet", "gpu", "424242001",
                       {}, {"ipv4Address": "203.0.113.10"})  # fmt: skip
    attachment = Resource(
        "urn:a", "digitalocean:index/volumeAttachment:VolumeAttachment", "cache-attachment",
        "a-1", {"dropletId": 424242001.0, "volumeId": "v-1"}, {}, dependencies={"urn:d"},
    )  # fmt: skip
    unrelated = Resource(
        "urn:u", "digitalocean:index/volumeAttachment:VolumeAttachment", "other", "a-2",
        {"dropletId": 424242002.0, "volumeId": "v-2"}, {}, dependencies={"urn:d"},
    )  # fmt: skip
    cloud = Volumes(FakeCloud(DEFAULT_OFFERS))
    state = {r.urn: r for r in (droplet, attachment, unrelated)}
    engine = Engine(cloud.fake, {"digitalocean:": cloud}, state)
    assert engine.dependent_replacements(droplet) == [attachment]
