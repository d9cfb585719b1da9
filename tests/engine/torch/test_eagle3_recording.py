"""A head trained for a shard key (engine.TorchEngine.recording / train_head): the rows' hidden
states are the ones the decoding forwards computed (no forward of their own), under any arm,
and the head trained on them is written in the released format and decodes losslessly."""

from __future__ import annotations

import pytest
import torch

from batchspec.engine.base import NO_SPEC, SpecConfig
from batchspec.engine.eagle3_format import is_head
from batchspec.engine.torch.eagle3 import aux_layers
from batchspec.engine.torch.eagle3_release import load_head
from batchspec.engine.torch.eagle3_states import Recorded, record
from batchspec.engine.torch.eagle3_train import TrainSettings, train_head
from batchspec.engine.torch.engine import TorchEngine
from tests.engine.torch.eagle3_heads import released, word_requests, write


def _forwards(model) -> list[int]:
    """Count the target's forwards (its decoder's): a recording must add none."""
    calls = [0]
    model.get_decoder().register_forward_pre_hook(lambda *a, **k: calls.__setitem__(0, calls[0] + 1))
    return calls


def test_recorded_states_are_the_decoding_forwards_own_and_add_no_forward(word_models):
    target, _, tokenizer = word_models
    engine = TorchEngine(target, tokenizer, model_name="tiny")
    requests = word_requests(6, seed=5)
    for spec in (NO_SPEC, SpecConfig("ngram", 3)):
        calls = _forwards(engine.model)
        before = calls[0]
        plain = engine.generate(requests, spec, 3)
        alone = calls[0] - before
        with engine.recording(10_000) as rows:
            again = engine.generate(requests, spec, 3)
        assert calls[0] - before - alone == alone, "recording ran forwards of its own"
        assert [c.token_ids for c in again.completions] == [c.token_ids for c in plain.completions]
        assert len(rows) == len(requests)
        pairs = [(r.tokens[: r.prompt_len].tolist(), r.tokens[r.prompt_len :].tolist()) for r in rows]
        reference = record(target, pairs, aux_layers(target.config.num_hidden_layers), keep_last=False)
        for got, want in zip(rows, reference):
            assert got.aux.shape == want.aux.shape == (len(got.tokens) - 1, 3 * target.config.hidden_size)
            torch.testing.assert_close(got.aux, want.aux, atol=1e-4, rtol=1e-4)
    engine.generate(requests, NO_SPEC, 3)  # outside the recording nothing is kept
    assert engine._recording is None


def test_a_recording_stops_admitting_rows_at_its_positions(word_models):
    target, _, tokenizer = word_models
    engine = TorchEngine(target, tokenizer, model_name="tiny")
    requests = word_requests(6, seed=5)
    need = max(len(engine.encode(r)) + r.params.max_tokens for r in requests)
    with engine.recording(need) as rows:
        engine.generate(requests, NO_SPEC, 1)
    assert 1 <= len(rows) < len(requests)


def test_a_head_trained_on_recorded_rows_is_released_and_lossless(tmp_path, word_models):
    target, _, tokenizer = word_models
    engine = TorchEngine(target, tokenizer, model_name="tiny")
    requests = word_requests(12, seed=3)
    with engine.recording(100_000) as rows:
        plain = engine.generate(requests, NO_SPEC, 4)
    doc = engine.train_head(rows, 1.0, [2, 4], str(tmp_path / "head"))
    assert is_head(tmp_path / "head")
    assert doc["rows"] + doc["held_rows"] == len(rows) and doc["held_rows"] >= 1 and doc["steps"] > 0
    assert set(doc["mean_accepted_len"]) == {"2", "4"} and all(v >= 1.0 for v in doc["mean_accepted_len"].values())
    fresh = TorchEngine(target, tokenizer, model_name="tiny")
    for batch in (1, 4):
        ran = fresh.generate(requests, SpecConfig("eagle3", 3, draft_model=str(tmp_path / "head")), batch)
        assert [c.token_ids for c in ran.completions] == [c.token_ids for c in plain.completions]
        assert ran.draft_tokens > 0


def test_a_head_trained_from_a_published_one_starts_from_its_weights_and_keeps_its_vocabulary(tmp_path, word_models):
    """`train_head` on a job that runs a published head trains from it (SpecForge's fine-tune from
    a checkpoint), not from nothing: the head written has the published head's draft vocabulary
    (d2t, t2d), not the rows' own; zero steps give back the published weights exactly; some steps
    move them; and the trained head decodes equal to plain decoding."""
    target, _, tokenizer = word_models
    engine = TorchEngine(target, tokenizer, model_name="tiny")
    config, weights = released(target, draft_vocab=40)
    published = write(tmp_path / "published", config, weights)
    requests = word_requests(12, seed=3)
    with engine.recording(100_000) as rows:
        plain = engine.generate(requests, NO_SPEC, 4)
    recorded = [Recorded(r.tokens.clone(), r.prompt_len, r.aux.clone(), None) for r in rows]
    start = load_head(published, target, dtype=torch.float32)
    same, _ = train_head(target, recorded, TrainSettings(max_steps=0, soft=False), start=load_head(published, target, dtype=torch.float32))
    moved, stats = train_head(target, recorded, TrainSettings(max_steps=5, soft=False), start=load_head(published, target, dtype=torch.float32))
    for name, value in start.state_dict().items():
        if name.startswith("embed"):
            continue
        torch.testing.assert_close(same.state_dict()[name], value, rtol=0, atol=0)
        if name in ("d2t", "t2d"):
            assert torch.equal(moved.state_dict()[name], value), name  # the published vocabulary, kept
    assert not torch.equal(moved.fc.weight, start.fc.weight) and stats.steps == 5
    assert stats.draft_vocab_size == 40 and 0.0 <= stats.coverage <= 1.0
    doc = engine.train_head(rows, 1.0, [2], str(tmp_path / "head"), start=str(published))
    assert doc["draft_vocab_size"] == 40
    assert torch.equal(load_head(tmp_path / "head", target).d2t, start.d2t)
    ran = TorchEngine(target, tokenizer, model_name="tiny").generate(
        requests, SpecConfig("eagle3", 3, draft_model=str(tmp_path / "head")), 4)
    assert [c.token_ids for c in ran.completions] == [c.token_ids for c in plain.completions]


def test_a_published_head_whose_vocabulary_holds_none_of_the_rows_tokens_is_refused_in_one_line(tmp_path, word_models):
    """Training from a published head whose draft vocabulary holds none of the key's output tokens
    has nothing to learn from: one line saying so (the worker keeps the shard's rows and notes
    it: test_train_head), not a backward pass over an empty loss."""
    target, _, tokenizer = word_models
    engine = TorchEngine(target, tokenizer, model_name="tiny")
    with engine.recording(100_000) as rows:
        engine.generate(word_requests(4, seed=3), NO_SPEC, 4)
    seen = set(torch.cat([r.tokens[r.prompt_len :] for r in rows]).tolist())
    absent = torch.tensor(sorted(set(range(target.config.vocab_size)) - seen))
    assert len(absent) >= 2, "the word target's 4 rows use most of its vocabulary: pick fewer rows"
    config, weights = released(target, draft_vocab=len(absent))
    weights["d2t"] = absent - torch.arange(len(absent))
    weights["t2d"] = torch.zeros(target.config.vocab_size, dtype=torch.bool).index_fill(0, absent, True)
    published = write(tmp_path / "published", config, weights)
    with pytest.raises(ValueError, match="holds none of the rows' output tokens"):
        engine.train_head(rows, 1.0, [2], str(tmp_path / "head"), start=str(published))
