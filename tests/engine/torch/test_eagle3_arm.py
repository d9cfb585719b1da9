"""The EAGLE-3 arm in the torch engine's decode loop (engine/torch/eagle3_drafter.py): a head in the
released format drafts from the hidden states of the target's own prefill and verify forwards.

Lossless as every arm: greedy output equals plain greedy output token for token (float32), with a
random head and with a head trained on the target's rows (which gets drafts accepted), at batch 1
and 4, across arm switches in flight, and under a grammar (response_format); sampled output follows
the target's distribution (a chi-square test against the exact joint, the broken accept rule its
negative control), the head's reduced vocabulary included. While a row decodes under the arm the
target runs one forward per step: no second pass for the hidden states."""

from __future__ import annotations

import copy

import pytest
import torch

from batchspec.engine.acceptance import PlainRow
from batchspec.engine.base import NO_SPEC, Request, SamplingParams, SpecConfig
from batchspec.engine.torch import decode as torch_decode
from batchspec.engine.torch.counterfactual import chain_acceptance, head_acceptance
from batchspec.engine.torch.eagle3_chains import chains
from batchspec.engine.torch.eagle3_release import save_head
from batchspec.engine.torch.eagle3_states import record
from batchspec.engine.torch.eagle3_drafter import Eagle3Drafter
from batchspec.engine.torch.engine import TorchEngine
from batchspec.engine.torch.linear import measure_linears
from batchspec.errors import ConfigError
from batchspec.predict.costs import CostTable
from tests.conftest import tiny_llama, word_tokenizer
from tests.engine.torch.eagle3_heads import released, write
from tests.engine.torch.eagle3_heads import word_requests as head_word_requests
from tests.engine.torch.test_engine import Cycle, joint_pvalue, word_requests, wrong_rule
from tests.engine.torch.test_linear import widened
from tests.engine.torch.test_structured import constrained_requests


@pytest.fixture(scope="module")
def heads(tmp_path_factory, word_models, trained):
    """Folders of two heads for the word target in the released format: "random" (written as
    SpecForge exports one, 40 of 64 tokens in its draft vocabulary) and "trained" (save_head)."""
    target = word_models[0]
    folder = tmp_path_factory.mktemp("heads")
    config, weights = released(target, draft_vocab=40)
    return {"random": str(write(folder / "random", config, weights)),
            "trained": str(save_head(trained[3], folder / "trained"))}


@pytest.fixture(scope="module")
def engine(word_models):
    target, _, tokenizer = word_models
    return TorchEngine(target, tokenizer, model_name="tiny")


@pytest.fixture(scope="module")
def plain(engine):
    return {c.id: c.token_ids for c in engine.generate(word_requests(6), NO_SPEC, 3).completions}


@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("head", ["random", "trained"])
def test_greedy_eagle3_equals_plain_greedy(engine, plain, heads, head, k, batch_size):
    result = engine.generate(word_requests(6), SpecConfig("eagle3", k, draft_model=heads[head]), batch_size)
    assert {c.id: c.token_ids for c in result.completions} == plain
    assert result.draft_tokens > 0
    if head == "trained":  # drafts were kept: the hidden states of accepted slots extended the head's context
        assert result.accepted_tokens > 0


@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("batch_size", [1, 4])
def test_each_steps_acceptance_is_the_counterfactuals_of_the_head_over_recorded_rows(word_models, trained, heads, k, batch_size):
    """The head drafts in the loop exactly the chains it drafts over the rows' recorded hidden
    states (eagle3.chains, one teacher-forced forward): each row's drafts accepted per step equal
    the counterfactual's, step by step (greedy: exact). Wrong hidden states, a slot of them
    skipped or the head's context not extended by accepted drafts, would move its drafts."""
    engine, plain, rows, head, _ = trained
    predicted = chain_acceptance(plain, [k], chains(head, rows, k))[k]
    result = engine.generate(head_word_requests(12, seed=3), SpecConfig("eagle3", k, draft_model=heads["trained"]), batch_size)
    assert [c.token_ids for c in result.completions] == [list(p.output_ids) for p in plain]
    assert [c.accepted_steps for c in result.completions] == predicted.steps
    assert result.accepted_tokens > 0 and (k == 1 or any(n > 1 for c in result.completions for n in c.accepted_steps))


