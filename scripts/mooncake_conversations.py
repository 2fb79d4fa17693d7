"""Write the Mooncake FAST'25 conversation trace as a two-tenant workload (project JSON Lines).

    python scripts/mooncake_conversations.py TRACE.jsonl OUT.jsonl [--rows N] [--speedup S]

Each request goes to tenant ``conv-a`` or ``conv-b`` by the parity of its second
hash id (the first block after the system prompt's, hash id 0), so that the turns
of one conversation, which repeat the earlier turns' blocks, stay with one tenant
and their prefix sharing is kept.  Times are divided by ``--speedup``.  Used by the
fleet run of README.md ("A fleet of replicas behind a router").
"""

from __future__ import annotations

import argparse

import attrs

from tenantry.runner.traces import read_mooncake_jsonl, write_workload_jsonl


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--rows", type=int, default=None)
    ap.add_argument("--speedup", type=float, default=1.0)
    args = ap.parse_args(argv)
    reqs = read_mooncake_jsonl(args.trace, "conv", max_rows=args.rows)
    per_hash = 512 // 16  # read_mooncake_jsonl's model blocks per 512-token hash id (block_size_tokens 16)
    out = []
    for r in reqs:
        second = r.prefix_ids[per_hash] // per_hash if len(r.prefix_ids) > per_hash else r.request_id
        out.append(attrs.evolve(r, tenant="conv-" + "ab"[second % 2], arrival_s=r.arrival_s / args.speedup))
    write_workload_jsonl(out, args.out)
    print(f"{args.out}: {len(out)} requests, {sum(r.tenant == 'conv-a' for r in out)} conv-a, "
          f"{sum(r.tenant == 'conv-b' for r in out)} conv-b, over {max(r.arrival_s for r in out):.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
