"""Autoscale, the program's side (issue 33): where the count lives. The front's step asks for a
count through deploy.yml's `replicas` input (NEMOTRON_REPLICAS); every other run keeps what the
cloud has, within autoscale.min and max; the config refuses what cannot work before anything
is declared."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from pulumi_harness import ROOT, VOLUME, Run, existing_volume, run_program
from test_droplet import DROPLET, dev
from test_entry import live_set, of

from components import validate
from components.cloud import scale
from components.spec import catalog, config
from components.spec.config import ConfigError
from components.spec.schema import AutoscaleConfig

COMMAND = "command:remote:Command"
WAKE = {"enabled": True, "githubRepo": "me/llm", "token": "github_pat_x"}


def scaled(**autoscale: Any) -> dict[str, Any]:
    """The dev stack behind the waking front with autoscale."""
    raw = dev()
    raw["wake"] = WAKE
    raw["autoscale"] = {"min": 1, "max": 3, **autoscale}
    return raw


def run(raw: dict[str, Any], monkeypatch: pytest.MonkeyPatch, asked: str | None = None,
        **account: Any) -> Run:  # fmt: skip
    if asked is None:
        monkeypatch.delenv(scale.ENV, raising=False)
    else:
        monkeypatch.setenv(scale.ENV, asked)
    secrets = {"wake": json.dumps(raw.pop("wake"))}
    return run_program(raw, secrets=secrets, **account)


def gpus(result: Run) -> list[str]:
    return sorted(name for name in of(result, DROPLET) if name.startswith("gpu"))


# ---- the count ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bounds", "live", "asked", "count", "source", "note"),
    [
        # A step's count, within the bounds.
        ((1, 3), 1, "2", 2, "asked", "asked for 2"),
        ((1, 3), 2, "7", 3, "asked", "asked for 7, kept within autoscale.max: 3"),
        ((2, 3), 3, "1", 2, "asked", "asked for 1, kept within autoscale.min (at least 1): 2"),
        ((0, 3), 1, "0", 1, "asked", "asked for 0, kept within autoscale.min (at least 1): 1"),
        # A push (no input) keeps what runs: never undoes a step...
        ((1, 3), 3, None, 3, "live", "3 alive"),
        ((1, 3), 2, "", 2, "live", "2 alive"),
        # ...nor outlives a changed bound.
        ((1, 2), 3, None, 2, "live", "3 alive, kept within autoscale.max: 2"),
        ((2, 4), 1, None, 2, "live", "1 alive, kept within autoscale.min: 2"),
        # None alive (autodown deleted the set): the floor, as a wake brings it.
        ((0, 3), 0, None, 1, "floor", "none alive: max(autoscale.min, 1) = 1"),
        ((2, 3), 0, None, 2, "floor", "none alive: max(autoscale.min, 1) = 2"),
    ],
)
def test_the_count_is_the_steps_or_the_clouds_within_the_bounds(
    bounds: tuple[int, int], live: int, asked: str | None, count: int, source: str, note: str
) -> None:
    got = scale.decide(AutoscaleConfig(min=bounds[0], max=bounds[1]), live, asked)
    assert (got.replicas, got.source, got.note) == (count, source, note)


@pytest.mark.parametrize("asked", ["three", "-1", "2.5", "1e3", "3; rm -rf /", "9999",
                                   "\uff13", "\u0663", "\u00b2", "+3", "0x3", "3\x00"])  # fmt: skip
def test_an_input_that_is_not_a_count_is_refused_naming_it(asked: str) -> None:
    with pytest.raises(ConfigError) as err:
        scale.decide(AutoscaleConfig(min=1, max=3), 1, asked)
    [problem] = err.value.problems
    assert problem.startswith(f"{scale.ENV} (deploy.yml's `replicas` input): ")
    assert "accepted: a whole number of replicas, 1 to 3" in problem


@pytest.mark.parametrize("asked", [" 3 ", "003", "\u00a03\u2003", "3\n"])
def test_a_count_with_whitespace_or_leading_zeros_is_the_count(asked: str) -> None:
    """What a CI may hand over around a count (a trailing newline, padding) is not part of it;
    a digit of another script ("\uff13") is refused above, never read as a count."""
    assert scale.decide(AutoscaleConfig(min=1, max=3), 1, asked).replicas == 3


def test_a_push_keeps_the_replicas_a_step_added(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three replicas alive (a step added two): a push declares three, and says why."""
    result = run(scaled(), monkeypatch, droplets=live_set(3))
    assert result.error is None, result.error
    assert gpus(result) == ["gpu", "gpu-1", "gpu-2"]
    out = result.outputs["autoscale"].value
    assert (out["mode"], out["replicas"], out["countFrom"]) == ("on", 3, "3 alive")
    assert (out["min"], out["max"]) == (1, 3)
    assert out["maxHourlyPriceUsd"] == pytest.approx(3 * 0.76)
    assert result.outputs["hourlyPriceUsd"].value == pytest.approx(3 * 0.76 + 0.00893)


