"""Run a pipeline schedule on a world: stages of the GPT, activations passed point to point.

Each rank of a pipeline group holds one stage (`GPTStage`: a copy of the GPT holding
consecutive blocks, the first stage also the embeddings, the last the final norm and head;
the GPT's own forward runs) and executes its list from
`schedules.schedule` step by step (Narayanan et al. 2021, "Memory-Efficient Pipeline-Parallel
DNN Training", section 3; Megatron-LM's `forward_backward_pipelining_without_interleaving`):

- F(i): receive micro-batch i's activation from the previous stage (the first stage reads
  the batch), run the stage, send the output to the next one (the last computes the loss,
  divided by m so the accumulated gradient is the whole batch's mean);
- B(i): receive the gradient of that output, back-propagate, send the input's gradient back;
  with the zero-bubble split, B(i) computes only the input gradient and W(i) the weights',
  starting where B left off (`backward.backward_input`): no node, so no collective, runs twice.

Sends are asynchronous (`comm.batch_isend_irecv`), so two neighbours sending to each other
never wait on one another; receives block. Once a send has completed, the stage's copy of
the output is freed (its autograd node stays; backward then runs from the node with the
received gradient, as Megatron-LM's `deallocate_output_tensor` does). After the last step:
the tied embedding's two copies (first and last stage) get the sum of their gradients over
the embedding group, and data-parallel replicas all-reduce every gradient once.

`eval_step` runs the forwards only (`schedules.forward_only`, under `torch.no_grad()`):
the held-out loss, with no backward and nothing of the training state touched.
"""

from __future__ import annotations

import contextlib
import functools
import time

import torch
import torch.distributed as dist
import torch.nn as nn

from .. import comm
from ..memory import SavedActivations
from ..models import GPT
from ..parallel import ParallelModule, broadcast_parameters, verify_same_model
from ..policy import module_device
from .backward import backward, backward_input
from .schedules import SPLIT_BACKWARD, V_SHAPED, forward_only, schedule, virtual_stage
from .stages import GPTStage, split_gpt  # noqa: F401 (importable from here too)


