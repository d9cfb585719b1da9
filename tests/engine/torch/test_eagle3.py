"""The EAGLE-3 head (engine/torch/eagle3.py, eagle3_train.py): a head in the released format on
disk loads with every weight where it belongs, and a mismatch is one line naming the file and the
field; the hidden states it reads are the inputs of the target layers EAGLE-3 names; a head
trained on the target's own rows drafts what the target writes more often than an untrained one
and loads back, once written, as a published head does; and its counterfactual acceptance from
plain rows (counterfactual.chain_acceptance) equals, step by step, what a reference speculative
loop measures, the head drafting from the hidden states of the forward that verifies, with output
equal to plain greedy decoding."""

from __future__ import annotations

import json

import pytest
import torch

from batchspec.engine.torch.counterfactual import chain_acceptance
from batchspec.engine.torch.eagle3 import aux_layers
from batchspec.engine.torch.eagle3_chains import Chain, chains, draft_rows
from batchspec.engine.torch.eagle3_states import HiddenCapture
from batchspec.engine.torch.eagle3_release import load_head, save_head
from batchspec.engine.torch.eagle3_train import draft_vocabulary, new_head
from batchspec.errors import ModelError

from tests.conftest import tiny_llama
from tests.engine.torch.eagle3_heads import released, write

# -- the released format ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def target():
    """A 6-layer target (EAGLE-3 reads the inputs of layers 2, 3 and 3) over 96 tokens."""
    return tiny_llama(96, 6, seed=4, eos_token_id=0, pad_token_id=0)


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_a_released_head_loads_with_every_weight_in_place(tmp_path, target, fmt):
    config, weights = released(target)
    head = load_head(write(tmp_path / "head", config, weights, fmt), target)
    state = head.state_dict()
    assert set(state) == set(weights)
    for key, value in weights.items():
        assert torch.equal(state[key], value.to(state[key].dtype)), key
    assert head.config.draft_vocab_size == 40 and head.layers == (2, 3, 3)
    used = weights["d2t"] + torch.arange(40)
    assert torch.equal(head.to_target(torch.arange(40)), used)  # draft id i is target id i + d2t[i]
    assert head.embed(torch.tensor([5])).equal(target.get_input_embeddings()(torch.tensor([5])))


def test_a_head_that_carries_its_embeddings_uses_them(tmp_path, target):
    config, weights = released(target)
    weights["embed_tokens.weight"] = torch.randn(96, 64)
    head = load_head(write(tmp_path / "head", config, weights), target)
    assert head.embed(torch.tensor([7])).equal(weights["embed_tokens.weight"][7:8])
    assert head.embed_tokens is not None and "embed_tokens.weight" in head.state_dict()


@pytest.mark.parametrize("change,message", [
    (lambda c, w: c.update(hidden_size=128), "config.json: hidden_size 128 does not match the target's hidden size 64"),
    (lambda c, w: c.update(target_hidden_size=32), "config.json: target_hidden_size 32 does not match"),
    (lambda c, w: c.update(vocab_size=100), "config.json: vocab_size 100 does not match the target's vocabulary 96"),
    (lambda c, w: c.update(draft_vocab_size="many"), "config.json: draft_vocab_size is 'many', expected a positive integer"),
    (lambda c, w: w.pop("fc.weight"), "model.safetensors: missing weight fc.weight"),
    (lambda c, w: w.update(extra=torch.zeros(1)), "model.safetensors: unexpected weight extra"),
    (lambda c, w: w.update({"lm_head.weight": torch.zeros(41, 64)}), "model.safetensors: lm_head.weight has shape [41, 64], expected [40, 64]"),
    (lambda c, w: w.update(d2t=torch.full((40,), 500)), "model.safetensors: d2t maps draft ids outside"),
])
def test_a_mismatch_is_one_line_naming_the_file_and_field(tmp_path, target, change, message):
    config, weights = released(target)
    change(config, weights)
    folder = write(tmp_path / "head", config, weights)
    with pytest.raises(ModelError) as err:
        load_head(folder, target)
    text = str(err.value)
    assert message in text and "\n" not in text and str(folder) in text


