"""
The word trie: one index for the ``topic:``, ``mqtt:`` and ``nats:`` kinds.

Patterns are paths of tokens (``words.py``): a literal word, ONE or ANY. A
subject is walked through the trie like an automaton, keeping the set of nodes
still alive after each word; the bits stored at the nodes alive at the end are
the matching patterns. Patterns that share a beginning share the walk, and
literal children are a dict probe, so a subject costs about its word count
times the number of wildcard branches it meets, not the number of patterns.

Tests: ``tests/unit/test_matching_properties.py``, ``tests/unit/test_matching_index.py``.
"""

from __future__ import annotations

from collections.abc import Iterable

from pyroaring import BitMap

from malamute_pack.matching.base import KindIndex, Pattern, expect
from malamute_pack.matching.words import Token, Wild, WordPattern


class _Node:
    """Where a token path leads: its children and the patterns ending here."""

    __slots__ = ("any", "bits", "loops", "one", "words")

    def __init__(self, loops: bool) -> None:
        self.words: dict[str, _Node] = {}
        self.one: _Node | None = None
        self.any: _Node | None = None
        self.bits = BitMap()
        # Reached through an ANY edge, so it may swallow further words itself.
        self.loops = loops

    def unused(self) -> bool:
        return not (self.words or self.one or self.any or self.bits)


class WordTrie(KindIndex):
    """The trie of one dialect; ``separator`` splits subjects into words."""

    def __init__(self, separator: str) -> None:
        self._separator = separator
        self._root = _Node(loops=False)
        self._count = 0

    def add(self, bit: int, pattern: Pattern) -> None:
        node = self._root
        for token in expect(pattern, WordPattern).tokens:
            node = self._step(node, token)
        node.bits.add(bit)
        self._count += 1

    def remove(self, bit: int, pattern: Pattern) -> None:
        tokens = expect(pattern, WordPattern).tokens
        path = [self._root]
        for token in tokens:
            path.append(self._step(path[-1], token))
        path[-1].bits.remove(bit)
        self._count -= 1
        # Prune the branch back up to the first node something else still uses.
        for depth in range(len(tokens), 0, -1):
            if not path[depth].unused():
                break
            _unlink(path[depth - 1], tokens[depth - 1])

    def lookup(self, subject: str) -> BitMap:
        alive = _closure((self._root,))
        for word in subject.split(self._separator):
            following: set[_Node] = set()
            for node in alive:
                child = node.words.get(word)
                if child is not None:
                    following.add(child)
                if node.one is not None:
                    following.add(node.one)
                if node.loops:
                    following.add(node)
            if not following:
                return BitMap()
            alive = _closure(following)
        found = BitMap()
        ends = [node.bits for node in alive if node.bits]
        if ends:
            found.update(*ends)
        return found

    def __len__(self) -> int:
        return self._count

    @staticmethod
    def _step(node: _Node, token: Token) -> _Node:
        """The child of ``node`` along ``token``, made if missing."""
        if token is Wild.ONE:
            if node.one is None:
                node.one = _Node(loops=False)
            return node.one
        if token is Wild.ANY:
            if node.any is None:
                node.any = _Node(loops=True)
            return node.any
        child = node.words.get(token)
        if child is None:
            child = node.words[token] = _Node(loops=False)
        return child


def _unlink(parent: _Node, token: Token) -> None:
    if token is Wild.ONE:
        parent.one = None
    elif token is Wild.ANY:
        parent.any = None
    else:
        del parent.words[token]


def _closure(nodes: Iterable[_Node]) -> set[_Node]:
    """Add the nodes reached by letting ANY edges match zero words."""
    reached: set[_Node] = set()
    for node in nodes:
        current: _Node | None = node
        while current is not None and current not in reached:
            reached.add(current)
            current = current.any
    return reached
