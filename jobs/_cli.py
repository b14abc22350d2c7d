"""What every job shares: the common arguments, the exit-2 rule for bad input, and writing JSON."""

from __future__ import annotations

import argparse
import re
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from elastic_train.config import ConfigError
from elastic_train.files import write_json_atomically

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_KILLED = 0, 1, 2, 130


# An override written like an option: `--train.lr=0.1`, `-train.lr 0.1`, `--train.lr`.
_DASHED_OVERRIDE = re.compile(r"-{1,2}(?P<key>[A-Za-z_][\w-]*(?:\.[\w-]+)+)(?:=(?P<value>.*))?", re.DOTALL)


class ArgumentParser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line and exit code 2 (argparse's own convention), and takes
    ``section.key=value`` overrides anywhere on the line, between options too (as Hydra and torchrun do):
    ``train.lr=1e-3 --summary-json s.json train.epochs=2``."""

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        args = sys.argv[1:] if args is None else list(args)
        self._refuse_dashed_overrides(args)
        return self.parse_intermixed_args(args, namespace)

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_BAD_INPUT, f"error: {message} (see --help)\n")

    def _refuse_dashed_overrides(self, args: list[str]) -> None:
        """``--train.lr=0.1`` is an override with dashes: say how to write it, not just "unrecognized"."""
        for i, arg in enumerate(args):
            if arg == "--":
                return
            m = _DASHED_OVERRIDE.fullmatch(arg)
            if m is None or arg.split("=", 1)[0] in self._option_string_actions:
                continue
            value = m["value"]
            if value is None:  # `--train.lr 0.1`: the value is the next word, if there is one
                following = args[i + 1] if i + 1 < len(args) else ""
                value = following if following and not following.startswith("-") and "=" not in following else "VALUE"
            self.error(f"overrides take no dashes: write {m['key']}={value}")


CONFIG_REFERENCE = "docs/config.md"


def common_parser(description: str, epilog: str = "", prog: str | None = None) -> ArgumentParser:
    """The arguments every job takes. ``prog`` is how the user ran it (``elastic-train train`` or
    ``python -m jobs.train``), so ``--help`` never says ``train.py``."""
    epilog = (epilog.rstrip() + "\n\n" if epilog else "") + (
        f"Every config key, its default and meaning: {CONFIG_REFERENCE} (or --print-config for this run's)."
    )
    p = ArgumentParser(prog=prog, description=description, epilog=epilog,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", metavar="FILE", help="YAML config (defaults < FILE < overrides)")
    p.add_argument("overrides", nargs="*", metavar="section.key=value",
                   help=f"dotted overrides, values parsed as YAML (keys: {CONFIG_REFERENCE})")
    p.add_argument("--address", help="Ray cluster address (default: $RAY_ADDRESS, a local head, or embedded)")
    p.add_argument("--print-config", action="store_true",
                   help="print the resolved, validated config as YAML and exit (starts nothing: no Ray, no MLflow)")
    return p


def add_model_source(parser: argparse.ArgumentParser) -> None:
    """``--checkpoint PATH | --model URI`` (exactly one): where jobs.evaluate and jobs.generate load a model from."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", metavar="PATH", help="a checkpoint folder, or a run folder (its latest)")
    source.add_argument("--model", metavar="URI", help="an MLflow model: models:/NAME/VERSION or runs:/RUN_ID/model")


def print_config(cfg: Any) -> int:
    """The resolved config as YAML on stdout (feed it back with ``--config``); exit 0."""
    import yaml

    print(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False), end="")
    return EXIT_OK


def guarded(body: Callable[[], int]) -> int:
    """Run ``body``; a ConfigError is one line on stderr and exit 2; SIGTERM/Ctrl-C is exit 130. Before it, Ray's
    public console filter is exported (read once, when the job first imports Ray: launch/quiet.py)."""
    from elastic_train.launch.quiet import export_skip_regex

    export_skip_regex()
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main_thread else None
    if main_thread:  # `ray job stop` sends SIGTERM: end the MLflow run as KILLED, not as a crash
        signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        return body()
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_KILLED
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


def exit_now(code: int) -> None:
    """End the program with ``code`` once everything is written: stdio and logs flushed, then ``os._exit``.

    A finished job has closed its tracking, stopped or left Ray and written its summary; what remains is the
    interpreter's finalization (torch's, Ray's and MLflow's modules torn down), a second or more on a small
    machine during which the prompt would not come back. Only for a job that is the program, never in-process.
    """
    import logging
    import os

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed pipe: nothing more to say
            pass
    logging.shutdown()
    os._exit(code)


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def write_json(path: str | None, data: dict[str, Any]) -> None:
    if not path:
        return
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomically(p, data, indent=2)  # a reader polling for it never sees half of it
