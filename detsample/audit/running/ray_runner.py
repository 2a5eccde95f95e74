"""Scale-out on Ray: the audit's shards as Ray tasks, their exact accumulators merged in
file order by the caller, so the report is byte-equal to the one-process run.

Ray is an optional extra (``pip install 'detsample[ray]'``). :func:`ray_session` joins the
Ray instance this process is already connected to, or starts a local one
(:data:`~detsample.audit.running.options.LOCAL_RAY`), or connects to a cluster address; it shuts
down only what it started. On a cluster every node must be able to import detsample and
read the input paths (a shared filesystem): tasks receive paths and options, never data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from detsample.audit.issues import AuditInputError
from detsample.audit.running.options import LOCAL_RAY, AuditOptions
from detsample.errors import DetsampleError

INSTALL_HINT = "pip install 'detsample[ray]'"


class RayUnavailable(DetsampleError, RuntimeError):
    """``--ray`` was asked for but Ray is not installed (the message says how to get it)."""


def import_ray():
    """The ``ray`` module, or :class:`RayUnavailable` naming the extra to install."""
    try:
        import ray
    except ImportError as exc:
        raise RayUnavailable(f"--ray needs Ray, which is not installed: {INSTALL_HINT}") from exc
    return ray


@contextmanager
def ray_session(address: str) -> Iterator[object]:
    """The ray module, connected: to this process's Ray if it already joined one, else to
    a new local instance (``address == LOCAL_RAY``) or to the cluster at ``address``.
    Shuts down on exit only a connection it opened."""
    ray = import_ray()
    started = False
    if not ray.is_initialized():
        kwargs = {"include_dashboard": False, "log_to_driver": False}
        try:
            if address == LOCAL_RAY:
                ray.init(**kwargs)
            else:
                ray.init(address=address, **kwargs)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise AuditInputError(f"--ray {address}: cannot connect to Ray: {exc}") from exc
        started = True
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


def cluster_cpus(ray) -> int:
    """CPUs of the connected Ray cluster (at least 1): the default number of shards."""
    return max(int(ray.cluster_resources().get("CPU", 1)), 1)


def run_tasks(ray, fn: Callable, shards: Sequence, opts: AuditOptions) -> list:
    """``fn(shard, opts)`` for every shard as a Ray task (one CPU each); the results in
    shard order. A task's error is re-raised as itself (an AuditInputError stays one)."""
    task = ray.remote(num_cpus=1)(fn)
    opts_ref = ray.put(opts)
    refs = [task.remote(s, opts_ref) for s in shards]
    try:
        return ray.get(refs)
    except ray.exceptions.RayTaskError as exc:
        cause = exc.as_instanceof_cause()
        raise cause from None
