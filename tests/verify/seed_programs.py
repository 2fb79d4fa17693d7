"""The two schedulers of the seed documents, rebuilt at test time and recorded as tenantry histories.

Nothing of the seeds' code is in the repository: it is read from
``../shared/seeds`` (:data:`conftest.SHARED_SEEDS`) when a test runs, compiled
in memory, and driven on workloads given in tenantry's own terms
(:class:`~tenantry.model.workload.Request`, times in seconds).  What each
program decided is recorded with :class:`tenantry.verify.offline.Recording`:

* seed 001's ``fairness.py`` (a lesson's step-level simulation of one replica,
  policies ``FCFS``, ``rate limit``, ``VTC``) has steps: its ``serve`` loop is
  instrumented (three calls that read its local variables are inserted into
  the loop's body, nothing else changes) and each iteration becomes a step
  record: the answers to the step's arrivals, the requests it admitted into
  prefill, the batch (one decode token per running sequence, then each
  prefill chunk), what runs and waits after it, the KV it reserved per
  request (``prompt + output`` tokens at admission, as blocks of 16 tokens of
  its 1.3 M-token pool: 81,250 blocks) and, under VTC, its counters;
* the lab's ``MultiTenantScheduler`` (seed 002, the same text as seed 004's
  one flattened line) has no steps: it runs one request at a time, whole
  and without preemption, for ``service tokens / 45`` ms.  It is recorded as
  request records only: each outcome with the time it was decided (read from
  the deciding function's locals when the lab builds the outcome), start,
  first token (start + its ``prefill_ms``) and finish (start + its
  ``exec_ms``).

Seed 002 lost its indentation (seed 004 its newlines too); :func:`lab_source`
re-indents it with a few rules and :data:`LAB_LEVELS`, the block level of
the lines the rules cannot place, made for the text whose SHA-256 is
:data:`LAB_FLAT_SHA256`.  The rebuilt program must print the seed's own
saved results (the JSON in seed 002) exactly, and its text must be seed 004's
with whitespace collapsed; otherwise :class:`SeedChanged` says what differs.
"""

from __future__ import annotations

import ast
import hashlib
import json
import math
import re
import sys
import types
from functools import lru_cache
from typing import Any, Iterable

import pytest

from conftest import SHARED_SEEDS

from tenantry.model.config import Config
from tenantry.model.workload import Request, Workload
from tenantry.runner.history import History
from tenantry.verify.offline import Recording

needs_seeds = pytest.mark.skipif(not SHARED_SEEDS.is_dir(), reason=f"seed documents not found at {SHARED_SEEDS} "
                                 "(../shared/seeds beside the repository)")


class SeedChanged(RuntimeError):
    """A seed document no longer holds the program as this module reads it (which document, what differs)."""


def seed_text(number: str) -> str:
    """The text of seed document ``number`` (``"001"``) in ../shared/seeds.

    Raises:
        SeedChanged: when there is not exactly one such document.
    """
    found = sorted(SHARED_SEEDS.glob(f"{number}_*.txt"))
    if len(found) != 1:
        raise SeedChanged(f"expected one seed document {number}_*.txt in {SHARED_SEEDS}, found {len(found)}")
    return found[0].read_text(encoding="utf-8")


def load_module(name: str, source: str) -> types.ModuleType:
    """``source`` compiled and run as module ``name``, in memory (registered in sys.modules,
    which dataclasses need for string annotations)."""
    mod = types.ModuleType(name)
    mod.__file__ = f"<{name}>"
    sys.modules[name] = mod
    exec(compile(source, mod.__file__, "exec"), mod.__dict__)
    return mod


# --- seed 001: fairness.py -------------------------------------------------------------------

#: Where seed 001's program starts and ends in the lesson's text.
FAIRNESS_START, FAIRNESS_END = "fairness.pyPython\n", "\nRun it with python3 fairness.py"
#: fairness.py's pool: KV_CAP tokens (1.3 M) in blocks of this many tokens.
BLOCK_SIZE_TOKENS = 16


