"""Linear layers computed in the form measured faster (engine/torch/linear.py): both forms give
the same product, the choice follows the timings, and a model whose every product is transposed
decodes exactly as before, plain and speculative."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch.nn import functional as F

from batchspec.engine.base import SpecConfig
from batchspec.engine.torch.engine import TorchEngine
from batchspec.engine.torch.linear import ROWS, Forms, FormsCache, MeasuredLinear, measure_forms, measure_linears, transposed_form
from tests.engine.torch.test_engine import word_requests


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("lead", [(1,), (2,), (3,), (1, 1), (2, 5), (8, 9)])
def test_both_forms_compute_the_same_product(bias, lead):
    gen = torch.Generator().manual_seed(len(lead) + sum(lead))
    weight = torch.randn(48, 32, generator=gen)
    b = torch.randn(48, generator=gen) if bias else None
    x = torch.randn(*lead, 32, generator=gen)
    out = transposed_form(x, weight, b)
    assert out.shape == (*lead, 48)
    torch.testing.assert_close(out, F.linear(x, weight, b), rtol=1e-5, atol=1e-5)


def test_the_choice_follows_the_timings_and_falls_back_past_the_last_count():
    forms = Forms.from_timings({1: (1.0, 0.5), 2: (1.0, 0.95), 4: (2.0, 1.0), 8: (1.0, 1.2)})
    assert forms.transposed == {1, 4}  # 0.95 is no clear win (WIN = 0.9)
    chosen = {m: forms.use_transposed(m) for m in range(1, 11)}
    # a count between two measured ones transposes only where both did; past the last, F.linear
    assert chosen == {1: True, 2: False, 3: False, 4: True, 5: False, 6: False, 7: False, 8: False, 9: False, 10: False}
    both = Forms.from_timings({4: (2.0, 1.0), 8: (1.0, 0.5), 16: (1.0, 1.0)})
    assert [both.use_transposed(m) for m in (4, 5, 7, 8, 9, 15, 16)] == [True, True, True, True, False, False, False]
    assert Forms.from_timings({1: (1.0, 0.1)}).use_transposed(2) is False


def test_measuring_times_both_forms_at_every_row_count():
    forms = measure_forms([torch.randn(24, 16), torch.randn(24, 16)], [None, torch.randn(24)], tries=1, budget_s=0.0)
    assert sorted(forms.timings) == list(ROWS)
    assert all(a > 0 and b > 0 for a, b in forms.timings.values())
    assert forms.transposed == {m for m, (a, b) in forms.timings.items() if b < 0.9 * a}


def everywhere(weights, biases) -> Forms:
    """Forms that transpose every product, whatever the timings."""
    return Forms.from_timings({m: (1.0, 0.0) for m in ROWS})


def test_every_linear_is_replaced_and_keeps_its_parameters(word_models):
    target = copy.deepcopy(word_models[0])
    params = {name: p for name, p in target.named_parameters()}
    linears = [name for name, m in target.named_modules() if type(m) is torch.nn.Linear]
    forms = measure_linears(target, measure=everywhere)
    assert linears and not [name for name, m in target.named_modules() if type(m) is torch.nn.Linear]
    assert all(isinstance(target.get_submodule(name), MeasuredLinear) for name in linears)
    assert {name: p for name, p in target.named_parameters()} == params  # the same tensors, tied ones still tied
    assert target.get_output_embeddings().weight is target.get_input_embeddings().weight
    assert len(forms) == len({tuple(target.get_submodule(n).weight.shape) for n in linears})
    ids = torch.randint(1, 64, (3, 11))
    torch.testing.assert_close(target(ids).logits, word_models[0](ids).logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spec", [SpecConfig(), SpecConfig("ngram", 3), SpecConfig("draft_target", 4, draft_model="close")])
@pytest.mark.parametrize("batch_size", [1, 4])
def test_decoding_with_every_product_transposed_gives_the_same_tokens(word_models, spec, batch_size):
    target, drafts, tokenizer = word_models
    moved = copy.deepcopy(target)
    draft = copy.deepcopy(drafts["close"])
    measure_linears(moved, measure=everywhere)
    measure_linears(draft, measure=everywhere)
    before = TorchEngine(target, tokenizer, model_name="tiny", draft_loader=lambda name: (drafts[name], tokenizer))
    after = TorchEngine(moved, tokenizer, model_name="tiny", draft_loader=lambda name: (draft, tokenizer))
    a = before.generate(word_requests(6), spec, batch_size)
    b = after.generate(word_requests(6), spec, batch_size)
    assert [c.token_ids for c in b.completions] == [c.token_ids for c in a.completions]
    assert b.draft_tokens == a.draft_tokens and b.accepted_tokens == a.accepted_tokens


def counting(calls: list):
    """A measure that records its calls and returns timings where only one row transposes."""
    def measure(weights, biases) -> Forms:
        calls.append(len(weights))
        return Forms.from_timings({m: (1.0, 0.5 if m == 3 else 1.0) for m in ROWS})
    return measure


def test_the_timing_cache_serves_a_second_load_on_this_machine_and_no_other(word_models, tmp_path, monkeypatch):
    calls: list = []
    first = measure_linears(copy.deepcopy(word_models[0]), measure=counting(calls), cache=FormsCache(tmp_path))
    measured = len(calls)
    assert measured == len(first) and list(tmp_path.glob("*.json"))
    second = measure_linears(copy.deepcopy(word_models[0]), measure=counting(calls), cache=FormsCache(tmp_path))
    assert len(calls) == measured  # nothing measured again
    assert {k: (f.transposed, f.timings) for k, f in second.items()} == {k: (f.transposed, f.timings) for k, f in first.items()}
    assert all(f.transposed == {3} for f in second.values())
    # other threads are another machine as far as a timing goes: measured again
    monkeypatch.setattr(torch, "get_num_threads", lambda: 7)
    measure_linears(copy.deepcopy(word_models[0]), measure=counting(calls), cache=FormsCache(tmp_path))
    assert len(calls) == 2 * measured


def test_a_broken_or_unwritable_cache_only_costs_a_measurement(word_models, tmp_path):
    calls: list = []
    measure_linears(copy.deepcopy(word_models[0]), measure=counting(calls), cache=FormsCache(tmp_path))
    for path in tmp_path.glob("*.json"):
        path.write_text("{not json")
    forms = measure_linears(copy.deepcopy(word_models[0]), measure=counting(calls), cache=FormsCache(tmp_path))
    assert len(calls) == 2 * len(forms)
    assert json.loads(next(tmp_path.glob("*.json")).read_text())["timings"]  # rewritten whole
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    again = measure_linears(copy.deepcopy(word_models[0]), measure=counting(calls), cache=FormsCache(blocked / "cache"))
    assert all(f.transposed == {3} for f in again.values())
