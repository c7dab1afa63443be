"""The one comparator of trained layer states against the fault-free reference's.

Every "equals the reference" check (executor, runtime, end-to-end, chaos invariant, benchmarks)
calls this module, so there is one meaning of "equal":

- Exact mode (`messages.Reduction.EXACT`): `compare(got, want)`, bitwise equality of every
  parameter, both AdamW moments and the step counts (bit patterns: stricter than `torch.equal`,
  which takes -0.0 for 0.0), with no tolerance. A difference reports how
  many elements differ and where the first one is.
- Fast mode (float32 sums in the plan's order): `compare(got, want, bounds)` with
  `SensitivityBounds` measured from the reference's own sensitivity to summation order: the
  same training with the micro-batches summed in the reverse order (`ReferenceTrainer(...,
  reverse_micro_batches=True)`). For each tensor the bound is FACTOR times the largest element
  difference that reordering alone produced in that tensor, and every element of `got` must lie
  within it of `want`, or within ULPS units in the last place of `want`'s element (a small
  tensor, such as a LayerNorm gain of 32 elements, can come out of one reordering unchanged and
  of another one ulp away). A plan reorders the sums differently than the reversal does, and
  AdamW amplifies any reordering where gradients nearly cancel, so the factor leaves room; a lost or
  repeated micro-batch, a mean in place of a sum or a stale layer moves elements by orders of
  magnitude more (tests/agent/test_comparison.py injects each).

Not here: producing the states (`reference`, `runtime_states`, the harness).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from planaria.agent.training import model

States = Mapping[int, model.LayerState]
KINDS = ("parameters", "exp_avg", "exp_avg_sq", "steps")
# Fast mode: how far beyond the reversed-order reference's own largest difference a plan may
# land. Measured on the tests' plans and 15 drawn ones after 5 steps (Intel Xeon): at most 7.5
# times; 32 leaves room for other CPUs, and the injected bugs of the tests exceed it by far.
FACTOR = 32.0
ULPS = 4  # fast mode: a difference of this many units in the last place is always allowed
SHOWN = 5  # differences a description lists before "and N more"


@dataclass(frozen=True, slots=True, kw_only=True)
class Difference:
    """Tensor `name` of `kind` in layer `layer`: `count` of its `numel` elements differ (beyond
    the bound, in fast mode); the first at index `first`, `got` against `want` there."""

    layer: int
    kind: str
    name: str
    count: int
    numel: int
    first: tuple[int, ...]
    got: float
    want: float
    bound: float | None = None  # fast mode: the tensor's bound

    def __str__(self) -> str:
        beyond = "" if self.bound is None else f" by more than {self.bound:.3g} (or {ULPS} ulp)"
        return (
            f"layer {self.layer} {self.kind} {self.name}: {self.count} of {self.numel} elements "
            f"differ{beyond}, first at {list(self.first)}: {self.got!r} vs {self.want!r}"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    """The outcome of one comparison: layers on one side only, and every differing tensor."""

    missing: tuple[int, ...] = ()  # layers the reference has and `got` lacks
    extra: tuple[int, ...] = ()  # layers `got` has and the reference lacks
    differences: tuple[Difference, ...] = ()

    @property
    def equal(self) -> bool:
        return not (self.missing or self.extra or self.differences)

    @property
    def num_differing(self) -> int:
        """Differing elements over every tensor compared."""
        return sum(d.count for d in self.differences)

    def describe(self) -> str:
        """One line per problem, the first SHOWN differences; "" when equal."""
        lines = []
        if self.missing or self.extra:
            lines.append(f"layers missing {list(self.missing)}, unexpected {list(self.extra)}")
        if self.differences:
            lines.append(f"{self.num_differing} elements differ in {len(self.differences)} tensors")
            lines.extend(f"  {d}" for d in self.differences[:SHOWN])
            if len(self.differences) > SHOWN:
                lines.append(f"  ... and {len(self.differences) - SHOWN} more tensors")
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class SensitivityBounds:
    """Fast mode's per-tensor bounds, by (layer, kind, tensor position)."""

    bounds: Mapping[tuple[int, str, int], float]

    @classmethod
    def measure(
        cls, reference: States, reordered: States, factor: float = FACTOR
    ) -> SensitivityBounds:
        """FACTOR times the largest element difference of each tensor between the reference and
        the same training with another summation order (module docstring)."""
        bounds = {}
        for index, state in reference.items():
            for kind in KINDS:
                pairs = zip(_tensors(state, kind), _tensors(reordered[index], kind), strict=True)
                for position, (a, b) in enumerate(pairs):
                    spread = float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
                    bounds[(index, kind, position)] = factor * spread
        return cls(bounds)


