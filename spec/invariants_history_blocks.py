"""Record forms of the KV pool and its blocks (SPEC.md 7.1 and 7.5): KV-CONSERVE, KV-CAP,
SALT-ISOLATION, and :func:`block_reads`, the blocks' writers followed over a whole run.

The same contract as :mod:`tenantry.spec.invariants_history`: each
``h_*(hctx) -> list[Finding]`` reads only the records plus the claimed
configuration; where it judges step by step, its judgement of one step is
``s_*(h, v, pv, carry)``, which is also the invariant's state form
(:func:`tenantry.spec.invariants_state.from_record`).
"""

from __future__ import annotations

from tenantry.runner.history import RequestRecord

from .invariants_core import Finding, caps_enforced
from .invariants_history import HistoryContext, _f, each_step
from .replay import StepView


# --- the pool ----------------------------------------------------------------------------


def s_kv_conserve(h: HistoryContext, v: StepView, pv, carry: dict) -> list[Finding]:
    """KV-CONSERVE's judgement of one step (:func:`h_kv_conserve`)."""
    cfg, out = h.config, []
    exact, tenant_of, blocks_for, pool = h.replay.exact, h.tenant_of, cfg.blocks_for, cfg.num_blocks
    s, k = v.record, v.record.step_index
    free, held, used_blocks, in_use = s.free_blocks, s.held, s.used_blocks, s.blocks_in_use
    held_sum = sum(in_use.values())
    used = used_blocks if used_blocks is not None else (held_sum if not h.shareable else None)
    if free > pool:
        out.append(_f("KV-CONSERVE", k, "more free blocks than the pool has", free, pool))
    elif free < 0:
        pass  # more blocks in use than the pool: KV-CAP
    elif used is not None and used + free != pool:
        out.append(_f("KV-CONSERVE", k, f"free blocks ({free}) plus distinct blocks in use ({used}) "
                      "differ from the pool", used + free, pool))
    elif not s.running and (held_sum or free != pool):
        out.append(_f("KV-CONSERVE", k, "nothing runs but blocks are still in use", pool - free, 0))
    if held is not None:
        if held.keys() != set(s.running):
            extra = sorted(set(held) - set(s.running))
            if any(held[r] for r in extra):
                out.append(_f("KV-CONSERVE", k, "a request that is not running holds blocks: they leak",
                              len(extra), 0, requests=extra))
        per: dict[str, int] = {}
        running = v.running
        for rid, b in held.items():
            tenant = tenant_of.get(rid)
            if tenant is None:
                continue
            per[tenant] = per.get(tenant, 0) + b
            c = running.get(rid)
            if exact and c is not None and b < blocks_for(c):
                out.append(_f("KV-CONSERVE", k, f"request {rid} has {c} tokens of KV in {b} blocks",
                              b, blocks_for(c), [tenant], [rid]))
        for name, b in per.items():
            if in_use.get(name, 0) != b:
                out.append(_f("KV-CONSERVE", k, "a tenant's blocks in use differ from its requests' blocks",
                              in_use.get(name, 0), b, [name]))
        if used_blocks is not None and used_blocks > sum(held.values()):
            out.append(_f("KV-CONSERVE", k, "more distinct blocks in use than the running requests hold",
                          used_blocks, sum(held.values())))
    if s.block_ids:
        ids = [b for rid in s.running for b in s.block_ids.get(rid, ())]
        if s.used_blocks is not None and len(set(ids)) != s.used_blocks and (s.held is None or all(
                len(s.block_ids.get(rid, ())) == s.held.get(rid) for rid in s.running)):
            out.append(_f("KV-CONSERVE", k, "distinct block ids differ from the blocks in use",
                          len(set(ids)), s.used_blocks))
        if cfg.prefix_cache == "off" and len(set(ids)) != len(ids):
            twice = sorted({b for b in ids if ids.count(b) > 1}, key=repr)[:3]
            holders = [rid for rid in s.running if set(s.block_ids.get(rid, ())) & set(twice)]
            out.append(_f("KV-CONSERVE", k, f"block {twice[0]!r} is held by two requests with the prefix "
                          "cache off", len(ids) - len(set(ids)), 0, requests=holders))
    return out


