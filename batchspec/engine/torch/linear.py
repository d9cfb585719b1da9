"""A model's linear layers, each product computed in the fastest of equal forms, as measured on
the machine that loads the model.

A linear layer computes x W^T for x of m rows. `F.linear` hands the BLAS W transposed; the same
sums computed as (W x^T)^T read W in the order it is stored. The BLAS picks a different kernel for
each, and for the few rows of a decode step the difference can be several-fold either way. A
weight in a narrower float (bfloat16, float16) has a third form, the product in float32
(`float32_form`): on a CPU without bfloat16 instructions torch's bfloat16 products are slow, and
widened they take a fraction of the time; for the few rows of a decode step widening costs more
than it saves. The figures behind these forms are in docs/engines/torch.md ("Linear forms").

Such behaviour belongs to one BLAS on one CPU, so nothing here assumes it: `measure_linears`
times every form for every weight shape of the model at the row counts of `ROWS` (every count to
16, where the choice flips back and forth, then a few up to 128, the last standing for a
prefill's hundreds of rows; a count between two measured ones would otherwise take a choice that
is wrong for it) and keeps another form than `F.linear` only where it was faster by a clear
margin (`WIN`). CUDA devices keep `F.linear` (cuBLAS; never measured by this code).

The forms are the same dot products summed in another order: below 16 rows their float32
results differ in the last bits (as between thread counts or batch sizes), at 16 rows and more
they were identical. A greedy output can therefore differ from `F.linear`'s only at a near-tie of
its top two logits (tests/engine/lossless.py), and between two loads only if a shape's choice at
few rows flips, which the margin makes unlikely where the gap is 2-3x.

Measuring takes seconds per load, the same answer every time, so a `FormsCache` keeps the
timings of each weight shape on disk, keyed by everything they belong to: the CPU (vendor,
model, family, stepping, cache; logical CPUs), torch's version and build, the threads in use, the
shape and dtype, how many weights one pass reads, the row counts and the forms measured. A load
on the same machine with the same torch and threads then takes the timings instead of measuring;
anything else measures. The choice is still made here from the timings (`Forms.from_timings`), so
a change of WIN needs no new measurement. A timing measured at a loaded moment is kept until the
folder is removed: delete `$BATCHSPEC_CACHE/linear_forms` to measure again.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F

log = logging.getLogger(__name__)

ROWS = tuple(range(1, 17)) + (20, 24, 32, 48, 64, 128)  # rows per product measured (past the last: its choice)
WIN = 0.9  # another form is kept where it took under this fraction of F.linear's time
COLD_BYTES = 64 << 20  # a timed pass reads this many bytes of weights at least (all there are, if fewer): past a CPU's cache
COMPUTE_BOUND = 64  # from more rows than this a product is bound by arithmetic: one weight per timed pass, one try
RETRY = 2.0  # a form that took more than this times the fastest one's time is not timed again


def linear_form(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x, weight, bias)


def transposed_form(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """(W x^T)^T: the product of `F.linear` with W read as stored, copied back to row-major order
    (left transposed, it made the reshapes and elementwise work after a layer dearer: measured
    at batch 8, 3-9 tokens per row, 3-6% slower forwards than `F.linear`). One row is doubled
    first (with one column the BLAS takes its matrix-vector path, the slower where measured)."""
    flat = x.reshape(-1, x.shape[-1])
    m = flat.shape[0]
    if m == 1:
        flat = flat.repeat(2, 1)
    out = (weight @ flat.T).T[:m].contiguous()  # what follows a layer wants rows contiguous (and measured with the copy)
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], weight.shape[0])


class Widened(threading.local):
    """Float32 buffers to widen weights into, one per weight shape, reused call after call (each
    thread its own: a model may run in several). A fresh `weight.float()` per product was a new
    allocation each time, page faults included: widening SmolLM2's 210 layer weights took 52-322 ms
    that way and 26-35 ms into kept buffers. What this keeps is one float32 copy of each distinct
    weight shape the float32 form has run (SmolLM2-135M: under 10 MB without the vocabulary head,
    113 MB with it; the head is widened only for products of many rows)."""

    def __init__(self) -> None:
        self.buffers: dict[tuple, torch.Tensor] = {}

    def of(self, weight: torch.Tensor) -> torch.Tensor:
        key = (tuple(weight.shape), weight.device)
        buf = self.buffers.get(key)
        if buf is None:  # a normal tensor even under inference mode: a later forward outside it writes here too
            with torch.inference_mode(False):
                buf = self.buffers[key] = torch.empty(weight.shape, dtype=torch.float32, device=weight.device)
        return buf.copy_(weight)


def float32_form(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 widened: Widened | None = None) -> torch.Tensor:
    """x W^T of a narrower float (bfloat16, float16) computed by the float32 BLAS: x and W widened
    (exactly: every bfloat16 or float16 number is a float32 one; W into `widened`'s buffer where
    given), multiplied, and the result rounded back to x's dtype. The products of two such numbers
    are exact in float32 and torch's bfloat16 kernels sum them in float32 too, so the two forms
    differ only in summation order, like the other two (docs/engines/torch.md, "Linear forms").
    On a CPU without bfloat16 instructions the widening pays from a few rows on."""
    wide = widened.of(weight) if widened is not None else weight.float()
    out = F.linear(x.float(), wide, None if bias is None else bias.float())
    return out.to(x.dtype)


FORMS = {"linear": linear_form, "transposed": transposed_form, "float32": float32_form}


def form_of(name: str, widened: Widened) -> Callable:
    """The form called `name`, as (x, weight, bias) -> product; the float32 form widens into `widened`."""
    return partial(FORMS[name], widened=widened) if name == "float32" else FORMS[name]


def forms_for(dtype: torch.dtype) -> tuple[str, ...]:
    """The forms worth timing for weights of `dtype`: widening a float32 weight changes nothing."""
    return ("linear", "transposed") if dtype in (torch.float32, torch.float64) else ("linear", "transposed", "float32")


@dataclass
class Forms:
    """For one weight shape: the row counts measured, the form chosen at each (where it is not
    F.linear) and the timings. A product of a measured count of rows takes that count's choice;
    one between two measured counts takes a form only where both chose it (a choice made at 48
    rows with a 0.89 ratio said nothing of 63, where the same load measured 1.25x); past the last
    count, the last one's choice (the products only grow: a prefill of hundreds of rows takes the
    choice of 128)."""

    rows: tuple[int, ...] = ROWS
    chosen: dict[int, str] = field(default_factory=dict)  # rows -> form, where not "linear"
    timings: dict[int, dict[str, float]] = field(default_factory=dict)  # rows -> form -> seconds

    def __post_init__(self) -> None:
        self._by_rows = [self._choose(m) for m in range(self.rows[-1] + 1)] if self.rows else ["linear"]

    def form(self, m: int) -> str:
        return self._by_rows[min(m, len(self._by_rows) - 1)]

    def _choose(self, m: int) -> str:
        i = max(0, bisect.bisect_right(self.rows, m) - 1)
        here = self.chosen.get(self.rows[i], "linear")
        if self.rows[i] == m or i + 1 == len(self.rows):
            return here
        return here if self.chosen.get(self.rows[i + 1], "linear") == here else "linear"

    @classmethod
    def from_timings(cls, timings: dict[int, dict[str, float]], win: float = WIN) -> "Forms":
        """At each count, the fastest form if it beat F.linear by the margin, else F.linear."""
        rows = tuple(sorted(timings))
        chosen = {}
        for m in rows:
            best = min((t, name) for name, t in timings[m].items() if name != "linear")
            if best[0] < win * timings[m]["linear"]:
                chosen[m] = best[1]
        return cls(rows, chosen, {m: dict(t) for m, t in timings.items()})


class MeasuredLinear(nn.Module):
    """An `nn.Linear`'s own parameters (shared, not copied: tied weights stay tied), computed in
    the form its shape's `Forms` chose for the number of rows at hand."""

    def __init__(self, linear: nn.Linear, forms: Forms, widened: Widened | None = None) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.forms = forms
        self.widened = widened if widened is not None else Widened()  # shared by a model's layers

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = x.numel() // x.shape[-1] if x.shape[-1] else 0
        return form_of(self.forms.form(m), self.widened)(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, forms {self.forms.chosen}"


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


def measure_forms(weights: list[torch.Tensor], biases: list[torch.Tensor | None], rows: tuple[int, ...] = ROWS,
                  tries: int = 2, budget_s: float = 0.002) -> Forms:
    """Time every form of x W^T worth timing for the weights' dtype (`forms_for`) at every row
    count in `rows` and choose. One timed call is a pass over every weight of the shape in the
    model, as a forward makes it: a weight is then read from memory, not from a cache that timing
    one weight over and over would keep it in (a 1536 x 576 product of one row: 0.07 ms hot, 0.30
    ms in a forward). Past COMPUTE_BOUND rows a product is arithmetic, not reading: one weight,
    one try. Tries alternate the forms, so a change of load hits all alike; the fastest try counts.
    A form that took over RETRY times the fastest one's time is not tried again: no second try
    brings it within WIN of it, short of the first having been slowed down twice over (in
    bfloat16 on a CPU without bfloat16 instructions, `F.linear` and (W x^T)^T take 3-5x the
    float32 form's time from about 10 rows on, and timing them twice was most of a load: Qwen2.5-
    Coder-1.5B and its 0.5B draft took minutes)."""
    timings: dict[int, dict[str, float]] = {}
    names = forms_for(weights[0].dtype)
    widened = Widened()
    with torch.inference_mode():
        for m in rows:
            x = torch.randn(1, m, weights[0].shape[1], dtype=weights[0].dtype, device=weights[0].device)
            pass_of = list(zip(weights, biases))[: 1 if m > COMPUTE_BOUND else len(weights)]
            best = dict.fromkeys(names, float("inf"))
            for attempt in range(1 if m > COMPUTE_BOUND else tries):
                for name in names:
                    if attempt and best[name] > RETRY * min(best.values()):
                        continue
                    form = form_of(name, widened)
                    best[name] = min(best[name], _time(lambda: [form(x, w, b) for w, b in pass_of], budget_s))
            timings[m] = best
    return Forms.from_timings(timings)


def machine_identity() -> dict:
    """What a timing belongs to besides the shape: the CPU, torch's version and build, and the
    threads a product runs on now."""
    cpu: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            name, _, value = line.partition(":")
            name = name.strip()
            if name in ("vendor_id", "model name", "cpu family", "model", "stepping", "cache size") and name not in cpu:
                cpu[name] = value.strip()
    except OSError:  # not Linux: the platform's own word for the processor
        import platform

        cpu["processor"] = platform.processor() or platform.machine()
    build = hashlib.sha256(torch.__config__.show().encode()).hexdigest()[:16]
    return {"cpu": cpu, "cpus": os.cpu_count(), "torch": torch.__version__, "build": build, "threads": torch.get_num_threads()}


class FormsCache:
    """Timings of the forms per weight shape, one JSON file per key in `folder` (written whole
    and renamed into place, so concurrent loads never read half a file). A file that cannot be read
    is measured again; one that cannot be written is only logged: a load never fails for it."""

    VERSION = 3  # 1: two forms as (linear, transposed) pairs, rows to 64; 2: the float32 form widened into a fresh tensor

    def __init__(self, folder: Path | str) -> None:
        self.folder = Path(folder)
        self._machine = machine_identity()

    def _path(self, shape: tuple, weights: int, rows: tuple[int, ...], forms: tuple[str, ...]) -> tuple[Path, dict]:
        key = {"version": self.VERSION, "machine": self._machine, "shape": list(shape), "weights": weights,
               "rows": list(rows), "forms": sorted(forms), "cold_bytes": COLD_BYTES, "compute_bound": COMPUTE_BOUND}
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
        return self.folder / f"{digest}.json", key

    def get(self, shape: tuple, weights: int, forms: tuple[str, ...], rows: tuple[int, ...] = ROWS) -> dict[int, dict[str, float]] | None:
        """The stored timings of this shape, if they are of every row count and every form asked for."""
        path, key = self._path(shape, weights, rows, forms)
        try:
            stored = json.loads(path.read_text())
            if stored["key"] != key:
                return None
            timings = {int(m): {str(f): float(t) for f, t in by_form.items()} for m, by_form in stored["timings"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None
        if sorted(timings) != sorted(rows) or any(set(t) != set(forms) for t in timings.values()):
            return None
        return timings

    def put(self, shape: tuple, weights: int, timings: dict[int, dict[str, float]], rows: tuple[int, ...] = ROWS) -> None:
        forms = tuple(next(iter(timings.values()), {}))
        path, key = self._path(shape, weights, rows, forms)
        tmp = None
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=self.folder, suffix=".tmp", delete=False) as tmp:
                json.dump({"key": key, "timings": {str(m): t for m, t in timings.items()}}, tmp)
            os.replace(tmp.name, path)
        except OSError as exc:
            log.warning("linear forms: cannot write the timing cache %s: %s", self.folder, exc)
            if tmp is not None:
                Path(tmp.name).unlink(missing_ok=True)


def measure_linears(model: nn.Module, measure: Callable[[list, list], Forms] = measure_forms,
                    cache: FormsCache | None = None) -> dict:
    """Replace every `nn.Linear` of a model on a CPU by a `MeasuredLinear` whose forms were
    measured for its weight shape (once per shape and dtype, over all the model's weights of that
    shape, or as many as COLD_BYTES needs), or taken from `cache` where it holds that shape's
    timings on this machine (and given them when measured). Returns {(out, in, dtype, bias):
    Forms}. A model on another device is left as it is."""
    linears = [(name, mod) for name, mod in model.named_modules() if type(mod) is nn.Linear]
    if not linears or linears[0][1].weight.device.type != "cpu":
        return {}
    started = time.perf_counter()
    groups: dict[tuple, list[tuple[str, nn.Linear]]] = {}
    for name, mod in linears:
        groups.setdefault((mod.out_features, mod.in_features, str(mod.weight.dtype), mod.bias is not None), []).append((name, mod))
    by_shape: dict[tuple, Forms] = {}
    widened = Widened()  # one set of buffers for the model's layers
    cached = 0
    for key, members in groups.items():
        unique = list({id(mod.weight): mod for _, mod in members}.values())  # a tied weight is read once
        size = unique[0].weight.numel() * unique[0].weight.element_size()
        unique = unique[: max(1, -(-COLD_BYTES // size))]
        timings = cache.get(key, len(unique), forms_for(unique[0].weight.dtype)) if cache is not None else None
        if timings is not None:
            forms = Forms.from_timings(timings)
            cached += 1
        else:
            forms = measure([mod.weight for mod in unique], [mod.bias for mod in unique])
            if cache is not None:
                cache.put(key, len(unique), forms.timings)
        by_shape[key] = forms
        for name, mod in members:
            model.set_submodule(name, MeasuredLinear(mod, forms, widened))
    log.info("linear forms in %.2f s (%d of %d shapes from the cache): %s", time.perf_counter() - started, cached, len(groups),
             {f"{o}x{i}{' +bias' if bias else ''} {dtype}": f.chosen for (o, i, dtype, bias), f in by_shape.items()})
    return by_shape
