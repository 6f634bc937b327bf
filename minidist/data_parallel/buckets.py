"""Gradient buckets: how DDP groups parameters and the flat buffer each group reduces in.

Li et al. 2020, "PyTorch Distributed", section 3.2.3: parameters are grouped in reverse
registration order (about the order backward produces their gradients) into buckets of about
`bucket_cap_mb`, dtypes never mixed; each bucket is one flat buffer, all-reduced once.
`GradBucket` has the exercise's shape (lesson 01); ZeRO (lesson 02) buckets the same way.
"""

from __future__ import annotations

import torch

from .. import comm

MiB = 1024 * 1024


def plan_buckets(
    params: list[torch.Tensor],
    cap_bytes: int,
    first_cap_bytes: int,
    groups: list[int] | None = None,
) -> list[list[int]]:
    """Indices of `params` per bucket: reverse order, a bucket closes once it reaches its cap.

    A bucket may exceed its cap by its last parameter (as in PyTorch); dtypes never mix, nor
    do parameters of different `groups` (e.g. optimizer param groups, when given).
    """
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i in reversed(range(len(params))):
        p = params[i]
        if current and (
            params[current[0]].dtype != p.dtype
            or (groups is not None and groups[current[0]] != groups[i])
        ):
            buckets.append(current)
            current, size = [], 0
        current.append(i)
        size += p.numel() * p.element_size()
        if size >= (first_cap_bytes if not buckets else cap_bytes):
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


class GradBucket:
    """One flat gradient buffer, filled by hooks, all-reduced once per backward.

    The same shape as the exercise's `GradBucket`: slots laid out in the order of `params`,
    `on_grad_ready(param)` copies a gradient in and counts the pending ones. Launching is the
    wrapper's job here (`launch`), because buckets must be launched in index order.
    """

    def __init__(self, index: int, params: list[torch.Tensor], dtype: torch.dtype | None = None):
        self.index = index
        self.params = params
        self.buffer = torch.zeros(
            sum(p.numel() for p in params),
            dtype=dtype or params[0].dtype,
            device=params[0].device,
        )
        self.slots: dict[int, torch.Tensor] = {}  # id(param) -> view of its slot
        offset = 0
        for p in params:
            self.slots[id(p)] = self.buffer[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
        self.reset()

    def reset(self) -> None:
        self.pending = len(self.params)
        self.arrived: set[int] = set()
        self.had_grad: set[int] = set()  # arrived with a gradient (not as an unused zero)
        self.work = None

    def on_grad_ready(self, param: torch.Tensor) -> bool:
        """Put `param.grad` (zeros if it has none) into its slot; True once the bucket is full."""
        slot = self.slots[id(param)]
        if param.grad is None:
            slot.zero_()
        else:
            self.had_grad.add(id(param))
            if param.grad.data_ptr() != slot.data_ptr():
                slot.copy_(param.grad)  # casts to the reduction dtype where it differs
                param.grad = slot if slot.dtype == param.dtype else None
        self.pending -= 1
        self.arrived.add(id(param))
        return self.pending == 0

    def launch(self, divide: float, group) -> None:
        """Pre-divide (by N: the sum of the divided values is the mean), then all-reduce."""
        self.buffer.div_(divide)
        self.work = comm.all_reduce(
            self.buffer, group=group, async_op=True, tag=f"bucket{self.index}"
        )

    def wait(self) -> None:
        self.work.wait()
