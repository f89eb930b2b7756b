"""The suite's own output (issue 43.11): ``pytest -q`` prints dots, not a benchmark table among them. A test
shows what it checked by asserting it; a table to read is a ``bench/`` script's (``bench/corpus_table.py``
prints the corpus table the corpus test asserts)."""

from __future__ import annotations

import re

from conftest import ROOT

# What writes past pytest's capture: a capture disabled, or the real streams written directly.
_PAST_CAPTURE = re.compile(r"\bcap(?:sys|fd)\.disabled\(|sys\.__std(?:out|err)__")


def test_no_test_writes_past_pytests_capture() -> None:
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
             for p in sorted((ROOT / "tests").glob("*.py")) if p.name != "test_suite_output.py"
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if _PAST_CAPTURE.search(line)]  # fmt: skip
    assert not found, "\n".join(found)
