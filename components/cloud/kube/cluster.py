"""The DOKS cluster: a small always-on CPU pool (the cluster's default pool) and a GPU pool the
cluster autoscaler takes between its min and max nodes (0 allowed), and a pulumi-kubernetes
Provider that talks to it. The provider's fields are read from pulumi-digitalocean's SDK and
terraform-provider-digitalocean's docs/resources/kubernetes_cluster.md and
kubernetes_node_pool.md (docs/facts.md, "DigitalOcean Kubernetes").
"""

from __future__ import annotations

import pulumi
import pulumi_digitalocean as digitalocean
import pulumi_kubernetes as kubernetes

from ...spec import catalog
from ...spec.kube import DOKS_MINOR, KubePlatformConfig
from . import manifests


def _version() -> pulumi.Output[str]:
    """DigitalOcean's newest patch slug of the pinned minor (kube.py says why not a fixed one)."""
    found = digitalocean.get_kubernetes_versions_output(version_prefix=f"{DOKS_MINOR}.")
    return found.latest_version


class DoksCluster(pulumi.ComponentResource):
    """The cluster and its two pools. The GPU pool carries no taint of ours: DOKS taints GPU
    nodes `nvidia.com/gpu:NoSchedule` itself, and a taint of our own would also keep DOKS's
    NVIDIA device plugin (which tolerates only its own) off the node, so no pod could get a GPU.
    Its label is the model server's nodeSelector."""

    provider: kubernetes.Provider

    def __init__(
        self, name: str, kube: KubePlatformConfig, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__(f"{catalog.PROJECT}:kube:DoksCluster", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.cluster = digitalocean.KubernetesCluster(
            name,
            name=name,
            region=kube.region,
            version=_version(),
            # Explicit: the default turns true from 1.36 (docs/facts.md), and HA once on stays on.
            ha=kube.ha,
            # Patch releases within the maintenance window; a new minor only when the pin moves.
            auto_upgrade=True,
            surge_upgrade=True,
            # The default pool: small, CPU only, its size never changed after creation (a new
            # size replaces the pool, and the default pool is the cluster's).
            node_pool=digitalocean.KubernetesClusterNodePoolArgs(
                name=f"{name}-cpu",
                size=kube.cpu_pool.size,
                node_count=kube.cpu_pool.count,
                labels={manifests.GPU_POOL_LABEL: manifests.CPU_POOL_VALUE},
            ),
            tags=[catalog.PROJECT],
            # `pulumi destroy` stops every bill the cluster made: the Load Balancer and the
            # Volumes its controllers created for Services and claims (the model servers'
            # weights, Caddy's certificates) are not Pulumi's resources, and left to the default
            # they outlive the cluster and keep billing (terraform-provider-digitalocean #1007:
            # "load balancers, volumes, and volume snapshots"; docs/facts.md).
            destroy_all_associated_resources=True,
            # Explicit, as ha is: the default enables it only "for clusters with NVIDIA GPU
            # nodes", and at minNodes 0 the cluster starts with none (terraform-provider-
            # digitalocean docs/resources/kubernetes_cluster.md, nvidia_gpu_device_plugin).
            nvidia_gpu_device_plugin=digitalocean.KubernetesClusterNvidiaGpuDevicePluginArgs(
                enabled=True
            ),
            # The newest patch is asked for at creation; after it, auto_upgrade moves patches in
            # the maintenance window. Set on every run, a new patch would upgrade a serving
            # cluster at the next unrelated `pulumi up` (and surge a second GPU node meanwhile).
            opts=pulumi.ResourceOptions.merge(
                child, pulumi.ResourceOptions(ignore_changes=["version"])
            ),
        )
        self.gpu_pool = digitalocean.KubernetesNodePool(
            f"{name}-gpu",
            cluster_id=self.cluster.id,
            name=f"{name}-gpu",
            size=kube.gpu_pool.size,
            auto_scale=True,
            min_nodes=kube.gpu_pool.min_nodes,
            max_nodes=kube.gpu_pool.max_nodes,
            labels={manifests.GPU_POOL_LABEL: manifests.GPU_POOL_VALUE},
            tags=[catalog.PROJECT],
            # A new size replaces the pool (size is ForceNew): the old one goes first, as its
            # name is the new one's, and two GPU pools would bill at once.
            opts=pulumi.ResourceOptions.merge(
                child, pulumi.ResourceOptions(delete_before_replace=True)
            ),
        )
        # The credentials as DigitalOcean hands them on every run (the data source), not those
        # the cluster's state kept: those expire after 7 days (kubeconfig_expire_seconds).
        kubeconfig = digitalocean.get_kubernetes_cluster_output(name=self.cluster.name)
        self.provider = kubernetes.Provider(
            f"{name}-k8s",
            kubeconfig=pulumi.Output.secret(kubeconfig.kube_configs[0].raw_config),
            enable_server_side_apply=True,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.gpu_pool]),
        )
        self.register_outputs({"clusterId": self.cluster.id})
