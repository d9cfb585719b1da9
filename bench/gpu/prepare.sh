#!/usr/bin/env bash
# Build, on this machine, what a 15-minute GPU loan needs and cannot fetch (the device machine reaches
# nothing outside it): SmolLM2's packaged GGUF in two parts under the 64 MiB a call may carry, the
# `gguf` wheel that reads it, and the held-out prompt set. Run from the repository root after
# `make setup`; then bench/gpu/README.md says which calls to make.
set -euo pipefail
PY=${PY:-.venv/bin/python}
SPLIT=52000000  # bytes in part a; the rest (about 46 MB) is part b
rm -rf .gpu && mkdir -p .gpu/a .gpu/b
gguf=$($PY - <<'PY'
from batchspec.models import REGISTRY, _ensure_installed, _gguf_file
spec = REGISTRY["smollm2-135m"]
_ensure_installed(spec)
print(_gguf_file(spec, None))  # one packaged part: the file itself, its sha256 checked
PY
)
head -c $SPLIT "$gguf" > .gpu/a/smol.part_a
tail -c +$((SPLIT + 1)) "$gguf" > .gpu/b/smol.part_b
cat .gpu/a/smol.part_a .gpu/b/smol.part_b | sha256sum | grep -q "^$($PY -c 'from batchspec.models import REGISTRY; print(REGISTRY["smollm2-135m"].sha256)')" \
  || { echo "the two parts do not rejoin to the GGUF"; exit 1; }
$PY -m pip download -q --no-deps --dest .gpu/a "gguf==$($PY -c 'import importlib.metadata as m; print(m.version("gguf"))')"
$PY bench/common/peer_prompts.py --out .gpu/a/held7.parquet --rows 512 --seed 7 --min-tokens 150 --max-tokens 450
du -sh .gpu/a .gpu/b
