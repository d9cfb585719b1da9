"""The torch engine on tiny random models: lossless greedy speculation, exact counts on
constructed cases, the target distribution under sampling, and every per-row and per-call error."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.stats import chisquare

from batchspec.engine.base import Request, SamplingParams, SpecConfig
from batchspec.engine.sampling import accept_reject, sample_from
from batchspec.engine.torch import decode as torch_decode
from batchspec.engine.torch.engine import TorchEngine
from batchspec.errors import BatchspecError, ConfigError, ModelError
from tests.conftest import tiny_llama, word_tokenizer


def word_engine(word_models) -> TorchEngine:
    target, drafts, tokenizer = word_models
    return TorchEngine(target, tokenizer, model_name="tiny", draft_loader=lambda name: (drafts[name], tokenizer))


def word_requests(n: int, seed: int = 0, max_tokens=lambda i: 24 + 5 * i, **params) -> list[Request]:
    """Prompts of different lengths with repeated words (so n-gram lookup finds matches)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        words = [f"w{int(x)}" for x in torch.randint(1, 12, (4 + 6 * i,), generator=gen)]
        out.append(Request(f"r{i}", " ".join(words), params=SamplingParams(max_tokens=max_tokens(i), **params)))
    return out


@pytest.fixture(scope="module")
def plain_reference(word_models):
    """Greedy plain outputs, one request at a time with Hugging Face's own generate()."""
    target, _, tokenizer = word_models
    refs = {}
    for r in word_requests(6):
        ids = tokenizer(r.prompt, return_tensors="pt").input_ids
        out = target.generate(ids, max_new_tokens=r.params.max_tokens, do_sample=False, eos_token_id=0, pad_token_id=0)
        refs[r.id] = out[0, ids.shape[1]:].tolist()
    return refs


@pytest.mark.parametrize("batch_size", [1, 3, 8])
def test_plain_greedy_matches_huggingface_generate(word_models, plain_reference, batch_size):
    result = word_engine(word_models).generate(word_requests(6), SpecConfig(), batch_size)
    assert {c.id: c.token_ids for c in result.completions} == plain_reference


