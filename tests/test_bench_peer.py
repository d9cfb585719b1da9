"""bench/peer.py: its held-out prompt builder and one run of its harness on tiny random models (a
smoke test of the harness, no timing asserted)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))


def test_held_out_prompts_are_chat_requests_in_the_length_range(smol_tokenizer):
    from common import peer_prompts

    prompts = peer_prompts.held_out(smol_tokenizer, 8, seed=0)
    assert [p.task for p in prompts] == list(peer_prompts.TASKS) * 2
    for p in prompts:
        assert 300 <= len(p.token_ids) <= 600, (p.id, len(p.token_ids))
        assert list(p.token_ids) == peer_prompts.encode(smol_tokenizer, list(p.messages))
        assert p.source.lower() not in peer_prompts.OWN
    assert len({p.messages[0]["content"] for p in prompts}) == 8
    # seeded: the same seed gives the same prompts, another seed others
    assert peer_prompts.held_out(smol_tokenizer, 3, seed=0) == prompts[:3]
    assert [p.token_ids for p in peer_prompts.held_out(smol_tokenizer, 3, seed=1)] != [p.token_ids for p in prompts[:3]]


def test_peer_bench_compares_every_arm_and_profiles_a_step(tiny_model_dir, tiny_draft_dir, tmp_path):
    import peer

    from common import results

    target, draft = str(tiny_model_dir), str(tiny_draft_dir)
    recorded = results.RESULTS.read_bytes()
    data = peer.main(["--model", target, "--target", target, "--draft-model", draft, "--quick", "--max-tokens", "4",
                      "--min-tokens", "100", "--max-prompt-tokens", "200", "--out", str(tmp_path)])
    assert results.RESULTS.read_bytes() == recorded, "a run not asked to --record appends nothing"
    assert data["record"]["metrics"] == {f"{c['name'].replace(' ', '_')}_{c['layers']}": round(c["ratio"], 3) for c in data["comparisons"]}
    saved = json.loads((tmp_path / "peer.json").read_text())
    assert [(c["name"], c["layers"]) for c in saved["comparisons"]] == [
        (name, lay) for name in ("plain b8", "ngram b1", "draft b1") for lay in ("own", "shared")]
    for c in saved["comparisons"]:
        assert c["ours"]["tokens"] > 0 and c["theirs"]["tokens"] > 0
        assert c["ratio"] > 0 and c["cpu_ratio"] > 0 and len(c["chunk_ratios"]) == -(-c["prompts"] // c["batch_size"])
        assert all(100 <= n <= 200 for n in c["prompt_tokens"])
    assert saved["machine"]["torch_threads"] == 1 and len(saved["machine"]["load_avg_end"]) == 3
    step = saved["profile"]["parts"]["decode step"]
    assert abs(sum(step[p]["share"] for p in peer.step_profile.PARTS) - 1.0) < 1e-6
    assert step["forward"]["ms"] > 0 and saved["profile"]["target_steps"] > 0
    assert "| plain b8 |" in (tmp_path / "peer.md").read_text() and "one decode step" in (tmp_path / "peer.md").read_text()
    assert data["comparisons"] == saved["comparisons"]


def test_own_layers_gives_transformers_its_nn_linear_on_the_same_parameters_for_the_call():
    import peer
    import torch
    from torch import nn

    from batchspec.engine.torch.linear import Forms, MeasuredLinear, measure_linears

    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8, bias=False))
    measure_linears(model, measure=lambda w, b: Forms.from_timings({1: {"linear": 1.0, "transposed": 0.0}}))
    params = dict(model.named_parameters())
    x = torch.randn(3, 8)
    before = model(x)
    with peer.own_layers(model):
        assert [type(m) for m in model] == [nn.Linear, nn.ReLU, nn.Linear]
        assert {n: p for n, p in model.named_parameters()} == params  # the same tensors, not copies
        torch.testing.assert_close(model(x), before)
    assert [type(m) for m in model] == [MeasuredLinear, nn.ReLU, MeasuredLinear]
    assert {n: p for n, p in model.named_parameters()} == params
