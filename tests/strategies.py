"""Shared Hypothesis strategies, one section per kind of value (append yours; keep others').

Profiles (planaria.planner.profile): `link_profiles`, `layer_profiles`, `profiles`, with finite,
non-negative times and byte counts and model names that are none of the named shapes (a named
model's profile must have exactly its layer count). Model shapes: `small_shapes`, GPT shapes
small enough to cost or build in a test.
"""

from __future__ import annotations

from hypothesis import strategies as st

from planaria.planner import profile, shapes

# --- profiles ----------------------------------------------------------------------------------

_SECONDS = st.floats(min_value=0.0, max_value=1e3, allow_nan=False, allow_infinity=False)
_BYTES = st.integers(min_value=0, max_value=2**50)
_NAMES = st.text(min_size=1, max_size=12)


def link_profiles() -> st.SearchStrategy[profile.LinkProfile]:
    """Links with positive bandwidth (1 B/s .. 1 TB/s) and latency up to a second."""
    return st.builds(
        profile.LinkProfile,
        bandwidth_bytes_per_s=st.floats(min_value=1.0, max_value=1e12),
        latency_s=st.floats(min_value=0.0, max_value=1.0),
    )


@st.composite
def layer_profiles(draw: st.DrawFn, max_gpus: int) -> profile.LayerProfile:
    """One layer with times for exactly 1..max_gpus GPUs."""
    times = st.lists(_SECONDS, min_size=max_gpus, max_size=max_gpus).map(tuple)
    return profile.LayerProfile(
        name=draw(_NAMES),
        forward_s=draw(times),
        backward_s=draw(times),
        parameter_bytes=draw(_BYTES),
        gradient_bytes=draw(_BYTES),
        optimizer_bytes=draw(_BYTES),
        activation_bytes=draw(_BYTES),
        output_bytes=draw(_BYTES),
        optimizer_s=draw(_SECONDS),
    )


@st.composite
def profiles(draw: st.DrawFn, *, max_layers: int = 8, max_gpus: int = 4) -> profile.Profile:
    """A valid profile of 1..max_layers layers, all timed for the same 1..M GPUs."""
    m = draw(st.integers(min_value=1, max_value=max_gpus))
    return profile.Profile(
        model=draw(_NAMES.filter(lambda name: name not in shapes.NAMED_SHAPES)),
        accelerator=draw(_NAMES),
        micro_batch_size=draw(st.integers(min_value=1, max_value=64)),
        memory_bytes=draw(st.integers(min_value=1, max_value=2**40)),
        layers=tuple(draw(st.lists(layer_profiles(m), min_size=1, max_size=max_layers))),
        intra_node=draw(link_profiles()),
        inter_node=draw(link_profiles()),
        synthetic=draw(st.booleans()),
    )


@st.composite
def small_shapes(draw: st.DrawFn, *, max_layers: int = 6) -> shapes.ModelShape:
    """A small GPT shape: heads divide d_model; ffn_dim either the default 4*d or explicit."""
    num_heads = draw(st.integers(min_value=1, max_value=8))
    d_model = num_heads * draw(st.integers(min_value=1, max_value=32))
    return shapes.ModelShape(
        name="small-drawn",
        num_layers=draw(st.integers(min_value=1, max_value=max_layers)),
        d_model=d_model,
        num_heads=num_heads,
        seq_len=draw(st.integers(min_value=1, max_value=256)),
        vocab_size=draw(st.integers(min_value=1, max_value=4096)),
        ffn_dim=draw(st.sampled_from([0, d_model, 3 * d_model + 1])),
    )
