"""Linear layers computed in the form measured faster (engine/torch/linear.py): the forms give
the same product, the choice follows the timings, a model whose every product is transposed
decodes exactly as before, plain and speculative, and a bfloat16 model widened to float32 computes
what bfloat16's own products do, up to the rounding of the last bit."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch.nn import functional as F

from batchspec.engine.base import SpecConfig
from batchspec.engine.torch.engine import TorchEngine
from batchspec.engine.torch.linear import (
    ROWS,
    Forms,
    FormsCache,
    MeasuredLinear,
    Widened,
    float32_form,
    measure_forms,
    measure_linears,
    transposed_form,
)
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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("lead", [(1,), (3,), (2, 5), (8, 40)])
def test_the_float32_form_is_the_narrow_product_rounded_once(dtype, lead):
    gen = torch.Generator().manual_seed(sum(lead))
    weight = (torch.randn(48, 32, generator=gen) / 4).to(dtype)
    bias = torch.randn(48, generator=gen).to(dtype)
    x = torch.randn(*lead, 32, generator=gen).to(dtype)
    out = float32_form(x, weight, bias)
    assert out.dtype == dtype and out.shape == (*lead, 48)
    exact = F.linear(x.double(), weight.double(), bias.double())
    # one rounding of a float32 sum: within one step of the narrow type of the exact product
    step = torch.finfo(dtype).eps * exact.abs().clamp_min(torch.finfo(dtype).tiny)
    assert ((out.double() - exact).abs() <= step + 1e-6).all()
    if dtype == torch.bfloat16:  # torch's own bfloat16 product sums in float32 too: the same or a step apart
        torch.testing.assert_close(out, F.linear(x, weight, bias), rtol=torch.finfo(dtype).eps, atol=1e-6)


def test_a_widened_buffer_made_under_inference_mode_serves_a_forward_outside_it():
    """The decode loop's forwards run under inference mode and make the float32 buffers; a later
    forward under no_grad only (a counterfactual's recording of hidden states) widens into the same
    buffers: an inference tensor there could not be written outside inference mode."""
    widened = Widened()
    weight, x = torch.randn(8, 4).to(torch.bfloat16), torch.randn(2, 4).to(torch.bfloat16)
    with torch.inference_mode():
        first = float32_form(x, weight, None, widened)
    with torch.no_grad():
        again = float32_form(x, weight, None, widened)
    assert torch.equal(first, again)


def timings(**by_rows) -> dict:
    """{rows: {form: seconds}} from rows_N=(linear, transposed[, float32])."""
    names = ("linear", "transposed", "float32")
    return {int(k.split("_")[1]): dict(zip(names, v)) for k, v in by_rows.items()}


def test_the_choice_follows_the_timings_and_past_the_last_count_keeps_its_choice():
    forms = Forms.from_timings(timings(rows_1=(1.0, 0.5), rows_2=(1.0, 0.95), rows_4=(2.0, 1.0), rows_8=(1.0, 1.2)))
    assert forms.chosen == {1: "transposed", 4: "transposed"}  # 0.95 is no clear win (WIN = 0.9)
    chosen = {m: forms.form(m) for m in range(1, 11)}
    # a count between two measured ones takes a form only where both chose it; past the last, its choice
    assert [m for m, f in chosen.items() if f == "transposed"] == [1, 4]
    assert set(chosen.values()) == {"linear", "transposed"}
    both = Forms.from_timings(timings(rows_4=(2.0, 1.0), rows_8=(1.0, 0.5), rows_16=(1.0, 1.0)))
    assert [both.form(m) for m in (4, 5, 7, 8, 9, 15, 16, 500)] == ["transposed"] * 4 + ["linear"] * 4
    assert Forms.from_timings(timings(rows_1=(1.0, 0.1))).form(2) == "transposed"
    # three forms: the fastest, if it beats F.linear by the margin
    wide = Forms.from_timings(timings(rows_1=(1.0, 0.8, 1.5), rows_4=(1.0, 0.7, 0.3), rows_8=(1.0, 1.1, 0.2), rows_128=(1.0, 1.0, 0.1)))
    assert [wide.form(m) for m in (1, 2, 4, 6, 8, 100, 128, 4000)] == [
        "transposed", "linear", "float32", "float32", "float32", "float32", "float32", "float32"]


def test_measuring_times_every_form_of_the_dtype_at_every_row_count():
    forms = measure_forms([torch.randn(24, 16), torch.randn(24, 16)], [None, torch.randn(24)], tries=1, budget_s=0.0)
    assert sorted(forms.timings) == list(ROWS)
    assert all(set(t) == {"linear", "transposed"} and min(t.values()) > 0 for t in forms.timings.values())
    assert forms.chosen == {m: "transposed" for m, t in forms.timings.items() if t["transposed"] < 0.9 * t["linear"]}
    narrow = measure_forms([torch.randn(24, 16).bfloat16()], [None], rows=(1, 2, 128), tries=1, budget_s=0.0)
    assert all(set(t) == {"linear", "transposed", "float32"} for t in narrow.timings.values())
    assert sorted(narrow.timings) == [1, 2, 128]


def test_a_form_far_behind_is_not_timed_twice(monkeypatch):
    import time

    from batchspec.engine.torch import linear

    calls = {"linear": 0, "slow": 0}

    def counted(x, w, b):
        calls["linear"] += 1
        return F.linear(x, w, b)

    def slow(x, w, b):  # far over RETRY x F.linear's time on a 24 x 16 weight
        calls["slow"] += 1
        time.sleep(0.02)
        return F.linear(x, w, b)

    monkeypatch.setitem(linear.FORMS, "linear", counted)
    monkeypatch.setitem(linear.FORMS, "transposed", slow)
    forms = measure_forms([torch.randn(24, 16)], [None], rows=(1, 2), tries=3, budget_s=0.0)
    assert calls == {"linear": 6, "slow": 2}  # F.linear three tries per count, the slow form one
    assert forms.chosen == {} and all(t["transposed"] >= 0.02 for t in forms.timings.values())


def everywhere(weights, biases) -> Forms:
    """Forms that transpose every product, whatever the timings."""
    return Forms.from_timings({m: {"linear": 1.0, "transposed": 0.0} for m in ROWS})


def widened(weights, biases) -> Forms:
    """Forms that compute every product in float32, whatever the timings."""
    return Forms.from_timings({m: {"linear": 1.0, "transposed": 1.0, "float32": 0.0} for m in ROWS})


def test_a_bfloat16_model_widened_everywhere_computes_its_own_logits(word_models):
    narrow = copy.deepcopy(word_models[0]).to(torch.bfloat16)
    wide = copy.deepcopy(narrow)
    forms = measure_linears(wide, measure=widened)
    assert forms and all(f.form(m) == "float32" for f in forms.values() for m in (1, 7, 600))
    ids = torch.randint(1, 64, (3, 11))
    with torch.inference_mode():
        a, b = narrow(ids).logits, wide(ids).logits
    assert b.dtype == torch.bfloat16
    # the same products rounded in another order: logits a few bfloat16 steps apart at most
    torch.testing.assert_close(b.float(), a.float(), rtol=0.05, atol=0.05)


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
        return Forms.from_timings({m: {"linear": 1.0, "transposed": 0.5 if m == 3 else 1.0} for m in ROWS})
    return measure


def test_the_timing_cache_serves_a_second_load_on_this_machine_and_no_other(word_models, tmp_path, monkeypatch):
    calls: list = []
    first = measure_linears(copy.deepcopy(word_models[0]), measure=counting(calls), cache=FormsCache(tmp_path))
    measured = len(calls)
    assert measured == len(first) and list(tmp_path.glob("*.json"))
    second = measure_linears(copy.deepcopy(word_models[0]), measure=counting(calls), cache=FormsCache(tmp_path))
    assert len(calls) == measured  # nothing measured again
    assert {k: (f.chosen, f.timings) for k, f in second.items()} == {k: (f.chosen, f.timings) for k, f in first.items()}
    assert all(f.chosen == {3: "transposed"} for f in second.values())
    # the forms timed are part of what a timing belongs to: a bfloat16 weight's three are not these two
    assert FormsCache(tmp_path).get(next(iter(first)), calls[0], ("linear", "transposed", "float32")) is None
    assert FormsCache(tmp_path).get(next(iter(first)), calls[0], ("linear", "transposed")) is not None
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
    assert all(f.chosen == {3: "transposed"} for f in again.values())


def test_widening_reuses_one_buffer_per_shape_and_gives_the_same_product():
    from batchspec.engine.torch.linear import Widened

    gen = torch.Generator().manual_seed(3)
    widened = Widened()
    weights = [torch.randn(48, 32, generator=gen).bfloat16() for _ in range(3)] + [torch.randn(16, 32, generator=gen).bfloat16()]
    x = torch.randn(5, 32, generator=gen).bfloat16()
    for w in weights:
        assert torch.equal(float32_form(x, w, None, widened), float32_form(x, w, None))
    assert sorted(tuple(b.shape) for b in widened.buffers.values()) == [(16, 32), (48, 32)]
    assert all(b.dtype == torch.float32 for b in widened.buffers.values())
