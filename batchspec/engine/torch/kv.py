"""A batched KV cache whose rows advance by different amounts, for speculative decoding.

Every forward appends the same number of slots T to every row (the padded width of that step),
but each row then keeps only some of them: its accepted drafts, or its real tokens when it had
fewer than T. Rejected and padding slots stay in memory as holes, marked invalid in `valid`, and
every later query is masked from them. Positions (for RoPE) count valid tokens only, so a row
with holes computes exactly what it would without them. `compact()` squeezes holes out when they
outweigh the tokens.

`Batch` knows nothing about drafting or sampling; it owns the cache, the mask and the positions,
and can drop finished rows and take in newly prefilled ones (continuous batching).
"""

from __future__ import annotations

import inspect
import weakref

import torch
from transformers.cache_utils import Cache, DynamicLayer


class SlotLayer(DynamicLayer):
    """One layer's keys and values in preallocated buffers [row capacity, heads, slot capacity,
    dim] that grow by doubling; the cache is the first `rows` rows and `length` slots.

    Appending is a copy of the new slots only (DynamicLayer's torch.cat copies the whole cache
    every step). Rows come and go the same way (continuous batching): a finished row's place is
    taken by a row copied from the end (`take` with `moves_in_place` indices), and new rows are
    copied into free rows, so a row that finishes or joins moves one row's cache, not the batch's
    (before: two copies of the whole cache each time, one to gather, one to regrow)."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.length = 0
        self.rows = key_states.shape[0]
        self.k_buf = key_states.new_zeros(key_states.shape[:2] + (0,) + key_states.shape[3:])
        self.v_buf = value_states.new_zeros(value_states.shape[:2] + (0,) + value_states.shape[3:])
        self.is_initialized = True

    @classmethod
    def holding(cls, keys: torch.Tensor, values: torch.Tensor, length: int | None = None) -> "SlotLayer":
        """A layer whose buffers are `keys`/`values` [rows, heads, capacity, dim] (taken, not
        copied), its cache their first `length` slots (all of them by default)."""
        layer = cls()
        layer.lazy_initialization(keys, values)
        layer.k_buf, layer.v_buf = keys, values
        layer.length = keys.shape[2] if length is None else length
        return layer

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        assert key_states.shape[0] == self.rows, (key_states.shape, self.rows)
        end = self.length + key_states.shape[-2]
        self._reserve(self.rows, end)
        self.k_buf[: self.rows, :, self.length : end] = key_states
        self.v_buf[: self.rows, :, self.length : end] = value_states
        self.length = end
        return self.keys, self.values

    @property
    def keys(self) -> torch.Tensor:
        return self.k_buf[: self.rows, :, : self.length]

    @keys.setter
    def keys(self, value) -> None:  # DynamicLayer.__init__ assigns None
        pass

    @property
    def values(self) -> torch.Tensor:
        return self.v_buf[: self.rows, :, : self.length]

    @values.setter
    def values(self, value) -> None:
        pass

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def _reserve(self, rows: int, slots: int) -> None:
        """Make room for `rows` rows of `slots` slots, doubling a capacity that is too small. Room
        is zeros, never uninitialized memory: a hole is masked, and a masked NaN would still
        poison attention (its weight is 0, and 0 x NaN is NaN)."""
        have_rows, have_slots = self.k_buf.shape[0], self.k_buf.shape[2]
        if rows <= have_rows and slots <= have_slots:
            return
        rows = have_rows if rows <= have_rows else max(rows, 2 * have_rows)
        slots = have_slots if slots <= have_slots else max(slots, 2 * have_slots, 64)

        def grow(buf: torch.Tensor) -> torch.Tensor:
            out = buf.new_zeros((rows, buf.shape[1], slots, buf.shape[3]))
            out[: self.rows, :, : self.length] = buf[: self.rows, :, : self.length]
            return out

        self.k_buf, self.v_buf = grow(self.k_buf), grow(self.v_buf)

    def take(self, rows: list[int] | None, slots: torch.Tensor | None, length: int) -> None:
        """Keep `rows` (batch indices, in that order) and, per row, the slot indices `slots`
        [B, length]. Rows that `moves_in_place` allows are moved in place (only the rows that
        change place are copied); anything else is gathered into buffers of the present capacity."""
        moves = moves_in_place(rows) if rows is not None and slots is None else None
        if moves is not None:
            for to, frm in zip(*moves):  # the live slots only (a slice copy; fancy indexing is 10x slower on CPU)
                self.k_buf[to, :, :length].copy_(self.k_buf[frm, :, :length])
                self.v_buf[to, :, :length].copy_(self.v_buf[frm, :, :length])
            self.rows, self.length = len(rows), length
            return
        k, v = self.keys, self.values
        if rows is not None:
            index = torch.tensor(rows, device=k.device)
            k, v = k[index], v[index]
        if slots is not None:
            idx = slots[:, None, :, None].expand(-1, k.shape[1], -1, k.shape[3])
            k, v = k.gather(2, idx), v.gather(2, idx)
        self.rows, self.length = k.shape[0], length
        for name, part in (("k_buf", k), ("v_buf", v)):
            buf = getattr(self, name)
            out = buf.new_zeros((max(buf.shape[0], k.shape[0]), buf.shape[1], max(buf.shape[2], length), buf.shape[3]))
            out[: k.shape[0], :, :length] = part
            setattr(self, name, out)

    def append_rows(self, other: "SlotLayer") -> None:
        """Put `other`'s rows after ours, in free rows of the buffers where there is room. A row
        shorter than the other rows gets slots it never wrote (stale or zero), which Batch marks
        invalid."""
        rows, length = self.rows + other.rows, max(self.length, other.length)
        self._reserve(rows, length)
        self.k_buf[self.rows : rows, :, : other.length] = other.keys
        self.v_buf[self.rows : rows, :, : other.length] = other.values
        self.rows, self.length = rows, length


def moves_in_place(rows: list[int]) -> tuple[list[int], list[int]] | None:
    """For keeping batch rows `rows` (in that order): (destinations, sources) of the rows that
    change place, when every kept row either stays where it is or comes from past the new end
    (so no source is overwritten before it is read); else None (a general gather)."""
    n = len(rows)
    to = [i for i, r in enumerate(rows) if r != i]
    frm = [rows[i] for i in to]
    if any(r < n for r in frm) or len(set(rows)) != n:
        return None
    return to, frm


def survivors(finished: list[bool]) -> list[int]:
    """The rows to keep when the rows flagged in `finished` leave a batch, in an order that
    `moves_in_place` moves in place: a row that stays keeps its place, and each place a finished
    row leaves below the new end is taken by a surviving row from past it."""
    keep = len(finished) - sum(finished)
    tail = iter([i for i in range(keep, len(finished)) if not finished[i]])
    return [next(tail) if finished[i] else i for i in range(keep)]


_FORWARD_PARAMS: "weakref.WeakKeyDictionary[torch.nn.Module, frozenset[str]]" = weakref.WeakKeyDictionary()


def _forward_params(model) -> frozenset[str]:
    """The names `model.forward` takes (read once per model)."""
    params = _FORWARD_PARAMS.get(model)
    if params is None:
        params = _FORWARD_PARAMS[model] = frozenset(inspect.signature(model.forward).parameters)
    return params


def _takes_logits_to_keep(model) -> bool:
    return "logits_to_keep" in _forward_params(model)


def _cache_arg(model) -> str:
    """The name the model's forward takes its KV cache by: `cache` from transformers 5.2x on (where
    `past_key_values` is deprecated), `past_key_values` before (5.17 takes no `cache`: passed so,
    the cache went into **kwargs unused and every step attended to its own tokens only)."""
    return "cache" if "cache" in _forward_params(model) else "past_key_values"


class SlotCache(Cache):
    def __init__(self) -> None:
        super().__init__(layer_class_to_replicate=SlotLayer)


class Batch:
    """The running rows of one model: cache, valid-slot mask [B, L] and positions [B]."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cache = SlotCache()
        self.valid = torch.zeros(0, 0, dtype=torch.bool, device=device)
        self.positions = torch.zeros(0, dtype=torch.long, device=device)  # valid tokens per row

    @property
    def size(self) -> int:
        return self.valid.shape[0]

    @property
    def slots(self) -> int:
        return self.valid.shape[1]

    @property
    def dense(self) -> bool:
        """No holes: every row's slots are all valid (so every row has the same length)."""
        return bool(self.valid.all())

    def forward(self, model, tokens: list[list[int]], pad_id: int = 0, last_only: bool = False) -> torch.Tensor:
        """Append each row's tokens (right-padded to the longest) and return logits [B, T, V], or
        with `last_only` the logits after each row's last real token [B, V] (the head runs on
        those positions only: a prefill needs no others).

        Padding slots are appended as valid and must be dropped by the caller's `keep()`; a real
        token never sees them (they come after it)."""
        assert len(tokens) == self.size or self.size == 0, (len(tokens), self.size)
        if self.size == 0:
            self.valid = torch.zeros(len(tokens), 0, dtype=torch.bool, device=self.device)
            self.positions = torch.zeros(len(tokens), dtype=torch.long, device=self.device)
        width = max(len(t) for t in tokens)
        ids = torch.tensor([t + [pad_id] * (width - len(t)) for t in tokens], device=self.device)
        extra: dict = {}
        if last_only:  # a prefill's: each row's last position (a decode step keeps every position)
            last = [len(t) - 1 for t in tokens]
            kept = sorted(set(last))
        if last_only and _takes_logits_to_keep(model):
            # An int (the last position) where every row ends there, else the positions any row
            # ends at, for every row (a 1D tensor): forms every transformers 5.x takes. A 2D
            # tensor of per-row positions is read so only by later releases (5.25: 5.17 indexed
            # it as [B, B, 1, H] and broke the first GPU prefill of rows of unequal length).
            extra["logits_to_keep"] = 1 if len(kept) == 1 else torch.tensor(kept, device=self.device)
        extra[_cache_arg(model)] = self.cache
        out = model(input_ids=ids, **self._attention_inputs(width), use_cache=True, **extra)
        self.valid = torch.cat([self.valid, torch.ones(self.size, width, dtype=torch.bool, device=self.device)], 1)
        self._appended = width
        logits = out.logits
        if not last_only:
            return logits
        if "logits_to_keep" in extra:
            if len(kept) == 1:
                return logits[:, -1]
            at = {p: i for i, p in enumerate(kept)}
            return logits[torch.arange(len(tokens)), torch.tensor([at[p] for p in last])]
        return logits[torch.arange(len(tokens)), torch.tensor(last)]

    def _attention_inputs(self, width: int) -> dict:
        """Mask and positions for `width` new slots per row. With holes, an explicit mask. Without
        holes (a fresh batch, or rows that kept every slot) the model's own causal mask is exact
        and no mask is passed, except for one new token per row on a CPU: there transformers'
        SDPA path folds a single query's head groups onto the key/value heads when a mask is
        given (`pack_gqa`), but without one asks torch for `enable_gqa`, whose CPU kernel is
        slower at long contexts (SmolLM2, bfloat16, 1 thread, 400 tokens of context: a batch-8
        step 0.31 s without a mask, 0.20 s with one; equal at 88 tokens)."""
        new = torch.arange(width, device=self.device)
        position_ids = self.positions[:, None] + new[None, :]
        if self.slots == 0 or self.dense and not (width == 1 and self.device.type == "cpu"):
            return {"position_ids": position_ids}
        past = self.valid[:, None, None, :].expand(-1, 1, width, -1)
        causal = (new[None, :] <= new[:, None])[None, None].expand(self.size, 1, -1, -1)
        return {"position_ids": position_ids, "attention_mask": torch.cat([past, causal], dim=-1)}  # [B, 1, T, L + T]

    def keep(self, counts: torch.Tensor) -> None:
        """Of the slots the last forward appended, keep the first counts[b] for row b. Slots that
        no row keeps are cut off the end rather than left as holes."""
        width = self._appended
        cut = width - int(counts.max()) if self.size else 0
        self._cut(cut)
        width -= cut
        new = torch.arange(width, device=self.device)[None, :]
        self.valid[:, self.slots - width :] = new < counts[:, None]
        self.positions = self.positions + counts

    def _cut(self, n: int) -> None:
        """Forget the last n slots of every row."""
        if n:
            self.valid = self.valid[:, : self.slots - n]
            for layer in self.cache.layers:
                layer.length -= n

    def drop_last(self, counts: torch.Tensor) -> None:
        """Invalidate the last counts[b] valid tokens of row b (draft tokens the target rejected)."""
        if not bool((counts > 0).any()):
            return
        if bool((counts == counts[0]).all()) and self.dense:  # the same last slots of every row: cut them
            self._cut(int(counts[0]))
            self.positions = self.positions - counts
            return
        seen = self.valid.long().cumsum(1)
        self.valid &= ~(seen > (self.positions - counts)[:, None])
        self.positions = self.positions - counts

    def select(self, rows: list[int]) -> None:
        """Keep only `rows` (indices into the batch), in that order; `survivors` gives an order
        in which only the rows that change place are copied."""
        index = torch.tensor(rows, dtype=torch.long, device=self.device)
        self.valid, self.positions = self.valid[index], self.positions[index]
        for layer in self.cache.layers:
            layer.take(rows, None, layer.length)

    def fork(self, rows: torch.Tensor, slots: int, room: int = 0) -> "Batch":
        """A new batch of copies of `rows`, each cut to its first `slots` slots (this batch must
        have no holes there). This batch is left as it was: one prefilled row can seed probes of
        any batch size and any shorter context. With `room`, the copies' buffers have room for
        that many more slots, so a forward appends into them as a decode step does, instead of
        regrowing (copying) the whole cache as decode does only when its capacity doubles; a
        probe that regrew would time a copy no decode step pays. The copy is made once, into
        buffers of exactly `slots + room`: a fork is paid once per probe group, and it costs a
        fraction of a forward (docs/engines/torch.md, "The cost profile's probes")."""
        assert bool(self.valid[rows, :slots].all()), "fork needs rows without holes in their first slots"
        out = Batch(self.device)
        for layer in self.cache.layers:
            out.cache.layers.append(SlotLayer.holding(_copied(layer.keys, rows, slots, room),
                                                      _copied(layer.values, rows, slots, room), slots))
        out.valid = self.valid[rows, :slots].clone()
        out.positions = torch.full((len(rows),), slots, dtype=torch.long, device=self.device)
        return out

    def repeated(self, slots: int) -> "Batch":
        """A batch of this one's rows (without holes) whose caches repeat their slots up to `slots`:
        a cost probe's stand-in for rows prefilled to that length, made without their prefill. A
        forward's cost depends on the cache's shape, not its values; its logits are meaningless."""
        assert self.size and self.dense, "repeated needs rows without holes"
        have = self.slots
        times = -(-slots // have)
        out = Batch(self.device)
        for layer in self.cache.layers:
            out.cache.layers.append(SlotLayer.holding(layer.keys.repeat(1, 1, times, 1)[:, :, :slots].contiguous(),
                                                      layer.values.repeat(1, 1, times, 1)[:, :, :slots].contiguous()))
        out.valid = torch.ones(self.size, slots, dtype=torch.bool, device=self.device)
        out.positions = torch.full((self.size,), slots, dtype=torch.long, device=self.device)
        return out

    def extend(self, other: "Batch") -> None:
        """Take in `other`'s rows (freshly prefilled) after ours."""
        if other.size == 0:
            return
        if self.size == 0:
            self.cache, self.valid, self.positions = other.cache, other.valid, other.positions
            return
        width = max(self.slots, other.slots)
        pad = lambda v: torch.nn.functional.pad(v, (0, width - v.shape[1]))  # noqa: E731
        self.valid = torch.cat([pad(self.valid), pad(other.valid)])
        self.positions = torch.cat([self.positions, other.positions])
        for mine, theirs in zip(self.cache.layers, other.cache.layers):
            mine.append_rows(theirs)

    def compact(self, slack: float = 2.0) -> None:
        """Squeeze holes out when the cache holds `slack` times more slots than the longest row."""
        longest = int(self.positions.max()) if self.size else 0
        if self.slots <= slack * longest + 64:
            return
        # Stable sort puts each row's valid slots first, in their original order.
        order = torch.sort((~self.valid).to(torch.int8), dim=1, stable=True).indices[:, :longest]
        for layer in self.cache.layers:
            layer.take(None, order, longest)
        self.valid = torch.arange(longest, device=self.device)[None, :] < self.positions[:, None]


def prefill_groups(lengths: list[int], waste: float) -> list[range]:
    """Cut rows (in order) into runs prefilled together, each padding at most `waste` of its real
    tokens (rows sorted by length make long runs). waste 0 groups equal lengths only."""
    groups: list[range] = []
    begin = 0
    while begin < len(lengths):
        end, total = begin + 1, lengths[begin]
        while end < len(lengths):
            longest, tokens = max(lengths[begin : end + 1]), total + lengths[end]
            if longest * (end + 1 - begin) - tokens > waste * tokens:
                break
            end, total = end + 1, tokens
        groups.append(range(begin, end))
        begin = end
    return groups


def prefill(model, prompts: list[list[int]], pad_id: int, device: torch.device, waste: float) -> tuple[Batch, torch.Tensor]:
    """A new Batch holding `prompts`, and the logits after each prompt's last token [N, V].

    Rows are prefilled in groups that pad little (`prefill_groups`), each with the model's own
    causal mask and the head run on the last positions only."""
    batch, last = Batch(device), []
    for group in prefill_groups([len(p) for p in prompts], waste):
        part = Batch(device)
        rows = [prompts[i] for i in group]
        last.append(part.forward(model, rows, pad_id, last_only=True))
        part.keep(torch.tensor([len(r) for r in rows], device=device))
        batch.extend(part)
    return batch, torch.cat(last)


def prefill_waste(device: torch.device) -> float:
    """Padding a prefill may carry. On a CPU time grows with tokens, so batching rows of unequal
    length only adds padded work: equal lengths only. On a GPU one wide forward beats several."""
    return 0.0 if device.type == "cpu" else 0.1


def _copied(buf: torch.Tensor, rows: torch.Tensor, slots: int, room: int) -> torch.Tensor:
    """Rows `rows` of a cache tensor [rows, heads, slots, dim], their first `slots` slots, copied
    once into a buffer with `room` more slots, zeros (never uninitialized memory: `_reserve`)."""
    out = buf.new_empty((len(rows), buf.shape[1], slots + room, buf.shape[3]))
    for i, r in enumerate(rows.tolist()):
        out[i, :, :slots] = buf[r, :, :slots]
    out[:, :, slots:] = 0
    return out
