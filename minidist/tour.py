"""`python -m minidist tour`: every technique on a local CPU world, checked and measured.

Each row runs one technique on a world of real processes and the same model in one process,
and reports: does it match the reference (and the largest difference), model-state memory
per rank next to its formula, bytes each rank sent per step next to the theory, wall time.
Rows may also save figures into the output folder.

Adding a lesson adds a row: write a function `(world_size, out_dir) -> TourRow` and decorate
it with `@tour_row("name")` (see CONTRIBUTING.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from . import comm
from .runtime import launch


@dataclass
class TourRow:
    technique: str
    matches: bool
    max_abs_diff: float
    memory_per_rank: int | None  # bytes measured
    memory_theory: int | None
    bytes_per_rank: float | None  # bytes sent per rank per step (ring model), measured
    bytes_theory: float | None
    seconds: float = 0.0


ROWS: dict[str, Callable[[int, Path], TourRow]] = {}


def tour_row(name: str):
    def register(fn: Callable[[int, Path], TourRow]):
        ROWS[name] = fn
        return fn

    return register


def _mib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:.3f} MiB"


def format_table(rows: list[TourRow]) -> str:
    head = (
        f"{'technique':<22}{'matches reference':<24}{'memory/rank (theory)':<28}"
        f"{'sent/rank/step (theory)':<30}{'time':>7}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        match = f"{'yes' if r.matches else 'NO'} ({r.max_abs_diff:.1e})"
        mem = f"{_mib(r.memory_per_rank)} ({_mib(r.memory_theory)})"
        sent = f"{_mib(r.bytes_per_rank)} ({_mib(r.bytes_theory)})"
        lines.append(f"{r.technique:<22}{match:<24}{mem:<28}{sent:<30}{r.seconds:>6.1f}s")
    return "\n".join(lines)


def run_tour(world_size: int, out_dir: Path, only: list[str] | None = None) -> int:
    from tqdm.auto import tqdm

    names = [n for n in ROWS if not only or n in only]
    unknown = set(only or []) - set(ROWS)
    if unknown:
        raise SystemExit(f"tour: unknown rows {sorted(unknown)}; choose from {list(ROWS)}")
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    progress = tqdm(names, desc="tour", unit="technique")
    for name in progress:
        progress.set_postfix_str(name)
        t0 = time.perf_counter()
        row = ROWS[name](world_size, out_dir)
        row.seconds = time.perf_counter() - t0
        rows.append(row)
    print(f"\nminidist tour on a CPU world of {world_size} ranks (gloo)\n")
    print(format_table(rows))
    print(f"\nplots written to {out_dir.resolve()}/")
    return 0 if all(r.matches for r in rows) else 1


# -- lesson 00: collectives ------------------------------------------------------------------


def _ring_rank(numel: int):
    from .ring import ring_all_reduce

    g = torch.Generator().manual_seed(dist.get_rank())
    x = torch.randn(numel, generator=g)
    expected = x.clone()
    dist.all_reduce(expected)
    with comm.record() as ledger:
        ring_all_reduce(x)
    return float((x - expected).abs().max()), ledger.total_ring_bytes()


@tour_row("ring all-reduce")
def ring_row(world_size: int, out_dir: Path) -> TourRow:
    numel = 4096 * world_size
    results = launch(_ring_rank, world_size, numel)
    diff = max(d for d, _ in results)
    return TourRow(
        "ring all-reduce", diff < 1e-5, diff, None, None,
        bytes_per_rank=results[0][1],
        bytes_theory=2 * (world_size - 1) / world_size * numel * 4,
    )  # fmt: skip


# -- lesson 01: data parallelism -------------------------------------------------------------

_DP_STEPS = 5


def _dp_setup():
    from .data import CharTokenizer, lm_batches, make_corpus
    from .models import GPT, GPTConfig

    torch.manual_seed(0)
    text = make_corpus(200)
    tok = CharTokenizer(text)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, seq_len=32, layers=2, heads=4, hidden=64))
    return model, lm_batches(tok.encode(text), _DP_STEPS, 16, 32)


def _dp_rank(kind: str):
    from .data import shard_batch
    from .data_parallel import BucketedDataParallel, NaiveDataParallel
    from .data_parallel.timeline import step_timeline
    from .memory import model_state_bytes
    from .models import lm_loss
    from .training import make_optimizer, train

    rank, world = dist.get_rank(), dist.get_world_size()
    model, batches = _dp_setup()
    if kind == "naive":
        wrapped = NaiveDataParallel(model)
        before_step = wrapped.all_reduce_gradients
    else:
        wrapped = BucketedDataParallel(model, bucket_cap_mb=0.05, first_bucket_cap_mb=0.02)
        before_step = None
    local = [shard_batch(b, rank, world) for b in batches]
    opt = make_optimizer(model.parameters())
    with comm.record() as ledger:
        trace = train(model, local, lm_loss, opt, wrapped, before_step)
    timeline = step_timeline(wrapped, local[0], lm_loss, opt)
    memory = model_state_bytes(model, opt).total
    return trace.params, ledger.total_ring_bytes() / _DP_STEPS, memory, timeline


def _dp_row(kind: str, label: str, world_size: int, out_dir: Path) -> TourRow:
    from .models import lm_loss
    from .training import make_optimizer, max_abs_diff, train
    from .viz.data_parallel import plot_timeline

    model, batches = _dp_setup()
    ref = train(model, batches, lm_loss, make_optimizer(model.parameters()))
    psi = sum(p.numel() for p in model.parameters())
    results = launch(_dp_rank, world_size, kind)
    diff = max(max_abs_diff(params, ref.params) for params, _, _, _ in results)
    fig = plot_timeline([r[3] for r in results], title=f"{kind} data parallel, {world_size} ranks")
    fig.savefig(out_dir / f"dp_{kind}_timeline.png", dpi=100, bbox_inches="tight")
    return TourRow(
        label, diff < 1e-5, diff,
        memory_per_rank=results[0][2],
        memory_theory=3 * 4 * psi,  # fp32 params + grads + SGD momentum, all replicated
        bytes_per_rank=results[0][1],
        bytes_theory=2 * (world_size - 1) / world_size * 4 * psi,
    )  # fmt: skip


@tour_row("naive DP")
def naive_dp_row(world_size: int, out_dir: Path) -> TourRow:
    return _dp_row("naive", "naive DP", world_size, out_dir)


@tour_row("bucketed DDP")
def bucketed_dp_row(world_size: int, out_dir: Path) -> TourRow:
    return _dp_row("bucketed", "bucketed DDP", world_size, out_dir)
