"""Accelerator specs: the hardware numbers synthetic profiles are computed from.

An `Accelerator` holds what `planaria.planner.synthetic` needs to cost a model analytically: peak
matmul throughput for the training dtype (bf16/fp16 with fp32 accumulation, dense, no sparsity),
memory size and bandwidth, the intra- and inter-node links, and the fractions of the peaks a
well-tuned training run reaches. The named specs below are vendor datasheet numbers (each one
cited where it is set) or the papers' testbeds; link latencies are not on datasheets and are
order-of-magnitude assumptions, said so where they are set.

Nothing here measures anything; measured profiles come from the agent's profiler.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planaria.contract import errors, precision, profile

GB = 10**9  # datasheets count decimal gigabytes for bandwidth
GIB = 2**30
TERA = 10**12


@dataclass(frozen=True, slots=True, kw_only=True)
class Accelerator:
    """One kind of GPU and the node it sits in.

    `peak_flops` is dense tensor-core FLOP/s in 16 bits (bf16; fp16 on the V100, which has no
    bf16), `fp32_flops` plain float32 FLOP/s and `tf32_flops` dense TF32 tensor-core FLOP/s
    (None: no TF32 cores, TF32 computes at the float32 rate); `flops(precision)` picks one;
    `compute_efficiency` the share of it that large matmuls reach in training (model FLOPs
    utilisation); `memory_efficiency` the
    share of `memory_bandwidth_bytes_per_s` that memory-bound kernels reach. Links are per GPU and
    one direction. `default_gpus_per_node` is what the papers' or vendor's node has.
    """

    name: str
    peak_flops: float
    memory_bytes: int
    memory_bandwidth_bytes_per_s: float
    intra_node: profile.LinkProfile
    inter_node: profile.LinkProfile
    default_gpus_per_node: int
    fp32_flops: float
    tf32_flops: float | None = None
    compute_efficiency: float = 0.45
    memory_efficiency: float = 0.8
    source: str = ""

    def __post_init__(self) -> None:
        for field in ("peak_flops", "memory_bandwidth_bytes_per_s", "fp32_flops"):
            value = getattr(self, field)
            if not (math.isfinite(value) and value > 0):
                raise errors.PlanInputError(
                    f"accelerator {self.name!r}: {field} must be finite and > 0 (got {value})"
                )
        for field in ("compute_efficiency", "memory_efficiency"):
            value = getattr(self, field)
            if not 0 < value <= 1:
                raise errors.PlanInputError(
                    f"accelerator {self.name!r}: {field} is a fraction of the peak; "
                    f"give a value in (0, 1] (got {value})"
                )
        if self.memory_bytes < 1 or self.default_gpus_per_node < 1:
            raise errors.PlanInputError(
                f"accelerator {self.name!r}: memory_bytes and default_gpus_per_node must be >= 1"
            )

    @property
    def effective_flops(self) -> float:
        """FLOP/s a bf16 training matmul is assumed to sustain: peak times compute efficiency."""
        return self.peak_flops * self.compute_efficiency

    def flops(self, arithmetic: precision.Precision) -> float:
        """Peak FLOP/s of matmuls in `arithmetic` (the datasheet's dense rate)."""
        if arithmetic is precision.Precision.BF16:
            return self.peak_flops
        if arithmetic is precision.Precision.TF32 and self.tf32_flops is not None:
            return self.tf32_flops
        return self.fp32_flops

    @property
    def effective_memory_bandwidth(self) -> float:
        """Bytes/s a memory-bound kernel is assumed to sustain."""
        return self.memory_bandwidth_bytes_per_s * self.memory_efficiency


# Link latencies are not datasheet numbers: a few microseconds per hop is the usual order of a
# NCCL step over NVLink/PCIe, ~10 us over InfiniBand and ~20 us over Ethernet (our assumption).
_NVLINK_LATENCY_S = 5e-6
_PCIE_LATENCY_S = 5e-6
_INFINIBAND_LATENCY_S = 10e-6
_ETHERNET_LATENCY_S = 20e-6


def _link(bandwidth_bytes_per_s: float, latency_s: float) -> profile.LinkProfile:
    return profile.LinkProfile(bandwidth_bytes_per_s=bandwidth_bytes_per_s, latency_s=latency_s)


_ACCELERATORS = (
    Accelerator(
        name="v100-16gb",
        # NVIDIA V100 datasheet (SXM2): 125 TFLOPS tensor (fp16), 15.7 TFLOPS fp32, no TF32
        # and no bf16 (bf16 here stands for the fp16 mixed precision of the papers' testbeds),
        # 16 GB HBM2 at 900 GB/s.
        peak_flops=125 * TERA,
        fp32_flops=15.7 * TERA,
        memory_bytes=16 * GIB,
        memory_bandwidth_bytes_per_s=900 * GB,
        # REFT §7.1 Table 1 (its testbed): 150 GB/s NVLink P2P one way, 4 GPUs per node,
        # nodes joined by 100 Gbps Ethernet.
        intra_node=_link(150 * GB, _NVLINK_LATENCY_S),
        inter_node=_link(100 * GB / 8, _ETHERNET_LATENCY_S),
        default_gpus_per_node=4,
        source="NVIDIA V100 datasheet; links and node size from REFT §7.1 Table 1",
    ),
    Accelerator(
        name="a40-48gb",
        # NVIDIA A40 datasheet: 149.7 TFLOPS bf16/fp16 tensor (dense), 74.8 TF32 (dense),
        # 37.4 fp32, 48 GB GDDR6 at 696 GB/s,
        # PCIe Gen4 x16 64 GB/s both ways (32 GB/s one way). Oobleck §7.1's testbed: 30 A40
        # GPUs (the paper says 40 GB), one per host, each on a 200 Gbps InfiniBand adapter.
        peak_flops=149.7 * TERA,
        fp32_flops=37.4 * TERA,
        tf32_flops=74.8 * TERA,
        memory_bytes=48 * GIB,
        memory_bandwidth_bytes_per_s=696 * GB,
        intra_node=_link(32 * GB, _PCIE_LATENCY_S),
        inter_node=_link(200 * GB / 8, _INFINIBAND_LATENCY_S),
        default_gpus_per_node=1,
        source="NVIDIA A40 datasheet; network and node size from Oobleck §7.1",
    ),
    Accelerator(
        name="a100-40gb",
        # NVIDIA A100 datasheet (SXM4 40GB): 312 TFLOPS bf16 tensor (dense), 156 TF32 (dense),
        # 19.5 fp32, 1,555 GB/s HBM2,
        # NVLink 600 GB/s both ways (300 one way). DGX A100: 8 GPUs, one 200 Gb/s HDR
        # InfiniBand adapter per GPU.
        peak_flops=312 * TERA,
        fp32_flops=19.5 * TERA,
        tf32_flops=156 * TERA,
        memory_bytes=40 * GIB,
        memory_bandwidth_bytes_per_s=1555 * GB,
        intra_node=_link(300 * GB, _NVLINK_LATENCY_S),
        inter_node=_link(200 * GB / 8, _INFINIBAND_LATENCY_S),
        default_gpus_per_node=8,
        source="NVIDIA A100 datasheet (SXM4 40GB), DGX A100 node",
    ),
    Accelerator(
        name="a100-80gb",
        # NVIDIA A100 datasheet (SXM4 80GB): 312 TFLOPS bf16 tensor (dense), 156 TF32 (dense),
        # 19.5 fp32, 2,039 GB/s HBM2e,
        # NVLink 600 GB/s both ways. DGX A100 80GB node as above.
        peak_flops=312 * TERA,
        fp32_flops=19.5 * TERA,
        tf32_flops=156 * TERA,
        memory_bytes=80 * GIB,
        memory_bandwidth_bytes_per_s=2039 * GB,
        intra_node=_link(300 * GB, _NVLINK_LATENCY_S),
        inter_node=_link(200 * GB / 8, _INFINIBAND_LATENCY_S),
        default_gpus_per_node=8,
        source="NVIDIA A100 datasheet (SXM4 80GB), DGX A100 node",
    ),
    Accelerator(
        name="h100-80gb",
        # NVIDIA H100 datasheet (SXM5): 989 TFLOPS bf16 tensor (dense; 1,979 with sparsity),
        # 494.5 TF32 (dense), 67 fp32,
        # 3.35 TB/s HBM3, NVLink 900 GB/s both ways (450 one way). DGX H100: 8 GPUs, one
        # 400 Gb/s NDR InfiniBand adapter per GPU.
        peak_flops=989 * TERA,
        fp32_flops=67 * TERA,
        tf32_flops=494.5 * TERA,
        memory_bytes=80 * GIB,
        memory_bandwidth_bytes_per_s=3350 * GB,
        intra_node=_link(450 * GB, _NVLINK_LATENCY_S),
        inter_node=_link(400 * GB / 8, _INFINIBAND_LATENCY_S),
        default_gpus_per_node=8,
        source="NVIDIA H100 datasheet (SXM5), DGX H100 node",
    ),
)

NAMED_ACCELERATORS: dict[str, Accelerator] = {acc.name: acc for acc in _ACCELERATORS}


def named(name: str) -> Accelerator:
    """The accelerator registered under `name`; raises PlanInputError listing the known names."""
    try:
        return NAMED_ACCELERATORS[name]
    except KeyError:
        known = ", ".join(sorted(NAMED_ACCELERATORS))
        raise errors.PlanInputError(
            f"unknown accelerator {name!r}; choose one of: {known}"
        ) from None
