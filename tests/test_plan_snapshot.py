"""The plan a live stack would see, held still: every resource the program registers for a set
of stacks (its URN, parent, dependencies, options, and a digest of each input as sent on the
wire, secret markers included), compared with the snapshot in tests/golden/plans/.

A refactor that changes no behaviour leaves these files unchanged: same URNs (nothing renamed,
moved under another parent or re-typed), same inputs (no Command runs again, nothing is
replaced). A change that means to change the plan updates them with `./check --update-golden`,
and the diff shows which resource and which input moved.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from pulumi_harness import Registration, run_program, stack_config
from test_kube import DIGEST, EDGE_DIGEST, EPP_DIGEST, FAKE_HF_TOKEN, PROXY_DIGEST
from test_kube_edge import EdgeCloud

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden" / "plans"
AUTODOWN_TOKEN = "dop_v1_PLANsnapshotTOKEN0000000000000000"


def _dev(**changes: Any) -> dict[str, Any]:
    config = stack_config("dev")
    for key, value in changes.items():
        config[key] = {**config.get(key, {}), **value} if isinstance(value, dict) else value
    return config


def _kube(size: str, floor: int) -> dict[str, Any]:
    """The shipped Kubernetes example with its two image digests set (the tests' own), on a
    GPU size at a floor of `floor` nodes and servers."""
    config = stack_config("kube")
    kube = config["kubernetes"]
    config["kubernetes"] = {
        **kube,
        "imageDigest": DIGEST,
        "edge": {**kube["edge"], "imageDigest": EDGE_DIGEST},
        "router": {"eppImageDigest": EPP_DIGEST, "proxyImageDigest": PROXY_DIGEST},
        "gpuPool": {**kube["gpuPool"], "size": size, "minNodes": floor},
        "replicas": {**kube["replicas"], "min": floor},
    }
    return config


def _domain(zone: str = "example.com") -> dict[str, Any]:
    return {"domain": f"llm.{zone}", "dnsZone": zone, "acmeEmail": f"ops@{zone}"}


# name -> (config, secrets, account): the shipped stacks and the shapes the program takes.
STACKS: dict[str, tuple[dict[str, Any], dict[str, str], dict[str, Any]]] = {
    "dev": (stack_config("dev"), {}, {}),
    "prod": (stack_config("prod"), {}, {}),
    "super": (stack_config("super"), {}, {}),
    "dev-replicas-caddy": (_dev(replicas=3), {}, {}),
    "dev-replicas-managed": (
        _dev(replicas=2, access=_domain()),
        {},
        {"zones": ("example.com",)},
    ),
    "dev-domain-cache-autodown": (
        {k: v for k, v in _dev(access=_domain(), cache={"sizeGb": 58}).items() if k != "autodown"},
        {"autodown": json.dumps({"idleMinutes": 30, "maxHours": 8, "token": AUTODOWN_TOKEN})},
        {"zones": ("example.com",)},
    ),
    # platform: kubernetes, asleep (min 0) and with a floor of one node, on two GPU sizes.
    **{
        f"kube-{size.split('-')[1][:4]}-min{floor}": (
            _kube(size, floor),
            {"hfToken": FAKE_HF_TOKEN},
            {"cloud_type": EdgeCloud, "stack": "kube"},
        )
        for size in ("gpu-h100x1-80gb", "gpu-l40sx1-48gb")
        for floor in (0, 1)
    },
}


def _digest(value: Any) -> str:
    """A short digest of one input as sent (secret markers kept), with this checkout's path
    taken out (a FileAsset names its absolute path)."""
    text = json.dumps(value, sort_keys=True).replace(str(ROOT), "<repo>")
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def plan(registrations: list[Registration]) -> dict[str, Any]:
    """The snapshot of one run's registrations, by URN."""
    out: dict[str, Any] = {}
    for r in registrations:
        out[r.urn] = {
            "type": r.type,
            "parent": r.parent,
            "dependencies": sorted(r.dependencies),
            "options": {
                "customTimeouts": r.custom_timeouts,
                "deleteBeforeReplace": r.delete_before_replace,
                "replaceOnChanges": sorted(r.replace_on_changes),
                "retainOnDelete": r.retain_on_delete,
                "importId": r.import_id,
            },
            "inputs": {k: _digest(v) for k, v in sorted(r.raw.items())},
        }
    return dict(sorted(out.items()))


@pytest.mark.parametrize("name", sorted(STACKS))
def test_the_plan_of_each_stack_is_the_snapshot(name: str, update_golden: bool) -> None:
    config, secrets, account = STACKS[name]
    run = run_program(config, secrets=secrets, **account)
    assert run.error is None, run.error
    got = plan(run.registrations)
    path = GOLDEN / f"{name}.json"
    if update_golden:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    want = json.loads(path.read_text())
    assert sorted(got) == sorted(want), "URNs differ: a resource was renamed, moved or re-typed"
    moved = {
        urn: sorted(
            key
            for key in set(want[urn]["inputs"]) | set(got[urn]["inputs"])
            if want[urn]["inputs"].get(key) != got[urn]["inputs"].get(key)
        )
        for urn in want
        if want[urn]["inputs"] != got[urn]["inputs"]
    }
    assert moved == {}, f"inputs changed (run `./check --update-golden` if meant): {moved}"
    for urn in want:
        assert got[urn] == want[urn], urn
