"""KEDA and the Prometheus server it asks, and the ScaledObject that moves the model servers
between the platform's min and max, declared with pulumi-kubernetes exactly as scaling.py builds
them.

Each chart is a `helm.v3.Release`, not a `helm.v4.Chart`: a Release is one custom resource that
Helm installs, upgrades and rolls back as `helm` itself would, so `helm list` on the cluster
shows the pinned versions, and its inputs (chart, version, repository, values) are what the tests
read under Pulumi's mocks; a v4 Chart is a component the provider renders remotely
(pulumi-kubernetes 4.34.2 helm/v4/Chart.py: `remote=True`), whose objects exist only with a real
provider and Helm, so nothing of it could be checked here.
"""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_kubernetes as kubernetes

from ...spec import catalog
from ...spec.kube import KEDA_VERSION, KubePlatformConfig
from . import scaling


def _release(
    name: str, chart: str, version: str, repo: str, namespace: str, values: dict[str, Any],
    opts: pulumi.ResourceOptions,
) -> kubernetes.helm.v3.Release:  # fmt: skip
    return kubernetes.helm.v3.Release(
        name,
        name=chart,
        chart=chart,
        version=version,
        repository_opts=kubernetes.helm.v3.RepositoryOptsArgs(repo=repo),
        namespace=namespace,
        create_namespace=True,
        values=values,
        # A failed install or upgrade is rolled back, not left half applied.
        atomic=True,
        opts=opts,
    )


class Autoscaler(pulumi.ComponentResource):
    """`servers` is the model's StatefulSet (model.ModelServer.servers): the ScaledObject waits
    for it, for KEDA's release (its CRDs) and for Prometheus (what its triggers ask).
    `hold_seconds`: how long the router holds a request (router_values.hold_seconds), which
    the last server's cooldown never undercuts."""

    def __init__(
        self,
        name: str,
        kube: KubePlatformConfig,
        hold_seconds: int,
        servers: pulumi.Resource,
        provider: kubernetes.Provider,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__(f"{catalog.PROJECT}:kube:Autoscaler", name, None, opts)
        child = pulumi.ResourceOptions(parent=self, provider=provider)
        self.keda = _release(
            f"{name}-keda", scaling.KEDA_CHART, KEDA_VERSION, scaling.KEDA_REPO,
            scaling.KEDA_NAMESPACE, scaling.keda_values(kube), child,
        )  # fmt: skip
        self.prometheus = _release(
            f"{name}-prometheus", scaling.PROMETHEUS_CHART, scaling.PROMETHEUS_VERSION,
            scaling.PROMETHEUS_REPO, scaling.PROMETHEUS_NAMESPACE, scaling.prometheus_values(kube),
            child,
        )  # fmt: skip
        obj = scaling.scaled_object(kube, hold_seconds)
        self.scaled_object = kubernetes.apiextensions.CustomResource(
            name,
            api_version=obj["apiVersion"],
            kind=obj["kind"],
            metadata=obj["metadata"],
            spec=obj["spec"],
            opts=pulumi.ResourceOptions.merge(
                child, pulumi.ResourceOptions(depends_on=[self.keda, self.prometheus, servers])
            ),
        )
        self.register_outputs({})
