"""What an arm would deliver, without running it. No clock in any of it (the engine measures;
these replay and price).

    acceptance   counterfactual acceptance: from a row decoded under any arm (greedy), the
                 accepted length of every step each arm would have taken, every draft length at once
    costs        the worker's step-cost table: profiled forwards, and the ratio of what the decode
                 loop's steps took to them, learned from every step

Data flows down: batchspec.calibrate calls these; these call only the engine's own functions
(`drafters.NgramIndex`, `sampling.probs_from_logits`) and its records.
"""

from batchspec.predict.acceptance import Acceptance, PlainRow, draft_acceptance, ngram_acceptance, proposal_acceptance  # noqa: F401
from batchspec.predict.costs import CostTable, profile_grid  # noqa: F401
