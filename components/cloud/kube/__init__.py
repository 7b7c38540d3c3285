"""The Kubernetes platform (issue 43, `platform: kubernetes`): the DOKS cluster and its pools
(cluster.py), the model server's objects as plain dicts (manifests.py, no Pulumi) and declared
(model.py), KEDA (scaling.py, autoscaler.py), the edge (edge_manifests.py, edge.py), and the
wiring __main__.py calls (platform.py). Configured by spec/kube.py (docs/kubernetes.md)."""
