"""Batch API request files as INPUT, without an engine: read (lines, row groups, order, files,
URLs), parse (each line to a request, or its one-line error) and plan (custom_id as the row's id).

The request lines are written by hand from the Batch API's documented shape: `custom_id`,
`method`, `url` and a `body` as the chat-completions or completions endpoint takes it.
"""

from __future__ import annotations

import json

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import batchspec.read as read
from batchspec.errors import InputError
from batchspec.parse import RowDefaults, parse_rows
from batchspec.plan import make_plan
from batchspec.read import chunks, open_input, read_chunk, read_pieces, row_ids
from batchspec.stats import OUTPUT_NAMES

MODEL = "smollm2-135m"
DEFAULTS = RowDefaults(max_tokens=16, temperature=0.0, top_p=1.0, seed=7, prompt_format="chat", model=MODEL)
PERSON = {"type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": {
    "type": "object", "properties": {"name": {"type": "string"}, "nickname": {"type": ["string", "null"], "default": None}},
    "required": ["name"], "additionalProperties": False}}}


def chat(custom_id: str, content: str = "Say hi.", **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": content}], **body}}


def completion(custom_id: str, prompt: str = "def add(a, b):\n    return", **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/completions", "body": {"model": MODEL, "prompt": prompt, **body}}


# What each line of the hand-written file is, and the error its row must get (None: it runs).
LINES = [
    (chat("chat-1", max_tokens=5, temperature=0.7, top_p=0.9, seed=11, stop=["\n\n"]), None),
    (completion("comp-1", max_tokens=4, stop="\n"), None),
    (chat("json-1", "Name a person.", max_completion_tokens=12, response_format=PERSON), None),
    ("", None),  # a blank line: no request, no row
    ('{"custom_id": "broken", "method": "POST",', r"requests\.jsonl line 5 is not valid JSON: .* at column \d+"),
    (chat("unknown-1", logit_bias={"50256": -100}, user="me"), r"unknown body fields 'logit_bias', 'user': batchspec cannot honour them"),
    (chat("model-1", model="gpt-4o-mini"), r"body\.model 'gpt-4o-mini' is not this run's model 'smollm2-135m'"),
    ({k: v for k, v in chat("x").items() if k != "custom_id"}, r"requests\.jsonl line 8 has no custom_id"),
    ({**chat("get-1"), "method": "GET"}, r"method must be POST, got 'GET'"),
    ({**chat("embed-1"), "url": "/v1/embeddings"}, r"url must be /v1/chat/completions or /v1/completions, got '/v1/embeddings'"),
    (chat("n-2", n=2), r"body\.n must be 1 .*got 2"),
    (chat("both-max", max_tokens=4, max_completion_tokens=5), r"max_tokens and body\.max_completion_tokens are both set"),
    (completion("chatty", messages=[{"role": "user", "content": "hi"}]), r"unknown body field 'messages'.*/v1/completions reads prompt"),
    ({**chat("extra"), "metadata": {"a": 1}}, r"unknown request field 'metadata'"),
    (chat("typed", max_tokens="12"), r"max_tokens must be an integer, got '12'"),
    ("[1, 2, 3]", r"requests\.jsonl line 16 is not a JSON object"),
    (chat("neutral", n=1, stream=False), None),
    ({**chat("parts"), "body": {"messages": [{"role": "user", "content": [{"type": "text", "text": "Say"}, {"type": "text", "text": "hi."}]}]}}, None),
    ({**chat("image"), "body": {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}},
     r"messages\[0\]\.content\[0\]: type 'image_url' \(this engine reads text parts only\)"),
]


def write_lines(path, lines) -> list[str]:
    """The file (a trailing newline, as JSON-lines writers leave it); the custom_id of each request line."""
    text = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    with fsspec.open(str(path), "w") as f:
        f.write(text)
    return [line.get("custom_id") if isinstance(line, dict) else None for line in lines if not (isinstance(line, str) and not line.strip())]


def rows_of(source):
    table = pa.concat_tables([read_chunk(source, c, None) for c in chunks(source, 1 << 30)])
    ids = pa.concat_arrays([row_ids(source, c, read_chunk(source, c, ["id"])) for c in chunks(source, 1 << 30)]).to_pylist()
    return table, ids


def test_every_request_line_is_one_row_in_order_with_custom_id_as_its_id(tmp_path):
    custom_ids = write_lines(tmp_path / "requests.jsonl", [line for line, _ in LINES])
    source = open_input(str(tmp_path / "requests.jsonl"))
    table, ids = rows_of(source)
    assert source.rows == table.num_rows == len(LINES) - 1  # the blank line is no row
    assert table.column("custom_id").to_pylist() == custom_ids
    assert table.column("input_row").to_pylist() == list(range(source.rows))
    assert ids == [c if c is not None else f"requests.jsonl#{i}" for i, c in enumerate(custom_ids)]
    # only custom_id, url and input_row reach the output; the line itself is consumed
    assert source.passthrough_schema(OUTPUT_NAMES).names == ["custom_id", "url", "input_row"]


def test_each_line_parses_to_its_request_or_a_one_line_error_naming_what_is_wrong(tmp_path):
    write_lines(tmp_path / "requests.jsonl", [line for line, _ in LINES])
    table, ids = rows_of(open_input(str(tmp_path / "requests.jsonl")))
    parsed = parse_rows(table, ids, DEFAULTS)
    expected = [error for line, error in LINES if not (isinstance(line, str) and not line.strip())]
    assert len(parsed) == len(expected)
    for p, error, row_id in zip(parsed, expected, ids):
        if error is None:
            assert p.error is None, (row_id, p.error)
        else:
            assert p.error is not None and "\n" not in p.error, (row_id, p.error)
            assert __import__("re").search(error, p.error), (row_id, p.error)
    by_id = {p.request.id: p.request for p in parsed}
    c = by_id["chat-1"]  # every body field lands in the request
    assert c.messages == ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi."}) and c.prompt is None
    assert (c.params.max_tokens, c.params.temperature, c.params.top_p, c.params.seed, c.params.stop) == (5, 0.7, 0.9, 11, ("\n\n",))
    t = by_id["comp-1"]  # a completions prompt is text, tokenized as is, under the run's chat format too
    assert (t.prompt, t.messages, t.params.max_tokens, t.params.stop) == ("def add(a, b):\n    return", None, 4, ("\n",))
    j = by_id["json-1"]  # max_completion_tokens is max_tokens; the schema keeps its null default
    assert j.params.max_tokens == 12 and j.response_format.name == "person"
    assert j.response_format.schema_dict["properties"]["nickname"] == {"type": ["string", "null"], "default": None}
    assert by_id["parts"].messages == ({"role": "user", "content": "Say\nhi."},)  # text parts joined as vLLM joins them
    n = by_id["neutral"]  # n 1 and stream false change nothing; what the line leaves out is the run's default
    assert (n.params.max_tokens, n.params.temperature) == (DEFAULTS.max_tokens, DEFAULTS.temperature)


def test_a_byte_order_mark_opening_a_file_is_no_error(tmp_path):
    """Windows tools write UTF-8 with a BOM: the first line is a request all the same."""
    (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + json.dumps(chat("first")).encode() + b"\n" + json.dumps(chat("second")).encode() + b"\n")
    table, ids = rows_of(open_input(str(tmp_path / "bom.jsonl")))
    assert ids == ["first", "second"]
    assert [p.error for p in parse_rows(table, ids, DEFAULTS)] == [None, None]


def test_a_request_file_is_read_by_row_groups_and_pieces_that_agree(tmp_path, monkeypatch):
    monkeypatch.setattr(read, "REQUEST_GROUP_BYTES", 400)
    custom_ids = write_lines(tmp_path / "r.jsonl", [chat(f"c{i}", "x" * (i % 7) * 20) if i % 5 else "" for i in range(60)])
    source = open_input(str(tmp_path / "r.jsonl"))
    f = source.files[0]
    assert len(f.row_groups) > 3 and sum(n for n, _ in f.row_groups) == f.rows == len(custom_ids)
    whole = pa.concat_tables([read_chunk(source, c, None) for c in chunks(source, 1000)])
    assert whole.column("custom_id").to_pylist() == custom_ids
    pieces = [t for c in chunks(source, 1000) for _, t in read_pieces(source, c, 1)]
    assert pa.concat_tables(pieces).equals(whole)
    ids = [i for c in chunks(source, 1000) for i in row_ids(source, c, read_chunk(source, c, ["id"])).to_pylist()]
    assert ids == custom_ids


def test_a_file_changed_after_it_was_opened_is_one_line_naming_it(tmp_path):
    write_lines(tmp_path / "r.jsonl", [chat("a"), chat("b")])
    source = open_input(str(tmp_path / "r.jsonl"))
    write_lines(tmp_path / "r.jsonl", [chat("a")])
    with pytest.raises(InputError, match=r"r\.jsonl changed: 1 request lines from line 1, 2 when it was opened"):
        read_chunk(source, chunks(source, 1 << 20)[0], None)


def test_a_folder_or_glob_of_request_files_any_url_continues_input_row_across_files():
    base = "memory://requests-folder"
    first = write_lines(f"{base}/day=1/a.jsonl", [chat("a1"), completion("a2")])
    second = write_lines(f"{base}/day=2/b.jsonl", ["", chat("b1"), "not json"])
    for url in (base, f"{base}/*/*.jsonl"):
        source = open_input(url)
        table, ids = rows_of(source)
        assert table.column("input_row").to_pylist() == [0, 1, 2, 3]
        assert table.column("custom_id").to_pylist() == first + second
        assert ids[-1] == ("day=2/b.jsonl#1" if url == base else "../day=2/b.jsonl#1")
        assert table.column("batch_error").to_pylist()[-1] == f"{'day=2/b.jsonl' if url == base else '../day=2/b.jsonl'} line 3 is not valid JSON: Expecting value at column 1"


def test_request_files_beside_parquet_files_are_refused_in_one_line(tmp_path):
    write_lines(tmp_path / "a.jsonl", [chat("a")])
    pq.write_table(pa.table({"prompt": ["hi"]}), tmp_path / "b.parquet")
    with pytest.raises(InputError, match=r"holds both Batch API request files \(\.jsonl\) and Parquet files; give one kind"):
        open_input(str(tmp_path))


def test_shard_by_may_name_the_endpoint_and_names_what_a_request_file_has(tmp_path):
    write_lines(tmp_path / "r.jsonl", [chat("a")])
    assert open_input(str(tmp_path / "r.jsonl"), shard_by="url").rows == 1
    with pytest.raises(InputError, match=r"--shard-by column 'task' is not in input .*found \['id', 'custom_id', 'url', 'input_row'"):
        open_input(str(tmp_path / "r.jsonl"), shard_by="task")


def test_a_duplicate_custom_id_is_refused_by_the_plan_as_a_duplicate_id(tmp_path):
    write_lines(tmp_path / "r.jsonl", [chat("same"), completion("other"), chat("same")])
    with pytest.raises(InputError, match=r"has duplicate id 'same'; ids must be unique"):
        make_plan(open_input(str(tmp_path / "r.jsonl")), None, 64, local=True)


def test_the_plan_of_a_request_file_shards_by_endpoint_in_input_order(tmp_path):
    custom_ids = write_lines(tmp_path / "r.jsonl", [chat("c0"), completion("t0"), chat("c1"), completion("t1"), chat("c2")])
    plan = make_plan(open_input(str(tmp_path / "r.jsonl"), shard_by="url"), "url", 2, local=True)
    assert [(s.shard_key, s.rows) for s in plan.shards] == [("/v1/chat/completions", 2), ("/v1/chat/completions", 1), ("/v1/completions", 2)]
    assert plan.rows == len(custom_ids)


def test_request_files_on_s3_are_read_by_row_groups_through_fsspec(s3, monkeypatch):
    url, options, _ = s3
    monkeypatch.setattr(read, "REQUEST_GROUP_BYTES", 300)
    lines = [chat(f"s{i}") if i % 4 else completion(f"s{i}") for i in range(12)]
    fs = fsspec.filesystem("s3", **options)
    fs.pipe_file(f"{url}/in/requests.jsonl".removeprefix("s3://"), "".join(json.dumps(x) + "\n" for x in lines).encode())
    source = open_input(f"{url}/in/*.jsonl", options)
    assert len(source.files[0].row_groups) > 2
    table, ids = rows_of(source)
    assert ids == [x["custom_id"] for x in lines] and table.column("input_row").to_pylist() == list(range(12))
    parsed = parse_rows(table, ids, DEFAULTS)
    assert all(p.error is None for p in parsed) and parsed[0].request.prompt.startswith("def add")
