"""The arithmetic a job trains in: fp32, tf32 or bf16 (docs/numerics.md, "Precision").

Shared by both planes: the job's settings carry it to the agents (`planaria.wire.messages`
re-exports it), a profile records the precision it was measured or modelled in, and the
planner's synthetic profiles cost each one (`planaria.planner.synthetic`). What each means for
torch lives in the agent (`planaria.agent.training.precision`).
"""

from __future__ import annotations

from enum import StrEnum


class Precision(StrEnum):
    """The arithmetic of forward and backward.

    FP32: float32 everywhere; on CUDA matmuls and convolutions in full float32 (TF32 off).
    TF32: float32 tensors, CUDA matmuls and convolutions on TF32 tensor cores; the CPU has no
    TF32, so there it is FP32. BF16: forward under bfloat16 autocast; parameters, gradients,
    their reduction and AdamW's state stay float32 (the fp32 master state).
    """

    FP32 = "fp32"
    TF32 = "tf32"
    BF16 = "bf16"
