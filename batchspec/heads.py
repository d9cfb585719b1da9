"""EAGLE-3 heads trained for a job (`train_head: true`), one per shard key, under OUTPUT:

    OUTPUT/heads/<name>/config.json          the head in the released format (engine/torch/eagle3_release.py):
    OUTPUT/heads/<name>/model.safetensors    loadable by --draft-model as a published head is
    OUTPUT/heads/<name>/training.json        its training stats: the head's commit mark, written last

`<name>` is the shard key where it is a plain file name (letters, digits, `.`, `_`, `-`, not
leading `.` or `_`), else the key made one with a hash of it appended; `_all` without --shard-by.

Exactly once, as a shard is (batchspec.write): every object is written whole in one call, and a
head counts only once its mark exists, so a crashed attempt leaves nothing a later shard or run
reads; a retry writes the same names again. A head is found in this run's OUTPUT first, else in
the prior run's (`--prior-run`), read in place when OUTPUT is local and copied to a local folder
when it is an object store (the engine loads heads from folders).
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from fsspec.implementations.local import LocalFileSystem

from batchspec.engine.base import SpecConfig
from batchspec.redact import redact_text
from batchspec.write import Output

HEADS = "heads"
MARK = "training.json"
FILES = ("config.json", "model.safetensors")  # what eagle3_release.save_head writes
DRAFT_LENS = (2, 4)  # the trained head's arms: chain drafts of these lengths
RECORD_POSITIONS = 65_536  # prompt + max_tokens positions of a key's rows recorded at most (about 0.45 GB at hidden 576, float32)
_PLAIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def head_name(key: str | None) -> str:
    """The folder name of `key`'s head under OUTPUT/heads/."""
    if key is None:
        return "_all"
    text = str(key)
    if _PLAIN.match(text):
        return text
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", text)[:48].lstrip("._") or "key"
    return f"{safe}-{hashlib.sha256(text.encode()).hexdigest()[:10]}"


def with_head(arms: Sequence[SpecConfig], folder: str) -> list[SpecConfig]:
    """A key's arms with its trained head's: one EAGLE-3 arm per DRAFT_LENS length whose label no
    arm has already (calibration prices and picks among them like any arm)."""
    labels = {a.label for a in arms}
    added = [SpecConfig("eagle3", k, draft_model=folder, source="train_head") for k in DRAFT_LENS]
    return [*arms, *(a for a in added if a.label not in labels)]


@dataclass(frozen=True)
class HeadStore:
    """The run's heads (`output`) and the prior run's (`prior`), by shard key."""

    output: Output
    prior: Output | None = None

    def find(self, key: str | None) -> str | None:
        """A local folder holding `key`'s committed head: this run's, else the prior run's; None
        when neither has one."""
        for output in (self.output, self.prior):
            if output is not None and output.exists(self._path(output, key, MARK)):
                return self._local(output, key)
        return None

    def commit(self, key: str | None, folder: str, training: dict) -> str:
        """Write the head in the local `folder` as `key`'s, its files then its mark; returns the
        folder to load it from."""
        for name in FILES:
            self.output.put(self._path(self.output, key, name), (Path(folder) / name).read_bytes())
        self.output.put(self._path(self.output, key, MARK), (json.dumps(training, indent=1, sort_keys=True) + "\n").encode())
        return self._path(self.output, key) if isinstance(self.output.fs, LocalFileSystem) else folder

    @staticmethod
    def _path(output: Output, key: str | None, *name: str) -> str:
        return output.path(HEADS, head_name(key), *name)

    def _local(self, output: Output, key: str | None) -> str:
        if isinstance(output.fs, LocalFileSystem):
            return self._path(output, key)
        folder = tempfile.mkdtemp(prefix="batchspec-head-")
        fs = output.fs
        for name in (*FILES, MARK):
            Path(folder, name).write_bytes(fs.cat_file(self._path(output, key, name)))
        return folder


def published_head(arms: Sequence[SpecConfig]) -> str | None:
    """The folder of the first published EAGLE-3 head among a job's arms (an eagle3 arm of its
    own, not a trained one), from which `train_head` trains a key's head on; None without one."""
    return next((a.draft_model for a in arms if a.method == "eagle3" and a.draft_model and a.source != "train_head"), None)


def training_doc(key: str | None, shard_id: str, share: float, expected_decode_s: float, trained: dict,
                 started_from: str | None = None) -> dict:
    """The training stats written as a head's mark: where it was trained, within what budget, and
    from which published head (`started_from`, secrets left out; null: from nothing)."""
    return {"shard_key": key, "shard_id": shard_id, "budget_share": share, "expected_decode_s": expected_decode_s,
            **trained, "draft_lens": list(DRAFT_LENS),
            "started_from": redact_text(started_from) if started_from is not None else None}


def relative(output: Output, folder: str) -> str:
    """A head folder as OUTPUT/heads/<name> when it is this run's, for the stats."""
    root = output.root
    return posixpath.relpath(folder, root) if folder.startswith(root + "/") else folder


