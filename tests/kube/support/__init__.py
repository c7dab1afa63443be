"""Test support for the Kubernetes operator: the kubelet harness.

Nothing here knows Planaria: `kubelet` runs any pod's containers as local processes, against the
real control plane of tests/kube/real. See docs/testing-kubernetes.md.
"""
