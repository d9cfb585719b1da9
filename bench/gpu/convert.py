"""Device call B: SmolLM2's rejoined GGUF -> a Hugging Face folder, as batchspec.models prepares it."""
import sys
from pathlib import Path

sys.path.insert(0, ".")
from batchspec.models import REGISTRY, _convert  # noqa: E402

gguf, out = Path(sys.argv[1]), Path(sys.argv[2])
_convert(REGISTRY["smollm2-135m"], gguf, out)
print("converted", sorted(p.name for p in out.iterdir()))
