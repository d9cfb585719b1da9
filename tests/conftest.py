"""Shared fixtures: tiny random models built from a config at test time (engine unit tests), and
the real packaged SmolLM2 (end-to-end tests). Nothing is fetched from a hub."""

from __future__ import annotations

import os

# Before torch loads its OpenMP runtime, here and in every process the tests start (Ray's workers
# and subprocesses inherit it): a thread waiting at an OpenMP barrier sleeps instead of spinning.
# Two test processes share two cores; a worker of two torch threads (the default pipeline's) with a
# core taken by the other process spun away its time slices: SmolLM2's forward took 21 s instead
# of 2.7 s. A scheduling policy only: what runs, and its results, are the same.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(1)  # tiny models: threads only add sync cost, and CI has 2 cores


@pytest.fixture(scope="session")
def smollm2_dir():
    """The packaged SmolLM2-135M-Instruct, prepared by `make setup` (cached after the first time)."""
    from batchspec.models import resolve_model

    return resolve_model("smollm2-135m")


@pytest.fixture(scope="session")
def smol_tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


def tiny_llama(vocab_size: int, layers: int, seed: int, **overrides):
    """A small random Llama. initializer_range is large so logits are peaked and greedy argmaxes
    are far from ties (a tie could differ between batched and one-by-one float sums)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        attn_implementation="sdpa", **{"initializer_range": 0.3, "tie_word_embeddings": True, **overrides},
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="session")
def tiny_pair(smol_tokenizer):
    """(target, draft, tokenizer): a 4-layer target and a 1-layer draft with SmolLM2's tokenizer."""
    eos = smol_tokenizer.eos_token_id
    target = tiny_llama(len(smol_tokenizer), 4, seed=0, eos_token_id=eos, pad_token_id=eos)
    draft = tiny_llama(len(smol_tokenizer), 1, seed=1, eos_token_id=eos, pad_token_id=eos)
    return target, draft, smol_tokenizer


def save_folder(tmp_path_factory, name: str, model, tokenizer):
    folder = tmp_path_factory.mktemp(name)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_pair):
    """The tiny target saved as a Hugging Face folder, for tests that load models by path."""
    target, _, tokenizer = tiny_pair
    return save_folder(tmp_path_factory, "tiny-target", target, tokenizer)


@pytest.fixture(scope="session")
def tiny_base_model_dir(tmp_path_factory, tiny_pair):
    """The tiny target with a tokenizer that has no chat template, as a base model's: what
    prompt_format raw is for (chat refuses it)."""
    import json

    from batchspec.models import CHAT_TEMPLATE_FILES

    target, _, tokenizer = tiny_pair
    folder = save_folder(tmp_path_factory, "tiny-base", target, tokenizer)
    for name in CHAT_TEMPLATE_FILES:
        (folder / name).unlink(missing_ok=True)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="session")
def tiny_draft_dir(tmp_path_factory, tiny_pair):
    _, draft, tokenizer = tiny_pair
    return save_folder(tmp_path_factory, "tiny-draft", draft, tokenizer)


def word_tokenizer(vocab_size: int):
    """A word-level tokenizer over "<eos>", "w1" ... "w{n-1}": a small vocabulary makes n-gram
    matches frequent and lets statistical tests enumerate every outcome."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<eos>": 0, **{f"w{i}": i for i in range(1, vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<eos>")


def perturbed(model, scale: float, seed: int):
    """A copy of `model` with Gaussian noise on every weight: a draft that agrees only partly."""
    import copy

    out = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)
    return out


@pytest.fixture(scope="session")
def word_models():
    """(target, drafts by name, tokenizer) over a 64-word vocabulary. Drafts: "close" agrees with
    the target often, "far" rarely, "self" always."""
    tokenizer = word_tokenizer(64)
    target = tiny_llama(64, 4, seed=0, eos_token_id=0, pad_token_id=0, initializer_range=0.15)
    drafts = {
        "close": perturbed(target, 0.003, seed=1),
        "far": tiny_llama(64, 1, seed=2, eos_token_id=0, pad_token_id=0, initializer_range=0.15),
        "self": target,
    }
    return target, drafts, tokenizer


@pytest.fixture(scope="session")
def tiny_engine(word_models):
    """A torch engine over `word_models`' target; a draft it does not know fails to load."""
    from batchspec.engine.torch.engine import TorchEngine

    target, drafts, tokenizer = word_models

    def loader(name):
        if name not in drafts:
            raise RuntimeError(f"no draft called {name}")
        return drafts[name], tokenizer

    return TorchEngine(target, tokenizer, model_name="tiny", draft_loader=loader)


