"""A fleet's configuration and its routers (SPEC.md 2.7 and 5.3).

A fleet is N replicas of the one-replica model behind a router.  Router
policies (:data:`ROUTERS`) are small pure functions with one signature,
``route(view: RouteView) -> replica index``, like the order policies of
:mod:`tenantry.model.policies`: a router sees each replica's outstanding
requests, KV use and cached prefix blocks (:class:`RouteView`) and picks one.
Accounting is per replica (each replica its own VTC counters) or fleet-level
(one set of counters that every replica reads at the start of each fleet
step).  What runs a fleet in lockstep is :mod:`tenantry.runner.fleet`.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any, Callable

import attrs

from .config import Config, ConfigError, config_to_dict
from .state import State, prefix_keys
from .workload import Request

#: Accounting modes (SPEC.md 5.3): ``replica``: every replica keeps its own counters;
#: ``fleet``: one set of VTC counters shared by the router and every replica.
ACCOUNTING = ("replica", "fleet")
#: Most replicas a fleet may have: far beyond a lockstep simulation's reach on one machine,
#: and a typo (``--replicas 1000000``) is refused before a million replicas are built.
MAX_REPLICAS = 1024


def _subsets(d: Any) -> dict[str, tuple[Any, ...]]:
    """``tenant_replicas`` as tenant -> tuple (checked in :class:`FleetConfig`).

    Raises:
        ConfigError: when it is not a table of tenant -> list of replica numbers.
    """
    if not isinstance(d, dict):
        raise ConfigError("tenant_replicas", d, "give a table of tenant = [replica numbers]")
    out = {}
    for k, v in d.items():
        if not isinstance(v, (list, tuple)):
            raise ConfigError("tenant_replicas", f"{k} = {v!r}", "give a list of replica numbers")
        out[str(k)] = tuple(v)
    return out


@attrs.frozen
class FleetConfig:
    """A fleet: its replicas, its router and its accounting.

    Attributes:
        replicas: one :class:`Config` per replica (at least one); every replica has
            the same tenants (names, weights and tiers in the same order), pools and
            batch limits may differ.
        router: a key of :data:`ROUTERS`.
        accounting: ``replica`` or ``fleet`` (:data:`ACCOUNTING`); ``fleet`` needs order
            policy ``vtc`` on every replica (the shared counters are VTC counters).
        load_factor: c of the load bound of ``prefix_affinity``, >= 1: a request goes
            only to a replica whose outstanding requests, itself included, stay within
            ``ceil(c * (m + 1) / R)``, m the fleet's outstanding requests before it
            (Mirrokni, Thorup and Zadimoghaddam, "Consistent Hashing with Bounded
            Loads", SODA 2018).
        affinity_replicas: size of each tenant's subset under ``tenant_affinity``
            (1..R); None: ``ceil(R / 2)``.
        tenant_replicas: explicit subsets for ``tenant_affinity``: tenant name ->
            replica indices (non-empty); tenants not named get the hashed subset.

    Raises:
        ConfigError: naming the field and the value.
    """

    replicas: tuple[Config, ...] = attrs.field(converter=tuple)
    router: str = "round_robin"
    accounting: str = "replica"
    load_factor: float = 1.25
    affinity_replicas: int | None = None
    tenant_replicas: dict[str, tuple[int, ...]] = attrs.field(factory=dict, converter=lambda d: _subsets(d))

    def __attrs_post_init__(self) -> None:
        if not self.replicas:
            raise ConfigError("replicas", 0, "a fleet needs at least one replica")
        if len(self.replicas) > MAX_REPLICAS:
            raise ConfigError("replicas", len(self.replicas), f"at most {MAX_REPLICAS} replicas")
        if self.router not in ROUTERS:
            raise ConfigError("router", self.router, f"unknown router; choose from {', '.join(ROUTERS)}")
        if self.accounting not in ACCOUNTING:
            raise ConfigError("accounting", self.accounting, f"choose one of {', '.join(ACCOUNTING)}")
        if isinstance(self.load_factor, bool) or not isinstance(self.load_factor, (int, float)) \
                or not math.isfinite(self.load_factor) or self.load_factor < 1:
            raise ConfigError("load_factor", self.load_factor, "must be a number >= 1")
        n = len(self.replicas)
        a = self.affinity_replicas
        if a is not None and (isinstance(a, bool) or not isinstance(a, int) or not 1 <= a <= n):
            raise ConfigError("affinity_replicas", a, f"must be an integer from 1 to the number of replicas ({n})")
        names = {t.name for t in self.replicas[0].tenants}
        for tenant, reps in self.tenant_replicas.items():
            if tenant not in names:
                raise ConfigError("tenant_replicas", tenant, "names a tenant the replicas do not have; they have "
                                  + ", ".join(t.name for t in self.replicas[0].tenants))
            if not reps or not all(isinstance(r, int) and not isinstance(r, bool) and 0 <= r < n for r in reps):
                raise ConfigError("tenant_replicas", f"{tenant} = {list(reps)}",
                                  f"give a non-empty list of replica numbers 0..{n - 1}")
        key = lambda c: tuple((t.name, t.weight, t.tier) for t in c.tenants)
        for r, c in enumerate(self.replicas[1:], 1):
            if key(c) != key(self.replicas[0]):
                raise ConfigError("replicas", r, "every replica must have the same tenants (names, weights, tiers) "
                                  "as replica 0")
        if self.accounting == "fleet":
            for r, c in enumerate(self.replicas):
                if c.order.policy != "vtc":
                    raise ConfigError("accounting", "fleet", f"fleet-level accounting shares VTC counters: replica {r} "
                                      f"runs order policy {c.order.policy!r}, not 'vtc'")

    @property
    def lift(self) -> bool:
        """Under fleet accounting, the fleet applies the counter lift (replica 0's ``order.lift``)."""
        return self.accounting == "fleet" and self.replicas[0].order.lift

    @property
    def run_configs(self) -> tuple[Config, ...]:
        """The replica configurations as they run: under fleet accounting the lift is the
        fleet's (SPEC.md 5.3), so every replica runs with ``order.lift`` off."""
        if self.accounting != "fleet":
            return self.replicas
        return tuple(attrs.evolve(c, order=attrs.evolve(c.order, lift=False)) for c in self.replicas)

    def subset(self, tenant: str) -> tuple[int, ...]:
        """The replicas ``tenant_affinity`` pins ``tenant`` to: ``affinity_replicas``
        consecutive replicas (cyclically) from one picked by a BLAKE2b hash of the name,
        or its :attr:`tenant_replicas` entry."""
        if tenant in self.tenant_replicas:
            return tuple(sorted(set(self.tenant_replicas[tenant])))
        n = len(self.replicas)
        k = self.affinity_replicas or -(-n // 2)
        start = int.from_bytes(hashlib.blake2b(tenant.encode("utf-8"), digest_size=8).digest(), "big") % n
        return tuple(sorted((start + j) % n for j in range(k)))

    def to_dict(self) -> dict[str, Any]:
        """The fleet as plain data (a fleet history's ``header.fleet``), replicas as they run."""
        return {"router": self.router, "accounting": self.accounting, "load_factor": self.load_factor,
                "affinity_replicas": self.affinity_replicas,
                "tenant_replicas": {k: list(v) for k, v in sorted(self.tenant_replicas.items())}, "lift": self.lift,
                "replicas": [config_to_dict(c) for c in self.run_configs]}


def load_bound(load_factor: float, outstanding_total: int, replicas: int) -> int:
    """Most outstanding requests a replica may hold after receiving one more under a
    load-bounded router: ``ceil(c * (m + 1) / R)`` (ROUTE-LOAD-BOUND, SPEC.md 7.9).
    For c >= 1 the least-loaded replica is always within it."""
    return math.ceil(load_factor * (outstanding_total + 1) / replicas - 1e-9)


@attrs.frozen
class RouteView:
    """What a router policy may look at for one request (all tuples per replica).

    Attributes:
        request: the arriving request; tenant: its tenant's name.
        outstanding: requests routed to each replica and not ended (queued, running, or
            routed earlier in this fleet step), before this one.
        used_blocks, num_blocks: KV blocks in use and in the pool.
        cached_blocks: leading prompt blocks of this request present in each
            replica's prefix cache (0 with the cache off).
        rr_next: round robin's next replica.
        bound: :func:`load_bound` for this request.
        subset: the replicas ``tenant_affinity`` pins its tenant to.
    """

    request: Request
    tenant: str
    outstanding: tuple[int, ...]
    used_blocks: tuple[int, ...]
    num_blocks: tuple[int, ...]
    cached_blocks: tuple[int, ...]
    rr_next: int
    bound: int
    subset: tuple[int, ...]


def route_round_robin(view: RouteView) -> int:
    """The next replica in turn, whatever its load."""
    return view.rr_next % len(view.outstanding)


def route_least_outstanding(view: RouteView) -> int:
    """The replica with the fewest outstanding requests (ties: lowest index)."""
    return min(range(len(view.outstanding)), key=lambda r: (view.outstanding[r], r))


def route_least_kv(view: RouteView) -> int:
    """The replica with the smallest share of its KV pool in use (then fewest outstanding, lowest index)."""
    return min(range(len(view.outstanding)),
               key=lambda r: (view.used_blocks[r] / view.num_blocks[r], view.outstanding[r], r))


def route_prefix_affinity(view: RouteView) -> int:
    """Among the replicas within the load bound (``outstanding + 1 <= bound``), the one
    holding the longest cached prefix of the request (then fewest outstanding, lowest
    index): prefix-cache locality that cannot pile onto one replica."""
    ok = [r for r in range(len(view.outstanding)) if view.outstanding[r] + 1 <= view.bound]
    return min(ok, key=lambda r: (-view.cached_blocks[r], view.outstanding[r], r))


def route_tenant_affinity(view: RouteView) -> int:
    """The least-outstanding replica of the tenant's subset (:meth:`FleetConfig.subset`)."""
    return min(view.subset, key=lambda r: (view.outstanding[r], r))


#: Router policies by name: ``route(view) -> replica index``.
ROUTERS: dict[str, Callable[[RouteView], int]] = {
    "round_robin": route_round_robin,
    "least_outstanding": route_least_outstanding,
    "least_kv": route_least_kv,
    "prefix_affinity": route_prefix_affinity,
    "tenant_affinity": route_tenant_affinity,
}
#: Routers that keep ROUTE-LOAD-BOUND.
LOAD_BOUNDED = ("prefix_affinity",)


def outstanding(state: State) -> int:
    """Requests a replica holds: running plus queued."""
    return len(state.running) + sum(len(t.queue) for t in state.tenants)


def cached_blocks(config: Config, state: State, request: Request) -> int:
    """Leading prompt blocks of ``request`` present (referenced or retained) in the
    replica's prefix cache, under the request's tenant's salt (SPEC.md 4.6)."""
    if config.prefix_cache == "off" or not request.prefix_ids:
        return 0
    tenant = next(t for t in config.tenants if t.name == request.tenant)
    salt = tenant.salt if config.prefix_cache == "salted" else None
    refs, retained = state.kv.refs, state.kv.retained
    n = 0
    for key in prefix_keys(config, request, salt):
        if key not in refs and key not in retained:
            break
        n += 1
    return n
