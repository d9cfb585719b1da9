"""Cost regimes: what a decode step, a prefill and an arm switch cost on one kind of machine.

A regime prices the simulated clock (clock.py, the clock the replay engine hands the torch engine):
the engine decodes real tokens (real acceptance, batching, admission and draining) while every
second it reports comes from the regime instead of the wall clock. In virtual time every run is deterministic, so a
decision's ratio to the oracle (every arm run over the whole shard) is exact. Figures made on a
regime are simulated, never measurements; docs/simulator.md gives each regime's constants and
the measurements or datasheets behind them.

One formula serves every regime (a roofline with a floor):

    forward(rows, width, context) = launch + max(memory, compute)
        memory  = weight_s + rows * context * kv_s            (weights and the KV cache read once)
        compute = rows * width * (token_s + context * attend_s)
    step = forward(rows, 1 + k, context)                       the verify (or plain) forward
         + k * (launch + draft_fraction * (forward(rows, 1, context) - launch))
                                                               a draft model's k steps, each its own launch
         + k * head_fraction * forward(rows, 1, context)       or an EAGLE-3 head's k forwards
         + rows * bookkeeping(method, k)                       the engine's own work per row
    prefill(tokens) = forward(1, tokens, 0)
    switch(method)  = build_s                                  an arm change that rebuilds (TensorRT-LLM)
    profile point   = forward(rows, width, context)            a draft model's: draft_fraction x forward,
                                                               a head's: head_fraction x forward
Where drafts are padded (TensorRT-LLM's CUDA graphs), a speculative step is as wide as its arm's
draft whether or not its rows proposed.

A launch-bound engine (the torch engine on a GPU) has a large `launch`; a CPU is compute-bound
(`weight_s` 0); a tuned GPU engine on an 8B model is memory-bound up to a few hundred tokens a step.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Collection, Sequence

from batchspec.engine.base import StepCost
from batchspec.errors import ConfigError


@dataclass(frozen=True)
class StepSeconds:
    """One simulated decode step, split as `Timing` splits a measured one."""

    draft_s: float
    verify_s: float
    other_s: float

    @property
    def total(self) -> float:
        return self.draft_s + self.verify_s + self.other_s


@dataclass(frozen=True)
class Regime:
    """A machine's costs, in seconds (see the module docstring for the formula)."""

    name: str
    description: str
    launch_s: float  # fixed cost of one forward (kernel launches, the framework's own work)
    weight_s: float  # reading the weights once (weights / memory bandwidth); 0 where compute-bound
    kv_s: float  # reading one cached token of one row (KV bytes per token / bandwidth)
    token_s: float  # computing one token (2 x parameters / achieved FLOP/s)
    attend_s: float  # attention's extra compute per token per token of context
    draft_fraction: float = 0.1  # a draft model's forward, as a fraction of the target's (beyond launch)
    # an EAGLE-3 head's forward (one decoder layer, its fc and a reduced-vocabulary LM head), as a
    # fraction of the target's: the share of an 8B target's forward on a GPU (docs/simulator.md)
    head_fraction: float = 0.05
    # the engine's own work per row and decode step: plain, and a drafter's (fixed + per draft token)
    row_s: float = 0.0
    drafter_row_s: dict[str, tuple[float, float]] = field(default_factory=dict)
    build_s: float = 0.0  # seconds to build an engine for another arm (0: arms switch in flight)
    pads_drafts: bool = False  # every speculative step verifies the arm's full draft (CUDA graphs)

    def forward_s(self, rows: int, width: int, context: int) -> float:
        memory = self.weight_s + rows * context * self.kv_s
        compute = rows * width * (self.token_s + context * self.attend_s)
        return self.launch_s + max(memory, compute)

    def step(self, rows: int, width: int, context: int, method: str = "none") -> StepSeconds:
        """A decode step of `rows` rows verifying `width - 1` drafts each (width 1: plain)."""
        k = width - 1
        verify = self.forward_s(rows, width, context)
        draft = 0.0
        fixed, per_token = self.drafter_row_s.get(method, (0.0, 0.0)) if method != "none" else (0.0, 0.0)
        if method == "draft_target" and k:
            one = self.forward_s(rows, 1, context)
            draft += k * (self.launch_s + self.draft_fraction * (one - self.launch_s))
        if method == "eagle3" and k:  # k sequential forwards of the head, each one depth of every row's chain
            draft += k * self.head_fraction * self.forward_s(rows, 1, context)
        draft += rows * (fixed + per_token * k)
        return StepSeconds(draft, verify, rows * self.row_s)

    def prefill_s(self, tokens: int) -> float:
        return self.forward_s(1, max(1, tokens), 0)

    def switch_s(self, method: str) -> float:
        """An arm switch: a rebuild where arms are builds, else nothing (a drafter admits the rows)."""
        return self.build_s

    def profile(self, model: str, target: Sequence[tuple[int, int, int]],
                drafts: Sequence[tuple[str, int, int, int]] = (), heads: Collection[str] = ()) -> list[StepCost]:
        """A cost profile's points (`Engine.profile`), each the price of its forward; a draft named in
        `heads` is an EAGLE-3 head's (its fraction of the target's forward is `head_fraction`)."""
        fraction = {d: self.head_fraction if d in heads else self.draft_fraction for d, *_ in drafts}
        return [StepCost("target", model, b, c, w, self.forward_s(b, w, c)) for b, c, w in target] + \
               [StepCost("draft", d, b, c, w, fraction[d] * self.forward_s(b, w, c)) for d, b, c, w in drafts]