class PipelineParallel(ParallelModule):
    """This rank's stage of a pipeline over `pp_group`, driven by a schedule."""

    # count the bytes each forward saves for backward (a hook per saved tensor: turn it off
    # where only speed matters, as the bench does)
    measure_activations = True

    def __init__(
        self,
        dense: GPT,
        loss_fn,
        layout,
        kind: str = "1f1b",
        microbatches: int = 4,
        virtual: int = 1,
    ):
        """`layout`: a `minidist.megatron.ParallelLayout` with tp = 1; its pp groups are the
        pipelines, its dp groups the replicas, its embedding groups the tied copies.
        `virtual`: model chunks per rank for the interleaved schedule (rank r holds the
        virtual stages r, r + p, ...; `self.chunks`), 1 otherwise. ZB-V always has two,
        placed in a V (rank r holds r and 2p-1-r): rank 0 holds the first and the last,
        rank p-1 hands its activations from one chunk to the other without a message.
        DualPipeV places its chunks as ZB-V does; its overlapped pairs run one step after
        the other here (no second stream on a CPU)."""
        super().__init__()
        if virtual != 1 and kind != "interleaved":
            raise ValueError(f"PipelineParallel: virtual={virtual} needs kind='interleaved'")
        if layout.tp_size != 1:
            raise ValueError(
                f"PipelineParallel: layout.tp_size={layout.tp_size}; stages here are dense"
            )
        pp_group = layout.group("pp")
        dp_group = layout.group("dp") if layout.dp_size > 1 else None
        embedding_group = layout.groups.get("embedding")  # first and last stages only
        self.p, self.stage_index = dist.get_world_size(pp_group), dist.get_rank(pp_group)
        self.ranks = dist.get_process_group_ranks(pp_group) if pp_group else list(range(self.p))
        # every stage and replica cuts its stage from the same dense model
        config = {"kind": kind, "microbatches": microbatches, "virtual": virtual}
        for group in (pp_group, dp_group) if dp_group is not None else (pp_group,):
            verify_same_model(dense, group, "PipelineParallel", config)
        broadcast_parameters(dense)  # ranks seeded differently still cut one model
        self.v = 2 if kind in V_SHAPED else virtual
        self.chunks = [
            split_gpt(dense, self.p * self.v, virtual_stage(kind, self.stage_index, c, self.p))
            for c in range(self.v)
        ]
        self.module = self.chunks[0] if self.v == 1 else nn.ModuleList(self.chunks)
        self.steps = schedule(kind, self.p, microbatches, virtual)[self.stage_index]
        self.kind, self.m, self.loss_fn, self.hidden = kind, microbatches, loss_fn, dense.cfg.hidden
        self.pp_group, self.dp_group, self.embedding_group = pp_group, dp_group, embedding_group
        self.peak_alive = self.peak_saved_bytes = self.saved_per_microbatch = 0
        # set to a list to record (op, microbatch, start, end) of every step, perf_counter
        # seconds, start after the step's receive: the real run's Gantt chart and bubble
        self.timings: list[tuple[str, int, float, float]] | None = None

    @property
    def device(self) -> torch.device:
        """The stage's device: batches, received activations and gradients land here."""
        return module_device(self.module)

    # -- one training step ----------------------------------------------------------------
    def train_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> float:
        """Forward and backward of every micro-batch of `batch`, gradients synchronised.
        Returns the batch's mean loss (on every stage)."""
        xs, ys, shape = self._micro_batches(batch)
        inputs, outputs, saved, sends = {}, {}, {}, []
        loss_sum = torch.zeros((), device=self.device)
        for op, i, *chunk in self.steps:
            c = chunk[0] if chunk else 0
            stage, key = self.chunks[c], (i, c)
            if op == "F":
                inp = xs[i] if stage.first else self._recv(shape, -1, c).requires_grad_()
                start = time.perf_counter()
                measuring = SavedActivations(stage) if self.measure_activations else None
                with measuring or contextlib.nullcontext():
                    out = stage(inp)
                    if stage.last:
                        out = self.loss_fn(out, ys[i]) / self.m
                        loss_sum += out.detach()
                inputs[key], outputs[key] = inp, out
                saved[key] = measuring.bytes if measuring else 0
                self.saved_per_microbatch = saved[key]
                if not stage.last:
                    sends.append((self._send(out.detach(), +1, c), out))
                self.peak_alive = max(self.peak_alive, len(outputs))
                self.peak_saved_bytes = max(self.peak_saved_bytes, sum(saved.values()))
            elif op == "B":
                out, inp = outputs[key], inputs[key]
                grad = None if stage.last else self._recv(shape, +1, c)
                start = time.perf_counter()
                if not self.split_backward:
                    backward(out, grad)
                elif stage.first:  # no input gradient to pass: W runs the one backward
                    outputs[key] = functools.partial(backward, out, grad)
                else:  # the input gradient now; W, later, the weights' (what B leaves it)
                    params = [p for p in stage.parameters() if p.requires_grad]
                    outputs[key] = backward_input(out, grad, inp, params)
                if not stage.first:
                    sends.append((self._send(inp.grad, -1, c), None))
                if not self.split_backward:
                    del outputs[key], inputs[key], saved[key]
            else:  # W: the weight gradients of micro-batch i, from what its B left
                start = time.perf_counter()
                outputs.pop(key)()
                del inputs[key], saved[key]
            sends = _free_sent(sends)
            if self.timings is not None:
                self.timings.append((op, i, start, time.perf_counter()))
        for work, _ in sends:
            work.wait()
        self._sync_gradients()
        return self._broadcast_loss(loss_sum)

    @torch.no_grad()
    def eval_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> float:
        """The batch's mean loss, forward only (`schedules.forward_only`), the model in eval
        mode: no graph kept, no backward, no gradient or optimizer state touched. The loss is
        computed on the last stage and broadcast to every stage."""
        xs, ys, shape = self._micro_batches(batch)
        sends = []
        loss_sum = torch.zeros((), device=self.device)
        training = self.training
        self.eval()
        try:
            virtual = 1 if self.kind in V_SHAPED else self.v
            for _, i, c in forward_only(self.kind, self.p, self.m, virtual)[self.stage_index]:
                stage = self.chunks[c]
                out = stage(xs[i] if stage.first else self._recv(shape, -1, c))
                if stage.last:
                    loss_sum += self.loss_fn(out, ys[i]) / self.m
                else:
                    sends.append(self._send(out, +1, c))
            for work in sends:
                work.wait()
        finally:
            self.train(training)
        return self._broadcast_loss(loss_sum)

    def _micro_batches(self, batch) -> tuple[tuple, tuple, tuple[int, ...]]:
        """`batch` on the stage's device in m micro-batches (ids, targets), and the shape of
        what passes between stages; the same-rank hand-offs emptied."""
        x, y = (t.to(self.device) for t in batch)  # tensors follow the stage's module
        if x.shape[0] % self.m:
            raise ValueError(f"batch of {x.shape[0]} not divisible into m={self.m} micro-batches")
        self.mailbox: dict[tuple[int, int], list[torch.Tensor]] = {}  # same-rank hand-offs
        return x.chunk(self.m), y.chunk(self.m), self.activation_shape(x)

    def _broadcast_loss(self, loss_sum: torch.Tensor) -> float:
        """The batch's mean loss, from the rank computing it to every stage."""
        last = self._neighbour_of(self.p * self.v - 1)[0]
        comm.broadcast(loss_sum, src=last, group=self.pp_group, tag="pp-loss")
        return float(loss_sum)

    def activation_shape(self, x: torch.Tensor) -> tuple[int, ...]:
        """The shape of what passes between stages for a batch of ids `x` (one micro-batch
        of [batch, sequence, hidden]; a composed layout may hold part of the sequence)."""
        return (x.shape[0] // self.m, x.shape[1], self.hidden)

    @property
    def split_backward(self) -> bool:
        """B computes the input gradient only, W the weights' (the zero-bubble schedules)."""
        return self.kind in SPLIT_BACKWARD

    def _neighbour_of(self, vs: int) -> tuple[int, int]:
        """(global rank, chunk) holding virtual stage `vs`."""
        p = self.p
        if self.kind in V_SHAPED:
            return (self.ranks[vs], 0) if vs < p else (self.ranks[2 * p - 1 - vs], 1)
        return self.ranks[vs % p], vs // p

    def _neighbour(self, direction: int, chunk: int) -> tuple[int, int]:
        """(global rank, chunk) of the virtual stage before (-1) or after (+1) this rank's
        `chunk`: in a loop the last rank's chunk c is followed by the first rank's chunk
        c + 1; in a V rank p-1's chunk 0 by its own chunk 1."""
        vs = virtual_stage(self.kind, self.stage_index, chunk, self.p)
        return self._neighbour_of(vs + direction)

    def _send(self, t: torch.Tensor, direction: int, chunk: int = 0):
        """Activations go forward with tag 2·(their chunk), gradients back with 2·chunk + 1:
        streams between the same two ranks never mix. To a chunk of this rank: no message."""
        peer, peer_chunk = self._neighbour(direction, chunk)
        message = 2 * peer_chunk + (direction < 0)
        if peer == dist.get_rank():
            self.mailbox.setdefault((peer_chunk, message), []).append(t.detach().clone())
            return _Delivered()
        return comm.batch_isend_irecv([("send", t.contiguous(), peer, message)], tag="pp")[0]

    def _recv(self, shape, direction: int, chunk: int = 0) -> torch.Tensor:
        peer, _ = self._neighbour(direction, chunk)
        message = 2 * chunk + (direction > 0)  # from after: a gradient; from before: an input
        if peer == dist.get_rank():
            return self.mailbox[chunk, message].pop(0)
        buffer = torch.empty(shape, device=self.device)
        comm.batch_isend_irecv([("recv", buffer, peer, message)], tag="pp")[0].wait()
        return buffer

    @torch.no_grad()
    def _sync_gradients(self) -> None:
        first = next((c for c in self.chunks if c.first), None)
        last = next((c for c in self.chunks if c.last), None)
        # the tied embedding's two copies, unless one chunk holds both (one weight) or the
        # head is its own (lesson 17's Llama)
        tied = self.chunks[0].tied and first is not last
        if tied and first is not None and last is not None:  # both copies here (ZB-V)
            a, b = first.embedding.weight, last.head.weight
            a.grad += b.grad
            b.grad.copy_(a.grad)
        elif tied:  # one of them here, the other on the embedding group's other rank
            weight = first.embedding.weight if first is not None else last.head.weight
            comm.all_reduce(weight.grad, group=self.embedding_group, tag="pp-tied-embedding")
        if self.dp_group is not None:  # once per step, after the last micro-batch
            n = dist.get_world_size(self.dp_group)
            for p in self._named().values():
                if p.grad is not None:
                    comm.all_reduce(p.grad, group=self.dp_group, tag="dp-grads")
                    p.grad.div_(n)

    # -- the comparison contract: every stage's part, under the dense names ----------------
    def _gathered(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        parts = [None] * self.p
        comm.all_gather_object(parts, tensors, group=self.pp_group, tag="full-state")
        out = {}
        for part in parts:
            out.update({k: v for k, v in part.items() if k not in out and k != "lm_head.weight"})
        return out

    def _named(self) -> dict[str, torch.Tensor]:
        """Every chunk's parameters under the dense model's names (a stage's copy of the
        model is its `model`)."""
        named = (p for chunk in self.chunks for p in chunk.named_parameters())
        return {n.removeprefix("model."): p for n, p in named}

    def full_parameters(self) -> dict[str, torch.Tensor]:
        return self._gathered({n: p.detach().clone() for n, p in self._named().items()})

    def full_grads(self) -> dict[str, torch.Tensor]:
        return self._gathered(
            {n: p.grad.clone() for n, p in self._named().items() if p.grad is not None}
        )


class _Delivered:
    """The hand-off between two chunks of one rank: done as soon as it is made."""

    def is_completed(self) -> bool:
        return True

    def wait(self) -> bool:
        return True


def _free_sent(sends: list) -> list:
    """Drop completed sends; free the stage's copy of what they carried."""
    pending = []
    for work, out in sends:
        if work.is_completed():
            if out is not None:
                out.data = torch.empty(0, device=out.device)
        else:
            pending.append((work, out))
    return pending
