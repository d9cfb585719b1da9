"""Per-shard calibration: decide, while a shard runs, which speculative arm pays, if any.

The rule (docs/calibration.md gives each concept with its formula): an arm's speedup over plain
decoding is its counterfactual accepted length times plain decoding's step price over its own,
each price from the worker's cost table learned from the steps it runs; the running arm gives way
to the best arm where that arm's lower bound beats it by the margin (an arm the shard has not
chosen on a batch of its own rows, to another length of its drafter without one); an arm is measured (run for a
few steps) only where its interval straddles the margin because of its price and the rows left
repay the measurement.

    settings        the `calibration:` section, and the `Decision` record of a shard
    counterfactual  every arm's acceptance on rows already decoded (`Tally` per row and arm)
    estimate        every arm's speedup and gain over the running arm, with its uncertainty
    evidence        what a shard's rows say about every arm: the window the rule judges on, the shard's tallies
    controller      the rule (`rule`), applied after every decode step of a shard (`Controller`, engine.base.Control)
    ledger          the steps a shard ran by arm, their cost table, and their price as plain decoding
    segments        the same controller on engines whose arms are builds (a segment of rows per arm)
    worker          what a worker learns over its life (`WorkerState`: cost table, keys' last arms)

Data flows down: shard -> calibrate -> predict -> stats, engine.
"""

from batchspec.calibrate.controller import Controller  # noqa: F401
from batchspec.calibrate.segments import run_segments  # noqa: F401
from batchspec.calibrate.settings import CalibrationSettings, Decision, fixed_decision  # noqa: F401
from batchspec.calibrate.worker import WorkerState  # noqa: F401
