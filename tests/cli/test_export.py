"""A Batch API request file end to end on the real packaged SmolLM2-135M: `batchspec run
requests.jsonl OUT` then `batchspec export OUT results.jsonl --format batch-api`, the result file
read back as a Batch API client reads it: each line's envelope by the documented shape
(jsonschema), each response body by the `openai` package's own types (`ChatCompletion`,
`Completion`), each error by its `BatchError`.

The request file is written by hand from the Batch API's documented request shape: chat and
completions lines, response_format rows, a line that is not JSON, an unknown body field, another
model. Small max_tokens and a few rows keep it fast.
"""

from __future__ import annotations

import json
import shutil

import jsonschema
import polars as pl
import pytest
from click.testing import CliRunner
from openai.types import BatchError, Completion
from openai.types.chat import ChatCompletion

from batchspec.cli import cli

MODEL = "smollm2-135m"
PERSON = {"type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": {
    "type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"], "additionalProperties": False}}}
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"


def line(custom_id: str, url: str, **body) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": {"model": MODEL, **body}})


def user(text: str) -> list[dict]:
    return [{"role": "system", "content": "You are a terse assistant."}, {"role": "user", "content": text}]


# (request line, the error its result carries: None for a response)
REQUESTS = [
    (line("req-chat-code", CHAT, messages=user("Write a Python function that reverses a string."), max_tokens=6), None),
    (line("req-completion", COMPLETIONS, prompt="The capital of France is", max_tokens=4, stop="\n"), None),
    (line("req-json", CHAT, messages=user("Invent a person. Reply in JSON."), max_completion_tokens=8, response_format=PERSON), None),
    ('{"custom_id": "req-broken", "method": "POST", "url": ', "requests.jsonl line 4 is not valid JSON"),
    (line("req-unknown", CHAT, messages=user("hi"), logprobs=True), "unknown body field 'logprobs'"),
    (line("req-other-model", CHAT, messages=user("hi")).replace(MODEL, "gpt-4o-mini"), "body.model 'gpt-4o-mini' is not this run's model"),
    (line("req-completion-json", COMPLETIONS, prompt="A JSON person: ", max_tokens=6, response_format=PERSON), None),
    (line("req-chat-prose", CHAT, messages=user("Describe the sea in one sentence."), max_tokens=5, temperature=0.8, seed=3), None),
]

ENVELOPE = {  # one line of a Batch API result file, as OpenAI documents it and vLLM's run-batch writes it
    "type": "object",
    "required": ["id", "custom_id", "response", "error"],
    "additionalProperties": False,
    "properties": {
        "id": {"type": "string", "minLength": 1},
        "custom_id": {"type": ["string", "null"]},
        "response": {"oneOf": [{"type": "null"}, {
            "type": "object", "required": ["status_code", "request_id", "body"], "additionalProperties": False,
            "properties": {"status_code": {"type": "integer"}, "request_id": {"type": "string"}, "body": {"type": ["object", "null"]}}}]},
        "error": {"oneOf": [{"type": "null"}, {
            "type": "object", "required": ["code", "message"],
            "properties": {"code": {"type": "string"}, "message": {"type": "string"}}}]},
    },
}


