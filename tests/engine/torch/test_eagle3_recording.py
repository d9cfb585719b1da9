"""A head trained for a shard key (engine.TorchEngine.recording / train_head): the rows' hidden
states are the ones the decoding forwards computed (no forward of their own), under any arm,
and the head trained on them is written in the released format and decodes losslessly."""

from __future__ import annotations

import torch

from batchspec.engine.base import NO_SPEC, SpecConfig
from batchspec.engine.eagle3_format import is_head
from batchspec.engine.torch.eagle3 import aux_layers
from batchspec.engine.torch.eagle3_states import record
from batchspec.engine.torch.engine import TorchEngine
from tests.engine.torch.eagle3_heads import word_requests


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
