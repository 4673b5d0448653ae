"""Where a grid's tasks run: worker processes on this machine, Ray tasks, or this process itself.

Every backend takes the tasks (``bench/tasks.py``), runs each through ``tasks.attempt`` and hands each
outcome to the driver's ``sink`` with signals deferred, so that a run that finished is stored whatever
comes next; ``show`` hears how far the running tasks are. ``checkpointing``, when given, is where tasks
save their progress. Only the driver writes to the store.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection, wait

from zerosiam.bench.checkpoint import Checkpointing
from zerosiam.bench.store import Failure, signals_deferred
from zerosiam.bench.tasks import Execution, Outcome, Progress, Show, Sink, Task, attempt, throttled

# tasks, how to run them, where outcomes go, where progress goes, where tasks save their progress
Backend = Callable[[list[Task], Execution, Sink, Show, Checkpointing | None], None]


def default_workers(threads: int) -> int:
    """Parallel runs when none are asked for: as many as the cores hold at ``threads`` threads each."""
    return max(1, (os.cpu_count() or 1) // threads)


def _worker(connection: Connection, execution: Execution, checkpointing: Checkpointing | None = None) -> None:
    """A local worker process: runs the tasks it is sent, one at a time, and sends back the ``Progress``
    of each, then its outcomes. Ctrl-C reaches the whole process group; the driver handles it and stops
    the workers."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(EOFError, BrokenPipeError):  # the driver is gone (even killed): so is the work
        while (task := connection.recv()) is not None:
            report = throttled(connection.send)
            connection.send(attempt(task, execution, report, checkpointing))


@dataclass
class _Worker:
    process: multiprocessing.process.BaseProcess
    connection: Connection
    task: Task | None = None  # what it is running now
    progress: Progress | None = None  # how far it is, as it last said


def run_local(
    todo: list[Task],
    execution: Execution,
    sink: Sink,
    show: Show,
    checkpointing: Checkpointing | None = None,
) -> None:
    """Worker processes (spawned: no fork of a threaded torch), each handed one task at a time; with
    ``device="cuda"`` and several GPUs, worker i computes on GPU i (one worker per visible GPU).

    The driver knows which runs each worker holds, so a worker that dies (SIGKILL, out of memory) fails
    exactly those; a fresh worker takes its place and the grid goes on. Only the wait for workers can
    be interrupted (Ctrl-C, SIGTERM): what has arrived is stored first. On any exit the workers stop.
    """
    context = multiprocessing.get_context("spawn")
    queue = deque(todo)
    devices = worker_devices(execution)
    size = min(execution.workers or len(devices) or default_workers(execution.threads), len(todo))

    def start(index: int) -> _Worker:
        ours, theirs = context.Pipe()
        on_its_device = replace(execution, device=devices[index % len(devices)]) if devices else execution
        # not a daemon: its run may start DataLoader workers of its own; it ends with the driver's pipe
        args = (theirs, on_its_device, checkpointing)
        process = context.Process(target=_worker, args=args)
        process.start()
        theirs.close()
        return _Worker(process, ours)

    pool: list[_Worker] = []
    try:
        pool.extend(start(index) for index in range(size))
        while queue or any(w.task is not None for w in pool):
            for index, worker in enumerate(pool):
                if worker.task is None and queue:
                    if not worker.process.is_alive():  # died between runs: nothing of ours was lost
                        _stop(worker)
                        pool[index] = worker = start(index)
                    worker.task, worker.progress = queue.popleft(), None
                    worker.connection.send(worker.task)
            busy = [w for w in pool if w.task is not None]
            wait([*(w.connection for w in busy), *(w.process.sentinel for w in busy)])
            with signals_deferred():
                for index, worker in enumerate(pool):
                    outcomes = _collect(worker)
                    if outcomes is None:
                        continue
                    worker.task = None
                    if not worker.process.is_alive():
                        worker.connection.close()
                        pool[index] = start(index)
                    for outcome in outcomes:
                        sink(outcome)
            show([w.progress for w in pool if w.task is not None and w.progress is not None])
    finally:
        for worker in pool:
            _stop(worker)


