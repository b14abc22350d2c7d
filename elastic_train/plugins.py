"""User plug-ins named ``'package.module:function'`` (datasets, models): resolved with a ConfigError on failure."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from elastic_train.errors import ConfigError


def resolve_import(path: str, field_name: str) -> Callable[..., Any]:
    """``'package.module:function'`` -> the function; a ConfigError naming ``field_name`` otherwise."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(field_name, path, "unknown name; use a built-in or 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # any import failure is the user's path being wrong
        raise ConfigError(field_name, path, f"cannot import {module_name!r} ({type(e).__name__}: {e})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(field_name, path, f"{module_name!r} has no callable {attr!r}")
    return fn
