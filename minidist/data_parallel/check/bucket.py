"""data_parallel checker: exercise 2, the hook that fills a bucket."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ... import comm
from ...course.check import close, diagnose_values, fail, grads, passed, run_on_world
from ...course.watch import watch_comm
from ...data import shard_batch
from ._shared import WORLDS, _fixture, _reference


def _bucket_rank(bucket_cls: type) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    model, batches, loss_fn = _fixture()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    # Not the order backward produces gradients in (roughly reverse registration order):
    # a bucket must count its pending gradients, not wait for the last one of its list.
    order = [named[i] for i in _list_order(len(named))]
    names = [n for n, _ in order]
    params = [p for _, p in order]
    bucket = bucket_cls(params, world)
    by_id = {id(p): n for n, p in named}
    state: dict = {}

    def hook(p: torch.Tensor) -> None:
        state["local"][by_id[id(p)]] = p.grad.detach().clone()
        state["arrivals"].append(by_id[id(p)])
        state["hooks"] += 1
        before = len(state["ledger"].records)
        bucket.on_grad_ready(p)
        # the hook number at which each all-reduce was launched (1-based)
        state["launches"] += [state["hooks"]] * (len(state["ledger"].records) - before)

    for p in params:
        p.register_post_accumulate_grad_hook(hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = []
    for batch in batches:
        x, y = shard_batch(batch, rank, world)
        opt.zero_grad()
        with comm.record() as ledger, watch_comm() as watch:
            state.update(local={}, hooks=0, launches=[], arrivals=[], ledger=ledger)
            loss_fn(model(x), y).backward()
            in_backward = len(ledger.records)
            bucket.wait()
        steps.append(
            dict(
                local=state["local"],
                got=grads(model),
                buffer=_buffer_copy(bucket),
                launches=state["launches"],
                arrivals=state["arrivals"],
                in_backward=in_backward,
                records=[(r.op, r.payload_bytes) for r in ledger.records],
                unwaited=watch.never_waited(),
                blocking=[c.op for c in watch.calls if c.work is None],
            )
        )
        opt.step()
    sizes = [p.numel() for p in params]
    return dict(steps=steps, names=names, sizes=sizes)


def _list_order(n: int) -> list[int]:
    """A fixed shuffle of n indices whose last one (the first registered parameter, whose
    gradient backward produces last) moves to the front."""
    rest = list(range(1, n))
    return [0] + rest[1::2] + rest[0::2]


def _buffer_copy(bucket) -> torch.Tensor | None:
    buffer = getattr(bucket, "buffer", None)
    return buffer.detach().clone() if isinstance(buffer, torch.Tensor) else None


def _find_slot(values: torch.Tensor, flat: torch.Tensor) -> int | None:
    """Offset in `flat` where `values` sits, or None."""
    n = values.numel()
    for off in range(flat.numel() - n + 1):
        if close(flat[off : off + n], values):
            return off
    return None


def _diagnose_offsets(
    buffer: torch.Tensor | None, ref: dict[str, torch.Tensor], names: list[str]
) -> str | None:
    """Look inside the learner's buffer: which slot does not hold its parameter's gradient?"""
    total = sum(ref[n].numel() for n in names)
    if buffer is None or buffer.numel() != total:
        return None
    flat = buffer.detach().flatten().float()
    offset = 0
    for n in names:
        size = ref[n].numel()
        if not close(flat[offset : offset + size], ref[n].flatten()):
            found = _find_slot(ref[n].flatten(), flat)
            where = f"sits at offset {found}" if found is not None else "is nowhere in the buffer"
            return (
                f"wrong offsets: after wait() {n}'s mean gradient {where}, but its slot is "
                f"[{offset}, {offset + size}). A parameter's offset is the sum of numel() of "
                "the parameters before it in `params`; slots must not overlap, and the same "
                "offset is used to copy in (on_grad_ready) and out (wait)."
            )
        offset += size
    return None


def _diagnose_launches(step: dict, names: list[str], total_bytes: int) -> str | None:
    n_params = len(names)
    reduces = [b for op, b in step["records"] if op == "all_reduce"]
    launches = step["launches"]
    if not reduces:
        return (
            "the bucket was never all-reduced through minidist.comm: when the last gradient "
            "arrives, call comm.all_reduce(self.buffer, async_op=True) and keep the work."
        )
    if len(reduces) == n_params and n_params > 1:
        return (
            f"{n_params} all-reduces for {n_params} parameters: you launched one per parameter. "
            "A bucket launches ONE all-reduce of its whole flat buffer, when its last "
            "gradient has arrived."
        )
    if len(reduces) > 1:
        return f"the bucket launched {len(reduces)} all-reduces in one step; it must launch one."
    if step["in_backward"] == 0:
        return (
            "the all-reduce was launched in wait(), after backward finished, so it cannot "
            "overlap backward: launch it from on_grad_ready when the last gradient arrives."
        )
    arrivals = step["arrivals"]
    if launches and launches[0] < n_params and arrivals[launches[0] - 1] == names[-1]:
        return (
            f"you launched when the last parameter of the list ({names[-1]}) arrived, but it "
            f"was gradient {launches[0]} of {n_params} to arrive: gradients can arrive in any "
            "order (here: " + ", ".join(arrivals) + "). Count the pending ones and launch "
            "when none is left."
        )
    if launches and launches[0] < n_params:
        return (
            f"the all-reduce was launched when gradient {launches[0]} of {n_params} arrived: "
            "before the bucket was full. Count the gradients still pending and launch at zero."
        )
    if reduces[0] != total_bytes:
        if reduces[0] == 2 * total_bytes:
            return (
                f"the all-reduce carried {reduces[0]} bytes, twice the {total_bytes} of the "
                "bucket's float32 gradients: the buffer is float64 (8 bytes an element). "
                "Build it in the gradients' dtype (torch.zeros(n, dtype=params[0].dtype))."
            )
        return (
            f"the all-reduce carried {reduces[0]} bytes but the bucket holds {total_bytes}: "
            "all-reduce the whole flat buffer."
        )
    if step["blocking"]:
        return (
            "the bucket's all-reduce is blocking (async_op=False): backward stops in the "
            "hook until it finishes, so nothing overlaps. Launch it with async_op=True, keep "
            "the work and wait on it in wait()."
        )
    if step["unwaited"]:
        return (
            "wait() never waited on the async all-reduce's work: the buffer is only reduced "
            "after work.wait(); copying it out before reads whatever has arrived so far."
        )
    return None


def check_grad_bucket(bucket_cls: type) -> None:
    """Hook `bucket_cls(params, world_size)` into backward for N = 2 and 4; name the mistake."""
    reference = _reference()
    for world in WORLDS:
        results = run_on_world(_bucket_rank, world, bucket_cls)
        names, sizes = results[0]["names"], results[0]["sizes"]
        total_bytes = 4 * sum(sizes)
        for step, ref in enumerate(reference):
            for rank, res in enumerate(results):
                s = res["steps"][step]
                where = f"world of {world}, step {step}, rank {rank}"
                problem = _diagnose_launches(s, names, total_bytes)
                if problem and step > 0 and not s["records"]:
                    problem = (
                        "the first step was right but the second never all-reduced: wait() "
                        "must reset the pending count so the next backward launches again."
                    )
                problem = problem or diagnose_values(
                    s["got"],
                    ref,
                    s["local"],
                    world,
                    _diagnose_offsets(s["buffer"], ref, names),
                )
                if problem:
                    fail(f"{where}: {problem}")
    passed(
        f"GradBucket matches one process for N={tuple(sorted(WORLDS))}: one async all-reduce of "
        f"{total_bytes} bytes per step, launched by the last of {len(names)} hooks"
    )
