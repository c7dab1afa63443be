"""Test support for the Kubernetes operator: an API server emulator and a kubelet harness.

Nothing here knows Planaria: `emulator` serves any kinds (built-in and CRDs), `kubelet` runs any
pod's containers as local processes. See docs/testing-kubernetes.md.
"""
