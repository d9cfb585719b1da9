"""Structured output in the torch engine: a row's JSON schema enforced on every committed token.

On tiny random models (a 4-layer target and a 1-layer draft over SmolLM2's tokenizer): constrained
greedy speculative output equals constrained greedy plain output for every arm (n-gram lookup
behind the grammar's forced tokens, forced tokens alone, a draft model drafting under the mask,
suffix drafting over a tree the rows share), at batch 1 and 3; every row that stops is valid JSON of its schema (checked with `jsonschema`);
bad schemas fail their row only; and over a seven-token vocabulary where every outcome can be
enumerated, sampled constrained output follows the target's distribution restricted to the
tokens the grammar allows (a chi-square test, with a broken mask as its negative control)."""

from __future__ import annotations

import dataclasses
import json

import jsonschema
import pytest
import torch
from scipy.stats import chisquare

from batchspec.engine.base import NO_SPEC, Request, SamplingParams, SpecConfig
from batchspec.engine.response_format import parse_response_format
from batchspec.engine.torch import grammar as torch_grammar
from batchspec.engine.torch.engine import TorchEngine
from tests.conftest import tiny_llama

RECORD = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "kind": {"enum": ["person", "company", "place"]},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
    },
    "required": ["name", "age", "kind", "ok", "tags"],
    "additionalProperties": False,
}
POINT = {"type": "object", "properties": {"x": {"type": "integer", "minimum": -9, "maximum": 9},
                                          "y": {"type": "integer", "minimum": -9, "maximum": 9}},
         "required": ["x", "y"], "additionalProperties": False}


def fmt(schema: dict):
    return parse_response_format({"type": "json_schema", "json_schema": {"name": "t", "schema": schema, "strict": True}})


@pytest.fixture(scope="module")
def engine(tiny_pair):
    target, draft, tokenizer = tiny_pair
    drafts = {"self": target, "far": draft}
    return TorchEngine(target, tokenizer, model_name="tiny", draft_loader=lambda name: (drafts[name], tokenizer))


def constrained_requests(n: int = 6, max_tokens: int = 80) -> list[Request]:
    """Constrained rows of two schemas, one with a cap too small to finish, and an unconstrained row."""
    out = [Request(f"c{i}", f"Extract record {i}: name Bob{i}, age {20 + i}, tags a b.",
                   params=SamplingParams(max_tokens=max_tokens), response_format=fmt(RECORD if i % 2 else POINT))
           for i in range(n)]
    out.append(Request("short", "Extract a point", params=SamplingParams(max_tokens=6), response_format=fmt(RECORD)))
    out.append(Request("free", "hello there, general", params=SamplingParams(max_tokens=12)))
    return out


@pytest.fixture(scope="module")
def plain(engine):
    return engine.generate(constrained_requests(), NO_SPEC, 3)


ARMS = [SpecConfig("ngram", 2), SpecConfig("ngram", 5), SpecConfig("ngram", 6, ngram_size=0),
        SpecConfig("draft_target", 3, draft_model="self"), SpecConfig("draft_target", 4, draft_model="far")]


@pytest.mark.parametrize("batch_size", [1, 3])
@pytest.mark.parametrize("spec", ARMS, ids=lambda s: f"{s.label}:n={s.ngram_size}:{s.draft_model}")
def test_constrained_greedy_speculation_equals_constrained_greedy_plain(engine, plain, spec, batch_size):
    ran = engine.generate(constrained_requests(), spec, batch_size)
    for c, p in zip(ran.completions, plain.completions):
        assert (c.id, c.token_ids, c.finish_reason) == (p.id, p.token_ids, p.finish_reason)
        assert c.forced_tokens <= c.accepted_tokens <= c.draft_tokens
    forced = sum(c.forced_tokens for c in ran.completions)
    assert forced > 0  # keys, quotes and punctuation came as forced drafts, and were kept
    if spec.ngram_size == 0:  # forced drafts alone: the grammar's tokens, every one kept
        assert ran.accepted_tokens == ran.draft_tokens == forced
    assert ran.completions[-1].forced_tokens == 0  # the unconstrained row has no grammar


