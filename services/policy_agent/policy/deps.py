"""Start dependencies: ``requires`` edges between guests.

The graph maps a guest key (UUID, or the raw name of a guest this host does
not know) to the keys it requires. Pure functions; the agent builds the graph
from its cache of policies.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping, Sequence

from ..errors import PolicyError

Graph = Mapping[str, Sequence[str]]


def find_cycle(graph: Graph, start: str) -> list[str] | None:
    """A cycle reachable from ``start`` as ``[a, b, ..., a]``, or None."""
    path: list[str] = []
    on_path: set[str] = set()
    done: set[str] = set()

    def visit(node: str) -> list[str] | None:
        if node in on_path:
            return path[path.index(node):] + [node]
        if node in done:
            return None
        on_path.add(node)
        path.append(node)
        for nxt in graph.get(node, ()):
            if found := visit(nxt):
                return found
        path.pop()
        on_path.discard(node)
        done.add(node)
        return None

    return visit(start)


def start_order(graph: Graph, target: str, name_of: Callable[[str], str] = str) -> list[str]:
    """Every guest ``target`` needs, transitively, requirements first; ``target`` last (PolicyError on a cycle,
    its guests named by ``name_of``)."""
    if cycle := find_cycle(graph, target):
        raise PolicyError(describe_cycle(cycle, name_of))
    return _post_order(lambda node: graph.get(node, ()), target)


def stop_order(graph: Graph, target: str, name_of: Callable[[str], str] = str) -> list[str]:
    """Every guest that needs ``target``, transitively, dependents first; ``target`` last (PolicyError on a
    cycle)."""
    rev: dict[str, list[str]] = {}  # guest -> the guests that require it
    for node, reqs in graph.items():
        for req in reqs:
            rev.setdefault(req, []).append(node)
    if cycle := find_cycle(rev, target):
        raise PolicyError(describe_cycle(cycle[::-1], name_of))
    return _post_order(lambda node: sorted(rev.get(node, ())), target)


def describe_cycle(cycle: list[str], name_of: Callable[[str], str]) -> str:
    return "dependency cycle: " + " -> ".join(name_of(n) for n in cycle)


def _post_order(edges: Callable[[str], Iterable[str]], target: str) -> list[str]:
    """Depth-first post-order from ``target``: everything it leads to first, ``target`` last."""
    order: list[str] = []
    seen: set[str] = set()

    def visit(node: str) -> None:
        if node in seen:
            return
        seen.add(node)
        for nxt in edges(node):
            visit(nxt)
        order.append(node)

    visit(target)
    return order
