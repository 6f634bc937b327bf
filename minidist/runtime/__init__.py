"""A world of real processes: start N ranks, run a function on each, collect the results.

`launch(fn, world_size, *args)` starts `world_size` processes on this machine, initialises
the default `torch.distributed` process group in each (gloo; NCCL on request, for tensors
on the ranks' GPUs), runs `fn(*args)` on every rank and returns the per-rank return values in rank
order, their tensors on the CPU whatever device the ranks computed on. Under `torchrun` the
same call joins the world torchrun started instead.

How the pieces fit:
- Rendezvous: each world meets in a `FileStore` in a fresh temporary folder, so worlds never
  race for a port. (A `TCPStore` served from a thread of the parent is not safe here: a
  rank forked while that thread holds a lock can deadlock in rendezvous.) Gloo ranks then
  pass a barrier, so that none runs `fn` and exits while a peer is still connecting to it.
- Start method: fork where it is safe (Linux, CUDA not initialised in the parent), else
  spawn. Under spawn the function travels by value with cloudpickle, which is what lets a
  function defined in a notebook cell run in a fresh interpreter.
- Failure: the parent waits on every rank's result pipe and process sentinel at once. The
  first rank that raises (or dies) stops the world: the caller gets that rank's traceback
  (or its signal and last stderr lines), its peers named as having lost their connection to
  it, every other rank is terminated. A world that outlives `timeout_s` is stopped with an
  error naming the ranks still running and the collective each was inside (`board`). No
  child outlives the call, Ctrl-C included; a parent killed outright takes its ranks with it
  (`PR_SET_PDEATHSIG`) and the next launch sweeps its folders.
- Stderr: each rank's file descriptor 2 is a pipe to the parent, which copies everything to
  its own file descriptor 2 (where the ranks' output would have gone anyway) and keeps the
  last lines of each rank. A rank killed by a signal or an `abort()` leaves no traceback,
  only what native code (gloo, NCCL) wrote to stderr just before; those lines go into the
  error.

The native equivalent is `torch.multiprocessing.spawn` / `torchrun`; minidist adds result
collection, by-value shipping of notebook functions and the fast-fail guarantees.

Where each piece lives:
- `parent`: `launch`, shipping `fn` to spawned ranks, reaping the ranks.
- `device`: `world_backend` (launch's `device=`: cpu/gloo, cuda/NCCL, auto) and
  `rank_device`, the device of this rank (`cuda:LOCAL_RANK` under NCCL, else the CPU).
- `backend`: `default_backend`, `start_method_for` (fork or spawn) and their checks.
- `rank`: `_rank_main`, the body of each rank (rendezvous, barrier, result message).
- `stderr`: `_StderrTail`, the parent's end of a rank's stderr pipe.
- `board`: the call board, where `comm` writes the collective each rank is inside.
- `collect`: `_collect`, waiting for the results; `RankFailedError`, `WorldTimeoutError`.
- `torchrun`: `under_torchrun` and joining the world torchrun started.
- `host`: `dumps_on_host`, how a rank's result is pickled: its GPU tensors as CPU copies.
- `cuda_memory`: `cuda_peaks()`, each rank's peak CUDA memory, measured on the rank.
"""

# The private names are re-exported (noqa) from the module this package was before the split.
from .backend import (  # noqa: F401
    _BACKENDS,
    _check_backend,
    _pick_start_method,
    default_backend,
    start_method_for,
)
from .collect import _GRACE_S, RankFailedError, WorldTimeoutError, _collect, _exit_message  # noqa: F401
from .cuda_memory import cuda_peaks
from .device import DEVICES, rank_device, world_backend  # noqa: F401
from .host import dumps_on_host, on_host  # noqa: F401
from .parent import _main_module_hidden, _reap, _ship, launch  # noqa: F401
from .rank import _COLLECTIVE_TIMEOUT_MARGIN_S, _rank_main  # noqa: F401
from .stderr import _STDERR_TAIL_BYTES, _STDERR_TAIL_LINES, _StderrTail, _write_fd2  # noqa: F401
from .torchrun import (
    _join_torchrun_world,  # noqa: F401
    under_torchrun,
)

# Named (in tracebacks, reprs and pickles) from where callers import them, as before the split.
RankFailedError.__module__ = WorldTimeoutError.__module__ = __name__

__all__ = [
    "launch",
    "RankFailedError",
    "WorldTimeoutError",
    "under_torchrun",
    "default_backend",
    "rank_device",
    "cuda_peaks",
]
