"""The documents say what the code does: the README's adapter is examples/tiny_fcfs.py, every field
of the protocol's records is in docs/adapter.md, every relative link resolves, and the README and
SPEC.md hold no figure of a particular day and point at nothing a user does not have."""

from __future__ import annotations

import re

import attrs
import pytest

import tenantry
from conftest import REPO

DOCS = sorted((REPO / "docs").glob("*.md"))
README = REPO / "README.md"


def _code_blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def test_the_readme_adapter_is_the_example_file_whole():
    blocks = _code_blocks(README.read_text(), "python")
    assert (REPO / "examples" / "tiny_fcfs.py").read_text() in blocks


@pytest.mark.parametrize("record", ["Request", "Plan", "Scheduled", "Rejection", "StepResults", "Claims",
                                    "TenantConfig"])
def test_every_field_of_the_protocol_is_in_the_adapter_page(record):
    page = (REPO / "docs" / "adapter.md").read_text()
    cls = getattr(tenantry, record)
    missing = [f.name for f in attrs.fields(cls) if f"`{f.name}`" not in page]
    assert not missing, f"docs/adapter.md does not name {record}'s {missing}"


@pytest.mark.parametrize("doc", [README, REPO / "examples" / "README.md", *DOCS], ids=lambda p: p.name)
def test_every_relative_link_resolves(doc):
    text = doc.read_text()
    bad = []
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        if not (doc.parent / target).exists():
            bad.append(target)
    assert not bad, f"{doc.relative_to(REPO)} links to missing {bad}"


@pytest.mark.parametrize("doc", [README, REPO / "spec" / "SPEC.md"], ids=lambda p: p.name)
def test_no_dated_figure_and_nothing_outside_the_repository(doc):
    text = doc.read_text()
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), "a date: dated figures go to docs/measurements.md"
    assert "../shared" not in text, "points at ../shared, which users do not have"