def _collect(worker: _Worker) -> list[Outcome] | None:
    """The outcomes of the worker's task if they are there now: its results, or a ``Failure`` of each
    of its runs if it died. A ``Progress`` message is kept on the worker."""
    if worker.task is None:
        return None
    try:
        if worker.connection.poll():
            message = worker.connection.recv()
            if not isinstance(message, Progress):
                return message
            worker.progress = message
            return None
    except (EOFError, OSError):
        pass
    else:
        if worker.process.is_alive():
            return None
    worker.process.join()
    died = f"the worker process died ({_death(worker.process.exitcode)})"
    return [Failure(values, died, "") for values in worker.task]


def _death(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name
        return f"killed by {name}" + (", out of memory?" if name == "SIGKILL" else "")
    return f"exit code {exitcode}"


def _stop(worker: _Worker) -> None:
    if worker.process.is_alive():
        with contextlib.suppress(OSError, BrokenPipeError):
            worker.connection.send(None)
        worker.process.join(timeout=0 if worker.task is not None else 5)
        if worker.process.is_alive():
            worker.process.kill()
            worker.process.join()
    worker.connection.close()


def run_ray(
    todo: list[Task],
    execution: Execution,
    sink: Sink,
    show: Show,
    checkpointing: Checkpointing | None = None,
) -> None:
    """One Ray task per task of runs; the driver collects results as they finish and writes them. A task
    that raises, or whose worker dies, is a ``Failure`` of each of its runs. Ray tasks do not report
    their steps (``show`` is not called)."""
    try:
        import ray
    except ImportError:
        raise RuntimeError("the Ray backend needs Ray: pip install 'zerosiam[ray]'") from None
    started_here = not ray.is_initialized()
    threads, address = execution.threads, execution.address
    if started_here:
        ray.init(
            address=address,
            num_cpus=None if address else (execution.workers or default_workers(threads)) * threads,
            include_dashboard=False,
            log_to_driver=False,
        )
    try:
        # with GPU resources, Ray makes the run's GPU the task's only visible one: "cuda" is that GPU
        on_its_gpu = replace(execution, device="cuda") if execution.gpus_per_run > 0 else execution
        task = ray.remote(num_cpus=threads, num_gpus=execution.gpus_per_run, max_retries=0)(attempt)
        tasks = {task.remote(runs, on_its_gpu, None, checkpointing): runs for runs in todo}
        refs = list(tasks)
        while refs:
            done, refs = ray.wait(refs, num_returns=1)
            with signals_deferred():
                try:
                    outcomes = ray.get(done[0])
                except Exception as error:  # the task's worker died (ray.exceptions.WorkerCrashedError, ...)
                    outcomes = [Failure.of(values, error) for values in tasks[done[0]]]
                for outcome in outcomes:
                    sink(outcome)
    finally:
        if started_here:
            ray.shutdown()


def run_inline(
    todo: list[Task],
    execution: Execution,
    sink: Sink,
    show: Show,
    checkpointing: Checkpointing | None = None,
) -> None:
    """Tasks one after another in this process: for debugging and tests (peak memory is the process's)."""
    report = throttled(lambda progress: show([progress]))
    for task in todo:
        outcomes = attempt(task, execution, report, checkpointing)
        with signals_deferred():
            for outcome in outcomes:
                sink(outcome)
        show([])


def worker_devices(execution: Execution) -> list[str]:
    """One device per local worker when the grid runs on every visible GPU (``device="cuda"`` or
    ``"auto"`` with several GPUs); empty when every worker uses ``execution.device``."""
    import torch

    if execution.device in ("cuda", "auto") and torch.cuda.device_count() > 1:
        return [f"cuda:{index}" for index in range(torch.cuda.device_count())]
    return []


BACKENDS: dict[str, Backend] = {"local": run_local, "ray": run_ray, "inline": run_inline}
