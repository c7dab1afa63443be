"""How the commands present themselves in `--help`: an example per command and the formatter.

`EXAMPLES` holds real command lines, one or more per command (README.md's table of commands
and the docs they link to); `planaria.cli.main` puts them in each command's epilog, and a test
parses every one with the real parser. `Formatter` shows an option's default where it has one
worth showing and keeps the examples as written. What each option means stays in the command's
own module.
"""

from __future__ import annotations

import argparse

EXAMPLES: dict[str, tuple[str, ...]] = {
    "version": ("planaria version",),
    "profile": (
        "planaria profile --model tiny --micro-batch 4 --out p.json",
        "planaria profile --synthetic gpt3-6.7b --accelerator a100-80gb --micro-batch 1 "
        "--out p.json",
        "planaria profile --check p.json",
    ),
    "reference": ("planaria reference --model tiny --steps 200",),
    "plan": (
        "planaria plan --profile p.json --nodes 10 --gpus-per-node 4 --fault-tolerance 1 "
        "--global-batch 512 --micro-batch 1 --failed 3,7 --explain --mtbf 3600",
    ),
    "simulate": (
        "planaria simulate --scenario odyssey --seeds 20 --out out/",
        "planaria simulate --trace my.csv --scenario oobleck-1h --hours 6 --out out/ --json",
    ),
    "run": ("planaria run examples/tiny-job.yaml --out runs/demo --fail step=40:worker=3",),
    "export": (
        "planaria export examples/hf-llama/job.yaml --checkpoint runs/llama-ckpt --out llama-hf",
    ),
    "agent": ("planaria agent --worker 0 --job tiny --tls-dir /etc/planaria/tls",),
    "operator": (
        "planaria operator --namespace ml --standalone --agent-image REGISTRY/planaria:latest",
    ),
}


def epilog(command: str) -> str:
    """The epilog of `command`'s help: its examples, one indented line each."""
    lines = EXAMPLES[command]
    heading = "example:" if len(lines) == 1 else "examples:"
    return "\n".join([heading, *(f"  {line}" for line in lines)])


class Formatter(argparse.HelpFormatter):
    """argparse's formatter, plus: an option's help ends with "(default: X)" unless X is
    None, False, empty, or the help already says its default; and in a description or epilog,
    an indented line (a command line) is kept as written while other lines are wrapped."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        # identity, not equality: a default of 0 is worth showing, and 0 == False
        hidden = default is None or default is False or default is argparse.SUPPRESS
        if hidden or default in ("", []) or action.required or "default" in text:
            return text
        return f"{text} (default: %(default)s)"

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        lines = []
        for line in text.splitlines():
            if line.startswith(" "):
                lines.append(indent + line)
            else:
                lines.append(super()._fill_text(line, width, indent))
        return "\n".join(lines)
