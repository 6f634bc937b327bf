"""A parameter-server shard: owns a key range of the parameters and its optimizer state.

Li et al. 2014, "Scaling Distributed Machine Learning with the Parameter Server" (OSDI):
servers hold the parameters in key ranges, workers push gradients and pull parameters; the
consistency model decides when a pull may be answered. Dean et al. 2012 ("Large Scale
Distributed Deep Networks", NIPS: Downpour SGD) runs it fully asynchronously; Ho et al. 2013
("More Effective Distributed ML via a Stale Synchronous Parallel Parameter Server", NIPS)
bounds the staleness: a worker at clock c may read only once every update of clocks
< c - s is in (s = 0 is BSP, s = ∞ asynchronous).

The server applies updates clock by clock: when every worker's gradient for clock c has
arrived it averages them (summed in worker order) and takes one optimizer step, its version
becoming c + 1. A pull from a worker at clock c is answered once the version is at least
c - s (at once when asynchronous); waiting pulls are answered after each update. Each
applied gradient is recorded with the version it was computed on and the version it updated:
its staleness, never more than s. With `apply_on_arrival` (Downpour SGD, Dean et al. 2012,
section 4.1) there are no clocks to complete: each pushed gradient is one optimizer step as
soon as it arrives, the version counting the pushes applied, and pulls are answered at once.

Protocol, all through `minidist.comm` p2p: every message from a worker starts with a header
of 3 int64 (op, clock, the version the worker read), received from any source; a push is
followed by the gradient slice; a pull is answered with the version (1 int64) and the
parameter slice. Each stream has its own p2p message tag (`HEADER_TAG` for headers, the only
messages a receive from any source can match; `PUSH_TAG`, `VERSION_TAG`, `VALUES_TAG` for
the bodies), so a body can never be taken for a header nor a version for values, whatever
the order in which the backend delivers them. Workers post the receives of a pull before
sending its header, so a server never blocks on a send.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .. import comm

PUSH, PULL, PULL_ALL, DONE = 0, 1, 2, 3
HEADER = 3  # int64 values in a header
HEADER_TAG, PUSH_TAG, VERSION_TAG, VALUES_TAG = 0, 1, 2, 3  # p2p message tags, one per stream


@dataclass(frozen=True)
class AppliedGradient:
    """One worker's gradient as a server applied it."""

    worker: int  # worker index (0..W-1)
    clock: int  # the worker's clock when it computed the gradient
    read_version: int  # server version of the parameters it was computed on
    applied_version: int  # server version it was applied to (becomes applied_version + 1)

    @property
    def staleness(self) -> int:
        return self.applied_version - self.read_version


def pull_bound(clock: int, staleness: int | None) -> int:
    """The version a pull at `clock` must wait for: clock - s (0 when asynchronous)."""
    return 0 if staleness is None else max(0, clock - staleness)


@dataclass
class ShardServer:
    """Key range [start, stop) on this rank: its values, an SGD optimizer, the update log."""

    values: torch.Tensor
    worker_ranks: list[int]
    staleness: int | None
    lr: float = 0.05
    momentum: float = 0.9
    version: int = 0
    applied: list[AppliedGradient] = field(default_factory=list)
    last_update: torch.Tensor | None = None  # the averaged gradient of the last step
    apply_on_arrival: bool = False  # Downpour: one optimizer step per push, no clocks

    def __post_init__(self):
        s = self.staleness
        if s is not None and (not isinstance(s, int) or isinstance(s, bool) or s < 0):
            raise ValueError(
                f"ShardServer: staleness={s!r} must be an int >= 0 (the clocks a worker may "
                "run ahead) or None (asynchronous)"
            )
        self.param = torch.nn.Parameter(self.values.detach().clone())
        self.optimizer = torch.optim.SGD([self.param], lr=self.lr, momentum=self.momentum)
        self._pending: dict[int, dict[int, tuple[torch.Tensor, int]]] = {}
        self._waiting: list[tuple[int, int]] = []  # (worker rank, version it waits for)

    def serve(self) -> ShardServer:
        """Answer pushes and pulls until every worker said it is done."""
        header = torch.empty(HEADER, dtype=torch.int64, device=comm.group_device())
        done = 0
        while done < len(self.worker_ranks):
            src = comm.recv(header, None, tag="ps-header")
            op, clock, read_version = header.tolist()
            if op == PUSH:
                grad = torch.empty_like(self.param.data)
                for work in comm.batch_isend_irecv([("recv", grad, src, PUSH_TAG)], tag="push"):
                    work.wait()
                if self.apply_on_arrival:
                    self._apply_one(src, clock, grad, read_version)
                else:
                    self._pending.setdefault(clock, {})[src] = (grad, read_version)
                    self._apply_complete_clocks()
            elif op in (PULL, PULL_ALL):
                need = clock if op == PULL_ALL else pull_bound(clock, self.staleness)
                self._waiting.append((src, need))
            elif op == DONE:
                done += 1
            else:
                raise RuntimeError(f"parameter server: unknown op {op} from rank {src}")
            self._answer_pulls()
        return self

    def _apply_complete_clocks(self) -> None:
        while len(self._pending.get(self.version, {})) == len(self.worker_ranks):
            pushed = self._pending.pop(self.version)
            grads = [pushed[r][0] for r in self.worker_ranks]
            mean = torch.stack(grads).sum(0) / len(grads)
            self.param.grad = mean
            self.optimizer.step()
            self.last_update = mean
            for w, rank in enumerate(self.worker_ranks):
                self.applied.append(AppliedGradient(w, self.version, pushed[rank][1], self.version))
            self.version += 1

    def _apply_one(self, rank: int, clock: int, grad: torch.Tensor, read_version: int) -> None:
        """Downpour: this push alone is one optimizer step (no averaging, no waiting)."""
        self.param.grad = grad
        self.optimizer.step()
        self.last_update = grad
        worker = self.worker_ranks.index(rank)
        self.applied.append(AppliedGradient(worker, clock, read_version, self.version))
        self.version += 1

    def _answer_pulls(self) -> None:
        still = []
        for rank, need in self._waiting:
            if self.version >= need:
                version = torch.tensor([self.version], device=comm.group_device())
                answer = [
                    ("send", version, rank, VERSION_TAG),
                    ("send", self.param.data, rank, VALUES_TAG),
                ]
                for work in comm.batch_isend_irecv(answer, tag="pull"):
                    work.wait()
            else:
                still.append((rank, need))
        self._waiting = still
