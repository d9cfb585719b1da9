"""What a step costs, without a clock of its own (the engine measures; this prices).

    costs   the worker's step-cost table: profiled forwards, and the ratio of what the decode
            loop's steps took to them, learned from every step

What each arm would accept comes from the engine, which replays its own drafters
(`Engine.acceptance`, engine/acceptance.py). Data flows down: batchspec.calibrate calls these;
these call only the engine's records.
"""

from batchspec.predict.costs import CostTable, profile_grid  # noqa: F401
