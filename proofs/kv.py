"""The KV pool: conservation (the books balance, and a block held by several
sequences is a prefix block of one salt), capacity and per-tenant caps, and
salt isolation of the prefix cache (SPEC.md 8.8).

Prefix-cache keys are chain hashes: ``k_0 = seed(salt)``, ``k_j = H(k_{j-1},
content_j)`` (``prefix_keys``).  The hash is modelled as injective on salt
and content, through a function ``root`` with ``root(seed(x)) = x`` and
``root(H(k, c)) = root(k)``: the two axioms can only both hold if no chain of
one salt collides with a chain of another.  Keys, salts and contents are
uninterpreted sorts, sequences and tenants integer domains: every claim holds
for any number of each.

Transitions (``model/step.py``): ``alloc`` (new private blocks, after
``_reclaim`` dropped retained blocks: ``drop``), ``share`` (a lookup hit on a
referenced block), ``revive`` (a hit on a retained one), ``register`` (a
completed prompt block becomes shared, ``_register``), ``unref`` and ``free``
(``_release``: a shared block left with no reference is retained, free).
"""

from __future__ import annotations

import z3
from z3 import And, ForAll, Implies, Int, Not, Or, Store

from tenantry.model.config import AdmissionConfig, Config, CostConfig, OrderConfig, TenantConfig
from tenantry.model.workload import Request

from .checks import catalog_state, verdict
from .concrete import run_workload
from .core import Domain, Proof, Replay, Twin, implies_all, int_array, val

FAMILY = "kv"

Salt = z3.DeclareSort("Salt")
Content = z3.DeclareSort("Content")
Key = z3.DeclareSort("Key")
seed = z3.Function("seed", Salt, Key)
H = z3.Function("H", Key, Content, Key)
root = z3.Function("root", Key, Salt)
NONE = z3.Const("NONE", Salt)  # the single namespace of the shared cache


def hash_model(x, k, c) -> z3.BoolRef:
    """The injectivity model of the chain hash, at salt x, key k, content c."""
    return And(root(seed(x)) == x, root(H(k, c)) == root(k))


def chain_obligations() -> list[tuple[str, z3.BoolRef]]:
    """Every key ``prefix_keys(request, x)`` computes has root x (induction on the chain)."""
    x, k, c = z3.Const("x_ch", Salt), z3.Const("k_ch", Key), z3.Const("c_ch", Content)
    return [("chain-base", implies_all([hash_model(x, k, c)], root(seed(x)) == x)),
            ("chain-step", implies_all([hash_model(x, k, c), root(k) == x], root(H(k, c)) == x))]


def kstate(tag: str) -> dict:
    K_ = lambda n, r: z3.Array(f"{n}_{tag}", Key, r)  # noqa: E731
    return {"used": Int(f"used_{tag}"), "P": Int(f"P_{tag}"), "L": Int(f"L_{tag}"), "nret": Int(f"nret_{tag}"),
            "priv": int_array(f"priv_{tag}"), "refs": K_("refs", z3.IntSort()), "live": K_("live", z3.BoolSort()),
            "ret": K_("ret", z3.BoolSort()), "owner": K_("owner", Salt),
            "hold": z3.Array(f"hold_{tag}", z3.IntSort(), z3.ArraySort(Key, z3.BoolSort()))}


def empty_pool() -> dict:
    """The initial pool: nothing allocated, cached or held (constant arrays)."""
    return {"used": z3.IntVal(0), "P": z3.IntVal(0), "L": z3.IntVal(0), "nret": z3.IntVal(0),
            "priv": z3.K(z3.IntSort(), z3.IntVal(0)), "refs": z3.K(Key, z3.IntVal(0)), "live": z3.K(Key, False),
            "ret": z3.K(Key, False), "owner": z3.Array("owner_init", Key, Salt),
            "hold": z3.K(z3.IntSort(), z3.K(Key, False))}


# The invariant in pieces: global, per key, per sequence, per (sequence, key).  Obligations use
# them with the hypothesis instantiated at the terms of the transition and the goal at fresh
# (Skolem) constants, which proves the universally quantified invariant without quantifiers.

