"""The one mapping between a tenantry request and an OpenAI ``/v1/completions`` stream.

Both ends use it: ``tenantry replay`` builds each request's body and headers with
:func:`to_wire` and reads each streamed chunk with :func:`read_chunk`; ``tenantry serve``
reads a request back with :func:`from_wire` and writes its chunks with :func:`chunk` and its
refusals with :func:`refusal`.  SPEC.md 12.1 states the mapping; in short:

* **Prompt**: token ids (``prompt`` is a list of integers in ``[vocab_lo, vocab_hi)``).
  Block ``j`` of a request whose ``prefix_ids[j] = c`` holds the block of ``c`` at ``j``
  (:func:`shared_block`): its first ``D`` tokens write ``c`` in base ``V = vocab_hi -
  vocab_lo`` (:func:`digits`), the other ``B - D`` are a hash of ``(c, j)``.  So requests
  with equal ids at equal positions send equal token blocks, which a real server's prefix
  cache (vLLM's chained block hashes) shares exactly as the model does (SPEC.md 4.6), and
  :func:`prefix_ids_of` reads the ids back from the tokens (a block whose hash does not
  check ends the prefix).  Every other token is a hash of ``(prompt_seed, request_id,
  position)``: unique to the request.  Ids past the prompt's full blocks are not sent.
* **Output length**: ``max_tokens`` = ``min_tokens`` = ``output_tokens`` and
  ``ignore_eos``: the server generates exactly that many tokens.
* **Tenant**: the body's ``user``, the Gateway API inference extension's fairness header
  :data:`FAIRNESS_HEADER` and, when given, a header of the user's choice.
* **Priority**: the tenant's tier (``priority``: an integer, lower served first, vLLM's
  convention and the model's), only when the options carry tiers.
* **Cache salt**: ``cache_salt`` per tenant, only when the options carry salts (a setup
  whose prefix cache is salted).
* **Ids and estimates**: :data:`REQUEST_ID_HEADER` carries the request id;
  :data:`PREDICTED_HEADER` and :data:`BYTES_HEADER` the client's estimates
  (``predicted_output_tokens``, ``prompt_bytes``) when the request has them.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from typing import Any, Mapping

import attrs
import numpy as np

from tenantry.model.config import ConfigError
from tenantry.model.events import REJECT_REASONS
from tenantry.model.workload import Request

#: The Gateway API inference extension's flow-control fairness header (the endpoint picker
#: groups requests by it; ``default-flow`` when absent).
FAIRNESS_HEADER = "x-gateway-inference-fairness-id"
#: The request id (vLLM reads it with ``--enable-request-id-headers``; ``tenantry serve`` always).
REQUEST_ID_HEADER = "x-request-id"
#: The client's output-length estimate (``Request.predicted_output_tokens``), tenantry's own.
PREDICTED_HEADER = "x-tenantry-predicted-output-tokens"
#: The prompt's length in bytes (``Request.prompt_bytes``), tenantry's own.
BYTES_HEADER = "x-tenantry-prompt-bytes"
#: Default token-id range: above the special tokens of common vocabularies, within the
#: smallest vocabulary a test model has (1,000: vLLM's CPU test model, which a token id past
#: its vocabulary brings down, live/VLLM_WIRE.md).
DEFAULT_VOCAB = (100, 1000)
#: Fewest hashed tokens in a shared block (after its id's digits): what tells a shared block
#: from a unique one (a chance match has probability ``V ** -MIN_CHECK`` at most).
MIN_CHECK = 4
#: Content ids must fit in 64 bits (signed).
ID_BITS = 64


class WireError(ValueError):
    """A request body or a streamed chunk that does not follow the mapping (one line)."""


def _pairs(value: Any) -> tuple[tuple[str, Any], ...] | None:
    if value is None:
        return None
    items = value.items() if isinstance(value, Mapping) else value
    return tuple(sorted((str(k), v) for k, v in items))


@attrs.frozen
class WireOptions:
    """How requests go on the wire (both ends must agree on the block size and vocabulary).

    Attributes:
        model: the ``model`` field (the served model's name).
        block_size_tokens: tokens per KV block, B (the server's block size).
        vocab_lo, vocab_hi: token ids are drawn from ``[vocab_lo, vocab_hi)``.
        tenant_header: one more header carrying the tenant's name, or None.
        fairness_header: send :data:`FAIRNESS_HEADER` with the tenant's name.
        tiers: (tenant, tier) pairs: send ``priority`` = the tenant's tier; None: no priority.
        salts: (tenant, salt) pairs: send ``cache_salt``; None: no salt.
        prompt_seed: mixed into every unique token (a fresh seed gives fresh prompts, so a
            server that ran an earlier replay finds nothing of it cached).

    Raises:
        ConfigError: on a vocabulary of fewer than 2 ids, or a block too small to hold a
            content id's digits and :data:`MIN_CHECK` hashed tokens.
    """

    model: str = "tenantry"
    block_size_tokens: int = 16
    vocab_lo: int = DEFAULT_VOCAB[0]
    vocab_hi: int = DEFAULT_VOCAB[1]
    tenant_header: str | None = None
    fairness_header: bool = True
    tiers: tuple[tuple[str, int], ...] | None = attrs.field(default=None, converter=_pairs)
    salts: tuple[tuple[str, str], ...] | None = attrs.field(default=None, converter=_pairs)
    prompt_seed: int = 0

    def __attrs_post_init__(self) -> None:
        if not (isinstance(self.vocab_lo, int) and isinstance(self.vocab_hi, int)) or self.vocab_lo < 0 \
                or self.vocab_hi - self.vocab_lo < 2:
            raise ConfigError("vocab", f"{self.vocab_lo}:{self.vocab_hi}", "must be LO:HI with 0 <= LO and at least "
                              "2 ids (token ids are drawn from [LO, HI))")
        need = digits_needed(self.vocab_hi - self.vocab_lo) + MIN_CHECK
        if self.block_size_tokens < need:
            raise ConfigError("block_size_tokens", self.block_size_tokens, f"too small for the wire mapping: a "
                              f"shared block needs {need} tokens with this vocabulary (an id's digits and "
                              f"{MIN_CHECK} check tokens); give a larger block or vocabulary")

    @property
    def vocab(self) -> int:
        """V, the number of token ids used."""
        return self.vocab_hi - self.vocab_lo

    def tier_of(self, tenant: str) -> int | None:
        """The tenant's ``priority`` (its tier; 0 for a tenant not listed), or None without tiers."""
        return None if self.tiers is None else dict(self.tiers).get(tenant, 0)

    def salt_of(self, tenant: str) -> str | None:
        """The tenant's ``cache_salt`` (its listed salt, else its name), or None without salts."""
        return None if self.salts is None else dict(self.salts).get(tenant, tenant)


def digits_needed(vocab: int) -> int:
    """D: base-``vocab`` digits that hold any 64-bit content id (zigzag-coded)."""
    return max(1, math.ceil(ID_BITS / math.log2(vocab) - 1e-12))


def _seed(*parts: int | str) -> int:
    """A 64-bit seed from integers and strings (blake2b: the same on every machine)."""
    h = hashlib.blake2b(digest_size=8)
    for p in parts:
        h.update(repr(p).encode())
        h.update(b"\0")
    return int.from_bytes(h.digest(), "little")


def _zigzag(c: int) -> int:
    return 2 * c if c >= 0 else -2 * c - 1


def _unzigzag(z: int) -> int:
    return z // 2 if z % 2 == 0 else -(z + 1) // 2


def digits(c: int, vocab: int) -> list[int]:
    """The ``D`` base-``vocab`` digits (least significant first) of content id ``c``, zigzag-coded.

    Raises:
        ConfigError: when ``c`` does not fit in 64 bits."""
    if not -(1 << (ID_BITS - 1)) <= c < (1 << (ID_BITS - 1)):
        raise ConfigError("prefix_ids", c, "a content id must fit in 64 bits to go on the wire")
    z, out = _zigzag(c), []
    for _ in range(digits_needed(vocab)):
        z, d = divmod(z, vocab)
        out.append(d)
    return out


@functools.lru_cache(maxsize=65536)
def _check_tokens(c: int, j: int, lo: int, hi: int, n: int) -> tuple[int, ...]:
    return tuple(np.random.default_rng(_seed("shared", c, j)).integers(lo, hi, n).tolist())


def shared_block(c: int, j: int, opts: WireOptions) -> list[int]:
    """The ``B`` token ids of content id ``c`` at block position ``j``: its digits (offset
    ``lo``), then hashed check tokens of ``(c, j)``."""
    lo, V, B = opts.vocab_lo, opts.vocab, opts.block_size_tokens
    head = [lo + d for d in digits(c, V)]
    return head + list(_check_tokens(c, j, lo, opts.vocab_hi, B - len(head)))


def prompt_token_ids(r: Request, opts: WireOptions) -> list[int]:
    """The prompt of ``r`` as token ids: its shared blocks (:func:`shared_block`, the ids of
    its full blocks only), then ``prompt_tokens - k * B`` tokens unique to the request."""
    B = opts.block_size_tokens
    k = min(len(r.prefix_ids), r.prompt_tokens // B)
    out: list[int] = []
    for j in range(k):
        out.extend(shared_block(r.prefix_ids[j], j, opts))
    rest = r.prompt_tokens - k * B
    rng = np.random.default_rng(_seed("unique", opts.prompt_seed, r.request_id))
    out.extend(rng.integers(opts.vocab_lo, opts.vocab_hi, rest).tolist())
    return out


def prefix_ids_of(tokens: list[int], opts: WireOptions) -> tuple[int, ...]:
    """The content ids of a prompt's leading shared blocks (the inverse of
    :func:`prompt_token_ids`): block after block while its digits name an id whose check
    tokens are there; the first block that does not check ends the prefix."""
    lo, V, B = opts.vocab_lo, opts.vocab, opts.block_size_tokens
    D = digits_needed(V)
    out: list[int] = []
    for j in range(len(tokens) // B):
        block = tokens[j * B:(j + 1) * B]
        z = 0
        for d in reversed(block[:D]):
            if not (isinstance(d, int) and lo <= d < lo + V):
                return tuple(out)
            z = z * V + (d - lo)
        c = _unzigzag(z)
        if not -(1 << (ID_BITS - 1)) <= c < (1 << (ID_BITS - 1)):
            return tuple(out)
        if tuple(block[D:]) != _check_tokens(c, j, lo, opts.vocab_hi, B - D):
            return tuple(out)
        out.append(c)
    return tuple(out)


def to_wire(r: Request, opts: WireOptions) -> tuple[dict[str, Any], dict[str, str]]:
    """The streaming ``/v1/completions`` body and the headers of request ``r`` (see the module
    docstring).  ``r.cancel_s`` does not go on the wire: the client disconnects then."""
    body: dict[str, Any] = {
        "model": opts.model, "prompt": prompt_token_ids(r, opts), "max_tokens": r.output_tokens,
        "min_tokens": r.output_tokens, "ignore_eos": True, "stream": True, "return_token_ids": True,
        "user": r.tenant,
    }
    tier = opts.tier_of(r.tenant)
    if tier is not None:
        body["priority"] = tier
    salt = opts.salt_of(r.tenant)
    if salt is not None:
        body["cache_salt"] = salt
    headers = {REQUEST_ID_HEADER: str(r.request_id)}
    if opts.fairness_header:
        headers[FAIRNESS_HEADER] = r.tenant
    if opts.tenant_header:
        headers[opts.tenant_header.lower()] = r.tenant
    if r.predicted_output_tokens is not None:
        headers[PREDICTED_HEADER] = str(r.predicted_output_tokens)
    if r.prompt_bytes is not None:
        headers[BYTES_HEADER] = str(r.prompt_bytes)
    return body, headers


@attrs.frozen
class WireRequest:
    """A request as read back from the wire (:func:`from_wire`).

    Attributes:
        request: the :class:`Request` (``cancel_s`` None: a cancellation is a disconnect).
        priority: the body's ``priority``, or None; cache_salt: its ``cache_salt``, or None.
        stream: the body's ``stream``.
    """

    request: Request
    priority: int | None = None
    cache_salt: str | None = None
    stream: bool = True


def _int_field(body: Mapping, name: str, low: int) -> int:
    v = body.get(name)
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise WireError(f"'{name}' must be an integer >= {low}, not {json.dumps(v)[:40]}")
    return v


def _header_int(headers: Mapping[str, str], name: str) -> int | None:
    text = headers.get(name)
    if text is None:
        return None
    try:
        v = int(text)
    except ValueError:
        raise WireError(f"header {name} must be an integer >= 0, not {text[:40]!r}") from None
    if v < 0:
        raise WireError(f"header {name} must be an integer >= 0, not {text[:40]!r}")
    return v


def tenant_of(body: Mapping, headers: Mapping[str, str], opts: WireOptions) -> str | None:
    """The tenant a request names: its ``user``, else the options' tenant header, else the
    fairness header (headers by lower-case name); None when none is there."""
    for v in (body.get("user"), headers.get(opts.tenant_header.lower()) if opts.tenant_header else None,
              headers.get(FAIRNESS_HEADER)):
        if isinstance(v, str) and v:
            return v
    return None


def from_wire(body: Any, headers: Mapping[str, str], opts: WireOptions, *, request_id: int,
              arrival_s: float) -> WireRequest:
    """Read a ``/v1/completions`` body and its headers (lower-case names) back into a request
    arriving at ``arrival_s`` (seconds) with id ``request_id``: the inverse of :func:`to_wire`
    (prefix ids recovered from the token ids, :func:`prefix_ids_of`).

    Raises:
        WireError: naming the field that is missing or malformed (the server answers 400).
    """
    if not isinstance(body, Mapping):
        raise WireError("the body must be a JSON object")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
        prompt = prompt[0]  # a batch of one prompt
    if not isinstance(prompt, list) or not prompt or not all(type(t) is int for t in prompt):
        raise WireError("'prompt' must be a non-empty list of token ids (this server has no tokenizer)")
    output = _int_field(body, "max_tokens", 1)
    tenant = tenant_of(body, headers, opts)
    if tenant is None:
        raise WireError(f"no tenant: give 'user' in the body or the {FAIRNESS_HEADER} header"
                        + (f" or {opts.tenant_header}" if opts.tenant_header else ""))
    priority = body.get("priority")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
        raise WireError(f"'priority' must be an integer, not {json.dumps(priority)[:40]}")
    salt = body.get("cache_salt")
    if salt is not None and not isinstance(salt, str):
        raise WireError("'cache_salt' must be a string")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise WireError("'stream' must be true or false")
    r = Request(request_id, tenant, arrival_s, len(prompt), output, prefix_ids=prefix_ids_of(prompt, opts),
                predicted_output_tokens=_header_int(headers, PREDICTED_HEADER),
                prompt_bytes=_header_int(headers, BYTES_HEADER))
    return WireRequest(r, priority, salt, stream)


def request_id_of(headers: Mapping[str, str]) -> int | None:
    """The request id a client sent (:data:`REQUEST_ID_HEADER`, a non-negative integer), or None."""
    text = headers.get(REQUEST_ID_HEADER)
    return int(text) if text is not None and text.isdigit() and len(text) < 19 else None


def output_token_ids(request_id: int, start: int, n: int, opts: WireOptions) -> list[int]:
    """Token ids ``start .. start + n - 1`` of a request's output, as ``tenantry serve`` makes
    them (a hash of the request id and position: any ids in the vocabulary would do)."""
    lo, V = opts.vocab_lo, opts.vocab
    return [lo + _seed("out", request_id, k) % V for k in range(start, start + n)]


def chunk(request_id: int, model: str, created: int, token_ids: list[int], finish_reason: str | None) -> str:
    """One streamed chunk's ``data:`` JSON, as vLLM writes it with ``return_token_ids`` and no
    tokenizer (empty text; ``finish_reason`` ``length`` on the last token's chunk)."""
    return json.dumps({
        "id": f"cmpl-{request_id}", "object": "text_completion", "created": created, "model": model,
        "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": finish_reason,
                     "stop_reason": None, "token_ids": token_ids}],
    }, separators=(",", ":"))


def read_chunk(data: str) -> tuple[int, str | None]:
    """(output tokens in one streamed chunk, its ``finish_reason`` or None) from its ``data:``
    text: ``len(token_ids)`` when the chunk has them, else 1 for a non-empty ``text``, else 0.

    Raises:
        WireError: for text that is not a completion chunk (bad JSON, no ``choices``, an
            ``error`` object), naming what was found.
    """
    try:
        obj = json.loads(data)
    except ValueError:
        raise WireError(f"bad JSON in a streamed event: {data[:60]!r}") from None
    if isinstance(obj, dict) and "error" in obj:
        raise WireError(f"the server sent an error in the stream: {json.dumps(obj['error'])[:200]}")
    choices = obj.get("choices") if isinstance(obj, dict) else None
    if not isinstance(choices, list):
        raise WireError(f"a streamed event without 'choices': {data[:60]!r}")
    tokens, reason = 0, None
    for c in choices:
        if not isinstance(c, dict):
            raise WireError(f"a choice that is not an object: {data[:60]!r}")
        ids = c.get("token_ids")
        if ids is not None:
            if not isinstance(ids, list):
                raise WireError(f"'token_ids' that is not a list: {data[:60]!r}")
            tokens += len(ids)
        elif c.get("text"):
            tokens += 1
        if c.get("finish_reason") is not None:
            reason = str(c["finish_reason"])
    return tokens, reason


def refusal(status: int, message: str, reason: str | None = None, retry_after_s: float | None = None) -> dict:
    """The JSON body of a refusal (OpenAI's error shape), with the model's ``reason`` and
    ``retry_after_s`` (seconds of the model's clock) when it gave them."""
    err: dict[str, Any] = {"message": message, "type": "RateLimitError" if status == 429 else "BadRequestError",
                           "code": status}
    if reason is not None:
        err["reason"] = reason
    if retry_after_s is not None:
        err["retry_after_s"] = retry_after_s
    return {"error": err}


def refusal_reason(body: str) -> tuple[str | None, float | None]:
    """(the model's reason, its ``retry_after_s``) named in a refusal's body, when it is one of
    :data:`~tenantry.model.events.REJECT_REASONS` (``tenantry serve``'s), else (None, None)."""
    try:
        err = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return None, None
    if not isinstance(err, dict) or err.get("reason") not in REJECT_REASONS:
        return None, None
    ra = err.get("retry_after_s")
    ok = isinstance(ra, (int, float)) and not isinstance(ra, bool) and math.isfinite(ra) and ra >= 0
    return err["reason"], float(ra) if ok else None
