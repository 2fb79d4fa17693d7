"""The one vocabulary of setups, and the one place configurations are read and written.

A *setup* is a named policy configuration: an order policy with its
parameters, admission switches, per-tenant limits, hysteresis and a
prefix-cache mode.  The same names mean the same thing in ``tenantry
simulate --policy``, ``tenantry check --policy`` and the tests: a setup
applied to a replica (:func:`apply_setup`) sets the fields it names and
leaves the others as they are; :func:`build_config` applies it to the small
replica of the adversary search (:data:`REPLICA`), whose tenants have roles.

Tiers: in the tiered setups (``priority``, ``aging``, ``floors``) the
adversary's tenants are tier 0 (a paying or internal tenant) and the victims
tier 1, because that is the only arrangement in which a tier policy can hurt
anyone: an abusive tenant in the low tier only hurts itself.  Every other
setup puts all tenants in tier 0.  The three tiered setups share one bounded
per-tenant queue, so that they differ only in the order policy: with an
unbounded queue the higher tier's own backlog ages as fast as the lower
tier's, and aging degenerates into FCFS with an offset.

Fleet setups (``fleet_*``, SPEC.md 5.3) are setups with a :class:`FleetPart` (router,
accounting, replicas): :func:`build_config` gives one of their replicas (a quarter of
:data:`REPLICA`) and :func:`build_fleet` the whole fleet.

``claims`` lists the invariant ids (SPEC.md section 7) a setup is designed to
guarantee; ``tenantry check`` exits non-zero when one of them breaks.  Safety
invariants that every setup must keep (KV-CONSERVE, KV-CAP, NO-LOSS,
BATCH-LIMITS, DETERMINISM) are in :data:`COMMON_CLAIMS`.

Configuration files: :func:`load_config_toml` (a replica in TOML),
:func:`~tenantry.model.config.config_to_dict` / :func:`config_from_dict` (a history header's
``config``), :func:`config_with_tenants` (a claimed config completed with a
workload's tenants), :func:`default_config` (the default 70B replica).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Iterable, Mapping

import attrs

from tenantry.model.config import (
    AdmissionConfig, Config, ConfigError, CostConfig, EvictionConfig, OrderConfig, TenantConfig,
)

#: Roles a tenant can have in a scenario.
ROLES = ("adversary", "victim")

#: The small replica used for search: 8 sequences, 256-token steps, blocks of
#: 16 tokens, contexts up to 8,192 tokens.  Roofline constants of a slow
#: accelerator, so that a step lasts 25-35 ms and a 15-second run is a few
#: hundred steps: weights read once per step 25 ms, 1 us per context token of
#: KV, 120 us of compute per batched token, 2 ms host overhead (Williams et al.,
#: CACM 2009; the same formula as the model's default, smaller numbers).
REPLICA: dict[str, Any] = {
    "block_size_tokens": 16,
    "max_num_seqs": 8,
    "token_budget": 256,
    "max_context_tokens": 8192,
}
#: Pool of the order-policy setups: "ample KV" (8 sequences of the longest
#: context fit), the condition under which the spec's fairness bounds
#: (VTC-GAP, FLOOR, AGING) are claimed, so those claims are checked.
AMPLE_BLOCKS = 4096
#: Pool of the eviction setups: 512 blocks (8,192 tokens), where a few long
#: sequences fill it and preemption happens.
SMALL_BLOCKS = 512
COST = CostConfig(
    mode="roofline", weight_read_s=0.025, kv_read_s_per_token=1e-6, flop_s_per_token=1.2e-4, overhead_s=0.002,
)

#: Hysteresis of the setups that have it: evict only to free >= 4 blocks, keep
#: an evicted sequence out for 4 steps, reject a sequence chosen a 4th time.
HYSTERESIS = EvictionConfig(victim="most_over_share", min_free_blocks=4, cooldown_steps=4, max_evictions=3)
#: No hysteresis at all: the thrash-prone baseline (victim: newest).
NO_HYSTERESIS = EvictionConfig(victim="newest", min_free_blocks=0, cooldown_steps=0, max_evictions=None)

#: Invariants every setup claims (safety of the model itself).
COMMON_CLAIMS = ("KV-CONSERVE", "KV-CAP", "NO-LOSS", "BATCH-LIMITS", "DETERMINISM")

#: Request-rate limit of ``rate_limit``: 3 requests/s per tenant, burst 6
#: (the seed-001 baseline's shape, loose enough for the honest victims' bursts).
RATE_LIMIT = {"request_rate_per_s": 3.0, "request_burst": 6.0}
#: Token bucket of the protected setups: 3,000 tokens/s, burst 6,000 tokens per tenant.
TOKEN_BUCKET = {"token_rate_per_s": 3000.0, "token_burst_tokens": 6000.0}
#: Queue bound of the setups that bound queues (requests never scheduled).
QUEUE_BOUND = 24
#: Per-tenant KV cap of the protected setups: 40% of the small pool.
KV_CAP_BLOCKS = 204
#: Per-tenant batch-slot cap of ``protected_slots``: 2 of the replica's 8 sequences
#: (a tenant occupies at most a quarter of the batch, whatever its KV footprint).
SLOT_CAP_SEQS = 2
#: Starvation guard of ``protected_slots``: a head refused for 40 steps (about 1 s of the
#: replica's 25-35 ms steps) stops the filling until it fits.
GUARD_STEPS = 40
#: Skip budget of ``skip_budget``: a backlogged tenant whose head the pool refuses is passed
#: over at most 8 times in its backlog period while its counter is the lower; then the
#: waiting phase stops filling for it (SPEC.md 4.3), so VTC-GAP holds under KV pressure
#: with D/w + 8 D/w_min (SPEC.md 8.3).
GUARD_SKIPS = 8
#: Hysteresis of ``priority_preempt``: the lowest tier is evicted first, and preemption
#: for priority keeps the hysteresis (4 blocks freed at least, 4-step cooldown, 3 evictions).
PRIORITY_PREEMPTION = EvictionConfig(victim="lowest_priority", min_free_blocks=4, cooldown_steps=4, max_evictions=3,
                                     preempt_for_priority=True)


#: Replicas of the fleet setups.
FLEET_REPLICAS = 4
#: Each replica of a fleet setup: a quarter of :data:`REPLICA` (2 sequences, 64-token steps),
#: so the fleet of :data:`FLEET_REPLICAS` has the search replica's capacity and every
#: pattern's parameter space, calibrated on one replica, loads the fleet as much.  The pool
#: is ample KV for 2 sequences of the longest context (2 x 512 blocks).
FLEET_REPLICA: dict[str, Any] = {**REPLICA, "max_num_seqs": 2, "token_budget": 64}
FLEET_BLOCKS = 1024


@attrs.frozen
class FleetPart:
    """The fleet part of a setup (SPEC.md 5.3): how many replicas, the router and the accounting.

    Attributes:
        router: a key of :data:`tenantry.model.routers.ROUTERS`.
        accounting: ``replica`` or ``fleet``.
        replicas: number of replicas (each the setup's replica, :data:`FLEET_REPLICA`).
        load_factor: c of ``prefix_affinity``'s load bound (>= 1).
        affinity_replicas: the size of each tenant's subset under ``tenant_affinity`` (None: ceil(R / 2)).
    """

    router: str
    accounting: str = "replica"
    replicas: int = FLEET_REPLICAS
    load_factor: float = 1.25
    affinity_replicas: int | None = None


@attrs.frozen
class Setup:
    """One built-in policy configuration.

    Attributes:
        name: key in :data:`SETUPS`.
        summary: one line: what it is and what it should resist.
        order: order policy and its parameters.
        admission: which admission limits are enforced.
        eviction: victim policy and hysteresis.
        prefix_cache: ``off``, ``shared`` or ``salted``.
        tenant_limits: per-tenant limit fields (TenantConfig keyword arguments)
            given to every tenant.
        tiered: adversary tenants tier 0, victims tier 1 (else all tier 0).
        claims: invariant ids this setup is designed to keep (beyond
            :data:`COMMON_CLAIMS`).
        num_blocks: KV pool size (:data:`AMPLE_BLOCKS` or :data:`SMALL_BLOCKS`; a fleet
            setup's replicas: :data:`FLEET_BLOCKS`).
        fleet: a fleet setup's :class:`FleetPart` (None: one replica).  A fleet setup's
            replica is :data:`FLEET_REPLICA` with the setup's policies
            (:func:`build_config`); :func:`build_fleet` gives the whole fleet.  Its
            ``claims`` are per replica; the fleet invariants (SPEC.md 7.9) are claimed
            where they apply (:data:`tenantry.spec.invariants_fleet.FLEET_INVARIANTS`).
    """

    name: str
    summary: str
    order: OrderConfig = attrs.field(factory=OrderConfig)
    admission: AdmissionConfig = attrs.field(factory=lambda: AdmissionConfig(queue_bound=False, kv_cap=False))
    eviction: EvictionConfig = NO_HYSTERESIS
    prefix_cache: str = "off"
    tenant_limits: Mapping[str, Any] = attrs.field(factory=dict)
    tiered: bool = False
    claims: tuple[str, ...] = ()
    num_blocks: int = AMPLE_BLOCKS
    fleet: FleetPart | None = None

    @property
    def all_claims(self) -> tuple[str, ...]:
        """:data:`COMMON_CLAIMS` plus this setup's own claims."""
        return COMMON_CLAIMS + tuple(c for c in self.claims if c not in COMMON_CLAIMS)


def _setups() -> dict[str, Setup]:
    adm_off = AdmissionConfig(queue_bound=False, kv_cap=False)
    bounded = AdmissionConfig(queue_bound=True, kv_cap=False)
    bounded_limits = {"queue_bound": QUEUE_BOUND}
    protected_adm = AdmissionConfig(token_bucket=True, queue_bound=True, kv_cap=True)
    protected_limits = {"queue_bound": QUEUE_BOUND, "kv_block_cap": KV_CAP_BLOCKS, **TOKEN_BUCKET}
    protected_claims = ("VTC-GAP", "NO-BANKED-CREDIT", "TOKEN-BUCKET", "QUEUE-BOUND", "EVICT-MIN-FREE",
                        "EVICT-COOLDOWN", "EVICT-BOUNDED", "SALT-ISOLATION", "NONINTERFERENCE")
    rows = [
        Setup("fcfs", "first come, first served, no limits: the naive baseline (flood, stuffing)",
              order=OrderConfig(policy="fcfs"), admission=adm_off),
        Setup("round_robin", "request round robin: one request per tenant per turn, whatever its size",
              order=OrderConfig(policy="round_robin"), admission=adm_off),
        Setup("rate_limit", "FCFS behind a per-tenant request-rate limit (3 req/s, burst 6)",
              order=OrderConfig(policy="fcfs"), admission=AdmissionConfig(request_rate_limit=True, queue_bound=False, kv_cap=False),
              tenant_limits=RATE_LIMIT),
        Setup("vtc", "Virtual Token Counter with the counter lift (Sheng et al. 2024)",
              order=OrderConfig(policy="vtc", lift=True), admission=adm_off,
              claims=("VTC-GAP", "NO-BANKED-CREDIT")),
        Setup("vtc_nolift", "VTC without the counter lift: the banked-credit mutant",
              order=OrderConfig(policy="vtc", lift=False), admission=adm_off),
        Setup("vtc_predict", "VTC charging a predicted output length at admission, token buckets on a byte-length prompt estimate",
              order=OrderConfig(policy="vtc_predict", lift=True),
              admission=AdmissionConfig(token_bucket=True, prompt_estimate="bytes", queue_bound=False, kv_cap=False),
              tenant_limits=TOKEN_BUCKET),
        Setup("drr_block_seconds", "DRR over block-seconds, bounded carry, reset when idle (the essay's proposal)",
              order=OrderConfig(policy="drr_block_seconds", drr_quantum=2.0, drr_carry_bound=4.0), admission=adm_off,
              claims=("DRR-DEFICIT",)),
        Setup("drr_tokens", "DRR over weighted service tokens, bounded carry, reset when idle",
              order=OrderConfig(policy="drr_tokens", drr_quantum=512.0, drr_carry_bound=1024.0), admission=adm_off,
              claims=("DRR-DEFICIT",)),
        Setup("priority", "strict priority, adversary in the higher tier, bounded queues: starves the lower tier by design",
              order=OrderConfig(policy="priority"), admission=bounded, tenant_limits=bounded_limits, tiered=True,
              claims=("QUEUE-BOUND",)),
        Setup("aging", "priority with aging (1 tier per second of waiting), adversary in the higher tier, bounded queues",
              order=OrderConfig(policy="aging", aging_rate_per_s=1.0), admission=bounded,
              tenant_limits=bounded_limits, tiered=True, claims=("QUEUE-BOUND", "AGING")),
        Setup("floors", "weighted floors between tiers (60/40), adversary in the higher tier, bounded queues",
              order=OrderConfig(policy="floors", tier_floors=(0.6, 0.4)), admission=bounded,
              tenant_limits=bounded_limits, tiered=True, claims=("QUEUE-BOUND", "FLOOR")),
        Setup("no_hysteresis", "VTC on a small pool, eviction of the newest sequence with no hysteresis (thrash-prone)",
              order=OrderConfig(policy="vtc"), admission=adm_off, eviction=NO_HYSTERESIS,
              claims=("NO-BANKED-CREDIT", "VICTIM"), num_blocks=SMALL_BLOCKS),
        Setup("hysteresis", "VTC on a small pool, eviction with hysteresis (min 4 blocks freed, 4-step cooldown, reject after 3)",
              order=OrderConfig(policy="vtc"), admission=adm_off, eviction=HYSTERESIS,
              claims=("NO-BANKED-CREDIT", "EVICT-MIN-FREE", "EVICT-COOLDOWN", "EVICT-BOUNDED"),
              num_blocks=SMALL_BLOCKS),
        Setup("skip_budget", "'hysteresis' plus the starvation guard (40 steps) and a skip budget (8 picks past a "
              "refused lower counter): VTC fairness under KV pressure",
              order=OrderConfig(policy="vtc", guard_steps=GUARD_STEPS, guard_skips=GUARD_SKIPS), admission=adm_off,
              eviction=HYSTERESIS, num_blocks=SMALL_BLOCKS,
              claims=("VTC-GAP", "NO-BANKED-CREDIT", "GUARD", "EVICT-MIN-FREE", "EVICT-COOLDOWN", "EVICT-BOUNDED")),
        Setup("shared_cache", "VTC with a prefix cache shared by all tenants (timing side channel)",
              order=OrderConfig(policy="vtc"), admission=adm_off, prefix_cache="shared",
              claims=("VTC-GAP", "NO-BANKED-CREDIT")),
        Setup("salted_cache", "VTC with a prefix cache salted per tenant",
              order=OrderConfig(policy="vtc"), admission=adm_off, prefix_cache="salted",
              claims=("VTC-GAP", "NO-BANKED-CREDIT", "SALT-ISOLATION", "NONINTERFERENCE")),
        Setup("protected", "VTC with lift, token buckets, bounded queues, KV caps, hysteresis, salted cache",
              order=OrderConfig(policy="vtc", lift=True), admission=protected_adm, eviction=HYSTERESIS,
              prefix_cache="salted", tenant_limits=protected_limits, claims=protected_claims,
              num_blocks=SMALL_BLOCKS),
        Setup("protected_drr", "DRR over block-seconds with the same protections as 'protected'",
              order=OrderConfig(policy="drr_block_seconds", drr_quantum=2.0, drr_carry_bound=4.0),
              admission=protected_adm, eviction=HYSTERESIS, prefix_cache="salted", tenant_limits=protected_limits,
              claims=tuple(c for c in protected_claims if c not in ("VTC-GAP", "NO-BANKED-CREDIT")) + ("DRR-DEFICIT",),
              num_blocks=SMALL_BLOCKS),
        Setup("protected_slots", "'protected' plus a per-tenant cap of 2 batch slots, a token bucket that "
              "reserves each request's output at admission, and a starvation guard (40 steps)",
              order=OrderConfig(policy="vtc", lift=True, guard_steps=GUARD_STEPS),
              admission=attrs.evolve(protected_adm, reserve_output=True), eviction=HYSTERESIS,
              prefix_cache="salted", tenant_limits={**protected_limits, "max_running_seqs": SLOT_CAP_SEQS},
              claims=protected_claims + ("TOKEN-LIMIT", "GUARD"), num_blocks=SMALL_BLOCKS),
        Setup("priority_preempt", "strict priority with preemption for priority within a hysteresis, adversary in "
              "the higher tier, bounded queues: the higher tier takes running seats too",
              order=OrderConfig(policy="priority"), admission=bounded, eviction=PRIORITY_PREEMPTION,
              tenant_limits=bounded_limits, tiered=True,
              claims=("QUEUE-BOUND", "PRIORITY-PREEMPT", "EVICT-MIN-FREE", "EVICT-COOLDOWN", "EVICT-BOUNDED")),
    ]
    # Fleet setups (router x accounting): 4 quarter-size replicas, each VTC with the lift and a prefix
    # cache shared by all tenants (what prefix affinity routes by), ample KV.
    fleet_order = OrderConfig(policy="vtc", lift=True)
    fleet_claims = ("VTC-GAP", "NO-BANKED-CREDIT")
    for name, router, accounting, summary in (
        ("fleet_rr", "round_robin", "replica", "a fleet of 4 quarter-size VTC replicas behind round robin, "
         "per-replica counters"),
        ("fleet_least_kv", "least_kv", "replica", "the fleet behind the least-KV-in-use router, per-replica counters"),
        ("fleet_prefix_affinity", "prefix_affinity", "replica", "the fleet behind prefix affinity (longest cached "
         "prefix within the load bound c = 1.25), per-replica counters"),
        ("fleet_prefix_affinity_fleetacct", "prefix_affinity", "fleet", "prefix affinity with one set of VTC "
         "counters shared by the fleet"),
        ("fleet_tenant_affinity", "tenant_affinity", "replica", "each tenant pinned to a hashed half of the fleet, "
         "per-replica counters"),
        ("fleet_tenant_affinity_fleetacct", "tenant_affinity", "fleet", "tenant affinity with one set of VTC "
         "counters shared by the fleet"),
    ):
        rows.append(Setup(name, summary, order=fleet_order, admission=adm_off, prefix_cache="shared",
                          claims=fleet_claims, num_blocks=FLEET_BLOCKS, fleet=FleetPart(router, accounting)))
    return {s.name: s for s in rows}


#: The built-in setups by name, in the order the matrix prints them.
SETUPS: dict[str, Setup] = _setups()


def get_setup(name: str) -> Setup:
    """The setup called ``name``.

    Raises:
        ConfigError: naming the unknown setup and listing the known ones.
    """
    try:
        return SETUPS[name]
    except KeyError:
        raise ConfigError("--policy", name, f"unknown setup; choose from {', '.join(SETUPS)}") from None


def build_config(name: str, roles: Iterable[tuple[str, str]]) -> Config:
    """The :class:`Config` of setup ``name`` for tenants with the given roles.

    Args:
        name: a key of :data:`SETUPS`.
        roles: (tenant name, role) pairs in tenant order; role is one of :data:`ROLES`.

    Returns:
        The small :data:`REPLICA` (a fleet setup: one of its replicas,
        :data:`FLEET_REPLICA`) with the setup's policies, every tenant at
        weight 1 with the setup's per-tenant limits, tiers as described in the
        module docstring.

    Raises:
        ConfigError: on an unknown setup name or role.
    """
    s = get_setup(name)
    tenants = []
    for tenant, role in roles:
        if role not in ROLES:
            raise ConfigError("role", role, f"tenant {tenant}: choose one of {', '.join(ROLES)}")
        tier = (0 if role == "adversary" else 1) if s.tiered else 0
        tenants.append(TenantConfig(tenant, tier=tier, **dict(s.tenant_limits)))
    return Config(
        tenants=tenants, order=s.order, admission=s.admission, eviction=s.eviction, cost=COST,
        prefix_cache=s.prefix_cache, num_blocks=s.num_blocks, **(FLEET_REPLICA if s.fleet else REPLICA),
    )


def build_fleet(name: str, roles: Iterable[tuple[str, str]]):
    """The :class:`~tenantry.model.routers.FleetConfig` of fleet setup ``name``: ``fleet.replicas``
    copies of :func:`build_config`'s replica behind the setup's router, with its accounting.

    Raises:
        ConfigError: on an unknown setup name or role, or a setup without a fleet part.
    """
    from tenantry.model.routers import FleetConfig

    s = get_setup(name)
    if s.fleet is None:
        raise ConfigError("--policy", name, "is a one-replica setup, not a fleet setup "
                          f"(fleet setups: {', '.join(n for n, x in SETUPS.items() if x.fleet)})")
    f = s.fleet
    return FleetConfig((build_config(name, roles),) * f.replicas, router=f.router, accounting=f.accounting,
                       load_factor=f.load_factor, affinity_replicas=f.affinity_replicas)

def apply_setup(config: Config, name: str) -> Config:
    """``config`` with setup ``name`` applied: its order policy and parameters,
    admission switches, eviction and prefix-cache mode replace the config's;
    its per-tenant limits are given to every tenant that has none of its own.
    Tiers, weights, the pool and the batch limits stay the config's.

    Raises:
        ConfigError: on an unknown setup name.
    """
    s = get_setup(name)
    limits = dict(s.tenant_limits)
    tenants = tuple(attrs.evolve(t, **{k: v for k, v in limits.items() if getattr(t, k) is None}) for t in config.tenants)
    return attrs.evolve(config, tenants=tenants, order=s.order, admission=s.admission, eviction=s.eviction,
                        prefix_cache=s.prefix_cache)


def default_config(tenant_names: Iterable[str]) -> Config:
    """The default replica: a 70B model on 8 H100s (SPEC.md 4.7), equal tenants."""
    return Config(tenants=[TenantConfig(n) for n in tenant_names])


#: The request-rate limit of the seed-001 lesson's experiment: 2 requests/s, burst 4, per tenant.
SEED001_RATE_LIMIT = {"request_rate_per_s": 2.0, "request_burst": 4.0}


def seed001_config(tenant_names: Iterable[str] = ("bulk", "app", "chat")) -> Config:
    """The replica of the seed-001 experiment: :func:`default_config` with the lesson's
    request-rate limit on every tenant (in force only under a setup that enforces it,
    such as ``rate_limit``)."""
    return Config(tenants=[TenantConfig(n, **SEED001_RATE_LIMIT) for n in tenant_names])


def config_from_dict(d: dict[str, Any], where: str = "history header") -> Config:
    """Rebuild a :class:`Config` from :func:`config_to_dict` output.

    Raises:
        ConfigError: naming the field when the dict is not a configuration.
    """
    if not isinstance(d, dict):
        raise ConfigError("config", d,
                          "must be an object (a configuration's fields)", where)
    tenants = d.get("tenants")
    if not isinstance(tenants, (list, tuple)) or not tenants or not all(isinstance(t, dict) for t in tenants):
        raise ConfigError("config.tenants", tenants,
                          "must be a non-empty list of tenant objects", where)
    for key in _SECTIONS:
        if key in d and not isinstance(d[key], dict):
            raise ConfigError(f"config.{key}", d[key],
                              "must be an object", where)
    try:
        parts = dict(d)
        parts["tenants"] = tuple(TenantConfig(**t) for t in parts["tenants"])
        for key, cls in _SECTIONS.items():
            if key in parts:
                parts[key] = cls(**parts[key])
        return Config(**parts)
    except ConfigError as e:
        raise ConfigError(e.field, e.value, e.why, where) from None
    except (KeyError, TypeError) as e:
        raise ConfigError("config", str(e), "not a tenantry configuration", where) from None


def config_with_tenants(config: Config, names: Any) -> Config:
    """``config`` with a default :class:`TenantConfig` appended for every name it lacks."""
    known = {t.name for t in config.tenants}
    extra = tuple(TenantConfig(n) for n in dict.fromkeys(names) if n not in known)
    return attrs.evolve(config, tenants=config.tenants + extra) if extra else config


_SECTIONS = {"order": OrderConfig, "admission": AdmissionConfig, "eviction": EvictionConfig, "cost": CostConfig}
_REPLICA_KEYS = {"block_size_tokens", "num_blocks", "max_num_seqs", "token_budget", "max_context_tokens", "prefix_cache"}


def _build(cls: type, table: dict[str, Any], where: str) -> Any:
    names = {a.name for a in attrs.fields(cls) if a.init}
    for key in table:
        if key not in names:
            raise ConfigError(key, table[key], f"unknown key; expected one of {', '.join(sorted(names))}", where)
    try:
        return cls(**table)
    except ConfigError as e:
        raise ConfigError(e.field, e.value, e.why, where) from None
    except TypeError as e:
        raise ConfigError(cls.__name__, table, str(e), where) from None


#: Largest configuration file read (bytes): a replica's TOML is a few KB; an endless or
#: binary input (``/dev/zero``) is refused instead of filling the memory.
MAX_TOML_BYTES = 1 << 20


#: Documents read from pipes (``--config <(...)``), by the pipe's (device, inode): a pipe can be
#: read only once, and a configuration is read once for the replica and once for ``[fleet]``.
_PIPED: dict[tuple[int, int], dict[str, Any]] = {}


def read_toml(path: str | Path) -> dict[str, Any]:
    """The TOML document in ``path``, read once and bounded (:data:`MAX_TOML_BYTES`).

    ``path`` is a regular file or a pipe (``--config <(cat r.toml)``, a FIFO: read to
    its end once, and the same document is given again when the same pipe is read a
    second time, as the replica and ``[fleet]`` readers both do; a FIFO no process
    writes is an empty document, not a hang).  A device (``/dev/null``, ``/dev/zero``),
    a folder or a socket is refused without reading it.  An empty file is an empty
    document (``{}``).

    Raises:
        ConfigError: naming the file when it is not a regular file or a pipe, is larger
            than the bound, is not UTF-8, or is not TOML.
        OSError: if it cannot be opened (the CLI names the path).
    """
    import copy
    import os
    import stat

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # non-blocking: a FIFO with no writer opens at once
    try:
        st = os.fstat(fd)
        mode, key = st.st_mode, (st.st_dev, st.st_ino)
        if stat.S_ISFIFO(mode):
            if key in _PIPED:
                os.close(fd)
                return copy.deepcopy(_PIPED[key])
            os.set_blocking(fd, True)  # wait for the writer's bytes (no writer: end of file at once)
        elif not stat.S_ISREG(mode):
            kind = ("a directory" if stat.S_ISDIR(mode) else "a character device" if stat.S_ISCHR(mode)
                    else "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode)
                    else "not a file")
            raise ConfigError("", None, f"not a regular file or a pipe ({kind}); a configuration is a TOML file",
                              str(path))
        f = os.fdopen(fd, "rb")
    except BaseException:
        try:
            os.close(fd)
        except OSError:
            pass
        raise
    with f:
        raw = f.read(MAX_TOML_BYTES + 1)
    if len(raw) > MAX_TOML_BYTES:
        raise ConfigError("", None, f"larger than {MAX_TOML_BYTES >> 20} MiB: not a configuration file", str(path))
    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError("", None, f"not UTF-8 text (byte {raw[e.start]:#04x} at offset {e.start})",
                          str(path)) from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError("", None, f"not valid TOML ({e})", str(path)) from None
    if stat.S_ISFIFO(mode):
        _PIPED[key] = copy.deepcopy(doc)
    return doc


def load_config_toml(path: str | Path) -> Config:
    """Read a replica configuration from a TOML file.

    Layout: a ``[replica]`` table (block_size_tokens, num_blocks, max_num_seqs,
    token_budget, max_context_tokens, prefix_cache), optional ``[order]``,
    ``[admission]``, ``[eviction]``, ``[cost]`` tables whose keys are the fields
    of the matching config classes, and one ``[[tenants]]`` table per tenant
    (the fields of :class:`TenantConfig`).  See ``examples/replica.toml``.

    Raises:
        ConfigError: naming the file, the table and the key on any bad value.
        FileNotFoundError: if the file does not exist.
    """
    path = Path(path)
    doc = read_toml(path)
    known = set(_SECTIONS) | {"replica", "tenants", "fleet"}  # [fleet]: read by model.fleet.load_fleet_toml
    for key in doc:
        if key not in known:
            raise ConfigError(key, doc[key], f"unknown table; expected {', '.join(sorted(known))}", str(path))
    tenants_doc = doc.get("tenants")
    if not isinstance(tenants_doc, list) or not tenants_doc:
        raise ConfigError("tenants", tenants_doc, "give at least one [[tenants]] table", str(path))
    tenants = [_build(TenantConfig, t, f"{path}: [[tenants]] #{i + 1}") for i, t in enumerate(tenants_doc)]
    kwargs: dict[str, Any] = {k: _build(cls, doc.get(k, {}), f"{path}: [{k}]") for k, cls in _SECTIONS.items()}
    replica = doc.get("replica", {})
    for key in replica:
        if key not in _REPLICA_KEYS:
            raise ConfigError(key, replica[key], f"unknown key; expected one of {', '.join(sorted(_REPLICA_KEYS))}", f"{path}: [replica]")
    try:
        return Config(tenants=tenants, **replica, **kwargs)
    except ConfigError as e:  # a check across the tables (duplicate tenant names: [[tenants]])
        table = "[[tenants]]" if e.field == "tenants" else "[replica]"
        raise ConfigError(e.field, e.value, e.why, f"{path}: {table}") from None