def test_a_folder_without_the_files_says_which(tmp_path, target):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="no config.json"):
        load_head(tmp_path / "empty", target)
    config, _ = released(target)
    (tmp_path / "empty" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError, match="no model.safetensors or pytorch_model.bin"):
        load_head(tmp_path / "empty", target)


def test_the_captured_hidden_states_are_the_inputs_of_layers_2_mid_and_L_minus_3():
    model = tiny_llama(96, 10, seed=2)
    ids = torch.tensor([[3, 14, 15, 92, 65, 35]])
    capture = HiddenCapture(model, aux_layers(10))
    with torch.no_grad():
        states = model(ids, output_hidden_states=True).hidden_states  # [i]: the input of layer i
    aux = capture.take()
    capture.close()
    assert aux_layers(10) == (2, 5, 7)
    assert torch.equal(aux, torch.cat([states[2], states[5], states[7]], dim=-1))


# -- a head trained on the target's rows ------------------------------------------------------------


def mean_accepted_len(head, plain, rows, k: int) -> float:
    acceptance = chain_acceptance(plain, [k], chains(head, rows, k))[k]
    return 1 + acceptance.accepted_tokens / acceptance.target_steps


def test_training_on_the_targets_rows_makes_the_head_draft_what_it_writes(word_models, trained):
    target = word_models[0]
    _, plain, rows, head, stats = trained
    used, coverage = draft_vocabulary(rows, 48, 64)
    untrained = new_head(target, used)
    assert stats.steps == 40 and stats.rows == 12 and stats.draft_vocab_size == len(used) and coverage == stats.coverage
    assert stats.accuracy[0] > 0.3
    assert mean_accepted_len(head, plain, rows, 4) > mean_accepted_len(untrained, plain, rows, 4) + 0.3


def test_a_trained_head_written_in_the_released_format_loads_as_a_published_one(tmp_path, word_models, trained):
    target = word_models[0]
    _, plain, rows, head, _ = trained
    folder = save_head(head, tmp_path / "head")
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == head.config.draft_vocab_size
    loaded = load_head(folder, target)
    assert loaded.state_dict().keys() == head.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), head.state_dict().values()))
    assert chains(loaded, rows, 3) == chains(head, rows, 3)


def speculative_greedy(target, head, prompt: list[int], max_tokens: int, k: int, eos: int) -> tuple[list[int], list[int]]:
    """A reference decode loop (no KV cache: every forward reads the whole sequence): the head
    chain-drafts up to k tokens from the hidden states of the forward that verified the last
    step, the target accepts while its argmax agrees. Returns (output, drafts accepted per step)."""
    capture = HiddenCapture(target, head.layers)
    chain = Chain(head)
    with torch.no_grad():
        logits = target(torch.tensor([prompt])).logits[0]
        out = [int(logits[-1].argmax())]
        chain.extend(capture.take()[0], prompt[1:] + out)
        steps = []
        while len(out) < max_tokens and out[-1] != eos:
            budget = min(k, max_tokens - len(out) - 1)
            drafts = chain.draft(budget) if budget else []
            seq = prompt + out + drafts
            logits = target(torch.tensor([seq])).logits[0]
            aux = capture.take()[0]
            last = len(prompt) + len(out) - 1  # the position of the last committed token
            n = 0
            while n < len(drafts) and int(logits[last + n].argmax()) == drafts[n] and drafts[n] != eos:
                n += 1
            if n < len(drafts) and drafts[n] == eos and int(logits[last + n].argmax()) == eos:
                n += 1  # an accepted end token ends the row; no bonus token after it
                new = drafts[:n]
            else:
                new = drafts[:n] + [int(logits[last + n].argmax())]
            chain.extend(aux[last : last + len(new)], new)
            out += new
            steps.append(n)
    capture.close()
    return out, steps


