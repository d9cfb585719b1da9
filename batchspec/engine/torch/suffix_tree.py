"""The suffix tree of suffix drafting (SuffixDecoding, Oliaro et al., arXiv 2411.04975) and its
drafting rule; suffix.py holds a worker's trees and the drafter over them.

The rule (the paper's, as Snowflake's Arctic Inference implements it in
`csrc/suffix_decoding/suffix_tree.cc`, `SuffixTree::speculate` / `_speculate_path`):
- match: the longest suffix of the row's context (at most MAX_MATCH tokens) that occurs in the
  source followed by at least one token;
- draft: from the occurrences of that match, repeatedly the most frequent next token (ties: the
  one seen most recently), each with probability count(path + token) / count(path), the product
  along the path; stop before a token whose probability falls under `min_token_prob`, at
  floor(match length x `max_spec_factor`) tokens, or at the row's budget (max_draft_len);
- two sources, each drafting alone: the shared tree (other rows' outputs) and the row itself
  (its prompt and output so far, the current position excluded); the draft with the larger score
  (the sum of its tokens' probabilities) wins, the row's own on a tie.
Counts are over occurrences, so a path's count includes the occurrences that end there (at the
end of a row): a suffix tree's node count, as Arctic's `Node::count`.

A suffix tree holds the same counts as the occurrences of its strings. Here the finished rows of
a scope live in a few immutable `Segment`s, each its rows' tokens in one int32 array sorted by the
MAX_MATCH tokens that end at each position (a suffix array of the reversed rows, 8 bytes a token),
so a match narrows a sorted range one token back at a time, and its occurrences are that range.
A Python node per token position (Arctic's C++ tree, written in Python) costs 100-300 bytes a
node; this costs 8 (docs/suffix.md). A new row is a segment of its own; a segment is merged with
the next older one while that one is at most twice its size, so a tree has O(log rows) segments
and a token is sorted again O(log rows) times.
"""

from __future__ import annotations

import sys
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

MAX_MATCH = 32  # longest context suffix matched: the depth of the sort (tokens), as a tree depth
SENTINEL = -1  # between rows: no match crosses it, a continuation ends at it
SMALL_RANGE = 256  # ranges this small are matched to the end at once (`match_lengths`); larger ones bisected
_NONE = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class Draft:
    """A proposal: tokens, each with its estimated probability; `source` is "tree" (other rows'
    outputs), "row" (the row's own context) or "" (nothing matched)."""

    tokens: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    match_len: int = 0
    source: str = ""

    @property
    def score(self) -> float:
        return float(sum(self.probs))


# -- one group of occurrences, and the walk along its most frequent continuation -----------------


@dataclass
class Occurrences:
    """End positions of a match in `text` (which has SENTINEL between rows and at its end);
    `recency` orders groups: a later group's occurrences are more recent than an earlier one's."""

    text: np.ndarray
    ends: np.ndarray
    recency: int


def continuation(groups: list[Occurrences], budget: int, min_token_prob: float) -> tuple[list[int], list[float]]:
    """The most frequent path after the occurrences in `groups` (see the module docstring)."""
    tokens: list[int] = []
    probs: list[float] = []
    prob = 1.0
    groups = [g for g in groups if len(g.ends)]
    while len(tokens) < budget and groups:
        nexts = [g.text[g.ends + 1] for g in groups]
        total = sum(len(n) for n in nexts)
        if total == 1:  # one occurrence left: it continues alone, at probability `prob` throughout
            g = groups[0]
            run = g.text[int(g.ends[0]) + 1 : int(g.ends[0]) + 1 + budget - len(tokens)]
            stop = np.flatnonzero(run == SENTINEL)
            run = run[: stop[0]] if len(stop) else run
            if prob < min_token_prob:
                break
            tokens += run.tolist()
            probs += [prob] * len(run)
            break
        flat = np.concatenate(nexts) if len(nexts) > 1 else nexts[0]
        valid = flat != SENTINEL
        if not valid.any():
            break
        token, count = _most_frequent(flat, valid, groups)
        p = prob * count / total
        if p < min_token_prob:
            break
        prob = p
        tokens.append(token)
        probs.append(prob)
        groups = [Occurrences(g.text, g.ends[n == token] + 1, g.recency) for g, n in zip(groups, nexts)]
        groups = [g for g in groups if len(g.ends)]
    return tokens, probs


def _most_frequent(flat: np.ndarray, valid: np.ndarray, groups: list[Occurrences]) -> tuple[int, int]:
    """The most frequent valid next token and its count; on a tie, the one seen most recently."""
    tokens = flat[valid]
    if (tokens == tokens[0]).all():  # one continuation (shared structure): no counting
        return int(tokens[0]), len(tokens)
    values, inverse, counts = np.unique(tokens, return_inverse=True, return_counts=True)
    tied = np.flatnonzero(counts == counts.max())
    if len(tied) == 1:
        return int(values[tied[0]]), int(counts[tied[0]])
    rank = np.concatenate([g.ends.astype(np.int64) + (g.recency << 32) for g in groups])[valid]
    latest = np.full(len(values), -1, dtype=np.int64)
    np.maximum.at(latest, inverse, rank)
    best = tied[int(np.argmax(latest[tied]))]
    return int(values[best]), int(counts[best])