@pytest.mark.parametrize("batch_size", [1, 3])
@pytest.mark.parametrize("k", [4, 8])
def test_constrained_greedy_suffix_speculation_equals_constrained_greedy_plain(engine, plain, k, batch_size):
    """The suffix arm behind the grammar's forced tokens, its rows sharing one tree (a later row
    drafts from the outputs of the rows of its schema that finished before it)."""
    scope = f"constrained-{k}-{batch_size}"
    requests = [dataclasses.replace(r, draft_scope=scope) for r in constrained_requests()]
    ran = engine.generate(requests, SpecConfig("suffix", k), batch_size)
    for c, p in zip(ran.completions, plain.completions):
        assert (c.id, c.token_ids, c.finish_reason) == (p.id, p.token_ids, p.finish_reason)
        assert c.forced_tokens <= c.accepted_tokens <= c.draft_tokens <= k * c.target_steps
    assert sum(c.forced_tokens for c in ran.completions) > 0
    assert sum(c.tree_drafts for c in ran.completions) > 0  # the shared tree answered lookups


def test_the_suffix_drafter_proposes_forced_tokens_then_its_draft_cut_where_the_grammar_forbids(engine, plain):
    """A tree row that is a finished record of the row's schema followed by text no JSON allows.
    Behind each prefix of the record, the drafter proposes the grammar's forced tokens, then its
    draft over the context followed by them; with the grammar the whole proposal is cut at the
    first token it forbids (without, it is not): where the tree answers, the proposal keeps the
    record's rest and stops where the text begins."""
    from batchspec.engine.torch.decode import Row
    from batchspec.engine.torch.suffix import Lookups, SuffixDrafter, SuffixTrees

    request = constrained_requests()[0]  # POINT
    record = [t for t in plain.completions[0].token_ids if t not in engine.eos_ids]
    text = engine.tokenizer.encode("hello there", add_special_tokens=False)
    trees = SuffixTrees(cap_bytes=1 << 20)
    trees.add("key", "earlier", record + text)
    drafter = SuffixDrafter(trees, ["key"], Lookups(), max_spec_factor=64.0, min_token_prob=0.0)  # drafts run to the budget
    prompt = engine.encode(request)
    cut_in_the_tree = 0
    for j in range(1, len(record)):
        grammar = engine.grammar(request)
        assert grammar.consume(record[:j])
        forced = grammar.forced()
        row = Row(0, request.params, len(prompt), prompt + record[:j], None, grammar=grammar)
        free = Row(0, request.params, len(prompt), prompt + record[:j], None)
        (proposal,), (uncut,) = (drafter.propose([r], [64], engine.vocab, [forced]).tokens for r in (row, free))
        draft = drafter.draft(0, row.context + forced, 64 - len(forced))
        assert uncut == forced + draft.tokens
        assert proposal == uncut[: grammar.valid_prefix(uncut)]
        assert grammar.valid_prefix(proposal) == len(proposal) >= len(forced)  # nothing consumed by proposing
        if draft.source == "tree":
            follows = (record + text)[j + len(forced):]
            assert draft.tokens == follows[: len(draft.tokens)]
            assert proposal[len(forced):] == record[j + len(forced):][: len(draft.tokens)]
            cut_in_the_tree += len(forced) < len(proposal) < len(uncut)
    assert cut_in_the_tree > 0


def test_the_lookup_after_forced_tokens_is_the_lookup_over_the_sequence_followed_by_them():
    """`NgramIndex.propose(k, extra)` (the n-gram drafter after a grammar's forced tokens, and its
    counterfactual) against the reference scan over sequence + extra, nothing indexed from extra."""
    import numpy as np

    from batchspec.engine.torch.drafters import NgramIndex
    from tests.engine.torch.test_engine import ngram_lookup

    rng = np.random.default_rng(56)
    for vocab in (2, 3, 6):
        seq = rng.integers(0, vocab, 80).tolist()
        for max_ngram in (1, 2, 3):
            index = NgramIndex(max_ngram, seq[:1])
            for end in range(2, len(seq) - 4):
                index.extend(seq[end - 1 : end])
                for extra in (seq[end : end + 1], seq[end : end + 4], rng.integers(0, vocab, 3).tolist()):
                    for k in (0, 1, 5):
                        want = ngram_lookup(np.asarray(seq[:end] + extra), max_ngram, k)
                        assert index.propose(k, extra) == want, (vocab, max_ngram, end, extra, k)
                assert len(index.tokens) == end  # nothing of extra was indexed


