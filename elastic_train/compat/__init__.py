"""Every private or internal Ray, MLflow and torch name this code relies on, in one package (DESIGN invariant 13).

One module per upstream: :mod:`.ray_core`, :mod:`.ray_train`, :mod:`.ray_tune`, :mod:`.mlflow`, :mod:`.torch`.
Each holds the private imports and attribute accesses themselves; the modules that need them import them from
here. :mod:`.registry` lists every entry (these, the overrides of private methods that live with their feature,
the environment knobs, logger names, niceness changes, process-wide environment defaults and exit tricks) with
what it is for, the upstream issue or reason, and the version it was checked on; ``tests/unit/test_compat.py``
(``make test-fast``) fails when one of them is gone or has another signature, so an upgrade fails loudly.

Outside this package no module may import ``ray.*._internal``, ``ray._private``, ``ray._raylet`` or
``mlflow.*._*``: ``make lint`` checks it (``pyproject.toml``, the ``private_imports`` contract).

This ``__init__`` imports nothing, so that :mod:`.torch` stays importable where Ray may not be imported.
"""