def match_lengths(text: np.ndarray, ends: np.ndarray, context: np.ndarray) -> np.ndarray:
    """For each position in `ends`, how many tokens ending there equal the context's last ones
    (at most MAX_MATCH): one gather of MAX_MATCH tokens back from each."""
    back = context[::-1][:MAX_MATCH]
    if len(back) < MAX_MATCH:  # a short context: nothing matches past its start
        back = np.concatenate([back, np.full(MAX_MATCH - len(back), SENTINEL - 1, dtype=back.dtype)])
    window = text[np.maximum(ends[:, None] - np.arange(MAX_MATCH), 0)]
    equal = window == back
    return np.where(equal.all(axis=1), MAX_MATCH, np.argmin(equal, axis=1))


def spec_budget(match_len: int, budget: int, max_spec_factor: float) -> int:
    """How many tokens a match of `match_len` may draft: floor(match_len x factor), at most the budget
    (Arctic's `max_spec_tokens = min(max_spec_tokens, match_len * max_spec_factor + offset)`)."""
    return max(0, min(budget, int(match_len * max_spec_factor + 1e-6)))


# -- the row's own context ------------------------------------------------------------------------


def own_draft(context: Sequence[int] | np.ndarray, budget: int, max_spec_factor: float,
              min_token_prob: float) -> Draft:
    """The draft from the row's own prompt and output so far (the position being drafted excluded:
    a match must end at least one token before the end)."""
    ctx = np.asarray(context, dtype=np.int32)
    n = len(ctx)
    if n < 2 or budget <= 0:
        return Draft()
    ends = np.flatnonzero(ctx[: n - 1] == ctx[-1])
    if not len(ends):
        return Draft()
    text = np.concatenate([np.full(MAX_MATCH, SENTINEL, dtype=np.int32), ctx, [SENTINEL]])  # sentinels around
    lengths = match_lengths(text, ends + MAX_MATCH, ctx)
    m = int(lengths.max())
    best = ends[lengths == m] + MAX_MATCH
    tokens, probs = continuation([Occurrences(text, best, 0)], spec_budget(m, budget, max_spec_factor), min_token_prob)
    return Draft(tokens, probs, m, "row") if tokens else Draft()


# -- the shared tree: finished rows in sorted segments --------------------------------------------


class Segment:
    """Some finished rows, immutable: their tokens in one array (MAX_MATCH sentinels before each
    row and one block after the last) and every token position sorted by the MAX_MATCH tokens
    that end there, read backwards (`order`)."""

    def __init__(self, rows: list[np.ndarray], ids: list[str], serials: list[int]) -> None:
        self.ids, self.serials = ids, serials
        self.lengths = np.array([len(r) for r in rows], dtype=np.int64)
        pad = np.full(MAX_MATCH, SENTINEL, dtype=np.int32)
        pieces = [pad]
        for r in rows:
            pieces += [np.asarray(r, dtype=np.int32), pad]
        self.text = np.concatenate(pieces)
        self.starts = np.cumsum(np.concatenate([[MAX_MATCH], self.lengths[:-1] + MAX_MATCH]))
        self.order = _sorted_positions(self.text)
        self._text = memoryview(self.text)
        self._order = memoryview(self.order)
        ids = sum(sys.getsizeof(i) + 16 for i in ids)  # each id, its list slot and its serial's
        self.nbytes = self.text.nbytes + self.order.nbytes + self.lengths.nbytes + self.starts.nbytes + ids

    @property
    def tokens(self) -> int:
        return int(self.lengths.sum())


    def row(self, i: int) -> np.ndarray:
        return self.text[self.starts[i] : self.starts[i] + self.lengths[i]]

    def matches(self, context: np.ndarray) -> tuple[list[tuple[int, int]], np.ndarray, np.ndarray]:
        """Where the context's last tokens occur: the sorted ranges matching its last 1, 2, ...
        tokens, narrowed by bisection while large, then the positions of the last range with how
        many tokens each matches (`match_lengths`; at least as many as there are ranges).
        Positions are empty when the last token narrowed to nothing."""
        lo, hi, ranges = 0, len(self.order), []
        depth = min(MAX_MATCH, len(context))
        for j in range(depth):
            lo, hi = self._narrow(lo, hi, j, int(context[-1 - j]))
            if lo >= hi:
                return ranges, _NONE, _NONE
            ranges.append((lo, hi))
            if hi - lo <= SMALL_RANGE:
                break
        ends = self.order[lo:hi]
        if len(ranges) == depth:
            return ranges, ends, np.full(len(ends), depth)
        return ranges, ends, match_lengths(self.text, ends, context)

    def continues(self, lo: int, hi: int) -> bool:
        """Whether some occurrence in the range is followed by a token (not the end of its row)."""
        return bool((self.text[self.order[lo:hi] + 1] != SENTINEL).any())

    def _narrow(self, lo: int, hi: int, j: int, token: int) -> tuple[int, int]:
        """The part of [lo, hi) (equal in keys 0..j-1) whose key j is `token`; key j of the
        position p is text[p - j], non-decreasing within the range."""
        if hi - lo <= SMALL_RANGE:
            keys = self.text[self.order[lo:hi] - j]
            return lo + int(np.searchsorted(keys, token, "left")), lo + int(np.searchsorted(keys, token, "right"))
        text = self._text

        def key(p: int) -> int:
            return text[p - j]

        left = bisect_left(self._order, token, lo, hi, key=key)
        return left, bisect_right(self._order, token, left, hi, key=key)