def test_a_step_asks_one_more_and_the_highest_index_is_the_new_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    result = run(scaled(), monkeypatch, asked="3", droplets=live_set(2))
    assert result.error is None, result.error
    assert gpus(result) == ["gpu", "gpu-1", "gpu-2"]
    assert result.outputs["autoscale"].value["countFrom"] == "asked for 3"


def test_a_step_in_removes_the_highest_index_and_keeps_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    result = run(scaled(), monkeypatch, asked="2", droplets=live_set(3))
    assert result.error is None, result.error
    assert gpus(result) == ["gpu", "gpu-1"], "replica 2 leaves; 0 and 1 keep their URNs"


def test_a_replica_that_died_among_the_others_is_made_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Replicas 0 and 2 alive (1 was deleted by hand): the count is 3, not 2, so replica 2 is
    not deleted under its requests."""
    alive = [d for i, d in enumerate(live_set(3)) if i != 1]
    result = run(scaled(), monkeypatch, droplets=alive)
    assert result.error is None, result.error
    assert gpus(result) == ["gpu", "gpu-1", "gpu-2"]


def test_another_stacks_droplets_and_strays_do_not_count(monkeypatch: pytest.MonkeyPatch) -> None:
    other = live_set(3)
    for d in other:
        d["tags"] = ["nemotron-droplet", "stack:prod"]
    stray = {**live_set(1)[0], "name": "nemotron-dev-backup", "id": 99}
    result = run(scaled(), monkeypatch, droplets=[*other, stray])
    assert result.error is None, result.error
    assert gpus(result) == ["gpu"], "none of this stack's replicas alive: the floor"


def test_without_autoscale_the_input_is_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(scale.ENV, "3")
    result = run_program({**dev(), "replicas": 2})
    assert result.error is None, result.error
    assert gpus(result) == ["gpu", "gpu-1"]
    assert result.outputs["autoscale"].value == {"mode": "off", "replicas": 2}


def test_a_bad_input_is_refused_before_anything_is_declared(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    result = run(scaled(), monkeypatch, asked="lots")
    assert isinstance(result.error, ConfigError), result.error
    assert result.registrations == [] or not of(result, DROPLET)


# ---- what a step stands on ------------------------------------------------------------------------


def test_the_front_reads_every_replicas_metrics_with_autoscale(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each replica's gateway admits GET /metrics from replica 0 and, with autoscale, the
    front; without autoscale from replica 0 alone."""
    with_scale = run(scaled(), monkeypatch, droplets=live_set(2))
    without = run_program({**dev(), "replicas": 2})
    for result, readers in ((with_scale, 2), (without, 1)):
        assert result.error is None, result.error
        gateways = [r for name, r in of(result, COMMAND).items() if name.endswith("-gateway")
                    and name.startswith("bootstrap")]  # fmt: skip
        assert len(gateways) == 2
        for reg in gateways:
            line = next(x for x in reg.inputs["stdin"].splitlines() if "@metrics_reader" in x)
            assert len(line.split("remote_ip", 1)[1].split()) == readers, line


