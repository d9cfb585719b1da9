"""The released format of an EAGLE-3 head on disk, as far as telling one apart needs it (no torch):
a folder whose config.json names an Eagle3 architecture (SpecForge's `LlamaForCausalLMEagle3`,
EAGLE's) or carries a `draft_vocab_size`. engine/torch/eagle3.py reads and writes the whole format."""

from __future__ import annotations

import json
from pathlib import Path

CONFIG_FILE = "config.json"
ARCHITECTURE = "LlamaForCausalLMEagle3"  # SpecForge's name, written into a saved head's config.json


def is_head(location: str | Path) -> bool:
    """Whether `location` is a local folder holding an EAGLE-3 head in the released format."""
    try:
        raw = json.loads((Path(location) / CONFIG_FILE).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(raw, dict):
        return False
    return any("eagle3" in str(n).lower() for n in raw.get("architectures") or []) or "draft_vocab_size" in raw
