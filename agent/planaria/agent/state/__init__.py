"""Layer state kept outside the live layers: host-memory snapshots and persistent checkpoints."""
