"""The NGram drafter's pool, as tensorrt_llm/_torch/speculative/ngram.py NGramPoolManager keeps it
(NG in SOURCES.md): the stand-in drafts with it, and the tests take it as the brute-force model of
the rules that batchspec/engine/trtllm/ngram_pool.py replays. Written from the reading, on the same
`ordered_set.OrderedSet` (PyPI ordered-set) the real one uses, so removing from a pattern's
matches while iterating them behaves as there. Deliberately plain: a scan of every prefix
position at every call, no incremental start index shortcuts beyond the real one."""

from __future__ import annotations

from ordered_set import OrderedSet


class NGramPoolManager:
    def __init__(self, max_total_draft_tokens: int, max_matching_ngram_size: int, is_keep_all: bool,
                 is_use_oldest: bool, is_public_pool: bool) -> None:
        self.k, self.n_max = max_total_draft_tokens, max_matching_ngram_size
        self.keep_all, self.oldest, self.public = is_keep_all, is_use_oldest, is_public_pool
        self.pool: dict = {}  # public: pattern -> OrderedSet of matches; private: request -> that
        self.start_index: dict[int, int] = {}

    def get_draft_tokens(self, prefix: list[int], request_id: int, max_sequence_length: int) -> list[int]:
        room = max_sequence_length - 1 - len(prefix)
        if room <= 0:
            return []
        if request_id not in self.start_index:
            self.start_index[request_id] = 0
            if not self.public:
                self.pool[request_id] = {}
        pool = self.pool if self.public else self.pool[request_id]
        sequence = prefix[self.start_index[request_id]:]
        sizes = list(range(min(self.n_max, len(prefix) - 1), 0, -1))
        for size in sizes:
            for left in range(len(sequence) - size):
                pattern = tuple(sequence[left:left + size])
                new = tuple(sequence[left + size:min(left + size + self.k, len(sequence))])
                if pattern not in pool or (not self.keep_all and len(new) > len(pool[pattern][0])):
                    pool[pattern] = OrderedSet((new,))
                elif new not in pool[pattern]:
                    for old in pool[pattern]:
                        if len(old) < len(new):
                            pool[pattern].remove(old)
                    pool[pattern].add(new)
        draft: list[int] = []
        for size in sizes:
            pattern = tuple(prefix[-size:])
            if pattern in pool:
                draft = list(pool[pattern][0 if self.oldest else -1])[:room]
                break
        self.start_index[request_id] = max(0, len(prefix) - (self.k + self.n_max - 1))
        return draft

    def release(self, request_id: int) -> None:
        """update_resources on a finished request: a private pool is dropped, a public one kept."""
        if not self.public and request_id in self.pool:
            self.pool.pop(request_id)
            self.start_index.pop(request_id)
