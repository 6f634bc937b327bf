"""HugeCTR's two model-parallel placements of a hash embedding, over `minidist.comm`.

HugeCTR (NVIDIA Merlin HugeCTR docs, "DistributedSlotSparseEmbeddingHash" and
"LocalizedSlotSparseEmbeddingHash"; Wang et al. 2022, "Merlin HugeCTR") splits one embedding
of S slots (feature fields) over N ranks in two ways. Each rank holds a local batch in CSR
form, bags sample-major (bag b = sample b // S, slot b % S), and gets its own bags back:

- `DistributedSlotSparseEmbeddingHash`: every key lives on one owner rank (`key mod N`, or
  `fmix64(key) mod N` with `placement="hashed"`, which spreads structured keys evenly).
  Forward: an all-to-all sends each key occurrence to its owner, the owner looks it up
  (inserting it in training) and a second all-to-all returns the vectors, which the
  requester pools per bag. Backward: the reverse all-to-all of the vectors' gradients.
- `LocalizedSlotSparseEmbeddingHash`: every slot lives whole on rank `s mod N`. The keys of
  each bag travel to the owner of its slot, the owner pools them (`HashEmbeddingBag`), an
  all-to-all returns the pooled vectors and the requester reorders them to slot order.
  Backward: the reverse all-to-all of the pooled gradients.

Both equal one `HashEmbeddingBag` over the global batch (as a key -> vector map; keys
of different slots must differ, HugeCTR's convention). Before each data all-to-all the
ranks exchange their counts (one all-to-all of N int64). `theory.py` gives the bytes.

Not done here: HugeCTR's distributed mode pools partial sums on the owners and
reduce-scatters them (with an all-reduce of the counts for mean); this module returns
per-occurrence vectors instead, the row-wise scheme of TorchRec. Hybrid placement, the
dense part, and load balancing beyond the hash are not done either.
"""

from __future__ import annotations

import torch
from torch import nn

from .. import comm
from .hash_table import fmix64
from .layers import HashEmbeddingBag, check_csr, embedding_bag

PLACEMENTS = ("modulo", "hashed")


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
    import torch.distributed as dist

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
    def __init__(self, capacity_per_rank, dim, slots, mode, group, backend, local_mode):
        super().__init__()
        if not isinstance(slots, int) or slots <= 0:
            raise ValueError(f"{type(self).__name__}: slots={slots!r} must be an int > 0")
        self.slots, self.mode, self.dim, self.group = slots, mode, dim, group
        self.local = HashEmbeddingBag(capacity_per_rank, dim, local_mode, backend=backend)
        if mode not in ("sum", "mean"):
            raise ValueError(f"{type(self).__name__}: mode={mode!r} must be 'sum' or 'mean'")

    def dump(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's (keys, vectors), key-sorted; the union over ranks is the embedding."""
        return self.local.dump()


class DistributedSlotSparseEmbeddingHash(_SlotEmbedding):
    """Keys placed on owner ranks; see the module docstring."""

    def __init__(
        self, capacity_per_rank: int, dim: int, slots: int, mode: str = "sum", *,
        placement: str = "modulo", group=None, backend=None,
    ):  # fmt: skip
        if placement not in PLACEMENTS:
            raise ValueError(
                f"DistributedSlotSparseEmbeddingHash: placement={placement!r} must be one of "
                f"{PLACEMENTS}"
            )
        super().__init__(capacity_per_rank, dim, slots, mode, group, backend, "sum")
        self.placement = placement

    def forward(self, values: torch.Tensor, row_offsets: torch.Tensor) -> torch.Tensor:
        who = "DistributedSlotSparseEmbeddingHash"
        check_csr(values, row_offsets, who)
        bags = _check_slots(row_offsets, self.slots, who)
        n, _ = _world(self.group)
        owner = key_owner(values, n, self.placement)
        order = torch.argsort(owner, stable=True)
        send = torch.bincount(owner, minlength=n)
        recv = _exchange_counts(send[:, None], self.group)[:, 0]
        send_l, recv_l = send.tolist(), recv.tolist()
        keys = _all_to_all(values[order], recv_l, send_l, self.group)
        # The owner looks the keys up: bags of one key each, through the layer's kernel.
        ones = torch.arange(keys.numel() + 1, device=keys.device)
        layer = self.local
        found = embedding_bag(layer.weight, layer.rows(keys), ones, "sum", layer.backend)
        vectors = _AllToAll.apply(found, send_l, recv_l, self.group)
        per_key = vectors[torch.argsort(order)]
        counts = row_offsets[1:] - row_offsets[:-1]
        bag = torch.repeat_interleave(torch.arange(bags, device=values.device), counts)
        if self.mode == "mean":
            per_key = per_key / counts[bag].to(per_key.dtype)[:, None]
        return per_key.new_zeros(bags, self.dim).index_add(0, bag, per_key)


class LocalizedSlotSparseEmbeddingHash(_SlotEmbedding):
    """Slot s on rank s mod N; see the module docstring."""

    def __init__(
        self, capacity_per_rank: int, dim: int, slots: int, mode: str = "sum", *,
        group=None, backend=None,
    ):  # fmt: skip
        super().__init__(capacity_per_rank, dim, slots, mode, group, backend, mode)

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
