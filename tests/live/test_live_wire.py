"""The wire mapping (live/wire.py): a request goes on the wire and comes back the same; shared
prefixes are shared token blocks, and nothing else is."""

from __future__ import annotations

import json

import attrs
import pytest
from hypothesis import given, strategies as st

from tenantry.live.wire import (
    BYTES_HEADER, FAIRNESS_HEADER, PREDICTED_HEADER, REQUEST_ID_HEADER, WireError, WireOptions, chunk, digits_needed,
    from_wire, prefix_ids_of, prompt_token_ids, read_chunk, refusal, refusal_reason, shared_block, to_wire,
)
from tenantry.model.config import ConfigError
from tenantry.model.workload import Request

B = 16
OPTS = WireOptions(model="m", block_size_tokens=B)

ids = st.integers(-(1 << 63), (1 << 63) - 1) | st.integers(0, 40)
requests = st.builds(
    Request,
    request_id=st.integers(0, 10**9),
    tenant=st.sampled_from(["adv", "chat", "t-ü"]),
    arrival_s=st.just(0.0),
    prompt_tokens=st.integers(1, 200),
    output_tokens=st.integers(1, 300),
    prefix_ids=st.lists(ids, max_size=14).map(tuple),
    predicted_output_tokens=st.none() | st.integers(0, 500),
    prompt_bytes=st.none() | st.integers(0, 5000),
)


def _roundtrip(r: Request, opts: WireOptions, arrival_s: float = 1.5):
    body, headers = to_wire(r, opts)
    body = json.loads(json.dumps(body))  # as it crosses the wire
    return from_wire(body, {k.lower(): v for k, v in headers.items()}, opts, request_id=r.request_id,
                     arrival_s=arrival_s)


