"""Words and numbers as people read them: plurals and throughput figures, shared by every layer."""

from __future__ import annotations

from typing import Optional


def plural(n: int, word: str, many: Optional[str] = None) -> str:
    """``"1 error"``, ``"8 warnings"``, ``"2 boundary reformats"``: the count and its word, agreeing.

    ``many`` for irregular plurals (``plural(n, "copy", "copies")``). Never "error(s)": the count is
    known, so is the word."""
    return f"{n} {noun(n, word, many)}"


def noun(n: int, word: str, many: Optional[str] = None) -> str:
    """The word alone, agreeing with ``n`` (a count printed elsewhere: a tile, a table cell)."""
    if n == 1:
        return word
    return many if many is not None else word + "s"


def qps(value: Optional[float]) -> str:
    """Throughput in inferences per second, never in e-notation: ``"845"``, ``"2110"``, ``"12.3k"``,
    ``"1.2M"``; fractions below 10 keep one decimal (``"3.5"``). ``"-"`` when unknown."""
    if value is None:
        return "-"
    if value < 10:
        return f"{value:.1f}"
    if value < 10_000:
        return f"{value:.0f}"
    if value < 1_000_000:
        return f"{value / 1000:.1f}k"
    return f"{value / 1_000_000:.1f}M"


def ms(value: Optional[float]) -> str:
    """A latency in milliseconds with three significant figures, never in e-notation (``"0.553"``,
    ``"12.4"``, ``"1250"``); ``"-"`` when unknown."""
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def number(value: Optional[float], decimals: int = 6) -> str:
    """A figure such as an absolute error with four significant figures and at most ``decimals``
    decimals, never in e-notation (``"0.1603"``, ``"0.000015"``, ``"12.35"``); below the last
    decimal it reads ``"<0.000001"``. ``"-"`` when unknown."""
    import math

    if value is None or math.isnan(value):
        return "-"
    if value == 0:
        return "0"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    magnitude = abs(value)
    floor = 10.0 ** -decimals
    if magnitude < floor:
        return f"<{floor:.{decimals}f}" if value > 0 else f">-{floor:.{decimals}f}"
    places = min(decimals, max(0, 3 - math.floor(math.log10(magnitude))))
    return f"{value:.{places}f}"


def plain(value: Optional[float]) -> str:
    """A setting or a bound as one would type it (``15``, ``0.5``, ``0.35``, ``0.00001``, ``2000000``):
    ``:g``'s six significant digits, never its e-notation (``1e-05``). ``"-"`` when unset."""
    from decimal import Decimal

    if value is None:
        return "-"
    text = f"{value:.6g}"
    if "e" in text:  # 1e-05, 1.5e+07: the same digits, written out
        text = format(Decimal(text), "f")
    return text


def short_path(path: str, width: int) -> str:
    """A path as a title shows it, in at most ``width`` characters where it can be: relative to the
    working directory when under it, else its last components after ``…/``. The file name stays whole
    (a name is what a user copies), so one longer than ``width`` is returned alone."""
    import os

    if len(path) <= width:
        return path
    try:
        rel = os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        rel = path
    if not rel.startswith(".."):
        path = rel
        if len(path) <= width:
            return path
    parts = path.split(os.sep)
    kept = parts[-1]
    for part in reversed(parts[:-1]):
        if len(part) + 1 + len(kept) + 2 > width:
            break
        kept = f"{part}{os.sep}{kept}"
    return f"…{os.sep}{kept}"
