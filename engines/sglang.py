"""SGLang 0.5.23's real scheduler, driven step by step on a CPU-only machine,
and the :class:`~tenantry.verify.protocol.SchedulerAdapter` around it.

:class:`SglangScheduler` drives ``sglang.srt.managers.scheduler.Scheduler``
with no GPU, no model weights, no worker process and no ZMQ sockets.  Each
:meth:`~SglangScheduler.step` calls SGLang's own scheduler methods in the order
of its event loop (``event_loop_normal``; ``event_loop_overlap`` when
``overlap=True``):

1. ``get_next_batch_to_run()`` decides the batch: queue order
   (``SchedulePolicy``: lpm, dfs-weight, fcfs, lof, ... and priority order when
   priority scheduling is on), the prefill admission loop (``PrefillAdder``,
   chunked prefill, priority preemption), prefill before decode, the decode
   memory check and retraction (``retract_decode``);
2. ``run_batch()`` runs unchanged; the model worker it calls is a stand-in
   whose ``forward_batch_generation`` returns a ``GenerationBatchResult`` with
   one sampled token per request (the counterpart of vLLM's fabricated
   ``ModelRunnerOutput``); SGLang itself discards the token of a request that
   is still in a prefill chunk;
3. ``process_batch_result()`` (``process_batch_result_prefill`` /
   ``_decode``) appends the tokens, stops requests at ``max_new_tokens``,
   frees their KV and inserts it into the radix cache.

Setup without ``Scheduler.__init__`` (which loads a model, opens sockets and
joins torch.distributed): the configuration is SGLang's own
``ServerArgs`` for a one-layer Llama ``config.json`` written into a temporary
folder (``device="cpu"``, ``load_format="dummy"``, ``skip_tokenizer_init``),
made current with ``runtime_context.create_context`` / ``use_context`` (one
context per scheduler, so two schedulers in one process do not share
settings); the KV pools are SGLang's ``ReqToTokenPool``, ``MHATokenToKVPool``
and ``PagedTokenToKVPoolAllocator`` on the CPU (page size 16: SGLang's own
non-Triton allocation path), the prefix cache is what SGLang's default
factory builds (``UnifiedRadixCache``, disabled when the prefix cache is off);
the object is made with ``Scheduler.__new__``, about forty attributes that
``__init__`` would read off the model worker and process groups are set
here, and SGLang's own ``init_*`` methods build everything else
(``init_running_status``, ``init_chunked_prefill``, ``init_schedule_policy``,
``init_overlap``, ``init_output_streamer``, ``init_batch_result_processor``...).
The single-rank process groups are a namespace with ``world_size=1``.

Requests enter through SGLang's own ``handle_generate_request`` (a
``TokenizedGenerateReqInput``, as the tokenizer manager sends it), so
SGLang's clipping of ``max_new_tokens`` to the pool and its prompt-length
checks apply; aborts through ``abort_request(AbortReq)``.

What SGLang does not report, the driver reads off its state:

* preemptions: SGLang keeps no list; every running request that re-enters
  the waiting queue during a step (``_add_request_to_queue``, called by
  ``retract_decode`` and by priority preemption) is a preemption, in that
  order;
* KV blocks: the pages of ``req_to_token[req_pool_idx, :kv_allocated_len]``
  of every running request, as page ids; free blocks are the allocator's
  free pages plus the radix cache's evictable pages (SGLang evicts those on
  demand);
* prefix-cache hits: the ``prefix_lens`` of the extend batch when a request
  enters it.

Request ids: SGLang aborts every request whose id *starts with* the aborted
id; the driver's ids (``"r<id>."``) are never a prefix of one another.

Determinism: token ids are fixed functions of the request id and position
(:func:`~tenantry.engines.vllm.prompt_token_ids`), the sampled tokens of the
request id and output index, ``random_seed=0``; two identical drives give
identical step lists.

SGLang is imported lazily: importing this module never needs SGLang;
:func:`sglang_available` says whether it can be used and, if not, why.  Install
it with ``scripts/install_sglang.sh``.  Only SGLang 0.5.23 is accepted: its
scheduler internals are not a public interface.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import types
import warnings
from typing import Any

from tenantry.model.config import Config, EvictionConfig, OrderConfig, TenantConfig
from tenantry.verify.protocol import Claims, Plan, Rejection, Scheduled, StepResults

from .vllm import FIRST_TOKEN_ID, VOCAB_SIZE, _mix, prompt_token_ids

__all__ = [
    "SUPPORTED_SGLANG", "POLICIES", "sglang_available", "SglangScheduler", "SglangAdapter",
    "make_lpm", "make_fcfs", "make_priority", "make_dfs_weight", "make_lof",
    "make_lpm_small", "make_fcfs_small", "make_priority_small", "make_dfs_weight_small",
    "make_lpm_tight", "make_priority_tight", "make_shared_cache", "make_salted_cache", "make_lpm_overlap", "AMPLE_BLOCKS", "SMALL_BLOCKS",
]

#: The one SGLang release this driver accepts (exact version).
SUPPORTED_SGLANG = "0.5.23"

#: SGLang's queue policies (``--schedule-policy``) the driver accepts.
POLICIES = ("lpm", "dfs-weight", "fcfs", "lof", "random", "hrrn", "shortest-prefill-first", "routing-key")

_TAG_SAMPLE = 0x5341_4D50


#: Serialises every entry into SGLang in this process (see SglangScheduler._context).
_SGLANG_LOCK = threading.RLock()


def _rid(request_id: int) -> str:
    """SGLang request id: the terminator keeps ids from being prefixes of one another."""
    return f"r{request_id}."


def _sample(request_id: int, output_index: int) -> int:
    return FIRST_TOKEN_ID + _mix(_TAG_SAMPLE, request_id, output_index) % (VOCAB_SIZE - FIRST_TOKEN_ID)


@functools.lru_cache(maxsize=1)
def sglang_available() -> tuple[bool, str]:
    """``(True, "sglang 0.5.23")`` if SGLang's scheduler can be driven here,
    else ``(False, reason)``.  The first call imports SGLang (about 7 s)."""
    import importlib.metadata as md

    try:
        version = md.version("sglang")
    except md.PackageNotFoundError:
        return False, "sglang is not installed (scripts/install_sglang.sh installs it)"
    if version != SUPPORTED_SGLANG:
        return False, (f"sglang {version} is installed but this adapter drives sglang {SUPPORTED_SGLANG} "
                       "scheduler internals only (scripts/install_sglang.sh pins it)")
    try:
        _sglang()
    except Exception as exc:  # an ImportError of a missing dependency, mostly
        return False, f"sglang {version} is installed but does not import: {exc!r}"
    return True, f"sglang {version}"


class _Absent:
    """Stands for any name of the torchvision stub; raises when used."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> "_Absent":
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Absent(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self._name}: torchvision is not installed (tenantry's import stub)")


class _TorchvisionStub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Import stub for torchvision, last on ``sys.meta_path``: found only when no
    real torchvision is installed.  SGLang imports torchvision at module level
    in two multimodal config modules that the scheduler path never calls, and
    no torchvision wheel imports beside the CPU torch used here."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        mod = types.ModuleType(spec.name)

        def getattr_(attr: str, _name: str = spec.name) -> Any:
            if attr.startswith("__"):
                raise AttributeError(attr)
            return _Absent(f"{_name}.{attr}")

        mod.__getattr__ = getattr_  # type: ignore[method-assign]
        mod.__path__ = []  # type: ignore[attr-defined]
        mod.__version__ = "0.0.0"  # type: ignore[attr-defined]  (older than any real one)
        return mod

    def exec_module(self, module: types.ModuleType) -> None:
        return None


@functools.lru_cache(maxsize=1)
def _sglang() -> dict[str, Any]:
    """Import the SGLang pieces the driver needs, once."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("SGLANG_DISABLE_REQUEST_LOGGING", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    for name in ("sglang", "transformers"):
        lg = logging.getLogger(name)
        if lg.level == logging.NOTSET:
            lg.setLevel(logging.ERROR)  # e.g. "KV cache pool is full. Retract requests."
    if importlib.util.find_spec("torchvision") is None and not any(
            isinstance(f, _TorchvisionStub) for f in sys.meta_path):
        sys.meta_path.append(_TorchvisionStub())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Triton is not supported on current platform" and the like
        import torch
        from sglang.srt import runtime_context as rc
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.managers.io_struct import AbortReq, TokenizedGenerateReqInput
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        from sglang.srt.managers.scheduler import Scheduler
        from sglang.srt.managers.scheduler_components.ipc_channels import SchedulerIpcChannels
        from sglang.srt.managers.utils import GenerationBatchResult
        from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
        from sglang.srt.mem_cache.registry import TreeCacheBuildContext, default_radix_cache_factory
        from sglang.srt.model_executor.model_runner_components.ngram_embedding_manager import (
            NgramEmbeddingManager,
        )
        from sglang.srt.sampling.sampling_params import SamplingParams
        from sglang.srt.server_args import ServerArgs
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
        from sglang.srt.utils.torch_memory_saver_adapter import TorchMemorySaverAdapter
        from sglang.srt.environ import envs
        try:
            from sglang.srt.mem_cache.memory_pool import get_req_to_token_extra_context_len
        except ImportError:  # pragma: no cover - 0.5.23 has it
            get_req_to_token_extra_context_len = lambda: 4  # noqa: E731
    return dict(locals())


def _tiny_llama_config(max_model_len: int) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4,
        "num_hidden_layers": 1, "vocab_size": VOCAB_SIZE, "max_position_embeddings": max_model_len,
        "rms_norm_eps": 1e-5, "torch_dtype": "float32", "pad_token_id": 0, "bos_token_id": 1,
        "eos_token_id": 2, "tie_word_embeddings": False,
    }


class _Sent:
    """Stands for a ZMQ sender: keeps what SGLang sends (outputs, aborts)."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def send_output(self, obj: Any, *args: Any, **kwargs: Any) -> None:
        self.sent.append(obj)

    send_pyobj = send_output


class _ModelRunner:
    """What the scheduler reads off ``tp_worker.model_runner`` (no model)."""

    prefill_aware_swa = False
    lora_manager = None
    canary_manager = None
    forward_stream = None

    def __init__(self, ngram_embedding_manager: Any) -> None:
        self.attn_backend = types.SimpleNamespace()  # no extend_attention_block_m: SGLang's fallback (64)
        self.ngram_embedding_manager = ngram_embedding_manager


class _ModelWorker:
    """The model worker's place in ``run_batch``: one sampled token per request.

    ``forward_batch_generation`` returns ``GenerationBatchResult(next_token_ids)``
    with a token that depends only on the request and its output index, so
    runs are reproducible.  SGLang discards the token of a request whose
    prompt is still being prefilled in chunks, as with a real model.
    """

    def __init__(self, model_config: Any, runner: _ModelRunner, ids: dict[str, int]) -> None:
        self.model_config = model_config
        self.model_runner = runner
        self._ids = ids
        self.calls = 0

    def forward_batch_generation(self, batch: Any, **kwargs: Any) -> Any:
        s = _sglang()
        self.calls += 1
        toks = [_sample(self._ids.get(r.rid, 0), len(r.output_ids)) for r in batch.reqs]
        return s["GenerationBatchResult"](next_token_ids=s["torch"].tensor(toks, dtype=s["torch"].int64))

    def get_pad_input_ids_func(self) -> None:
        return None


#: SGLang init methods that build scheduler components from the attributes set
#: by hand (in this order; each reads only what the ones before it set).
_INIT_METHODS = (
    "init_metrics_collector", "init_tokenizer", "init_moe_gemm_config", "init_running_status",
    "init_chunked_prefill", "maybe_init_dynamic_chunk_sizer", "init_metrics_reporter", "init_schedule_policy",
    "init_disaggregation", "init_overlap", "maybe_init_ngram_embedding", "init_deterministic_inference_config",
    "init_dsa_kpool_truncation_align", "init_mamba_truncation_align", "init_weight_updater",
    "init_lora_drainer", "init_lora_overlap_loader", "init_grammar_manager", "maybe_init_scripted_scheduler_hook",
    "init_dp_attn_adapter", "init_pool_stats_observer", "init_invariant_checker", "init_load_publisher",
    "init_load_inquirer", "init_output_streamer", "init_batch_result_processor", "init_internal_state",
    "init_profiler", "init_kv_events_publisher", "init_diffusion_llm",
)


class SglangScheduler:
    """SGLang 0.5.23's ``Scheduler`` behind tenantry's step-mode calls.

    Args:
        num_blocks: KV pool, in pages of ``block_size_tokens`` tokens
            (SGLang's ``max_total_tokens = num_blocks * block_size_tokens``;
            SGLang's padding page 0 is extra and never handed out).
        block_size_tokens: SGLang's ``page_size``.
        max_num_seqs: ``max_running_requests``.
        token_budget: ``chunked_prefill_size`` and ``max_prefill_tokens``
            (tokens per prefill step; a decode step runs every running request).
        policy: SGLang's ``schedule_policy`` (one of :data:`POLICIES`).  SGLang
            itself falls back to fcfs for a cache-aware policy with the prefix
            cache off.
        priority: ``enable_priority_scheduling`` with
            ``schedule_low_priority_values_first`` (a lower ``priority`` runs
            first and is preempted last); priority preemption is on, as in
            SGLang's default.
        prefix_cache: the radix cache on (else ``disable_radix_cache``).
        overlap: SGLang's overlap schedule (step N's result is processed after
            step N+1 is planned); off by default, as SGLang's non-overlap loop.
        max_model_len: the model's context length (``context_length``).
        conservativeness: SGLang's ``schedule_conservativeness`` (scales the
            share of ``max_new_tokens`` admission reserves; below 1 admits more
            and retracts more).

    Raises:
        RuntimeError: if SGLang is not installed, not 0.5.23, or does not import.
        ValueError: on a bad argument.
    """

    def __init__(self, *, num_blocks: int, block_size_tokens: int = 16, max_num_seqs: int = 8,
                 token_budget: int = 256, policy: str = "lpm", priority: bool = False,
                 prefix_cache: bool = True, overlap: bool = False, max_model_len: int = 8192,
                 conservativeness: float = 1.0) -> None:
        ok, why = sglang_available()
        if not ok:
            raise RuntimeError(why)
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, not {policy!r}")
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2, not {num_blocks}")
        if block_size_tokens < 2:
            raise ValueError(f"block_size_tokens must be >= 2 (SGLang's paged allocator), not {block_size_tokens}")
        if token_budget < block_size_tokens:
            raise ValueError(f"token_budget must be >= block_size_tokens, not {token_budget}")
        s = _sglang()
        rc = s["rc"]
        self.num_blocks, self.block_size_tokens = num_blocks, block_size_tokens
        self.policy, self.priority, self.prefix_cache, self.overlap = policy, priority, prefix_cache, overlap
        self.max_num_seqs = max_num_seqs
        pool_tokens = num_blocks * block_size_tokens
        model_dir = tempfile.mkdtemp(prefix="tenantry-sglang-model-")
        try:
            with open(os.path.join(model_dir, "config.json"), "w") as f:
                json.dump(_tiny_llama_config(max_model_len), f)
            with _SGLANG_LOCK, warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.server_args = s["ServerArgs"](
                    model_path=model_dir, device="cpu", load_format="dummy", skip_tokenizer_init=True,
                    page_size=block_size_tokens, schedule_policy=policy, max_running_requests=max_num_seqs,
                    chunked_prefill_size=token_budget, max_prefill_tokens=token_budget,
                    max_total_tokens=pool_tokens, context_length=max_model_len,
                    disable_radix_cache=not prefix_cache, disable_overlap_schedule=not overlap,
                    enable_priority_scheduling=priority, schedule_low_priority_values_first=True,
                    schedule_conservativeness=conservativeness, random_seed=0, dtype="float32")
                self._ctx = rc.create_context(self.server_args, role="scheduler", ranks=rc.SpawnRanks(world_rank=0))
                with self._context():
                    self.model_config = s["ModelConfig"].from_server_args(self.server_args)
                    self._build(pool_tokens)
        finally:
            shutil.rmtree(model_dir, ignore_errors=True)
        self._running: dict[str, Any] = {}   # rid -> Req, in order of entry (the harness's "running")
        self._aborted: set[str] = set()      # rids the client aborted
        self._reported: set[str] = set()     # rids that ended (finished, aborted or rejected)
        self._requeued: list[tuple[Any, bool]] = []
        self.steps = 0

    @contextlib.contextmanager
    def _context(self) -> Any:
        # SGLang's use_context swaps process globals and "does not isolate concurrent threads":
        # instances driven from several threads (the matrix runs cells in threads) take turns.
        with _SGLANG_LOCK, _sglang()["rc"].use_context(self._ctx):
            yield

    def _build(self, pool_tokens: int) -> None:
        s = _sglang()
        rc, torch = s["rc"], s["torch"]
        sch, mem = rc.get_schedule(), rc.get_memory()
        mc = self.model_config
        B = self.block_size_tokens
        single = types.SimpleNamespace(world_size=1, first_rank=0, is_first_rank=True, is_last_rank=True,
                                       rank_in_group=0, rank=0, ranks=[0], local_rank=0, cpu_group=None,
                                       device_group=None)
        rc.get_parallel().override_permanently(tp_group=single, attn_tp_group=single, attn_cp_group=single,
                                               pp_group=single, world_group=single)
        kv = s["MHATokenToKVPool"](pool_tokens, page_size=B, dtype=torch.float32, head_num=1, head_dim=1,
                                   layer_num=1, device="cpu", enable_memory_saver=False)
        alloc = s["PagedTokenToKVPoolAllocator"](pool_tokens, B, torch.float32, "cpu", kv, need_sort=False)
        rtp = s["ReqToTokenPool"](size=self.max_num_seqs,
                                  max_context_len=mc.context_len + s["get_req_to_token_extra_context_len"](),
                                  device="cpu", enable_memory_saver=False)
        params = s["CacheInitParams"](disable=not self.prefix_cache, req_to_token_pool=rtp,
                                      token_to_kv_pool_allocator=alloc, page_size=B,
                                      eviction_policy=mem.radix_eviction_policy,
                                      eviction_policy_config=mem.radix_eviction_policy_config,
                                      chunked_prefill_size=sch.chunked_prefill_size)
        tree = s["default_radix_cache_factory"](s["TreeCacheBuildContext"](
            server_args=self.server_args, params=params, is_hybrid_swa=False, is_hybrid_ssm=False,
            enable_hierarchical_cache=False, disable_radix_cache=not self.prefix_cache, tp_worker=None,
            model_config=mc, tp_size=1, tp_rank=0, tp_group=None))
        self._ids: dict[str, int] = {}
        runner = _ModelRunner(s["NgramEmbeddingManager"].from_model(
            model=None, model_config=mc, req_to_token_pool=rtp, max_running_requests=self.max_num_seqs,
            device="cpu"))
        self.worker = _ModelWorker(mc, runner, self._ids)
        S = s["Scheduler"].__new__(s["Scheduler"])
        self._sched = S
        # What Scheduler.__init__ reads off its arguments and the runtime context.
        S.is_initializing = True
        S.server_args = self.server_args
        S.forward_ct = 0
        S.processed_tokens_counter = 0
        S.cur_batch_for_debug = None
        S.nccl_port = None
        S.schedule_policy = sch.schedule_policy
        S.enable_priority_scheduling = sch.enable_priority_scheduling
        S.abort_on_priority_when_disabled = sch.abort_on_priority_when_disabled
        S.schedule_low_priority_values_first = sch.schedule_low_priority_values_first
        S.priority_scheduling_preemption_threshold = sch.priority_scheduling_preemption_threshold
        S.enable_lora = False
        S.enable_lora_overlap_loading = False
        S.max_loras_per_batch = rc.get_lora().max_loras_per_batch
        S.enable_overlap = not sch.disable_overlap_schedule
        S.enable_overlap_mlx = False
        S.enable_pdmux = False
        S.skip_tokenizer_init = True
        S.stream_interval = rc.get_serving().stream_interval
        S.spec_algorithm = s["SpeculativeAlgorithm"].from_string(rc.get_spec().speculative_algorithm)
        S.page_size = sch.page_size
        S.enable_hierarchical_cache = False
        S.enable_lmcache = False
        S.enable_session_radix_cache = False
        S.enable_hicache_storage = False
        S.enable_unified_cache_external_linker = False
        S.enable_decode_hicache = False
        S.max_recv_per_poll = s["envs"].SGLANG_SCHEDULER_MAX_RECV_PER_POLL.get()
        S.max_new_tokens_limit = s["envs"].SGLANG_MAX_NEW_TOKENS_LIMIT.get()
        S.enable_hisparse = False
        S.attn_dp_enabled = False
        S.enable_unified_memory = False
        S.model_config = mc
        S.dllm_config = None
        # What init_model_worker and the KV cache builder would set.
        S.tp_worker = S.model_worker = self.worker
        S.draft_worker = None
        S.req_to_token_pool, S.token_to_kv_pool_allocator, S.tree_cache = rtp, alloc, tree
        S.is_hybrid_swa = S.is_hybrid_ssm = False
        S.sliding_window_size = None
        S.full_tokens_per_layer, S.swa_tokens_per_layer = pool_tokens, 0
        S.disable_radix_cache = not self.prefix_cache
        S.hisparse_coordinator = None
        S.decode_offload_manager = None
        S.max_total_num_tokens = pool_tokens
        S.max_prefill_tokens = sch.max_prefill_tokens
        S.max_running_requests = self.max_num_seqs
        S.max_queued_requests = sch.max_queued_requests
        S.max_req_len = min(mc.context_len - 1, pool_tokens - 1)  # as TpModelWorker.get_worker_info
        S.max_req_input_len = S.max_req_len - 5
        S.random_seed = 0
        S.device = "cpu"
        S.forward_stream = torch.cpu.Stream()  # no-op CPU streams: the overlap loop's stream calls run as on a GPU
        S.schedule_stream = torch.cpu.Stream()
        runner.forward_stream = S.forward_stream
        S.min_free_slots_delayer = None
        S.tp_group = S.attn_tp_group = S.attn_cp_group = S.pp_group = S.world_group = S.dp_tp_group = single
        S.tp_cpu_group = S.attn_tp_cpu_group = S.attn_cp_cpu_group = S.dp_tp_cpu_group = None
        S.pad_input_ids_func = None
        S.rust_server = None
        S.load_snapshot_writer = None
        S.recv_from_tokenizer = None
        self._to_tokenizer, self._to_detokenizer = _Sent(), _Sent()
        S.ipc_channels = s["SchedulerIpcChannels"](recv_from_tokenizer=None, recv_from_rpc=None,
                                                   send_to_tokenizer=self._to_tokenizer,
                                                   send_to_detokenizer=self._to_detokenizer,
                                                   send_metrics_from_scheduler=None)
        # init_watch_dog_memory_saver_input_blocker without its watchdog thread.
        S.memory_saver_adapter = s["TorchMemorySaverAdapter"].create(enable=False)
        S.recv_skipper = None
        S.input_blocker = None
        if not rc.get_parallel().pp_max_micro_batch_size:  # as init_model_worker
            rc.get_context().override("scheduler.pp_max_micro_batch_size_default",
                                      pp_max_micro_batch_size=max(self.max_num_seqs // rc.get_parallel().pp_size, 1))
        for name in _INIT_METHODS:
            if name == "init_invariant_checker":
                S.scheduler_stage_metrics = S.metrics_reporter.scheduler_stage_metrics
            getattr(S, name)()
        S.is_initializing = False
        S._sched_idled = False
        # Record every request that re-enters the waiting queue (preemption / retraction).
        original = S._add_request_to_queue

        def recording_add(req: Any, is_retracted: bool = False) -> Any:
            self._requeued.append((req, is_retracted))
            return original(req, is_retracted=is_retracted)

        S._add_request_to_queue = recording_add

    # -- the adapter calls --------------------------------------------------------------

    @property
    def max_request_tokens(self) -> int:
        """The most prompt + output tokens the adapter lets through to SGLang as within
        the context: ``context_len - 6``.  SGLang has two limits: an output is clipped
        past ``max_req_len - 1`` prompt + output tokens (``max_req_len`` is at most
        ``context_len - 1``, ``TpModelWorker``; ``Scheduler.init_req_max_new_tokens``),
        and a prompt of ``max_req_input_len = max_req_len - 5`` tokens *or more* is
        refused with an error (``validate_input_length`` compares with ``>=``; its
        message says the input "exceeds" the maximum when it equals it).  One total
        limit covers both: with at least one output token, a total of
        ``context_len - 6`` keeps the prompt within ``context_len - 7 =
        max_req_input_len - 1``; the four totals above it that SGLang would run are
        refused ``too_long`` (conservative).  A smaller pool lowers ``max_req_len``
        too: that part is ``too_large``."""
        return int(self.model_config.context_len) - 6

    @property
    def max_input_tokens(self) -> int:
        """The longest prompt SGLang takes: ``max_req_input_len - 1`` (it refuses a prompt of
        ``max_req_input_len = max_req_len - 5`` tokens or more; a pool smaller than the
        context lowers it)."""
        return int(self._sched.max_req_input_len) - 1

    def max_output_tokens(self, prompt_tokens: int, output_tokens: int) -> int | None:
        """What SGLang's admission leaves of ``output_tokens`` (its own
        ``max_new_tokens`` clipping to the context and the pool,
        ``Scheduler.init_req_max_new_tokens``), or None if the prompt can never fit."""
        S = self._sched
        with self._context():
            n = max(0, min(output_tokens, S.max_req_len - prompt_tokens - 1))
            return S.token_to_kv_pool_allocator.max_new_tokens_for_memory(
                prompt_tokens, n, token_capacity=S.max_total_num_tokens, sliding_window_size=None,
                chunk_size=S.chunked_prefill_size)

    def add_request(self, request_id: int, prompt_tokens: int, output_tokens: int, *,
                    prefix_ids: tuple[int, ...] = (), priority: int | None = None,
                    extra_key: str | None = None) -> None:
        """Queue a request through ``handle_generate_request`` that generates
        ``output_tokens`` tokens (``max_new_tokens``, EOS ignored).  ``extra_key``
        namespaces its prefix-cache entries (SGLang's per-tenant cache key)."""
        if prompt_tokens < 1 or output_tokens < 1:
            raise ValueError(f"prompt_tokens and output_tokens must be >= 1, not {prompt_tokens}, {output_tokens}")
        rid = _rid(request_id)
        if rid in self._ids:
            raise ValueError(f"request {request_id} was already added")
        s = _sglang()
        from array import array

        self._ids[rid] = request_id
        with self._context():
            sp = s["SamplingParams"](max_new_tokens=output_tokens)
            sp.normalize(None)
            sp.verify(self.model_config.vocab_size)
            ids = prompt_token_ids(request_id, prompt_tokens, tuple(prefix_ids), self.block_size_tokens)
            self._sched.handle_generate_request(s["TokenizedGenerateReqInput"](
                rid=rid, input_text=None, input_ids=array("q", ids), input_embeds=None, mm_inputs=None,
                token_type_ids=None, sampling_params=sp, return_logprob=False, logprob_start_len=-1,
                top_logprobs_num=0, token_ids_logprob=None, stream=False, priority=priority,
                extra_key=extra_key))

    def abort_request(self, request_id: int) -> None:
        """The client cancels: SGLang's ``abort_request`` (a waiting request is
        dropped at once; a running one finishes aborted after one more step)."""
        rid = _rid(request_id)
        if rid not in self._ids or rid in self._reported:
            return
        self._aborted.add(rid)
        self._reported.add(rid)
        self._running.pop(rid, None)
        with self._context():
            self._sched.abort_request(_sglang()["AbortReq"](rid=rid))

    def _plan(self) -> Any:
        """get_next_batch_to_run, as the event loop calls it."""
        S = self._sched
        plan = S.get_next_batch_to_run(running_batch=S.running_batch, last_batch=S.last_batch)
        S.running_batch = plan.running_batch
        S.cur_batch_for_debug = plan.batch_to_run
        return plan.batch_to_run

    def step(self) -> dict[str, Any]:
        """One scheduler iteration; returns what it decided.

        Keys: ``batch`` [(request id, tokens)], ``computed`` {request id:
        tokens already computed when it entered the batch (prefix-cache hit or
        the chunks before)}, ``preempted`` [ids, in order], ``rejected`` [(id,
        SGLang's message)], ``finished`` [ids], ``first_token`` [ids],
        ``blocks`` {running id: page ids}, ``free_blocks`` (None while an
        aborted request still holds KV), ``mode`` (``extend``/``decode``/None).
        """
        with self._context():
            return self._step_overlap() if self.overlap else self._step()

    def _step(self) -> dict[str, Any]:
        S = self._sched
        self._requeued.clear()
        self._to_tokenizer.sent.clear()
        self._to_detokenizer.sent.clear()
        batch = self._plan()
        out = self._decisions(batch)
        if batch:
            result = S.run_batch(batch)
            self._snapshot(out)
            S.process_batch_result(batch, result)
        else:
            self._snapshot(out)
            S._sched_idled = True
        S.last_batch = batch
        self._outcomes(batch, out)
        self.steps += 1
        return out

    def _step_overlap(self) -> dict[str, Any]:
        """One iteration of SGLang's overlap loop: plan and launch step N, then
        process the result of step N-1 (unless SGLang disables the overlap for
        this batch, then N-1 is processed before N is launched)."""
        S = self._sched
        self._requeued.clear()
        self._to_tokenizer.sent.clear()
        self._to_detokenizer.sent.clear()
        S.enable_skip_finishing_decode = True
        batch = self._plan()
        out = self._decisions(batch)
        no_overlap = S.is_disable_overlap_for_batch(batch, last_batch=S.last_batch)
        done = []
        if no_overlap and S.result_queue:
            prev = S.result_queue.popleft()
            S.process_batch_result(*prev)
            done.append(prev[0])
        if batch:
            result = S.run_batch(batch)
            S.result_queue.append((batch.copy(), result))
        else:
            result = None
            S._sched_idled = True
        if S.last_batch and not no_overlap:
            prev = S.result_queue.popleft()
            S.process_batch_result(*prev)
            done.append(prev[0])
        # Finishes of step N-1 free their KV here; the snapshot is what step N's
        # running requests hold (the harness ended the N-1 finishers already).
        self._outcomes_of(done, out)
        self._snapshot(out)
        S.launch_batch_sample_if_needed(result, batch)
        S.last_batch = batch
        self.steps += 1
        return out

    def flush(self) -> dict[str, Any]:
        """Overlap only: process the last launched step's result (as the loop
        does on its next iteration); returns its finishes."""
        out: dict[str, Any] = {"finished": [], "first_token": [], "rejected": []}
        if self.overlap and self._sched.result_queue:
            with self._context():
                prev = self._sched.result_queue.popleft()
                self._sched.process_batch_result(*prev)
                self._sched.last_batch = None
                self._outcomes_of([prev[0]], out)
        return out

    def _decisions(self, batch: Any) -> dict[str, Any]:
        """The batch, the preemptions and SGLang's own aborts of this plan."""
        preempted = []
        for req, _ in self._requeued:
            if req.rid in self._running:
                preempted.append(self._ids[req.rid])
                del self._running[req.rid]
        entries, computed = [], {}
        mode = None
        if batch is not None and not batch.is_empty():
            fm = batch.forward_mode
            mode = "extend" if fm.is_extend() else "decode" if fm.is_decode() else str(fm)
            for i, req in enumerate(batch.reqs):
                if req.rid in self._aborted:
                    continue  # SGLang runs an aborted request once more to free it; not a decision
                rid = self._ids[req.rid]
                if mode == "extend":
                    entries.append((rid, int(batch.extend_lens[i])))
                    computed[rid] = int(batch.prefix_lens[i])
                else:
                    entries.append((rid, 1))
                self._running.setdefault(req.rid, req)
        return {"batch": entries, "computed": computed, "preempted": preempted, "rejected": [],
                "finished": [], "first_token": [], "blocks": {}, "free_blocks": None, "mode": mode}

    def _snapshot(self, out: dict[str, Any]) -> None:
        """KV as held during the step: after the plan allocated it, before results free it."""
        S = self._sched
        B = self.block_size_tokens
        table = S.req_to_token_pool.req_to_token
        blocks = {}
        for rid, req in self._running.items():
            n = req.kv.kv_allocated_len if req.kv.req_pool_idx is not None else 0
            pages = table[req.kv.req_pool_idx, :n].div(B, rounding_mode="floor").tolist() if n else []
            blocks[self._ids[rid]] = tuple(dict.fromkeys(int(p) for p in pages))
        out["blocks"] = blocks
        zombie = any(self._ids.get(r.rid) is not None and r.rid in self._aborted and r.kv.req_pool_idx is not None
                     and r.kv.kv_allocated_len > 0 for r in self._live_reqs())
        free = S.token_to_kv_pool_allocator.available_size() + S.tree_cache.evictable_size()
        out["free_blocks"] = None if zombie else free // B

    def _live_reqs(self) -> list[Any]:
        S = self._sched
        reqs = list(S.running_batch.reqs)
        if S.last_batch is not None:
            reqs += list(S.last_batch.reqs)
        if S.cur_batch_for_debug is not None:
            reqs += list(S.cur_batch_for_debug.reqs)
        if S.chunked_req is not None:
            reqs.append(S.chunked_req)
        return reqs

    def _outcomes(self, batch: Any, out: dict[str, Any]) -> None:
        self._outcomes_of([batch] if batch is not None else [], out)

    def _outcomes_of(self, batches: list[Any], out: dict[str, Any]) -> None:
        """Finishes of the processed batches, and SGLang's own aborts (rejections)."""
        for b in batches:
            for req in b.reqs:
                rid = req.rid
                if rid in self._reported or not req.finished():
                    continue
                self._reported.add(rid)
                self._running.pop(rid, None)
                reason = req.finished_reason
                if type(reason).__name__ == "FINISH_ABORT":
                    out["rejected"].append((self._ids[rid], getattr(reason, "message", str(reason))))
                else:
                    out["finished"].append(self._ids[rid])
        for msg in self._to_tokenizer.sent:  # aborts of queued / retracted requests
            rid = getattr(msg, "rid", None)
            if rid in self._ids and rid not in self._reported:
                self._reported.add(rid)
                self._running.pop(rid, None)
                fr = getattr(msg, "finished_reason", None) or {}
                out["rejected"].append((self._ids[rid], fr.get("message", "aborted") if isinstance(fr, dict)
                                        else str(fr)))

    def has_unfinished(self) -> bool:
        """Whether SGLang still holds a request that has not ended."""
        S = self._sched
        return bool(S.waiting_queue or any(not r.finished() for r in S.running_batch.reqs) or S.chunked_req is not None
                    or bool(self.overlap and S.result_queue) or self._running)

    # -- extras for tests and benchmarks ------------------------------------------------------

    @property
    def scheduler(self) -> Any:
        """The wrapped ``sglang.srt.managers.scheduler.Scheduler``."""
        return self._sched

    def num_running(self) -> int:
        return len(self._sched.running_batch.reqs)

    def num_waiting(self) -> int:
        return len(self._sched.waiting_queue)

    def check_pools(self) -> None:
        """SGLang's own pool invariant (``SchedulerInvariantChecker.self_check_during_busy``):
        raises AssertionError if pages leaked.  Meaningful after a step."""
        with self._context():
            self._sched.invariant_checker.self_check_during_busy()


# --- the adapter: SGLang's scheduler behind the protocol ------------------------------------

#: Pools: "ample" as the order-policy setups (8 sequences of the longest
#: context fit), "small" as the eviction setups (retraction happens).
AMPLE_BLOCKS, SMALL_BLOCKS = 4096, 512

def _replica() -> tuple[dict[str, Any], Any]:
    from tenantry.runner.setups import COST, REPLICA

    return dict(REPLICA), COST


class SglangAdapter:
    """SGLang 0.5.23's scheduler as a scheduler under test.

    Claims, per setup (what SGLang's code promises, nothing more):

    * always: KV and batch safety (checked whatever is claimed);
    * ``fcfs``: FCFS-TENANT and FCFS-TIER (SGLang admits in queue order and
      stops at the first request that does not fit); ``priority``:
      FCFS-TENANT and TIER-ORDER (tier = priority, then queue order), and on
      the ample pool VICTIM (lowest priority, newest first, as
      ``preempt_to_schedule`` sorts); checked on admissions, so SGLang's own
      chunking needs no copy of the model's;
    * ``salted`` cache: SALT-ISOLATION (the tenant's salt is SGLang's
      ``extra_key``, which namespaces the radix tree);
    * lpm, dfs-weight, lof: no order claim (they reorder the queue by cache
      state or output length).

    Args:
        policy: SGLang's ``schedule_policy`` (``priority`` means fcfs with
            priority scheduling; tier = priority value, lower runs first).
        tenants: the tenants (their tiers become priorities, their salts
            ``extra_key``).
        num_blocks: KV pool in 16-token pages.
        cache: ``off`` (radix cache disabled: SGLang then runs every
            cache-aware policy as fcfs), ``shared`` (radix cache, no key) or
            ``salted`` (radix cache, ``extra_key`` = the tenant's salt).
        overlap: SGLang's overlap schedule (see :class:`SglangScheduler`).
        conservativeness: SGLang's ``schedule_conservativeness`` (below 1:
            admission reserves less for future tokens, and decode retracts).

    Raises:
        RuntimeError: if SGLang 0.5.23 is not installed or does not import.
    """

    def __init__(self, *, policy: str = "lpm", tenants: tuple[TenantConfig, ...] = (),
                 num_blocks: int = AMPLE_BLOCKS, cache: str = "shared", overlap: bool = False,
                 conservativeness: float = 1.0) -> None:
        replica, cost = _replica()
        tenants = tuple(tenants) or (TenantConfig("default"),)
        B = replica["block_size_tokens"]
        priority = policy == "priority"
        self.s = SglangScheduler(num_blocks=num_blocks, block_size_tokens=B, max_num_seqs=replica["max_num_seqs"],
                                 token_budget=replica["token_budget"], policy="fcfs" if priority else policy,
                                 priority=priority, prefix_cache=cache != "off", overlap=overlap,
                                 max_model_len=replica["max_context_tokens"], conservativeness=conservativeness)
        # the context the claims state is one SGLang enforces (max_request_tokens: 6 tokens short of it)
        self.max_context_tokens = self.s.max_request_tokens
        ordered = policy in ("fcfs", "priority") or cache == "off"
        if not priority:
            tenants = tuple(attrs_evolve(t, tier=0) for t in tenants)  # SGLang ignores tiers here
        order = OrderConfig(policy="priority" if priority else "fcfs")
        config = Config(
            tenants=tenants, block_size_tokens=B, num_blocks=num_blocks, max_num_seqs=replica["max_num_seqs"],
            token_budget=replica["token_budget"], max_context_tokens=self.max_context_tokens, order=order,
            eviction=EvictionConfig(victim="lowest_priority" if priority else "newest"),
            prefix_cache=cache, cost=cost,
        )
        claims: list[str] = []
        if ordered:
            claims += ["FCFS-TENANT", "TIER-ORDER" if priority else "FCFS-TIER"]
            if priority and num_blocks >= replica["max_num_seqs"] * -(-replica["max_context_tokens"] // B):
                claims.append("VICTIM")
        self.claims = Claims(config, invariants=claims,
                             describe=f"{sglang_available()[1]} scheduler, policy {policy}, {num_blocks} blocks, "
                                      f"radix cache {cache}{', overlap schedule' if overlap else ''}"
                                      f"{f', conservativeness {conservativeness:g}' if conservativeness != 1.0 else ''}")
        self.cache = cache
        self.tiers = {t.name: t.tier for t in tenants}
        self.salts = {t.name: t.salt for t in tenants}
        self._last: dict[str, Any] = {}
        self._pending_finished: list[int] = []

    def add_request(self, request: Any) -> str | None:
        """Queue the request; refuse what SGLang's front end and admission would
        cut short: longer than the context SGLang enforces (``too_long``, as the
        tokenizer manager refuses; :attr:`SglangScheduler.max_request_tokens`), or an output SGLang would clip to fit the empty pool
        (``too_large``; SGLang would silently stop it early)."""
        if request.prompt_tokens + request.output_tokens > self.max_context_tokens:
            return "too_long"
        allowed = self.s.max_output_tokens(request.prompt_tokens, request.output_tokens)
        if allowed is None or allowed < request.output_tokens or request.prompt_tokens > self.s.max_input_tokens:
            return "too_large"
        self.s.add_request(request.request_id, request.prompt_tokens, request.output_tokens,
                           prefix_ids=tuple(request.prefix_ids),
                           priority=self.tiers.get(request.tenant, 0) if self.s.priority else None,
                           extra_key=self.salts.get(request.tenant, request.tenant) if self.cache == "salted"
                           else None)
        return None

    def abort_request(self, request_id: int) -> None:
        self.s.abort_request(request_id)

    def plan_step(self, t_s: float) -> Plan:
        """One SGLang scheduler iteration, reported as a plan."""
        d = self._last = self.s.step()
        batch = tuple(Scheduled(rid, n, d["computed"].get(rid)) for rid, n in d["batch"])
        rejected = tuple(Rejection(rid, None) for rid, _ in d["rejected"])
        return Plan(batch=batch, preempted=tuple(d["preempted"]), rejected=rejected, blocks=dict(d["blocks"]),
                    free_blocks=d["free_blocks"])

    def take_results(self, results: StepResults) -> None:
        """SGLang must have finished exactly the requests the harness finished
        (with the overlap schedule: one step later, when it processes them)."""
        if self.s.overlap:
            self._pending_finished, expected = list(results.finished), self._pending_finished
            mine = sorted(self._last.get("finished", ()))
            if sorted(expected) != mine:
                raise AssertionError(f"SGLang processed finishes {mine} in step {results.step_index}; the harness "
                                     f"finished {sorted(expected)} in the step before")
            return
        mine = sorted(self._last.get("finished", ()))
        if sorted(results.finished) != mine:
            raise AssertionError(f"SGLang finished {mine} in step {results.step_index}, the harness "
                                 f"{sorted(results.finished)}")


def attrs_evolve(t: TenantConfig, **kw: Any) -> TenantConfig:
    import attrs

    return attrs.evolve(t, **kw)


def make_lpm(tenants: tuple[TenantConfig, ...] = ()) -> SglangAdapter:
    """SGLang lpm (its default policy), radix cache shared, ample pool."""
    return SglangAdapter(policy="lpm", tenants=tenants)


def make_fcfs(tenants: tuple[TenantConfig, ...] = ()) -> SglangAdapter:
    """SGLang fcfs, radix cache shared, ample pool (claims arrival order)."""
    return SglangAdapter(policy="fcfs", tenants=tenants)


def make_priority(tenants: tuple[TenantConfig, ...] = ()) -> SglangAdapter:
    """SGLang fcfs with priority scheduling (tier = priority), ample pool (claims tier-then-arrival order)."""
    return SglangAdapter(policy="priority", tenants=tenants)


def make_dfs_weight(tenants: tuple[TenantConfig, ...] = ()) -> SglangAdapter:
    """SGLang dfs-weight, radix cache shared, ample pool."""
    return SglangAdapter(policy="dfs-weight", tenants=tenants)


def make_lof(tenants: tuple[TenantConfig, ...] = ()) -> SglangAdapter:
    """SGLang lof (longest output first), ample pool."""
    return SglangAdapter(policy="lof", tenants=tenants)


def make_lpm_small(tenants: tuple[TenantConfig, ...] = ()) -> SglangAdapter:
    """SGLang lpm on the small pool (retraction happens)."""
    return SglangAdapter(policy="lpm", tenants=tenants, num_blocks=SMALL_BLOCKS)


def make_fcfs_small(tenants: tuple[TenantConfig, ...] = ()) -> SglangAdapter:
    """SGLang fcfs on the small pool."""
    return SglangAdapter(policy="fcfs", tenants=tenants, num_blocks=SMALL_BLOCKS)


def make_priority_small(tenants: tuple[TenantConfig, ...] = ()) -> SglangAdapter:
    """SGLang priority on the small pool."""
    return SglangAdapter(policy="priority", tenants=tenants, num_blocks=SMALL_BLOCKS)


def make_dfs_weight_small(tenants: tuple[TenantConfig, ...] = ()) -> SglangAdapter:
    """SGLang dfs-weight on the small pool."""
    return SglangAdapter(policy="dfs-weight", tenants=tenants, num_blocks=SMALL_BLOCKS)


def make_lpm_tight(tenants: tuple[TenantConfig, ...] = ()) -> SglangAdapter:
    """SGLang lpm on the small pool with ``schedule_conservativeness=0.3`` (decode retraction happens)."""
    return SglangAdapter(policy="lpm", tenants=tenants, num_blocks=SMALL_BLOCKS, conservativeness=0.3)


def make_priority_tight(tenants: tuple[TenantConfig, ...] = ()) -> SglangAdapter:
    """SGLang priority on the small pool with ``schedule_conservativeness=0.3``."""
    return SglangAdapter(policy="priority", tenants=tenants, num_blocks=SMALL_BLOCKS, conservativeness=0.3)


def make_shared_cache(tenants: tuple[TenantConfig, ...] = ()) -> SglangAdapter:
    """SGLang fcfs with its radix cache and no extra_key (tenants share the tree)."""
    return SglangAdapter(policy="fcfs", tenants=tenants, cache="shared")


def make_salted_cache(tenants: tuple[TenantConfig, ...] = ()) -> SglangAdapter:
    """SGLang fcfs with ``extra_key`` = the tenant's salt (claims SALT-ISOLATION)."""
    return SglangAdapter(policy="fcfs", tenants=tenants, cache="salted")


def make_lpm_overlap(tenants: tuple[TenantConfig, ...] = ()) -> SglangAdapter:
    """SGLang lpm with its overlap schedule (its server default), ample pool."""
    return SglangAdapter(policy="lpm", tenants=tenants, overlap=True)
