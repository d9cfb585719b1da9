"""The EAGLE-3 draft head: its module, the target hidden states it reads, and its chain drafts (its
released format on disk: eagle3_release.py). It knows the target model's modules (embeddings,
decoder layers, LM head); it knows nothing about requests, the decode loop or calibration.

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
and `Chain` for one growing row (the drafter's, keys of the context kept).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

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



# -- chain drafts over a growing row ---------------------------------------------------------------


class Chain:
    """One row's head state while it decodes: the context's keys (from the target's hidden
    states, extended as tokens are committed) and greedy chain drafts from its last position."""

    def __init__(self, head: Eagle3Head) -> None:
        self.head = head
        self.k0 = self.v0 = self.hidden = self.x = None
        self.length = 0  # context positions with keys

    @torch.inference_mode()
    def extend(self, aux: torch.Tensor, next_ids: Sequence[int]) -> None:
        """Add positions: `aux` [n, 3H'] the target's hidden states after the next n committed
        tokens, `next_ids` the n tokens after them (the last one just committed)."""
        ids = torch.tensor([list(next_ids)], dtype=torch.long, device=aux.device)
        hidden, x, k, v = self.head.context(aux[None], ids, start=self.length)
        grow = (lambda old, new: new if old is None else torch.cat((old, new), dim=2))
        self.k0, self.v0 = grow(self.k0, k), grow(self.v0, v)
        self.hidden, self.x = hidden[:, -1:], x[:, -1:]
        self.length += aux.shape[0]

    @torch.inference_mode()
    def draft(self, k: int, pick: Callable[[int, torch.Tensor], int | None] | None = None) -> list[int]:
        """Up to k chain drafts (target ids) after the last committed token. `pick(i, logits)`
        chooses draft i from the head's draft-vocabulary logits [draft vocab] (a target id; None
        ends the chain there); by default the greedy one."""
        head = self.head
        at = torch.tensor([self.length - 1], device=self.k0.device)
        pick = pick or (lambda i, logits: int(head.to_target(logits.argmax(-1))))
        drafts: list[int] = []

        def chosen(logits: torch.Tensor) -> int | None:
            token = pick(len(drafts), logits[0, 0])
            if token is not None:
                drafts.append(token)
            return token

        def own(d: int, logits: torch.Tensor) -> torch.Tensor | None:
            token = chosen(logits)
            return None if token is None else torch.tensor([[token]], device=at.device)

        out = head.deepen(self.k0, self.v0, self.hidden, self.x, at, k, own)
        if len(out) == k:  # the last depth's draft (the others were picked as the next depth's input)
            chosen(out[-1])
        return drafts


@torch.inference_mode()
def draft_rows(chains: Sequence[Chain], ks: Sequence[int], pick: Callable[[int, int, torch.Tensor], int | None]) -> list[list[int]]:
    """Chain drafts of several rows at once, one forward of the head per depth: row b drafts up to
    ks[b] tokens after its last committed one, `pick(b, i, logits)` choosing its draft i from the
    head's draft-vocabulary logits [draft vocab] (a target id; None ends row b's chain). The rows'
    context keys are padded to the longest and masked past each row's own last position, so each
    row's logits are its own chain's (`Chain.draft`), up to float rounding."""
    out: list[list[int]] = [[] for _ in ks]
    live = [b for b, k in enumerate(ks) if k > 0]
    if not live:
        return out
    head = chains[live[0]].head
    longest = max(chains[b].length for b in live)

    def stack(name: str) -> torch.Tensor:
        parts = [getattr(chains[b], name) for b in live]
        if name in ("k0", "v0"):
            parts = [torch.nn.functional.pad(t, (0, 0, 0, longest - t.shape[2])) for t in parts]
        return torch.cat(parts)

    at = torch.tensor([[chains[b].length - 1] for b in live], device=chains[live[0]].k0.device)
    going = [True] * len(live)

    def chosen(logits: torch.Tensor) -> list[int]:
        ids = []
        for i, b in enumerate(live):
            token = None
            if going[i] and len(out[b]) < ks[b]:
                token = pick(b, len(out[b]), logits[i, 0])
            if token is None:
                going[i] = False
            else:
                out[b].append(token)
            ids.append(0 if token is None else token)  # a row that stopped feeds a filler, never read
        return ids

    def own(d: int, logits: torch.Tensor) -> torch.Tensor | None:
        ids = chosen(logits)
        return torch.tensor(ids, device=at.device)[:, None] if any(going) else None

    depth = max(ks[b] for b in live)
    logits = head.deepen(stack("k0"), stack("v0"), stack("hidden"), stack("x"), at, depth, own)
    if len(logits) == depth:  # the last depth's drafts (the others were picked as the next depth's input)
        chosen(logits[-1])
    return out


# -- the target's hidden states ----------------------------------------------------------------------


class HiddenCapture:
    """Forward pre-hooks on the target's decoder layers `layers`: after forwards of the target
    (a prefill's, a verify's), `forwards()` gives for each the inputs of those layers concatenated
    [B, T, 3H] in layer order, EAGLE-3's low, middle and high hidden states; `take()` the last
    one's. Built `on=False` (the engine's, installed once), it keeps nothing outside `reading()`.
    Remove with `close()`."""

    def __init__(self, model, layers: Sequence[int], on: bool = True) -> None:
        self.layers = tuple(layers)
        self.on = on
        self.seen: dict[int, list[torch.Tensor]] = {}
        decoder = model.get_decoder().layers
        self.handles = [decoder[i].register_forward_pre_hook(self._hook(i), with_kwargs=True) for i in sorted(set(self.layers))]

    def _hook(self, index: int):
        def hook(module, args, kwargs):
            if self.on:
                self.seen.setdefault(index, []).append(args[0] if args else kwargs["hidden_states"])
        return hook

    @contextmanager
    def reading(self) -> Iterator[None]:
        """Keep the hidden states of the forwards run inside (for `forwards`)."""
        was, self.on, self.seen = self.on, True, {}
        try:
            yield
        finally:
            self.on = was

    def forwards(self) -> list[torch.Tensor]:
        """Each forward's [B, T, 3H] since the last call, in order."""
        count = len(self.seen.get(self.layers[0], ()))
        out = [torch.cat([self.seen[i][f] for i in self.layers], dim=-1) for f in range(count)]
        self.seen = {}
        return out

    def take(self) -> torch.Tensor:
        return self.forwards()[-1]

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()


