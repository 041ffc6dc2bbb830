"""Executors that train client jobs in other processes: a local process pool and Ray.

Both implement the :class:`~fedgmr.sim.executor.Executor` protocol: ``submit`` returns at
once with a handle, and the simulator asks for the result only when the job's upload
arrives on the virtual clock - so every job in flight at the same virtual time trains in
parallel. A job's inputs (start vector, buffers, mask, seed) are fixed at dispatch and
each worker trains with the same number of torch threads as the serial executor, so the
results - and hence the metrics - are bit-identical to :class:`SerialExecutor`'s.

Each worker holds the :class:`~fedgmr.sim.executor.ClientWorkload` (client data and one
model instance) for its whole life; only jobs and results cross process boundaries.
Those crossings are between processes of one trusted run (multiprocessing and Ray
serialise them with pickle); nothing here reads data from the network or from disk.
What crosses is on the CPU: jobs are moved there before they are sent, results before
they are returned; each worker resolves the run's device (``run.device``) itself and
trains there. With a GPU the pool starts its workers with ``spawn`` (CUDA does not
survive ``fork``).

Workers never outlive the run: process-pool workers die with their parent, however it
ends (``kill -9`` included: ``PR_SET_PDEATHSIG`` on Linux, and a watchdog thread that
notices the parent is gone on every platform), and ``close`` stops them without waiting
for jobs nobody needs any more. Ray actors are killed on ``close``, and a Ray instance
started here is shut down.
"""

from __future__ import annotations

import copy
import ctypes
import io
import logging
import multiprocessing as mp
import os
import pickle
import signal
import sys
import threading
import time
from concurrent.futures import Future
from concurrent.futures import ProcessPoolExecutor as _Pool
from concurrent.futures.process import BrokenProcessPool
from dataclasses import replace
from multiprocessing.reduction import ForkingPickler
from typing import TYPE_CHECKING, Any

import torch

from fedgmr.device import resolve_device, to_device
from fedgmr.sim.executor import ClientWorkload, JobResult, TrainJob

if TYPE_CHECKING:  # pragma: no cover
    from fedgmr.config import ExperimentConfig

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------- process pool
_WORKLOAD: ClientWorkload | None = None


def _own_model(workload: ClientWorkload) -> ClientWorkload:
    """The workload with private copies of everything but the client data.

    Client data is read-only and may stay shared, but the model (and whatever the
    workload keeps bound to it, such as a reused optimiser) is trained in place:
    workloads that arrive through torch's multiprocessing pickler (``spawn``) have their
    tensors in shared memory, which every worker would otherwise train at once.
    """
    shared = (workload.client_data, workload.client_val)  # lists of pairs, or ClientShards (views of one storage)
    memo: dict[int, Any] = {id(t): t for split in shared for pair in split for t in pair}
    memo.update({id(split): split for split in shared})
    return copy.deepcopy(workload, memo)


#: how often a worker's watchdog checks that its parent is alive (seconds)
WATCHDOG_INTERVAL = 1.0
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def _watch_parent(parent_pid: int, interval: float) -> None:
    """Exit this process as soon as ``parent_pid`` is no longer its parent (it died and
    the worker was re-parented)."""
    while True:
        if os.getppid() != parent_pid:
            os._exit(1)
        time.sleep(interval)


def die_with_parent(parent_pid: int | None = None, interval: float = WATCHDOG_INTERVAL) -> None:
    """Make this (worker) process end when its parent ``parent_pid`` (default: the
    current parent, e.g. a fork server) dies.

    On Linux the kernel sends SIGKILL at once (``prctl(PR_SET_PDEATHSIG)``; it fires
    when the parent *thread* that started the worker ends, which for the pool is the
    thread that runs the simulation). A daemon thread checks ``os.getppid()`` every
    ``interval`` seconds everywhere, and a parent that died before this call is caught
    right away.
    """
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
                log.debug("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
        except (OSError, AttributeError):  # pragma: no cover - exotic libc
            log.debug("prctl is not available; relying on the watchdog thread")
    if parent_pid is None:
        parent_pid = os.getppid()
    elif os.getppid() != parent_pid:  # the parent died before the kernel could be told
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent_pid, interval), name="fedgmr-parent-watchdog",
                     daemon=True).start()


