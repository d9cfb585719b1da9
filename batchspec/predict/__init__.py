"""Acceptance and cost models: what an arm would deliver, without running it. No clock in any of
them (the engine measures; these replay and price).

    acceptance   counterfactual acceptance: from a row decoded under "none", the accepted length of
                 every step each arm would have taken, every draft length at once (exact for greedy)
    cost         the worker's cost profile: step costs the engine measured, priced at any shape
    replay       the replay of a sample's schedule that prices an arm from the profile
    probe        goodput at other draft lengths from one measured probe (Leviathan et al.), for
                 arms that must be measured by running (TensorRT-LLM's Eagle3 and MTP)

Data flows down: batchspec.calibrate calls these; these call only the engine's own functions
(`drafters.NgramIndex`, `sampling.probs_from_logits`) and the records in batchspec.stats.
"""

from batchspec.predict.acceptance import (  # noqa: F401
    Acceptance,
    PlainRow,
    draft_acceptance,
    expected_walk,
    greedy_runs,
    ngram_acceptance,
    ngram_runs,
    walk,
)
from batchspec.predict.cost import CostProfile, profile_grid  # noqa: F401
from batchspec.predict.replay import Predicted, RowPlan, predict_decode_s  # noqa: F401
from batchspec.predict.probe import (  # noqa: F401
    acceptance_from_mean_len,
    expected_tokens_per_step,
    predict_tokens_per_s,
    tokens_per_step,
)
