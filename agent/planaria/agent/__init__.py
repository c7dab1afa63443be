"""The training agent: one per pod or local process, in subpackages layered bottom to top.

    training    what one training step computes: model, data, job, gradient sums, reference
    execution   running a schedule on one worker in one epoch: groups, held layers, executor
    state       host-memory snapshots and persistent checkpoints (beside execution, not on it)
    recovery    setting up an epoch: regroup, then keep, copy, load or build every layer
    runtime     the training thread and the command state machine the controller drives
    server      the agent process: gRPC AgentService, health, mutual TLS
    harness     executor processes on loopback for tests and benchmarks (beside server)

A subpackage imports only those listed before it, never one after it (.importlinter,
agent-layers). The agent knows the planner's plain data types and the wire contract, never the
control plane's internals (agent-data-plane).
"""
