"""``topic``: binding keys are ``.``-separated words where ``*`` matches exactly one word and
``#`` matches zero or more.

Bindings live in a trie of words; matching walks it with an explicit stack and a visited set, so
the work is bounded by (trie nodes x routing-key words) whatever the patterns.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable

from ...protocol.codec import FieldTable


class _Node:
    __slots__ = ("children", "destinations")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.destinations: Counter[Hashable] = Counter()


class TopicRouter:
    # The result depends only on the routing key and the bindings: the vhost may memoise it.
    cacheable = True

    def __init__(self) -> None:
        self._root = _Node()

    def bind(self, destination: Hashable, binding_key: str, arguments: FieldTable) -> None:
        node = self._root
        for word in binding_key.split("."):
            node = node.children.setdefault(word, _Node())
        node.destinations[destination] += 1

    def unbind(self, destination: Hashable, binding_key: str, arguments: FieldTable) -> None:
        path = [self._root]
        words = binding_key.split(".")
        for word in words:
            child = path[-1].children.get(word)
            if child is None:
                return
            path.append(child)
        leaf = path[-1]
        leaf.destinations[destination] -= 1
        if leaf.destinations[destination] <= 0:
            del leaf.destinations[destination]
        # Prune nodes left with nothing below them.
        for parent, word, node in zip(
            reversed(path[:-1]), reversed(words), reversed(path[1:]), strict=True
        ):
            if node.children or node.destinations:
                break
            del parent.children[word]

    def route(self, routing_key: str, headers: FieldTable | None) -> Iterable[Hashable]:
        words = routing_key.split(".")
        n = len(words)
        found: set[Hashable] = set()
        stack: list[tuple[_Node, int]] = [(self._root, 0)]
        seen: set[tuple[int, int]] = set()
        while stack:
            node, i = stack.pop()
            key = (id(node), i)
            if key in seen:
                continue
            seen.add(key)
            children = node.children
            hash_node = children.get("#")
            if hash_node is not None:
                # '#' swallows zero or more words.
                stack.extend((hash_node, j) for j in range(i, n + 1))
            if i == n:
                found.update(node.destinations)
                continue
            child = children.get(words[i])
            if child is not None:
                stack.append((child, i + 1))
            star = children.get("*")
            if star is not None:
                stack.append((star, i + 1))
        return found


class TopicExchange:
    def validate(self, arguments: FieldTable) -> None:
        pass

    def create_router(self, arguments: FieldTable) -> TopicRouter:
        return TopicRouter()
