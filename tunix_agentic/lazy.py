"""Names a package exports but imports only on first use (PEP 562 ``__getattr__``), so
importing the package stays cheap and host-side code never loads JAX by accident."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``(__getattr__, __dir__)`` pair of ``package``: ``exports`` maps each name to
    the module defining it; a name, once looked up, is kept in ``namespace`` (the
    package's ``globals()``) so later lookups skip the hook."""

    def getattr_(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted({*namespace, *exports, *namespace.get("__all__", ())})

    return getattr_, dir_
