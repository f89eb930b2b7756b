"""Disjoint sets, for the groups that share one thing: Q/DQ sites sharing a scale (placement, the
mirror) and engine layers that make up one region of a comparison."""

from __future__ import annotations

from typing import Generic, Hashable, TypeVar

T = TypeVar("T", bound=Hashable)


class UnionFind(Generic[T]):
    def __init__(self) -> None:
        self.parent: dict[T, T] = {}

    def add(self, x: T) -> None:
        self.parent.setdefault(x, x)

    def find(self, x: T) -> T:
        self.add(x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]  # path halving
            x = self.parent[x]
        return x

    def union(self, a: T, b: T) -> T:
        """Join the sets of ``a`` and ``b``; the root of ``a``'s set stays the root."""
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra
        return ra