def test_the_target_runs_one_forward_per_step_and_no_row_is_read_again(engine, heads, monkeypatch):
    """Under the arm from the start every target forward is a prefill or a verify (one a step):
    the head reads the hidden states those forwards left, never a forward of its own."""
    forwards, reads = [], []
    decoder = engine.model.get_decoder()
    forward = decoder.forward
    monkeypatch.setattr(decoder, "forward", lambda *a, **kw: forwards.append(1) or forward(*a, **kw))
    monkeypatch.setattr(Eagle3Drafter, "read", lambda self, tokens: reads.append(tokens))
    result = engine.generate(word_requests(4), SpecConfig("eagle3", 3, draft_model=heads["trained"]), 2)
    prefills = len(forwards) - len(result.steps)
    assert result.accepted_tokens > 0 and len(result.steps) > 0
    assert reads == [] and 1 <= prefills <= 4  # rows of equal prompt length prefill together


@pytest.mark.parametrize("batch_size", [1, 3])
def test_greedy_output_is_plain_greedy_across_switches_into_and_out_of_the_arm(engine, plain, heads, batch_size):
    """The arm after plain steps and an n-gram step: a row it meets in flight is read once from its
    context; not one greedy token changes."""
    specs = [SpecConfig(), SpecConfig("eagle3", 3, draft_model=heads["trained"]), SpecConfig("ngram", 2),
             SpecConfig("eagle3", 2, draft_model=heads["trained"]), SpecConfig("eagle3", 4, draft_model=heads["random"])]
    control = Cycle(specs)
    result = engine.generate(word_requests(6), SpecConfig(), batch_size, control=control)
    assert {c.id: c.token_ids for c in result.completions} == plain
    assert result.accepted_tokens > 0 and {p.spec.label for p in control.seen} >= {"eagle3:k=3", "eagle3:k=2"}


def test_eagle3_without_a_head_is_refused_in_one_line(engine):
    with pytest.raises(ConfigError, match="Eagle3 needs a head") as err:
        engine.check(SpecConfig("eagle3", 2))
    assert "\n" not in str(err.value)


# -- under a grammar --------------------------------------------------------------------------------


def test_constrained_greedy_eagle3_equals_constrained_greedy_plain(tiny_pair, tmp_path):
    """On the SmolLM2-tokenizer target, a random head with a 2,048-token draft vocabulary: drafts
    follow the grammar's forced tokens under its mask, and output is constrained plain output."""
    target, _, tokenizer = tiny_pair
    engine = TorchEngine(target, tokenizer, model_name="tiny")
    config, weights = released(target, draft_vocab=2048)
    spec = SpecConfig("eagle3", 4, draft_model=str(write(tmp_path / "head", config, weights)))
    plain = engine.generate(constrained_requests(), NO_SPEC, 3)
    for batch_size in (1, 3):
        ran = engine.generate(constrained_requests(), spec, batch_size)
        for c, p in zip(ran.completions, plain.completions):
            assert (c.id, c.token_ids, c.finish_reason) == (p.id, p.token_ids, p.finish_reason)
            assert c.forced_tokens <= c.accepted_tokens <= c.draft_tokens
        assert sum(c.forced_tokens for c in ran.completions) > 0


# -- sampled output follows the target's distribution ----------------------------------------------