def _init_worker(workload: ClientWorkload, threads: int, parent_pid: int | None = None,
                 device: str = "cpu") -> None:
    """Runs once in each worker: die with the parent (``parent_pid``, or the process
    that started the worker), leave Ctrl-C to the parent (it closes the pool), keep the
    workload on ``device`` (a ``run.device`` value, resolved here), pin torch's thread count."""
    global _WORKLOAD
    die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(threads)
    _WORKLOAD = _own_model(workload).to(resolve_device(device))


#: CPU tensors smaller than this travel as bytes inside a pool message; larger ones through
#: torch's shared memory (one copy into a shared file, then only its handle per message)
WIRE_INLINE_BYTES = 1 << 20


def _tensor_from_array(array: Any) -> torch.Tensor:
    return torch.from_numpy(array)


class _WirePickler(ForkingPickler):
    """multiprocessing's pickler, but small CPU tensors travel as numpy bytes.

    torch's reduction moves every tensor to a shared-memory file and passes its descriptor
    over a separate authenticated connection: about a millisecond per tensor, paid for
    every job and every result (a job of the 6 k-parameter CNN carries four, a result
    one or more), which is as much as a 5-step job's training. Copying the bytes of a
    tensor under :data:`WIRE_INLINE_BYTES` costs microseconds; a larger one (a big
    model's start vector, shared by a dispatch wave) keeps the shared-memory path, where
    it is copied once and each later job sends its handle."""

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is torch.Tensor and obj.device.type == "cpu" and obj.layout == torch.strided \
                and obj.numel() * obj.element_size() < WIRE_INLINE_BYTES:
            try:
                return _tensor_from_array, (obj.detach().numpy(),)
            except (TypeError, RuntimeError):  # a dtype numpy has not (bfloat16): torch's way
                return NotImplemented
        return NotImplemented


