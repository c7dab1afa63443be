"""The controller core: one job's state machine, pure asyncio, with the world behind ports.

It knows the planner and the contract's dataclasses (`planaria.wire.messages`) and nothing of
gRPC, Kubernetes, torch or processes: agents, workers, the clock and status publishing are the
Protocols of `ports`, implemented by `planaria.rpc`, `planaria.local` and `planaria.kube`.
"""