def five_word_eagle3_case(tmp_path, n: int):
    """A 4-layer target over 5 words (EAGLE-3 reads layers 2, 2 and 1), a random head whose draft
    vocabulary is 4 of them, and n sampled requests (T = 0.9, seeds 0..n-1) of 4 tokens each."""
    V = 5
    tokenizer = word_tokenizer(V)
    target = tiny_llama(V, 4, seed=10, eos_token_id=None, pad_token_id=0, initializer_range=0.5)
    engine = TorchEngine(target, tokenizer, model_name="t")
    engine.eos_ids = set()  # every sequence runs four tokens, so every outcome is a full 4-tuple
    config, weights = released(target, draft_vocab=4)
    weights = {k: v * 0.3 if v.is_floating_point() else v for k, v in weights.items()}  # a softer head: q spread
    folder = write(tmp_path / "head", config, weights)
    prompt = [1, 2, 3, 1, 2, 4, 1, 2]
    requests = [Request(f"s{i}", prompt_token_ids=tuple(prompt),
                        params=SamplingParams(max_tokens=4, temperature=0.9, seed=i)) for i in range(n)]
    return engine, target, prompt, requests, str(folder)


@pytest.mark.parametrize("rule_is_right", [True, False])
def test_sampled_eagle3_follows_the_target_distribution(tmp_path, monkeypatch, rule_is_right):
    """As the other arms' test (test_engine.py): at 2,000 rows the wrong rule scores p ~ 1e-44."""
    V, n = 5, 2000
    engine, target, prompt, requests, head = five_word_eagle3_case(tmp_path, n)
    if not rule_is_right:
        monkeypatch.setattr(torch_decode, "accept_reject", wrong_rule)
    result = engine.generate(requests, SpecConfig("eagle3", 2, draft_model=head), 1000)
    assert result.draft_tokens > 1.5 * n and result.accepted_tokens > 0.2 * result.draft_tokens
    pvalue = joint_pvalue(result, target, prompt, V)
    if rule_is_right:
        assert pvalue > 1e-3
    else:
        assert pvalue < 1e-6


def test_each_sampled_row_draws_from_its_own_generator_under_the_arm(engine, heads):
    """A sampled row's drafts and output don't depend on which rows share its batch."""
    reqs = word_requests(5, temperature=0.8, top_p=0.9, seed=7)
    spec = SpecConfig("eagle3", 3, draft_model=heads["trained"])
    a, b = engine.generate(reqs, spec, 5), engine.generate(reqs, spec, 2)
    assert [c.token_ids for c in a.completions] == [c.token_ids for c in b.completions]
    assert a.draft_tokens > 0


# -- calibration's counterfactual of the arm ----------------------------------------------------------


@pytest.mark.parametrize("batch_size", [1, 4])
def test_the_engines_counterfactual_of_the_arm_is_what_the_arm_then_accepts(trained, heads, batch_size):
    """`TorchEngine.acceptance` prices an eagle3 arm from plain rows (the head over their recorded
    hidden states): exact, and step by step what generate then accepts under the arm."""
    engine, plain, _, _, _ = trained
    arms = [SpecConfig("eagle3", k, draft_model=heads["trained"]) for k in (2, 5)]
    predicted, exact = engine.acceptance(plain, arms)
    assert exact and set(predicted) == {"eagle3:k=2", "eagle3:k=5"}
    for arm in arms:
        ran = engine.generate(head_word_requests(12, seed=3), arm, batch_size)
        assert [c.accepted_steps for c in ran.completions] == predicted[arm.label].steps
        assert predicted[arm.label].accepted_tokens == ran.accepted_tokens > 0


def test_on_greedy_rows_the_counterfactual_reads_the_heads_chains_from_the_engine(trained, heads, monkeypatch):
    """On greedy unconstrained rows the arm's counterfactual is its chains' (exact), asked of the
    engine (`TorchEngine.head_chains`: the seam an engine replaying recordings answers from its
    recording, as `draft_proposals` for a draft model): the head's chains over the rows' hidden
    states from one teacher-forced forward, once at the longest draft, giving head_acceptance's steps."""
    engine, plain, _, _, _ = trained
    folder = heads["trained"]
    pairs = [(p.prompt_ids, p.output_ids) for p in plain]
    head = engine.head(folder)
    rows = record(engine.model, pairs, head.layers, keep_last=False)
    got = engine.head_chains(pairs, folder, 5)
    assert got == chains(head, rows, 5)
    asked = []
    monkeypatch.setattr(engine, "head_chains", lambda sequences, f, k: asked.append((len(sequences), f, k)) or got)
    predicted, exact = engine.acceptance(plain, [SpecConfig("eagle3", k, draft_model=folder) for k in (2, 5)])
    direct = head_acceptance(plain, [2, 5], head, rows)
    assert exact and asked == [(len(plain), folder, 5)]
    assert [predicted[f"eagle3:k={k}"].steps for k in (2, 5)] == [direct[k].steps for k in (2, 5)]
    assert predicted["eagle3:k=5"].accepted_tokens > 0