def _sorted_positions(text: np.ndarray) -> np.ndarray:
    """Token positions (not sentinels) sorted by the MAX_MATCH tokens ending at each, read
    backwards, by prefix doubling; ties (equal windows) keep position order."""
    rank = np.unique(text, return_inverse=True)[1].astype(np.int64)  # SENTINEL (-1) ranks 0
    h = 1
    while h < MAX_MATCH:
        shifted = np.zeros_like(rank)
        shifted[h:] = rank[:-h]  # the rank of the h tokens before the h ending here
        rank = np.unique(rank * (int(rank.max()) + 1) + shifted, return_inverse=True)[1].astype(np.int64)
        h *= 2
    positions = np.flatnonzero(text != SENTINEL)
    return positions[np.argsort(rank[positions], kind="stable")].astype(np.int32)


class SuffixTree:
    """The finished rows of one scope, oldest first, across `Segment`s (oldest segment first)."""

    def __init__(self) -> None:
        self.segments: list[Segment] = []

    @property
    def rows(self) -> int:
        return sum(len(s.ids) for s in self.segments)

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.segments)

    @property
    def oldest(self) -> int | None:
        """The serial of the oldest row held (None when empty)."""
        return self.segments[0].serials[0] if self.segments else None

    def copy(self) -> "SuffixTree":
        """A tree over the same rows that changes apart from this one (segments are immutable)."""
        twin = SuffixTree()
        twin.segments = list(self.segments)
        return twin

    def serials(self) -> list[int]:
        """The rows' serial numbers, oldest first."""
        return [x for s in self.segments for x in s.serials]

    def add(self, row_id: str, tokens: Sequence[int], serial: int) -> None:
        self.segments.append(Segment([np.asarray(tokens, dtype=np.int32)], [row_id], [serial]))
        while len(self.segments) > 1 and self.segments[-2].tokens <= 2 * self.segments[-1].tokens:
            newer = self.segments.pop()
            self.segments[-1] = _merged([self.segments[-1], newer])

    def remove(self, ids: set[str]) -> None:
        """Drop the rows with these ids (a row about to run again must not draft from itself)."""
        self.segments = [_merged([s], keep=lambda i, s=s: s.ids[i] not in ids) if ids.intersection(s.ids) else s
                         for s in self.segments]
        self.segments = [s for s in self.segments if s.ids]

    def evict_oldest(self, rows: int) -> None:
        while rows > 0 and self.segments:
            first = self.segments[0]
            if rows >= len(first.ids):
                rows -= len(first.ids)
                self.segments.pop(0)
            else:
                self.segments[0] = _merged([first], keep=lambda i, n=rows: i >= n)
                rows = 0

    def draft(self, context: np.ndarray, budget: int, max_spec_factor: float, min_token_prob: float) -> Draft:
        """The draft from these rows (see the module docstring)."""
        if budget <= 0 or not self.segments or len(context) == 0:
            return Draft()
        found = [s.matches(context) for s in self.segments]
        m = 0
        for s, (ranges, ends, lengths) in zip(self.segments, found):
            follows = s.text[ends + 1] != SENTINEL
            if follows.any():
                m = max(m, int(lengths[follows].max()))
                continue
            for depth in range(len(ranges) - (1 if len(ends) else 0), m, -1):  # shallower, where it continues
                if s.continues(*ranges[depth - 1]):
                    m = depth
                    break
        if m == 0:
            return Draft()
        groups = []
        for age, (s, (ranges, ends, lengths)) in enumerate(zip(self.segments, found)):
            at = s.order[ranges[m - 1][0] : ranges[m - 1][1]] if m <= len(ranges) else ends[lengths >= m]
            groups.append(Occurrences(s.text, at, age))
        tokens, probs = continuation(groups, spec_budget(m, budget, max_spec_factor), min_token_prob)
        return Draft(tokens, probs, m, "tree") if tokens else Draft()


def _merged(segments: list[Segment], keep=lambda i: True) -> Segment:
    rows, ids, serials = [], [], []
    for s in segments:
        for i in range(len(s.ids)):
            if keep(i):
                rows.append(s.row(i))
                ids.append(s.ids[i])
                serials.append(s.serials[i])
    return Segment(rows, ids, serials)
