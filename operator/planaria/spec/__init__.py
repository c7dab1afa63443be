"""Documents users and machines hand us, validated with pydantic: the profile file, the job spec.

The trust boundary: everything here parses untrusted input (extra fields forbidden, camelCase
aliases) and converts it into the planner's frozen dataclasses.
"""
