"""The DOKS cluster (components/cloud/kube/cluster.py) under Pulumi's mocks, for two GPU sizes and
min 0 / min 1: its pinned version, HA and pools, and the pulumi-kubernetes Provider every object
goes through, from a fresh kubeconfig kept secret. The fakes and the deployment are
test_kube.py's."""

from __future__ import annotations

from test_kube import (
    CLUSTER,
    CLUSTER_TOKEN,
    FAKE_KUBECONFIG,
    LATEST,
    NODE_POOL,
    PROVIDER,
    VERSIONS_TOKEN,
    deployed,
    k8s,
)

from components.cloud.kube import manifests
from components.spec import catalog

__all__ = ["deployed"]  # the fixture, used by name


def test_the_cluster_pins_its_version_ha_and_pools(deployed) -> None:
    result, _, kube = deployed
    doks = result.one(CLUSTER)
    # The version: the newest patch of the pinned minor, as DigitalOcean lists it on this run.
    (versions,) = [c for c in result.cloud.calls if c.token == VERSIONS_TOKEN]
    assert versions.args["versionPrefix"] == "1.36."
    assert doks.inputs == {
        "name": "nemotron-kube",
        "region": kube.region,
        "version": LATEST,
        "ha": False,
        "autoUpgrade": True,
        "surgeUpgrade": True,
        "nodePool": {
            "name": "nemotron-kube-cpu",
            "size": "s-2vcpu-4gb",
            "nodeCount": 2,
            "labels": {manifests.GPU_POOL_LABEL: "cpu"},
        },
        "tags": [catalog.PROJECT],
        # What the cluster's controllers made (its Load Balancer, the claims' Volumes) goes
        # with it: nothing bills after `pulumi destroy`.
        "destroyAllAssociatedResources": True,
        # Set, not left to the default that looks for GPU nodes a pool at 0 does not have.
        "nvidiaGpuDevicePlugin": {"enabled": True},
    }
    pool = result.one(NODE_POOL)
    assert pool.inputs == {
        "clusterId": "doks-uuid-0001",
        "name": "nemotron-kube-gpu",
        "size": kube.gpu_pool.size,
        "autoScale": True,
        "minNodes": kube.gpu_pool.min_nodes,
        "maxNodes": 2,
        "labels": {manifests.GPU_POOL_LABEL: manifests.GPU_POOL_VALUE},
        "tags": [catalog.PROJECT],
    }
    # No taint of ours (DOKS's own nvidia.com/gpu taint is the one its device plugin tolerates).
    assert "taints" not in pool.inputs


def test_the_provider_reads_a_fresh_kubeconfig_kept_secret(deployed) -> None:
    result, _, _ = deployed
    provider = result.one(PROVIDER)
    assert provider.inputs == {"kubeconfig": FAKE_KUBECONFIG, "enableServerSideApply": "true"}
    (fetched,) = [c for c in result.cloud.calls if c.token == CLUSTER_TOKEN]
    assert fetched.args["name"] == "nemotron-kube"
    # The provider waits for the GPU pool, and every Kubernetes object goes through it (not
    # through a default provider and whatever kubeconfig the machine running `pulumi up` has).
    assert result.one(NODE_POOL).urn in provider.dependencies
    for r in k8s(result):
        assert result.providers[r.urn].startswith(provider.urn + "::"), r.name
