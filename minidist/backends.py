"""What each torch.distributed backend can move, and where a group's bookkeeping lives.

NCCL moves only CUDA tensors; gloo moves CPU tensors, and CUDA tensors only in all-reduce
and broadcast (torch.distributed's "Backends" table, docs.pytorch.org/docs/stable/
distributed.html). `minidist.comm` checks every tensor against its group's backend with
`_check_devices` before the backend sees it, so a CPU tensor sent into NCCL gets a message
naming the op, the tensor's tag, its device and the backend instead of NCCL's own.
`group_device(group)` is where a small bookkeeping tensor (a model check, a found-inf flag,
lengths, clocks) for that group must be made.

`_check_aliasing` refuses a collective whose input and output share memory other than in
place. NCCL defines an all-gather (or reduce-scatter) as in place when the rank's part sits
at its own offset of the whole: `all_gather(data, data[r·n : (r+1)·n])` (NCCL user guide,
"In-place Operations"; what FSDP2 and DeepSpeed's ZeRO do); any other overlap is written
while it is still being read, with a result that depends on the backend (gloo happens to
copy the input first, so a test on CPU would not show it). An all-to-all has no in-place
form: gloo's gives wrong chunks.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

# Other backends (MPI, fake test groups) are not checked.
_GLOO_CUDA_OPS = ("all_reduce", "broadcast")
_NO_PAYLOAD = torch.empty(0, device="meta")  # the ledger's stand-in for barrier and objects


def group_backend(group=None) -> str:
    """The backend of `group` ("gloo", "nccl", ...)."""
    return str(dist.get_backend(group))


def group_device(group=None) -> torch.device:
    """Where a bookkeeping tensor of `group`'s collectives must live: this rank's GPU under
    NCCL, the CPU otherwise."""
    if group_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _check_devices(op: str, tensors, group, tag: str) -> None:
    """Refuse a tensor the group's backend cannot move, before anything is sent or recorded."""
    backend = group_backend(group)
    if backend not in ("gloo", "nccl"):
        return
    flat = [x for t in tensors for x in (t if isinstance(t, list | tuple) else [t])]
    for t in flat:  # (torch.distributed's list forms give lists of tensors)
        kind = t.device.type
        if backend == "nccl":
            ok, rule = kind == "cuda", "NCCL moves only CUDA tensors"
        else:
            ok = kind == "cpu" or (kind == "cuda" and op in _GLOO_CUDA_OPS)
            rule = f"gloo moves CPU tensors (CUDA tensors only in {', '.join(_GLOO_CUDA_OPS)})"
        if not ok:
            raise ValueError(
                f"comm.{op}: the tensor tagged {tag or '(untagged)'!r} is on {t.device}, which "
                f"backend {backend!r} cannot move: {rule}. Create it on the group's device "
                "(comm.group_device(group), or the device of the module it belongs to)."
            )


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    """[first, last) byte of `t` in its storage's address space."""
    if t.numel() == 0:
        return t.data_ptr(), t.data_ptr()
    span = sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + (span + 1) * t.element_size()


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.device != b.device or a.device.type == "meta" or not a.numel() or not b.numel():
        return False
    base = a.untyped_storage().data_ptr()
    if not base or base != b.untyped_storage().data_ptr():  # 0: a storage resized to nothing
        return False
    (a0, a1), (b0, b1) = _byte_range(a), _byte_range(b)
    return a0 < b1 and b0 < a1


def _check_aliasing(op: str, whole, part, group, tag: str) -> None:
    """Refuse `part` (the all-gather's input, the reduce-scatter's output) sharing memory
    with `whole` except as this rank's own chunk of it (the in-place form); for all_to_all,
    any overlap. `whole` may be torch's list form (a list of chunks)."""
    if op == "all_to_all":
        if _overlap(whole, part):
            raise ValueError(
                f"comm.all_to_all (tag {tag or '(untagged)'!r}): output shares memory with "
                "input; an all-to-all has no in-place form (chunks arrive while the input is "
                "still being sent): give it a separate output buffer."
            )
        return
    chunks = list(whole) if isinstance(whole, list | tuple) else None
    if chunks is None and not _overlap(whole, part):
        return  # the common case: separate buffers, no chunk views made
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    if chunks is None:
        if part.numel() * n != whole.numel() or not whole.is_contiguous():
            return  # the backend refuses the sizes, with its own words
        chunks = list(whole.reshape(-1).chunk(n))
    for j, chunk in enumerate(chunks):
        if not _overlap(chunk, part):
            continue
        own = j == rank and chunk.data_ptr() == part.data_ptr() and part.is_contiguous()
        if own and chunk.numel() == part.numel():
            continue
        k = part.numel()
        mine = f"[{rank * k}, {(rank + 1) * k})"
        if op == "all_gather":
            what = f"the all-gather writes chunk {j} while the input is still being sent"
            fix = f"Pass a copy (.clone()), or exactly output[{rank * k}:{(rank + 1) * k}]"
        else:
            what = f"the reduce-scatter writes the output while chunk {j} is still being reduced"
            fix = f"Use a separate output buffer, or exactly input[{rank * k}:{(rank + 1) * k}]"
        name, role = ("input", "output") if op == "all_gather" else ("output", "input")
        raise ValueError(
            f"comm.{op} (tag {tag or '(untagged)'!r}): the {name} shares memory with the "
            f"{role} but is not this rank's own chunk of it (rank {rank} owns elements {mine}; "
            f"the {name} overlaps chunk {j}): {what}, so the result depends on the backend. "
            f"{fix} (in place)."
        )
