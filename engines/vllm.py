"""Drive vLLM's real V1 scheduler, step by step, on a CPU-only machine.

:class:`VllmScheduler` wraps ``vllm.v1.core.sched.scheduler.Scheduler`` (vLLM
0.33) with no model, no GPU and no worker process.  Each :meth:`~VllmScheduler.step`
is what vLLM's ``EngineCore.step`` does around the model:

1. ``Scheduler.schedule()`` decides the batch (continuous batching, chunked
   prefill under the token budget, KV block allocation, preemption by
   recompute, prefix-cache hits);
2. a fabricated ``ModelRunnerOutput`` stands in for the forward pass: one
   sampled token for every scheduled request whose known tokens (prompt plus
   tokens generated so far) are all computed after this step, nothing for a
   request still in a prefill chunk, exactly as vLLM's GPU model runner
   discards the sample of a partial prefill;
3. ``Scheduler.update_from_output()`` appends the tokens, stops requests at
   ``max_tokens`` and frees their blocks.

Everything the adapter reports is read back from vLLM's own state: the batch
from ``SchedulerOutput.num_scheduled_tokens``, preemptions from
``SchedulerOutput.preempted_req_ids`` (in the order vLLM preempted them),
finishes from the ``EngineCoreOutput.finish_reason`` of ``update_from_output``,
blocks from the ``KVCacheManager`` and its ``BlockPool``, prefix-cache hits
from the ``num_computed_tokens`` vLLM hands the model runner when it admits a
request (``NewRequestData`` for a new one, ``CachedRequestData`` for one that
resumes after a preemption).

Setup without a model: a ``config.json`` for a one-layer Llama is written into
a temporary folder (no weights, no tokenizer: ``skip_tokenizer_init``, and
``HF_HUB_OFFLINE=1`` so nothing reaches a hub), the KV cache configuration is
made by hand (one full-attention group of ``num_blocks`` blocks), and the
device is given as ``cpu`` since vLLM cannot infer one here.

Pool accounting: vLLM keeps one block of its pool as the "null block" that no
request ever holds, so the adapter gives vLLM ``num_blocks + 1`` blocks and
``free_blocks`` starts at ``num_blocks``.  With prefix caching on, a block
whose last holder finished stays cached but counts as free (vLLM evicts it
lazily), and a block shared by several requests appears in each of their
``blocks_in_use`` counts.

Determinism: request arrival times are a logical counter (vLLM breaks priority
ties on them), sampled tokens derive from the request id and the output index,
and stats logging is off, so two identical drives give identical step lists.

vLLM is imported lazily: importing this module never needs vLLM;
:func:`vllm_available` says whether it can be used and, if not, why.  Install
it with ``scripts/install_vllm.sh``.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import tempfile
from typing import Any

from tenantry.model.config import Config, EvictionConfig, OrderConfig, TenantConfig
from tenantry.verify.protocol import Claims, Plan, Scheduled, StepResults

__all__ = ["VllmScheduler", "VllmAdapter", "vllm_available", "prompt_token_ids", "SUPPORTED_VLLM", "VOCAB_SIZE"]

#: vLLM release this adapter is written against (its scheduler internals are
#: not a public interface and change between minor releases).
SUPPORTED_VLLM = "0.33"
#: Token ids are drawn from ``[FIRST_TOKEN_ID, VOCAB_SIZE)``.
VOCAB_SIZE = 32000
FIRST_TOKEN_ID = 3  # 0, 1, 2: pad, bos, eos of the Llama config below

_MASK64 = (1 << 64) - 1
# Domain tags so that prefix-content tokens, per-request tokens and sampled
# tokens come from independent streams.
_TAG_PREFIX = 0x5052_4546
_TAG_UNIQUE = 0x554E_4951
_TAG_SAMPLE = 0x5341_4D50


def _mix(*parts: int) -> int:
    """SplitMix64 over the parts: a fixed, platform-independent integer hash."""
    h = 0x9E37_79B9_7F4A_7C15
    for part in parts:
        h = (h ^ (part & _MASK64)) & _MASK64
        h = (h + 0x9E37_79B9_7F4A_7C15) & _MASK64
        h = ((h ^ (h >> 30)) * 0xBF58_476D_1CE4_E5B9) & _MASK64
        h = ((h ^ (h >> 27)) * 0x94D0_49BB_1331_11EB) & _MASK64
        h ^= h >> 31
    return h


def _token(*parts: int) -> int:
    return FIRST_TOKEN_ID + _mix(*parts) % (VOCAB_SIZE - FIRST_TOKEN_ID)


def prompt_token_ids(
    request_id: int, prompt_tokens: int, prefix_ids: tuple[int, ...], block_size_tokens: int
) -> list[int]:
    """The prompt the adapter submits for a request.

    Block ``i < len(prefix_ids)`` of the prompt holds tokens that depend only on
    ``(prefix_ids[i], i)``: equal content at an equal position gives equal
    tokens, hence equal vLLM block hashes (under one cache salt).  The rest of
    the prompt depends on ``request_id`` and the position, so it is unique to
    the request.
    """
    n_prefix = min(len(prefix_ids) * block_size_tokens, prompt_tokens)
    out = []
    for pos in range(prompt_tokens):
        if pos < n_prefix:
            blk, off = divmod(pos, block_size_tokens)
            out.append(_token(_TAG_PREFIX, prefix_ids[blk], blk, off))
        else:
            out.append(_token(_TAG_UNIQUE, request_id, pos))
    return out


@functools.lru_cache(maxsize=1)
def vllm_available() -> tuple[bool, str]:
    """``(True, "vllm X.Y.Z")`` if the vLLM scheduler can be driven here, else
    ``(False, reason)``.  The first call imports vLLM (about 10 s)."""
    try:
        import importlib.metadata as md

        version = md.version("vllm")
    except Exception:
        return False, "vllm is not installed (scripts/install_vllm.sh installs it)"
    if not version.startswith(SUPPORTED_VLLM + "."):
        return False, (
            f"vllm {version} is installed but this adapter drives vllm "
            f"{SUPPORTED_VLLM}.x scheduler internals (scripts/install_vllm.sh pins it)"
        )
    try:
        _vllm()
    except Exception as exc:  # an ImportError of a missing dependency, mostly
        return False, f"vllm {version} is installed but does not import: {exc!r}"
    return True, f"vllm {version}"


@functools.lru_cache(maxsize=1)
def _vllm() -> dict[str, Any]:
    """Import the vLLM pieces the adapter needs, once."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    # vLLM 0.33 configures its logger only inside its engine processes; here
    # its warnings (e.g. about its missing CUDA/CPU kernels, which the
    # scheduler never calls) would go to Python's last-resort handler.
    vllm_logger = logging.getLogger("vllm")
    if vllm_logger.level == logging.NOTSET:
        vllm_logger.setLevel(os.environ["VLLM_LOGGING_LEVEL"].upper())
    import torch
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        ModelConfig,
        SchedulerConfig,
        VllmConfig,
    )
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
    )
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request, RequestStatus
    from vllm.v1.structured_output import StructuredOutputManager

    return dict(locals())


