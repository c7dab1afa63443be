"""`planaria export`: a job's persistent checkpoint as a Hugging Face model folder.

    planaria export JOB_FILE --checkpoint DIR [--step N] --out DIR

Reads the model source of the job file (`modelSource`, docs/running.md "Models"), loads the
checkpoint's layer states (the newest complete step, or --step) and writes model.safetensors and
config.json in the family's layout (`planaria.agent.training.hf_export`); with a tokenizer in
the job's data, its tokenizer.json is copied beside them. The folder loads back with
transformers' `from_pretrained`. torch and the agent are imported only inside the handler.
User errors (a job without a modelSource, no checkpoint, a checkpoint that is not this model's)
are ValueErrors: one line, exit status 2.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from planaria.contract import shapes
from planaria.spec import conversion, job_file


class ExportCommandError(ValueError):
    """Options that do not name an exportable checkpoint; the message says what to change."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "export",
        help="write a job's checkpoint as a Hugging Face model folder (safetensors)",
        description="Export the parameters of a job's persistent checkpoint in its model "
        "family's safetensors layout, loadable with transformers' from_pretrained.",
    )
    parser.add_argument("job_file", metavar="JOB_FILE", help="the job file the model trained by")
    parser.add_argument(
        "--checkpoint", required=True, metavar="DIR", help="the job's checkpoints.dir"
    )
    parser.add_argument(
        "--step", type=int, metavar="N", help="the step to export (default: the newest complete)"
    )
    parser.add_argument("--out", required=True, metavar="DIR", help="the model folder to write")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    spec = job_file.load_job(args.job_file).spec
    if spec.model_source is None:
        raise ExportCommandError(
            f"{args.job_file}: the job trains the named model {spec.model!r}; export writes "
            "Hugging Face models only (a job with a modelSource)"
        )
    shape = shapes.resolve(conversion.model_name(spec))
    # Imported here: torch takes seconds to import and only an export needs it.
    from planaria.agent.state import checkpoints
    from planaria.agent.training import hf_export

    root = Path(args.checkpoint)
    if not checkpoints.checkpoint_steps(root):
        raise ExportCommandError(f"--checkpoint {root}: holds no checkpoint; give checkpoints.dir")
    states = checkpoints.load_checkpoint(root, args.step)
    out = Path(args.out)
    weights = hf_export.export(shape, states, out)
    if spec.data.tokenizer:
        shutil.copyfile(spec.data.tokenizer, out / "tokenizer.json")
    print(f"wrote {weights} and {out / hf_export.CONFIG_FILE} ({len(states)} planner layers)")
    return 0