@dataclass
class Recorded:
    """One row as the head needs it: its tokens (prompt, then output) and the target's hidden
    states after tokens 0..N-2: `aux` [N-1, 3H] (the head's input) and `last` [N-1, H] (the
    decoder's normed output, whose LM head gives the target's distributions; training's soft
    targets)."""

    tokens: torch.Tensor  # [N] long
    prompt_len: int
    aux: torch.Tensor
    last: torch.Tensor | None = None

    @property
    def output_len(self) -> int:
        return len(self.tokens) - self.prompt_len


def record(model, sequences: Sequence[tuple[Sequence[int], Sequence[int]]], layers: Sequence[int],
           keep_last: bool = True, dtype: torch.dtype = torch.float32) -> list[Recorded]:
    """For each (prompt ids, output ids): one teacher-forced forward of the target over prompt +
    output[:-1] with the hidden states EAGLE-3 reads captured (the later decode loop takes the
    same from its prefill and verify forwards instead)."""
    device = next(model.parameters()).device
    capture = HiddenCapture(model, layers)
    out = []
    try:
        with torch.no_grad():  # not inference_mode: training reads these tensors under autograd
            for prompt, output in sequences:
                tokens = torch.tensor(list(prompt) + list(output), dtype=torch.long)
                hidden = model.get_decoder()(input_ids=tokens[None, :-1].to(device)).last_hidden_state
                aux = capture.take()[0].to("cpu", dtype)
                out.append(Recorded(tokens, len(prompt), aux, hidden[0].to("cpu", dtype) if keep_last else None))
    finally:
        capture.close()
    return out


def depth_logits(head: Eagle3Head, row: Recorded, k: int) -> list[torch.Tensor]:
    """Per depth j < k: the head's draft-vocabulary logits [n-1, draft vocab] for draft j of a
    step starting at each output position t = 1..n-1 (the true tokens fed before it: `chains`)."""
    P, N = row.prompt_len, len(row.tokens)
    at = torch.arange(P - 1, N - 2, device=head.fc.weight.device)  # a step at output t drafts from position P + t - 2
    if len(at) == 0:
        return [torch.zeros(0, head.config.draft_vocab_size) for _ in range(k)]
    aux = row.aux[None].to(head.fc.weight.device, head.fc.weight.dtype)
    with torch.inference_mode():
        return [lg[0] for lg in head.unroll(aux, row.tokens[None].to(at.device), k, at)]


def chains(head: Eagle3Head, rows: Sequence[Recorded], k: int) -> list[list[list[int]]]:
    """Per row, per output position t: the head's greedy chain of k drafts for a step starting at
    t (index 0 empty: prefill commits the first output token), each draft j fed the true tokens
    before it, as only a chain whose earlier drafts all matched matters (greedy: exact)."""
    out = []
    for row in rows:
        logits = depth_logits(head, row, k)
        drafts = torch.stack([head.to_target(lg.argmax(-1)) for lg in logits], dim=1)  # [n-1, k]
        out.append([[]] + drafts.tolist())
    return out


# -- the released format ---------------------------------------------------------------------------
