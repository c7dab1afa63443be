"""Training data (planaria.agent.training.data).

Covers: byte tokenizer round trip; corpus files in sorted path order (nested directories,
hidden entries and site-packages skipped, suffix filter, named files read whatever their
suffix, paths in the order given), the byte cap, the standard-library default corpus, and
one-line errors for missing paths, empty corpora and bad caps; dataset windows (targets shifted
by one, sample count) against a slicing oracle; the sampler against a brute-force stream of
per-epoch permutations: determinism, every split of a step covering the same samples in order,
each sample once per epoch across epoch boundaries, and split errors.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from planaria.agent.training import data

# --- tokenizer ----------------------------------------------------------------------------------


@given(st.binary(max_size=200))
def test_bytes_round_trip_through_the_tokenizer(raw: bytes) -> None:
    ids = data.encode(raw)
    assert ids.dtype == np.uint8 and len(ids) == len(raw)
    assert bytes(ids.tolist()) == raw


@given(st.text(max_size=100))
def test_text_round_trips_through_the_tokenizer(text: str) -> None:
    assert data.decode(data.encode(text)) == text
    assert data.decode(torch.from_numpy(data.encode(text).astype(np.int64))) == text


# --- corpus -------------------------------------------------------------------------------------


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_directories_are_read_in_sorted_path_order(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "b.py": "B",
            "a/z.py": "AZ",
            "a/b/c.py": "ABC",
            "a.py": "A",
            "a/notes.md": "N",
            "a/binary.bin": "skipped: suffix",
            ".hidden/x.py": "skipped: hidden",
            "lib/site-packages/y.py": "skipped: installed packages",
        },
    )
    found = [p.relative_to(root).as_posix() for p in data.corpus_files(root)]
    assert found == ["a/b/c.py", "a/notes.md", "a/z.py", "a.py", "b.py"]
    assert data.decode(data.load_corpus([root])) == "ABCNAZAB"


def test_a_named_file_is_read_whatever_its_suffix_and_paths_keep_their_order(
    tmp_path: Path,
) -> None:
    _tree(tmp_path, {"data.bin": "raw", "d/x.txt": "text"})
    tokens = data.load_corpus([tmp_path / "d", tmp_path / "data.bin"])
    assert data.decode(tokens) == "textraw"


def test_suffixes_can_be_chosen(tmp_path: Path) -> None:
    _tree(tmp_path, {"a.py": "P", "b.txt": "T"})
    assert data.decode(data.load_corpus([tmp_path], suffixes=frozenset({".txt"}))) == "T"


@given(cap=st.integers(1, 40))
def test_the_byte_cap_cuts_the_corpus_exactly(cap: int) -> None:
    # Hypothesis does not mix with function-scoped fixtures: a temporary tree per example.
    with tempfile.TemporaryDirectory() as name:
        root = _tree(Path(name), {"a.txt": "0123456789", "b.txt": "abcdefghij", "c.txt": "XYZ"})
        whole = data.decode(data.load_corpus([root]))
        assert data.decode(data.load_corpus([root], max_bytes=cap)) == whole[:cap]


def test_the_default_corpus_is_the_standard_librarys_sources() -> None:
    root = data.default_corpus_root()
    assert (root / "os.py").is_file()
    first = next(data.corpus_files(root, frozenset({".py"})))
    tokens = data.load_default_corpus(max_bytes=50_000)
    assert len(tokens) == 50_000
    assert bytes(tokens[:100].tolist()) == first.read_bytes()[:100]


@pytest.mark.parametrize(
    ("paths", "message"),
    [
        (["missing"], "corpus path '.*missing' does not exist; name a file or directory"),
        (["empty"], "corpus '.*empty' is empty: no non-empty files .* name files or directories"),
        (["only.bin/.."], "is empty"),
        ([], "no corpus paths given"),
    ],
    ids=["a missing path", "an empty directory", "a directory without text files", "no paths"],
)
def test_a_corpus_is_refused_for(tmp_path: Path, paths: list[str], message: str) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "only.bin").mkdir()
    (tmp_path / "only.bin" / "x.bin").write_bytes(b"\0")
    with pytest.raises(data.CorpusError, match=message):
        data.load_corpus([tmp_path / p for p in paths])


def test_a_byte_cap_below_one_is_refused(tmp_path: Path) -> None:
    with pytest.raises(data.CorpusError, match="max corpus bytes must be >= 1"):
        data.load_corpus([tmp_path], max_bytes=0)


def test_corpus_errors_are_value_errors() -> None:
    assert issubclass(data.CorpusError, ValueError)
    assert issubclass(data.BatchError, ValueError)


# --- dataset ------------------------------------------------------------------------------------


@given(seq_len=st.integers(1, 20), extra=st.integers(1, 300), data_=st.data())
def test_samples_are_windows_with_targets_shifted_by_one(
    seq_len: int, extra: int, data_: st.DataObject
) -> None:
    length = seq_len + extra
    tokens = (np.arange(length) % 251).astype(np.uint8)
    dataset = data.TokenDataset(tokens=tokens, seq_len=seq_len)
    assert dataset.num_samples == (length - 1) // seq_len
    indices = data_.draw(st.lists(st.integers(0, dataset.num_samples - 1), max_size=5))
    inputs, targets = dataset.batch(indices)
    assert inputs.dtype == targets.dtype == torch.int64
    assert inputs.shape == targets.shape == (len(indices), seq_len)
    for row, i in enumerate(indices):
        window = tokens[i * seq_len : i * seq_len + seq_len + 1].astype(np.int64)
        assert inputs[row].tolist() == window[:-1].tolist()
        assert targets[row].tolist() == window[1:].tolist()


def test_a_corpus_shorter_than_one_sample_is_refused() -> None:
    with pytest.raises(data.CorpusError, match="has 8 tokens but one sample of seq_len 8 needs 9"):
        data.TokenDataset(tokens=data.encode(b"12345678"), seq_len=8)


def test_a_sample_index_past_the_end_is_refused() -> None:
    dataset = data.TokenDataset(tokens=data.encode(b"0123456789"), seq_len=3)
    with pytest.raises(IndexError, match=r"0\.\.2"):
        dataset.batch([3])


# --- sampler ------------------------------------------------------------------------------------

samplers = st.builds(
    data.Sampler,
    num_samples=st.integers(1, 40),
    global_batch_size=st.integers(1, 24),
    seed=st.integers(0, 2**32),
)


def _stream(sampler: data.Sampler, num_epochs: int) -> list[int]:
    """Oracle: the permutations of epochs 0..num_epochs-1, concatenated."""
    stream: list[int] = []
    for epoch in range(num_epochs):
        rng = np.random.Generator(np.random.PCG64([sampler.seed, epoch]))
        stream.extend(int(i) for i in rng.permutation(sampler.num_samples))
    return stream


@given(sampler=samplers, step=st.integers(0, 30))
def test_a_global_batch_is_its_slice_of_the_epoch_stream(sampler: data.Sampler, step: int) -> None:
    b = sampler.global_batch_size
    epochs = ((step + 1) * b) // sampler.num_samples + 1
    expected = _stream(sampler, epochs)[step * b : (step + 1) * b]
    assert sampler.global_batch(step) == tuple(expected)


@given(sampler=samplers, step=st.integers(0, 30))
def test_the_sampler_is_deterministic(sampler: data.Sampler, step: int) -> None:
    twin = data.Sampler(
        num_samples=sampler.num_samples,
        global_batch_size=sampler.global_batch_size,
        seed=sampler.seed,
    )
    assert sampler.global_batch(step) == twin.global_batch(step)


@given(sampler=samplers, num_epochs=st.integers(1, 4))
def test_every_sample_appears_once_per_epoch_across_batch_boundaries(
    sampler: data.Sampler, num_epochs: int
) -> None:
    n, b = sampler.num_samples, sampler.global_batch_size
    steps = -(-num_epochs * n // b)  # enough steps to cover the epochs
    stream = [i for step in range(steps) for i in sampler.global_batch(step)]
    for epoch in range(num_epochs):
        assert sorted(stream[epoch * n : (epoch + 1) * n]) == list(range(n))


@st.composite
def splits(draw: st.DrawFn) -> tuple[data.Sampler, int, list[int]]:
    """A sampler and a split of its global batch: micro-batch size b, counts per pipeline."""
    b = draw(st.integers(1, 6))
    num_micro = draw(st.integers(1, 8))
    cuts = sorted(draw(st.lists(st.integers(0, num_micro), max_size=4)))
    bounds = [0, *cuts, num_micro]
    counts = [hi - lo for lo, hi in zip(bounds, bounds[1:], strict=False)]
    sampler = data.Sampler(
        num_samples=draw(st.integers(1, 30)),
        global_batch_size=b * num_micro,
        seed=draw(st.integers(0, 99)),
    )
    return sampler, b, counts


@given(split=splits(), step=st.integers(0, 20))
def test_any_split_covers_the_steps_batch_in_order(
    split: tuple[data.Sampler, int, list[int]], step: int
) -> None:
    sampler, b, counts = split
    pipelines = sampler.split(step, b, counts)
    assert [len(micro_batches) for micro_batches in pipelines] == counts
    flat = [i for micro_batches in pipelines for mb in micro_batches for i in mb]
    assert tuple(flat) == sampler.global_batch(step)
    assert all(len(mb) == b for micro_batches in pipelines for mb in micro_batches)


def test_global_micro_batch_g_covers_positions_g_times_b() -> None:
    sampler = data.Sampler(num_samples=100, global_batch_size=12, seed=7)
    batch = sampler.global_batch(3)
    pipelines = sampler.split(3, 2, [1, 3, 2])
    assert pipelines[1][0] == batch[2:4]  # global micro-batch 1
    assert pipelines[2][1] == batch[10:12]  # global micro-batch 5


def test_seeds_change_the_order() -> None:
    orders = {
        data.Sampler(num_samples=50, global_batch_size=50, seed=s).global_batch(0) for s in range(3)
    }
    assert len(orders) == 3


@pytest.mark.parametrize(
    ("b", "counts", "message"),
    [
        (5, [1, 1], "global batch size 12 is not a multiple of the micro-batch size 5"),
        (3, [1, 2], "3 micro-batches .* cover 9 samples but the global batch is 12; .* sum to 4"),
        (3, [5, -1], "counts must be >= 0"),
        (0, [4], "micro-batch size must be >= 1"),
    ],
    ids=[
        "a micro-batch that does not divide the batch",
        "too few micro-batches",
        "a negative count",
        "an empty micro-batch",
    ],
)
def test_a_split_is_refused_for(b: int, counts: list[int], message: str) -> None:
    sampler = data.Sampler(num_samples=30, global_batch_size=12, seed=0)
    with pytest.raises(data.BatchError, match=message):
        sampler.split(0, b, counts)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"num_samples": 0}, "num_samples must be >= 1"),
        ({"global_batch_size": 0}, "global batch size must be >= 1"),
        ({"seed": -1}, "seed must be >= 0"),
    ],
    ids=["no samples", "an empty global batch", "a negative seed"],
)
def test_a_sampler_is_refused_with(fields: dict[str, int], message: str) -> None:
    arguments = {"num_samples": 10, "global_batch_size": 4, "seed": 0} | fields
    with pytest.raises(data.BatchError, match=message):
        data.Sampler(**arguments)


def test_a_negative_step_is_refused() -> None:
    with pytest.raises(data.BatchError, match="step must be >= 0"):
        data.Sampler(num_samples=10, global_batch_size=4, seed=0).global_batch(-1)
