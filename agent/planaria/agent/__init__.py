"""The training agent: one per pod or local process (model, data, executor, snapshots, transfers).

It knows the planner's plain data types and the wire contract, never the control plane's
internals (enforced by .importlinter).
"""
