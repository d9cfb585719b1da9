"""The simulator's engine: replayed recordings run the torch engine's own schedule, step for step,
and a cost regime prices them deterministically."""

from __future__ import annotations

import pickle
from dataclasses import replace

import pytest

from batchspec.engine.acceptance import PlainRow
from batchspec.engine.base import NO_SPEC, Request, SamplingParams, SpecConfig
from batchspec.engine.torch.counterfactual import head_acceptance
from batchspec.engine.torch.eagle3_release import save_head
from batchspec.engine.torch.eagle3_states import record as record_states
from batchspec.errors import ConfigError
from batchspec.sim.regimes import REGIMES, regime
from batchspec.sim.replay import Recorded, ReplayEngine, record
from tests.engine.torch.eagle3_heads import trained_word_head

HEAD_K = 4  # how deep the head's chains are recorded


def _requests(n: int = 10, max_tokens: int = 24) -> list[Request]:
    prompts = [" ".join(f"w{(i * 7 + j * (i % 3 + 1)) % 40 + 1}" for j in range(5 + i % 6)) for i in range(n)]
    return [Request(f"r{i}", prompt=p, params=SamplingParams(max_tokens=max_tokens - (i % 4) * 3)) for i, p in enumerate(prompts)]


@pytest.fixture(scope="module")
def head(word_models, tmp_path_factory) -> str:
    """The folder of an EAGLE-3 head trained on the word target's rows (so its drafts pass)."""
    return str(save_head(trained_word_head(word_models)[3], tmp_path_factory.mktemp("head") / "head"))


@pytest.fixture(scope="module")
def recorded(tiny_engine, head):
    requests = _requests()
    recording, done = record(tiny_engine, requests, batch_size=4, draft_models=["close"], heads=[head], head_k=HEAD_K)
    return requests, recording, done


HEAD = "<head>"  # an arm's draft model: the `head` fixture's folder
ARMS = [NO_SPEC, SpecConfig("ngram", 2), SpecConfig("ngram", 5), SpecConfig("draft_target", 3, draft_model="close"),
        SpecConfig("eagle3", 2, draft_model=HEAD), SpecConfig("eagle3", HEAD_K, draft_model=HEAD)]


@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("arm", ARMS, ids=lambda a: a.label)
def test_a_replay_takes_the_engines_steps_and_commits_its_tokens(tiny_engine, recorded, head, arm, batch_size):
    requests, recording, _ = recorded
    arm = replace(arm, draft_model=head) if arm.draft_model == HEAD else arm
    real = tiny_engine.generate(requests, arm, batch_size)
    replay = ReplayEngine(tiny_engine, recording, regime("gpu-roofline")).generate(requests, arm, batch_size)
    assert [c.token_ids for c in replay.completions] == [c.token_ids for c in real.completions]
    assert [c.accepted_steps for c in replay.completions] == [c.accepted_steps for c in real.completions]
    assert [(s.rows, s.tokens, s.committed) for s in replay.steps] == [(s.rows, s.tokens, s.committed) for s in real.steps]
    if arm.method != "none":
        assert replay.accepted_tokens > 0  # the arm drafted something that passed: the comparison says something


def test_a_switch_in_flight_replays_as_the_engine_runs_it(tiny_engine, recorded):
    requests, recording, _ = recorded

    class Switch:
        def __init__(self):
            self.calls = 0

        def __call__(self, progress):
            self.calls += 1
            return SpecConfig("ngram", 4) if self.calls == 5 else (NO_SPEC if self.calls == 20 else None)

    real = tiny_engine.generate(requests, NO_SPEC, 4, control=Switch())
    replay = ReplayEngine(tiny_engine, recording, regime("cpu")).generate(requests, NO_SPEC, 4, control=Switch())
    assert [(s.rows, s.tokens, s.committed, s.method) for s in replay.steps] == \
           [(s.rows, s.tokens, s.committed, s.method) for s in real.steps]
    assert {s.method for s in replay.steps} == {"none", "ngram"}


def test_every_second_of_a_replay_is_the_regimes_and_the_same_on_every_run(tiny_engine, recorded):
    requests, recording, _ = recorded
    gpu = regime("gpu-roofline")
    engine = ReplayEngine(tiny_engine, recording, gpu)
    one, two = (engine.generate(requests, SpecConfig("ngram", 3), 4) for _ in range(2))
    assert one.timing == two.timing and one.steps == two.steps
    for step in one.steps:
        assert step.seconds == pytest.approx(gpu.step(step.rows, step.tokens, step.context, "ngram").total)
    assert one.timing.decode_s == pytest.approx(sum(s.seconds for s in one.steps))
    prompts = [len(recording[r.id].prompt_ids) for r in requests]
    assert one.timing.prefill_s == pytest.approx(sum(gpu.prefill_s(n) for n in prompts))


