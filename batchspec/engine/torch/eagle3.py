"""The EAGLE-3 draft head's module (the target hidden states it reads: eagle3_states.py; its chain
drafts: eagle3_chains.py; its released format on disk: eagle3_release.py). It knows the target
model's modules (embeddings, decoder layers, LM head); it knows nothing about requests, the
decode loop or calibration.

What it mirrors (read at these commits; the names below are theirs):
- SafeAILab/EAGLE @ cb7e0841fe0c206c6ed74a197ad5e2a1f13f5a2b
  - eagle/model/cnets.py, `Model`: `fc` (3 x target hidden -> hidden, no bias) fuses the target's
    low, middle and high hidden states; `midlayer` (`LlamaDecoderLayeremb`) is one Llama decoder
    layer whose attention reads `cat(input_layernorm(embedding), hidden_norm(hidden))` (2 x hidden
    into q/k/v) with the un-normed hidden as its residual; `norm` and `lm_head` (hidden ->
    `draft_vocab_size`) give draft-vocabulary logits, and draft id i is target id i + `d2t[i]`
    (`t2d[v]`: target id v is in the draft vocabulary). The embeddings are the target's, frozen.
  - eagle/model/cnets.py, `Model.forward` / `topK_genrate`: the head at position j pairs the
    target's hidden state after token j with the embedding of token j+1 (`input_ids[:, 1:]`) and
    predicts token j+2; each further draft feeds the head's own output hidden state (before
    `norm`) with the embedding of the token just drafted, one position later. The context's keys
    always come from the target's hidden states: the drafts' keys are dropped after each step
    (`stable_kv`).
  - eagle/model/modeling_llama_kv.py, `LlamaModel.forward`: the three hidden states are the
    inputs of decoder layers 2, L // 2 and L - 3 (`idx==2`, `len(self.layers)//2`,
    `len(self.layers)-3`), concatenated in layer order (eagle/model/utils.py, `initialize_tree`).
  - eagle/traineagle3/cnets.py, `Model.forward` and `LlamaAttention.forward` (`cache_hidden`): the
    training-time test unrolls depths 0..6; at depth d the query at position i (rotary position
    i + d) attends to the depth-0 keys at positions <= i and to the depth-1..d keys at position i
    only. `Model.scandata`: the draft vocabulary is the most frequent target tokens, sorted;
    `d2t[i] = used[i] - i`, `t2d[v] = v in used`.
- sgl-project/SpecForge @ a6b6b0230009d15ec2a97a57384e6f53f0f96946
  - specforge/modeling/draft/llama3_eagle.py, `LlamaForCausalLMEagle3`: the same module names
    (`fc`, `midlayer.*`, `norm`, `lm_head`, buffers `t2d`, `d2t`), `target_hidden_size` when the
    head's hidden size differs from the target's.

A chain draft of length k from a row whose committed tokens are s[0..n] runs depth 0 at position
n-1 (the target's hidden after s[n-1], the embedding of s[n]) and depths 1..k-1 there, each fed
its own previous output: `unroll` with `feed=None` does exactly this for every position of a
sequence at once (the counterfactual's and training's pass, the target's true next tokens fed),
and `eagle3_chains.Chain` for one growing row (the drafter's, keys of the context kept).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding


def aux_layers(num_layers: int) -> tuple[int, int, int]:
    """The target decoder layers whose inputs EAGLE-3 reads: low, middle, high."""
    return (2, num_layers // 2, num_layers - 3)


# -- the module -----------------------------------------------------------------------------------


class Eagle3Attention(nn.Module):
    """The midlayer's attention: q/k/v read 2 x hidden (embedding and hidden state side by side)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        bias = bool(getattr(config, "attention_bias", False))
        width = 2 * config.hidden_size
        self.q_proj = nn.Linear(width, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(width, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(width, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, config.hidden_size, bias=bias)

    def split(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        """[B, T, heads * D] -> [B, heads, T, D]."""
        return x.view(*x.shape[:2], heads, self.head_dim).transpose(1, 2)

    def keys(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotated keys and values [B, kv_heads, T, D] of x [B, T, 2H]."""
        k, v = self.split(self.k_proj(x), self.kv_heads), self.split(self.v_proj(x), self.kv_heads)
        k = k * cos.unsqueeze(1) + _rotate_half(k) * sin.unsqueeze(1)
        return k, v

    def queries(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        q = self.split(self.q_proj(x), self.heads)
        return q * cos.unsqueeze(1) + _rotate_half(q) * sin.unsqueeze(1)

    def attend(self, q: torch.Tensor, k0: torch.Tensor, v0: torch.Tensor, at: torch.Tensor,
               own: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """EAGLE-3's attention at one depth: q [B, h, Q, D] at positions `at` ([Q], or [B, Q] where
        each row has its own: rows of different lengths, their keys padded) attends to the context
        keys k0/v0 [B, kv, T, D] at positions <= at and to `own`, the keys/values [B, kv, Q, D]
        each deeper draft left at its own query's position. Out: [B, Q, H]."""
        group = self.heads // self.kv_heads
        k0, v0 = k0.repeat_interleave(group, 1), v0.repeat_interleave(group, 1)
        scale = 1.0 / math.sqrt(self.head_dim)
        scores = [torch.matmul(q, k0.transpose(2, 3)) * scale]  # [B, h, Q, T]
        later = torch.arange(k0.shape[2], device=q.device) > at[..., None]  # [Q, T] or [B, Q, T]
        later = later[:, None] if later.dim() == 3 else later
        scores[0] = scores[0].masked_fill(later, float("-inf"))
        own = [(k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)) for k, v in own]
        scores += [(q * k).sum(-1, keepdim=True) * scale for k, _ in own]  # [B, h, Q, 1] each
        weights = torch.softmax(torch.cat(scores, -1), dim=-1, dtype=torch.float32).to(q.dtype)
        T = k0.shape[2]
        out = torch.matmul(weights[..., :T], v0)
        for i, (_, v) in enumerate(own):
            out = out + weights[..., T + i : T + i + 1] * v
        return self.o_proj(out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1))


class Eagle3Midlayer(nn.Module):
    """EAGLE-3's one decoder layer (`midlayer`)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.hidden_norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.self_attn = Eagle3Attention(config)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def mix(self, emb: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """The attention's input [.., 2H]: the token's embedding beside the hidden state, each normed."""
        return torch.cat((self.input_layernorm(emb), self.hidden_norm(hidden)), dim=-1)

    def finish(self, hidden: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """Residual over the attention (the un-normed hidden state), then the MLP's."""
        hidden = hidden + attended
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class Eagle3Head(nn.Module):
    """The draft head. Its embeddings are the target's (read, never trained or saved) unless a
    released head carried its own (`embed_tokens`); `layers` are the target layers it reads."""

    def __init__(self, config: LlamaConfig, embed: nn.Embedding, layers: Sequence[int]) -> None:
        super().__init__()
        self.config = config
        self.layers = tuple(layers)
        self.target_hidden = getattr(config, "target_hidden_size", None) or config.hidden_size
        self.fc = nn.Linear(3 * self.target_hidden, config.hidden_size, bias=False)
        self.midlayer = Eagle3Midlayer(config)
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(config.vocab_size, dtype=torch.bool))
        self.rotary = LlamaRotaryEmbedding(config)  # no persistent buffers: not in the state dict
        self.embed_tokens: nn.Embedding | None = None
        self._target_embed = (embed,)  # a tuple: not a submodule, so `.to()` never converts the target's

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        table = self.embed_tokens if self.embed_tokens is not None else self._target_embed[0]
        return table(ids).detach()

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids to the target's."""
        return draft_ids + self.d2t[draft_ids]

    def target_ids(self) -> torch.Tensor:
        """Every draft id's target id, in draft-id order (on the head's device)."""
        return self.to_target(torch.arange(self.config.draft_vocab_size, device=self.d2t.device))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits of the head's output hidden states."""
        return self.lm_head(self.norm(hidden))

    def rope(self, positions: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [1, Q, D] of positions [Q]; [B, Q, D] of positions [B, Q]."""
        return self.rotary(like, positions if positions.dim() == 2 else positions[None])

    def context(self, aux: torch.Tensor, next_ids: torch.Tensor, start: int = 0):
        """Depth 0's inputs over context positions start..start+T-1: the fused hidden states
        [B, T, H], the attention inputs [B, T, 2H] and their keys/values [B, kv, T, D].
        `aux` [B, T, 3 x target hidden]: the target's hidden states there; `next_ids` [B, T]: the
        token after each position (its embedding pairs with that position)."""
        hidden = self.fc(aux)
        x = self.midlayer.mix(self.embed(next_ids).to(hidden.dtype), hidden)
        cos, sin = self.rope(torch.arange(start, start + aux.shape[1], device=aux.device), x)
        k, v = self.midlayer.self_attn.keys(x, cos, sin)
        return hidden, x, k, v

    def deepen(self, k0: torch.Tensor, v0: torch.Tensor, hidden: torch.Tensor, x: torch.Tensor, at: torch.Tensor,
               depth: int, next_ids: Callable[[int, torch.Tensor], torch.Tensor]) -> list[torch.Tensor]:
        """Depths 0..depth-1 at query positions `at` ([Q] or [B, Q]): `hidden` [B, Q, H] and `x` [B, Q, 2H] are
        depth 0's inputs there; `next_ids(d, logits)` gives depth d's input tokens [B, Q] from
        depth d-1's draft logits (None: stop there). Returns each depth's logits [B, Q, draft vocab]."""
        attn = self.midlayer.self_attn
        own: list[tuple[torch.Tensor, torch.Tensor]] = []
        out: list[torch.Tensor] = []
        for d in range(depth):
            if d:
                ids = next_ids(d, out[-1])
                if ids is None:  # the caller stops the chain here
                    break
                x = self.midlayer.mix(self.embed(ids).to(hidden.dtype), hidden)
            cos, sin = self.rope(at + d, x)
            if d:
                own.append(attn.keys(x, cos, sin))
            hidden = self.midlayer.finish(hidden, attn.attend(attn.queries(x, cos, sin), k0, v0, at, own))
            out.append(self.logits(hidden))
        return out

    def unroll(self, aux: torch.Tensor, tokens: torch.Tensor, depth: int, at: torch.Tensor,
               feed: Callable[[int, torch.Tensor], torch.Tensor] | None = None) -> list[torch.Tensor]:
        """EAGLE-3's training-time test over whole sequences: `tokens` [B, N], `aux` [B, N-1, 3H']
        the target's hidden states after tokens 0..N-2. Position i (of `at`) at depth d reads
        token i+1+d (`feed` None: the true token, 0 past the end; else `feed(d, logits)`) and
        predicts token i+2+d. Returns each depth's logits [B, len(at), draft vocab]."""
        hidden, x, k0, v0 = self.context(aux, tokens[:, 1:])
        if feed is None:
            padded = torch.nn.functional.pad(tokens, (0, depth))

            def feed(d: int, logits: torch.Tensor) -> torch.Tensor:
                return padded[:, at + 1 + d]

        return self.deepen(k0, v0, hidden[:, at], x[:, at], at, depth, feed)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