def _tiny_llama_config(max_model_len: int) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "num_hidden_layers": 1,
        "vocab_size": VOCAB_SIZE,
        "max_position_embeddings": max_model_len,
        "rms_norm_eps": 1e-5,
        "torch_dtype": "float32",
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "tie_word_embeddings": False,
    }


class VllmScheduler:
    """vLLM 0.33's V1 ``Scheduler`` behind the tenantry step-mode adapter calls.

    ``num_blocks`` is the pool the requests can use (see the module notes on
    vLLM's null block); ``token_budget`` is vLLM's ``max_num_batched_tokens``
    (chunked prefill is on, as in vLLM's default); ``policy`` is ``"fcfs"`` or
    ``"priority"`` (lower ``priority`` value runs first, and preempts last).
    vLLM itself requires ``token_budget >= max_num_seqs``.

    vLLM never rejects a request here: one whose prompt can never fit the pool
    stays waiting (and, under FCFS, blocks every request queued behind it), so
    a driver should bound its number of steps.
    """

    def __init__(
        self,
        *,
        num_blocks: int,
        block_size_tokens: int = 16,
        max_num_seqs: int = 256,
        token_budget: int = 512,
        policy: str = "fcfs",
        enable_prefix_caching: bool = False,
        max_model_len: int = 131072,
    ) -> None:
        ok, why = vllm_available()
        if not ok:
            raise RuntimeError(why)
        if policy not in ("fcfs", "priority"):
            raise ValueError(f"policy must be 'fcfs' or 'priority', not {policy!r}")
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, not {num_blocks}")
        v = _vllm()
        self.num_blocks = num_blocks
        self.block_size_tokens = block_size_tokens
        self.enable_prefix_caching = enable_prefix_caching

        self._model_dir = tempfile.mkdtemp(prefix="tenantry-vllm-model-")
        try:
            with open(os.path.join(self._model_dir, "config.json"), "w") as f:
                json.dump(_tiny_llama_config(max_model_len), f)
            model_config = v["ModelConfig"](
                model=self._model_dir,
                tokenizer=self._model_dir,
                skip_tokenizer_init=True,
                dtype="float32",
                seed=0,
                max_model_len=max_model_len,
            )
        finally:
            # ModelConfig has read everything it needs from the folder.
            shutil.rmtree(self._model_dir, ignore_errors=True)
        scheduler_config = v["SchedulerConfig"](
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=token_budget,
            max_model_len=max_model_len,
            is_encoder_decoder=False,
            enable_chunked_prefill=True,
            policy=policy,
            async_scheduling=False,
        )
        cache_config = v["CacheConfig"](
            block_size=block_size_tokens,
            enable_prefix_caching=enable_prefix_caching,
        )
        vllm_blocks = num_blocks + 1  # + vLLM's null block
        cache_config.num_gpu_blocks = vllm_blocks
        self._config = v["VllmConfig"](
            model_config=model_config,
            scheduler_config=scheduler_config,
            cache_config=cache_config,
            device_config=v["DeviceConfig"](device="cpu"),
        )
        kv_cache_config = v["KVCacheConfig"](
            num_blocks=vllm_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=[
                v["KVCacheGroupSpec"](
                    ["model.layers.0.self_attn.attn"],
                    v["FullAttentionSpec"](
                        block_size=block_size_tokens,
                        num_kv_heads=1,
                        head_size=1,
                        dtype=v["torch"].float32,
                    ),
                )
            ],
        )
        self._sched = v["Scheduler"](
            vllm_config=self._config,
            kv_cache_config=kv_cache_config,
            structured_output_manager=v["StructuredOutputManager"](self._config),
            block_size=block_size_tokens,
            hash_block_size=block_size_tokens,
            log_stats=False,
        )
        # What EngineCore does when prefix caching is on: requests carry a block
        # hasher that hashes full blocks of their tokens (the cache salt enters
        # the first block's hash).
        self._block_hasher = None
        if enable_prefix_caching:
            hash_fn = v["get_hash_fn_by_name"](cache_config.prefix_caching_hash_algo)
            v["init_none_hash"](hash_fn)
            self._block_hasher = v["get_request_block_hasher"](block_size_tokens, hash_fn)

        # Record the order in which vLLM preempts; the set itself is checked
        # against SchedulerOutput.preempted_req_ids every step.
        self._preempt_log: list[str] = []
        original_preempt = self._sched._preempt_request

        def _recording_preempt(request: Any, *args: Any, **kwargs: Any) -> None:
            self._preempt_log.append(request.request_id)
            original_preempt(request, *args, **kwargs)

        self._sched._preempt_request = _recording_preempt

        self._arrivals = 0
        self._first_token_seen: set[str] = set()
        self._steps = 0

    # -- the adapter protocol -------------------------------------------------

    def add_request(
        self,
        request_id: int,
        tenant: str,
        prompt_tokens: int,
        output_tokens: int,
        *,
        prefix_ids: tuple[int, ...] = (),
        priority: int = 0,
        cache_salt: str | None = None,
    ) -> None:
        """Queue a request of ``prompt_tokens`` prompt tokens that generates
        exactly ``output_tokens`` tokens (``max_tokens``, EOS ignored)."""
        if prompt_tokens < 1:
            raise ValueError(f"prompt_tokens must be >= 1, not {prompt_tokens}")
        if output_tokens < 1:
            raise ValueError(f"output_tokens must be >= 1, not {output_tokens}")
        rid = str(request_id)
        if rid in self._sched.requests:
            raise ValueError(f"request {request_id} is already in the scheduler")
        v = _vllm()
        params = v["SamplingParams"](max_tokens=output_tokens, ignore_eos=True)
        self._arrivals += 1
        req = v["Request"](
            request_id=rid,
            prompt_token_ids=prompt_token_ids(
                request_id, prompt_tokens, tuple(prefix_ids), self.block_size_tokens
            ),
            sampling_params=params,
            pooling_params=None,
            arrival_time=float(self._arrivals),
            cache_salt=cache_salt,
            priority=priority,
            block_hasher=self._block_hasher,
        )
        req.tenant = tenant  # for whoever inspects vLLM's queues; vLLM ignores it
        self._sched.add_request(req)

    def abort_request(self, request_id: int) -> None:
        """Cancel a request wherever it is (waiting, running or preempted); its
        blocks are freed at once.  Unknown or finished ids are ignored, as
        vLLM does."""
        v = _vllm()
        self._sched.finish_requests(str(request_id), v["RequestStatus"].FINISHED_ABORTED)

    def step(self) -> dict[str, Any]:
        """One engine step: schedule, a fabricated forward pass, update."""
        v = _vllm()
        sched = self._sched
        self._preempt_log.clear()
        so = sched.schedule()
        self._steps += 1

        batch_ids = list(so.num_scheduled_tokens)
        preempted_set = set(so.preempted_req_ids or ())
        logged = [r for r in self._preempt_log if r in preempted_set]
        if set(logged) != preempted_set:  # vLLM changed how it preempts
            raise RuntimeError(
                f"preemption log {self._preempt_log} disagrees with "
                f"SchedulerOutput.preempted_req_ids {sorted(preempted_set)}"
            )
        preempted = list(dict.fromkeys(logged))

        # Prefix-cache hits of the requests admitted in this step: the tokens
        # vLLM counts as computed before it schedules anything for them.
        cached_hits: dict[int, int] = {}
        for new in so.scheduled_new_reqs:
            cached_hits[int(new.req_id)] = new.num_computed_tokens
        cached = so.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            if rid in cached.resumed_req_ids:
                cached_hits[int(rid)] = cached.num_computed_tokens[i]

        # The fabricated forward pass.  After schedule(), num_computed_tokens
        # already includes this step's tokens, and is_prefill_chunk says whether
        # known tokens remain uncomputed (then the model runner samples nothing).
        sampled: list[list[int]] = []
        for rid in batch_ids:
            req = sched.requests[rid]
            if req.is_prefill_chunk:
                sampled.append([])
            else:
                sampled.append([_token(_TAG_SAMPLE, int(rid), req.num_output_tokens)])
        output = v["ModelRunnerOutput"](
            req_ids=batch_ids,
            req_id_to_index={rid: i for i, rid in enumerate(batch_ids)},
            sampled_token_ids=sampled,
        )
        engine_outputs = sched.update_from_output(so, output)

        finished: list[int] = []
        first_token: list[int] = []
        for client in sorted(engine_outputs):
            for out in engine_outputs[client].outputs:
                if out.new_token_ids and out.request_id not in self._first_token_seen:
                    self._first_token_seen.add(out.request_id)
                    first_token.append(int(out.request_id))
                if out.finish_reason is not None:
                    finished.append(int(out.request_id))
                    self._first_token_seen.discard(out.request_id)

        kvm = sched.kv_cache_manager
        blocks_in_use = {
            int(req.request_id): len(kvm.get_block_ids(req.request_id)[0])
            for req in sched.running
        }
        return {
            "batch": [(int(rid), n) for rid, n in so.num_scheduled_tokens.items()],
            "preempted": [int(r) for r in preempted],
            "finished": finished,
            "first_token": first_token,
            "blocks_in_use": blocks_in_use,
            "free_blocks": kvm.block_pool.get_num_free_blocks(),
            "cached_hits": cached_hits,
        }

    def has_unfinished(self) -> bool:
        return self._sched.has_unfinished_requests()

    # -- extras for tests and benchmarks ----------------------------------------

    @property
    def scheduler(self) -> Any:
        """The wrapped ``vllm.v1.core.sched.scheduler.Scheduler``."""
        return self._sched

    def num_running(self) -> int:
        return len(self._sched.running)

    def num_waiting(self) -> int:
        return len(self._sched.waiting)


