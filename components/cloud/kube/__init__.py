"""The Kubernetes platform (issue 43, its foundation): the DOKS cluster and its pools
(cluster.py), the model server's Kubernetes objects as plain dicts (manifests.py, no Pulumi) and
their declaration with pulumi-kubernetes (model.py). Configured by spec/kube.py; not wired into
__main__.py until the platform has its API-key gate at the edge (docs/kubernetes.md)."""
