"""What `planaria run` checks before anything starts, and the options it hands on.

    options = run_checks.options(args, loaded, name)   # RunCommandError, FaultSyntaxError

Every option is refused here, with one line naming it and what to change, before the run
directory is made, the lock taken or an agent started, so a refused command leaves nothing on
disk: the failures (`--fail` parsed and checked against the job by the job file's own rule,
`planaria.local.faults.parse_failures`; the file's entries were checked when it was loaded),
`--mtbf`, `--metrics-port`, the two directories, `--out` and `--snapshot-base`, the job's
device: `device: cuda` needs a GPU per worker on this machine (`planaria.local.devices`), and
the job's data when it needs tokenising (`prepare_data`: it is tokenised into its cache here,
once, before any agent starts), and that a Hugging Face model source can be built
(`check_model`: transformers installed).

A directory is checked by trying it, not with `os.access`: the missing folders are made, a
temporary file is created in the last and everything made is removed again. root passes every
permission check, yet cannot create a folder under /proc or on a read-only mount, nor under a
file; trying finds all of these, and finds a directory root may write as usable, as it is.

Errors: `RunCommandError` (a ValueError: `planaria.cli.main` prints it as one line, exit 2).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from planaria.contract import plan, shapes
from planaria.local import devices, faults, launching
from planaria.spec import conversion, job, job_file


class RunCommandError(ValueError):
    """An option of `planaria run` out of range; names the option and the fix."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    """What the run needs besides the job's settings, every part checked."""

    failures: tuple[faults.Failure, ...]  # the file's, then the --fail flags'
    mtbf_s: float | None
    out: Path
    live: bool
    snapshot_base: Path
    metrics_port: int | None
    gpus: dict[plan.WorkerId, str] = field(default_factory=dict)  # cuda: each worker's GPU


def cuda_device_count() -> int:
    """How many CUDA devices torch sees here (0 with a CPU build of torch)."""
    import torch  # only for a cuda job: the checks of a cpu job stay torch-free

    return int(torch.cuda.device_count())


def options(
    args: argparse.Namespace,
    loaded: job_file.JobFile,
    name: str,
    *,
    live: bool,
    gpu_count: Callable[[], int] = cuda_device_count,
) -> Options:
    """`planaria run`'s options for the job `loaded` (named `name`), or the first problem;
    `gpu_count` says how many GPUs this machine shows (asked only for a cuda job)."""
    spec = loaded.spec
    gpus: dict[plan.WorkerId, str] = {}
    if spec.device == "cuda":
        try:
            visible = devices.visible_gpus(os.environ, count=gpu_count())
            gpus = devices.assign(workers=spec.workers, gpus=visible)
        except devices.DeviceError as exc:
            raise RunCommandError(f"{args.job}: {exc}") from None
    failures = [faults.from_spec(f) for f in spec.failures]
    failures += faults.parse_failures(args.fail, workers=spec.workers, steps=spec.steps)
    mtbf_s = faults.parse_mtbf(args.mtbf) if args.mtbf is not None else None
    if args.metrics_port is not None and not 0 <= args.metrics_port <= 65535:
        raise RunCommandError(f"--metrics-port {args.metrics_port}: give a port in [0, 65535]")
    out = Path(args.out) if args.out else Path("runs") / name
    base = Path(args.snapshot_base) if args.snapshot_base else launching.DEFAULT_SNAPSHOT_BASE
    check_directory(out, "--out", default=not args.out)
    check_directory(base, "--snapshot-base", default=not args.snapshot_base)
    prepare_data(args.job, spec.data)
    check_model(args.job, spec)
    return Options(
        failures=tuple(failures),
        mtbf_s=mtbf_s,
        out=out,
        live=live,
        snapshot_base=base,
        metrics_port=args.metrics_port,
        gpus=gpus,
    )


def check_directory(path: Path, option: str, *, default: bool = False) -> None:
    """RunCommandError unless `path` (given as `option`, or its default) is a directory this
    process can create files in, or can be made one; leaves the file system as it found it
    (module docstring)."""
    made: list[Path] = []
    what = f"{option} {path}" + (" (the default)" if default else "")
    fix = f"give {option} a directory you can write"
    try:
        for folder in (*reversed(path.parents), path):
            if folder.is_dir():
                continue
            if folder.exists() or folder.is_symlink():
                raise RunCommandError(f"{what}: {folder} is not a directory; {fix}")
            folder.mkdir()
            made.append(folder)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        where = exc.filename or path
        raise RunCommandError(
            f"{what}: cannot create or write {where} ({exc.strerror}); {fix}"
        ) from None
    finally:
        for folder in reversed(made):
            with contextlib.suppress(OSError):
                folder.rmdir()


def prepare_data(source: str, spec: job.DataSpec) -> None:
    """Tokenise the job's corpus into its cache now, when it needs tokenising (a tokenizer, a
    separator, JSONL or Parquet), so every agent maps the cached tokens and a bad field, file or
    tokenizer, an empty corpus or a missing `planaria[hf]` is refused before anything starts.
    Plain byte text is the agents' to read, as before (docs/running.md, "A job that fails on
    its agents' errors")."""
    if not conversion.data_settings(spec, corpus_default=UNUSED_DEFAULT).needs_tokenising:
        return
    from planaria.agent.training import corpora, data  # torch: only for a job with such data

    settings = conversion.data_settings(spec, corpus_default=str(data.default_corpus_root()))
    try:
        corpora.load(settings)
    except data.CorpusError as exc:
        raise RunCommandError(f"{source}: {exc}") from None


def check_model(source: str, spec: job.JobSpec) -> None:
    """RunCommandError when the job's modelSource needs transformers and it is not installed
    (found without importing it), or when its checkpointPath does not hold the model's tensors
    with the model's shapes (the tokenizer's vocabulary included; this imports transformers)."""
    if spec.model_source is None:
        return
    if importlib.util.find_spec("transformers") is None:
        raise RunCommandError(
            f"{source}: modelSource needs transformers; install planaria[hf] "
            "(pip install 'planaria[hf]')"
        )
    if not spec.model_source.checkpoint_path:
        return
    from planaria.agent.training import corpora, hf_models  # torch: only for such a job

    shape = shapes.resolve(conversion.model_name(spec))
    if spec.data.tokenizer:
        vocab = corpora.Tokenizer.open(spec.data.tokenizer).vocab_size
        shape = dataclasses.replace(shape, vocab_size=vocab)
    try:
        hf_models.check_weights(shape)
    except hf_models.HfModelError as exc:
        raise RunCommandError(f"{source}: {exc}") from None


UNUSED_DEFAULT = "(the default corpus)"  # a stand-in where only the data's kind is asked