def batchspec(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def client_read(path) -> list[dict]:
    """The result file as a client reads it: every line checked, bodies and errors as the SDK's types."""
    out = []
    for text in path.read_text().splitlines():
        doc = json.loads(text)
        jsonschema.validate(doc, ENVELOPE)
        if doc["error"] is None:
            assert doc["response"]["status_code"] == 200
            body = doc["response"]["body"]
            doc["parsed"] = (ChatCompletion if body["object"] == "chat.completion" else Completion).model_validate(body)
        else:
            assert doc["response"]["status_code"] == 400 and doc["response"]["body"] is None
            doc["parsed"] = BatchError.model_validate(doc["error"])
        out.append(doc)
    return out


@pytest.fixture(scope="module")
def batch_run(ray_session, smollm2_dir, tmp_path_factory):
    """OUTPUT of `batchspec run requests.jsonl OUT --shard-by url`: two keys, so OUTPUT's shards hold
    the rows out of input order and export has to put them back."""
    root = tmp_path_factory.mktemp("batch")
    (root / "requests.jsonl").write_text("".join(text + "\n" for text, _ in REQUESTS))
    result = batchspec("run", str(root / "requests.jsonl"), str(root / "out"), "--shard-by", "url", "--batch-size", "4",
                       "--max-tokens", "8")
    assert result.exit_code == 0, result.output
    return root


def test_every_request_line_has_one_output_row_with_its_custom_id(batch_run):
    df = pl.read_parquet(batch_run / "out" / "outputs" / "*.parquet")
    assert df.height == len(REQUESTS)
    assert sorted(df["input_row"].to_list()) == list(range(len(REQUESTS)))
    by_row = df.sort("input_row")
    assert by_row["custom_id"].to_list() == [json.loads(t)["custom_id"] if e is None or "JSON" not in e else None for t, e in REQUESTS]
    assert by_row["id"][3] == "requests.jsonl#3"  # the broken line: no custom_id, its row still there
    assert [e is None for e in by_row["error"].to_list()] == [e is None for _, e in REQUESTS]
    stats = pl.read_parquet(batch_run / "out" / "stats" / "*.parquet")
    assert stats.sort("shard_id")["shard_key"].to_list() == [CHAT, COMPLETIONS, None]  # the broken line has no url: the null key
    assert (stats["constrained_rows"].sum(), stats["rows"].sum()) == (2, len(REQUESTS))


def test_export_writes_one_result_line_per_request_line_in_input_order_that_a_client_parses(batch_run):
    result = batchspec("export", str(batch_run / "out"), str(batch_run / "results.jsonl"), "--format", "batch-api")
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"wrote {len(REQUESTS)} result line(s), 3 with an error, to {batch_run / 'results.jsonl'}"
    lines = client_read(batch_run / "results.jsonl")
    sent = [json.loads(t) if e is None or "JSON" not in e else None for t, e in REQUESTS]
    assert [d["custom_id"] for d in lines] == [s["custom_id"] if s else None for s in sent]
    outputs = pl.read_parquet(batch_run / "out" / "outputs" / "*.parquet").sort("input_row").to_dicts()
    for doc, (_, error), out, request in zip(lines, REQUESTS, outputs, sent):
        if error is not None:
            assert error in doc["parsed"].message and doc["parsed"].code == "invalid_request"
            continue
        body = doc["parsed"]
        assert body.model == MODEL and len(body.choices) == 1
        choice = body.choices[0]
        text = choice.message.content if request["url"] == CHAT else choice.text
        assert isinstance(body, ChatCompletion if request["url"] == CHAT else Completion)
        assert text == out["text"] and choice.finish_reason == out["finish_reason"] in ("stop", "length")
        usage = body.usage
        assert (usage.prompt_tokens, usage.completion_tokens) == (out["prompt_tokens"], out["output_tokens"])
        assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens and usage.completion_tokens >= 1
        limit = request["body"].get("max_tokens") or request["body"].get("max_completion_tokens")
        assert usage.completion_tokens <= limit  # the line's own max_tokens, not the run's 8
    assert len({d["id"] for d in lines}) == len(lines)
    again = batch_run / "again.jsonl"  # the same run exported twice: the same file
    assert batchspec("export", str(batch_run / "out"), str(again)).exit_code == 0
    assert again.read_bytes() == (batch_run / "results.jsonl").read_bytes()


def test_the_client_types_refuse_a_result_of_the_wrong_shape(batch_run):
    """The check above can fail: the SDK's types refuse a body whose object, finish_reason or
    usage is not the documented one."""
    lines = [json.loads(t) for t in (batch_run / "results.jsonl").read_text().splitlines()]
    body = next(d for d in lines if d["error"] is None and d["response"]["body"]["object"] == "chat.completion")["response"]["body"]
    for bad in ({**body, "object": "text_completion"}, {**body, "choices": [{**body["choices"][0], "finish_reason": "error"}]},
                {k: v for k, v in body.items() if k != "usage"} | {"usage": {"prompt_tokens": "many"}}):
        with pytest.raises(Exception):
            ChatCompletion.model_validate(bad)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**lines[0], "extra": 1}, ENVELOPE)


def test_a_rerun_resumes_with_nothing_to_do_and_other_options_are_refused(batch_run):
    before = {p.name: p.read_bytes() for p in (batch_run / "out" / "outputs").iterdir()}
    again = batchspec("run", str(batch_run / "requests.jsonl"), str(batch_run / "out"), "--shard-by", "url", "--batch-size", "4",
                      "--max-tokens", "8")
    assert again.exit_code == 0, again.output
    assert {p.name: p.read_bytes() for p in (batch_run / "out" / "outputs").iterdir()} == before
    other = batchspec("run", str(batch_run / "requests.jsonl"), str(batch_run / "out"), "--shard-by", "url", "--max-tokens", "9")
    assert other.exit_code != 0 and "max_tokens" in other.output and len(other.output.strip().splitlines()) == 1, other.output


def test_export_refuses_an_unfinished_run_and_a_parquet_run_in_one_line(batch_run, tmp_path):
    unfinished = tmp_path / "unfinished"
    shutil.copytree(batch_run / "out", unfinished)
    (unfinished / "_SUCCESS").unlink()
    result = batchspec("export", str(unfinished), str(tmp_path / "r.jsonl"))
    assert result.exit_code == 1 and result.output.strip().splitlines() == [
        f"Error: OUTPUT {unfinished} is not a finished run (no _SUCCESS): export writes a committed run only; rerun `batchspec run` to finish it"]
    assert not (tmp_path / "r.jsonl").exists()
    parquet_run = tmp_path / "parquet_run"
    shutil.copytree(batch_run / "out", parquet_run)
    for f in (parquet_run / "outputs").iterdir():
        pl.read_parquet(f).drop("custom_id", "url", "input_row").write_parquet(f)
    result = batchspec("export", str(parquet_run), str(tmp_path / "r.jsonl"))
    assert result.exit_code == 1 and "was not run from Batch API request files (its outputs have no custom_id, url, input_row)" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_a_duplicate_custom_id_refuses_the_run_in_one_line_before_any_row_runs(ray_session, tmp_path):
    (tmp_path / "dup.jsonl").write_text("\n".join([line("a", CHAT, messages=user("hi")), line("a", COMPLETIONS, prompt="x")]) + "\n")
    result = batchspec("run", str(tmp_path / "dup.jsonl"), str(tmp_path / "out"))
    assert result.exit_code == 1 and result.output.strip().splitlines() == [
        f"Error: input {tmp_path / 'dup.jsonl'} has duplicate id 'a'; ids must be unique"], result.output
    assert not (tmp_path / "out" / "stats").exists()
