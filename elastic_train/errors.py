"""The one exception for bad input, with no dependencies (engine modules import it without pydantic).

:mod:`elastic_train.config` re-exports it; ``jobs._cli.guarded`` turns it into one line and exit code 2.
"""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A configuration mistake: which field, which value, and why."""

    def __init__(self, field: str, value: Any, reason: str):
        self.field, self.value, self.reason = field, value, reason
        super().__init__(f"{field}={value!r}: {reason}" if field else reason)
