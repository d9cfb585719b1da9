"""The target's hidden states EAGLE-3 reads (the head's module: eagle3.py): the inputs of its low,
middle and high decoder layers, captured by hooks on the forwards the decode loop runs anyway
(`HiddenCapture`) or by one teacher-forced forward (`record`), and a row as the head needs it
(`Recorded`). It knows the target's decoder layers; nothing about the head or requests.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch


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
