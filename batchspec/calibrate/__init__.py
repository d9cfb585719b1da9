"""Per-shard calibration: find out on the shard's own prompts whether speculation pays, then choose.

The rule (docs/calibration.md): speculate only when

    (draft time + verify time + coordination time) / committed tokens  <  baseline time per token

by a margin (default 5%), goodput measured at the shard's production batch size. Two ways to get
there, one rule and one record:

    decision        the `calibration:` settings, the `Decision` record, the sample, and the rule
                    (`choose` over measured speedups, `choose_predicted` over predicted ones)
    counterfactual  where acceptance can be computed (the torch engine; n-gram and draft-model
                    arms): one plain run of the sample, every arm predicted from it, a measured
                    confirmation only where it matters
    inflight        the same inside the shard's own batch: one generate call per shard, its
                    control deciding when the sample is done, confirming on the arm's own steps,
                    and watching for drift (engines that switch in flight: torch)
    pricing         each arm's counterfactual acceptance on plain rows and its goodput priced
                    from the worker's cost profile, tied to a measured run (`Anchor`)
    profiling       when and what a worker profiles for it, stopping at the width curve where
                    no arm can pay on it
    worker          what calibration keeps for a worker's life (`WorkerCalibration`): its
                    profile, its keys' last settings, rows and prediction errors
    drift           the same prediction on the rows a shard finishes (in flight: a window of the
                    last ones, every batch of rows), both ways: `switch_on` under "none",
                    `while_speculating` while speculating
    measured        where it cannot (TensorRT-LLM's Eagle3/MTP): every arm measured by running,
                    in paired rounds, within a budget
    builds          engines whose arms are builds: which arms a worker can afford, what they cost

Decisions are plain data (`Decision`), reused for small shards of the same key by shard.py. The
acceptance and cost models live in batchspec.predict; the arm record in batchspec.stats. Data
flows down: shard -> calibrate -> predict -> engine.
"""

from batchspec.calibrate.builds import BuildCost, arms_are_builds, build_cost, plan_builds  # noqa: F401
from batchspec.calibrate.counterfactual import calibrate_counterfactual, counterfactual_ready  # noqa: F401
from batchspec.calibrate.decision import (  # noqa: F401
    CalibrationSettings,
    Decision,
    choose,
    choose_predicted,
    fixed_decision,
    pick_sample,
    speculation_unmeasured,
)
from batchspec.calibrate.drift import switch_on, while_speculating  # noqa: F401
from batchspec.calibrate.measured import calibrate  # noqa: F401
from batchspec.calibrate.pricing import plain_rows, predict_arms  # noqa: F401
from batchspec.calibrate.worker import WorkerCalibration  # noqa: F401