def test_routing_follows_the_most_the_set_may_have_not_this_runs_count() -> None:
    """A step from one replica to two must not install the router, nor one back remove it."""
    raw = {**scaled(), "balancer": {"routing": "cache-aware"}}
    cfg = config.parse(raw, "dev", frozenset({"wake"}))
    assert cfg.replicas == 1 and cfg.routing == "cache-aware"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"wake": None}, "autoscale.max: autoscale runs on the waking front"),
        ({"replicas": 2}, "replicas: set beside autoscale.max"),
        ({"autoscale": {"min": 3, "max": 2}}, "autoscale.min: 3 is more than autoscale.max (2)"),
        ({"autoscale": {"max": 2, "inWindowSeconds": 30, "outWindowSeconds": 60}},
         "autoscale.inWindowSeconds: 30 is shorter than autoscale.outWindowSeconds (60)"),
        ({"autoscale": {"min": 0, "max": 2}, "autodown": {"maxHours": 8}},
         "autoscale.min: 0 lets the set sleep"),
        ({"autoscale": {"max": 9}}, "autoscale.max: "),
        ({"autoscale": {"max": 2, "inUtilization": 1}}, "autoscale.inUtilization: "),
        ({"autoscale": {"max": 2, "dailyBudgetUsd": 0}}, "autoscale.dailyBudgetUsd: "),
    ],
)  # fmt: skip
def test_an_autoscale_that_cannot_work_is_refused_naming_the_field(
    change: dict[str, Any], message: str
) -> None:
    raw = scaled()
    for key, value in change.items():
        if value is None:
            raw.pop(key)
        else:
            raw[key] = value
    with pytest.raises(ConfigError) as err:
        config.parse(raw, "dev", frozenset({"wake"}))
    assert any(p.startswith(message) for p in err.value.problems), err.value.problems


def test_min_0_with_the_idle_rule_is_accepted_and_starts_one() -> None:
    raw = {**scaled(min=0), "autodown": {"idleMinutes": 30}}
    cfg = config.parse(raw, "dev", frozenset({"wake"}))
    assert cfg.replicas == 1 and cfg.autoscale.min == 0


def test_a_workflow_without_the_replicas_input_is_refused_with_autoscale(tmp_path: Path) -> None:
    shipped = yaml.safe_load((ROOT / ".github" / "workflows" / "deploy.yml").read_text())
    del shipped[True]["workflow_dispatch"]["inputs"]["replicas"]
    (tmp_path / "deploy.yml").write_text(yaml.safe_dump(shipped))
    wake = config.WakeConfig.model_validate(WAKE)
    assert config.wake_pipeline_problems(wake, "dev", ROOT / ".github" / "workflows",
                                         scaled=True) == []  # fmt: skip
    [problem] = config.wake_pipeline_problems(wake, "dev", tmp_path, scaled=True)
    assert problem.startswith("autoscale: deploy.yml declares no input `replicas`")
    assert config.wake_pipeline_problems(wake, "dev", tmp_path) == []


def test_deploy_yml_hands_the_input_to_the_program_through_env_only() -> None:
    wf = yaml.safe_load((ROOT / ".github" / "workflows" / "deploy.yml").read_text())
    spec = wf[True]["workflow_dispatch"]["inputs"]["replicas"]
    assert spec == {**spec, "type": "string", "required": False, "default": ""}
    [step] = [s for s in wf["jobs"]["deploy"]["steps"] if s.get("uses", "").startswith("pulumi/")]
    assert step["env"][scale.ENV] == "${{ inputs.replicas }}"