def test_a_heads_chains_follow_decoding_on_a_bfloat16_target_whose_products_are_widened(word_models, tmp_path):
    """A bfloat16 target on a CPU computes its products in float32 into kept buffers (linear.py),
    made by the decode loop's forwards under inference mode: the chains' teacher-forced forward,
    after decoding, runs under it too (it failed writing an inference tensor outside it)."""
    target = copy.deepcopy(word_models[0]).to(torch.bfloat16)
    measure_linears(target, measure=widened)
    engine = TorchEngine(target, word_models[2], model_name="tiny")
    config, weights = released(target, draft_vocab=40)
    folder = str(write(tmp_path / "head", config, weights))
    done = engine.generate(word_requests(2), NO_SPEC, 2).completions
    pairs = [(engine.encode(r), c.token_ids) for r, c in zip(word_requests(2), done)]
    got = engine.head_chains(pairs, folder, 3)
    assert [len(c) for c in got] == [len(o) for _, o in pairs] and {len(d) for c in got for d in c[1:]} == {3}


def test_the_counterfactual_of_sampled_rows_estimates_what_the_arm_accepts(tmp_path):
    """On the five-word case: the estimate from 300 plain sampled rows within 10% of the
    acceptance 3,000 rows measure under the arm (and marked an estimate)."""
    engine, _, prompt, requests, head = five_word_eagle3_case(tmp_path, 3000)
    arm = SpecConfig("eagle3", 2, draft_model=head)
    plain = engine.generate(requests[:300], NO_SPEC, 300).completions
    rows = [PlainRow(prompt, c.token_ids, 4, temperature=0.9) for c in plain]
    predicted, exact = engine.acceptance(rows, [arm])
    ran = engine.generate(requests, arm, 1000)
    estimate = predicted[arm.label].accepted_tokens / predicted[arm.label].target_steps
    measured = ran.accepted_tokens / ran.target_steps
    assert not exact and measured > 0.2
    assert estimate == pytest.approx(measured, rel=0.1)


def test_a_profile_times_the_heads_draft_step_and_the_cost_table_prices_the_arm_with_it(engine, heads):
    """The arm is priced as the draft-model arm: its verify forward and k draft steps of the head,
    timed by the profile (b rows' chains, one depth each) beside the target's forwards."""
    head = heads["trained"]
    profile = engine.profile([(2, 16, 1), (2, 16, 4)], [(head, 2, 16, 1)], tries=1)
    [draft] = [p for p in profile.points if p.kind == "draft"]
    assert (draft.model, draft.batch, draft.context, draft.tokens) == (head, 2, 16, 1) and draft.seconds > 0
    table = CostTable()
    table.seed(profile.points, 2)
    assert table.base_s("eagle3", 2, 4, 16, head) == pytest.approx(table.base_s("none", 2, 4, 16) + 3 * draft.seconds)


def test_an_engine_loaded_with_a_head_as_its_draft_model_runs_the_arm(tiny_pair, tiny_model_dir, tmp_path):
    """`--draft-model` naming a head folder reaches the engine as its draft: it is loaded as a head
    (not as a causal LM), and the arm runs with it."""
    config, weights = released(tiny_pair[0], draft_vocab=2048)
    folder = str(write(tmp_path / "head", config, weights))
    engine = TorchEngine.load(str(tiny_model_dir), draft_model=folder)
    assert folder in engine._heads
    [c] = engine.generate([Request("a", "Hello", params=SamplingParams(max_tokens=6))], SpecConfig("eagle3", 2, draft_model=folder), 1).completions
    assert c.finish_reason in ("stop", "length") and c.draft_tokens > 0