@pytest.fixture
def folder(tmp_path):
    """An input folder of two Parquet files (10 rows: 6 in a.parquet in row groups of 2, 4 in
    b.parquet in row groups of 3) and a `_SUCCESS` marker that listing must skip."""
    import fsspec

    from tests.data import prompts_table, write_parquet

    fs = fsspec.filesystem("file")
    (tmp_path / "in").mkdir()
    write_parquet(fs, str(tmp_path / "in" / "a.parquet"), prompts_table(10).slice(0, 6), row_group_size=2)
    write_parquet(fs, str(tmp_path / "in" / "b.parquet"), prompts_table(10).slice(6), row_group_size=3)
    (tmp_path / "in" / "_SUCCESS").write_text("")
    return tmp_path / "in"


# ---- the order files run in ------------------------------------------------------------------------

# The files that take longest, longest first (pytest --durations, summed per file). `make test`
# hands whole files to two processes (pytest-xdist, --dist loadfile, --no-loadscope-reorder): a
# long file started last keeps one process busy while the other idles, and xdist's own order (most
# tests first) put the real-Ray files, few tests each, last. The first file needs no Ray: with
# test_run.py and test_pipeline.py first, both processes started their local Ray at once and, on a
# loaded machine, both raylets missed Ray's 30 s registration limit (every Ray test then errored).
# Order only: no test depends on it.
LONGEST_FIRST = (
    "tests/engine/torch/test_eagle3_arm.py", "tests/cli/test_run.py", "tests/test_pipeline.py", "tests/test_submit.py",
    "tests/test_multinode.py", "tests/test_bench.py", "tests/engine/torch/test_suffix.py",
    "tests/engine/torch/test_acceptance.py", "tests/engine/torch/test_engine.py", "tests/test_group.py",
    "tests/engine/trtllm/test_gpu_check.py", "tests/engine/torch/test_structured.py", "tests/test_ray_data.py",
    "tests/engine/trtllm/test_multi_gpu.py", "tests/test_redact.py", "tests/test_install.py",
    "tests/test_structured_input.py", "tests/test_lease.py", "tests/test_gpu_check_torch.py", "tests/report/test_report.py",
)


def pytest_collection_modifyitems(items):
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))  # stable: the rest as collected


# ---- one local Ray for the whole session, and a real S3 endpoint on loopback (moto's server) ----

S3_KEY, S3_SECRET = "testing", "testing"


@pytest.fixture(scope="session")
def ray_session():
    import ray

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)  # never join a cluster left running on the machine
        ray.data.DataContext.get_current().enable_progress_bars = False
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def s3_endpoint():
    from moto.server import ThreadedMotoServer

    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    os.environ.setdefault("AWS_ACCESS_KEY_ID", S3_KEY)
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", S3_SECRET)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3(s3_endpoint, request):
    """A fresh bucket; returns (bucket url, fsspec storage options, polars storage options)."""
    import s3fs

    options = {"key": S3_KEY, "secret": S3_SECRET, "client_kwargs": {"endpoint_url": s3_endpoint}}
    fs = s3fs.S3FileSystem(**options)
    bucket = "bkt-" + request.node.name.lower().replace("_", "-")[:40].strip("-")
    fs.mkdir(bucket)
    polars_options = {
        "aws_access_key_id": S3_KEY,
        "aws_secret_access_key": S3_SECRET,
        "aws_region": "us-east-1",
        "aws_endpoint_url": s3_endpoint,
        "aws_allow_http": "true",
    }
    return f"s3://{bucket}", options, polars_options


from tests.cluster import two_node_cluster  # noqa: F401,E402  (one two-node Ray cluster per module that needs it)
