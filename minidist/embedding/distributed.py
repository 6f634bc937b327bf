"""HugeCTR's two model-parallel placements of a hash embedding, over `minidist.comm`.

HugeCTR (NVIDIA Merlin HugeCTR docs, "DistributedSlotSparseEmbeddingHash" and
"LocalizedSlotSparseEmbeddingHash"; Wang et al. 2022, "Merlin HugeCTR") splits one embedding
of S slots (feature fields) over N ranks in two ways. Each rank holds a local batch in CSR
form, bags sample-major (bag b = sample b // S, slot b % S), and gets its own bags back:

- `DistributedSlotSparseEmbeddingHash`: every key lives on one owner rank (`key mod N`, or
  `fmix64(key) mod N` with `placement="hashed"`, which spreads structured keys evenly).
  Two schemes:
  * `scheme="reduce_scatter"`, the default and HugeCTR's: every owner receives the keys of
    the *whole global batch* that it owns (one all-to-all of (key, global bag) pairs;
    HugeCTR's data reader does this distribution), sums them into partial pooled vectors for
    every bag of the global batch [N·bags, D], and a reduce-scatter leaves each rank the
    pooled vectors of its own bags. Mean divides each occurrence by its bag's global count,
    from an all-gather of the bags' lengths (the gathered row offsets). Backward: an
    all-gather of the top gradients, so that every owner has the gradient of every bag it
    summed into. Every rank must bring the same number of bags (the reduce-scatter splits
    evenly); a malformed batch on one rank is an error on every rank, before anything
    changes.
  * `scheme="all_to_all"` (TorchRec's row-wise sharding, the alternative; Ivchenko et al.
    2022, "TorchRec: a PyTorch Domain Library for Recommendation Systems", RecSys 2022): an
    all-to-all sends each key occurrence to its owner, the owner looks it up and a second
    all-to-all returns the vectors, which the requester pools per bag. Backward: the reverse
    all-to-all of the vectors' gradients.
  Per rank and step, the reduce-scatter and its all-gather move 2·(N-1)·bags·D floats
  whatever the bags hold; the all-to-alls 2·D floats per key occurrence sent to or received
  from another rank, about 2·(N-1)/N·keys·D: the all-to-all sends less when a bag holds fewer
  than about N keys (`theory.py` counts both exactly), the reduce-scatter when bags are long.
- `LocalizedSlotSparseEmbeddingHash`: every slot lives whole on rank `s mod N`. The keys of
  each bag travel to the owner of its slot, the owner pools them (`HashEmbeddingBag`), an
  all-to-all returns the pooled vectors and the requester reorders them to slot order.
  Backward: the reverse all-to-all of the pooled gradients.

Each rank's shard is a `HashEmbeddingBag` (`layer.local`; `auto_grow=True` lets it grow).
Both equal one `HashEmbeddingBag` over the global batch (as a key -> vector map; keys
of different slots must differ, HugeCTR's convention). Before the data moves the ranks
exchange their counts (one all-to-all of N or 2N int64). `theory.py` gives the bytes of each
scheme. Not done here: hybrid placement, the dense part, load balancing beyond the hash.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from .. import comm
from .backward import occurrence_bags
from .hash_table import fmix64
from .layers import HashEmbeddingBag, check_csr, embedding_bag, pool

PLACEMENTS = ("modulo", "hashed")
SCHEMES = ("reduce_scatter", "all_to_all")


def key_owner(keys: torch.Tensor, world_size: int, placement: str = "modulo") -> torch.Tensor:
    """The rank that owns each key: key mod N, or fmix64(key) mod N (non-negative)."""
    if placement not in PLACEMENTS:
        raise ValueError(f"key_owner: placement={placement!r} must be one of {PLACEMENTS}")
    base = keys if placement == "modulo" else fmix64(keys)
    return torch.remainder(base, world_size)


class _AllToAll(torch.autograd.Function):
    """Rows of `x` split by `send` go out; rows split by `recv` come in. Backward reverses."""

    @staticmethod
    def forward(ctx, x, recv, send, group):
        ctx.recv, ctx.send, ctx.group = recv, send, group
        return _all_to_all(x, recv, send, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_to_all(grad.contiguous(), ctx.send, ctx.recv, ctx.group), None, None, None


class _ReduceScatter(torch.autograd.Function):
    """[N·b, D] partial sums -> this rank's [b, D] sums; backward all-gathers the gradient."""

    @staticmethod
    def forward(ctx, partial, group):
        n, _ = _world(group)
        ctx.group = group
        out = partial.new_empty(partial.shape[0] // n, *partial.shape[1:])
        comm.reduce_scatter(out, partial.contiguous(), group=group, tag="embedding pooled")
        return out

    @staticmethod
    def backward(ctx, grad):
        n, _ = _world(ctx.group)
        full = grad.new_empty(grad.shape[0] * n, *grad.shape[1:])
        comm.all_gather(full, grad.contiguous(), group=ctx.group, tag="embedding pooled grad")
        return full, None


def _all_to_all(x, recv: list[int], send: list[int], group, tag="embedding"):
    out = x.new_empty((sum(recv), *x.shape[1:]))
    comm.all_to_all(out, x.contiguous(), recv, send, group=group, tag=tag)
    return out


def _exchange_counts(send: torch.Tensor, group) -> torch.Tensor:
    """send [N, c] int64 counts for each rank -> what each rank sends here, [N, c]."""
    recv = torch.empty_like(send)
    comm.all_to_all(recv, send.contiguous(), group=group, tag="embedding counts")
    return recv


def _world(group) -> tuple[int, int]:
    return dist.get_world_size(group), dist.get_rank(group)


def _check_slots(row_offsets: torch.Tensor, slots: int, who: str) -> int:
    bags = row_offsets.numel() - 1
    if bags % slots:
        raise ValueError(
            f"{who}: row_offsets describes {bags} bags, not a multiple of slots={slots} "
            "(one bag per sample and slot, sample-major)"
        )
    return bags


class _SlotEmbedding(nn.Module):
    def __init__(
        self, capacity_per_rank, dim, slots, mode, group, backend, local_mode, loss_scale, auto_grow
    ):
        super().__init__()
        if not isinstance(slots, int) or slots <= 0:
            raise ValueError(f"{type(self).__name__}: slots={slots!r} must be an int > 0")
        if mode not in ("sum", "mean"):
            raise ValueError(f"{type(self).__name__}: mode={mode!r} must be 'sum' or 'mean'")
        self.slots, self.mode, self.dim, self.group = slots, mode, dim, group
        # on the device the group's collectives move: a rank's GPU under NCCL, else the CPU
        device = comm.group_device(group) if dist.is_initialized() else None
        self.local = HashEmbeddingBag(
            capacity_per_rank,
            dim,
            local_mode,
            device=device,
            backend=backend,
            loss_scale=loss_scale,
            auto_grow=auto_grow,
        )

    def dump(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's (keys, vectors), key-sorted; the union over ranks is the embedding."""
        return self.local.dump()


class DistributedSlotSparseEmbeddingHash(_SlotEmbedding):
    """Keys placed on owner ranks, pooled by one of two `scheme`s; see the module docstring."""

    def __init__(
        self,
        capacity_per_rank: int,
        dim: int,
        slots: int,
        mode: str = "sum",
        *,
        placement: str = "modulo",
        scheme: str = "reduce_scatter",
        group=None,
        backend=None,
        loss_scale: float = 1.0,
        auto_grow: bool = False,
    ):
        who = "DistributedSlotSparseEmbeddingHash"
        if placement not in PLACEMENTS:
            raise ValueError(f"{who}: placement={placement!r} must be one of {PLACEMENTS}")
        if scheme not in SCHEMES:
            raise ValueError(f"{who}: scheme={scheme!r} must be one of {SCHEMES}")
        super().__init__(
            capacity_per_rank, dim, slots, mode, group, backend, "sum", loss_scale, auto_grow
        )
        self.placement, self.scheme = placement, scheme

    def forward(self, values: torch.Tensor, row_offsets: torch.Tensor) -> torch.Tensor:
        who = "DistributedSlotSparseEmbeddingHash"
        if self.scheme == "reduce_scatter":
            return self._reduce_scatter(values, row_offsets)
        check_csr(values, row_offsets, who)
        bags = _check_slots(row_offsets, self.slots, who)
        n, _ = _world(self.group)
        owner = key_owner(values, n, self.placement)
        order = torch.argsort(owner, stable=True)
        send = torch.bincount(owner, minlength=n)
        return self._all_to_all(values, row_offsets, bags, order, send)

    def _reduce_scatter(self, values, row_offsets):
        who = "DistributedSlotSparseEmbeddingHash(scheme='reduce_scatter')"
        try:  # a bad batch still joins the first exchange (bags = -1), so no rank hangs
            check_csr(values, row_offsets, who)
            bags, error = _check_slots(row_offsets, self.slots, who), None
        except (TypeError, ValueError) as caught:
            bags, error = -1, caught
        if error is not None and not dist.is_initialized():
            raise error  # no world to tell
        n, rank = _world(self.group)
        if error is None:
            owner = key_owner(values, n, self.placement)
            order, send = torch.argsort(owner, stable=True), torch.bincount(owner, minlength=n)
        else:
            send = torch.zeros(n, dtype=torch.int64, device=row_offsets.device)
        # Counts and batch sizes in one exchange: every rank learns every rank's bags.
        info = _exchange_counts(torch.stack([send, torch.full_like(send, bags)], 1), self.group)
        if error is not None:
            raise error
        if (info[:, 1] < 0).any():
            bad = (info[:, 1] < 0).nonzero()[:, 0].tolist()
            raise ValueError(
                f"{who}: rank(s) {bad} brought a malformed batch (their error says "
                "why); no rank changed anything"
            )
        if (info[:, 1] != bags).any():
            raise ValueError(
                f"{who}: every rank must bring the same number of bags, got "
                f"{info[:, 1].tolist()} (rank by rank)"
            )
        global_bag = occurrence_bags(row_offsets) + rank * bags
        pairs = torch.stack([values, global_bag], 1)[order]
        got = _all_to_all(pairs, info[:, 0].tolist(), send.tolist(), self.group)
        keys, gbag = got[:, 0].contiguous(), got[:, 1].contiguous()
        layer = self.local
        scale = torch.ones(keys.numel(), device=keys.device)
        if self.mode == "mean":  # the global counts: every rank's bag lengths, gathered
            counts = (row_offsets[1:] - row_offsets[:-1]).contiguous()
            every = counts.new_empty(n * bags)
            comm.all_gather(every, counts, group=self.group, tag="embedding bag lengths")
            scale = scale / every[gbag].to(scale.dtype)
        partial = pool(
            layer.weight, layer.rows(keys), gbag, scale, n * bags, layer.backend, layer.loss_scale
        )
        return _ReduceScatter.apply(partial, self.group)

    def _all_to_all(self, values, row_offsets, bags, order, send):
        recv = _exchange_counts(send[:, None], self.group)[:, 0]
        send_l, recv_l = send.tolist(), recv.tolist()
        keys = _all_to_all(values[order], recv_l, send_l, self.group)
        # The owner looks the keys up: bags of one key each, through the layer's kernel.
        ones = torch.arange(keys.numel() + 1, device=keys.device)
        layer = self.local
        found = embedding_bag(
            layer.weight, layer.rows(keys), ones, "sum", layer.backend, layer.loss_scale
        )
        vectors = _AllToAll.apply(found, send_l, recv_l, self.group)
        per_key = vectors[torch.argsort(order)]
        counts = row_offsets[1:] - row_offsets[:-1]
        bag = occurrence_bags(row_offsets)
        if self.mode == "mean":
            per_key = per_key / counts[bag].to(per_key.dtype)[:, None]
        return per_key.new_zeros(bags, self.dim).index_add(0, bag, per_key)


class LocalizedSlotSparseEmbeddingHash(_SlotEmbedding):
    """Slot s on rank s mod N; see the module docstring."""

    def __init__(
        self,
        capacity_per_rank: int,
        dim: int,
        slots: int,
        mode: str = "sum",
        *,
        group=None,
        backend=None,
        loss_scale: float = 1.0,
        auto_grow: bool = False,
    ):
        super().__init__(
            capacity_per_rank, dim, slots, mode, group, backend, mode, loss_scale, auto_grow
        )

    def forward(self, values: torch.Tensor, row_offsets: torch.Tensor) -> torch.Tensor:
        who = "LocalizedSlotSparseEmbeddingHash"
        check_csr(values, row_offsets, who)
        bags = _check_slots(row_offsets, self.slots, who)
        n, _ = _world(self.group)
        device = values.device
        bag_owner = torch.remainder(torch.arange(bags, device=device) % self.slots, n)
        bag_order = torch.argsort(bag_owner, stable=True)  # per owner, sample-major
        lengths = (row_offsets[1:] - row_offsets[:-1])[bag_order]
        starts = row_offsets[:-1][bag_order]
        first = torch.cumsum(lengths, 0) - lengths
        within = torch.arange(values.numel(), device=device) - first.repeat_interleave(lengths)
        keys = values[starts.repeat_interleave(lengths) + within]
        send_bags = torch.bincount(bag_owner, minlength=n)
        owner_of_key = bag_owner[bag_order].repeat_interleave(lengths)
        send_keys = torch.bincount(owner_of_key, minlength=n)
        recv = _exchange_counts(torch.stack([send_bags, send_keys], 1), self.group)
        sb, sk, rb, rk = (t.tolist() for t in (send_bags, send_keys, recv[:, 0], recv[:, 1]))
        recv_lengths = _all_to_all(lengths, rb, sb, self.group)
        recv_keys = _all_to_all(keys, rk, sk, self.group)
        offsets = torch.zeros(recv_lengths.numel() + 1, dtype=torch.int64, device=device)
        offsets[1:] = torch.cumsum(recv_lengths, 0)
        pooled = self.local(recv_keys, offsets)  # this rank's slots, every rank's samples
        back = _AllToAll.apply(pooled, sb, rb, self.group)
        return back[torch.argsort(bag_order)]  # back to sample-major slot order
