"""The docs cannot drift from the code: every command in the README's code blocks parses and names a config
that validates, every `make` target it shows exists, every link to a file resolves, and docs/config.md is what
the config models generate. In-process only (the jobs' own parsers and config loading): a few seconds."""

from __future__ import annotations

import importlib
import re
import shlex
from pathlib import Path

import pytest

from elastic_train import config_reference
from elastic_train.config import load
from jobs import cli
from tests.conftest import ROOT

README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
SHELL_ENDS = {"&&", "||", ";", "|", "&", ">", ">>", "2>&1"}


def code_blocks(path: Path) -> list[str]:
    return re.findall(r"```(?:bash|sh|shell)?\n(.*?)```", path.read_text(), re.S)


def command_lines(path: Path) -> list[str]:
    """Shell lines of the bash blocks, continuations joined."""
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", path.read_text(), re.S):
        lines += [line for line in block.replace("\\\n", " ").splitlines() if line.strip()]
    return lines


def job_invocations(path: Path) -> list[tuple[str, list[str]]]:
    """``(module, argv)`` for every ``python -m jobs.X ...`` and ``elastic-train X ...`` in the bash blocks."""
    found = []
    for line in command_lines(path):
        words = shlex.split(line, comments=True)
        for i, word in enumerate(words):
            if word == "-m" and i + 1 < len(words) and words[i + 1].startswith("jobs."):
                module, rest = words[i + 1], words[i + 2:]
            elif Path(word).name == "elastic-train" and i + 1 < len(words) and not words[i + 1].startswith("-"):
                module, rest = cli.COMMANDS.get(words[i + 1], f"unknown command {words[i + 1]}"), words[i + 2:]
            else:
                continue
            end = next((j for j, w in enumerate(rest) if w in SHELL_ENDS), len(rest))
            found.append((module, rest[:end]))
            break
    return found


README_JOBS = job_invocations(README)
DOC_JOBS = [job for path in DOCS for job in job_invocations(path)]


def test_the_readme_shows_every_command():
    modules = {m for m, _ in README_JOBS}
    assert set(cli.COMMANDS.values()) <= modules | {"jobs.mlflow_ui"}, modules
    assert len(README_JOBS) >= 15


@pytest.mark.parametrize("module, argv", README_JOBS + DOC_JOBS,
                         ids=[" ".join([m, *a])[:80] for m, a in README_JOBS + DOC_JOBS])
def test_every_readme_command_parses_and_its_config_validates(module, argv, monkeypatch):
    """The README's (and docs/') commands: the job's own parser accepts the line (an error exits 2), and the
    config it names validates."""
    monkeypatch.chdir(ROOT)
    assert module in cli.COMMANDS.values(), module
    job = importlib.import_module(module)
    argv = [a.replace("/app/", f"{ROOT}/") for a in argv]  # the image's copy of the repo is this one
    args = job.build_parser().parse_args(argv)
    if hasattr(args, "config") and getattr(args, "resume", None) is None:  # jobs without a config: parsing is the check
        cfg = load(args.config, args.overrides)
        if ":" in cfg.data.name or ":" in cfg.model.name:  # the worked plug-in example builds, as on the driver
            from elastic_train.launch.preflight import check_static

            bundle, n_params = check_static(cfg)
            assert len(bundle.train) > 0 and n_params > 0


def test_every_make_target_shown_exists():
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    shown = set()
    for path in [README, *DOCS]:
        for line in command_lines(path):
            shown.update(re.findall(r"(?:^|\s)make ([\w-]+)", line))
    assert shown and shown <= targets, shown - targets


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: p.name)
def test_links_to_files_resolve(path):
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text()):
        if "://" in target:
            continue
        assert (path.parent / target).exists(), f"{path.name}: {target}"


def test_anchors_in_the_table_of_contents_exist():
    text = README.read_text()
    headings = {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-")
                for h in re.findall(r"^#+ (.+)$", text, re.M)}
    for anchor in re.findall(r"\]\(#([\w-]+)\)", text):
        assert anchor in headings, anchor


def test_config_reference_is_up_to_date():
    assert (ROOT / "docs" / "config.md").read_text() == config_reference.render(), (
        "docs/config.md is stale: python -m elastic_train.config_reference > docs/config.md"
    )


def test_one_optuna_install_hint():
    from elastic_train.sweep import plan

    hint = "pip install 'elastic-train[optuna]'"
    assert hint in Path(plan.__file__).read_text()
    for path in [README, *DOCS, ROOT / "configs" / "sweep-digits.yaml"]:
        text = path.read_text()
        assert "'.[optuna]'" not in text, path.name
    assert hint in README.read_text()


def test_list_overrides_are_quoted_for_zsh():
    """`scaling.num_workers=[1,4]` unquoted stops zsh ("no matches found"): every shown one is quoted."""
    for path in [README, *DOCS]:
        for line in command_lines(path):
            for word in re.findall(r"(?:^|\s)([\w.]+=\[[^\s]*)", line):
                pytest.fail(f"{path.name}: unquoted {word!r} in: {line.strip()}")
