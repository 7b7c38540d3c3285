"""The model server declared (components/cloud/kube/model.py, `ModelServer`) under Pulumi's mocks:
the Secret that holds the key and the HF token (never a plain input), a new key rolling the
servers, only a ClusterIP Service, and a size mismatch refused before anything is declared. The
fakes and the deployment are test_kube.py's."""

from __future__ import annotations

from pulumi_harness import FAKE_API_KEY, plain_strings
from test_kube import (
    FAKE_HF_TOKEN,
    FAKE_KUBECONFIG,
    Run,
    deployed,
    k8s,
    platform,
    run,
    stack,
)

from components.cloud.kube import manifests

__all__ = ["deployed"]  # the fixture, used by name


def test_no_secret_is_ever_a_plain_input(deployed) -> None:
    """The kubeconfig, the API key and the HF token are in Pulumi secrets only: in no plain
    input of any resource (the Secret's stringData is marked secret; the pods read it by
    reference)."""
    result, _, _ = deployed
    for r in result.registrations:
        for path, text in plain_strings(r.raw):
            for secret in (FAKE_KUBECONFIG, "FAKE-DOKS-TOKEN", FAKE_API_KEY, FAKE_HF_TOKEN):
                assert secret not in text, (r.type, r.name, path)
    secret = result.one("kubernetes:core/v1:Secret")
    assert secret.inputs["stringData"] == {"VLLM_API_KEY": FAKE_API_KEY, "HF_TOKEN": FAKE_HF_TOKEN}
    server = result.one("kubernetes:apps/v1:StatefulSet")
    every_env = [
        e
        for c in server.inputs["spec"]["template"]["spec"]["initContainers"]
        + server.inputs["spec"]["template"]["spec"]["containers"]
        for e in c["env"]
    ]
    by_ref = {e["name"] for e in every_env if "valueFrom" in e}
    assert by_ref == {"VLLM_API_KEY", "HF_TOKEN"}
    assert all("value" not in e for e in every_env if e["name"] in by_ref)


def test_without_an_hf_token_the_secret_holds_only_the_key() -> None:
    result = run(stack(), platform(), hf_token=None)
    assert result.error is None, result.error
    secret = result.one("kubernetes:core/v1:Secret")
    assert secret.inputs["stringData"] == {"VLLM_API_KEY": FAKE_API_KEY}


def pods_version(result: Run) -> str:
    spec = result.one("kubernetes:apps/v1:StatefulSet").inputs["spec"]
    return str(spec["template"]["metadata"]["annotations"][manifests.SECRET_VERSION])


def test_a_new_api_key_rolls_the_servers() -> None:
    """vLLM reads the key from env at start: a new key (the Secret updated in place) must roll
    the servers, or they keep the old one while the output shows the new. The same key twice
    changes nothing."""
    cfg, kube = stack(), platform()
    first, again = run(cfg, kube), run(cfg, kube)
    rotated = run(cfg, kube, api_key="b" * 48)
    assert pods_version(first) == pods_version(again)
    assert pods_version(rotated) != pods_version(first)
    assert "b" * 48 not in pods_version(rotated)


def test_only_a_cluster_ip_service(deployed) -> None:
    result, _, _ = deployed
    (svc,) = result.of("kubernetes:core/v1:Service")
    assert svc.inputs["spec"]["type"] == "ClusterIP"
    assert svc.inputs["spec"]["selector"] == manifests.LABELS
    kinds = {r.type for r in k8s(result)}
    assert kinds == {
        "kubernetes:core/v1:Namespace",
        "kubernetes:core/v1:Secret",
        "kubernetes:apps/v1:StatefulSet",
        "kubernetes:core/v1:Service",
    }


def test_a_size_mismatch_is_refused_before_anything_is_declared() -> None:
    result = run(stack("gpu-h100x1-80gb"), platform("gpu-l40sx1-48gb"))
    assert isinstance(result.error, ValueError)
    assert "droplet.size (gpu-h100x1-80gb) and gpuPool.size (gpu-l40sx1-48gb)" in str(result.error)
    assert not result.of("kubernetes:apps/v1:StatefulSet")
