"""The model server on the cluster: its namespace, the Secret with the HF token and vLLM's API
key (from Pulumi secrets, read by the pods as secretKeyRef env, never a literal), the StatefulSet
of vLLM servers and their ClusterIP Service, declared with pulumi-kubernetes exactly as
manifests.py builds them.
"""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_kubernetes as kubernetes

from ...spec import catalog
from ...spec.kube import KubePlatformConfig
from ...spec.schema import StackConfig
from . import manifests

# The StatefulSet's count, as ignore_changes names it (a path in the resource's inputs).
REPLICAS_FIELD = "spec.replicas"


class ModelServer(pulumi.ComponentResource):
    """`api_key` and `hf_token` (None: a public model) are Pulumi secrets: they go into the
    Secret only, which Pulumi keeps encrypted in the state."""

    def __init__(
        self,
        name: str,
        cfg: StackConfig,
        kube: KubePlatformConfig,
        api_key: pulumi.Input[str],
        hf_token: pulumi.Input[str] | None,
        provider: kubernetes.Provider,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__(f"{catalog.PROJECT}:kube:ModelServer", name, None, opts)
        if cfg.droplet.size != kube.gpu_pool.size:
            # serve_args sizes tensor parallelism from the stack's size: they must agree.
            raise ValueError(
                f"droplet.size ({cfg.droplet.size}) and gpuPool.size ({kube.gpu_pool.size}) "
                "differ; accepted: the same GPU size"
            )
        child = pulumi.ResourceOptions(parent=self, provider=provider)
        ns = manifests.namespace()
        self.namespace = kubernetes.core.v1.Namespace(
            f"{name}-ns", metadata=ns["metadata"], opts=child
        )
        after_ns = pulumi.ResourceOptions.merge(
            child, pulumi.ResourceOptions(depends_on=[self.namespace])
        )
        data: dict[str, pulumi.Input[str]] = {manifests.API_KEY_KEY: api_key}
        if hf_token is not None:
            data[manifests.HF_TOKEN_KEY] = hf_token
        self.secret = kubernetes.core.v1.Secret(
            f"{name}-secrets",
            metadata={"name": manifests.SECRET, "namespace": manifests.NAMESPACE},
            type="Opaque",
            string_data=pulumi.Output.secret(data),
            opts=after_ns,
        )
        server: dict[str, Any] = manifests.model_server(cfg, kube)
        version = self.secret.metadata.apply(manifests.secret_version)
        # A new key or token rolls the servers (manifests.SECRET_VERSION).
        spec: Any = version.apply(lambda v: manifests.with_secret_version(server["spec"], v))
        self.servers = kubernetes.apps.v1.StatefulSet(
            name,
            metadata=server["metadata"],
            spec=spec,
            # pulumi-kubernetes waits for the servers to be ready (its default: 10 minutes); a
            # first start joins a GPU node, pulls the image, downloads and loads the weights.
            opts=pulumi.ResourceOptions.merge(
                after_ns,
                pulumi.ResourceOptions(
                    depends_on=[self.secret],
                    custom_timeouts=pulumi.CustomTimeouts(create="60m", update="60m"),
                    # KEDA's HPA owns the count once the StatefulSet exists (scaling.py): with
                    # the field ignored, server-side apply leaves it out of every later patch,
                    # so Pulumi neither resets a scaled set to `min` nor meets a field-manager
                    # conflict over it (pulumi-kubernetes#2258: ignoreChanges is the way; the
                    # conflict it avoids: pulumi-kubernetes#2491, #2569, the latter on DOKS).
                    ignore_changes=[REPLICAS_FIELD],
                ),
            ),
        )
        svc = manifests.service()
        self.service = kubernetes.core.v1.Service(
            f"{name}-svc", metadata=svc["metadata"], spec=svc["spec"], opts=after_ns
        )
        self.register_outputs({})