def inv_global(s: dict, pool) -> z3.BoolRef:
    """Books balance (used = private + live shared) and capacity (used and used +
    retained within the pool).  P, L and nret are ghosts kept alongside by every
    transition: the sum of private blocks and the numbers of live and retained
    keys (non-negative by construction)."""
    return And(s["used"] == s["P"] + s["L"], s["used"] <= pool, s["used"] + s["nret"] <= pool)


def inv_key(s: dict, k, salted: bool) -> z3.BoolRef:
    """Refcount >= 1 exactly on live blocks, live and retained disjoint, a cached key rooted in its owner's salt."""
    cached_root = root(k) == (s["owner"][k] if salted else NONE)
    return And(s["refs"][k] >= 0, (s["refs"][k] >= 1) == s["live"][k], Not(And(s["live"][k], s["ret"][k])),
               Implies(Or(s["live"][k], s["ret"][k]), cached_root))


def inv_seq(s: dict, x) -> z3.BoolRef:
    return s["priv"][x] >= 0


def inv_hold(s: dict, x, k, tsalt) -> z3.BoolRef:
    """A held block is live and its holder's tenant has the salt it was registered under."""
    return Implies(s["hold"][x][k], And(s["live"][k], tsalt[x] == s["owner"][k]))


def holders_counted(s: dict, x, y, k) -> z3.BoolRef:
    """A consequence of ``refs[k]`` counting k's holders: two distinct holders mean refs >= 2."""
    return Implies(And(x != y, s["hold"][x][k], s["hold"][y][k]), s["refs"][k] >= 2)


def refcount_delta(s: dict, post: dict, x, k) -> z3.BoolRef:
    """A transition on (x, k) moves ``refs[k]`` by exactly the change of x's hold flag on k,
    so refs[k] stays the number of k's holders (by induction from the empty pool)."""
    b = lambda v: z3.If(v, 1, 0)  # noqa: E731
    return post["refs"][k] - s["refs"][k] == b(post["hold"][x][k]) - b(s["hold"][x][k])


def kv_inv(dom: Domain, s: dict, pool, tsalt, salted: bool) -> z3.BoolRef:
    """The whole invariant, quantified (for statements and checks on concrete values)."""
    k = z3.Const(f"k!inv{id(s)}", Key)
    return And(inv_global(s, pool), ForAll([k], inv_key(s, k, salted)),
               dom.forall(lambda x: And(inv_seq(s, x), ForAll([k], inv_hold(s, x, k, tsalt)))))


def ns(x, tsalt, salted: bool) -> z3.ExprRef:
    """The namespace a sequence's keys are rooted in: its tenant's salt, or NONE when shared."""
    return tsalt[x] if salted else NONE


def actions(dom: Domain, s: dict, pool, tsalt, salted: bool, tag: str, x=None, k=None) -> tuple[dict, dict]:
    """name -> (guard, post) for every transition of the pool, acting on sequence x and key k."""
    x = Int(f"x_{tag}") if x is None else x
    k = z3.Const(f"k_{tag}", Key) if k is None else k
    n = Int(f"n_{tag}")
    refs, live, ret, hold, priv = s["refs"], s["live"], s["ret"], s["hold"], s["priv"]
    mine = And(dom.has(x), root(k) == ns(x, tsalt, salted))
    hold_x = lambda v: Store(hold, x, Store(hold[x], k, v))  # noqa: E731
    out = {}
    out["alloc"] = (And(dom.has(x), n >= 0, n <= pool - s["used"], s["used"] + s["nret"] + n <= pool),
                    {**s, "priv": Store(priv, x, priv[x] + n), "P": s["P"] + n, "used": s["used"] + n})
    out["drop"] = (ret[k], {**s, "ret": Store(ret, k, False), "nret": s["nret"] - 1})
    out["share"] = (And(mine, live[k], Not(hold[x][k])), {**s, "refs": Store(refs, k, refs[k] + 1), "hold": hold_x(True)})
    out["revive"] = (And(mine, ret[k], Not(hold[x][k]), s["used"] + 1 <= pool),
                     {**s, "ret": Store(ret, k, False), "nret": s["nret"] - 1, "live": Store(live, k, True),
                      "refs": Store(refs, k, 1), "L": s["L"] + 1, "used": s["used"] + 1, "hold": hold_x(True)})
    out["register"] = (And(mine, Not(live[k]), Not(ret[k]), priv[x] >= 1),
                       {**s, "priv": Store(priv, x, priv[x] - 1), "P": s["P"] - 1, "refs": Store(refs, k, 1),
                        "live": Store(live, k, True), "L": s["L"] + 1, "hold": hold_x(True),
                        "owner": Store(s["owner"], k, tsalt[x])})
    last = refs[k] == 1
    out["unref"] = (And(dom.has(x), hold[x][k]),
                    {**s, "hold": hold_x(False), "refs": Store(refs, k, refs[k] - 1),
                     "live": Store(live, k, Not(last)), "ret": Store(ret, k, z3.If(last, True, ret[k])),
                     "nret": s["nret"] + z3.If(last, 1, 0), "L": s["L"] - z3.If(last, 1, 0),
                     "used": s["used"] - z3.If(last, 1, 0)})
    out["free"] = (dom.has(x), {**s, "priv": Store(priv, x, 0), "P": s["P"] - priv[x], "used": s["used"] - priv[x]})
    return out, {"x": x, "n": n, "k": k}