def test_a_draft_models_recorded_proposals_are_its_teacher_forced_argmax(tiny_engine, recorded):
    requests, recording, _ = recorded
    rec = recording["r3"]
    (real,) = tiny_engine.draft_proposals([(rec.prompt_ids, rec.output_ids)], "close")
    assert tuple(real) == rec.proposals["close"]
    replay = ReplayEngine(tiny_engine, recording, regime("cpu"))
    assert replay.draft_proposals([(rec.prompt_ids, rec.output_ids[:5])], "close") == [list(rec.proposals["close"][:5])]


def test_a_heads_recorded_chains_are_its_chains_over_the_rows_hidden_states(tiny_engine, recorded, head):
    requests, recording, _ = recorded
    rec = recording["r3"]
    (real,) = tiny_engine.head_chains([(rec.prompt_ids, rec.output_ids)], head, HEAD_K)
    assert rec.chains[head] == tuple(tuple(chain) for chain in real)
    assert rec.chains[head][0] == () and {len(c) for c in rec.chains[head][1:]} == {HEAD_K}
    assert len(rec.chains[head]) == len(rec.output_ids)


def test_the_counterfactual_of_an_eagle3_arm_on_the_replay_is_the_recordings(tiny_engine, recorded, head, monkeypatch):
    """Calibration prices an eagle3 arm on the replay from the recorded chains (ReplayEngine.head_chains),
    neither the head nor the target run: exactly what head_acceptance gives over the same rows'
    hidden states, at every recorded draft length."""
    requests, recording, _ = recorded
    rows = [PlainRow(recording[r.id].prompt_ids, recording[r.id].output_ids, r.params.max_tokens) for r in requests]
    model = tiny_engine.head(head)
    states = record_states(tiny_engine.model, [(r.prompt_ids, r.output_ids) for r in rows], model.layers, keep_last=False)
    direct = head_acceptance(rows, [1, 2, HEAD_K], model, states)
    replay = ReplayEngine(tiny_engine, recording, regime("cpu"))
    monkeypatch.setattr(replay, "head", lambda folder: pytest.fail("the replay loaded the head"))
    monkeypatch.setattr(replay, "head_states", lambda *a, **kw: pytest.fail("the replay ran the target"))
    predicted, exact = replay.acceptance(rows, [SpecConfig("eagle3", k, draft_model=head) for k in (1, 2, HEAD_K)])
    assert exact and predicted[f"eagle3:k={HEAD_K}"].accepted_tokens > 0
    for k in (1, 2, HEAD_K):
        assert predicted[f"eagle3:k={k}"].steps == direct[k].steps


def test_a_row_pickled_before_heads_were_recorded_loads_with_no_chains():
    """Recordings cached by bench/sim.py before heads were recorded still load (their rows have none)."""
    old = Recorded.__new__(Recorded)
    old.__dict__.update(prompt_ids=(1, 2), output_ids=(3,), proposals={})
    loaded = pickle.loads(pickle.dumps(old))
    assert loaded.chains == {} and loaded == Recorded((1, 2), (3,))


def test_the_replay_refuses_what_it_cannot_replay(tiny_engine, recorded, head):
    requests, recording, _ = recorded
    engine = ReplayEngine(tiny_engine, recording, regime("cpu"))
    with pytest.raises(ConfigError, match="greedy"):
        engine.generate([Request("r0", prompt="w1 w2", params=SamplingParams(temperature=0.7))], NO_SPEC, 2)
    with pytest.raises(ConfigError, match="not recorded"):
        engine.generate([Request("new", prompt="w1 w2")], NO_SPEC, 2)
    with pytest.raises(ConfigError, match="far"):
        engine.generate(requests, SpecConfig("draft_target", 2, draft_model="far"), 2)
    with pytest.raises(ConfigError, match="EAGLE-3 head '/elsewhere' was not recorded"):
        engine.generate(requests, SpecConfig("eagle3", 2, draft_model="/elsewhere"), 2)
    with pytest.raises(ConfigError, match=f"recorded {HEAD_K} drafts deep"):
        engine.generate(requests, SpecConfig("eagle3", HEAD_K + 1, draft_model=head), 2)
    with pytest.raises(ConfigError, match="unknown cost regime"):
        regime("tpu")


def test_regimes_price_a_verify_as_their_machines_do():
    """The shapes each regime stands for (docs/simulator.md): a CPU pays for every token it
    computes, a launch-bound GPU engine hardly notices the width, and an 8B target on an H100 is
    memory-bound, a verify of 9 tokens within 1.0-1.3 plain steps up to batch 32."""
    cpu, h200, roof = REGIMES["cpu"], REGIMES["h200-torch"], REGIMES["gpu-roofline"]
    assert cpu.forward_s(8, 9, 200) > 3 * cpu.forward_s(8, 1, 200)
    assert h200.forward_s(8, 9, 200) < 1.1 * h200.forward_s(8, 1, 200)
    for rows in (1, 8, 32):
        assert 1.0 <= roof.forward_s(rows, 9, 1000) / roof.forward_s(rows, 1, 1000) <= 1.3
    assert roof.forward_s(64, 9, 1000) / roof.forward_s(64, 1, 1000) > 1.5  # compute-bound beyond
    assert REGIMES["trtllm"].switch_s("ngram") >= 60 and roof.switch_s("ngram") == 0


