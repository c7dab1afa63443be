"""The Kubernetes adapter: a thin kopf layer over `planaria.control`, pure pod builders, the CRD."""
