"""The corpus table: every real implicit INT8 engine of ``tests/test_corpus.py`` (27 models, H100 and H200)
mirrored onto its graph, beside the rules' placement of the same graph. Prints one line a model: its INT8
edges, how many the mirror keeps, the agreement with the rules, float-entry and merged-convolution edges,
and whether the rules' own Q/DQ model built. No GPU; about 20 s on a 2-core host::

    python bench/corpus_table.py

The test asserts what the table shows; the table itself is for reading, here rather than in the suite's
output.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_corpus import corpus_rows, render

if __name__ == "__main__":
    print(render(corpus_rows()))
