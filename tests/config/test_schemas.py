"""The config models as JSON Schemas: `batchspec validate --schema KIND` writes them, the package
ships them (batchspec/data/schemas/, held equal to what the command writes), every shipped YAML file
names its schema in its first line (yaml-language-server) and validates against it with the
`jsonschema` package, and every key a user can write carries a description."""

from __future__ import annotations

import glob
import json
import typing
from pathlib import Path

import jsonschema
import pytest
import yaml
from click.testing import CliRunner

from batchspec.cli import cli
from batchspec.config import spec as specs
from batchspec.config.validate import SCHEMAS
from batchspec.engine.trtllm.translate import DECODING_TYPES, SPEC_KEYS
from tests.engine.trtllm.fake_tensorrt_llm import llm_args as l12

REPO = Path(__file__).resolve().parents[2]
SCHEMA_DIR = REPO / "batchspec" / "data" / "schemas"
SHIPPED = {
    "pipeline": glob.glob(str(REPO / "batchspec/data/pipelines/*.yaml")),
    "candidates": glob.glob(str(REPO / "batchspec/data/pipelines/candidates/*.yaml"))
    + glob.glob(str(REPO / "batchspec/data/trt_configs/candidates/*.yaml")),
    "options": glob.glob(str(REPO / "batchspec/data/trt_configs/*.yaml")),
    "job": [p for p in glob.glob(str(REPO / "jobs/*.yaml")) if yaml.safe_load(Path(p).read_text()).get("kind") == "batchspec-job"],
}
FILES = [(kind, path) for kind, paths in SHIPPED.items() for path in sorted(paths)]


def schema(kind: str) -> dict:
    return json.loads((SCHEMA_DIR / f"{kind}.schema.json").read_text())


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
def test_the_shipped_schema_is_what_validate_schema_writes(kind):
    result = CliRunner().invoke(cli, ["validate", "--schema", kind])
    assert result.exit_code == 0, result.output
    assert (SCHEMA_DIR / f"{kind}.schema.json").read_text() == result.stdout, f"regenerate: batchspec validate --schema {kind}"
    jsonschema.Draft202012Validator.check_schema(json.loads(result.stdout))


def test_every_kind_has_shipped_files():
    assert {kind for kind, _ in FILES} == set(SCHEMAS) and len(FILES) >= 14


@pytest.mark.parametrize("kind,path", FILES, ids=lambda v: Path(v).name if "/" in str(v) else v)
def test_every_shipped_file_names_its_schema_and_validates_against_it(kind, path):
    first = Path(path).read_text().splitlines()[0]
    assert first.startswith("# yaml-language-server: $schema="), first
    named = (Path(path).parent / first.split("=", 1)[1]).resolve()
    assert named == (SCHEMA_DIR / f"{kind}.schema.json").resolve()
    jsonschema.Draft202012Validator(schema(kind)).validate(yaml.safe_load(Path(path).read_text()))


@pytest.mark.parametrize("kind,doc,where", [
    ("pipeline", {"batch_size": 0}, "batch_size"),
    ("pipeline", {"shard_sise": 4}, "shard_sise"),
    ("pipeline", {"worker": {"num_cpus": -1}}, "num_cpus"),
    ("pipeline", {"calibration": {"margin": 2}}, "margin"),
    ("pipeline", {"llm_options": {"device": "cuda"}}, "device"),
    ("options", {"speculative_config": {"decoding_type": "NGram", "max_draft_len": 0}}, "max_draft_len"),
    ("options", {"speculative_config": {"decoding_type": "DraftTarget", "max_draft_len": 4}}, "DraftTarget"),
    ("options", {"speculative_config": {"decoding_type": "NGram", "max_draft_len": 4, "ngram_size": 3}}, "ngram_size"),
    ("options", {"not_an_arg": 1}, "not_an_arg"),
    ("candidates", {"candidates": []}, "[]"),
    ("job", {"kind": "batchspec-job", "name": "Bad Name", "input": "i", "output": "/o"}, "Bad Name"),
])
def test_a_schema_refuses_what_batchspec_refuses(kind, doc, where):
    errors = list(jsonschema.Draft202012Validator(schema(kind)).iter_errors(doc))
    assert errors and any(where in str(e.instance) or where in e.message or where in str(list(e.absolute_path)) for e in errors), errors


def _properties(node, at=""):
    if isinstance(node, dict):
        for name, prop in (node.get("properties") or {}).items():
            yield f"{at}.{name}", prop
        for key, value in node.items():
            yield from _properties(value, f"{at}.{key}" if key != "properties" else at)
    elif isinstance(node, list):
        for value in node:
            yield from _properties(value, at)


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
def test_every_key_has_a_description(kind):
    missing = [at for at, prop in _properties(schema(kind)) if not prop.get("description")]
    assert not missing, missing


def test_the_option_file_classes_mirror_tensorrt_llm_1_2_names_and_tags():
    """Class names and decoding_type tags as 1.2's llm_args.py spells them (the stand-in copies its
    classes), every field one 1.2 has; Suffix is batchspec's own."""
    union = typing.get_args(typing.get_args(specs.SpeculativeConfig)[0])
    assert {cls.tag() for cls in union} == set(DECODING_TYPES)
    for cls in union:
        assert set(cls.model_fields) <= set(SPEC_KEYS[cls.tag()]), cls
        if cls.tag() != "Suffix":
            theirs = getattr(l12, cls.__name__)
            assert theirs.model_fields["decoding_type"].default == cls.tag()
            assert set(cls.model_fields) - {"speculative_model_dir"} <= set(theirs.model_fields)
    for name in ("KvCacheConfig", "CudaGraphConfig"):
        assert set(getattr(specs, name).model_fields) <= set(getattr(l12, name).model_fields)
    assert set(specs.LlmOptions.model_fields) <= set(l12.TorchLlmArgs.model_fields)
