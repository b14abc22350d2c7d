"""Reading a job configuration: YAML files, dotted overrides and a stored run's config, layered and validated.

Precedence, lowest to highest::

    built-in defaults  <  stored run (--resume)  <  --config FILE.yaml  <  dotted overrides  section.key=value

Override values are parsed as YAML, so ``scaling.num_workers=[1,4]``, ``model.hidden_sizes=[256,256]``
and ``train.compile=true`` mean what they look like; ``1e-3`` is a number there and in files (:func:`load_yaml`,
unlike plain YAML 1.1, which wants ``1.0e-3``). Every mistake surfaces as one
:class:`ConfigError` that names the dotted field and the bad value. The schema is :mod:`elastic_train.config.schema`.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from elastic_train.config.schema import JobConfig, Section
from elastic_train.errors import ConfigError


class NumberLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that reads ``1e-3`` and ``3E4`` as floats (YAML 1.2, JSON and Python do; PyYAML's
    YAML 1.1 resolver wants a dot, ``1.0e-3``, and would leave ``1e-3`` a string)."""


NumberLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def load_yaml(text: str) -> Any:
    """Parse YAML text the way every config input is parsed (files, overrides, sweep spaces): safe, and
    ``1e-3`` is a number. Raises ``yaml.YAMLError``."""
    return yaml.load(text, Loader=NumberLoader)  # a SafeLoader subclass