def test_rows_that_stop_are_valid_json_of_their_schema(plain):
    requests = constrained_requests()
    stopped = 0
    for r, c in zip(requests, plain.completions):
        if r.response_format is None:
            continue
        if c.finish_reason == "stop":
            jsonschema.validate(json.loads(c.text), r.response_format.schema_dict)
            stopped += 1
        else:
            assert c.finish_reason == "length" and c.output_tokens == r.params.max_tokens
    assert stopped == 6  # every constrained row with room finished its JSON
    assert plain.completions[-2].finish_reason == "length"  # "short": cut at max_tokens, said so


def test_keys_come_in_the_schemas_order(plain):
    assert list(json.loads(plain.completions[1].text)) == list(RECORD["properties"])


def test_an_unconstrained_row_decodes_as_it_would_alone(engine, plain):
    alone = engine.generate(constrained_requests()[-1:], NO_SPEC, 1).completions[0]
    assert plain.completions[-1].token_ids == alone.token_ids


def test_a_schema_the_library_cannot_compile_fails_its_row_only(engine):
    bad = parse_response_format({"type": "json_schema", "json_schema": {"schema": {"type": "strin"}}})
    requests = [Request("bad", "x", params=SamplingParams(max_tokens=8), response_format=bad),
                Request("stop", "x", params=SamplingParams(max_tokens=8, stop=("}",)), response_format=fmt(POINT)),
                *constrained_requests(2)[:2]]
    result = engine.generate(requests, SpecConfig("ngram", 3), 4)
    bad_row, stop_row = result.completions[:2]
    assert bad_row.finish_reason == "error" and "cannot be compiled" in bad_row.error and "strin" in bad_row.error
    assert "\n" not in bad_row.error and bad_row.text is None
    assert stop_row.finish_reason == "error" and "stop strings cannot be combined with response_format" in stop_row.error
    assert all(c.finish_reason == "stop" for c in result.completions[2:])
    with pytest.raises(torch_grammar.GrammarError):  # compiled once: the cached failure raises again
        engine.grammars.compile(bad)


def test_compiled_grammars_are_cached_per_schema(engine, monkeypatch):
    engine.grammars.compile(fmt(POINT))
    calls = []
    monkeypatch.setattr(engine.grammars, "_compile", lambda f: calls.append(f) or "never")
    engine.generate(constrained_requests(2), NO_SPEC, 2)  # POINT and RECORD, both compiled before
    assert calls == []


# -- sampling follows the constrained distribution ------------------------------------------------

# A byte-level vocabulary for a two-item array of "a"/"b"/"c": each item is one token or three
# (`"`, the letter, `"`), and the grammar forces the brackets, the `,` and space between the items
# and the closing quote of a split item. Every outcome is a path in a small tree, enumerated exactly.
ARRAY_VOCAB = {"<eos>": 0, "[": 1, "]": 2, ",Ġ": 3, '"a"': 4, '"b"': 5, '"c"': 6, '"': 7, "a": 8, "b": 9, "c": 10,
               ",": 11, "Ġ": 12}
PAIR = {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 2, "maxItems": 2}
TEMPERATURE = 0.9


