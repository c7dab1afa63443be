"""The planner's exception tree.

    PlannerError
    ├── PlanInputError (ValueError)   bad input: a field and what to change
    ├── InfeasibleError (ValueError)  valid input no plan can satisfy: why, and what would fix it
    └── ScheduleError                 a schedule breaks the execution contract (docs/schedule.md)
        └── DeadlockError             ... because some workers wait on each other for ever

The first two are user-facing: the CLI prints them as one line and exits 2; the controller turns
them into a status condition. A ScheduleError is a fault of whoever built the schedule (the
compiler or a hand-written test schedule), never of the user, so it is not a ValueError.
Internal invariants use `assert`, never these.
"""


class PlannerError(Exception):
    """Base of every error the planner raises on purpose."""


class PlanInputError(PlannerError, ValueError):
    """An input value is out of range or inconsistent; the message names it and the fix."""


class InfeasibleError(PlannerError, ValueError):
    """The inputs are valid but admit no plan; the message says why and what would fix it."""


class ScheduleError(PlannerError):
    """A schedule is malformed: unmatched messages, missing or repeated work, wrong groups."""


class DeadlockError(ScheduleError):
    """Replaying a schedule gets stuck; the message lists each stuck worker's instruction."""
