"""Trace I/O: real LLM-serving traces in, replayable workload files out.

Formats: Azure LLM inference trace 2023 CSV (wall-clock timestamps, 100 ns);
Mooncake FAST'25 JSON Lines (ms timestamps, one chained hash id per 512 prompt
tokens); BurstGPT CSV (seconds from the trace's start; model, log type or
session as the tenant); the project's workload JSON Lines (:class:`Request`
field names).
Readers return requests with ids 0, 1, ... (callers renumber when composing);
times are seconds, lengths tokens.  Bad input raises one :class:`ConfigError`,
one line ``file:line: field=value: why``.  Writers are deterministic (same
workload, same bytes) and atomic (:func:`~tenantry.runner.files.atomic_write_text`).
"""

from __future__ import annotations

import csv
import datetime as dt
import importlib.resources
import itertools
import json
import math
import os
import re
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import attrs
import numpy as np

from tenantry.model.config import ConfigError
from tenantry.model.workload import Request, Workload, renumber

from .files import atomic_write_text, json_lines as _json_lines, text_lines as _text_lines

#: Tokens covered by one Mooncake hash id.
MOONCAKE_BLOCK_TOKENS = 512
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
#: BurstGPT's columns (Wang et al., "BurstGPT: A Real-world Workload Dataset to Optimize LLM Serving
#: Systems", 2024): the six of the release files, and the two more of the session variant.
BURSTGPT_COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type")
BURSTGPT_SESSION_COLUMNS = ("Session ID", "Elapsed time")
#: What names a BurstGPT request's tenant: its column.
BURSTGPT_TENANT_COLUMNS = {"model": "Model", "log_type": "Log Type", "session": "Session ID"}
_REQUIRED = ("request_id", "tenant", "arrival_s", "prompt_tokens", "output_tokens")
_OPTIONAL = ("prefix_ids", "predicted_output_tokens", "prompt_bytes", "cancel_s")
_TS = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:\.(\d{1,7}))?")
_EPOCH = dt.datetime(1970, 1, 1)
_TICKS = 10**7  # 100 ns ticks per second, the Azure timestamps' resolution
_SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _count(v: Any, field: str, where: str) -> int:
    """A token count (an int, or a decimal string in CSV) >= 0; 0 is clamped to 1."""
    if isinstance(v, str) and re.fullmatch(r"\s*-?\d+\s*", v):
        v = int(v)
    if not _is_int(v) or v < 0:
        raise ConfigError(field, v, "must be an integer token count >= 0", where)
    return max(v, 1)


def _finite(v: Any, field: str, *, low: float, strict: bool, where: str = "") -> None:
    ok = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) and (v > low if strict else v >= low)
    if not ok:
        raise ConfigError(field, v, f"must be a finite number {'>' if strict else '>='} {low}", where)


def _check_max_rows(max_rows: int | None) -> None:
    if max_rows is not None and (not _is_int(max_rows) or max_rows < 0):
        raise ConfigError("max_rows", max_rows, "must be None or an integer >= 0")


def _ticks(ts: Any, where: str, field: str = "TIMESTAMP") -> int:
    """Parse ``YYYY-MM-DD HH:MM:SS[.fffffff]`` to 100 ns ticks since 1970 (naive clock)."""
    m = _TS.fullmatch(ts.strip()) if isinstance(ts, str) else None
    try:
        base = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S") if m else None
    except ValueError:
        base = None
    if base is None:
        raise ConfigError(field, ts, "unparseable timestamp; expected YYYY-MM-DD HH:MM:SS.fffffff", where)
    frac = int((m.group(2) or "").ljust(7, "0"))
    return (base - _EPOCH) // dt.timedelta(seconds=1) * _TICKS + frac


