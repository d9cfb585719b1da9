"""A model's linear layers, each product computed in the faster of two equal forms, as measured on
this machine when the model is loaded.

A linear layer computes x W^T for x of m rows. `F.linear` hands the BLAS W transposed; the same
sums computed as (W x^T)^T read W in the order it is stored. The BLAS picks a different kernel for
each, and for the few rows of a decode step the difference can be large. Measured with MKL's
float32 sgemm on a 2-core CPU (torch 2.13, SmolLM2-135M): the vocabulary head (49152 x 576) took
36.8 ms for 3 rows as `F.linear` and 4.3 ms as (W x^T)^T, 17.5 against 7.3 ms for 8 rows; an MLP
projection (1536 x 576) 0.20 against 0.14 ms for 3 rows and about the same for 8. A verify forward
of 3 tokens at batch 1 went from 120 to 55 ms, a plain step at batch 8 from 84 to 75 ms. In
bfloat16 the same machine's kernels favour `F.linear`. Such behaviour belongs to one BLAS on one
CPU, so nothing here assumes it: `measure_linears` times both forms for every weight shape of the
model at row counts 1..128 and keeps (W x^T)^T only where it was faster by a clear margin. CUDA
devices keep `F.linear` (cuBLAS; not measured: no GPU in this work).

The two forms are the same dot products; their float32 results may differ in the last bit where
the kernels sum in another order, as between any two batch sizes (tests/engine/lossless.py).
"""

from __future__ import annotations

import bisect
import logging
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F

log = logging.getLogger(__name__)

ROWS = (1, 2, 3, 4, 8, 16, 32, 64, 128)  # rows per product measured; more than the last: F.linear
WIN = 0.9  # (W x^T)^T is kept where it took under this fraction of F.linear's time


def linear_form(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x, weight, bias)


def transposed_form(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """(W x^T)^T: the product of `F.linear` with W read as stored. One row is doubled first (with
    one column the BLAS takes its matrix-vector path, the slower of the two where measured)."""
    flat = x.reshape(-1, x.shape[-1])
    m = flat.shape[0]
    if m == 1:
        flat = flat.repeat(2, 1)
    out = (weight @ flat.T).T[:m]
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], weight.shape[0])


@dataclass
class Forms:
    """For one weight shape: the row counts measured, and at which of them (W x^T)^T won. A product
    of m rows takes the choice of the largest measured count not above m; past the last, F.linear."""

    rows: tuple[int, ...] = ROWS
    transposed: frozenset[int] = frozenset()
    timings: dict[int, tuple[float, float]] = field(default_factory=dict)  # rows -> (linear s, transposed s)

    def use_transposed(self, m: int) -> bool:
        if m > self.rows[-1]:
            return False
        return self.rows[max(0, bisect.bisect_right(self.rows, m) - 1)] in self.transposed

    @classmethod
    def from_timings(cls, timings: dict[int, tuple[float, float]], win: float = WIN) -> "Forms":
        rows = tuple(sorted(timings))
        return cls(rows, frozenset(m for m in rows if timings[m][1] < win * timings[m][0]), dict(timings))


class MeasuredLinear(nn.Module):
    """An `nn.Linear`'s own parameters (shared, not copied: tied weights stay tied), computed in
    the form its shape's `Forms` chose for the number of rows at hand."""

    def __init__(self, linear: nn.Linear, forms: Forms) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.forms = forms

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = x.numel() // x.shape[-1] if x.shape[-1] else 0
        form = transposed_form if self.forms.use_transposed(m) else linear_form
        return form(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, transposed at rows {sorted(self.forms.transposed)}"


def _time(fn: Callable[[], object], budget_s: float) -> float:
    """Seconds per call of `fn`: one call, or where that took under `budget_s` the mean of enough
    more to fill it."""
    t = time.perf_counter()
    fn()
    once = time.perf_counter() - t
    if once >= budget_s:
        return once
    n = min(50, int(budget_s / max(once, 1e-6)))
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n


def measure_forms(weight: torch.Tensor, bias: torch.Tensor | None, rows: tuple[int, ...] = ROWS,
                  tries: int = 2, budget_s: float = 0.002) -> Forms:
    """Time both forms of x W^T for every row count in `rows` (tries alternate the forms, so a
    change of load hits both alike; the fastest try counts) and choose."""
    timings = {}
    with torch.inference_mode():
        for m in rows:
            x = torch.randn(1, m, weight.shape[1], dtype=weight.dtype, device=weight.device)
            best = [float("inf"), float("inf")]
            for _ in range(tries):
                for i, form in enumerate((linear_form, transposed_form)):
                    best[i] = min(best[i], _time(lambda: form(x, weight, bias), budget_s))
            timings[m] = (best[0], best[1])
    return Forms.from_timings(timings)


def measure_linears(model: nn.Module, measure: Callable[[torch.Tensor, torch.Tensor | None], Forms] = measure_forms) -> dict:
    """Replace every `nn.Linear` of a model on a CPU by a `MeasuredLinear` whose forms were
    measured for its weight shape (once per shape and dtype). Returns {(out, in, dtype): Forms}.
    A model on another device is left as it is."""
    linears = [(name, mod) for name, mod in model.named_modules() if type(mod) is nn.Linear]
    if not linears or linears[0][1].weight.device.type != "cpu":
        return {}
    started = time.perf_counter()
    by_shape: dict[tuple, Forms] = {}
    for name, mod in linears:
        key = (mod.out_features, mod.in_features, str(mod.weight.dtype), mod.bias is not None)
        if key not in by_shape:
            by_shape[key] = measure(mod.weight, mod.bias)
        parent_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, attr, MeasuredLinear(mod, by_shape[key]))
    log.info("linear forms measured in %.2f s: %s", time.perf_counter() - started,
             {k[:2]: sorted(f.transposed) for k, f in by_shape.items()})
    return by_shape
