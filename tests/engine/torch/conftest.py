"""Fixtures of the torch engine's tests that more than one module shares."""

import pytest

from tests.engine.torch.eagle3_heads import trained_word_head


@pytest.fixture(scope="session")
def trained(word_models):
    """(engine, plain rows, recorded rows, trained head, its stats): eagle3_heads.trained_word_head."""
    return trained_word_head(word_models)