@pytest.mark.parametrize("draft_len", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("method,draft", [("ngram", None), ("draft_target", "close"), ("draft_target", "far"), ("suffix", None)])
def test_greedy_speculation_equals_plain_greedy(word_models, plain_reference, method, draft, draft_len, batch_size):
    spec = SpecConfig(method, draft_len, draft_model=draft)
    result = word_engine(word_models).generate(word_requests(6), spec, batch_size)
    assert {c.id: c.token_ids for c in result.completions} == plain_reference
    assert result.draft_tokens > 0  # speculation really happened
    if draft == "close":
        assert result.accepted_tokens > 0  # and some drafts were kept, so acceptance paths ran


def test_sequences_finish_independently_and_in_request_order(word_models, plain_reference):
    # lengths 24..49 tokens, batch of 4: rows leave and queued rows join mid-flight
    result = word_engine(word_models).generate(word_requests(6), SpecConfig("draft_target", 3, draft_model="close"), 4)
    assert [c.id for c in result.completions] == [f"r{i}" for i in range(6)]
    assert [c.output_tokens for c in result.completions] == [len(plain_reference[f"r{i}"]) for i in range(6)]
    assert all(c.finish_reason == "length" for c in result.completions)


@pytest.mark.parametrize("draft_len", [1, 3, 4])
def test_counts_when_every_draft_is_right(word_models, draft_len):
    """With the target as its own draft, every draft passes: accepted == proposed, and each step
    commits draft_len + 1 tokens until the max_tokens budget shortens the last drafts."""
    reqs = word_requests(3, max_tokens=lambda i: 13 + 4 * i)
    result = word_engine(word_models).generate(reqs, SpecConfig("draft_target", draft_len, draft_model="self"), 2)
    for c, r in zip(result.completions, reqs):
        assert c.finish_reason == "length"
        after_prefill = r.params.max_tokens - 1  # the first token comes from prefill
        assert c.accepted_tokens == c.draft_tokens == after_prefill - c.target_steps
        assert c.target_steps == math.ceil(after_prefill / (draft_len + 1))
        # step by step: every full step accepted all draft_len drafts, a last short one what its budget left
        full, last = divmod(after_prefill, draft_len + 1)
        assert c.accepted_steps == [draft_len] * full + ([last - 1] if last else [])


def bigram_model(vocab: int):
    """A 1-layer Llama whose attention and MLP write nothing, and whose head maps token t to
    t + 1 (mod vocab): the next token depends only on the current one, so n-gram drafts are
    right or wrong in ways we can count by hand."""
    model = tiny_llama(vocab, 1, seed=3, eos_token_id=None, pad_token_id=None, tie_word_embeddings=False)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        emb = model.model.embed_tokens.weight
        unit = emb / emb.norm(dim=-1, keepdim=True)
        model.lm_head.weight.copy_(10 * unit.roll(1, dims=0))  # row j scores the embedding of j - 1
    return model


def test_ngram_counts_on_a_constructed_case():
    tokenizer = word_tokenizer(32)
    tokenizer.eos_token = None
    engine = TorchEngine(bigram_model(32), tokenizer, model_name="bigram")
    # prompt ... 10 11 | the model continues 12 13 14 15 16 ...; the prompt's earlier
    # "10 11 12 13 14 15 9" lets lookup propose 13 14 15 9 after "10 11 12": 3 right, 1 wrong.
    prompt = (10, 11, 12, 13, 14, 15, 9, 10, 11)
    request = Request("c", prompt_token_ids=prompt, params=SamplingParams(max_tokens=8))
    [c] = engine.generate([request], SpecConfig("ngram", 4, ngram_size=3), 1).completions
    assert c.token_ids == [12, 13, 14, 15, 16, 17, 18, 19]
    # step 1 proposes 13 14 15 9 (4), accepts 3, recovers 16; "15 16" never occurred: no more drafts
    assert (c.draft_tokens, c.accepted_tokens) == (4, 3)
    assert c.target_steps == 1 + 3  # then three plain steps for 17 18 19
    assert c.accepted_steps == [3, 0, 0, 0]  # step 1 accepted 3 drafts, the plain steps none


def ngram_lookup(tokens, max_ngram: int, k: int) -> list[int]:
    """The reference the n-gram index is held to: the scan the drafter ran until 2026-12-04. Up to
    k tokens that followed the latest earlier match of the last n tokens, n from max_ngram down."""
    import numpy as np

    tokens = np.asarray(tokens)
    if k <= 0:
        return []
    for n in range(min(max_ngram, len(tokens) - 1), 0, -1):
        windows = np.lib.stride_tricks.sliding_window_view(tokens[:-1], n)
        hits = np.flatnonzero((windows == tokens[-n:]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return tokens[start : start + k].tolist()
    return []


def test_ngram_lookup_prefers_the_longest_latest_match():
    from batchspec.engine.torch.drafters import NgramIndex

    tokens = [1, 2, 3, 4, 9, 2, 3, 5, 6, 7, 2, 3]
    cases = [(tokens, 3, 2, [5, 6]),  # "2 3" latest earlier match is followed by 5 6
             ([1, 2, 3, 1, 2], 2, 4, [3, 1, 2]), ([1, 2, 3], 3, 4, []), (tokens, 3, 0, [])]
    for seq, max_ngram, k, want in cases:
        assert ngram_lookup(seq, max_ngram, k) == want
        assert NgramIndex(max_ngram, seq).propose(k) == want


# -- sampling follows the target's distribution ----------------------------------------------------


def exact_joint(model, prompt: list[int], vocab: int, temperature: float) -> torch.Tensor:
    """P(t1..t4 | prompt) for the target, by enumeration: [V, V, V, V]."""
    import itertools

    joint = torch.ones(())
    with torch.no_grad():
        for depth in range(4):
            prefixes = list(itertools.product(range(vocab), repeat=depth))
            ids = torch.tensor([prompt + list(p) for p in prefixes])
            step = torch.softmax(model(ids).logits[:, -1].double() / temperature, -1)
            joint = joint[..., None] * step.view(*([vocab] * depth), vocab)
    return joint


def five_word_case(V: int, n: int):
    """A 2-layer target and a 1-layer draft over V words, and n sampled requests (T = 0.9, seeds
    0..n-1) of 4 tokens each on one prompt: (engine, target, prompt, requests)."""
    tokenizer = word_tokenizer(V)
    target = tiny_llama(V, 2, seed=10, eos_token_id=None, pad_token_id=0, initializer_range=0.5)
    draft = tiny_llama(V, 1, seed=11, eos_token_id=None, pad_token_id=0, initializer_range=0.5)
    engine = TorchEngine(target, tokenizer, model_name="t", draft_loader=lambda name: (draft, tokenizer))
    engine.eos_ids = set()  # every sequence runs four tokens, so every outcome is a full 4-tuple
    prompt = [1, 2, 3, 1, 2, 4, 1, 2]  # repeats, so n-gram lookup proposes after "1 2"
    requests = [Request(f"s{i}", prompt_token_ids=tuple(prompt),
                        params=SamplingParams(max_tokens=4, temperature=0.9, seed=i)) for i in range(n)]
    return engine, target, prompt, requests


def joint_pvalue(result, target, prompt: list[int], vocab: int) -> float:
    """Chi-square p-value of the 4-token outputs in `result` against the target's exact joint."""
    counts = torch.zeros(*[vocab] * 4)
    for c in result.completions:
        counts[tuple(c.token_ids)] += 1
    n = len(result.completions)
    expected = exact_joint(target, prompt, vocab, 0.9).double().flatten() * n
    observed = counts.double().flatten()
    small = expected < 5  # pool rare outcomes so the chi-square approximation holds
    obs = torch.cat([observed[~small], observed[small].sum()[None]])
    exp = torch.cat([expected[~small], expected[small].sum()[None]])
    return chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue


def wrong_rule(draft_tokens, draft_probs, num_drafts, target_probs, u_accept, u_sample):
    """A plausible bug: on rejection, resample from p instead of the residual max(0, p - q)."""
    n, _ = accept_reject(draft_tokens, draft_probs, num_drafts, target_probs, u_accept, u_sample)
    return n, sample_from(target_probs[torch.arange(len(n)), n], u_sample)


@pytest.mark.parametrize("rule_is_right", [True, False])
@pytest.mark.parametrize("method", ["draft_target", "ngram"])  # suffix: tests/engine/torch/test_suffix.py
def test_sampled_speculation_follows_the_target_distribution(monkeypatch, rule_is_right, method):
    """The 4-token joint against the target's exact one (chi-square). 4,000 rows are plenty to
    refuse a wrong accept rule: it scores p ~ 1e-78 (draft_target) and 1e-233 (ngram) here, the
    right rule 0.13 and 0.95."""
    V, n = 5, 4_000
    engine, target, prompt, requests = five_word_case(V, n)
    if not rule_is_right:
        monkeypatch.setattr(torch_decode, "accept_reject", wrong_rule)
    result = engine.generate(requests, SpecConfig(method, 2, draft_model="d"), 1000)
    assert result.draft_tokens > 1.5 * n  # rows really drafted (up to 2, then 1, per row)
    pvalue = joint_pvalue(result, target, prompt, V)
    if rule_is_right:
        assert pvalue > 1e-3
    else:
        assert pvalue < 1e-6


def test_each_row_draws_from_its_own_generator(word_models):
    """A row's random draws don't depend on which rows share its batch (over a 64-word
    vocabulary, where float noise cannot move a draw across a boundary)."""
    engine = word_engine(word_models)
    reqs = word_requests(5, temperature=0.8, top_p=0.9, seed=7)
    a = engine.generate(reqs, SpecConfig("draft_target", 3, draft_model="close"), 5)
    b = engine.generate(reqs, SpecConfig("draft_target", 3, draft_model="close"), 2)
    assert [c.token_ids for c in a.completions] == [c.token_ids for c in b.completions]


# -- text, chat, stop strings and errors -------------------------------------------------------------


@pytest.fixture(scope="module")
def smol_engine(tiny_pair):
    target, draft, tokenizer = tiny_pair
    other = word_tokenizer(64)
    drafts = {"tiny-draft": (draft, tokenizer), "other-tokenizer": (draft, other)}
    return TorchEngine(target, tokenizer, model_name="tiny", draft_loader=lambda name: drafts[name])


def test_chat_messages_go_through_the_chat_template(smol_engine):
    messages = ({"role": "user", "content": "Say hi"},)
    chat = Request("chat", messages=messages, params=SamplingParams(max_tokens=4))
    templated = smol_engine.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
    plain = Request("plain", prompt=templated, params=SamplingParams(max_tokens=4))
    a, b = smol_engine.generate([chat, plain], SpecConfig(), 2).completions
    assert a.error is None and a.prompt_tokens > 5
    assert (a.prompt_tokens, a.token_ids) == (b.prompt_tokens, b.token_ids)


def test_a_prompt_under_chat_is_the_templated_user_message_and_under_raw_its_own_tokens(smol_engine):
    """prompt_format (batchspec.parse): chat wraps the prompt in the model's chat template as one
    user message, with the generation prompt after it; raw tokenizes the text alone."""
    import pyarrow as pa

    from batchspec.parse import RowDefaults, parse_rows

    text = "Write a Python function that adds two numbers."
    table = pa.table({"prompt": [text]})
    chat, raw = (parse_rows(table, ["r"], RowDefaults(8, 0.0, 1.0, 0, fmt))[0].request for fmt in ("chat", "raw"))
    tok = smol_engine.tokenizer
    chat_ids, raw_ids = smol_engine.encode(chat), smol_engine.encode(raw)
    assert raw_ids == tok(text, add_special_tokens=True)["input_ids"]
    templated = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
    assert chat_ids == tok(templated, add_special_tokens=False)["input_ids"] and len(chat_ids) > len(raw_ids)
    rendered = tok.decode(chat_ids)
    assert rendered.startswith("<|im_start|>") and f"<|im_start|>user\n{text}<|im_end|>" in rendered
    assert rendered.endswith("<|im_start|>assistant\n"), rendered[-40:]
    a, b = smol_engine.generate([chat, raw], SpecConfig(), 2).completions
    assert (a.prompt_tokens, b.prompt_tokens) == (len(chat_ids), len(raw_ids))


def test_a_prompts_ids_are_kept_for_the_request_that_asked(smol_engine, monkeypatch):
    """TorchEngine.encode keeps the ids of the requests it encoded (calibration asks again at
    every drift check): the same request is not templated twice, a caller's change to the list
    it got does not reach the next, and another request object is encoded afresh."""
    chat = Request("chat", messages=({"role": "user", "content": "Say hi"},))
    first = smol_engine.encode(chat)
    calls = []
    templated = smol_engine._encode
    monkeypatch.setattr(smol_engine, "_encode", lambda r: calls.append(r.id) or templated(r))
    again = smol_engine.encode(chat)
    assert again == first and calls == []
    again.append(0)
    assert smol_engine.encode(chat) == first
    other = Request("chat", messages=({"role": "user", "content": "Say bye"},))
    assert smol_engine.encode(other) != first and calls == ["chat"]


def test_stop_strings_cut_the_text(smol_engine):
    free = smol_engine.generate([Request("a", "Hello there", params=SamplingParams(max_tokens=12))], SpecConfig(), 1)
    text = free.completions[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert stop.strip(), text
    cut = smol_engine.generate(
        [Request("a", "Hello there", params=SamplingParams(max_tokens=12, stop=(stop,)))], SpecConfig("ngram", 3), 1
    ).completions[0]
    assert cut.finish_reason == "stop"
    assert cut.text == text[: text.find(stop)]


def test_eos_finishes_rows_early_at_different_times(word_models):
    engine = word_engine(word_models)
    reqs = word_requests(6, max_tokens=lambda i: 40)
    free = engine.generate(reqs, SpecConfig(), 6).completions
    engine.eos_ids = {free[1].token_ids[5]}  # make a token this model really emits the eos
    plain = engine.generate(reqs, SpecConfig(), 3).completions
    early = [c for c in plain if c.finish_reason == "stop"]
    assert len({c.output_tokens for c in early}) >= 2 and plain[1].output_tokens <= 6
    assert all(c.token_ids[-1] in engine.eos_ids and c.output_tokens < 40 for c in early)
    for spec in (SpecConfig("draft_target", 4, draft_model="close"), SpecConfig("ngram", 4)):
        got = engine.generate(reqs, spec, 3).completions
        assert [(c.token_ids, c.finish_reason) for c in got] == [(c.token_ids, c.finish_reason) for c in plain]


def test_bad_rows_fail_alone(smol_engine):
    long_prompt = "word " * 600  # over the tiny model's 512-token context
    requests = [
        Request("ok", "Hello", params=SamplingParams(max_tokens=3)),
        Request("none", None),
        Request("empty", "   "),
        Request("number", 42),  # type: ignore[arg-type]
        Request("long", long_prompt, params=SamplingParams(max_tokens=3)),
        Request("temp", "Hi", params=SamplingParams(temperature=-1.0)),
        Request("top_p", "Hi", params=SamplingParams(top_p=0.0)),
        Request("max", "Hi", params=SamplingParams(max_tokens=0)),
        Request("badchat", messages=({"role": "user"},)),
    ]
    result = smol_engine.generate(requests, SpecConfig("ngram", 3), 4)
    by_id = {c.id: c for c in result.completions}
    assert [c.id for c in result.completions] == [r.id for r in requests]
    assert by_id["ok"].error is None and by_id["ok"].output_tokens == 3
    expected = {
        "none": "prompt is missing", "empty": "prompt is empty", "number": "prompt must be a string",
        "long": "exceeds the model's context of 512 tokens", "temp": "temperature must be >= 0",
        "top_p": "top_p must be in (0, 1]", "max": "max_tokens must be an integer >= 1", "badchat": "",
    }
    for rid, fragment in expected.items():
        c = by_id[rid]
        assert c.finish_reason == "error" and c.text is None and "\n" not in c.error, rid
        assert fragment in c.error, (rid, c.error)
    assert by_id["long"].prompt_tokens > 512


def test_a_draft_with_another_tokenizer_is_refused(smol_engine):
    with pytest.raises(ModelError, match="different tokenizer"):
        smol_engine.check(SpecConfig("draft_target", 2, draft_model="other-tokenizer"))
    smol_engine.check(SpecConfig("draft_target", 2, draft_model="tiny-draft"))  # same tokenizer: fine


@pytest.mark.parametrize("method", ["mtp"])
def test_methods_the_torch_engine_cannot_run_are_refused(smol_engine, method):
    with pytest.raises(ConfigError, match="not supported by the torch engine"):
        smol_engine.generate([Request("a", "Hi")], SpecConfig(method, 2, source="trt_configs/x.yaml"), 1)


def test_draft_target_without_a_draft_model_is_refused(smol_engine):
    with pytest.raises(ConfigError, match="needs a draft model"):
        smol_engine.check(SpecConfig("draft_target", 2))


def test_load_by_path_and_unknown_model(tiny_model_dir, tiny_draft_dir):
    engine = TorchEngine.load(str(tiny_model_dir), draft_model=str(tiny_draft_dir))
    [c] = engine.generate([Request("a", "Hello", params=SamplingParams(max_tokens=5))],
                          SpecConfig("draft_target", 2, draft_model=str(tiny_draft_dir)), 1).completions
    assert c.output_tokens == 5 and c.draft_tokens > 0
    with pytest.raises(BatchspecError):
        TorchEngine.load("no-such-model-anywhere")


def test_profile_times_every_point_asked_and_nothing_else(tiny_engine):
    target = [(1, 6, 1), (4, 6, 1), (4, 6, 5), (4, 12, 1), (4, 20, 1)]
    drafts = [("close", 4, 12, 1), ("close", 4, 12, 2), ("close", 1, 20, 1)]
    profile = tiny_engine.profile(target, drafts, reps=2)
    got = sorted((p.kind, p.batch, p.context, p.tokens) for p in profile.points)
    want = sorted([("target", b, c, w) for b, c, w in target] + [("draft", b, c, w) for _, b, c, w in drafts])
    assert got == want  # every point the cost table prices (predict/costs.py), and no other
    assert all(p.seconds > 0 for p in profile.points)
    assert profile.seconds > sum(p.seconds for p in profile.points)  # its wall: every try, a prefill and a warm-up


def test_a_greedy_profile_times_the_argmax_the_greedy_engine_takes_not_probabilities(tiny_engine, monkeypatch):
    """The greedy engine accepts on argmaxes (sampling.greedy_accept) and never turns a verify's
    logits into probabilities; its profile must not time that either, or every wide verify looks
    dearer than it runs. A sampled profile times the probabilities, as sampled decoding computes them."""
    from batchspec.engine.torch import measure

    calls = []
    real = measure.probs_from_logits
    monkeypatch.setattr(measure, "probs_from_logits", lambda *a: calls.append(a[0].shape) or real(*a))
    tiny_engine.profile([(4, 6, 1), (4, 6, 5)], reps=2, temperature=0.0)
    assert calls == []
    tiny_engine.profile([(4, 6, 5)], reps=2, temperature=0.8)
    assert calls and {shape[0] for shape in calls} == {4 * 5}  # every position of every row (the model is warm: no warm-up)


def test_a_later_profile_forks_the_row_the_first_prefilled_and_needs_no_warm_up(tiny_engine, monkeypatch):
    """The target's probes fork one short prefilled row, repeated to the widest context
    (kv.Batch.repeated). The engine keeps it: a later profile (a context probe, a re-timed curve)
    runs only its timed tries, not a prefill and a warm-up besides, even where it reaches further."""
    from batchspec.engine.torch import kv, measure

    tiny_engine.probe_seeds.clear()
    monkeypatch.setattr(tiny_engine, "warmed", False)  # as loaded: no rows decoded yet
    forwards = []
    real = kv.Batch.forward
    monkeypatch.setattr(kv.Batch, "forward", lambda self, model, tokens, *a, **k: forwards.append((len(tokens), len(tokens[0])))
                        or real(self, model, tokens, *a, **k))
    measure.profile(tiny_engine, [(4, 10, 1)], reps=2, agree=100.0)
    assert forwards == [(1, 10), (4, 1), (4, 1), (4, 1)]  # its prefill, the warm-up, two tries
    tiny_engine.probe_seeds.clear()
    tiny_engine.generate(word_requests(1, max_tokens=lambda i: 2), SpecConfig("none", 0), 1)  # a worker's sample
    assert tiny_engine.warmed
    forwards.clear()
    measure.profile(tiny_engine, [(4, 10, 1)], reps=2, agree=100.0)
    assert forwards == [(1, 10), (4, 1), (4, 1)]  # its prefill and two tries: the decode warmed the model
    forwards.clear()
    points = measure.profile(tiny_engine, [(4, 40, 1), (4, 40, 3)], reps=2, agree=100.0)
    assert forwards == [(4, 1), (4, 3), (4, 1), (4, 3)]  # two tries of each width, round-robin
    assert [(p.context, p.tokens) for p in points] == [(40, 1), (40, 3)] and all(p.seconds > 0 for p in points)
    forwards.clear()
    measure.profile(tiny_engine, [(4, 40, 1), (4, 40, 3)], reps=3, agree=-1.0, least=1)  # within a shard's budget
    assert forwards == [(4, 1), (4, 3)]  # one try of each: settled, however far they might disagree


# -- a setting changed in flight (generate's control=) ------------------------------------------------


class Cycle:
    """A control that moves the rows in flight to the next setting of `specs` after every step,
    and records what it saw."""

    def __init__(self, specs):
        self.specs, self.seen, self.finished, self.outputs = list(specs), [], [], []

    def __call__(self, progress):
        self.seen.append(progress)  # its completions, steps and in_flight are the call's own, live: read them now
        self.finished.append(sum(c is not None for c in progress.completions))
        self.outputs.append({i: list(out) for i, out in progress.in_flight.items()})
        return self.specs[len(self.seen) % len(self.specs)]


IN_FLIGHT_SPECS = [SpecConfig(), SpecConfig("ngram", 3), SpecConfig("draft_target", 2, draft_model="close"),
                   SpecConfig("draft_target", 5, draft_model="far"), SpecConfig("ngram", 1)]


@pytest.mark.parametrize("batch_size", [1, 3])
def test_greedy_output_is_plain_greedy_across_settings_changed_in_flight(word_models, plain_reference, batch_size):
    """Every step under another setting (plain, n-gram, two draft models): a fresh drafter admits
    the rows in flight from their contexts, and not one greedy token changes."""
    control = Cycle(IN_FLIGHT_SPECS)
    result = word_engine(word_models).generate(word_requests(6), SpecConfig(), batch_size, control=control)
    assert {c.id: c.token_ids for c in result.completions} == plain_reference
    assert result.draft_tokens > 0 and {p.spec.label for p in control.seen} == {s.label for s in IN_FLIGHT_SPECS}
    # the steps the control saw add up to the call's: every token but a row's first (prefill's) was committed by one
    steps = control.seen[-1].steps
    assert sum(s.committed for s in steps) == result.decode_tokens == sum(len(t) - 1 for t in plain_reference.values())
    assert sum(s.rows for s in steps) == result.target_steps and all(1 <= s.rows <= batch_size for s in steps)
    assert sorted(i for p in control.seen for i in p.done) == list(range(6))  # each finished row reported once


def test_progress_shows_the_rows_in_flight_with_their_output_so_far(word_models):
    """After the first step the control sees the batch's two rows (the shortest prompts) in flight,
    each with prefill's token and the step's, the other four queued, none finished."""
    control = Cycle([SpecConfig()])
    requests = word_requests(6)
    engine = word_engine(word_models)
    engine.generate(requests, SpecConfig(), 2, control=control)
    start = control.seen[0]
    shortest = sorted(range(6), key=lambda i: len(engine.encode(requests[i])))[:2]
    assert set(control.outputs[0]) == set(shortest) and start.queued == 4 and start.spec.label == "none"
    assert all(len(out) == 2 for out in control.outputs[0].values())  # prefill's token and the first step's
    assert control.finished[0] == 0


def test_rows_are_admitted_shortest_first_within_windows_of_the_input(word_models):
    """At batch 1 a window is 8 rows: of 10 rows listed longest first, the first 8 go shortest
    first, and the 2 after them (shorter than all 8) only then: a shard's later rows stay later
    (its workload's order), whatever their length."""
    requests = word_requests(10, max_tokens=lambda i: 3)[::-1]  # prompt lengths fall with the index
    control = Cycle([SpecConfig()])
    word_engine(word_models).generate(requests, SpecConfig(), 1, control=control)
    finished = [i for p in control.seen for i in p.done]  # at batch 1 in the order admitted
    assert finished == [7, 6, 5, 4, 3, 2, 1, 0, 9, 8]


@pytest.mark.parametrize("method", ["draft_target", "ngram"])
def test_sampled_output_follows_the_target_distribution_across_settings_changed_in_flight(method):
    """The chi-square test above, with the rows' setting changed after every step: plain
    decoding, then `method`, then plain again: the target's distribution holds across a switch."""
    V, n = 5, 8_000
    engine, target, prompt, requests = five_word_case(V, n)
    control = Cycle([SpecConfig(), SpecConfig(method, 1, draft_model="d")])  # plain, then one draft: 4 tokens span both
    result = engine.generate(requests, SpecConfig(), 4000, control=control)
    assert result.draft_tokens > 0.5 * n and len({p.spec.label for p in control.seen}) == 2
    assert joint_pvalue(result, target, prompt, V) > 1e-3


def test_the_ngram_index_proposes_what_the_lookup_finds_at_every_position():
    """NgramIndex (the drafter's and the counterfactual's) against ngram_lookup, the scan it
    replaces, at every prefix of random sequences over small vocabularies (many repeats), every
    n-gram size and draft length; and NgramDrafter follows rows that commit several tokens a step,
    leave and join, as the decode loop's rows do."""
    import numpy as np

    from batchspec.engine.torch.drafters import NgramDrafter, NgramIndex

    rng = np.random.default_rng(7)
    large = [0, 65_535, 65_536, 2**20 + 3, 2**31 - 1, 2**32 - 1]  # ids that fill an n-gram key's bits
    for seq in [rng.integers(0, vocab, 120).tolist() for vocab in (2, 3, 5, 50)] + [rng.choice(large, 120).tolist()]:
        vocab = max(seq) + 1
        for max_ngram in (1, 2, 3, 4):
            index = NgramIndex(max_ngram, seq[:1])
            for end in range(2, len(seq) + 1):
                index.extend(seq[end - 1 : end])
                for k in (0, 1, 3, 8):
                    assert index.propose(k) == ngram_lookup(np.asarray(seq[:end]), max_ngram, k), (vocab, max_ngram, end, k)

    # many tokens at once (a prompt) are indexed n by n: the same index as token by token,
    # whatever the runs the sequence comes in
    for seq in [rng.integers(0, vocab, 300).tolist() for vocab in (2, 7, 1000)] + [rng.choice(large, 300).tolist()]:
        for max_ngram in (1, 2, 3, 4):
            one_by_one = NgramIndex(max_ngram)
            for token in seq:
                one_by_one.extend([token])
            for cuts in ([300], [17, 283], [1, 15, 16, 40, 228], sorted(rng.choice(range(1, 300), 6, replace=False).tolist())):
                index, begin = NgramIndex(max_ngram), 0
                for end in [*cuts, 300]:
                    index.extend(np.asarray(seq[begin:end]))  # numpy ids too, as a tensor's .tolist() is not
                    begin = end
                assert index.tokens == one_by_one.tokens and index.latest == one_by_one.latest, (max_ngram, cuts)
                assert all(type(t) is int for t in index.tokens)
                assert [index.propose(k) for k in (1, 4)] == [ngram_lookup(np.asarray(seq), max_ngram, k) for k in (1, 4)]

    class Row:
        grammar = None  # an unconstrained row (structured output: tests/engine/torch/test_structured.py)

        def __init__(self, context):
            self.context = context

    drafter = NgramDrafter(2)
    rows = [Row(rng.integers(0, 4, 30).tolist()) for _ in range(3)]
    for step in range(12):
        budgets = [4, 2, 6][: len(rows)]
        got = drafter.propose(rows, budgets, 4).tokens
        assert got == [ngram_lookup(np.asarray(r.context), 2, k) for r, k in zip(rows, budgets)]
        for r in rows:
            r.context += rng.integers(0, 4, int(rng.integers(1, 4))).tolist()
        if step == 5:
            rows = [rows[2], Row(rng.integers(0, 4, 10).tolist()), rows[0]]  # one left, one joined, reordered