def array_tokenizer():
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(ARRAY_VOCAB, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("<eos>", special=True)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<eos>")


def array_case(n: int):
    tokenizer = array_tokenizer()
    V = len(ARRAY_VOCAB)
    target = tiny_llama(V, 2, seed=10, eos_token_id=0, pad_token_id=0, initializer_range=0.5)
    draft = tiny_llama(V, 1, seed=11, eos_token_id=0, pad_token_id=0, initializer_range=0.5)
    engine = TorchEngine(target, tokenizer, model_name="t", draft_loader=lambda name: (draft, tokenizer))
    prompt = [1, 4, 11, 12, 7, 9, 7, 2, 1, 7]  # `["a", "b"] ["`: n-gram lookup finds matches
    requests = [Request(f"s{i}", prompt_token_ids=tuple(prompt), response_format=fmt(PAIR),
                        params=SamplingParams(max_tokens=16, temperature=TEMPERATURE, seed=i)) for i in range(n)]
    return engine, target, prompt, requests


@torch.no_grad()
def constrained_outcomes(engine, target, request, prompt: list[int]) -> dict[tuple[int, ...], float]:
    """Every output the grammar allows, with its probability under the target's distribution at
    TEMPERATURE restricted to the allowed tokens at each position: the tree, walked exactly."""
    out: dict[tuple[int, ...], float] = {}
    frontier = [((), 1.0)]
    while frontier:
        path, p = frontier.pop()
        if path and path[-1] == 0:
            out[path] = p
            continue
        grammar = engine.grammar(request)
        assert grammar.consume(list(path))
        allowed = grammar.mask()
        logits = target(torch.tensor([prompt + list(path)])).logits[0, -1].double() / TEMPERATURE
        probs = torch.softmax(logits.masked_fill(~allowed, float("-inf")), -1)
        frontier += [(path + (t,), p * float(probs[t])) for t in allowed.nonzero().flatten().tolist()]
    return out


def outcome_pvalue(result, expected: dict[tuple[int, ...], float]) -> float:
    counts = {k: 0 for k in expected}
    for c in result.completions:
        assert c.finish_reason == "stop", c.error
        counts[tuple(c.token_ids)] += 1  # a KeyError here: an output the grammar does not allow
    n = len(result.completions)
    big = [k for k in expected if expected[k] * n >= 5]  # pool rare outcomes so the chi-square approximation holds
    rare = [k for k in expected if k not in big]
    obs = [counts[k] for k in big] + [sum(counts[k] for k in rare)]
    exp = [expected[k] * n for k in big] + [sum(expected[k] for k in rare) * n]
    return chisquare(obs, [e * sum(obs) / sum(exp) for e in exp]).pvalue


@pytest.fixture(scope="module")
def array_expected():
    engine, target, prompt, requests = array_case(1)
    expected = constrained_outcomes(engine, target, requests[0], prompt)
    assert len(expected) == 36 and sum(expected.values()) == pytest.approx(1.0)  # 6 ways per item, squared
    return expected


@pytest.mark.parametrize("spec", [SpecConfig("ngram", 3), SpecConfig("draft_target", 3, draft_model="d"),
                                  SpecConfig("suffix", 3), SpecConfig()], ids=lambda s: s.label)
def test_sampled_constrained_output_follows_the_constrained_distribution(spec, array_expected):
    engine, target, prompt, requests = array_case(3000)
    if spec.method == "suffix":  # the rows share one tree: later rows draft from earlier rows' sampled outputs
        requests = [dataclasses.replace(r, draft_scope="pairs") for r in requests]
    result = engine.generate(requests, spec, 1000)
    if spec.method != "none":
        assert result.draft_tokens > len(requests)  # rows really drafted
        assert sum(c.forced_tokens for c in result.completions) > len(requests)
    if spec.method == "suffix":
        assert sum(c.tree_drafts for c in result.completions) > len(requests) / 4
    assert outcome_pvalue(result, array_expected) > 1e-3


def test_a_mask_missing_at_the_draft_positions_fails_the_distribution_test(monkeypatch, array_expected):
    """The negative control: masking only the first scored position of each verify lets a token
    the grammar forbids through after an accepted draft (the row fails), or bends the distribution."""
    masks = torch_grammar.Grammar.masks

    def first_only(self, drafts):
        allowed, held = masks(self, drafts)
        allowed[1:] = True
        return allowed, held

    monkeypatch.setattr(torch_grammar.Grammar, "masks", first_only)
    engine, target, prompt, requests = array_case(3000)
    result = engine.generate(requests, SpecConfig("ngram", 3), 1000)
    broken = [c for c in result.completions if c.finish_reason != "stop" or tuple(c.token_ids) not in array_expected]
    assert broken or outcome_pvalue(result, array_expected) < 1e-6
