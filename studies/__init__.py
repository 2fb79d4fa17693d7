"""Studies: the seed documents' open questions answered with the model (``tenantry study NAME``).

A study runs the model (or reads a ``tenantry check`` matrix) and returns a
:class:`~tenantry.studies.report.StudyResult`; the command writes it as a folder
(:func:`~tenantry.studies.report.write_study`) and prints the headline table.
Every study is deterministic for its seed (the model is); a ``quick`` run is a
smaller version of the same study, for the tests.

* ``seed-001`` (:mod:`.seed001`): seed 001's "Try it" experiments;
* ``abuse`` (:mod:`.abuse`): the check matrix as a heat map;
* ``thrash``, ``accounting-cost``, ``batch-size`` (:mod:`.load`): studies that
  load a replica.
"""

from __future__ import annotations

from tenantry.model.config import ConfigError

from .abuse import ABUSE_QUESTION, abuse_study
from .load import (
    BATCH_QUESTION, COST_QUESTION, THRASH_QUESTION, accounting_cost_study, batch_size_study, thrash_study,
)
from .report import Study, StudyResult, Table, write_study
from .seed001 import SEED001_QUESTION, seed001_study

STUDIES: dict[str, Study] = {s.name: s for s in (
    Study("seed-001", SEED001_QUESTION, seed001_study),
    Study("abuse", ABUSE_QUESTION, abuse_study),
    Study("thrash", THRASH_QUESTION, thrash_study),
    Study("accounting-cost", COST_QUESTION, accounting_cost_study),
    Study("batch-size", BATCH_QUESTION, batch_size_study),
)}


def get_study(name: str) -> Study:
    """The study called ``name``.

    Raises:
        ConfigError: an unknown name, listing the known ones.
    """
    try:
        return STUDIES[name]
    except KeyError:
        raise ConfigError("study", name, f"unknown study; choose from {', '.join(STUDIES)}") from None


__all__ = ["STUDIES", "Study", "StudyResult", "Table", "abuse_study", "get_study", "seed001_study", "write_study",
           "thrash_study", "accounting_cost_study", "batch_size_study"]
