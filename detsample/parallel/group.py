"""A local tensor-parallel process group: ``world`` rank processes on this machine.

``with RankGroup(world, init, args) as g: g.call(job, *more)`` spawns ``world`` processes
(``torch.multiprocessing``, start method ``spawn``), joins them into one
``torch.distributed`` group (gloo on CPU, NCCL when ``backend="nccl"``: written, not run
on this project's CPU machines) through a file store in a private temporary directory
(no port to pick, none to collide), and in each runs ``state = init(comm, *args)`` once
(load and shard a model, say). Each :meth:`RankGroup.call` then runs
``job(state, comm, *more)`` on every rank (SPMD: every rank the same call) and returns
rank 0's result.

Bounded: every call waits at most ``timeout`` seconds (the collectives time out after
the same), a rank that dies or hangs ends the group (the others are terminated), and the
parent raises :class:`RankError` naming the rank and what happened (its exception type,
message and the last lines of its traceback). Results travel as ``torch.save`` bytes and
are read back with ``weights_only=True`` (tensors, lists, dicts, strings, numbers).

``init`` and ``job`` must be importable module-level functions (``spawn`` pickles them by
name). Each rank runs ``threads`` intra-op threads (default 1: ``world`` ranks on a
machine of few cores oversubscribe it already). ``start_method="fork"`` starts ranks
without re-importing torch (about 1 s instead of several per rank; the tests use it):
only from a process that holds no threads it needs in the children and is not inside a
``batch_invariant`` block (the children would inherit it); ``spawn`` is always safe.
"""

from __future__ import annotations

import io
import os
import queue as queue_mod
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch

from detsample.errors import DetsampleError
from detsample.inputs import thread_problem
from detsample.inputs.signals import children_ignore_ctrl_c
from detsample.parallel.comm import Comm

DEFAULT_TIMEOUT = 300.0
BACKENDS = ("gloo", "nccl")
START_METHODS = ("spawn", "forkserver", "fork")


class RankError(DetsampleError, RuntimeError):
    """A rank of a :class:`RankGroup` failed, died or did not answer in time. ``rank``:
    which (None: the group as a whole), ``kind``: the rank's exception type name (or
    ``"timeout"`` / ``"died"``)."""

    def __init__(self, message: str, rank: int | None = None, kind: str = "") -> None:
        super().__init__(message)
        self.rank, self.kind = rank, kind