@given(requests)
def test_a_request_comes_back_from_the_wire_as_it_went(r):
    """Request -> body and headers -> Request: every field the wire carries is the same (the
    prefix ids cut to the prompt's full blocks, SPEC.md 4.6; cancel_s is a disconnect, not a
    field), and the prompt is ``prompt_tokens`` ids in the vocabulary."""
    back = _roundtrip(r, OPTS).request
    want = attrs.evolve(r, arrival_s=1.5, prefix_ids=r.prefix_ids[:r.prompt_tokens // B])
    assert back == want
    body, _ = to_wire(r, OPTS)
    assert len(body["prompt"]) == r.prompt_tokens
    assert all(OPTS.vocab_lo <= t < OPTS.vocab_hi for t in body["prompt"])
    assert body["max_tokens"] == body["min_tokens"] == r.output_tokens and body["ignore_eos"] is True


@given(requests, requests)
def test_two_prompts_share_exactly_their_common_prefix_blocks(a, b):
    """Two prompts agree on their first j + 1 token blocks exactly when their prefix ids agree up
    to j (equal ids at equal positions behind equal ids, the model's rule): a prefix cache that
    hashes each block with the blocks before it (vLLM's) shares what the model shares, and
    nothing else."""
    b = attrs.evolve(b, request_id=a.request_id + 1)
    ta, tb = prompt_token_ids(a, OPTS), prompt_token_ids(b, OPTS)
    ka, kb = min(len(a.prefix_ids), a.prompt_tokens // B), min(len(b.prefix_ids), b.prompt_tokens // B)
    common = 0
    while common < min(ka, kb) and a.prefix_ids[common] == b.prefix_ids[common]:
        common += 1
    for j in range(min(len(ta), len(tb)) // B):
        same = ta[:(j + 1) * B] == tb[:(j + 1) * B]
        assert same == (j < common), (j, common)


def test_shared_blocks_depend_on_content_and_position_only():
    a = Request(0, "adv", 0.0, 64, 1, prefix_ids=(7, 9, 11))
    b = Request(5, "chat", 3.0, 80, 4, prefix_ids=(7, 9, 12))
    ta, tb = prompt_token_ids(a, OPTS), prompt_token_ids(b, OPTS)
    assert ta[:2 * B] == tb[:2 * B] and ta[2 * B:3 * B] != tb[2 * B:3 * B]
    assert shared_block(9, 1, OPTS) != shared_block(9, 0, OPTS)  # the same id elsewhere is other content
    # the same id at the same position behind another id: the block's tokens alike, the prefix not
    x, y = Request(0, "a", 0.0, 2 * B, 1, prefix_ids=(1, 5)), Request(1, "a", 0.0, 2 * B, 1, prefix_ids=(2, 5))
    tx, ty = prompt_token_ids(x, OPTS), prompt_token_ids(y, OPTS)
    assert tx[B:] == ty[B:] and tx[:B] != ty[:B]
    assert prompt_token_ids(a, OPTS) == ta  # deterministic
    assert prompt_token_ids(a, attrs.evolve(OPTS, prompt_seed=1))[:3 * B] == ta[:3 * B]
    assert prompt_token_ids(a, attrs.evolve(OPTS, prompt_seed=1))[3 * B:] != ta[3 * B:]  # a fresh seed: fresh tails


def test_prefix_ids_are_read_back_until_the_first_unique_block():
    r = Request(3, "a", 0.0, 5 * B + 3, 1, prefix_ids=(1, -2, 3))
    tokens = prompt_token_ids(r, OPTS)
    assert prefix_ids_of(tokens, OPTS) == (1, -2, 3)
    broken = tokens[:B] + [tokens[B] + 1] + tokens[B + 1:]  # one token of block 1 changed
    assert prefix_ids_of(broken, OPTS) == (1,)
    assert prefix_ids_of(prompt_token_ids(Request(3, "a", 0.0, 64, 1), OPTS), OPTS) == ()
    assert prefix_ids_of(list(range(5000, 5000 + 4 * B)), OPTS) == ()


def test_identity_priority_and_salt_go_where_servers_read_them():
    r = Request(12, "adv", 0.0, 20, 3, predicted_output_tokens=2, prompt_bytes=80)
    opts = WireOptions(tenant_header="X-Tenant", tiers={"adv": 0, "chat": 1}, salts={"adv": "s-adv"})
    body, headers = to_wire(r, opts)
    assert body["user"] == "adv" and headers[FAIRNESS_HEADER] == "adv" and headers["x-tenant"] == "adv"
    assert FAIRNESS_HEADER == "x-gateway-inference-fairness-id"
    assert body["priority"] == 0 and body["cache_salt"] == "s-adv"
    assert headers[REQUEST_ID_HEADER] == "12" and headers[PREDICTED_HEADER] == "2" and headers[BYTES_HEADER] == "80"
    assert to_wire(attrs.evolve(r, tenant="chat"), opts)[0]["priority"] == 1
    plain_body, plain_headers = to_wire(r, WireOptions(fairness_header=False))
    assert "priority" not in plain_body and "cache_salt" not in plain_body and FAIRNESS_HEADER not in plain_headers
    back = from_wire(body, {k.lower(): v for k, v in headers.items()}, opts, request_id=12, arrival_s=0.0)
    assert (back.priority, back.cache_salt) == (0, "s-adv")


@pytest.mark.parametrize("body, why", [
    ({"prompt": "hello", "max_tokens": 3, "user": "a"}, "'prompt' must be a non-empty list of token ids"),
    ({"prompt": [], "max_tokens": 3, "user": "a"}, "'prompt' must be a non-empty list"),
    ({"prompt": [1, 2], "max_tokens": 0, "user": "a"}, "'max_tokens' must be an integer >= 1"),
    ({"prompt": [1, 2], "user": "a"}, "'max_tokens' must be an integer >= 1, not null"),
    ({"prompt": [1, 2], "max_tokens": 2}, "no tenant: give 'user'"),
    ({"prompt": [1, 2], "max_tokens": 2, "user": "a", "priority": "high"}, "'priority' must be an integer"),
    ([1, 2], "the body must be a JSON object"),
])
def test_a_body_off_the_mapping_is_one_line_naming_the_field(body, why):
    with pytest.raises(WireError, match=why.replace("(", r"\(")) as e:
        from_wire(body, {}, OPTS, request_id=0, arrival_s=0.0)
    assert "\n" not in str(e.value)


def test_the_tenant_is_read_from_the_fairness_header_when_the_body_has_no_user():
    wr = from_wire({"prompt": [5, 6], "max_tokens": 1}, {FAIRNESS_HEADER: "bob"}, OPTS, request_id=4, arrival_s=0.0)
    assert wr.request.tenant == "bob"


def test_options_that_cannot_carry_a_content_id_are_refused():
    assert digits_needed(31000) == 5 and digits_needed(2) == 64
    with pytest.raises(ConfigError, match="block_size_tokens=8: too small"):
        WireOptions(block_size_tokens=8, vocab_lo=0, vocab_hi=100)
    with pytest.raises(ConfigError, match="vocab"):
        WireOptions(vocab_lo=10, vocab_hi=11)


def test_chunks_and_refusals_read_back():
    assert read_chunk(chunk(3, "m", 0, [1001, 1002], None)) == (2, None)
    assert read_chunk(chunk(3, "m", 0, [1001], "length")) == (1, "length")
    assert read_chunk(json.dumps({"choices": [{"text": "hi", "finish_reason": None}]})) == (1, None)
    for bad, why in (("{nope", "bad JSON"), ('{"x": 1}', "without 'choices'"),
                     ('{"error": {"message": "boom"}}', "the server sent an error")):
        with pytest.raises(WireError, match=why):
            read_chunk(bad)
    assert refusal_reason(json.dumps(refusal(429, "no", "queue_full", 1.5))) == ("queue_full", 1.5)
    assert refusal_reason(json.dumps(refusal(429, "no", "made_up"))) == (None, None)
    assert refusal_reason("<html>busy</html>") == (None, None)
