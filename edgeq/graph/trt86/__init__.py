"""Every TensorRT 8.6 pattern edgeq knows, one module per family; ``edgeq.graph.registry`` reads them.

A pattern entry (``edgeq.graph.facts.Pattern``) holds one measured fact with its evidence (files under
``tests/fixtures``: real TensorRT 8.6.0 engines), its matcher, the edges it decides for placement, its
lint check and its engine signature. Families: ``conv`` (weighted ops, epilogues, residual Adds, pooling
tails), ``concat`` (data movement and Concat), ``silu``, ``regions`` (PointWise regions, SE gates, channel
shuffles), ``myelin`` (regions TensorRT compiles with Myelin), ``inception`` (a build 8.6 fails) and
``qdq`` (what the parser accepts as Q/DQ). To add a pattern: one entry in its family (or a new family
listed below), its fixture, its tests
and its section in ``edgeq/docs/trt86-rules.md``.
An entry no engine has shown says ``verified=False``; when an engine contradicts an entry, the engine wins.
"""

from __future__ import annotations

from edgeq.graph.facts import Pattern
from edgeq.graph.trt86 import concat, conv, inception, myelin, qdq, regions, silu

# Precedence orders them: where two entries decide one (tensor, consumer) edge, the later one wins
# (a SiLU stays whole, except the one feeding a residual Add).
PATTERNS: tuple[Pattern, ...] = tuple(
    sorted(
        (*conv.PATTERNS, *concat.PATTERNS, *silu.PATTERNS, *regions.PATTERNS, *myelin.PATTERNS,
         *inception.PATTERNS, *qdq.PATTERNS),
        key=lambda p: p.precedence,
    )
)