def test_a_replicas_capacity_is_vllms_own_default_unless_set() -> None:
    for slug, seqs in (("gpu-4000adax1-20gb", 256), ("gpu-l40sx1-48gb", 256),
                       ("gpu-h100x1-80gb", 1024), ("gpu-h200x1-141gb", 1024)):  # fmt: skip
        assert catalog.default_max_num_seqs(catalog.SIZES[slug]) == seqs
    raw = {**scaled(), "droplet": {"size": "gpu-h100x1-80gb"}, "vllm": {"maxNumSeqs": 64}}
    assert config.parse(raw, "dev", frozenset({"wake"})).replica_capacity == 64


def test_validate_refuses_a_ceiling_the_policy_pack_would_refuse_mid_step(tmp_path: Path) -> None:
    """5 x H100 lists at $16.95/h, over the default stack-within-budget ($16/h): a step out to
    5 would fail in the pipeline. 4 lists at $13.56/h and passes; the super stack's own entry
    ($24/h) lets 5 through."""
    h100 = {**scaled(), "droplet": {"size": "gpu-h100x1-80gb"}}
    five = config.parse({**h100, "autoscale": {"max": 5}}, "dev", frozenset({"wake"}))
    [problem] = validate.autoscale_budget_problems(five)
    assert problem.startswith("autoscale.max: 5 x gpu-h100x1-80gb lists at $16.95/h, over the "
                              "policy pack's stack-within-budget ($16/h for dev)")  # fmt: skip
    four = config.parse({**h100, "autoscale": {"max": 4}}, "dev", frozenset({"wake"}))
    assert validate.autoscale_budget_problems(four) == []
    on_super = config.parse({**h100, "autoscale": {"max": 5}}, "super", frozenset({"wake"}))
    assert validate.autoscale_budget_problems(on_super) == []
    assert validate.autoscale_budget_problems(five, tmp_path / "none.json") == []


def test_a_step_out_adopts_the_volume_a_step_in_kept_so_it_starts_warm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With cache.keepOnDestroy each replica's Volume outlives its Droplet (retained on
    delete, a step in included), and the step out that brings replica 2 back adopts its
    Volume, with the weights and envs on it: a warm start."""
    raw = {**scaled(), "cache": {"sizeGb": 60, "keepOnDestroy": True}}
    raw["droplet"] = {**raw["droplet"], "regions": ["tor1"]}
    kept = existing_volume(name="nemotron-dev-2-cache", region="tor1", size=60, volume_id="vol-r2")
    result = run(raw, monkeypatch, asked="3", droplets=live_set(2), volumes=[kept])
    assert result.error is None, result.error
    volumes = of(result, VOLUME)
    assert sorted(volumes) == ["cache", "cache-1", "cache-2"]
    assert volumes["cache-2"].import_id == "vol-r2", "the kept Volume is adopted, warm"
    assert all(v.retain_on_delete for v in volumes.values()), "a step in keeps each one"


def commands(result: Run) -> dict[str, str]:
    """Each remote command's inputs, as the engine would compare them."""
    return {r.name: json.dumps(r.inputs, sort_keys=True) for r in result.registrations
            if r.type == COMMAND}  # fmt: skip


def test_a_step_changes_nothing_that_serves_on_the_replicas_that_stay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two replicas live: the step to three adds the new replica's commands (and its join on
    the front), and of those already there changes only replica 0's autodown (the peers it
    reads and deletes); the step back to two is the same plan as before the step out."""
    before = commands(run(scaled(), monkeypatch, asked="2", droplets=live_set(2)))
    out = commands(run(scaled(), monkeypatch, asked="3", droplets=live_set(2)))
    changed = sorted(name for name in before if name in out and before[name] != out[name])
    assert changed == ["bootstrap-autodown"], changed
    added = {name for name in out if name not in before}
    assert added and all("-2-" in name or name.endswith("-2") for name in added), sorted(added)
    back = commands(run(scaled(), monkeypatch, asked="2", droplets=live_set(3)))
    assert back == before
