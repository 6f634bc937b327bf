"""Lesson 18's bench: how long a save blocks a training step, synchronous vs asynchronous,
and what a resharding resume reads per rank; and its tour row (`resume_row`: the composed
engine saved on one layout, resumed on another, against one process).

`python -m minidist bench checkpoint --world-size 2` trains the course GPT (wider than the
tests', so the write is not all framing) under FSDP and, interleaved over `rounds`, times
a step alone, a step followed by a synchronous `save`, and a step followed by an
`AsyncSaver.save` (what the loop waits for: the copy to host memory), then the step during
the background write. Then it loads the checkpoint on half the ranks (one process from 2)
and prints the bytes each rank read beside its own shard.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from .. import comm
from ..data import shard_batch
from ..data_parallel.fixture import build
from ..fsdp import FullyShardedDataParallel
from ..fsdp.fixture import UNITS
from ..registry import TourRow, bench, tour_row
from ..runtime import launch
from ..training import train
from ..zero.fixture import ADAM
from .async_save import AsyncSaver
from .lesson_pieces import fsdp_pieces, materialize_optimizer_state
from .state import TrainingState
from .universal import load, save

BENCH = dict(hidden=256, layers=4, heads=4, seq_len=64)


def _fsdp(seed: int = 0):
    rank, world = dist.get_rank(), dist.get_world_size()
    model, batches, loss_fn = build("gpt", steps=4, seed=seed, **BENCH)
    fsdp = FullyShardedDataParallel(model, wrap=UNITS["gpt"])
    opt = torch.optim.Adam(fsdp.sharded_parameters(), **ADAM)
    return fsdp, opt, [shard_batch(b, rank, world) for b in batches], loss_fn


def _bench_rank(directory: str, rounds: int) -> dict:
    fsdp, opt, local, loss_fn = _fsdp()
    saver = AsyncSaver()
    path = Path(directory) / "ck"
    times: dict[str, list[float]] = {"step": [], "sync": [], "async": [], "during": []}
    train(fsdp, local[:1], loss_fn, opt)  # warm-up: optimizer state exists
    for r in range(rounds):
        comm.barrier(tag="bench")
        start = time.perf_counter()
        train(fsdp, local[:1], loss_fn, opt)
        step = time.perf_counter() - start
        times["step"].append(step)
        pieces, state = fsdp_pieces(fsdp, opt), TrainingState(step=r)
        order = ("sync", "async") if r % 2 == 0 else ("async", "sync")
        for kind in order:
            comm.barrier(tag="bench")
            start = time.perf_counter()
            if kind == "sync":
                save(path, pieces, state)
            else:
                saver.save(path, pieces, state)
                times["async"].append(time.perf_counter() - start)
                begin = time.perf_counter()
                train(fsdp, local[:1], loss_fn, opt)  # the step the write runs beside
                times["during"].append(time.perf_counter() - begin)
                saver.wait()
                continue
            times["sync"].append(time.perf_counter() - start)
    saver.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    return med | {"write": saver.write_s, "shard": sum(p.tensor.nbytes for p in pieces)}


def _resume_rank(directory: str) -> dict:
    fsdp, opt, _, _ = _fsdp(seed=1)
    materialize_optimizer_state(opt)
    report = load(Path(directory) / "ck", fsdp_pieces(fsdp, opt))
    return {"read": report.bytes_read, "payload": report.payload_read, "shard": report.shard_bytes}


@bench("checkpoint")
def bench_checkpoint(world_size: int, rounds: int, steps: int) -> dict[str, float]:
    """The step time a synchronous save blocks vs an asynchronous one (copy to host, write in
    a thread); bytes each rank reads resuming on half the ranks vs its own shard."""
    directory = tempfile.mkdtemp(prefix="minidist-bench-ckpt-")
    try:
        runs = launch(_bench_rank, world_size, directory, rounds, timeout_s=1800)
        resumed = launch(_resume_rank, max(1, world_size // 2), directory, timeout_s=600)
        total = sum(f.stat().st_size for f in (Path(directory) / "ck").iterdir())
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    r0 = runs[0]
    out = {
        "step_s": r0["step"],
        "sync_save_blocked_s": r0["sync"],
        "async_save_blocked_s": r0["async"],
        "async_write_s": r0["write"],
        "step_during_async_write_s": r0["during"],
        "saved_shard_bytes_rank0": r0["shard"],
        "checkpoint_bytes": total,
    }
    for rank, r in enumerate(resumed):
        out[f"resume_on_{len(resumed)}_rank{rank}_read_bytes"] = r["read"]
        out[f"resume_on_{len(resumed)}_rank{rank}_payload_bytes"] = r["payload"]
        out[f"resume_on_{len(resumed)}_rank{rank}_shard_bytes"] = r["shard"]
    return out


@tour_row("universal checkpoint, resumed on another layout", lesson=18)
def resume_row(world_size: int, out_dir: Path) -> TourRow:
    """The Llama-style model saved at step 2 on dp_shard 2 · tp 2 (4 ranks), resumed on
    dp_shard `world_size` to step 4, against one process (lesson 17's tolerances: losses
    1e-5, parameters 1e-3). Memory and bytes: rank 0 of the resumed run, no theory."""
    from ..compose.fixture import reference
    from ..trainer.cli import dims_of, parse
    from ..trainer.loop import train_rank
    from ..training import max_abs_diff

    if world_size < 4:
        raise ValueError(f"resume tour row: world_size={world_size} must be >= 4")
    ck = str(Path(out_dir) / "resume-ck")
    before = parse(
        ["--model", "llama", "--dp-shard", "2", "--tp", "2", "--steps", "2", "--save", ck]
    )
    launch(train_rank, 4, before, dims_of(before), timeout_s=600)
    d = max(k for k in (1, 2, 4, 8) if k <= world_size)
    after = parse(["--model", "llama", "--dp-shard", str(d), "--steps", "4", "--resume", ck])
    r0 = launch(train_rank, d, after, dims_of(after), timeout_s=600)[0]
    want = reference("llama", 4)
    loss = max(abs(a - b) for a, b in zip(r0["losses"], want["losses"][2:]))
    diff = max_abs_diff(r0["params"], want["params"])
    m = r0["memory"]
    return TourRow(
        f"universal checkpoint: dp_shard 2 · tp 2 resumed on dp_shard {d}",
        r0["resumed_from"] == 2 and loss < 1e-5 and diff < 1e-3,
        diff,
        memory_per_rank=m["params"] + m["grads"] + m["master"] + m["optimizer"],
        memory_theory=None,
        bytes_per_rank=sum(r0["bytes"].values()),
        bytes_theory=None,
    )
