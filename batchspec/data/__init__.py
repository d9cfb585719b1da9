"""Package data: the default pipeline and the TensorRT-LLM option and candidates files that ship
with batchspec, found through `importlib.resources` so an installed wheel runs anywhere. The
repository's top-level `pipelines/` and `trt_configs/` are links to these folders."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def data_path(*parts: str) -> Path:
    """A file shipped inside the package, e.g. `data_path("pipelines", "local.yaml")`."""
    return Path(str(files("batchspec.data").joinpath(*parts)))


DEFAULT_PIPELINE = data_path("pipelines", "local.yaml")
PIPELINES_DIR = data_path("pipelines")
CANDIDATES_DIR = data_path("trt_configs", "candidates")
