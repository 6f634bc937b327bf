"""A parameter-server worker: pull the parameters, compute a gradient on its slice, push it.

Every exchange goes to all S servers, each for its key range (`keys.key_ranges`). A pull
posts the receives of the S answers first, then sends the S request headers (so a server
answering never waits on this worker), and returns the version each server answered with:
the versions the next push reports, from which the servers compute staleness.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .. import comm
from . import keys
from .server import DONE, PULL, PULL_ALL, PUSH, PUSH_TAG, VALUES_TAG, VERSION_TAG


class Worker:
    """This rank's client of the servers at ranks `server_ranks`, owning `ranges`."""

    def __init__(self, model: nn.Module, server_ranks: list[int], ranges: list[tuple[int, int]]):
        psi = sum(p.numel() for p in keys.trainable(model))
        if len(server_ranks) != len(ranges) or ranges[-1][1] != psi:
            raise ValueError(
                f"Worker: the key ranges {ranges} do not cover the model's Ψ={psi} keys "
                f"on {len(server_ranks)} servers"
            )
        self.model, self.server_ranks, self.ranges = model, server_ranks, ranges
        self.read_versions = [0] * len(server_ranks)

    def _header(self, op: int, clock: int, read_version: int = 0) -> torch.Tensor:
        return torch.tensor(
            [op, clock, read_version], dtype=torch.int64, device=comm.group_device()
        )

    def pull(self, clock: int, everything: bool = False) -> list[int]:
        """Fresh parameters into the model, as allowed at `clock` (`everything`: wait for
        every update of clocks < `clock`). Returns each server's version."""
        dev, values_at = comm.group_device(), next(self.model.parameters()).device
        versions = [torch.empty(1, dtype=torch.int64, device=dev) for _ in self.server_ranks]
        slices = [torch.empty(stop - start, device=values_at) for start, stop in self.ranges]
        recvs = [
            op
            for v, x, s in zip(versions, slices, self.server_ranks)
            for op in (("recv", v, s, VERSION_TAG), ("recv", x, s, VALUES_TAG))
        ]
        works = comm.batch_isend_irecv(recvs, tag="pull")
        op = PULL_ALL if everything else PULL
        for server in self.server_ranks:
            comm.send(self._header(op, clock), server, tag="ps-header")
        for work in works:
            work.wait()
        keys.write_values(self.model, torch.cat(slices))
        self.read_versions = [int(v) for v in versions]
        return self.read_versions

    def push(self, clock: int, grads: torch.Tensor | None = None) -> None:
        """Send each server its key range of `grads` (the model's gradients by default),
        computed at `clock` on the versions of the last pull."""
        grads = keys.flat_grads(self.model) if grads is None else grads
        for server, (start, stop), version in zip(
            self.server_ranks, self.ranges, self.read_versions
        ):
            comm.send(self._header(PUSH, clock, version), server, tag="ps-header")
            body = [("send", grads[start:stop].contiguous(), server, PUSH_TAG)]
            for work in comm.batch_isend_irecv(body, tag="push"):
                work.wait()

    def done(self) -> None:
        for server in self.server_ranks:
            comm.send(self._header(DONE, 0), server, tag="ps-header")
