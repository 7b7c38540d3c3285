"""llm-d's router between the edge and the model servers, declared with pulumi-kubernetes exactly
as router_values.py builds it: the standalone chart as a `helm.v3.Release` (as autoscaler.py
installs KEDA and Prometheus, and for the same reason: a Release is what Helm itself installs
and rolls back, and its inputs are what the tests read), and the cluster role its authenticated
/metrics needs.

The wiring is one line: `Router(name, cfg, kube, server, provider)` after the model server,
and the edge in front of `router.upstream`.
"""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as kubernetes

from ...spec import catalog
from ...spec.kube import KubePlatformConfig
from ...spec.schema import StackConfig
from . import edge_manifests, model, router_values, scaling


class Router(pulumi.ComponentResource):
    """The router in the model's namespace (`server`: model.ModelServer, whose namespace it
    waits for). `upstream` is what the edge forwards to."""

    upstream: edge_manifests.Upstream = edge_manifests.ROUTER

    def __init__(
        self,
        name: str,
        cfg: StackConfig,
        kube: KubePlatformConfig,
        server: model.ModelServer,
        provider: kubernetes.Provider,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        values = router_values.values(cfg, kube)
        super().__init__(f"{catalog.PROJECT}:kube:Router", name, None, opts)
        child = pulumi.ResourceOptions(parent=self, provider=provider)
        role = router_values.metrics_auth_role()
        self.metrics_role = kubernetes.rbac.v1.ClusterRole(
            f"{name}-metrics-auth", metadata=role["metadata"], rules=role["rules"], opts=child
        )
        binding = router_values.metrics_auth_binding()
        self.metrics_binding = kubernetes.rbac.v1.ClusterRoleBinding(
            f"{name}-metrics-auth",
            metadata=binding["metadata"],
            subjects=binding["subjects"],
            role_ref=binding["roleRef"],
            opts=pulumi.ResourceOptions.merge(
                child, pulumi.ResourceOptions(depends_on=[self.metrics_role])
            ),
        )
        self.release = kubernetes.helm.v3.Release(
            name,
            # The release's name makes the EPP's Service (`<release>-epp`), the one KEDA's
            # Prometheus scrapes and the edge forwards to.
            name=scaling.ROUTER_RELEASE,
            chart=router_values.CHART,
            version=router_values.CHART_VERSION,
            namespace=router_values.NAMESPACE,
            values=values,
            # A failed install or upgrade is rolled back, not left half applied.
            atomic=True,
            opts=pulumi.ResourceOptions.merge(
                child,
                pulumi.ResourceOptions(depends_on=[server.namespace, self.metrics_binding]),
            ),
        )
        self.register_outputs({})