def fairness_source() -> str:
    """fairness.py as printed in seed 001 (its indentation survived).

    Raises:
        SeedChanged: when the markers around it, or its ``serve`` loop, are not where they were.
    """
    text = seed_text("001")
    i, j = text.find(FAIRNESS_START), text.find(FAIRNESS_END)
    if i < 0 or j < i:
        raise SeedChanged(f"seed 001: the program between {FAIRNESS_START!r} and {FAIRNESS_END!r} is gone")
    return text[i + len(FAIRNESS_START):j] + "\n"


def _hook(tag: str) -> ast.stmt:
    return ast.parse(f"__tenantry_hook__({tag!r}, locals())").body[0]


def instrument_serve(source: str) -> str:
    """fairness.py with three read-only calls in ``serve``'s loop: ``begin`` after the idle
    jump (the step's start time is ``now``), ``pre`` after arrivals and admission (before
    the batch is computed), ``post`` after the step's clock and finishes (before the
    run-length stop).  Each passes ``locals()``; the decisions are the program's own.

    Raises:
        SeedChanged: when ``serve``'s loop does not have the three places.
    """
    tree = ast.parse(source)
    serve = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "serve"), None)
    loop = next((n for n in (serve.body if serve else ()) if isinstance(n, ast.While)), None)
    if loop is None:
        raise SeedChanged("seed 001: fairness.py has no serve() with a while loop")
    body = loop.body
    text = [ast.unparse(s) for s in body]
    try:
        begin = next(k for k, t in enumerate(text) if t.startswith("if not prefilling and (not running)"))
        pre = next(k for k, t in enumerate(text) if t.startswith("tokens, left, finished ="))
        post = next(k for k, t in enumerate(text) if t.startswith("if now > 3 * SIM"))
    except StopIteration:
        raise SeedChanged("seed 001: serve()'s loop changed (idle jump, batch start or stop test not found)") from None
    loop.body = body[:begin + 1] + [_hook("begin")] + body[begin + 1:pre] + [_hook("pre")] + body[pre:post] + [
        _hook("post")] + body[post:]
    return ast.unparse(ast.fix_missing_locations(tree))


@lru_cache(maxsize=1)
def fairness_module() -> types.ModuleType:
    """fairness.py, instrumented (:func:`instrument_serve`), loaded in memory."""
    return load_module("seed001_fairness", instrument_serve(fairness_source()))


#: fairness.py's policy names -> what they claim, in tenantry's terms.
FAIRNESS_POLICIES = ("FCFS", "rate limit", "VTC")


