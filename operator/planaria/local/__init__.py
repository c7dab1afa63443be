"""Local mode: a job's agents as processes on this machine, behind the controller's ports."""
