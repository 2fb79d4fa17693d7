"""Every proof, in one list, selectable by id or family (SPEC.md section 8)."""

from __future__ import annotations

from typing import Iterable

from . import admission, bucket, drr, evict, fleet, guard, guard_wait, kv, order, preempt, priority, skips, vtc, wait
from .core import Proof

#: All proofs in the order ``tenantry prove`` runs them.
PROOFS: tuple[Proof, ...] = (vtc.PROOFS + skips.PROOFS + drr.PROOFS + (skips.DRR_GAP_SKIPS, skips.DRR_GAP_SKIPS_BS) + priority.PROOFS
                             + (skips.FLOOR_SKIPS,) + order.PROOFS + wait.PROOFS + bucket.PROOFS
                             + admission.PROOFS + evict.PROOFS + preempt.PROOFS + kv.PROOFS + guard.PROOFS + guard_wait.PROOFS
                             + fleet.PROOFS)

FAMILIES = tuple(dict.fromkeys(p.family for p in PROOFS))


def select(ids: Iterable[str] | None = None) -> tuple[Proof, ...]:
    """The proofs whose id or family is in ``ids`` (all when None).

    A name matches a proof id exactly, an id without its ``[unit]`` suffix
    (``DRR-DEFICIT`` selects both units), or a family name.

    Raises:
        KeyError: naming the first name that matches nothing, with the known ids.
    """
    if ids is None:
        return PROOFS
    out: list[Proof] = []
    for name in ids:
        hit = [p for p in PROOFS if name in (p.id, p.id.split("[")[0], p.family)]
        if not hit:
            known = ", ".join(dict.fromkeys([p.id for p in PROOFS] + list(FAMILIES)))
            raise KeyError(f"no proof or family named {name!r}; known: {known}")
        out += [p for p in hit if p not in out]
    return tuple(out)