def ample_context_tokens() -> int:
    """The longest request (tokens) for which fairness.py's pool is ample (SPEC.md 7.0):
    MAX_SEQS sequences of it fit the KV_CAP-token pool, in whole blocks (5,072 tokens)."""
    m = fairness_module()
    return (m.KV_CAP // BLOCK_SIZE_TOKENS // m.MAX_SEQS) * BLOCK_SIZE_TOKENS


def fairness_config(policy: str, tenants: Iterable[str], *, ample: bool = False) -> tuple[Config, tuple[str, ...]]:
    """The configuration fairness.py claims under ``policy`` and the claim ids: its
    replica (256 sequences, 512 tokens per step, a 1.3 M-token pool) with FCFS order
    (``FCFS``: FCFS-TIER, FCFS-TENANT), FCFS behind a per-tenant request-rate limit of
    2 requests/s, burst 4 (``rate limit``: REQUEST-RATE as well), or VTC with
    w_in = 1, w_out = 2 and the counter lift (``VTC``: VTC-GAP, NO-BANKED-CREDIT,
    FCFS-TENANT, and WORK-CONSERVING, which the lesson states: "If only one tenant has
    work, it gets the whole replica").

    fairness.py has no context limit, and its pool is not ample for 256 sequences of
    its own 8,000-token prompts, so VTC-GAP (claimed only with ample KV) does not
    apply to its claims as they stand.  ``ample``: claim a context limit of
    :func:`ample_context_tokens`, which makes it apply, for workloads within it.
    """
    from tenantry.model.config import AdmissionConfig, OrderConfig, TenantConfig

    m = fairness_module()
    rate = {"request_rate_per_s": 2.0, "request_burst": 4.0} if policy == "rate limit" else {}
    cfg = Config(
        tenants=tuple(TenantConfig(n, **rate) for n in tenants), block_size_tokens=BLOCK_SIZE_TOKENS,
        num_blocks=m.KV_CAP // BLOCK_SIZE_TOKENS, max_num_seqs=m.MAX_SEQS, token_budget=m.BUDGET,
        **({"max_context_tokens": ample_context_tokens()} if ample else {}),
        order=OrderConfig(policy="vtc" if policy == "VTC" else "fcfs", w_in=m.W_IN, w_out=m.W_OUT, lift=True),
        admission=AdmissionConfig(request_rate_limit=policy == "rate limit", queue_bound=False, kv_cap=False))
    claims = {"FCFS": ("FCFS-TIER", "FCFS-TENANT"), "rate limit": ("FCFS-TIER", "FCFS-TENANT", "REQUEST-RATE"),
              "VTC": ("VTC-GAP", "NO-BANKED-CREDIT", "FCFS-TENANT", "WORK-CONSERVING")}[policy]
    return cfg, claims


def fairness_fixture(duration_s: float = 10.0) -> Workload:
    """fairness.py's own workload: its ``arrivals()`` (seed 9, its three tenants) over the first
    ``duration_s`` seconds of its 300-s run, as tenantry requests (ids in arrival order)."""
    m = fairness_module()
    sim = m.SIM
    try:
        m.SIM = duration_s
        reqs = m.arrivals()
    finally:
        m.SIM = sim
    return Workload(tuple(Request(i, r.tenant, r.arrival, r.prompt, r.output) for i, r in enumerate(reqs)))


def run_fairness(workload: Workload, policy: str, *, ample: bool = False) -> tuple[History, list[str]]:
    """Run fairness.py's ``serve`` under ``policy`` on ``workload`` and record what it decided.

    The tenants are the workload's (fairness.py's tenant table is replaced for the run);
    ``ample``: see :func:`fairness_config`.
    Returns the history and, one line per request, fairness.py's own first-token and
    finish times (its ``Req.first`` / ``Req.done``) where they differ from those its
    batches imply.
    """
    m = fairness_module()
    tenants = workload.tenants
    cfg, claims = fairness_config(policy, tenants, ample=ample)
    rec = Recording(cfg, scheduler=f"seed 001 fairness.py, policy {policy}", claims=claims)
    reqs, rid = [], {}
    for r in workload.requests:  # in arrival order, as fairness.py wants them
        rec.offer(r)
        q = m.Req(r.tenant, r.arrival_s, r.prompt_tokens, r.output_tokens, r.prompt_tokens)
        reqs.append(q)
        rid[id(q)] = r.request_id
    by_rid = {rid[id(q)]: q for q in reqs}
    blocks = lambda q: cfg.blocks_for(q.prompt + q.output)
    state: dict[str, Any] = {"order": [], "before": set()}
    odd: list[str] = []

    def hook(tag: str, L: dict) -> None:
        if tag == "begin":
            state.update(start_s=L["now"], i=L["i"])
            return
        if tag == "pre":
            arrived = reqs[state["i"]:L["i"]]
            state["answers"] = [(rid[id(q)], "rate_limit" if q.first == -1.0 else None) for q in arrived]
            entered = [q for q in L["prefilling"] if id(q) not in state["before"]]
            state["scheduled"] = [rid[id(q)] for q in entered]
            state["order"] += [id(q) for q in entered]
            state["decode"] = [q for _, _, q in L["running"]]
            state["prefill"] = [(q, q.left) for q in L["prefilling"]]
            return
        end_s = L["now"]
        batch = [(rid[id(q)], 1) for q in state["decode"]]
        batch += [(rid[id(q)], left - q.left) for q, left in state["prefill"] if left - q.left > 0]
        live = {id(q) for q in L["prefilling"]} | {id(q) for _, _, q in L["running"]}
        state["order"] = [x for x in state["order"] if x in live]
        state["before"] = {id(q) for q in L["prefilling"]} | {id(q) for _, _, q in L["running"]}
        by_id = {id(q): q for q in reqs}
        running = [rid[x] for x in state["order"]]
        rec.step(
            state["start_s"], end_s - state["start_s"], batch=batch, running=running,
            queued={n: len(L["queues"][n]) for n in tenants}, answers=state["answers"],
            scheduled=state["scheduled"], held={rid[x]: blocks(by_id[x]) for x in state["order"]},
            counters=dict(L["counter"]) if policy == "VTC" else None)

    saved = dict(m.TENANTS)
    m.TENANTS.clear()
    m.TENANTS.update({n: (0.0, 0, 0) for n in tenants})
    m.__tenantry_hook__ = hook
    try:
        m.serve(reqs, policy)
    finally:
        m.TENANTS.clear()
        m.TENANTS.update(saved)
        del m.__tenantry_hook__
    h = rec.history()
    for r in h.requests:  # fairness.py's own times against those its batches imply
        q, odd_here = by_rid[r.request_id], []
        for what, own, implied in (("first token", q.first, r.first_token_s), ("finish", q.done, r.finish_s)):
            own = None if own in (math.inf, -1.0) else own
            if r.outcome != "rejected" and own != implied:
                odd_here.append(f"{what} at {own!r} s, its batches' at {implied!r} s")
        if odd_here:
            odd.append(f"request {r.request_id}: fairness.py says " + "; ".join(odd_here))
    return h, odd


# --- seed 002 / 004: the lab's MultiTenantScheduler ---------------------------------------------

#: SHA-256 of the lab's code as extracted from seed 002 (lines without indentation).
LAB_FLAT_SHA256 = "d70ba87cf69508e3ac3c40b62890a242341577f913eb9bf794b8751f2e9e3626"
#: Block level of the lines (1-based, of the extracted code) whose level the rules of
#: :func:`reindent` cannot tell: the first statement after a block that ends without a
#: ``return``/``continue``/``break``/``raise``.  Chosen by reading the program, and
#: checked by the rebuilt program printing the seed's saved results exactly.
LAB_LEVELS = {106: 3, 110: 3, 163: 3, 165: 2, 195: 3, 273: 2, 283: 3, 358: 4, 360: 3, 374: 2, 419: 1, 430: 1,
              441: 1, 465: 1, 468: 1, 517: 0}
#: Where the lab's code starts (the line after this suffix) and ends (a line starting
#: with this prefix; the prose that follows was glued to it) in seed 002.
LAB_START_SUFFIX, LAB_END_PREFIX = "Read lab.py", "main()This fixture"
#: The saved results printed in seed 002, between these two lines.
LAB_RESULT_START, LAB_RESULT_END = "Inspect the complete local result", "This image is"


def lab_flat_lines() -> list[str]:
    """The lab's code lines as seed 002 holds them (no indentation), checked against
    :data:`LAB_FLAT_SHA256` and against seed 004 (the same text on one line).

    Raises:
        SeedChanged: when the code is not found, its text differs from the one
            :data:`LAB_LEVELS` was made for, or seed 004 holds another program.
    """
    lines = seed_text("002").split("\n")
    try:
        start = next(i for i, line in enumerate(lines) if line.endswith(LAB_START_SUFFIX)) + 1
        end = next(i for i, line in enumerate(lines) if line.startswith(LAB_END_PREFIX))
    except StopIteration:
        raise SeedChanged(f"seed 002: the lab's code between {LAB_START_SUFFIX!r} and {LAB_END_PREFIX!r} is gone") from None
    code = lines[start:end] + ["main()"]
    digest = hashlib.sha256(("\n".join(code) + "\n").encode()).hexdigest()
    if digest != LAB_FLAT_SHA256:
        raise SeedChanged(f"seed 002: the lab's code changed (sha256 {digest}, LAB_LEVELS was made for "
                          f"{LAB_FLAT_SHA256}); re-derive LAB_LEVELS")
    collapse = lambda t: re.sub(r"\s+", " ", t).strip()
    if collapse(" ".join(code)) != collapse(seed_text("004")):
        raise SeedChanged("seed 004 no longer holds the program of seed 002 (whitespace aside)")
    return code


_OPENER = re.compile(r"(if|elif|else|for|while|try|except|finally|with|def|class)\b")
_CLAUSE = {"elif": ("if", "elif"), "else": ("if", "elif", "for", "while", "try", "except"),
           "except": ("try", "except"), "finally": ("try", "except", "else")}


def _depth(line: str, depth: int = 0) -> int:
    """Bracket depth after ``line`` (string literals and comments skipped)."""
    i, n = 0, len(line)
    while i < n:
        c = line[i]
        if c == "#":
            break
        if c in "\"'":
            q = line[i:i + 3] if line[i:i + 3] in ('"""', "'''") else c
            j = line.find(q, i + len(q))
            i = n if j < 0 else j + len(q)
            continue
        depth += (c in "([{") - (c in ")]}")
        i += 1
    return depth


def _code(line: str) -> str:
    """``line`` without a trailing comment (strings kept), stripped."""
    out, i, n = [], 0, len(line)
    while i < n and line[i] != "#":
        if line[i] in "\"'":
            q = line[i:i + 3] if line[i:i + 3] in ('"""', "'''") else line[i]
            j = line.find(q, i + len(q))
            j = n if j < 0 else j + len(q)
            out.append(line[i:j])
            i = j
        else:
            out.append(line[i])
            i += 1
    return "".join(out).strip()


def reindent(lines: list[str], levels: dict[int, int]) -> str:
    """Python source from lines that lost their indentation (4 spaces per block level).

    A statement's level: the level in ``levels`` (1-based line number) when given;
    else ``class`` and decorators at 0 (the program has no nested class), a ``def``
    whose first parameter is ``self`` in the innermost class, another ``def`` at the
    body level of the innermost method (a nested function) or at 0, ``elif``/``else``/
    ``except``/``finally`` at their opener's level; else one level in after a line
    ending a block header with ``:``, one level out after ``return``/``raise`` (out of
    the function when at its body's level), ``continue``/``break``/``pass``, and the
    same level otherwise.  Lines inside brackets are continuation lines.
    """
    out: list[str] = []
    stack: list[tuple[int, str, bool]] = [(-1, "module", False)]  # (level, opener, is a method)
    level, depth, stmt_level = 0, 0, 0
    for no, raw in enumerate(lines, 1):
        s = raw.strip()
        if depth > 0:  # a continuation line: its indentation does not matter
            out.append("    " * (stmt_level + 1) + s)
            depth = _depth(s, depth)
            continue
        if not s or s.startswith("#"):
            out.append("    " * level + s)
            continue
        word = re.split(r"[\s(:]", s, maxsplit=1)[0]
        if no in levels:
            level = levels[no]
        elif word == "class" or s.startswith("@"):
            level = 0
        elif word == "def" and (re.match(r"def \w+\(\s*self\b", s) or (s.endswith("(") and no < len(lines)
                                                                    and lines[no].strip().startswith("self"))):
            level = max(lv for lv, kind, _ in stack if kind == "class") + 1
        elif word == "def":
            methods = [lv for lv, _, method in stack if method]
            level = methods[-1] + 1 if methods else 0
        elif word in _CLAUSE:
            while not (stack[-1][1] in _CLAUSE[word] and stack[-1][0] <= level):
                stack.pop()
            level = stack[-1][0]
        while stack[-1][0] >= level:
            stack.pop()
        out.append("    " * level + s)
        depth, stmt_level = _depth(s), level
        logical, j, d = s, no, depth
        while d > 0 and j < len(lines):
            logical += " " + lines[j].strip()
            d = _depth(lines[j].strip(), d)
            j += 1
        code, opener = _code(logical), _OPENER.match(s)
        first = code.split()[0] if code else ""
        if code.endswith(":") and opener:
            stack.append((level, opener.group(1), opener.group(1) == "def" and stack[-1][1] == "class"))
            level += 1
        elif first in ("return", "raise") and stack[-1][1] == "def" and stack[-1][0] == level - 1:
            stack.pop()
            level -= 1
        elif first in ("return", "raise", "continue", "break", "pass"):
            level -= 1
    return "\n".join(out) + "\n"


def lab_saved_results() -> dict:
    """The results seed 002 printed for ``python3 lab.py`` (its JSON).

    Raises:
        SeedChanged: when they are not found or are not JSON.
    """
    lines = seed_text("002").split("\n")
    try:
        start = next(i for i, line in enumerate(lines) if line.startswith(LAB_RESULT_START)) + 1
        end = next(i for i, line in enumerate(lines) if line.startswith(LAB_RESULT_END))
        return json.loads("\n".join(lines[start:end]))
    except (StopIteration, ValueError):
        raise SeedChanged("seed 002: the saved JSON results of lab.py are gone or unreadable") from None


@lru_cache(maxsize=1)
def lab_module() -> types.ModuleType:
    """The lab program rebuilt (:func:`reindent`) and loaded in memory.

    Raises:
        SeedChanged: see :func:`lab_flat_lines`; or when the rebuilt program does not
            reproduce the seed's saved results exactly (then :data:`LAB_LEVELS` is wrong).
    """
    m = load_module("seed002_lab", reindent(lab_flat_lines(), LAB_LEVELS))
    saved, ours = lab_saved_results(), m.simulate_noisy_neighbor()
    saved.pop("execution_mode", None)
    if json.loads(json.dumps(ours)) != saved:
        raise SeedChanged("the rebuilt lab.py does not print the results saved in seed 002: LAB_LEVELS is wrong")
    return m


#: The lab's 429 reasons in tenantry's words: a KV watermark, the estimated queue wait
#: over the lane's limit, the batch tenant's service-token bucket.
LAB_REASONS = {"shed_kv_watermark": "kv_watermark", "shed_queue_wait_slo": "estimated_wait",
               "shed_tenant_token_quota": "token_bucket"}
#: The lab's lanes as tiers: interactive above batch.
LAB_TIERS = {"interactive": 0, "batch": 1}
#: The lab's own decisions are read from these functions' frames when it builds an outcome.
LAB_DECIDERS = ("enqueue_arrivals", "_run_service_token_drr", "_run_request_count_fifo")


def lab_quotas(workload: Workload, batch: Iterable[str] = ()) -> list:
    """The lab's quotas for the workload's tenants: those in ``batch`` in the batch lane with the
    fixture's batch quota (weight 1, 28,000 service tokens of burst, 60,000 per second), the others
    interactive with the fixture's chat quota (weight 1, 48,000 and 180,000 per second: the lab
    enforces buckets on the batch lane only)."""
    m, batch = lab_module(), set(batch)
    return [m.TenantQuota(n, 1.0, 28_000, 60_000, "batch") if n in batch else
            m.TenantQuota(n, 1.0, 48_000, 180_000, "interactive") for n in workload.tenants]


def lab_fixture() -> tuple[list, Workload]:
    """The lab's own noisy-neighbour fixture (60 requests, three tenants) as its quotas and
    a tenantry workload (ids 0..59 in the fixture's order, times in seconds)."""
    m = lab_module()
    quotas, reqs = m.build_noisy_neighbor_workload()
    return quotas, Workload(tuple(Request(i, r.tenant_id, r.arrival_ms / 1000.0, r.prefill_tokens, r.decode_tokens)
                                  for i, r in enumerate(reqs)))


def lab_config(quotas: list, *, mode: str, admission_control: bool,
               wait_promise: bool = False) -> tuple[Config, tuple[str, ...]]:
    """What the lab's ``MultiTenantScheduler`` (default settings) claims, in tenantry's terms,
    and the claim ids.

    ``service_token_drr``: DRR over weighted tokens with w_in = 1, w_out = 4 (its decode
    weight), quantum 1,200 per unit weight, no carry bound (the lab has none), an idle
    tenant's deficit reset, the lanes as strict tiers (interactive 0, batch 1;
    DRR-DEFICIT, NO-BANKED-CREDIT, FCFS-TENANT, TIER-ORDER); a pool of 1,600 blocks of 16
    tokens.  With admission control: KV watermarks 0.90 and 0.65 of the pool counting
    queued blocks (``kv_watermark_queued``), estimated-wait shedding at 420 ms and 3,500 ms
    with 45,000 service tokens per second, and each batch tenant's service-token bucket
    as a token bucket that reserves the output (TOKEN-BUCKET, TOKEN-LIMIT; the lab charges
    prompt + 4 x output, more than tenantry's prompt + output, so its bucket is the
    stricter one).  ``request_count_fifo``: request round robin, no lanes (FCFS-TENANT);
    with admission control, one watermark of 0.90 on the blocks in use, which the lab
    checks at dispatch only.  examples/gateway_lab/ holds the same claims as TOML for the
    reference model (there with a carry bound and 16 seats, its own choices).

    ``wait_promise``: also read the lab's wait limits (420 ms interactive, 3,500 ms batch)
    as a promise, each tenant's ``max_wait_s`` (BOUNDED-WAIT).  The lab sheds on an
    *estimated* wait (its lane's queued service tokens / 45 per ms); this reading is
    stronger than what it says, and is kept apart from its own claims.
    """
    from tenantry.model.config import AdmissionConfig, OrderConfig, TenantConfig

    m = lab_module()
    s = m.MultiTenantScheduler(quotas)
    drr = mode == "service_token_drr"
    tenants = []
    for q in quotas:
        bucket = ({"token_rate_per_s": float(q.sustained_service_tokens_per_sec),
                   "token_burst_tokens": float(q.burst_service_tokens)}
                  if drr and admission_control and q.priority_class == "batch" else {})
        if wait_promise:
            bucket["max_wait_s"] = (s.max_interactive_wait_ms if q.priority_class == "interactive"
                                    else s.max_batch_wait_ms) / 1000.0
        tier = LAB_TIERS[q.priority_class] if drr else 0  # request_count_fifo has no lanes
        tenants.append(TenantConfig(q.tenant_id, weight=q.weight, tier=tier, **bucket))
    admission = AdmissionConfig(queue_bound=False, kv_cap=False)
    if admission_control and drr:
        admission = AdmissionConfig(
            queue_bound=False, kv_cap=False, kv_watermarks=(s.interactive_kv_watermark, s.batch_kv_watermark),
            kv_watermark_queued=True, wait_limits_s=(s.max_interactive_wait_ms / 1000.0, s.max_batch_wait_ms / 1000.0),
            wait_service_rate_tokens_per_s=s.cluster_service_tokens_per_ms * 1000.0, token_bucket=True,
            reserve_output=True)
    elif admission_control:
        admission = AdmissionConfig(queue_bound=False, kv_cap=False, kv_watermarks=(s.interactive_kv_watermark,))
    cfg = Config(
        tenants=tuple(tenants), block_size_tokens=BLOCK_SIZE_TOKENS, num_blocks=s.total_kv_blocks,
        order=OrderConfig(policy="drr_tokens", w_in=1.0, w_out=float(s.decode_weight),
                          drr_quantum=float(s.base_quantum_tokens), drr_carry_bound=None, drr_reset_when_idle=True,
                          strict_tiers=True)
        if drr else OrderConfig(policy="round_robin"), admission=admission)
    claims = ("DRR-DEFICIT", "NO-BANKED-CREDIT", "FCFS-TENANT", "TIER-ORDER") if drr else ("FCFS-TENANT",)
    if drr and admission_control:
        claims += ("TOKEN-BUCKET", "TOKEN-LIMIT")
    return cfg, claims + (("BOUNDED-WAIT",) if wait_promise else ())


def run_lab(workload: Workload, quotas: list, *, mode: str, admission_control: bool,
            wait_promise: bool = False) -> History:
    """Run the lab's scheduler (default settings, ``scheduling_mode=mode``) on ``workload`` and
    record each outcome as a request record (no steps: it has none).

    Arrivals are whole milliseconds (the lab's ``arrival_ms``), rounded from ``arrival_s``.
    Each outcome is recorded when the lab builds it, with the time it was decided, read
    from the deciding function's locals: a refusal at arrival (``enqueue_arrivals``, at
    its ``eval_ms``: the lab judges arrivals between dispatches) is refused at admission;
    a refusal at dispatch (``shed_kv_watermark`` of a queued request, at ``clock_ms``) is
    a refusal after admission; a dispatch starts at arrival + ``wait_ms``, gives its first
    token ``prefill_ms`` later and finishes ``exec_ms`` later (the lab's clock moves by
    ``exec_ms``; it holds the KV blocks 5.5 times as long, which no record field holds).

    Raises:
        SeedChanged: when an outcome is built by another function than :data:`LAB_DECIDERS`
            or without the locals named above.
    """
    m = lab_module()
    cfg, claims = lab_config(quotas, mode=mode, admission_control=admission_control, wait_promise=wait_promise)
    tier = {q.tenant_id: q.priority_class for q in quotas}
    rec = Recording(cfg, scheduler=f"seed 002/004 lab.py MultiTenantScheduler, {mode}, admission control "
                    f"{'on' if admission_control else 'off'}", claims=claims)
    lab_reqs, rid = [], {}
    for r in workload.requests:
        arrival_ms = int(round(r.arrival_s * 1000))
        rec.offer(Request(r.request_id, r.tenant, arrival_ms / 1000.0, r.prompt_tokens, r.output_tokens))
        name = f"r{r.request_id:06d}"
        rid[name] = r.request_id
        lab_reqs.append(m.InferenceRequest(name, r.tenant, arrival_ms, r.prompt_tokens, r.output_tokens,
                                           tier[r.tenant]))
    arrival = {x.request_id: x.arrival_ms for x in lab_reqs}
    real = m.ScheduledOutcome

    def outcome(**kw: Any) -> Any:
        f = sys._getframe(1)
        where, L = f.f_code.co_name, f.f_locals
        try:
            i = rid[kw["request_id"]]
            if where == "enqueue_arrivals":
                rec.settle(i, admitted=False, reason=LAB_REASONS[kw["reason"]], finish_s=L["eval_ms"] / 1000.0)
            elif where in LAB_DECIDERS and kw["status_code"] == 429:
                rec.settle(i, admitted=True, reason=LAB_REASONS[kw["reason"]], finish_s=L["clock_ms"] / 1000.0)
            elif where in LAB_DECIDERS:
                start_ms = arrival[kw["request_id"]] + L["wait_ms"]
                rec.settle(i, admitted=True, start_s=start_ms / 1000.0,
                           first_token_s=(start_ms + L["prefill_ms"]) / 1000.0,
                           finish_s=(start_ms + L["exec_ms"]) / 1000.0)
            else:
                raise KeyError(where)
        except KeyError as e:
            raise SeedChanged(f"the lab built an outcome in {where} without {e} (its code changed)") from None
        return real(**kw)

    sched = m.MultiTenantScheduler(quotas, scheduling_mode=mode, enable_admission_control=admission_control)
    m.ScheduledOutcome = outcome
    try:
        sched.run_trace(lab_reqs)
    finally:
        m.ScheduledOutcome = real
    return rec.history()