def _setup(dom, pool, tsalt, xs=()):
    return And(dom.size >= 1, pool >= 1, *[tsalt[x] != NONE for x in xs])


def conserve_obligations(salted: bool = True) -> list[tuple[str, z3.BoolRef]]:
    dom, pool, tsalt = Domain("S"), Int("pool"), z3.Array("tsalt", z3.IntSort(), Salt)
    kw, kh = z3.Const("kw", Key), z3.Const("kh", Key)  # Skolem witnesses of the goal
    xw, xh = Int("xw"), Int("xh")
    out = []
    goal = lambda s: And(inv_global(s, pool), inv_key(s, kw, salted), inv_seq(s, xw),  # noqa: E731
                         Implies(And(dom.has(xh)), inv_hold(s, xh, kh, tsalt)))
    e = empty_pool()
    out.append(("init", implies_all([_setup(dom, pool, tsalt)], goal(e))))
    for name in ("alloc", "drop", "share", "revive", "register", "unref", "free"):
        s = kstate(name)
        acts, p = actions(dom, s, pool, tsalt, salted, name)
        g, post = acts[name]
        x, k = p["x"], p["k"]
        pre = [inv_global(s, pool)] + [inv_key(s, kk, salted) for kk in (k, kw, kh)] + \
              [inv_seq(s, xx) for xx in (x, xw)] + [inv_hold(s, xx, kk, tsalt) for xx in (x, xh) for kk in (k, kh)] + \
              [holders_counted(s, x, xh, kk) for kk in (k, kh)]
        out.append((name, implies_all([_setup(dom, pool, tsalt, (x, xh)), dom.has(xw), *pre, g], goal(post))))
        if name in ("share", "revive", "register", "unref"):
            out.append((f"{name}:refs", implies_all([_setup(dom, pool, tsalt, (x,)), *pre, g],
                                                    refcount_delta(s, post, x, k))))
    return out


def isolation_obligations(salted: bool = True) -> list[tuple[str, z3.BoolRef]]:
    """A hit (``share`` or ``revive``) by sequence x on key k: k was registered
    under x's tenant's salt."""
    dom, pool, tsalt = Domain("S"), Int("pool"), z3.Array("tsalt", z3.IntSort(), Salt)
    out = list(chain_obligations())
    for name in ("share", "revive"):
        s = kstate(f"hit_{name}")
        acts, p = actions(dom, s, pool, tsalt, salted, f"hit_{name}")
        g, _ = acts[name]
        pre = [inv_key(s, p["k"], salted)]
        out.append((name, implies_all([_setup(dom, pool, tsalt, (p["x"],)), *pre, g],
                                      s["owner"][p["k"]] == tsalt[p["x"]])))
    return out