def read_azure_csv(path: str | os.PathLike, tenant: str, *, max_rows: int | None = None,
                   start: str | None = None) -> tuple[Request, ...]:
    """Read an Azure LLM inference trace 2023 CSV file.

    Columns ``TIMESTAMP``, ``ContextTokens`` (prompt tokens), ``GeneratedTokens``
    (output tokens); extra columns are ignored; LF or CRLF line endings.
    ``arrival_s`` is seconds since the first row's timestamp, or since ``start``
    (same format) when given, at 100 ns resolution.  A token count of 0 is
    clamped to 1 (a :class:`Request` needs >= 1; the 2023 files hold none).
    At most ``max_rows`` data rows are read.  Ids are 0, 1, ... in file order.

    Raises:
        ConfigError: ``file:line`` with the field and value, for a missing
            column (naming the header seen), a non-numeric or negative count,
            an unparseable timestamp, a timestamp before the previous row's
            (naming both) or before ``start``.
    """
    _check_max_rows(max_rows)
    reader = csv.reader(line for _, line in _text_lines(path))  # a stream, with the readers' size limits
    try:
        return tuple(_azure_rows(reader, path, tenant, max_rows, None if start is None else _ticks(start, "", "start")))
    except csv.Error as e:
        raise ConfigError("csv", str(e), "malformed CSV", f"{path}:{reader.line_num}") from None


def _azure_rows(reader: Any, path: Any, tenant: str, max_rows: int | None, origin: int | None) -> Iterator[Request]:
    header = [h.strip() for h in next(reader, [])]
    for col in AZURE_COLUMNS:
        if col not in header:
            raise ConfigError("header", header, f"missing column {col!r}", f"{path}:1")
    idx = [header.index(c) for c in AZURE_COLUMNS]
    prev: tuple[int, str, int] | None = None
    n = 0
    for row in reader:
        if max_rows is not None and n >= max_rows:
            return
        if not row:
            continue
        where = f"{path}:{reader.line_num}"
        for col, i in zip(AZURE_COLUMNS, idx):
            if i >= len(row):
                raise ConfigError(col, None, f"missing: row has {len(row)} fields, header {header}", where)
        ts, ctx, gen = (row[i] for i in idx)
        t = _ticks(ts, where)
        if prev is not None and t < prev[0]:
            raise ConfigError("TIMESTAMP", ts, f"goes backwards: earlier than {prev[1]!r} on line {prev[2]}", where)
        prev = (t, ts, reader.line_num)
        origin = t if origin is None else origin
        if t < origin:
            raise ConfigError("TIMESTAMP", ts, "before the given start", where)
        yield Request(n, tenant, (t - origin) / _TICKS,
                      _count(ctx, "ContextTokens", where), _count(gen, "GeneratedTokens", where))
        n += 1


def _block_ratio(block_size_tokens: Any) -> int:
    if not _is_int(block_size_tokens) or block_size_tokens <= 0 or MOONCAKE_BLOCK_TOKENS % block_size_tokens:
        raise ConfigError("block_size_tokens", block_size_tokens, f"must be a positive divisor of {MOONCAKE_BLOCK_TOKENS}")
    return MOONCAKE_BLOCK_TOKENS // block_size_tokens