# --- the adapter: vLLM's scheduler behind the protocol -----------------------------------

#: Pools: "ample" as the order-policy setups (8 sequences of the longest
#: context fit), "small" as the eviction setups (preemption happens).
AMPLE_BLOCKS, SMALL_BLOCKS = 4096, 512


def _replica() -> tuple[dict[str, Any], Any]:
    from tenantry.runner.setups import COST, REPLICA

    return dict(REPLICA), COST


class VllmAdapter:
    """vLLM's V1 scheduler as a scheduler under test.

    Claims (what vLLM's code promises, nothing more): the safety invariants
    (always checked); FCFS-TENANT and, for ``fcfs``, FCFS-TIER or, for
    ``priority``, TIER-ORDER: vLLM admits from its waiting queue in order
    (``priority``: by priority, then arrival) and stops at the first request it
    cannot allocate; the order claims are judged on admissions past requests
    that surely did not fit, so no copy of the model's chunking is needed.

    Args:
        policy: ``fcfs`` or ``priority`` (vLLM's two policies).
        tenants: the tenants (tiers become vLLM priorities).
        num_blocks: KV pool (the adapter adds vLLM's null block itself).
        cache: ``off``, ``shared`` (vLLM's prefix cache, no salt) or
            ``salted`` (prefix cache, ``cache_salt`` = the tenant's salt).

    Raises:
        RuntimeError: if vLLM is not installed or not the supported version.
    """

    def __init__(self, *, policy: str = "fcfs", tenants: tuple[TenantConfig, ...] = (),
                 num_blocks: int = AMPLE_BLOCKS, cache: str = "off") -> None:
        replica, cost = _replica()
        tenants = tuple(tenants) or (TenantConfig("default"),)
        self.max_context_tokens = min(replica["max_context_tokens"], num_blocks * replica["block_size_tokens"])
        self.vs = VllmScheduler(num_blocks=num_blocks, block_size_tokens=replica["block_size_tokens"],
                                max_num_seqs=replica["max_num_seqs"], token_budget=replica["token_budget"],
                                policy=policy, enable_prefix_caching=cache != "off",
                                max_model_len=self.max_context_tokens)
        config = Config(
            tenants=tenants, block_size_tokens=replica["block_size_tokens"], num_blocks=num_blocks,
            max_num_seqs=replica["max_num_seqs"], token_budget=replica["token_budget"],
            max_context_tokens=self.max_context_tokens, order=OrderConfig(policy=policy),
            eviction=EvictionConfig(victim="newest" if policy == "fcfs" else "lowest_priority"),
            prefix_cache=cache, cost=cost,
        )
        self.claims = Claims(config, invariants=("FCFS-TENANT", "FCFS-TIER" if policy == "fcfs" else "TIER-ORDER"),
                             describe=f"{vllm_available()[1]} scheduler, policy {policy}, "
                             f"{num_blocks} blocks, prefix cache {cache}")
        self.cache = cache
        self.tiers = {t.name: t.tier for t in tenants}
        self.salts = {t.name: t.salt for t in tenants}
        self._held: dict[int, tuple[int, ...]] = {}
        self._free = num_blocks
        self._last: dict[str, Any] = {}
        sched = self.vs.scheduler
        original = sched.update_from_output

        def snapshot_then_update(scheduler_output: Any, model_output: Any) -> Any:
            # KV as held during the step: after schedule(), before finished requests free theirs.
            kvm = sched.kv_cache_manager
            self._held = {int(r.request_id): tuple(kvm.get_block_ids(r.request_id)[0]) for r in sched.running}
            self._free = kvm.block_pool.get_num_free_blocks()
            return original(scheduler_output, model_output)

        sched.update_from_output = snapshot_then_update

    def add_request(self, request: Any) -> str | None:
        """Queue the request; refuse one longer than the context limit, as vLLM's front end does."""
        if request.prompt_tokens + request.output_tokens > self.max_context_tokens:
            return "too_long"
        self.vs.add_request(request.request_id, request.tenant, request.prompt_tokens, request.output_tokens,
                            prefix_ids=tuple(request.prefix_ids), priority=self.tiers.get(request.tenant, 0),
                            cache_salt=self.salts.get(request.tenant, request.tenant) if self.cache == "salted"
                            else None)
        return None

    def abort_request(self, request_id: int) -> None:
        self.vs.abort_request(request_id)

    def plan_step(self, t_s: float) -> Plan:
        """One vLLM engine step, reported as a plan."""
        d = self._last = self.vs.step()
        hits = d["cached_hits"]
        batch = tuple(Scheduled(rid, n, hits.get(rid)) for rid, n in d["batch"])
        return Plan(batch=batch, preempted=tuple(d["preempted"]), blocks=dict(self._held),
                    free_blocks=self._free)

    def take_results(self, results: StepResults) -> None:
        """vLLM must have finished exactly the requests the harness finished."""
        mine = sorted(self._last.get("finished", ()))
        if sorted(results.finished) != mine:
            raise AssertionError(f"vLLM finished {mine} in step {results.step_index}, the harness "
                                 f"{sorted(results.finished)}")