def wire_dumps(obj: Any) -> bytes:
    """``obj`` as one pool message (:class:`_WirePickler`)."""
    buf = io.BytesIO()
    _WirePickler(buf, pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def _run_job(payload: bytes) -> bytes:
    assert _WORKLOAD is not None, "worker was not initialised"
    return wire_dumps(_WORKLOAD.run(pickle.loads(payload)).to("cpu"))


#: how often a handle waiting for its result checks that the pool's workers are alive (seconds)
LIVENESS_INTERVAL = 1.0


class _FutureHandle:
    def __init__(self, future: Future[bytes], workers_lost: Any) -> None:
        self.future = future
        self._workers_lost = workers_lost
        self._value: JobResult | None = None

    def result(self) -> JobResult:
        if self._value is None:
            while True:
                try:
                    raw = self.future.result(timeout=LIVENESS_INTERVAL)
                    break
                except TimeoutError:
                    # a worker that died while it wrote a reply leaves the pool's reader waiting
                    # for the rest of the message: say so instead of waiting forever
                    if not self.future.done() and self._workers_lost():
                        raise BrokenProcessPool("a process-pool worker died while jobs were in flight") from None
            self._value = pickle.loads(raw)
            self.future = None  # type: ignore[assignment]  # the bytes are not needed any more
        return self._value


class ProcessPoolExecutor:
    """Trains jobs in ``workers`` local processes.

    With the ``fork`` start method (the default where the platform has it) the workers
    inherit the workload from the parent, copy-on-write, so it is never serialised;
    with ``spawn``/``forkserver`` it is sent to each worker once, at start-up.

    Parameters
    ----------
    workload: client data and model, shared by every job.
    workers: number of processes (default: the machine's CPU count).
    threads: torch threads in each worker; must equal the serial run's count for
        identical results (``run.torch_threads``, default 1).
    start_method: multiprocessing start method (default ``fork`` where available and the
        workers train on the CPU, else ``spawn``).
    device: where the workers train (a ``run.device`` value, resolved in each worker).
    """

    def __init__(self, workload: ClientWorkload, workers: int | None = None, threads: int = 1,
                 start_method: str | None = None, device: str = "cpu") -> None:
        if start_method is None:
            on_cpu = resolve_device(device).type == "cpu"  # a forked child cannot use a GPU
            start_method = "fork" if on_cpu and "fork" in mp.get_all_start_methods() else "spawn"
        workload = workload.to("cpu")  # sent to (or inherited by) the workers; each moves its copy
        self.workers = workers or os.cpu_count() or 1
        self.threads = threads
        ctx = mp.get_context(start_method)
        self._pool = _Pool(max_workers=self.workers, mp_context=ctx, initializer=_init_worker,
                           # a fork server, not this process, starts forkserver workers
                           initargs=(workload, threads, None if start_method == "forkserver" else os.getpid(),
                                     device))
        self._closed = False
        self._procs: dict[int, Any] = {}  # every worker started (the pool forgets them at shutdown)

    def submit(self, job: TrainJob) -> _FutureHandle:
        future = self._pool.submit(_run_job, wire_dumps(job.to("cpu")))
        if len(self._procs) < self.workers:  # started at the first submits
            self._procs.update(getattr(self._pool, "_processes", None) or {})
        return _FutureHandle(future, self._workers_lost)

    def _workers_lost(self) -> bool:
        return self._closed or any(not p.is_alive() for p in list(self._procs.values()))

    def worker_pids(self) -> list[int]:
        """Process ids of the live workers (started at the first submit)."""
        procs = getattr(self._pool, "_processes", None) or {}
        return [p.pid for p in list(procs.values()) if p.pid is not None and p.is_alive()]

    def close(self) -> None:
        """Stop the workers now: queued jobs are cancelled and running ones, whose
        results nobody will ask for, are terminated rather than awaited. Idempotent."""
        if self._closed:
            return
        self._closed = True
        procs = list((getattr(self._pool, "_processes", None) or {}).values())
        # (taken before shutdown(), which lets go of them)
        queue = getattr(self._pool, "_result_queue", None)
        manager = getattr(self._pool, "_executor_manager_thread", None)
        self._pool.shutdown(wait=False, cancel_futures=True)
        for p in procs:
            try:
                if p.is_alive():
                    p.terminate()
            except (ValueError, OSError):  # already closed or gone
                pass
        for p in procs:
            try:
                p.join(timeout=10)
                if p.is_alive():
                    p.kill()
                    p.join(timeout=10)
            except (ValueError, OSError, AssertionError):
                pass
        # a worker terminated while it wrote a result leaves half a message in the result
        # pipe; with this process's own (never used) write end closed, the pool's reader gets
        # end-of-file now that the workers are gone, instead of waiting for the rest forever
        # (and holding up this call, or the interpreter's exit, which joins it)
        try:
            if queue is not None:
                queue._writer.close()
        except (AttributeError, OSError):
            pass
        if manager is not None:
            manager.join(timeout=30)
        self._pool.shutdown(wait=True)


def make_process_executor(workload: ClientWorkload, cfg: "ExperimentConfig") -> ProcessPoolExecutor:
    """``executor: process`` in a config (``run.workers``, ``run.torch_threads``, ``run.device``)."""
    return ProcessPoolExecutor(workload, cfg.run.workers, cfg.run.torch_threads or 1,
                               device=getattr(cfg.run, "device", "cpu"))


# ---------------------------------------------------------------------- Ray
def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - depends on the environment
        from fedgmr.errors import ConfigError

        raise ConfigError("run.executor 'ray' needs Ray: pip install 'fedgmr[ray]'") from exc
    return ray


def _actor_device(device: str) -> str:
    """An actor's ``run.device``: a CUDA index names the driver's GPUs, but Ray shows an
    actor only the GPU it assigned it (as ``cuda``)."""
    return "cuda" if device.startswith("cuda") else device


class _ClientActor:
    """A Ray actor holding the workload; ``run`` trains one job."""

    def __init__(self, workload: ClientWorkload, threads: int, device: str = "cpu") -> None:
        torch.set_num_threads(threads)
        self.workload = _own_model(workload).to(resolve_device(_actor_device(device)))

    def run(self, job: TrainJob, start: torch.Tensor, buffers: dict[str, torch.Tensor],
            mask: torch.Tensor | None) -> JobResult:
        return self.workload.run(replace(job, start=start, buffers=buffers, mask=mask)).to("cpu")

    def ready(self) -> bool:
        return True


class _RayHandle:
    def __init__(self, ray: Any, ref: Any) -> None:
        self._ray = ray
        self.ref = ref
        self._value: JobResult | None = None

    def result(self) -> JobResult:
        if self._value is None:
            self._value = self._ray.get(self.ref)
            self.ref = None  # let Ray free the object
        return self._value


class RayExecutor:
    """Trains jobs on Ray actors that each hold the workload.

    Starts a local Ray instance, or joins an existing cluster when ``address`` is given
    (``"auto"`` or ``"HOST:PORT"`` of a ``ray start --head``). If Ray is already
    initialised in this process, that instance is used and left running on close.

    The start vector and buffers of a dispatch wave are the same objects for every job in
    it, so they are ``ray.put`` once per wave; per-level masks likewise once per wave.

    Parameters
    ----------
    workload: client data and model; ``ray.put`` once and handed to every actor.
    workers: number of actors (default: the cluster's CPU count).
    threads: torch threads per actor (one CPU each is reserved).
    address: cluster address, or None for a local instance.
    init_options: extra keyword arguments for ``ray.init``.
    device: where the actors train (a ``run.device`` value). When it is a GPU here, each
        actor reserves an equal share of the cluster's GPUs and trains on the one Ray
        assigns it.
    """

    def __init__(self, workload: ClientWorkload, workers: int | None = None, threads: int = 1,
                 address: str | None = None, init_options: dict[str, Any] | None = None,
                 device: str = "cpu") -> None:
        ray = _import_ray()
        self._ray = ray
        self._owns_ray = False
        self.actors: list[Any] = []
        self._refs: dict[int, Any] = {}
        self._wave_keep: tuple[Any, ...] = ()
        if not ray.is_initialized():
            opts: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True,
                                    "configure_logging": False}
            if address is None:
                opts["num_cpus"] = workers or os.cpu_count() or 1
            opts.update(init_options or {})
            ray.init(address=address, **opts)
            self._owns_ray = True
        try:
            n = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
            gpus = 0.0
            if resolve_device(device).type == "cuda":  # Ray hides GPUs from actors that reserve none
                gpus = min(1.0, float(ray.cluster_resources().get("GPU", 0)) / n)
            actor_cls = ray.remote(num_cpus=1, num_gpus=gpus)(_ClientActor)
            ref = ray.put(workload.to("cpu"))
            for _ in range(n):
                self.actors.append(actor_cls.remote(ref, threads, device))
            ray.get([a.ready.remote() for a in self.actors])
        except BaseException:  # Ctrl-C or a failed actor: release what was started
            self.close()
            raise
        self._pending: list[list[Any]] = [[] for _ in self.actors]
        self._wave_key: tuple[int, int] | None = None

    def _put(self, obj: Any) -> Any:
        """One ObjectRef per distinct object of the current wave (its tensors sent from the CPU)."""
        key = id(obj)
        if key not in self._refs:
            self._refs[key] = self._ray.put(to_device(obj, "cpu") if isinstance(obj, dict) else obj.to("cpu"))
            self._wave_keep += (obj,)  # keep ids valid while cached
        return self._refs[key]

    def _least_busy(self) -> int:
        for i, refs in enumerate(self._pending):
            if refs:
                _, not_done = self._ray.wait(refs, num_returns=len(refs), timeout=0)
                self._pending[i] = not_done
        return min(range(len(self.actors)), key=lambda i: len(self._pending[i]))

    def submit(self, job: TrainJob) -> _RayHandle:
        wave = (id(job.start), id(job.buffers))
        if wave != self._wave_key:
            self._wave_key = wave
            self._refs = {}
            self._wave_keep = ()
        start, buffers = self._put(job.start), self._put(job.buffers)
        mask = None if job.mask is None else self._put(job.mask)
        i = self._least_busy()
        # the rest (upload mask, extras, client state) travels inside the job, from the CPU
        light = replace(job, start=torch.empty(0), buffers={}, mask=None).to("cpu")
        ref = self.actors[i].run.remote(light, start, buffers, mask)
        self._pending[i].append(ref)
        return _RayHandle(self._ray, ref)

    def close(self) -> None:
        """Kill the actors; shut Ray down only if this executor started it. Idempotent;
        the runner calls it on every exit path (errors and Ctrl-C included)."""
        actors, self.actors = self.actors, []
        self._pending = []
        self._refs = {}
        self._wave_keep = ()
        try:
            for a in actors:
                try:
                    self._ray.kill(a)
                except Exception:  # noqa: BLE001 - best effort on shutdown
                    log.debug("could not kill a Ray actor", exc_info=True)
        finally:
            if self._owns_ray:
                self._owns_ray = False
                self._ray.shutdown()


def make_ray_executor(workload: ClientWorkload, cfg: "ExperimentConfig") -> RayExecutor:
    """``executor: ray`` in a config (``run.workers``, ``run.torch_threads``, ``run.ray_address``,
    ``run.device``)."""
    return RayExecutor(workload, cfg.run.workers, cfg.run.torch_threads or 1,
                       getattr(cfg.run, "ray_address", None), device=getattr(cfg.run, "device", "cpu"))