def parse_overrides(overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``["train.lr=0.1", "scaling.num_workers=[1,4]"]`` -> ``{"train.lr": 0.1, ...}`` (values parsed as YAML)."""
    parsed: dict[str, Any] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError("override", item, "expected section.key=value")
        if not re.match(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w.]*)?$", key):
            raise ConfigError("override", item, "the key must be dotted names like train.lr")
        try:
            parsed[key] = load_yaml(raw) if raw.strip() else None
        except yaml.YAMLError as e:
            raise ConfigError(key, raw, f"value is not valid YAML ({_yaml_problem(e)})") from None
    return parsed


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a config file; a missing, unreadable or non-mapping file is a ConfigError."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError("--config", str(path), "is a folder; name a YAML file in it, e.g. configs/digits.yaml")
    if not p.is_file():
        raise ConfigError("--config", str(path), "file not found")
    try:
        data = load_yaml(p.read_text())
    except yaml.YAMLError as e:
        raise ConfigError("--config", str(path), f"cannot parse YAML ({_yaml_problem(e)})") from None
    except (UnicodeDecodeError, OSError) as e:
        raise ConfigError("--config", str(path), f"cannot read it ({_first_line(e)})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("--config", str(path), f"top level must be a mapping, got {type(data).__name__}")
    return data


def layer(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (),
          stored: dict[str, Any] | None = None) -> JobConfig:
    """The one layering of a config: built-in defaults < ``stored`` run < YAML ``path`` < dotted ``overrides``.

    ``stored`` is a run's saved config (``--resume``, ``jobs.evaluate``); the file and the overrides are each
    read and parsed once. Overrides are checked on their own first, so a typo names the override, not the
    stored run.
    """
    return compose(read_yaml(path) if path else {}, parse_overrides(overrides), stored)


def compose(file_tree: dict[str, Any], overrides: dict[str, Any], stored: dict[str, Any] | None = None) -> JobConfig:
    """:func:`layer` on an already-read file and already-parsed overrides (callers that layer twice read once)."""
    tree = deep_merge(stored or {}, file_tree)
    for key, value in overrides.items():
        set_dotted(tree, key, value)
    return validate(tree)


def load(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> JobConfig:
    """Defaults < YAML file < dotted overrides, validated into a JobConfig (:func:`layer` without a stored run)."""
    return layer(path, overrides)


def deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """``top`` over ``base``, section by section (a new dict; neither input changes)."""
    out = dict(base)
    for k, v in top.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


# What a resumed run may not change: the checkpoint would not load, or the data position would mean other samples.
FROZEN_ON_RESUME = ("seed", "model.", "data.name", "data.path", "data.num_samples", "data.num_features",
                    "data.num_classes", "data.val_fraction", "data.options", "train.global_batch_size",
                    "scaling.strategy")


def refuse_incompatible_resume(stored: dict[str, Any] | None, cfg: JobConfig) -> None:
    """ConfigError naming the first setting that differs from the run being resumed, if it must not."""
    if not stored:
        return
    before = flatten(validate(stored))
    for key, value in flatten(cfg).items():
        if key.startswith(FROZEN_ON_RESUME) and before.get(key) != value:
            raise ConfigError(key, value, f"differs from the run being resumed ({before.get(key)!r}); "
                                          "start a new run (another name) to change it")


def validate(tree: dict[str, Any]) -> JobConfig:
    """Validate a nested dict into a JobConfig, turning pydantic's report into one ConfigError."""
    try:
        return JobConfig.model_validate(tree)
    except ValidationError as e:
        raise _to_config_error(e, tree) from None


def with_overrides(cfg: JobConfig, overrides: dict[str, Any]) -> JobConfig:
    """A copy of ``cfg`` with dotted keys replaced (used for sweep trials)."""
    tree = cfg.model_dump(mode="python")
    for key, value in overrides.items():
        set_dotted(tree, key, value)
    return validate(tree)


def flatten(cfg: JobConfig) -> dict[str, Any]:
    """``section.key`` -> value for every field (MLflow params, summaries)."""
    out: dict[str, Any] = {}
    for key, value in cfg.model_dump(mode="json").items():
        if isinstance(value, dict):
            out.update({f"{key}.{sub}": v for sub, v in value.items()})
        else:
            out[key] = value
    return out


def leaf_keys() -> set[str]:
    """Every dotted key a config accepts (for validating sweep spaces)."""
    keys: set[str] = set()
    for name, field in JobConfig.model_fields.items():
        sub = field.annotation
        if isinstance(sub, type) and issubclass(sub, Section):
            keys.update(f"{name}.{k}" for k in sub.model_fields)
        else:
            keys.add(name)
    return keys


def set_dotted(tree: dict[str, Any], key: str, value: Any) -> None:
    parts = _space_key_parts(key.split("."))
    node = tree
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(".".join(parts[: i + 1]), child, f"is not a section, cannot set {key}")
        node = child
    node[parts[-1]] = value


def _space_key_parts(parts: list[str]) -> list[str]:
    """``sweep.space.train.lr.low`` -> ``[sweep, space, train.lr, low]``: a space's keys are dotted config keys
    (one part for top-level fields such as ``seed``, else ``section.key``)."""
    if parts[:2] != ["sweep", "space"] or len(parts) < 3:
        return parts
    field = JobConfig.model_fields.get(parts[2])
    top_level = field is not None and not (isinstance(field.annotation, type) and issubclass(field.annotation, Section))
    n = 1 if top_level else 2
    return [*parts[:2], ".".join(parts[2 : 2 + n]), *parts[2 + n :]]


def _to_config_error(e: ValidationError, tree: dict[str, Any]) -> ConfigError:
    err = e.errors()[0]
    loc = [str(p) for p in err["loc"] if not str(p).startswith(("function-", "tuple[", "list["))]
    # Union members show up as extra loc parts ("int", "tuple[int, int]", "literal['auto']"); drop them.
    loc = [p for p in loc if not re.match(r"^(int|float|str|bool|literal\[.*\]|dict\[.*\]|none)$", p)]
    field = ".".join(loc)
    ctx_err = (err.get("ctx") or {}).get("error")
    if isinstance(ctx_err, ConfigError):
        return ctx_err
    value = _lookup(tree, loc)
    parent = _lookup(tree, loc[:-1]) if len(loc) > 1 else None
    if loc and loc[-1].isdigit() and not isinstance(parent, list | tuple | dict | type(None)):
        # A one-item shorthand (`tracking.log_checkpoints=bestt`) fails as item 0 of the list it became: name
        # the field and the value as written.
        loc, value = loc[:-1], parent
        field = ".".join(loc)
    if err["type"] == "extra_forbidden":
        section = _section_model(loc[:-1])
        known = sorted(section.model_fields) if section else []
        hint = _suggest_key(loc[:-1], loc[-1], known)
        where = ".".join(loc[:-1]) or "top level"
        reason = f"unknown key in {where}" + (
            f"; did you mean {hint!r}?" if hint else f"; known: {', '.join(known)}"
        )
        return ConfigError(field, value, reason)
    reason = err["msg"].removeprefix("Value error, ")
    more = len(e.errors()) - 1
    return ConfigError(field, value, reason + (f" (and {more} more problem{'s' * (more > 1)})" if more else ""))


def _suggest_key(section: list[str], key: str, known: list[str]) -> str | None:
    """The key meant by ``key``: the same key in another case (``LR`` -> ``lr``), a close spelling in this
    section, else the same key in another section (``lr`` at the top level -> ``train.lr``; ``train.num_workers``
    -> ``scaling.num_workers``), shown dotted from the top when it lives elsewhere."""
    lower = {k.lower(): k for k in known}
    if key.lower() in lower:
        return lower[key.lower()]
    close = difflib.get_close_matches(key.lower(), list(lower), n=1)
    if close and section:  # top-level keys are few: a section key that fits exactly is the better guess
        return lower[close[0]]
    if len(section) > 1:  # inside a sweep space or an options dict: no other sections to look in
        return None
    elsewhere = {f"{name}.{k}".lower(): f"{name}.{k}" for name, sub in _sections().items() for k in sub.model_fields
                 if name not in section}
    exact = [dotted for low, dotted in elsewhere.items() if low.split(".", 1)[1] == key.lower()]
    if exact:
        return exact[0]
    if close:
        return lower[close[0]]
    near = difflib.get_close_matches(key.lower(), [low.split(".", 1)[1] for low in elsewhere], n=1)
    return next((dotted for low, dotted in elsewhere.items() if near and low.split(".", 1)[1] == near[0]), None)


def _sections() -> dict[str, type[Section]]:
    return {name: f.annotation for name, f in JobConfig.model_fields.items()
            if isinstance(f.annotation, type) and issubclass(f.annotation, Section)}


def _yaml_problem(e: yaml.YAMLError) -> str:
    """A YAML error with where it is: ``line 3, column 7: found character '\\t' that cannot start any token``."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or _first_line(e)
    if mark is None:
        return problem
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"


def _lookup(tree: Any, loc: list[str]) -> Any:
    node = tree
    for part in loc:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list | tuple) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _section_model(loc: list[str]) -> type[Section] | None:
    model: type[Section] = JobConfig
    for part in loc:
        field = model.model_fields.get(part)
        if field is None or not (isinstance(field.annotation, type) and issubclass(field.annotation, Section)):
            return None
        model = field.annotation
    return model


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
