"""Checking a scheduler tenantry did not write (SPEC.md 9).

* :mod:`~tenantry.verify.protocol`: the adapter protocol (``Claims``, ``Plan``,
  ``StepResults``, ``SchedulerAdapter``) and the harness's protocol ids;
* :mod:`~tenantry.verify.harness`: step mode: the harness drives an adapter
  through the one driver loop and checks every plan;
* :mod:`~tenantry.verify.calls`: calls into the scheduler with timeouts;
* :mod:`~tenantry.verify.reference`: the reference model behind the protocol;
* :mod:`~tenantry.verify.offline`: history mode (a recorded history, offline);
* :mod:`~tenantry.verify.run`, :mod:`~tenantry.verify.matrix`,
  :mod:`~tenantry.verify.suite`: verdicts on one workload, the adversary
  matrix, the suite as pytest items;
* :mod:`~tenantry.verify.plugin`: the pytest plugin;
* :mod:`~tenantry.engines.vllm`: vLLM's V1 scheduler on the CPU, behind the protocol.

Nothing heavy is imported here.
"""
