"""The ranks of a tensor-parallel run: how they start, how rank 0 talks to the others, how a lost
rank ends the run.

Start: under torchrun (RANK and WORLD_SIZE set) every process joins the group torchrun describes;
otherwise rank 0 starts the others itself, on this machine, as child processes (python -c ...
follow()) that rendezvous at a TCPStore rank 0 opens on 127.0.0.1 (a port the OS picks), at
most one per CPU core (or GPU): checked before any starts.
Backends: gloo on CPU, NCCL on CUDA (one GPU per rank, by LOCAL_RANK) for the model's collectives;
rank 0's messages (what to load, each forward call) always go over a gloo group of their own.

Failure, within bounded time, never a silent hang:
- every collective has a timeout (`timeout`, 120 s by default): a rank that hangs makes the
  others' next collective fail;
- a rank that dies closes its sockets: the others' next collective fails at once;
- rank 0 sends a heartbeat when idle (every timeout / 4) that every rank answers, so the others
  notice a lost rank 0, and rank 0 a dead or hung rank, even while no request runs;
- rank 0 watches the processes it started: one that exits ends the run with its exit status;
  they watch rank 0 in turn, and die with it (parallel_parent.py): none is ever left behind.
A failure is reported once (RankFailed, a ConnectionError: the CLI prints it as one line) and to
every callback registered (the server stops).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

DEFAULT_TIMEOUT = 120.0  # seconds a collective waits for the other ranks
STARTUP_TIMEOUT = 1800.0  # seconds every rank has to load its model
BEAT = "beat"  # rank 0 is alive and idle; every rank answers (a barrier)
STOP = "stop"  # the run is over: leave the group


class RankFailed(ConnectionError):
    """A rank of a tensor-parallel run died, hung, or fell out of step: the run cannot go on."""


class RankGroup:
    """This process's place among the ranks, and rank 0's line to the others."""

    def __init__(self, rank: int, world: int, device: torch.device, timeout: float,
                 children: list[subprocess.Popen]):
        self.rank, self.world, self.device, self.timeout = rank, world, device, timeout
        self.children = children  # the ranks this process started (rank 0 without torchrun)
        self.control = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout))
        self.group = None  # the model's collectives: the default group
        self.lock = threading.Lock()  # one message or forward pass at a time
        self.failure: str | None = None
        self._callbacks: list = []
        self._failing = threading.Lock()  # failures may be found by several threads at once
        self._closed = threading.Event()
        self._last_sent = time.monotonic()
        if rank == 0:
            for target in (self._beat, self._watch):
                threading.Thread(target=target, name=f"nexttok-tp-{target.__name__[1:]}", daemon=True).start()

    # -- messages (rank 0 sends, the others receive) --------------------------------------------

    def send(self, message) -> None:
        """Rank 0: one message to every other rank (hold self.lock: see talking())."""
        dist.broadcast_object_list([message], src=0, group=self.control)
        self._last_sent = time.monotonic()

    def receive(self):
        """The other ranks: rank 0's next message (waits at most the timeout: rank 0 beats, and
        each beat is answered, so that rank 0 knows this rank is alive too)."""
        while True:
            box = [None]
            dist.broadcast_object_list(box, src=0, group=self.control)
            if box[0] != BEAT:
                return box[0]
            dist.barrier(group=self.control)

    @contextlib.contextmanager
    def talking(self):
        """Rank 0: hold the line for a message and the work that follows it. A collective that fails
        in here fails the group: the ranks may be out of step."""
        with self.lock:
            if self.failure:
                raise RankFailed(self.failure)
            try:
                yield
            except RuntimeError as e:  # gloo and NCCL errors (DistBackendError is one)
                raise RankFailed(self.fail(self._lost_child(1.0) or f"{type(e).__name__}: {e}")) from None
            except KeyboardInterrupt:  # mid-call: the others may wait in a collective; close() won't wait
                self.fail("interrupted")
                raise

    def gather_status(self, error: str | None) -> list[str | None]:
        """Every rank's error (None: fine) after a start-up step that may take long (loading a
        model): waits up to STARTUP_TIMEOUT for the slowest rank, then exchanges the errors."""
        dist.monitored_barrier(self.control, timeout=timedelta(seconds=STARTUP_TIMEOUT), wait_all_ranks=True)
        errors: list = [None] * self.world
        dist.all_gather_object(errors, error, group=self.control)
        return errors

    # -- failure -----------------------------------------------------------------------------

    def on_failure(self, callback) -> None:
        """Call callback() (from any thread) when the group fails."""
        self._callbacks.append(callback)
        if self.failure:
            callback()

    def fail(self, reason: str) -> str:
        """Record the first failure and tell the callbacks; returns the message to raise."""
        with self._failing:
            if self.failure is not None:
                return self.failure
            self.failure = f"tensor parallelism failed: {reason}"
        for callback in self._callbacks:
            callback()
        return self.failure

    def check(self) -> None:
        if self.failure:
            raise RankFailed(self.failure)

    def _lost_child(self, wait: float) -> str | None:
        """Why a started rank is gone, waiting up to `wait` seconds for its exit to show."""
        deadline = time.monotonic() + (wait if self.children else 0)
        while True:
            for rank, child in enumerate(self.children, start=1):
                code = child.poll()
                if code is not None:
                    how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
                    return f"rank {rank} (pid {child.pid}) {how}"
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def _watch(self) -> None:
        while not self._closed.wait(0.2):
            reason = self._lost_child(0)
            if reason and not self._closed.is_set():
                self.fail(reason)
                return

    def _beat(self) -> None:
        interval = self.timeout / 4
        while not self._closed.wait(interval / 4):
            if self.failure or time.monotonic() - self._last_sent < interval:
                continue
            if not self.lock.acquire(blocking=False):
                continue  # a call is running: that is a sign of life too
            try:
                if not self._closed.is_set():
                    self.send(BEAT)
                    dist.barrier(group=self.control)  # every rank answers within the timeout
            except RuntimeError as e:
                self.fail(self._lost_child(1.0) or f"no answer from the other ranks ({e})")
            finally:
                self.lock.release()

    # -- the end -----------------------------------------------------------------------------

    def close(self) -> None:
        """Rank 0: tell the others to leave (when they can still hear), stop the ranks it started;
        every rank: leave the group. Safe to call twice."""
        if self._closed.is_set():
            return
        self._closed.set()  # first: the ranks' exits that follow are no failure
        if self.rank == 0 and not self.failure:
            with contextlib.suppress(RuntimeError), self.lock:
                self.send(STOP)
        for child in self.children:
            try:
                child.wait(timeout=10 if not self.failure else 1)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def start(world: int, *, device: str | None = None, timeout: float = DEFAULT_TIMEOUT,
          threads: int | None = None) -> RankGroup:
    """Join (under torchrun) or start (N - 1 local child processes) a group of `world` ranks.
    threads: CPU threads of each local rank (default: this machine's cores shared out)."""
    if type(world) is not int or world < 2:
        raise ValueError(f"--tensor-parallel needs at least 2 ranks to start a group, got {world!r}")
    if not timeout > 0:
        raise ValueError(f"the tensor-parallel timeout must be > 0 seconds, got {timeout!r}")
    target = _pick_device(device)
    launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ  # by torchrun, maybe over machines
    if not launched:
        check_local_world(world, target)  # before any rank starts
    if dist.is_initialized():
        raise ValueError("a torch.distributed group is already running in this process")
    if launched:  # torchrun: its rendezvous (env://)
        rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        if size != world:
            raise ValueError(f"--tensor-parallel {world}, but the launcher started {size} processes (WORLD_SIZE)")
        return _init(rank, world, _rank_device(target), timeout, [], init_method="env://")
    store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, timeout=timedelta(seconds=STARTUP_TIMEOUT),
                          wait_for_workers=False)
    if target.type == "cpu":
        threads = threads or max(1, (os.cpu_count() or 1) // world)
    children = [_spawn(rank, world, store.port, target, timeout, threads) for rank in range(1, world)]
    try:
        if threads:
            torch.set_num_threads(threads)
        return _init(0, world, _rank_device(target, 0), timeout, children, store=store)
    except BaseException:
        for child in children:
            child.kill()
        raise


def check_local_world(world: int, device: torch.device) -> None:
    """Ranks started on this machine: at most one per CPU core (one per GPU on CUDA). More cannot be
    faster (they would share the cores, and every collective waits for the slowest rank), and each
    is a process that imports torch: 64 of them on 2 cores spent minutes just starting."""
    have, what = (torch.cuda.device_count(), "GPUs") if device.type == "cuda" else (cpu_cores(), "CPU cores")
    if world > have:
        raise ValueError(f"--tensor-parallel {world}: this machine has {have} {what} and each rank started here "
                         f"needs one of its own; use at most {have} (torchrun spreads more over several machines)")


def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity mask: a container's share, not the host's)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def join(rank: int, world: int, port: int, device: str, timeout: float) -> RankGroup:
    """A rank started by rank 0 on this machine: join its group at 127.0.0.1:port."""
    store = dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=timedelta(seconds=STARTUP_TIMEOUT))
    return _init(rank, world, _rank_device(torch.device(device), rank), timeout, [], store=store)


