"""A warm SuperExec for Flower SuperNodes: each ClientApp task runs in a fork of one
process that has already imported torch, Flower and FedGMR (and, optionally, built the
node's data and model), instead of in a fresh ``flwr-clientapp`` process.

Flower 1.42 runs every message a SuperNode receives in a new ``flwr-clientapp`` process:
the SuperNode's SuperExec (``--isolation subprocess``, the default) or a separate
``flower-superexec`` (``--isolation process``) starts ``flwr-clientapp --token ...``, which
pulls one message, runs the ClientApp, pushes the reply and exits. Each reply therefore
pays Python's, torch's and Flower's import time and the ClientApp's data loading.

``fedgmr flower superexec`` is a drop-in for ``flower-superexec`` beside a SuperNode
started with ``--isolation process``. It runs Flower's own SuperExec loop
(:func:`flwr.supercore.superexec.run_superexec.run_superexec`: task acquisition,
authentication, signal handling are Flower's) with :class:`ForkExecutor` as the executor:
a ClientApp task is run by :func:`flwr.supernode.runtime.run_clientapp.run_clientapp` in a
child forked from the warm process, so the child starts with everything imported and,
with ``--warm-config``, with the node's :class:`~fedgmr.sim.executor.ClientWorkload`
already built. Each task still gets its own process (Flower's isolation of one task from
the next is kept: a crash or a leak ends with the child). Other task types (none reach a
SuperNode's SuperExec today) are started as Flower starts them.

This uses two Flower internals, both of 1.42: the ``Executor`` protocol of
``flwr.supercore.superexec.executor`` and ``run_superexec``'s lookup of ``get_executor``.
:func:`check_flower_internals` says clearly when an installed Flower lacks them.

With ``pull_backoff`` (``--pull-backoff S``) a ClientApp that asks the SuperNode for its
message's objects before the SuperNode has them all (the SuperNode hands out the task first,
then pulls the objects from the SuperLink) retries after at most ``S`` seconds instead of
Flower's 1 s, doubling up to 10 s: the forks' ``run_clientapp`` module is given a
``pull_and_inflate_object_from_tree`` with that back-off (a third 1.42 internal, checked by
:func:`check_pull_internals`), in this process only and put back when the loop ends.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Iterable

log = logging.getLogger(__name__)

#: what Flower's SuperExec waits between task polls when FLWR_SUPEREXEC_TASK_POLL_INTERVAL
#: is unset (1 s); the warm SuperExec polls faster unless told otherwise
DEFAULT_POLL_INTERVAL = 0.2
POLL_ENV = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"


def check_flower_internals() -> None:
    """Raise ``RuntimeError`` naming what is missing when the installed Flower does not
    have the SuperExec internals the warm SuperExec builds on (Flower 1.42's)."""
    try:
        import flwr
        from flwr.supercore.constant import TaskType  # noqa: F401
        from flwr.supercore.superexec import run_superexec as _rs
        from flwr.supercore.superexec.executor import LaunchResult  # noqa: F401
        from flwr.supernode.runtime.run_clientapp import run_clientapp  # noqa: F401
    except ImportError as err:
        raise RuntimeError(f"the warm SuperExec needs Flower 1.42's SuperExec internals ({err}); use "
                           "flower-superexec (a ClientApp process per message) with this Flower") from err
    if not hasattr(_rs, "get_executor") or not hasattr(_rs, "run_superexec"):
        raise RuntimeError(f"Flower {flwr.__version__}'s run_superexec has no get_executor: the warm SuperExec "
                           "supports Flower 1.42; use flower-superexec with this Flower")


def check_pull_internals() -> Any:
    """Return Flower's ``run_clientapp`` module; raise ``RuntimeError`` when it does not pull
    a task's message through its global ``pull_and_inflate_object_from_tree`` (1.42)."""
    import flwr
    import flwr.supernode.runtime.run_clientapp as rc

    from fedgmr.flower.fast_supernode import _uses

    task_input = getattr(rc, "pull_task_input", None)
    if (not callable(rc.__dict__.get("pull_and_inflate_object_from_tree")) or task_input is None
            or not _uses(task_input.__code__, "pull_and_inflate_object_from_tree")):
        raise RuntimeError(f"Flower {flwr.__version__}'s run_clientapp does not pull a message through "
                           "pull_and_inflate_object_from_tree: --pull-backoff supports Flower 1.42; leave it out "
                           "with this Flower")
    return rc


def _exit_code(code: Any) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    return 1


#: the signals that stop a ClientApp child: blocked across the fork until the child has its own handlers
STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})