# The torch engine's own work per row and step (the accept rule, commit, n-gram lookup): measured
# on a CPU host; the same Python runs on a GPU machine's host (docs/simulator.md, "Regimes").
TORCH_ROW_S = 85e-6
TORCH_DRAFTERS = {"ngram": (176e-6, 41e-6), "draft_target": (40e-6, 10e-6), "suffix": (200e-6, 41e-6)}

# An 8B-class target (Llama-3.1-8B: 8.03e9 parameters in bf16, 32 layers, 8 KV heads of 128) on
# an H100 SXM (3.35 TB/s HBM3, 989 TFLOP/s dense bf16 at 80% achieved).
_8B_WEIGHTS, _8B_KV_PER_TOKEN, _8B_FLOPS_PER_TOKEN, _8B_ATTEND = 16.06e9, 131072, 2 * 8.03e9, 4 * 32 * 4096
_H100_BW, _H100_FLOPS = 3.35e12, 0.8 * 989e12

_ROOFLINE = Regime(
    "gpu-roofline", "an 8B-class target on an H100 in a tuned engine: memory-bound, a verify of k+1 tokens "
    "about 1.0-1.3 plain steps up to batch 32",
    launch_s=0.8e-3, weight_s=_8B_WEIGHTS / _H100_BW, kv_s=_8B_KV_PER_TOKEN / _H100_BW,
    token_s=_8B_FLOPS_PER_TOKEN / _H100_FLOPS, attend_s=_8B_ATTEND / _H100_FLOPS, draft_fraction=0.1,
    row_s=5e-6, drafter_row_s={"ngram": (15e-6, 1e-6), "draft_target": (5e-6, 0.0), "suffix": (25e-6, 2e-6)},
)

REGIMES: dict[str, Regime] = {
    r.name: r
    for r in (
        Regime(
            "cpu", "the packaged SmolLM2-135M in float32 on a 2-core x86 CPU, 2 torch threads: compute-bound",
            launch_s=0.0247, weight_s=0.0, kv_s=0.0, token_s=2.08e-3, attend_s=2.35e-6, draft_fraction=0.35,
            head_fraction=0.04,  # one layer of its 30, fc and LM head: drafts 6-8% of decode at k=2 (docs/simulator.md)
            row_s=TORCH_ROW_S, drafter_row_s=TORCH_DRAFTERS,
        ),
        Regime(
            "h200-torch", "the torch engine on an H200 in eager mode (an 8B shape): launch-bound, about 26 ms a "
            "forward up to about 150 tokens a step at any width, growing beyond",
            launch_s=0.0165, weight_s=0.0095, kv_s=0.0, token_s=6.5e-5, attend_s=0.0, draft_fraction=0.9,
            row_s=TORCH_ROW_S, drafter_row_s=TORCH_DRAFTERS,
        ),
        _ROOFLINE,
        replace(  # the same target and GPU under TensorRT-LLM
            _ROOFLINE, name="trtllm", description="gpu-roofline under TensorRT-LLM: CUDA graphs, and each arm an "
            "engine build (90 s) with one live engine per worker",
            launch_s=0.4e-3, row_s=2e-6, build_s=90.0, pads_drafts=True,
            drafter_row_s={"ngram": (20e-6, 1e-6), "draft_target": (2e-6, 0.0), "suffix": (30e-6, 2e-6)},
        ),
    )
}


def regime(name: str) -> Regime:
    """The regime called `name`; a one-line error naming the known ones otherwise."""
    if name not in REGIMES:
        raise ConfigError(f"unknown cost regime {name!r}; known: {', '.join(REGIMES)}")
    return REGIMES[name]
