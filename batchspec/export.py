"""`batchspec export`: a committed run written back as a Batch API result file, one JSON line per
request line of its input, in input order.

What it owns: reading OUTPUT's outputs (the record; nothing else is read, nothing under OUTPUT is
written) and shaping each row as the result line a Batch API client reads. It refuses, in one line,
an OUTPUT without `_SUCCESS` and one whose input was not Batch API request files (its outputs carry
no `custom_id`, `url` and `input_row`: batchspec.request_lines' REQUEST_SCHEMA). It knows nothing of how
the rows were made.

A result line (`result_line`) has the shape of OpenAI's batch output file as vLLM's run-batch
writes it:

    {"id": "batch_req_<h>", "custom_id": ..., "response": {"status_code": 200, "request_id":
     "req_<h>", "body": <a chat.completion or text_completion object>}, "error": null}

The body follows the request's endpoint (its `url`): `/v1/chat/completions` gives
`{"id": "chatcmpl-<h>", "object": "chat.completion", "created", "model", "choices": [{"index": 0,
"message": {"role": "assistant", "content": text}, "logprobs": null, "finish_reason"}], "usage":
{"prompt_tokens", "completion_tokens", "total_tokens"}}`; `/v1/completions` the same with
`"object": "text_completion"`, `"id": "cmpl-<h>"` and `choices[0].text`. An error row (a line that
was not a request, or a request batchspec could not honour or run) gets `"response":
{"status_code": 400, "request_id", "body": null}` and `"error": {"code": "invalid_request",
"message": <the row's one-line error>}`: a committed run has no other kind (a shard that failed
every attempt leaves no `_SUCCESS`). A line without a custom_id (not JSON, say) has `"custom_id":
null`. `<h>` is a hash of the run's plan and the line's place, so exporting a run twice gives the
same file; `created` is the run's end (the manifest's `finished_at`), `model` the model as
configured.

Upstream, as read: vllm-project/vllm @ 0052bed36509c7a5a2d8e48265334e40cf2f5a0e,
vllm/entrypoints/openai/protocol.py: `BatchRequestOutput` (id, custom_id, response, error),
`BatchResponseData` (status_code 200 by default, request_id, body), `ChatCompletionResponse`,
`ChatCompletionResponseChoice`, `CompletionResponse`, `CompletionResponseChoice`, `UsageInfo`;
vllm-project/vllm @ 0056ae7b2144abbc7b4916a43491c154567e0b76, vllm/entrypoints/openai/run_batch.py:
`make_error_request_output` (status_code 400, the error beside an empty body), `stream_file_lines`
(blank lines are no requests), `OrderedStreamingWriter` (results in input order). vLLM writes its
error as a string; here it is the {code, message} object of OpenAI's documented batch output (the
`openai` package's `BatchError` reads it).

The file is written whole in one call, as everything batchspec writes (a temporary name renamed
into place locally, one PUT on an object store): a reader never sees half of it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import dataclass

from batchspec.errors import OutputError
from batchspec.parse import CHAT, COMPLETIONS  # the endpoints a request line may name
from batchspec.report.load import parquet_files, read_frame, storage_options
from batchspec.write import Output

FORMATS = ("batch-api",)
COLUMNS = ("id", "text", "prompt_tokens", "output_tokens", "finish_reason", "error", "custom_id", "url", "input_row")
REQUEST_COLUMNS = ("custom_id", "url", "input_row")  # what a run of Batch API request files passes through


@dataclass(frozen=True)
class Exported:
    """What `export_batch_api` wrote."""

    path: str
    lines: int
    errors: int  # lines with an error instead of a response body


@dataclass(frozen=True)
class RunFacts:
    """What every result line of one run shares."""

    model: str
    created: int  # epoch seconds: the run's end
    key: str  # the run's plan fingerprint: result ids are unique to the run


def export_batch_api(output: str, dest: str, environ: dict[str, str] | None = None) -> Exported:
    """Write the committed run in OUTPUT to DEST (any fsspec URL) as a Batch API result file."""
    url = output.rstrip("/")
    fs_opts, pl_opts = storage_options(url, environ)
    out = Output(url, tuple(fs_opts.items()))
    plan = out.read_text("_plan.json")
    if plan is None:
        raise OutputError(f"OUTPUT {url} is not a batchspec run (no _plan.json)")
    if out.read_text("_SUCCESS") is None:
        raise OutputError(f"OUTPUT {url} is not a finished run (no _SUCCESS): export writes a committed run only; "
                          "rerun `batchspec run` to finish it")
    manifest = json.loads(out.read_text("_manifest.json") or "{}")
    rows = json.loads(plan).get("rows")
    frame = read_frame(out, parquet_files(out, "outputs"), pl_opts, None)
    missing = [c for c in REQUEST_COLUMNS if c not in frame.columns]
    if missing:
        raise OutputError(f"OUTPUT {url} was not run from Batch API request files (its outputs have no "
                          f"{', '.join(missing)}); export --format batch-api needs a .jsonl INPUT")
    frame = frame.select(COLUMNS).sort("input_row")
    rows = frame.height if rows is None else rows
    if frame["input_row"].to_list() != list(range(rows)):
        raise OutputError(f"OUTPUT {url}: outputs hold {frame.height} rows whose input_row is not 0..{rows - 1} once each; "
                          "the run's files were changed after it finished")
    facts = run_facts(manifest)
    lines = [result_line(row, facts) for row in frame.iter_rows(named=True)]
    data = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines).encode()
    sink = Output(dest, tuple(storage_options(dest, environ)[0].items()))
    sink.put(sink.root, data)
    return Exported(dest, len(lines), sum(line["error"] is not None for line in lines))


def run_facts(manifest: dict) -> RunFacts:
    finished = manifest.get("finished_at")
    created = int(dt.datetime.fromisoformat(finished).timestamp()) if finished else 0
    return RunFacts(manifest.get("config", {}).get("model") or "", created, manifest.get("plan_fingerprint") or "")


def result_line(row: dict, facts: RunFacts) -> dict:
    """One output row as a Batch API result line (module docstring)."""
    h = hashlib.sha256(f"{facts.key}:{row['input_row']}".encode()).hexdigest()[:24]
    if row["finish_reason"] == "error" or row["url"] not in (CHAT, COMPLETIONS):
        return {"id": f"batch_req_{h}", "custom_id": row["custom_id"],
                "response": {"status_code": 400, "request_id": f"req_{h}", "body": None},
                "error": {"code": "invalid_request", "message": row["error"] or "the row has no completion"}}
    return {"id": f"batch_req_{h}", "custom_id": row["custom_id"],
            "response": {"status_code": 200, "request_id": f"req_{h}", "body": _body(row, facts, h)}, "error": None}


def _body(row: dict, facts: RunFacts, h: str) -> dict:
    prompt, completion = row["prompt_tokens"], row["output_tokens"]
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    if row["url"] == CHAT:
        choice = {"index": 0, "message": {"role": "assistant", "content": row["text"]}, "logprobs": None,
                  "finish_reason": row["finish_reason"]}
        return {"id": f"chatcmpl-{h}", "object": "chat.completion", "created": facts.created, "model": facts.model,
                "choices": [choice], "usage": usage}
    choice = {"index": 0, "text": row["text"], "logprobs": None, "finish_reason": row["finish_reason"]}
    return {"id": f"cmpl-{h}", "object": "text_completion", "created": facts.created, "model": facts.model,
            "choices": [choice], "usage": usage}

