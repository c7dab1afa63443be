"""The planner's exception tree.

    PlannerError
    ├── PlanInputError (ValueError)   bad input: a field and what to change
    └── InfeasibleError (ValueError)  valid input no plan can satisfy: why, and what would fix it

Both are user-facing: the CLI prints them as one line and exits 2; the controller turns them into
a status condition. Internal invariants use `assert`, never these.
"""


class PlannerError(Exception):
    """Base of every error the planner raises on purpose."""


class PlanInputError(PlannerError, ValueError):
    """An input value is out of range or inconsistent; the message names it and the fix."""


class InfeasibleError(PlannerError, ValueError):
    """The inputs are valid but admit no plan; the message says why and what would fix it."""
