"""The operator against a real Kubernetes control plane (etcd, kube-apiserver, controller manager).

See conftest.py and docs/testing-kubernetes.md.
"""
