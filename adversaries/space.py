"""Parameter spaces of adversary patterns, and their unit-cube encoding.

A :class:`Space` is a tuple of :class:`Param` (name, range, integer or real,
linear or log scale, default).  Searches work on points of the unit cube
[0, 1]^d; :meth:`Space.decode` maps a point to concrete parameters (clamped,
rounded for integers) and :meth:`Space.encode` maps parameters back.  Parameter
sets are plain dicts ``{name: value}``; :func:`freeze` makes them hashable and
picklable in a fixed order.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import attrs
import numpy as np

from tenantry.model.config import ConfigError


@attrs.frozen
class Param:
    """One numeric parameter.

    Attributes:
        name: parameter name (units in the name: ``_s``, ``_tokens``, ``_per_s``).
        low, high: inclusive range (low < high; both > 0 when ``log``).
        default: the value used when the pattern runs with no search.
        integer: round to an integer.
        log: uniform on a log scale (for rates and sizes spanning decades).
    """

    name: str
    low: float
    high: float
    default: float
    integer: bool = False
    log: bool = False

    def __attrs_post_init__(self) -> None:
        if not self.low < self.high or (self.log and self.low <= 0):
            raise ConfigError(self.name, (self.low, self.high), "need low < high (and low > 0 on a log scale)")
        if not self.low <= self.default <= self.high:
            raise ConfigError(self.name, self.default, f"default outside [{self.low}, {self.high}]")

    def decode(self, u: float) -> float | int:
        """The value at unit coordinate ``u`` (clamped to [0, 1])."""
        u = min(1.0, max(0.0, float(u)))
        if self.log:
            v = math.exp(math.log(self.low) + u * (math.log(self.high) - math.log(self.low)))
        else:
            v = self.low + u * (self.high - self.low)
        return self.clamp(v)

    def encode(self, v: float) -> float:
        """The unit coordinate of value ``v``."""
        v = min(self.high, max(self.low, float(v)))
        if self.log:
            return (math.log(v) - math.log(self.low)) / (math.log(self.high) - math.log(self.low))
        return (v - self.low) / (self.high - self.low)

    def clamp(self, v: float) -> float | int:
        """``v`` clamped to the range (rounded for integers); reals rounded to 6 significant digits
        so that written parameter files are short and exact."""
        v = min(self.high, max(self.low, float(v)))
        if self.integer:
            return int(round(v))
        return float(f"{v:.6g}")


@attrs.frozen
class Space:
    """An ordered tuple of parameters."""

    params: tuple[Param, ...] = attrs.field(converter=tuple)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def __len__(self) -> int:
        return len(self.params)

    def defaults(self) -> dict[str, float | int]:
        """Every parameter at its default."""
        return {p.name: p.clamp(p.default) for p in self.params}

    def decode(self, u: Sequence[float]) -> dict[str, float | int]:
        """Parameters at unit point ``u`` (length d)."""
        if len(u) != len(self.params):
            raise ConfigError("point", list(u), f"needs {len(self.params)} coordinates")
        return {p.name: p.decode(x) for p, x in zip(self.params, u)}

    def encode(self, params: Mapping[str, Any]) -> np.ndarray:
        """Unit point of ``params`` (missing names at their default)."""
        return np.array([p.encode(params.get(p.name, p.default)) for p in self.params], dtype=float)

    def complete(self, params: Mapping[str, Any] | None) -> dict[str, float | int]:
        """``params`` with missing names at their default and every value clamped.

        Raises:
            ConfigError: on a name the space does not have.
        """
        params = dict(params or {})
        for k in params:
            if k not in self.names:
                raise ConfigError("param", k, f"unknown parameter; this pattern has {', '.join(self.names)}")
        return {p.name: p.clamp(params.get(p.name, p.default)) for p in self.params}

    def sample(self, rng: np.random.Generator) -> dict[str, float | int]:
        """Parameters at a uniform random point of the unit cube."""
        return self.decode(rng.random(len(self.params)))


def freeze(params: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """``params`` as a sorted tuple of (name, value) pairs: hashable, picklable, ordered."""
    return tuple(sorted(params.items()))
