"""``elastic-train``: one console command, a subcommand per job (each is also ``python -m jobs.<module>``).

    elastic-train train --config configs/digits.yaml train.lr=1e-3
    elastic-train sweep --config configs/sweep-digits.yaml
    elastic-train evaluate --checkpoint results/RUN
    elastic-train preflight --config configs/digits.yaml scaling.num_workers=8
    elastic-train ui                       # the MLflow UI on the store the runs use

A new job is one line in :data:`COMMANDS`: a module with ``main(argv, prog=...) -> int``.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys

from jobs._cli import CONFIG_REFERENCE, EXIT_BAD_INPUT, EXIT_OK

PROG = "elastic-train"

# subcommand -> job module (its docstring's first line is the summary shown by `elastic-train --help`)
COMMANDS: dict[str, str] = {
    "train": "jobs.train",
    "sweep": "jobs.sweep",
    "evaluate": "jobs.evaluate",
    "preflight": "jobs.preflight",
    "ui": "jobs.mlflow_ui",
    "prepare-tokens": "jobs.prepare_tokens",
    "generate": "jobs.generate",
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"usage: {PROG} COMMAND [--help] [--config FILE] [section.key=value ...]", "", "commands:"]
    for name, module in COMMANDS.items():
        lines.append(f"  {name:<{width}}  {summary(module)}")
    lines += ["", f"`{PROG} COMMAND --help` for a command's options; each is also `python -m jobs.<module>`.",
              f"Every config key: {CONFIG_REFERENCE}."]
    return "\n".join(lines)


def summary(module: str) -> str:
    """The first sentence of a job module's docstring, on one line."""
    first = " ".join((importlib.import_module(module).__doc__ or "").strip().split("\n\n")[0].split())
    return re.split(r"[.:;](?:\s|$)", first, maxsplit=1)[0]


def main(argv: list[str] | None = None) -> int:
    program = argv is None  # the program itself: a job's wall counts from the process start
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:
        print(usage(), file=sys.stderr)
        return EXIT_BAD_INPUT
    if argv[0] in ("-h", "--help", "help"):
        print(usage())
        return EXIT_OK
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"error: unknown command {name!r}; choose one of {', '.join(COMMANDS)} (see {PROG} --help)",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    job = importlib.import_module(COMMANDS[name]).main
    params = inspect.signature(job).parameters
    kwargs: dict[str, object] = {"prog": f"{PROG} {name}"} if "prog" in params else {}
    if "program" in params:  # the job is this process's program, though handed its arguments
        kwargs["program"] = program
    return job(rest, **kwargs)


if __name__ == "__main__":
    sys.exit(main())