def compare(got: States, want: States, bounds: SensitivityBounds | None = None) -> Comparison:
    """`got` against the reference `want`: bitwise without `bounds` (exact mode), else every
    element within its tensor's bound (fast mode). Step counts must always be equal."""
    missing = tuple(sorted(set(want) - set(got)))
    extra = tuple(sorted(set(got) - set(want)))
    differences = [
        difference
        for index in sorted(set(got) & set(want))
        for difference in _layer_differences(got[index], want[index], bounds)
    ]
    return Comparison(missing=missing, extra=extra, differences=tuple(differences))


def _layer_differences(
    got: model.LayerState, want: model.LayerState, bounds: SensitivityBounds | None
) -> list[Difference]:
    if got.names != want.names:
        raise ValueError(
            f"layer {want.index}: parameters {got.names} against the reference's {want.names}; "
            "compare states of the same model"
        )
    found = []
    for kind in KINDS:
        pairs = zip(_tensors(got, kind), _tensors(want, kind), strict=True)
        for position, (a, b) in enumerate(pairs):
            bound = None
            if bounds is not None and kind != "steps":
                bound = bounds.bounds[(want.index, kind, position)]
            difference = _difference(a, b, bound)
            if difference is not None:
                count, first = difference
                found.append(
                    Difference(
                        layer=want.index,
                        kind=kind,
                        name=want.names[position],
                        count=count,
                        numel=b.numel(),
                        first=first,
                        got=float(a[first]),
                        want=float(b[first]),
                        bound=bound,
                    )
                )
    return found


def _difference(
    a: torch.Tensor, b: torch.Tensor, bound: float | None
) -> tuple[int, tuple[int, ...]] | None:
    """(differing elements, index of the first) or None when `a` matches `b`: bitwise without
    a bound, else within the bound or ULPS ulps."""
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(
            f"a tensor of shape {tuple(a.shape)} {a.dtype} against the reference's "
            f"{tuple(b.shape)} {b.dtype}; compare states of the same model"
        )
    if bound is None:
        a_bits, b_bits = _bits(a), _bits(b)  # bitwise: -0.0 is not 0.0, a NaN equals its bits
        if torch.equal(a_bits, b_bits):
            return None
        mask = a_bits != b_bits
    else:
        allowed = torch.clamp(ULPS * _ulp(b), min=bound)
        mask = ~((a.double() - b.double()).abs() <= allowed)  # NaN lands outside every bound
    count = int(mask.sum())
    if count == 0:
        return None
    first = tuple(int(i) for i in mask.nonzero()[0])
    return count, first


def _ulp(t: torch.Tensor) -> torch.Tensor:
    """The unit in the last place of each element of `t`, in float64."""
    magnitude = t.abs()
    return (torch.nextafter(magnitude, torch.full_like(magnitude, torch.inf)) - magnitude).double()


_BITS = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """A floating tensor's bit patterns as integers of the same width (others as they are)."""
    return t.view(_BITS[t.element_size()]) if t.is_floating_point() else t


def _tensors(state: model.LayerState, kind: str) -> tuple[torch.Tensor, ...]:
    tensors: tuple[torch.Tensor, ...] = getattr(state, kind)
    return tensors
