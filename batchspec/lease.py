"""One writer per OUTPUT: a lease held in OUTPUT/_lease/ for the whole of a run.

The lease is a sequence of generations, `OUTPUT/_lease/<n>.json`, each written once with a
conditional create (`Output.create`: O_EXCL-style link locally, `If-None-Match: *` on S3, the
store's own exclusive create elsewhere), so of two runs that try to take generation n at the same
moment exactly one gets it. The holder of the highest generation holds the lease:

- **take**: read the highest generation; if its holder still lives (it has not released it, its
  heartbeat is younger than TTL_S, and, on this host, its process still runs) the run is refused
  in one line naming that holder; otherwise create generation n + 1. A run killed on this host is
  taken over at once; one killed elsewhere once its heartbeat is older than TTL_S.
- **heartbeat**: a daemon thread rewrites the holder's own generation every TTL_S / 4 with the
  time; nobody else ever writes it.
- **check**: before every commit (a shard's outputs and stats, the plan, the manifest) the writer
  checks that generation n + 1 does not exist: a run whose lease was taken over (its heartbeat
  stopped for longer than TTL_S: a paused process) stops with one line instead of writing.
- **release**: the holder marks its generation released when the run ends, however it ends.

Generations are never deleted while a run may hold them (numbers only grow), so a stale holder
cannot mistake a later run's generation for its own; the taker removes generations below its own.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, replace

from batchspec.errors import OutputError
from batchspec.write import Output

TTL_S = 120.0  # a lease whose heartbeat is older than this is taken over
FOLDER = "_lease"


@dataclass(frozen=True)
class Holder:
    """What a lease generation says about the run that holds it."""

    token: str
    host: str
    pid: int
    started: float  # epoch seconds
    heartbeat: float  # epoch seconds of the last renewal
    released: bool = False

    def alive(self, now: float, ttl_s: float) -> bool:
        if self.released or now - self.heartbeat > ttl_s:
            return False
        return self.host != socket.gethostname() or _running(self.pid)

    def describe(self, now: float) -> str:
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started))
        return f"host {self.host}, pid {self.pid}, started {started}, last heartbeat {max(0.0, now - self.heartbeat):.0f} s ago"


@dataclass(frozen=True)
class Lease:
    """This run's hold on OUTPUT: generation `generation`, proven by `token`. Picklable: the
    workers get it to check before each commit."""

    output: Output
    generation: int
    token: str

    def path(self, generation: int | None = None) -> str:
        return self.output.path(FOLDER, f"{self.generation if generation is None else generation:08d}.json")

    def check(self) -> None:
        """OutputError (one line) when another run took OUTPUT over from this one."""
        if self.output.exists(self.path(self.generation + 1)):
            raise OutputError(f"OUTPUT {self.output.url} was taken over by another run (this run's heartbeat stopped "
                              f"for longer than {TTL_S:.0f} s); this run stops without writing")


def take(output: Output, ttl_s: float = TTL_S, now: float | None = None) -> Lease:
    """Take OUTPUT's lease (the next generation), or OutputError naming the live holder."""
    now = time.time() if now is None else now
    generations = _generations(output)
    top = generations[-1] if generations else 0
    if top:
        holder = _read(output, top)
        if holder is not None and holder.alive(now, ttl_s):
            raise OutputError(f"OUTPUT {output.url} is in use by another run ({holder.describe(now)}); wait for it to "
                              f"finish, or use another OUTPUT (a run that stops heartbeating is taken over after {ttl_s:.0f} s)")
    mine = Holder(uuid.uuid4().hex, socket.gethostname(), os.getpid(), now, now)
    lease = Lease(output, top + 1, mine.token)
    if not output.create(lease.path(), _doc(mine)):
        raise OutputError(f"OUTPUT {output.url} was taken by another run starting at the same moment; use another OUTPUT or wait for it")
    for old in generations:
        output.remove_object(lease.path(old))
    return lease


def renew(lease: Lease, now: float | None = None) -> bool:
    """Rewrite this run's generation with a fresh heartbeat; False (and nothing written) once
    another run took OUTPUT over."""
    if lease.output.exists(lease.path(lease.generation + 1)):
        return False
    holder = _read(lease.output, lease.generation)
    if holder is None or holder.token != lease.token:
        return False
    lease.output.put(lease.path(), _doc(replace(holder, heartbeat=time.time() if now is None else now)))
    return True


def release(lease: Lease) -> None:
    """Mark this run's generation released (the next run takes OUTPUT at once)."""
    holder = _read(lease.output, lease.generation)
    if holder is not None and holder.token == lease.token:
        lease.output.put(lease.path(), _doc(replace(holder, released=True, heartbeat=time.time())))


class Held:
    """`with Held(output) as lease:` the lease for the block, renewed by a daemon thread every
    ttl_s / 4, released when the block ends (an exception or SystemExit included)."""

    def __init__(self, output: Output, ttl_s: float = TTL_S):
        self.output, self.ttl_s = output, ttl_s
        self._stop = threading.Event()

    def __enter__(self) -> Lease:
        self.lease = take(self.output, self.ttl_s)
        self._thread = threading.Thread(target=self._beat, name="batchspec-lease", daemon=True)
        self._thread.start()
        return self.lease

    def _beat(self) -> None:
        while not self._stop.wait(self.ttl_s / 4):
            try:
                if not renew(self.lease):
                    return  # taken over: every later commit's check stops the run
            except Exception:  # a failed renewal is retried at the next beat; the TTL covers a few
                pass

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            release(self.lease)
        except Exception:  # never hide the run's own outcome; the lease expires after ttl_s anyway
            pass


def _generations(output: Output) -> list[int]:
    names = output.names(FOLDER)
    return sorted(int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit())


def _read(output: Output, generation: int) -> Holder | None:
    """The holder a generation names; None when it cannot be read (taken as expired)."""
    text = output.read_text(f"{FOLDER}/{generation:08d}.json")
    try:
        return Holder(**json.loads(text)) if text else None
    except (ValueError, TypeError):
        return None


def _doc(holder: Holder) -> bytes:
    return (json.dumps(holder.__dict__, sort_keys=True) + "\n").encode()


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: running
        return True
    return True
