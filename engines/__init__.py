"""Real engines' schedulers behind the adapter protocol, on the CPU: vLLM's V1
scheduler (``vllm``) and SGLang's (``sglang``).  Each is an optional install
(``scripts/install_vllm.sh``, ``scripts/install_sglang.sh``); without it the
module imports and says what is missing (SPEC.md 9).
"""