def bounded_salt_run(salted: bool, hit: str) -> tuple[z3.BoolRef, dict]:
    """From the empty pool: sequence 0 allocates a block and registers it under key
    k, then sequence 1 (another tenant's) hits k (``share``, or ``revive`` after
    sequence 0 released it).  A run of the encoding, bound 3-4 transitions."""
    dom, pool, tsalt = Domain("S", 2), Int("pool"), z3.Array("tsalt", z3.IntSort(), Salt)
    k = z3.Const("k_run", Key)
    x0, x1 = z3.IntVal(0), z3.IntVal(1)
    s = empty_pool()
    steps = [("alloc", x0), ("register", x0)] + ([("unref", x0)] if hit == "revive" else []) + [(hit, x1)]
    conds = [pool == 4, tsalt[x0] != NONE, tsalt[x1] != NONE, tsalt[x0] != tsalt[x1]]
    for n, (name, x) in enumerate(steps):
        acts, p = actions(dom, s, pool, tsalt, salted, f"run{n}", x=x, k=k)
        g, s = acts[name]
        conds.append(g)
        if name == "alloc":
            conds.append(p["n"] == 1)
        if name == "register":
            conds.append(root(k) == ns(x0, tsalt, salted))
    bad = And(s["hold"][x1][k], tsalt[x1] != s["owner"][k])
    return And(*conds, bad), {"steps": [n for n, _ in steps]}


# --- KV-CAP ------------------------------------------------------------------------------


def cap_obligations(enforced: bool = True) -> list[tuple[str, z3.BoolRef]]:
    """Tenant blocks (a shared block counts once per holder) within the cap, pool within size."""
    dom, cap = Domain("N"), int_array("cap")
    blocks, used, pool = int_array("blocks"), Int("used"), Int("pool")
    i, n, b = Int("i"), Int("n"), Int("b")
    inv = lambda bl, u: And(u >= 0, u <= pool, dom.forall(lambda t: And(bl[t] >= 0, bl[t] <= cap[t])))  # noqa: E731
    setup = And(dom.size >= 1, pool >= 1, dom.forall(lambda t: cap[t] >= 1))
    capg = (lambda: blocks[i] + n <= cap[i]) if enforced else (lambda: z3.BoolVal(True))
    # admit / grow: ``_admit_head`` and ``_make_room`` allow n new references of which f are fresh blocks
    f = Int("fresh")
    grow = And(dom.has(i), n >= 0, f >= 0, f <= n, used + f <= pool, capg())
    out = [("grow", implies_all([setup, inv(blocks, used), grow], inv(Store(blocks, i, blocks[i] + n), used + f))),
           ("release", implies_all([setup, inv(blocks, used), dom.has(i), b >= 0, b <= blocks[i], f >= 0, f <= used],
                                   inv(Store(blocks, i, blocks[i] - b), used - f)))]
    return out


# --- replays -----------------------------------------------------------------------------


def cache_config(mode: str) -> Config:
    return Config(tenants=(TenantConfig("a"), TenantConfig("b")), max_num_seqs=4, token_budget=64, num_blocks=16,
                  max_context_tokens=64, prefix_cache=mode, order=OrderConfig(policy="fcfs"),
                  cost=CostConfig(mode="unit"))


def held_by_two_salts(config: Config, transitions) -> list[str]:
    """KV-CONSERVE's salt clause on concrete states: every block referenced by
    several running sequences is referenced only by tenants of one salt."""
    for tr in transitions:
        holders: dict = {}
        for s in tr.state.running:
            for key in s.shared_keys:
                holders.setdefault(key, set()).add(config.tenants[s.tenant].salt)
        for key, salts in holders.items():
            if len(salts) > 1:
                return [f"step {tr.output.step_index}: one cached block is held by tenants of salts {sorted(salts)}"]
    return []


def cross_salt_hits(config: Config, transitions) -> list[str]:
    """SALT-ISOLATION on a run: every cached block a sequence references was
    registered by a tenant of its own salt (the registrant is tracked from the
    step in which the key first enters the cache)."""
    owner: dict = {}
    for tr in transitions:
        new = [s for s in tr.state.running]
        for s in new:
            for key in s.shared_keys:
                salt = config.tenants[s.tenant].salt
                if key not in owner:
                    owner[key] = salt
                elif owner[key] != salt:
                    return [f"step {tr.output.step_index}: request {s.request_id} of salt {salt!r} reuses a block "
                            f"registered under salt {owner[key]!r}"]
    return []


