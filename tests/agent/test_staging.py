"""Host staging of live layer state (planaria.agent.state.staging).

Covers: merged ranges cover exactly the same bytes, sorted and disjoint (hypothesis); staged
flattened bytes equal the live state's in the wanted ranges for small and large tensors,
whatever the ranges (hypothesis); a second stage after an in-place update shows
the new bytes (the cached views follow the tensors); a replaced tensor or new ranges prepare the
layer afresh; non-contiguous tensors are copied each time; forgotten layers are dropped. Buffers
outlive their staging: a closed staging's buffers serve the next staging on the same copier (the
next epoch's writer: pinned memory is allocated once, not once per epoch), a forgotten layer's
buffer serves another layer of its size, a resized layer gives its old buffer back, and `trim`
frees what nobody took.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from planaria.agent.state import staging
from planaria.agent.training import model

RANGES = st.lists(
    st.tuples(st.integers(0, 400), st.integers(0, 400)).map(lambda t: range(min(t), max(t))),
    max_size=6,
)


@given(ranges=RANGES)
def test_merged_ranges_cover_the_same_bytes(ranges: list[range]) -> None:
    merged = staging.merge(ranges)
    assert {b for r in merged for b in r} == {b for r in ranges for b in r}
    assert all(len(r) for r in merged)
    assert all(a.stop < b.start for a, b in zip(merged, merged[1:], strict=False))


def _state(sizes: list[int], seed: int = 0) -> model.LayerState:
    rng = np.random.default_rng(seed)

    def group() -> tuple[torch.Tensor, ...]:
        return tuple(torch.from_numpy(rng.standard_normal(n).astype(np.float32)) for n in sizes)

    return model.LayerState(
        index=0,
        names=tuple(f"p{i}" for i in range(len(sizes))),
        parameters=group(),
        exp_avg=group(),
        exp_avg_sq=group(),
        steps=tuple(torch.tensor(1.0) for _ in sizes),
    )


def _live_bytes(state: model.LayerState) -> bytes:
    return b"".join(t.contiguous().numpy().tobytes() for t in state.tensors())


def _check(state: model.LayerState, wanted: list[range], stage: staging.Staging) -> None:
    _, staged = stage.stage(state, wanted)
    live = _live_bytes(state)
    for r in wanted:
        assert staged.copy(r.start, r.stop).tobytes() == live[r.start : r.stop]


BIG = 16 * 1024 + 3  # float32 elements: a tensor of more than 64 KiB


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.sampled_from([0, 1, 7, 100, BIG]), min_size=1, max_size=4),
    cuts=st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1)), max_size=4),
)
def test_staged_bytes_equal_the_live_state_in_the_wanted_ranges(
    sizes: list[int], cuts: list[tuple[float, float]]
) -> None:
    state = _state(sizes)
    n = state.nbytes
    wanted = [range(int(min(c) * n), int(max(c) * n)) for c in cuts]
    stage = staging.Staging()
    _check(state, wanted, stage)
    for t in state.tensors():  # in place, as AdamW updates
        t.add_(1)
    _check(state, wanted, stage)


def test_a_replaced_tensor_or_new_ranges_prepare_the_layer_afresh() -> None:
    state = _state([5, BIG])
    stage = staging.Staging()
    _check(state, [range(0, 40)], stage)
    replaced = model.LayerState(
        index=0,
        names=state.names,
        parameters=(torch.full((5,), 3.0), state.parameters[1]),
        exp_avg=state.exp_avg,
        exp_avg_sq=state.exp_avg_sq,
        steps=state.steps,
    )
    _check(replaced, [range(0, 40)], stage)
    _check(replaced, [range(10, replaced.nbytes)], stage)


def test_non_contiguous_tensors_are_copied_every_time() -> None:
    matrix = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    state = model.LayerState(
        index=2,
        names=("w",),
        parameters=(matrix.t(),),
        exp_avg=(matrix,),
        exp_avg_sq=(matrix,),
        steps=(torch.tensor(0.0),),
    )
    stage = staging.Staging()
    _, staged = stage.stage(state, [range(0, state.nbytes)])
    assert staged.copy(0, 48).tobytes() == matrix.t().contiguous().numpy().tobytes()
    matrix.add_(1)
    _, staged = stage.stage(state, [range(0, state.nbytes)])
    assert staged.copy(0, 48).tobytes() == matrix.t().contiguous().numpy().tobytes()


def test_forgotten_layers_are_dropped() -> None:
    stage = staging.Staging()
    stage.stage(_state([3]), [range(0, 8)])
    stage.keep_only(set())
    assert stage._layers == {}  # the cached views (and their tensors) are released


def test_a_closed_stagings_buffers_serve_the_next_staging_on_the_same_copier() -> None:
    copier = staging.CpuCopier()
    first = staging.Staging(copier)
    states = [_state([7, BIG], seed=1), _state([100], seed=2)]
    states[1] = dataclasses.replace(states[1], index=1)
    buffers = {s.index: first.prepare(s, [range(0, s.nbytes)]).buffer for s in states}
    first.close()
    assert first._layers == {}
    second = staging.Staging(copier)  # the next epoch's writer
    for state in states:
        prepared = second.prepare(state, [range(0, state.nbytes)])
        assert prepared.buffer is buffers[state.index]  # no new allocation
        _check(state, [range(0, state.nbytes)], second)  # and the bytes are right


def test_forgotten_and_resized_layers_give_their_buffers_back_and_trim_frees_them() -> None:
    copier = staging.CpuCopier()
    stage = staging.Staging(copier)
    state = _state([BIG])
    whole = stage.prepare(state, [range(0, state.nbytes)]).buffer
    half = stage.prepare(state, [range(0, state.nbytes // 2)]).buffer  # new ranges, new size
    assert half is not whole and half.numel() == state.nbytes // 2
    assert copier.buffer(whole.numel()) is whole  # the resized layer gave it back
    copier.recycle(whole)
    stage.keep_only(set())
    assert copier.buffer(half.numel()) is half  # the forgotten layer gave it back
    copier.recycle(half)
    copier.trim()
    assert copier.buffer(half.numel()) is not half  # freed: a new buffer