def test_an_eagle3_step_drafts_with_k_forwards_of_the_head_and_its_profile_points_are_the_heads():
    """A head is one decoder layer, its fc and a reduced-vocabulary LM head: each of a step's k
    drafts one forward of it, `head_fraction` of the target's (0.05 of an 8B target's on the GPU
    regimes, 0.04 of SmolLM2-135M's 30 layers on `cpu`), and its profile point priced so."""
    assert {name: r.head_fraction for name, r in REGIMES.items()} == \
           {"cpu": 0.04, "h200-torch": 0.05, "gpu-roofline": 0.05, "trtllm": 0.05}
    for r in REGIMES.values():
        step, plain = r.step(8, 5, 300, "eagle3"), r.step(8, 5, 300, "none")
        assert step.verify_s == plain.verify_s and step.other_s == plain.other_s
        assert step.draft_s == pytest.approx(4 * r.head_fraction * r.forward_s(8, 1, 300))
        assert r.step(8, 1, 300, "eagle3").draft_s == 0  # a step where no row drafted runs no head
        head, draft = r.profile("m", [], [("h", 8, 300, 1), ("d", 8, 300, 1)], heads={"h"})
        assert head.seconds == pytest.approx(r.head_fraction * r.forward_s(8, 1, 300))
        assert draft.seconds == pytest.approx(r.draft_fraction * r.forward_s(8, 1, 300))


def test_a_replayed_eagle3_arm_is_priced_as_the_heads_forwards(tiny_engine, recorded, head):
    """Every step of the arm at the regime's price of its verify and k head forwards; the replay's
    profile prices a recorded head's point as a head's, not a draft model's."""
    requests, recording, _ = recorded
    gpu = regime("gpu-roofline")
    engine = ReplayEngine(tiny_engine, recording, gpu)
    ran = engine.generate(requests, SpecConfig("eagle3", 3, draft_model=head), 4)
    for step in ran.steps:
        assert step.seconds == pytest.approx(gpu.step(step.rows, step.tokens, step.context, "eagle3").total)
    assert ran.timing.draft_s > 0
    (point,) = [p for p in engine.profile([(4, 16, 1)], [(head, 4, 16, 1)]).points if p.kind == "draft"]
    assert point.seconds == pytest.approx(gpu.head_fraction * gpu.forward_s(4, 1, 16))


def test_drafts_that_match_through_a_rows_end_end_it_there(tiny_engine):
    """A recording whose last token (eos) n-gram lookup proposes with the tokens before it: the
    replay commits through the eos and stops, as the engine does (drafts past a row's end are not
    output), under every draft length."""
    prompt, output = (5, 6, 7, 0, 9, 5, 6), (7, 0)
    requests = [Request("x", prompt_token_ids=prompt, params=SamplingParams(max_tokens=16))]
    engine = ReplayEngine(tiny_engine, {"x": Recorded(prompt, output)}, regime("cpu"))
    for arm in [NO_SPEC, SpecConfig("ngram", 2), SpecConfig("ngram", 4)]:
        (done,) = engine.generate(requests, arm, 1).completions
        assert done.token_ids == list(output) and done.finish_reason == "stop"


def test_under_trtllm_every_speculative_step_verifies_the_arms_full_draft_and_nothing_else_differs(tiny_engine, recorded):
    """TensorRT-LLM pads every row's drafts to the arm's length for its CUDA graphs, so under the
    `trtllm` regime a step is as wide as its arm's draft even where no row proposed (narrow steps
    exist in the torch engine's own loop, and under `gpu-roofline`); the profile is empty, as the
    adapter's; tokens and accepted drafts are the engine's either way."""
    requests, recording, _ = recorded
    arm = SpecConfig("ngram", 5)
    loose = ReplayEngine(tiny_engine, recording, regime("gpu-roofline")).generate(requests, arm, 4)
    trt_engine = ReplayEngine(tiny_engine, recording, regime("trtllm"))
    padded = trt_engine.generate(requests, arm, 4)
    assert any(s.tokens < 6 for s in loose.steps)  # some steps proposed less than 5 drafts a row
    assert {s.tokens for s in padded.steps} == {6}
    assert [c.token_ids for c in padded.completions] == [c.token_ids for c in loose.completions]
    assert [(s.rows, s.committed) for s in padded.steps] == [(s.rows, s.committed) for s in loose.steps]
    assert {s.tokens for s in trt_engine.generate(requests, NO_SPEC, 4).steps} == {1}
    assert trt_engine.profile([(4, 16, 1), (4, 16, 6)]).points == []
    assert len(ReplayEngine(tiny_engine, recording, regime("gpu-roofline")).profile([(4, 16, 1), (4, 16, 6)]).points) == 2
