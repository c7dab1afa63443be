"""The simulator's exceptions.

    SimError
     └── SimInputError (also ValueError): a bad trace file, scenario name or option; the
         message names the field and what to change.

Planner errors (`planaria.contract.errors`) pass through unchanged.
"""

from __future__ import annotations


class SimError(Exception):
    """Base of the simulator's own errors."""


class SimInputError(SimError, ValueError):
    """User input the simulator cannot use; says what to change."""