def _salt_twin(which: str):
    def formula():
        return bounded_salt_run(salted=False, hit="share" if which == "conserve" else "revive")

    def replay(m, sym):
        cfg, ref = cache_config("shared"), cache_config("salted")
        # a and b send prompts with the same two-block prefix; b's arrives while a's still runs
        reqs = [Request(0, "a", 0.0, 40, 6, prefix_ids=(7, 8)), Request(1, "b", 2.0, 40, 6, prefix_ids=(7, 8))]
        trs = list(run_workload(cfg, reqs, max_steps=30))
        local = held_by_two_salts(cfg, trs) if which == "conserve" else cross_salt_hits(cfg, trs)
        ok, detail = verdict(local, catalog_state("SALT-ISOLATION", ref, trs),
                             "prefix_cache=shared, tenants a and b send the same 2-block prefix")
        return Replay(ok, detail, {"shared_prefix_blocks": 2})
    return formula, replay


def cap_config(enforced: bool) -> Config:
    return Config(tenants=(TenantConfig("a", kv_block_cap=2), TenantConfig("b")), max_num_seqs=8, token_budget=64,
                  num_blocks=16, max_context_tokens=16, admission=AdmissionConfig(kv_cap=enforced),
                  order=OrderConfig(policy="fcfs"), cost=CostConfig(mode="unit"))


def _cap_twin():
    def formula():
        obligations = dict(cap_obligations(enforced=False))
        n = Int("n")
        return And(obligations["grow"], n >= 1, n <= 4, Int("fresh") == n), {"n": n}

    def replay(m, sym):
        extra = val(m, sym["n"])
        cfg, ref = cap_config(False), cap_config(True)
        reqs = [Request(j, "a", 0.0, 4, 2) for j in range(2 + extra)]
        trs = list(run_workload(cfg, reqs, max_steps=3))
        held = [sum(s.blocks_held for s in tr.state.running if s.tenant == 0) for tr in trs]
        local = [f"tenant a holds {h} blocks, over its cap of 2" for h in held if h > 2][:1]
        ok, detail = verdict(local, catalog_state("KV-CAP", ref, trs),
                             f"kv_cap=False, cap 2 blocks, {2 + extra} one-block requests at t=0")
        return Replay(ok, detail, {"cap": 2, "requests": 2 + extra, "max_held": max(held)})
    return formula, replay


def _proofs():
    cf, cr = _salt_twin("conserve")
    sf, sr = _salt_twin("isolation")
    kf, kr = _cap_twin()
    return (
        Proof(id="KV-CONSERVE", family=FAMILY,
              claim="used = private + live shared blocks, used + retained <= pool, refcounts >= 1 exactly on live "
                    "blocks, and a block's holders all have the salt it was registered under",
              scope="any N (sequences, keys, salts)", obligations=conserve_obligations,
              twins=(Twin("shared-salt", "per-tenant salts (prefix_cache='shared')", cf, cr,
                          scope="run of 3 from the empty pool"),),
              hypotheses=("the chain hash is injective on salt and content (root(seed(x)) = x, root(H(k, c)) = root(k))",)),
        Proof(id="KV-CAP", family=FAMILY,
              claim="blocks in use <= pool and each tenant's references <= its KV block cap",
              scope="any N", obligations=cap_obligations,
              twins=(Twin("no-cap", "the per-tenant cap (AdmissionConfig(kv_cap=False))", kf, kr),)),
        Proof(id="SALT-ISOLATION", family=FAMILY,
              claim="every prefix-cache hit (shared or revived block) was registered under the requester's salt",
              scope="any N (tenants, keys, salts, contents)", obligations=isolation_obligations,
              twins=(Twin("shared-salt", "per-tenant salts (prefix_cache='shared')", sf, sr,
                          scope="run of 4 from the empty pool"),),
              hypotheses=("the chain hash is injective on salt and content",)),
    )


PROOFS = _proofs()