def _run_clientapp_child(spec: Any, mask: Iterable[int] = ()) -> None:
    """In the forked child: run one ClientApp task as ``flwr-clientapp`` would, then
    leave with its exit status (never returns). The child starts with :data:`STOP_SIGNALS`
    blocked (the parent blocks them across the fork): it sets their default actions, then
    restores ``mask`` (the parent's mask before the fork), so that a stop sent the moment it
    was forked ends it, never the parent's handlers run in it."""
    code, t0 = 1, 0.0
    try:  # nothing may raise out of here: an exception would return into the parent's code in the child
        t0 = time.perf_counter()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        from flwr.supercore.tls import validate_and_resolve_root_certificates
        from flwr.supernode.runtime.run_clientapp import run_clientapp

        run_clientapp(runtime_api_address=spec.runtime_api_address, token=spec.token, insecure=spec.insecure,
                      certificates=validate_and_resolve_root_certificates(spec.root_certificates_path,
                                                                          spec.insecure),
                      parent_pid=spec.parent_pid, runtime_dependency_install=spec.runtime_dependency_install)
        code = 0
    except SystemExit as e:  # flwr_exit ends every task with sys.exit
        code = _exit_code(e.code)
    except BaseException:  # noqa: BLE001 - the child must never return into the parent's loop
        traceback.print_exc()
    finally:
        try:
            log.info("task %d: ClientApp process %d done in %.2f s (status %d)", spec.task_id, os.getpid(),
                     time.perf_counter() - t0, code)
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


class ForkExecutor:
    """Flower's SuperExec ``Executor`` that runs ClientApp tasks in forks of this process.

    ``launched`` counts the forks (for tests and benchmarks); ``reconcile`` (called by
    Flower's loop before every poll) reaps finished children and logs any that failed.
    """

    def __init__(self, fallback: Any | None = None) -> None:
        from flwr.supercore.superexec.executor.subprocess_executor import SubprocessExecutor

        self.fallback = fallback if fallback is not None else SubprocessExecutor()
        self.children: dict[int, int] = {}  # pid -> task id
        self.launched = 0

    def get_eligible_capacity(self, supported_task_types: set, *, insecure: bool = False,
                              root_certificates_path: str | None = None) -> tuple[set, set[str]]:
        return set(supported_task_types), set()

    def wait_for_capacity(self, task_type: Any = None, *, fab_hash: str | None = None, insecure: bool = False,
                          root_certificates_path: str | None = None) -> None:
        return None

    def launch(self, spec: Any) -> Any:
        from flwr.supercore.constant import TaskType
        from flwr.supercore.superexec.executor import LaunchResult

        if spec.task_type != TaskType.CLIENT_APP:
            return self.fallback.launch(spec)
        sys.stdout.flush()
        sys.stderr.flush()
        # a SIGTERM that reached the child before it set its own handlers would run the
        # parent's there (which may ignore it): block the stop signals across the fork
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            pid = os.fork()
        except OSError as err:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            return LaunchResult.failed(f"fork failed: {err}")
        if pid == 0:
            _run_clientapp_child(spec, mask)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        self.children[pid] = spec.task_id
        self.launched += 1
        log.info("task %d: ClientApp in forked process %d", spec.task_id, pid)
        return LaunchResult.accepted()

    def reconcile(self) -> None:
        for pid in list(self.children):
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done, status = pid, 0
            if done:
                task = self.children.pop(pid)
                code = os.waitstatus_to_exitcode(status)
                if code != 0:
                    log.warning("task %d: ClientApp process %d exited with status %d", task, pid, code)

    def close(self, grace_s: float = 10.0) -> None:
        """Stop the children still running: SIGTERM (each pushes its task's failure), then,
        for any still running after ``grace_s`` seconds, SIGKILL; every child that ends is reaped."""
        if not self._stop_children(signal.SIGTERM, grace_s):
            log.warning("ClientApp processes %s still running %.0f s after SIGTERM: killed",
                        sorted(self.children), grace_s)
            if not self._stop_children(signal.SIGKILL, grace_s):  # stuck in the kernel: say so, do not hang
                log.error("ClientApp processes %s did not end on SIGKILL", sorted(self.children))
        self.fallback.close()

    def _stop_children(self, signum: int, within_s: float) -> bool:
        """Send ``signum`` to every child, then reap those that end within ``within_s``
        seconds; whether none is left."""
        for pid in list(self.children):
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + within_s
        while self.children and time.monotonic() < deadline:
            self.reconcile()
            time.sleep(0.05)
        return not self.children


