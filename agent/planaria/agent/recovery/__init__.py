"""Setting up an epoch: regroup, then find every layer's state (kept, copied, loaded or built)."""
