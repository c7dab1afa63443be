"""The arithmetic of forward and backward: fp32, tf32 or bf16 (docs/numerics.md, "Precision").

One job setting, `messages.Precision`, applied in the same two places by the executor, the
reference trainer and the profiler, so all three compute alike:

    around the forward of a micro-batch (loss included)   `forward(precision, device)`
    around a whole step (or a profiling run)              `matmul_precision(precision, device)`

BF16 is mixed precision with float32 master state: the forward runs under
`torch.autocast(device.type, dtype=torch.bfloat16)`, which casts per operation (matmuls and
attention to bfloat16; LayerNorm, softmax / cross-entropy and the residual additions stay
float32) and leaves every parameter float32. The backward runs outside autocast, as torch
documents: each backward op runs in the dtype its forward op chose. So parameter gradients are
float32 (the gradient of a bfloat16 cast is cast back to the parameter's dtype), gradients are
summed and all-reduced in float32 (float64 in exact mode), AdamW's moments are float32, and
snapshots and checkpoints carry that float32 state unchanged. Stage boundaries carry float32
hidden states (the residual stream is float32 under autocast), so the messages between stages
keep the layers' dtype. Autocast's cache of bfloat16 weight copies lives for one forward only:
it must never outlive an optimizer step, which rewrites the float32 weights in place.

TF32 lets CUDA matmuls and cuDNN convolutions use TF32 tensor cores (10-bit mantissa inputs,
float32 accumulation): `torch.set_float32_matmul_precision("high")` and
`torch.backends.cudnn.allow_tf32`. The CPU has no TF32 and ignores the matmul setting, so on
the CPU TF32 trains exactly as FP32. FP32 turns both off on CUDA (cuDNN's default is on).

Not here: which settings a job may combine (the spec) and summing gradients (`reduction`).

Errors: PrecisionError (ValueError) for bf16 on a device that cannot compute in bfloat16.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from planaria.wire import messages

LOW_DTYPE = torch.bfloat16  # the autocast dtype of BF16


class PrecisionError(ValueError):
    """A precision the device cannot compute in; one line naming the setting and the fix."""


def check_supported(precision: messages.Precision, device: torch.device) -> None:
    """Raise PrecisionError when `device` cannot run `precision`: bf16 on a CUDA GPU without
    bfloat16 support (before Ampere). Every CPU can: torch emulates bfloat16 where the CPU has
    no native instructions (slower, same results). TF32 on a GPU without TF32 cores silently
    computes in float32, so it is never refused."""
    if precision is not messages.Precision.BF16 or device.type != "cuda":
        return
    if not torch.cuda.is_available():
        raise PrecisionError(
            f"precision: bf16 on {device} needs a CUDA GPU and this machine has none; "
            "run on a GPU with bfloat16 support or use device cpu"
        )
    if not torch.cuda.is_bf16_supported(including_emulation=False):
        name = torch.cuda.get_device_name(device)
        raise PrecisionError(
            f"precision: bf16 needs a GPU with bfloat16 support (Ampere or later) but {device} "
            f"is a {name}; use precision fp32 or tf32"
        )


@contextlib.contextmanager
def forward(precision: messages.Precision, device: torch.device) -> Iterator[None]:
    """Inside: one micro-batch's forward and loss in `precision` (bfloat16 autocast for BF16;
    nothing for FP32 and TF32). Leave it before the backward."""
    if precision is not messages.Precision.BF16:
        yield
        return
    with torch.autocast(device_type=device.type, dtype=LOW_DTYPE):
        yield


@contextlib.contextmanager
def matmul_precision(precision: messages.Precision, device: torch.device) -> Iterator[None]:
    """Inside: CUDA matmuls and convolutions in TF32 for TF32, in full float32 otherwise;
    restored on leaving (the settings are process-wide: call it from the one thread that
    trains). On the CPU nothing changes: it has no TF32."""
    if device.type != "cuda":
        yield
        return
    tf32 = precision is messages.Precision.TF32
    matmul_before = torch.get_float32_matmul_precision()
    cudnn_before = torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    torch.backends.cudnn.allow_tf32 = tf32
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(matmul_before)
        torch.backends.cudnn.allow_tf32 = cudnn_before
