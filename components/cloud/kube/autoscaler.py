"""KEDA on the cluster, and the ScaledObject that moves the model servers between the platform's
min and max, declared with pulumi-kubernetes exactly as scaling.py builds them.

KEDA is a `helm.v3.Release`, not a `helm.v4.Chart`: a Release is one custom resource that Helm
installs, upgrades and rolls back as `helm` itself would, so `helm list` on the cluster shows
the pinned version, and its inputs (chart, version, repository, values) are what the tests read
under Pulumi's mocks; a v4 Chart is a component the provider renders remotely (pulumi-kubernetes
4.34.2 helm/v4/Chart.py: `remote=True`), whose objects exist only with a real provider and Helm.
"""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_kubernetes as kubernetes

from ...spec import catalog
from ...spec.kube import KubePlatformConfig
from . import scaling


def _custom(
    name: str, obj: dict[str, Any], opts: pulumi.ResourceOptions
) -> kubernetes.apiextensions.CustomResource:
    return kubernetes.apiextensions.CustomResource(
        name,
        api_version=obj["apiVersion"],
        kind=obj["kind"],
        metadata=obj["metadata"],
        spec=obj["spec"],
        opts=opts,
    )


class Autoscaler(pulumi.ComponentResource):
    """`servers` is the model's StatefulSet (model.ModelServer.servers): the ScaledObject waits
    for it, and for KEDA's release (its CRDs), so that neither is applied against nothing."""

    def __init__(
        self,
        name: str,
        kube: KubePlatformConfig,
        servers: pulumi.Resource,
        provider: kubernetes.Provider,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__(f"{catalog.PROJECT}:kube:Autoscaler", name, None, opts)
        child = pulumi.ResourceOptions(parent=self, provider=provider)
        self.keda = kubernetes.helm.v3.Release(
            f"{name}-keda",
            name=scaling.KEDA_CHART,
            chart=scaling.KEDA_CHART,
            version=scaling.KEDA_VERSION,
            repository_opts=kubernetes.helm.v3.RepositoryOptsArgs(repo=scaling.KEDA_REPO),
            namespace=scaling.KEDA_NAMESPACE,
            create_namespace=True,
            values=scaling.keda_values(),
            # A failed install or upgrade is rolled back, not left half applied.
            atomic=True,
            opts=child,
        )
        # The reader lives in the model's namespace: after the servers (and so the namespace).
        in_ns = pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=[servers]))
        account, token, role, binding = scaling.metrics_reader()
        reader = [
            kubernetes.core.v1.ServiceAccount(
                f"{name}-reader", metadata=account["metadata"], opts=in_ns
            ),
            kubernetes.core.v1.Secret(
                f"{name}-reader-token", metadata=token["metadata"], type=token["type"], opts=in_ns
            ),
            kubernetes.rbac.v1.ClusterRole(
                f"{name}-reader-role", metadata=role["metadata"], rules=role["rules"], opts=child
            ),
            kubernetes.rbac.v1.ClusterRoleBinding(
                f"{name}-reader-binding",
                metadata=binding["metadata"],
                role_ref=binding["roleRef"],
                subjects=binding["subjects"],
                opts=child,
            ),
        ]
        after = pulumi.ResourceOptions.merge(
            child, pulumi.ResourceOptions(depends_on=[self.keda, *reader])
        )
        self.trigger_auth = _custom(f"{name}-auth", scaling.trigger_authentication(), after)
        self.scaled_object = _custom(
            name,
            scaling.scaled_object(kube),
            pulumi.ResourceOptions.merge(
                after, pulumi.ResourceOptions(depends_on=[self.trigger_auth, servers])
            ),
        )
        self.register_outputs({})