def h_kv_conserve(h: HistoryContext) -> list[Finding]:
    """KV-CONSERVE (SPEC.md 7.1), record form: after every step free blocks are at
    most the pool and free + distinct blocks in use = pool (``used_blocks``; without it,
    only when no block can be shared: free + sum of blocks held = pool); each
    running request holds at least the blocks its computed tokens need and the
    tenants' counts add up (``held``); a block is held by two requests only with a
    prefix cache (``block_ids``); an entry into the batch with computed tokens is
    a whole-block cache hit; nothing held when nothing runs (:func:`s_kv_conserve`,
    step by step).  Over the whole run (block ids): no request holds a block whose
    content was last written for other tokens under its own salt (another salt's:
    SALT-ISOLATION)."""
    cfg, out = h.config, h.anomalies("KV-CONSERVE") + each_step(h, s_kv_conserve)
    salts = {t.name: (t.salt if cfg.prefix_cache == "salted" else None) for t in cfg.tenants}
    for k, rid, j, bid, w in block_reads(h):
        r = h.requests[rid]
        if w[0] == salts.get(r.tenant):  # same namespace, other content: the request reads KV that is not its own
            if w[3] == rid:  # its own other position (or its earlier content): no other party to name
                out.append(_f("KV-CONSERVE", k, f"request {rid} holds block {bid!r} at position {j}, whose content "
                              "it last wrote itself for other tokens", None, None, [r.tenant], [rid]))
            else:
                out.append(_f("KV-CONSERVE", k, f"request {rid} holds block {bid!r} at position {j}, whose content "
                              f"was last written by request {w[3]} for other tokens (observed: that writer; allowed: "
                              "the holder)", w[3], rid, [r.tenant], [rid, w[3]]))
    return out


def s_kv_cap(h: HistoryContext, v: StepView, pv, carry: dict) -> list[Finding]:
    """KV-CAP's judgement of one step (:func:`h_kv_cap`)."""
    cfg, s, out = h.config, v.record, []
    used = max(s.used_blocks if s.used_blocks is not None else 0, cfg.num_blocks - s.free_blocks)
    if used > cfg.num_blocks:
        out.append(_f("KV-CAP", s.step_index, "more blocks in use than the pool has", used, cfg.num_blocks))
    if not caps_enforced(cfg):
        return out
    for name, n in s.blocks_in_use.items():
        t = h.tenant_cfg.get(name)
        if t is not None and t.kv_block_cap is not None and n > t.kv_block_cap:
            running = [rid for rid in s.running if h.requests.get(rid) and h.requests[rid].tenant == name]
            out.append(_f("KV-CAP", s.step_index, "a tenant holds more blocks than its cap", n, t.kv_block_cap,
                          [name], running))
    return out


def h_kv_cap(h: HistoryContext) -> list[Finding]:
    """KV-CAP (SPEC.md 7.1), record form: after every step blocks in use within the pool;
    per-tenant blocks within enforced caps (:func:`s_kv_cap`)."""
    return each_step(h, s_kv_cap)


# --- the blocks' writers, and isolation ---------------------------------------------------


def _content_keys(r: RequestRecord, n: int) -> list:
    """The content of blocks 0..n-1 of request ``r``: a chain over its prefix content ids,
    then unique to the request (what a block must hold for ``r`` to read it)."""
    out, key = [], ("c",)
    for j in range(n):
        if j < len(r.prefix_ids):
            key = hash((key, r.prefix_ids[j]))
            out.append(key)
        else:
            out.append(("u", r.request_id, j))
    return out


def block_reads(h: HistoryContext) -> list[tuple[int, int, int, object, tuple]]:
    """:func:`_block_reads` of ``h``, computed once per context (KV-CONSERVE and SALT-ISOLATION share it)."""
    got = h.memo.get("block_reads")
    if got is None:
        got = h.memo["block_reads"] = _block_reads(h)
    return got