def make_fcfs(tenants: tuple[TenantConfig, ...] = ()) -> VllmAdapter:
    """vLLM fcfs, ample pool."""
    return VllmAdapter(policy="fcfs", tenants=tenants)


def make_priority(tenants: tuple[TenantConfig, ...] = ()) -> VllmAdapter:
    """vLLM priority (tier = priority), ample pool."""
    return VllmAdapter(policy="priority", tenants=tenants)


def make_fcfs_small(tenants: tuple[TenantConfig, ...] = ()) -> VllmAdapter:
    """vLLM fcfs on the small pool (preemption happens)."""
    return VllmAdapter(policy="fcfs", tenants=tenants, num_blocks=SMALL_BLOCKS)


def make_priority_small(tenants: tuple[TenantConfig, ...] = ()) -> VllmAdapter:
    """vLLM priority on the small pool."""
    return VllmAdapter(policy="priority", tenants=tenants, num_blocks=SMALL_BLOCKS)


def make_shared_cache(tenants: tuple[TenantConfig, ...] = ()) -> VllmAdapter:
    """vLLM fcfs with its prefix cache and no cache salt."""
    return VllmAdapter(policy="fcfs", tenants=tenants, cache="shared")


def make_salted_cache(tenants: tuple[TenantConfig, ...] = ()) -> VllmAdapter:
    """vLLM fcfs with its prefix cache and ``cache_salt`` per tenant (claims SALT-ISOLATION)."""
    return VllmAdapter(policy="fcfs", tenants=tenants, cache="salted")
