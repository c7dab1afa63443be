"""Event-driven simulator: hours of training under failure traces, every policy side by side.

`traces` (failure and re-join events), `scenarios` (the papers' named setups), `planning` (what
the simulator asks the planner: fresh plans, restricted decisions), `fresh` (the best plan over
N workers, an exact best-first search) with `step_bounds` (its lower bounds), `policies`
(Planaria and the baselines), `engine` (one policy over one trace), `report` (tables, JSON,
timeline PNG).
Every step time comes from the planner's estimator; this package has no performance model.
"""
