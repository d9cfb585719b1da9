"""Structured output in the torch engine: a row's JSON schema as a token-level grammar.

The grammar library is llguidance (docs/structured-output.md says why): it compiles a JSON schema
into an Earley grammar over the tokenizer's tokens and answers, for a matcher standing at a row's
committed tokens, which tokens may come next (a bit mask over the vocabulary), how many tokens of a
proposal it would accept, which tokens it forces, and it rolls back.

- `Grammars` (one per engine): the tokenizer as llguidance sees it, built once (about a second),
  and each schema compiled once, cached by its canonical text (`ResponseFormat.schema`).
- `Grammar` (one per constrained row): the matcher, and the few questions the decode loop asks.

The JSON is compact and fixed in form (`JSON_OPTIONS`: ", " and ": " as separators, no other
whitespace), so keys, quotes and punctuation are forced: that is where forced drafts come from.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch

from batchspec.engine.response_format import ResponseFormat

JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
CACHED_SCHEMAS = 256  # compiled grammars a worker keeps (least recently used out first)


class GrammarError(ValueError):
    """A schema the grammar library cannot compile (the row's one-line error)."""


class Grammars:
    """Compiles schemas for one tokenizer and hands out matchers. `vocab` is the model's (the mask's
    width: ids past the tokenizer's are never allowed); `eos_ids` end a row whose JSON is complete."""

    def __init__(self, tokenizer, vocab: int, eos_ids: set[int]) -> None:
        self.hf_tokenizer, self.vocab, self.eos_ids = tokenizer, vocab, sorted(eos_ids)
        self._tokenizer = None
        self._compiled: OrderedDict[str, str | GrammarError] = OrderedDict()

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            import llguidance.hf

            self._tokenizer = llguidance.hf.from_tokenizer(self.hf_tokenizer, n_vocab=self.vocab,
                                                           eos_token=self.eos_ids or None)
        return self._tokenizer

    def compile(self, fmt: ResponseFormat) -> str:
        """The schema's grammar (cached); GrammarError (one line) when it cannot be compiled."""
        held = self._compiled.get(fmt.schema)
        if held is None:
            held = self._compile(fmt)
            self._compiled[fmt.schema] = held
            if len(self._compiled) > CACHED_SCHEMAS:
                self._compiled.popitem(last=False)
        else:
            self._compiled.move_to_end(fmt.schema)
        if isinstance(held, GrammarError):
            raise held
        return held

    def _compile(self, fmt: ResponseFormat) -> str | GrammarError:
        grammar, problem = _grammar(fmt, self.tokenizer)
        return GrammarError(problem) if problem else grammar

    def matcher(self, fmt: ResponseFormat) -> "Grammar":
        """A fresh matcher at the start of `fmt`'s output (GrammarError if it cannot compile)."""
        from llguidance import LLMatcher

        matcher = LLMatcher(self.tokenizer, self.compile(fmt), log_level=0)
        if matcher.is_error():
            raise GrammarError(f"response_format: the schema cannot be compiled: {_line(matcher.get_error())}")
        return Grammar(matcher, self.vocab, frozenset(self.eos_ids))


class Grammar:
    """One row's matcher, standing at the row's committed tokens between decode steps."""

    def __init__(self, matcher, vocab: int, eos_ids: frozenset[int] = frozenset()) -> None:
        self.matcher, self.vocab, self.eos_ids = matcher, vocab, eos_ids
        self.words = (vocab + 31) // 32  # int32 words of a bit mask

    def copy(self) -> "Grammar":
        """An independent matcher in the same state."""
        return Grammar(self.matcher.deep_copy(), self.vocab, self.eos_ids)

    def forced(self) -> list[int]:
        """The tokens the grammar forces from here (its fast-forward tokens), possibly none."""
        return list(self.matcher.compute_ff_tokens())

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many leading tokens of `tokens` the grammar allows from here (nothing consumed)."""
        return self.matcher.validate_tokens(tokens) if tokens else 0

    def masks(self, drafts: list[int]) -> tuple[torch.Tensor, int]:
        """Allowed tokens [len(drafts) + 1, vocab] (bool) at each position a verify scores: here,
        and after each draft. The drafts the grammar allows are consumed (the count is returned:
        `rollback` it); a position past a forbidden draft, or past the end of the output, allows
        every token (acceptance never reaches it, or the row ends before it). An eos is never
        consumed here: the row ends on it, and llguidance does not roll an eos back cleanly."""
        held = self.valid_prefix(_before_eos(drafts, self.eos_ids))
        bits = torch.full((len(drafts) + 1, self.words), -1, dtype=torch.int32)
        for i in range(held + 1):
            self._fill(bits[i])
            if i < held:
                self.matcher.consume_token(drafts[i])
        return unpack(bits, self.vocab), held

    def mask(self) -> torch.Tensor:
        """Allowed tokens here [vocab] (bool)."""
        bits = torch.empty(1, self.words, dtype=torch.int32)
        self._fill(bits[0])
        return unpack(bits, self.vocab)[0]

    def _fill(self, row: torch.Tensor) -> None:
        self.matcher.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * 4)
        if not bool(row.any()):  # nothing allowed: past the output's end (an eos consumed)
            row.fill_(-1)

    def advance(self, token: int) -> bool:
        """Consume `token` if the grammar allows it here and it is not an eos (True), else leave
        the matcher as it is (an eos ends the output: see `masks`)."""
        return token not in self.eos_ids and self.matcher.try_consume_tokens([token]) == 1

    def consume(self, tokens: list[int]) -> bool:
        """Advance over committed tokens; False if the grammar refused one (the row's error)."""
        return all(self.matcher.consume_token(t) for t in tokens)

    def rollback(self, n: int) -> None:
        if n:
            self.matcher.rollback(n)

    @property
    def error(self) -> str | None:
        return _line(self.matcher.get_error()) if self.matcher.is_error() else None


def unpack(bits: torch.Tensor, vocab: int) -> torch.Tensor:
    """Bit masks [N, words] (int32, bit j of word w = token 32 w + j) as bool [N, vocab]. numpy's
    unpackbits over the little-endian bytes: shifting int32 tensors took 12 ms a row on this CPU
    (SmolLM2's 49,152 tokens), unpackbits 0.02 ms."""
    flat = np.unpackbits(bits.numpy().view(np.uint8), axis=-1, bitorder="little")
    return torch.from_numpy(flat).view(torch.bool)[:, :vocab]


def _before_eos(tokens: list[int], eos_ids: frozenset[int]) -> list[int]:
    for i, token in enumerate(tokens):
        if token in eos_ids:
            return tokens[:i]
    return tokens


def schema_problem(fmt: ResponseFormat) -> str | None:
    """Why llguidance cannot compile `fmt`'s schema (one line), or None: checked without a
    tokenizer, so a run's default response_format is refused before any worker starts."""
    return _grammar(fmt, None)[1]


def _grammar(fmt: ResponseFormat, tokenizer) -> tuple[str, str | None]:
    """The schema's llguidance grammar and, where it cannot be compiled (for `tokenizer`, or for
    any tokenizer where None), the row's one-line error."""
    from llguidance import LLMatcher

    try:
        grammar = LLMatcher.grammar_from_json_schema(fmt.schema, defaults=JSON_OPTIONS)
        problem = LLMatcher.validate_grammar(grammar, tokenizer)
    except ValueError as exc:
        grammar, problem = "", str(exc)
    return grammar, (f"response_format: the schema cannot be compiled: {_line(problem)}" if problem else None)


def _line(text) -> str:
    return " ".join(str(text).split())[:300]