def _block_reads(h: HistoryContext) -> list[tuple[int, int, int, object, tuple]]:
    """Blocks held with content they do not hold: (step, request id, position, block id,
    writer) for every block a running request holds at a computed position whose last
    writer was another salt or other content (the first such per request).  A block's
    writer is followed over its whole life, cache hit declared or not: the request
    that computes tokens into a block (its entry's declared hits excepted) writes it,
    in its last step too (a request finishing in a step has its block ids there).

    Cost follows what changed: a position a request held, fine, at its last check stays
    fine while it holds the same block and no other content is written into that block
    (a writer's salt and content only matter), so each step checks a request's new
    positions, positions whose block changed and blocks written with other content since,
    in position order; the result is that of checking every position every step."""
    cfg, B, out = h.config, h.config.block_size_tokens, []
    salt = {t.name: (t.salt if cfg.prefix_cache == "salted" else None) for t in cfg.tenants}
    writer: dict = {}
    rewritten: dict = {}  # block id -> index (in ``h.views``) of the last step that wrote other content into it
    seen: dict[int, tuple] = {}  # request id -> (block ids, positions checked, view index) of its last check
    keys: dict[int, list] = {}
    bad: set[int] = set()
    for i, v in enumerate(h.views):
        s, k = v.record, v.record.step_index
        if not s.block_ids:
            continue
        entered = {e.request_id: e.tokens for e in s.events if e.kind == "scheduled"}
        held = [(rid, c, s.block_ids.get(rid), h.requests.get(rid)) for rid, c in v.running.items()]
        # a request finishing in the step wrote its last chunk too (its ids as it finished)
        held += [(rid, c, s.block_ids.get(rid), h.requests.get(rid)) for rid, c in v.finished.items()]
        changed = set()
        for rid, c_after, ids, r in held:
            if ids and r is not None:
                start = entered[rid] // B if rid in entered else v.before.get(rid, (0, 0))[0] // B
                for j in range(start, min(cfg.blocks_for(c_after), len(ids))):
                    w = (salt.get(r.tenant), _key(keys, r, j), r.tenant, rid)
                    was = writer.get(ids[j])
                    if was is not None and (was[0] != w[0] or was[1] != w[1]):
                        changed.add(ids[j])
                        rewritten[ids[j]] = i
                    writer[ids[j]] = w
        for rid, c_after, ids, r in held:
            if not ids or r is None or rid in bad:
                continue
            n = min(cfg.blocks_for(c_after), len(ids))
            last = seen.get(rid)
            if last is None:
                todo = range(n)
            else:
                old, m, at = last
                m = min(m, n)
                if old is not ids and old[:m] != ids[:m]:
                    todo = [j for j in range(n) if j >= m or old[j] != ids[j] or rewritten.get(ids[j], -1) > at]
                elif not changed and not (at < i - 1 and rewritten):
                    todo = range(m, n)
                else:
                    since = changed if at == i - 1 else {b for b in ids[:m] if rewritten.get(b, -1) > at}
                    todo = ([j for j in range(m) if ids[j] in since] if since and not since.isdisjoint(ids[:m])
                            else []) + list(range(m, n))
            seen[rid] = (ids, n, i)
            for j in todo:
                w = writer.get(ids[j])
                if w is None:  # first seen holding computed tokens: its holder wrote it
                    writer[ids[j]] = (salt.get(r.tenant), _key(keys, r, j), r.tenant, rid)
                elif w[0] != salt.get(r.tenant) or w[1] != _key(keys, r, j):
                    out.append((k, rid, j, ids[j], w))
                    bad.add(rid)
                    break
    return out


def h_salt_isolation(h: HistoryContext) -> list[Finding]:
    """SALT-ISOLATION (SPEC.md 7.5), record form over block ids: no request holds a
    block last written under another salt (:func:`block_reads`)."""
    salt = {t.name: t.salt for t in h.config.tenants}
    out = []
    for k, rid, j, bid, w in block_reads(h):
        r = h.requests[rid]
        if w[0] != salt.get(r.tenant):
            out.append(_f("SALT-ISOLATION", k, f"request {rid} (tenant {r.tenant}) holds block {bid!r} at position {j}, "
                          f"written by request {w[3]} (tenant {w[2]}) under another salt", w[2], r.tenant,
                          [r.tenant, w[2]] if w[2] != r.tenant else [r.tenant], [rid, w[3]]))
    return out


def _key(cache: dict[int, list], r: RequestRecord, j: int):
    ks = cache.get(r.request_id)
    if ks is None or len(ks) <= j:
        ks = cache[r.request_id] = _content_keys(r, max(j + 1, 2 * len(ks or ())))
    return ks[j]