def warm_up(config: str | Path | None = None, seed: int | None = None, torch_threads: int = 1) -> None:
    """Import what a FedGMR ClientApp needs, and with ``config`` build its workload (data,
    partition, model), so that forked children start with it.

    Torch's intra-op pool is set to ``torch_threads`` here, before any torch work: a forked
    child cannot use a thread pool its parent started (the ClientApp sets its own count
    from the config's ``run.torch_threads``)."""
    import torch

    torch.set_num_threads(torch_threads)
    import fedgmr.flower.client_app  # noqa: F401 - the ClientApp the FAB names
    from fedgmr.flower.client import load_run_config, workload_for

    if config is not None:
        run_config: dict[str, Any] = {"config": str(config)}
        if seed is not None:
            run_config["seed"] = seed
        workload_for(load_run_config(run_config))


def run_warm_superexec(runtime_api_address: str, insecure: bool = False, root_certificates: str | None = None,
                       warm_config: str | Path | None = None, seed: int | None = None,
                       poll_interval: float | None = None, parent_pid: int | None = None,
                       superexec_auth_secret: bytes | None = None, pull_backoff: float | None = None) -> None:
    """Run Flower's SuperExec loop with :class:`ForkExecutor` (blocks until stopped); with
    ``pull_backoff``, the forked ClientApps back off at most that long when their message's
    objects are not at the SuperNode yet."""
    check_flower_internals()
    if pull_backoff is not None and not pull_backoff > 0:
        raise ValueError(f"--pull-backoff must be positive, got {pull_backoff}")
    rc = check_pull_internals() if pull_backoff is not None else None
    if poll_interval is not None:
        os.environ[POLL_ENV] = str(poll_interval)
    else:
        os.environ.setdefault(POLL_ENV, str(DEFAULT_POLL_INTERVAL))
    warm_up(warm_config, seed)
    from flwr.supercore.superexec import run_superexec as rs

    executor = ForkExecutor()
    rs.get_executor = lambda *args, **kwargs: executor  # Flower's loop, our executor
    original = rc.__dict__["pull_and_inflate_object_from_tree"] if rc is not None else None
    if rc is not None:
        from fedgmr.flower.fast_supernode import capped_backoff

        rc.pull_and_inflate_object_from_tree = capped_backoff(original, pull_backoff)
    try:
        rs.run_superexec(runtime_api_address=runtime_api_address, insecure=insecure,
                         root_certificates_path=root_certificates, superexec_auth_secret=superexec_auth_secret,
                         parent_pid=parent_pid)
    finally:
        if rc is not None:
            rc.pull_and_inflate_object_from_tree = original