def _dump(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _load(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=True)


def _worker(
    rank: int,
    world: int,
    store: str,
    backend: str,
    timeout: float,
    threads: int,
    init: Callable,
    args: tuple,
    commands: Any,
    replies: Any,
) -> None:
    """One rank: join the group, ``init``, then run commands until ``None``."""
    import torch.distributed as dist

    torch.set_num_threads(threads)
    state = None
    try:
        if backend == "nccl":  # one GPU per rank (written, not run by this project's tests)
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(
            backend, init_method=f"file://{store}", rank=rank, world_size=world, timeout=timedelta(seconds=timeout)
        )
        comm = Comm.from_default_group()
        state = init(comm, *args)
        replies.put((rank, "ready", b""))
    except BaseException as e:  # noqa: BLE001 - reported to the parent, by name
        replies.put((rank, "error", _error(e)))
        _exit(replies)
    try:
        while True:
            cmd = commands.get()
            if cmd is None:
                break
            job, more = cmd
            try:
                out = job(state, comm, *more)
                replies.put((rank, "ok", _dump(out) if rank == 0 else b""))
            except BaseException as e:  # noqa: BLE001
                replies.put((rank, "error", _error(e)))
                break
    finally:
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - the group may be broken already
            pass
    _exit(replies)


def _exit(replies: Any) -> None:
    """Leave a rank at once, once its replies are flushed (the interpreter's teardown of
    torch and gloo takes seconds and has nothing left to do)."""
    replies.close()
    replies.join_thread()
    os._exit(0)


def _error(e: BaseException) -> bytes:
    tb = traceback.format_exception(type(e), e, e.__traceback__)
    return _dump({"type": type(e).__name__, "message": str(e), "traceback": "".join(tb[-3:])})


class RankGroup:
    """``world`` local rank processes in one process group (see the module docstring)."""

    def __init__(
        self,
        world: int,
        init: Callable,
        args: tuple = (),
        *,
        timeout: float = DEFAULT_TIMEOUT,
        threads: int = 1,
        backend: str = "gloo",
        start_method: str = "spawn",
    ) -> None:
        if isinstance(world, bool) or not isinstance(world, int) or world < 1:
            raise ValueError(f"world must be an int >= 1, got {world!r}")
        too_many = thread_problem(world)  # one process per rank, on this machine
        if too_many:
            raise ValueError(f"tensor-parallel size (local rank processes) {too_many}")
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be an int >= 1, got {threads!r}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if start_method not in START_METHODS:
            raise ValueError(f"start_method must be one of {START_METHODS}, got {start_method!r}")
        self.world, self.timeout = world, float(timeout)
        self._dir = tempfile.mkdtemp(prefix="detsample-tp-")
        ctx = torch.multiprocessing.get_context(start_method)
        self._replies = ctx.Queue()
        self._commands = [ctx.Queue() for _ in range(world)]
        store = os.path.join(self._dir, "store")
        self._procs = self._all = [
            ctx.Process(
                target=_worker,
                daemon=True,
                name=f"detsample-tp-rank{r}",
                args=(
                    r,
                    world,
                    store,
                    backend,
                    self.timeout,
                    threads,
                    init,
                    tuple(args),
                    self._commands[r],
                    self._replies,
                ),
            )
            for r in range(world)
        ]
        try:
            with children_ignore_ctrl_c():  # the parent alone handles Ctrl-C
                for p in self._procs:
                    p.start()
            self._collect("start", self.timeout)
        except BaseException:
            self.close()
            raise

    # -- replies -------------------------------------------------------------------------
    def _collect(self, what: str, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        got: dict[int, bytes] = {}
        while len(got) < self.world:
            try:
                rank, status, payload = self._replies.get(timeout=0.5)
            except queue_mod.Empty:
                dead = [r for r, p in enumerate(self._procs) if r not in got and not p.is_alive()]
                if dead:
                    r = dead[0]
                    self._procs[r].join(timeout=1.0)
                    self.close()
                    raise RankError(
                        f"tensor-parallel rank {r} of {self.world} died during {what} (exit code {self._exitcodes[r]})",
                        r,
                        "died",
                    ) from None
                if time.monotonic() > deadline:
                    missing = [r for r in range(self.world) if r not in got]
                    self.close()
                    raise RankError(
                        f"tensor-parallel ranks {missing} of {self.world} did not "
                        f"finish {what} within {timeout:g} s (terminated)",
                        missing[0],
                        "timeout",
                    ) from None
                continue
            if status == "error":
                info = _load(payload)
                died = self._dead_within(1.0)
                self.close()
                if died is not None:  # the others' errors follow from it: name the cause
                    raise RankError(
                        f"tensor-parallel rank {died} of {self.world} died during "
                        f"{what} (exit code {self._exitcodes[died]}); rank {rank} "
                        f"then raised {info['type']}: {info['message']}",
                        died,
                        "died",
                    )
                raise RankError(
                    f"tensor-parallel rank {rank} of {self.world} raised "
                    f"{info['type']} during {what}: {info['message']}\n"
                    f"{info['traceback']}".rstrip(),
                    rank,
                    info["type"],
                )
            got[rank] = payload
        return got[0]

    def _dead_within(self, seconds: float) -> int | None:
        """The first rank found dead (exited with a non-zero code: a rank that reported an
        error leaves with 0) within ``seconds``, or None."""
        end = time.monotonic() + seconds
        while True:
            for r, p in enumerate(self._procs):
                if p.exitcode not in (None, 0):
                    return r
            if time.monotonic() > end:
                return None
            time.sleep(0.05)

    @property
    def _exitcodes(self) -> list[int | None]:
        return [p.exitcode for p in self._all]

    def call(self, job: Callable, *args: Any, timeout: float | None = None) -> Any:
        """``job(state, comm, *args)`` on every rank; rank 0's result. ``timeout``: for
        this call (default: the group's)."""
        if not self._procs:
            raise RankError("the tensor-parallel group is closed")
        for q in self._commands:
            q.put((job, tuple(args)))
        return _load(
            self._collect(getattr(job, "__name__", "a call"), self.timeout if timeout is None else float(timeout))
        )

    # -- lifetime ------------------------------------------------------------------------
    def close(self) -> None:
        """Stop every rank (politely, then terminate after a few seconds) and clean up."""
        procs, self._procs = self._procs, []
        for p, q in zip(procs, self._commands):
            if p.is_alive():
                try:
                    q.put(None)
                except Exception:  # noqa: BLE001
                    pass
        end = time.monotonic() + 5.0
        for p in procs:
            p.join(timeout=max(0.0, end - time.monotonic()))
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=2.0)
            if p.is_alive():
                p.kill()
                p.join(timeout=2.0)
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> RankGroup:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:  # a group nobody closed still stops its ranks
        if getattr(self, "_procs", None):
            self.close()


def launch(
    world: int,
    init: Callable,
    args: tuple,
    job: Callable,
    *more: Any,
    timeout: float = DEFAULT_TIMEOUT,
    threads: int = 1,
    backend: str = "gloo",
    start_method: str = "spawn",
) -> Any:
    """One :meth:`RankGroup.call` on a fresh group, closed afterwards: rank 0's result."""
    with RankGroup(
        world, init, args, timeout=timeout, threads=threads, backend=backend, start_method=start_method
    ) as g:
        return g.call(job, *more)
