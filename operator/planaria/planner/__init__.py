"""The planner: pure decisions (templates, instantiation, batching, schedule, estimator, policy).

Plain frozen dataclasses in and out, deterministic, no I/O: no torch, Kubernetes, gRPC or pydantic
(enforced by .importlinter). Every decision returns its choice and a readable reason.
"""