def _init(rank: int, world: int, device: torch.device, timeout: float, children: list, **rendezvous) -> RankGroup:
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=timeout),
                            device_id=device if backend == "nccl" else None, **rendezvous)
    return RankGroup(rank, world, device, timeout, children)


def _spawn(rank: int, world: int, port: int, device: torch.device, timeout: float,
           threads: int | None) -> subprocess.Popen:
    """Start rank `rank` on this machine: a child that joins the group at 127.0.0.1:port and
    follows rank 0. Its own session, so a Ctrl-C reaches rank 0 only (which then stops it); its
    first statement watches this process, so that it dies with rank 0 (parallel_parent.py)."""
    parent, deathsig = os.getpid(), threading.current_thread() is threading.main_thread()
    code = (f"from nexttok.parallel.parent import watch_parent; watch_parent({parent}, {deathsig}); "
            f"from nexttok.parallel.model import follower_main; "
            f"follower_main({rank}, {world}, {port}, {device.type!r}, {timeout!r}, {threads!r}, parent={parent})")
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, start_new_session=True)


def _pick_device(device: str | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    chosen = torch.device(device)
    if chosen.type not in ("cpu", "cuda"):
        raise ValueError(f"tensor parallelism runs on cpu or cuda, not {device!r}")
    if chosen.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} is not available: no CUDA GPU is visible (use --device cpu)")
    return torch.device(chosen.type)


def _rank_device(device: torch.device, local_rank: int | None = None) -> torch.device:
    """This rank's device: the CPU, or GPU LOCAL_RANK (one GPU per rank on each machine)."""
    if device.type != "cuda":
        return device
    index = int(os.environ.get("LOCAL_RANK", 0)) if local_rank is None else local_rank
    if index >= torch.cuda.device_count():
        raise ValueError(f"rank needs GPU {index}, but {torch.cuda.device_count()} are visible")
    torch.cuda.set_device(index)
    return torch.device("cuda", index)
