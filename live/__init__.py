"""The HTTP room: tenantry's workloads against a running OpenAI-compatible server.

:mod:`.wire` is the one mapping between a :class:`~tenantry.model.workload.Request` and a
``/v1/completions`` streaming request (body and headers), used by both ends; :mod:`.client`
replays a workload against a URL and records what it saw (:mod:`.record`, a live history,
SPEC.md 6 and 12); :mod:`.engine` and :mod:`.server` put the reference model behind the same
API in scaled real time (``tenantry serve``).  The HTTP libraries are the optional extra
``tenantry[live]``: importing :mod:`.client` or :mod:`.server` without them raises
:class:`MissingExtra`.
"""

from __future__ import annotations

#: The one line a command prints when the HTTP libraries are missing.
INSTALL_HINT = "the HTTP libraries are not installed: pip install 'tenantry[live]'"


class MissingExtra(ImportError):
    """httpx, httpx-sse or uvicorn is missing (``pip install 'tenantry[live]'``)."""


def require_extra() -> None:
    """Raise :class:`MissingExtra` (its message: :data:`INSTALL_HINT`) unless every HTTP library
    of the ``live`` extra can be imported."""
    import importlib.util

    for name in ("httpx", "httpx_sse", "uvicorn"):
        if importlib.util.find_spec(name) is None:
            raise MissingExtra(f"{INSTALL_HINT} ({name} is missing)")
