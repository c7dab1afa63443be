"""The training thread and its command state machine, driven by the controller's commands."""