def read_mooncake_jsonl(path: str | os.PathLike, tenant: str, *, block_size_tokens: int = 16,
                        max_rows: int | None = None) -> tuple[Request, ...]:
    """Read a Mooncake FAST'25 trace (JSON Lines).

    ``arrival_s`` = ``timestamp`` / 1000 (the trace's own origin is kept).
    Each 512-token ``hash_ids`` entry h becomes 512 / block_size_tokens model
    blocks with content ids ``h * (512 // block_size_tokens) + j``, injective in
    (h, j); only blocks lying wholly inside ``input_length`` get an id, so
    ``len(prefix_ids) <= input_length // block_size_tokens``.  Token counts of 0
    are clamped to 1.  Extra keys are ignored.  Ids are 0, 1, ... in file order.

    Raises:
        ConfigError: if 512 % block_size_tokens != 0; ``file:line`` with the
            field and value for bad JSON, a missing field, a non-integer or
            negative count or hash id, a bad timestamp, or a timestamp before
            the previous line's (naming both).
    """
    per = _block_ratio(block_size_tokens)
    _check_max_rows(max_rows)
    out: list[Request] = []
    prev: tuple[float, str] | None = None
    for where, obj in _json_lines(path):
        if max_rows is not None and len(out) >= max_rows:
            break
        for f in MOONCAKE_FIELDS:
            if f not in obj:
                raise ConfigError(f, None, f"missing field; have {sorted(obj)}", where)
        ts, hashes = obj["timestamp"], obj["hash_ids"]
        _finite(ts, "timestamp", low=0, strict=False, where=where)
        if prev is not None and ts < prev[0]:
            raise ConfigError("timestamp", ts, f"goes backwards: earlier than {prev[0]!r} on {prev[1]}", where)
        prev = (ts, where)
        bad = [h for h in hashes if not (_is_int(h) and h >= 0)] if isinstance(hashes, list) else [hashes]
        if bad:
            raise ConfigError("hash_ids", bad[0], "must be a list of integers >= 0", where)
        prompt = _count(obj["input_length"], "input_length", where)
        output = _count(obj["output_length"], "output_length", where)
        ids = [h * per + j for h in hashes for j in range(per)][: prompt // block_size_tokens]
        out.append(Request(len(out), tenant, ts / 1000, prompt, output, tuple(ids)))
    return tuple(out)


def read_burstgpt_csv(path: str | os.PathLike, *, tenant_by: str = "model", failed: str = "drop",
                      max_rows: int | None = None) -> tuple[Request, ...]:
    """Read a BurstGPT trace (CSV with a header; the 6-column release format
    ``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`` or the
    8-column one with ``Session ID,Elapsed time`` after them; extra columns ignored).

    ``arrival_s`` = ``Timestamp`` (seconds from the trace's start, as published) minus
    the first row's, so the workload starts at 0.  The tenant is the value of the
    ``tenant_by`` column: ``model`` (``Model``, e.g. ChatGPT or GPT-4), ``log_type``
    (``Log Type``: conversation or API log) or ``session`` (``Session ID``, as
    ``s<id>``; the 8-column files only).  A failed request (0 response tokens, as
    the trace records a failure) is dropped (``failed="drop"``, default) or kept
    with one output token (``"keep"``: it still took its prefill).  A prompt of 0
    tokens is clamped to 1.  At most ``max_rows`` data rows are read (dropped ones
    count).  Ids are 0, 1, ... in file order.

    Raises:
        ConfigError: an unknown ``tenant_by`` or ``failed``; ``file:line`` with the
            field and value for a missing column (naming the header seen), a
            non-numeric or negative count or timestamp, a timestamp earlier than the
            previous row's (naming both), an empty tenant value, malformed CSV.
    """
    if tenant_by not in BURSTGPT_TENANT_COLUMNS:
        raise ConfigError("tenant_by", tenant_by, f"must be one of {', '.join(BURSTGPT_TENANT_COLUMNS)}")
    if failed not in ("drop", "keep"):
        raise ConfigError("failed", failed, "must be drop or keep")
    _check_max_rows(max_rows)
    reader = csv.reader(line for _, line in _text_lines(path))
    try:
        return tuple(_burstgpt_rows(reader, path, tenant_by, failed, max_rows))
    except csv.Error as e:
        raise ConfigError("csv", str(e), "malformed CSV", f"{path}:{reader.line_num}") from None


def _burstgpt_rows(reader: Any, path: Any, tenant_by: str, failed: str, max_rows: int | None) -> Iterator[Request]:
    header = [h.strip() for h in next(reader, [])]
    tenant_col = BURSTGPT_TENANT_COLUMNS[tenant_by]
    for col in ("Timestamp", "Request tokens", "Response tokens", tenant_col):
        if col not in header:
            raise ConfigError("header", header, f"missing column {col!r}", f"{path}:1")
    i_ts, i_in, i_out, i_t = (header.index(c) for c in ("Timestamp", "Request tokens", "Response tokens", tenant_col))
    origin: float | None = None
    prev: tuple[float, int] | None = None
    n = rows = 0
    for row in reader:
        if max_rows is not None and rows >= max_rows:
            return
        if not row:
            continue
        rows += 1
        where = f"{path}:{reader.line_num}"
        if len(row) < len(header):
            raise ConfigError(header[len(row)], None, f"missing: row has {len(row)} fields, header {header}", where)
        try:
            ts = float(row[i_ts])
        except ValueError:
            ts = row[i_ts]
        _finite(ts, "Timestamp", low=0, strict=False, where=where)
        if prev is not None and ts < prev[0]:
            raise ConfigError("Timestamp", row[i_ts], f"goes backwards: earlier than {prev[0]!r} on line {prev[1]}",
                              where)
        prev = (ts, reader.line_num)
        origin = ts if origin is None else origin
        out = row[i_out].strip()
        if re.fullmatch(r"0+", out) and failed == "drop":
            continue
        name = row[i_t].strip()
        if not name:
            raise ConfigError(tenant_col, row[i_t], "empty: the tenant of this request", where)
        yield Request(n, f"s{name}" if tenant_by == "session" else name, round(ts - origin, 9),
                      _count(row[i_in], "Request tokens", where), _count(out, "Response tokens", where))
        n += 1


def write_burstgpt_csv(workload: Workload | Iterable[Request], path: str | os.PathLike, *,
                       tenant_as: str = "model", log_type: str = "Conversation log") -> None:
    """Write requests as a BurstGPT CSV (the 6-column release format), atomically.

    ``Timestamp`` = ``arrival_s`` (seconds, shortest round-trip form); the tenant is
    written into the ``Model`` column (``tenant_as="model"``) or the ``Log Type``
    column (``"log_type"``, the model then ``ChatGPT``); ``Total tokens`` = request +
    response.  :func:`read_burstgpt_csv` with the same ``tenant_by`` gives back
    tenants, times and lengths (a workload starting at 0; ids renumbered in file order).

    Raises:
        ConfigError: an unknown ``tenant_as``; a tenant name holding a comma,
            quote or line break (not written quoted, to keep the file plain).
    """
    if tenant_as not in ("model", "log_type"):
        raise ConfigError("tenant_as", tenant_as, "must be model or log_type")

    def lines() -> Iterator[str]:
        yield ",".join(BURSTGPT_COLUMNS)
        for r in workload:
            if re.search(r'[,"\r\n]', r.tenant):
                raise ConfigError("tenant", r.tenant, "cannot be written to a BurstGPT CSV (comma, quote or newline)")
            model, log = (r.tenant, log_type) if tenant_as == "model" else ("ChatGPT", r.tenant)
            yield (f"{r.arrival_s!r},{model},{r.prompt_tokens},{r.output_tokens},"
                   f"{r.prompt_tokens + r.output_tokens},{log}")

    atomic_write_text(path, lines())


#: The ``kind`` of every line of a history file (:func:`tenantry.runner.history.read_history`).
HISTORY_KINDS = ("header", "step", "fleet_step", "request")


def read_workload_jsonl(path: str | os.PathLike) -> Workload:
    """Read the project's workload JSON Lines (one :class:`Request` object per line).

    Required keys: request_id, tenant, arrival_s (s), prompt_tokens,
    output_tokens; optional: prefix_ids (list of ints), predicted_output_tokens,
    prompt_bytes, cancel_s (s; null allowed).  Blank lines are skipped; lines need not be
    sorted (the :class:`Workload` sorts).

    Raises:
        ConfigError: ``file:line`` with the field and value for bad JSON, an
            unknown or missing field, a wrong type or value, or a duplicate id; a
            history file's line (``kind`` header, step, ...) says so and what to run.
    """
    requests: list[Request] = []
    seen: dict[int, str] = {}
    for where, obj in _json_lines(path):
        if obj.get("kind") in HISTORY_KINDS:  # the mirror of read_history on a workload line
            raise ConfigError("kind", obj["kind"], f"this line is a {obj['kind']} line of a history, not a request "
                              f"of a workload: judge a history with tenantry verify --history {path}", where)
        for k in sorted(set(obj) - set(_REQUIRED + _OPTIONAL)):
            raise ConfigError(k, obj[k], f"unknown field; expected {', '.join(_REQUIRED + _OPTIONAL)}", where)
        for k in [k for k in _REQUIRED if k not in obj]:
            raise ConfigError(k, None, "missing field", where)
        if obj.get("prefix_ids") is not None and not isinstance(obj["prefix_ids"], list):
            raise ConfigError("prefix_ids", obj["prefix_ids"], "must be a list of integers", where)
        kwargs = {k: v for k, v in obj.items() if not (k == "prefix_ids" and v is None)}
        try:
            r = Request(**kwargs)
        except ConfigError as e:
            raise ConfigError(e.field, e.value, e.why, where) from None
        if r.request_id in seen:
            raise ConfigError("request_id", r.request_id, f"duplicate; first on {seen[r.request_id]}", where)
        seen[r.request_id] = where
        requests.append(r)
    return Workload(requests, origin=seen)


def _workload_line(r: Request) -> str:
    d: dict[str, Any] = {k: getattr(r, k) for k in _REQUIRED}
    if r.prefix_ids:
        d["prefix_ids"] = list(r.prefix_ids)
    for k in ("predicted_output_tokens", "prompt_bytes", "cancel_s"):
        if getattr(r, k) is not None:
            d[k] = getattr(r, k)
    return json.dumps(d, sort_keys=True, separators=(",", ":"))


def write_workload_jsonl(workload: Workload | Iterable[Request], path: str | os.PathLike) -> None:
    """Write requests as workload JSON Lines, in the given (Workload: arrival) order.

    Deterministic: keys sorted, compact separators, floats in ``repr`` form,
    empty or None optional fields left out.  Atomic: on any error the previous
    file at ``path`` is left unchanged.
    """
    atomic_write_text(path, (_workload_line(r) for r in workload))


def write_azure_csv(workload: Workload | Iterable[Request], path: str | os.PathLike, *,
                    start: str = "2023-11-16 00:00:00", tenant: str | None = None) -> None:
    """Write requests as an Azure 2023 CSV (LF endings), atomically.

    Row timestamp = ``start`` + arrival_s, at 100 ns resolution (7 digits).
    ``tenant`` keeps only that tenant's requests; None merges all tenants (the
    tenant is not recorded).  Requests must come in arrival order (a Workload does).
    :func:`read_azure_csv` with the same ``start`` gives back the arrival times.

    Raises:
        ConfigError: if ``start`` is not a timestamp.
    """
    origin = _ticks(start, "", "start")

    def lines() -> Iterator[str]:
        yield ",".join(AZURE_COLUMNS)
        for r in workload:
            if tenant is None or r.tenant == tenant:
                secs, frac = divmod(origin + round(r.arrival_s * _TICKS), _TICKS)
                stamp = _EPOCH + dt.timedelta(seconds=secs)
                yield f"{stamp:%Y-%m-%d %H:%M:%S}.{frac:07d},{r.prompt_tokens},{r.output_tokens}"

    atomic_write_text(path, lines())


def write_mooncake_jsonl(workload: Workload | Iterable[Request], path: str | os.PathLike, *,
                         block_size_tokens: int = 16, tenant: str | None = None) -> None:
    """Write requests as a Mooncake-style trace (JSON Lines), atomically.

    ``timestamp`` = round(arrival_s * 1000) ms; ``hash_ids`` has one id per
    512 tokens of the prompt.  Prefix ids are grouped 512 / block_size_tokens
    to a hash block: a group of the form ``h * n + 0..`` (as made by
    :func:`read_mooncake_jsonl`) gives back h; any other complete group gets a
    stable id (equal groups behind equal parents share it); blocks with no
    prefix ids, or only part of theirs, get fresh ids unique to the request.
    New ids start above every recovered h and are assigned in request order.
    Reading the file back gives the same tokens, times (to 1 ms), and the same
    sharing structure (identical prefix ids for Mooncake-derived workloads).

    Raises:
        ConfigError: if 512 % block_size_tokens != 0.
    """
    per = _block_ratio(block_size_tokens)
    reqs = [r for r in workload if tenant is None or r.tenant == tenant]

    def recovered(chunk: Sequence[int]) -> int | None:
        ok = chunk and chunk[0] >= 0 and chunk[0] % per == 0 and list(chunk) == list(range(chunk[0], chunk[0] + len(chunk)))
        return chunk[0] // per if ok else None

    groups = [[tuple(r.prefix_ids[i:i + per]) for i in range(0, len(r.prefix_ids), per)] for r in reqs]
    top = max((h for gs in groups for g in gs if (h := recovered(g)) is not None), default=-1)
    table: dict[tuple, int] = {}
    new_ids = itertools.count(top + 1)

    def lines() -> Iterator[str]:
        for r, gs in zip(reqs, groups):
            full, hashes, parent = r.prompt_tokens // block_size_tokens, [], None
            for c in range(-(-r.prompt_tokens // MOONCAKE_BLOCK_TOKENS)):
                g = gs[c] if c < len(gs) else ()
                complete = bool(g) and len(g) == min(per, full - c * per) and (c == 0 or parent is not None)
                h = recovered(g) if complete else None
                if h is None:
                    h = table.get((parent, g)) if complete else None
                    h = next(new_ids) if h is None else h
                    if complete:
                        table[(parent, g)] = h
                parent = h if complete else None
                hashes.append(h)
            d = {"timestamp": round(r.arrival_s * 1000), "input_length": r.prompt_tokens,
                 "output_length": r.output_tokens, "hash_ids": hashes}
            yield json.dumps(d, sort_keys=True, separators=(",", ":"))

    atomic_write_text(path, lines())


@attrs.frozen
class TracePart:
    """One part of a composed workload (see :func:`compose`).

    Attributes:
        requests: the part's requests (any iterable, e.g. a reader's result).
        tenant: new tenant name for all of them; None keeps theirs.
        speedup: time compression (> 0): 2.0 replays twice as fast.
        offset_s: where the part starts in the composed workload (s, >= 0).
        start_s, duration_s: keep only arrivals in [start_s, start_s + duration_s)
            of the original axis (s); None: from 0 / to the end.
    """

    requests: tuple[Request, ...] = attrs.field(converter=tuple)
    tenant: str | None = None
    speedup: float = 1.0
    offset_s: float = 0.0
    start_s: float | None = None
    duration_s: float | None = None

    def __attrs_post_init__(self) -> None:
        _finite(self.speedup, "speedup", low=0, strict=True)
        _finite(self.offset_s, "offset_s", low=0, strict=False)
        if self.start_s is not None:
            _finite(self.start_s, "start_s", low=0, strict=False)
        if self.duration_s is not None:
            _finite(self.duration_s, "duration_s", low=0, strict=True)
        if self.tenant is not None and (not isinstance(self.tenant, str) or not self.tenant):
            raise ConfigError("tenant", self.tenant, "must be a non-empty string or None")

    def transformed(self) -> list[Request]:
        """The window's requests, renamed, with arrival (t - start_s) / speedup + offset_s
        (and a cancellation's ``cancel_s`` re-timed the same way, so it stays after its arrival)."""
        lo = self.start_s or 0.0
        hi = math.inf if self.duration_s is None else lo + self.duration_s
        at = lambda t: (t - lo) / self.speedup + self.offset_s  # noqa: E731
        return [attrs.evolve(r, tenant=self.tenant or r.tenant, arrival_s=at(r.arrival_s),
                             cancel_s=None if r.cancel_s is None else at(r.cancel_s))
                for r in self.requests if lo <= r.arrival_s < hi]


def compose(parts: Sequence[TracePart], *, seed: int | None = None) -> Workload:
    """Merge parts into one workload with ids renumbered 0.. in arrival order.

    Each part is windowed, renamed and re-timed (:meth:`TracePart.transformed`;
    the window start maps to ``offset_s``).  Requests with equal arrival times
    keep part order then their original id order; with ``seed``, such ties are
    broken by a seeded shuffle instead (np.random.default_rng(seed)).
    """
    merged = [r for p in parts for r in sorted(p.transformed(), key=lambda r: r.request_id)]
    tie = np.random.default_rng(seed).permutation(len(merged)) if seed is not None else range(len(merged))
    order = sorted(range(len(merged)), key=lambda i: (merged[i].arrival_s, tie[i]))
    return Workload(renumber(attrs.evolve(merged[i], request_id=k) for k, i in enumerate(order)))


def poisson_tenant(tenant: str, rate_per_s: float, prompt_tokens_mean: float, output_tokens_mean: float,
                   duration_s: float, *, seed: int, cv: float = 0.2, start_s: float = 0.0) -> tuple[Request, ...]:
    """Synthetic Poisson arrivals for one tenant on [start_s, start_s + duration_s).

    Gaps are exponential with mean 1 / rate_per_s (s); prompt and output token
    counts are normal with mean ``*_mean`` and standard deviation cv * mean,
    rounded, and clamped to >= 16 (prompt) and >= 2 (output).  Uses
    np.random.default_rng(seed): the same arguments give the same requests.
    Ids are 0, 1, ...

    Raises:
        ConfigError: on a non-positive rate, mean or duration, or a negative cv or start.
    """
    for name, v in (("rate_per_s", rate_per_s), ("prompt_tokens_mean", prompt_tokens_mean),
                    ("output_tokens_mean", output_tokens_mean), ("duration_s", duration_s)):
        _finite(v, name, low=0, strict=True)
    _finite(cv, "cv", low=0, strict=False)
    _finite(start_s, "start_s", low=0, strict=False)
    rng = np.random.default_rng(seed)
    n = int(rate_per_s * duration_s + 10 * math.sqrt(rate_per_s * duration_s) + 10)
    times = np.cumsum(rng.exponential(1.0 / rate_per_s, size=n))
    while times[-1] < duration_s:  # practically never: n is mean + 10 sigma
        times = np.concatenate([times, times[-1] + np.cumsum(rng.exponential(1.0 / rate_per_s, size=n))])
    times = times[times < duration_s]
    prompts = np.maximum(np.rint(rng.normal(prompt_tokens_mean, cv * prompt_tokens_mean, len(times))), 16)
    outputs = np.maximum(np.rint(rng.normal(output_tokens_mean, cv * output_tokens_mean, len(times))), 2)
    return tuple(Request(i, tenant, start_s + float(t), int(p), int(o))
                 for i, (t, p, o) in enumerate(zip(times, prompts, outputs)))


#: The "seed 001" experiment: tenant -> (requests/s, mean prompt tokens, mean output tokens).
SEED001_TENANTS = {"bulk": (6.0, 8000, 500), "app": (3.0, 1500, 300), "chat": (0.5, 500, 150)}


def seed001_workload(seed: int = 9, duration_s: float = 300.0,
                     rate_scale: Mapping[str, float] | None = None) -> Workload:
    """The three-tenant "seed 001" workload (bulk, app, chat; see SEED001_TENANTS).

    Tenant i uses the seed ``SeedSequence([seed, i]).generate_state(1)[0]``, so the
    tenants' streams are distinct and each is fixed by ``seed``.  ``rate_scale``
    multiplies the named tenants' request rates (the seed-001 study's contended
    variant, where app and chat ask more than an equal share).

    Raises:
        ConfigError: for a scale of an unknown tenant or one that is not positive.
    """
    scale = dict(rate_scale or {})
    for name, x in scale.items():
        if name not in SEED001_TENANTS or not x > 0:
            raise ConfigError("rate_scale", f"{name}={x}", f"a positive factor for one of {', '.join(SEED001_TENANTS)}")
    parts = []
    for i, (name, (rate, p, o)) in enumerate(SEED001_TENANTS.items()):
        sub = int(np.random.SeedSequence([seed, i]).generate_state(1)[0])
        parts.append(TracePart(poisson_tenant(name, rate * scale.get(name, 1.0), p, o, duration_s, seed=sub)))
    return compose(parts)


def excerpt_path(name: str) -> Path:
    """Path of a packaged Azure excerpt: ``name`` is "code" or "conv".

    The excerpts hold the first 10 minutes of each 2023 trace (see data/NOTICE.md).

    Raises:
        ConfigError: for any other name.
    """
    if name not in ("code", "conv"):
        raise ConfigError("name", name, "packaged excerpts are 'code' and 'conv'")
    return Path(str(importlib.resources.files("tenantry.runner") / "data" / f"azure_{name}_excerpt.csv"))


def azure_two_tenant_workload(*, speedup: float = 1.0, max_rows: int | None = None,
                              use_shared: bool | str | os.PathLike = True) -> Workload:
    """The Azure 2023 code and conv traces as tenants "code" and "conv".

    ``use_shared``: a folder holding ``azure_llm_2023_{code,conv}.csv``; True
    uses ``../shared/traces`` beside the repository when present, else the
    packaged 10-minute excerpts; False always uses the excerpts.  Each file's
    times start at 0 at its own first row, divided by ``speedup``; ``max_rows``
    caps each file.  Ids are renumbered 0.. in arrival order.

    Raises:
        ConfigError: if a given folder lacks the files, or on bad rows.
    """
    if isinstance(use_shared, bool):
        folder = _SHARED if use_shared and (_SHARED / "azure_llm_2023_code.csv").exists() else None
    else:
        folder = Path(use_shared)
    parts = []
    for name in ("code", "conv"):
        path = folder / f"azure_llm_2023_{name}.csv" if folder is not None else excerpt_path(name)
        parts.append(TracePart(read_azure_csv(path, name, max_rows=max_rows), speedup=speedup))
    return compose(parts)