@pytest.mark.parametrize("k", [1, 2, 4])
def test_counterfactual_acceptance_equals_the_reference_loop_step_by_step(word_models, trained, k):
    target = word_models[0]
    engine, plain, rows, head, _ = trained
    predicted = chain_acceptance(plain, [k], chains(head, rows, k))[k]
    assert predicted.method == "eagle3" and predicted.exact
    accepted_somewhere = False
    for r, row in enumerate(plain):
        output, steps = speculative_greedy(target, head, list(row.prompt_ids), row.max_tokens, k, eos=0)
        assert output == list(row.output_ids)  # lossless: the plain greedy output
        assert steps == predicted.steps[r], f"row {r}"
        accepted_somewhere |= any(s > 1 for s in steps)
    assert accepted_somewhere or k == 1


def naive_chain(head, aux: torch.Tensor, tokens: list[int], k: int) -> list[int]:
    """EAGLE-3's test-time chain written plainly: the midlayer over one growing sequence with
    ordinary causal attention (transformers' rotary, torch's sdpa), the context's positions
    pairing the target's hidden state with the next token, each draft appended as one more
    position pairing the head's own last output with the token it drafted."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    attn, layer = head.midlayer.self_attn, head.midlayer
    hidden = head.fc(aux)  # [n, H]
    ids = torch.tensor(tokens[1:])
    drafts = []
    for _ in range(k):
        x = layer.mix(head.embed(ids), hidden)[None]  # [1, T, 2H]
        T = x.shape[1]
        cos, sin = head.rotary(x, torch.arange(T)[None])
        q, key = apply_rotary_pos_emb(attn.split(attn.q_proj(x), attn.heads), attn.split(attn.k_proj(x), attn.kv_heads), cos, sin)
        value = attn.split(attn.v_proj(x), attn.kv_heads)
        out = torch.nn.functional.scaled_dot_product_attention(q, key, value, is_causal=True, enable_gqa=True)
        out = attn.o_proj(out.transpose(1, 2).reshape(1, T, -1))
        last = layer.finish(hidden[-1], out[0, -1])
        drafts.append(int(head.to_target(head.logits(last).argmax())))
        hidden = torch.cat([hidden, last[None]])
        ids = torch.cat([ids, torch.tensor(drafts[-1:])])
    return drafts


def test_the_heads_attention_is_eagle3s_chain_written_plainly(trained):
    _, plain, rows, head, _ = trained
    with torch.no_grad():
        for row in rows[:4]:
            for n in range(row.prompt_len, len(row.tokens) - 1, 3):  # committed tokens: prompt + some output
                chain = Chain(head)
                chain.extend(row.aux[: n - 1], row.tokens[1:n].tolist())
                assert chain.draft(4) == naive_chain(head, row.aux[: n - 1], row.tokens[:n].tolist(), 4)


def test_rows_drafted_together_draft_what_each_rows_chain_drafts_alone(trained):
    """eagle3_chains.draft_rows (the drafter's: one head forward per depth over the batch, contexts
    padded to the longest) against each row's `Chain.draft`: rows of different lengths and
    budgets (0 among them), and a row whose pick ends its chain early."""
    _, _, rows, head, _ = trained
    with torch.no_grad():
        chains_, alone = [], []
        for i, row in enumerate(rows[:5]):
            n = row.prompt_len + 2 * i  # committed tokens: every row a different length
            chain = Chain(head)
            chain.extend(row.aux[: n - 1], row.tokens[1:n].tolist())
            chains_.append(chain)
        ks = [4, 0, 2, 5, 3]
        alone = [chain.draft(k) if k else [] for chain, k in zip(chains_, ks)]
        greedy = (lambda b, i, logits: int(head.to_target(logits.argmax(-1))))
        assert draft_rows(chains_, ks, greedy) == alone
        assert len({c.length for c in chains_}) == 5 and any(len(d) == 5 for d in alone)
        stop_row_3_after_1 = (lambda b, i, logits: None if (b, i) == (3, 1) else greedy(b, i, logits))
        assert draft_rows(chains_, ks, stop_row_3_after_1) == [*alone[:3], alone[3][:1], alone[4]]
