"""Lesson 11's entries in the tour: HugeCTR's two placements, "distributed slots" and
"localized slots", and a Wide&Deep model.

"distributed slots (HugeCTR)": `DistributedSlotSparseEmbeddingHash` (NVIDIA Merlin HugeCTR
docs; Wang et al. 2022) on the tour's world, both key placements (`key mod N` and
`fmix64(key) mod N`), trained `STEPS` steps with `SparseAdagrad` on `fixture.ctr_data`,
against one `HashEmbeddingBag` over the global batches: pooled outputs and key-sorted
key -> vector dumps within `fixture.TOL`.
Memory: rank 0's value table plus Adagrad's accumulator, measured, against
`theory.embedding_state_bytes_per_rank`. Bytes: what rank 0 sends in the last step with the
hashed placement and HugeCTR's reduce-scatter scheme, the layer's default (the counts, the
(key, bag) pairs to their owners, the reduce-scatter of the partial sums, the all-gather of
the top gradients), against `theory.distributed_slot_reduce_scatter_step_bytes` from the
step's split counts. Figures: the load of keys per rank and the bytes per step of the two
placements. (`step_bytes_theory` also counts the all-to-all scheme, for notebook 11.)

"localized slots (HugeCTR)": `LocalizedSlotSparseEmbeddingHash` (every slot whole on rank
s mod N) trained the same way, against the same reference (each slot's keys are its own, so
one table and N tables of slots hold the same vectors). Memory: rank 0's table and Adagrad's
state against `theory.embedding_state_bytes_per_rank`; bytes: rank 0's last step against
`theory.localized_slot_step_bytes` from the step's bags and keys per owner
(`fixture.localized_counts`).

The "Wide&Deep (hash emb. + DDP)" row (Cheng et al. 2016) trains `ctr.build_ctr("wide_deep")`
on `criteo.criteo_data` with its embeddings model-parallel (distributed slots, hashed) and
its MLPs in `BucketedDataParallel`, against the same model in one process: losses, key-sorted
tables, MLP parameters and held-out logits within `CTR_TOL`. Memory: rank 0's two tables
(dimensions 8 and 1) and their Adagrad state against `theory.embedding_state_bytes_per_rank`;
bytes: rank 0's last step against `theory.distributed_slot_reduce_scatter_step_bytes` for
each table plus DDP's all-reduce of the MLP gradients
(`data_parallel.theory.bytes_sent_per_step`).

The bench `python -m minidist bench embedding` (one process; `bench.py` says what it times):
the torch back end's insert and find against a Python dict (`hash_find_speedup_vs_dict`, goal
>= 10), the pooled lookup against `nn.EmbeddingBag` on pre-mapped rows
(`embedding_bag_ratio_vs_dense`, goal <= 3), and on a GPU the Triton kernels' keys/s and
fraction of the copy bandwidth beside HierarchicalKV's A100 figures.
"""

from __future__ import annotations

from pathlib import Path

from ..registry import TourRow, bench, tour_row
from ..runtime import launch
from . import theory
from .fixture import (
    CTRData,
    ctr_data,
    localized_counts,
    max_diff_vs_reference,
    reference,
    slot_embedding_on_rank,
    split_counts,
)

STEPS, GLOBAL_BATCH, CAPACITY_PER_RANK = 2, 16, 256
CTR_STEPS, CTR_BATCH, CTR_CAPACITY = 2, 64, 2048
# float32, other summation orders (DDP's mean, the owners' sums); Adagrad starts its
# accumulators at 0.1, so rounding is not amplified (tests/test_embedding_ctr.py)
CTR_TOL = 1e-5
BENCH_KEYS, BENCH_SAMPLES = 1 << 18, 2048  # keys at load 0.5; Criteo-like samples (x 26 slots)
PLACEMENTS = ("modulo", "hashed")


def _save(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def _slot_step_bytes(to: list, rank: int, dim: int, bags: int, scheme: str, mode: str):
    """One rank's bytes in one distributed-slot step, from every rank's split counts
    `to[r][q]` (key occurrences rank r sends to owner q) and its `bags` bags."""
    if scheme == "reduce_scatter":
        return theory.distributed_slot_reduce_scatter_step_bytes(to[rank], rank, dim, bags, mode)
    return theory.distributed_slot_step_bytes(to[rank], [t[rank] for t in to], rank, dim)


def step_bytes_theory(
    data: CTRData,
    step: int,
    world: int,
    placement: str,
    dim: int,
    scheme: str = "reduce_scatter",
    mode: str = "sum",
) -> list:
    """Every rank's bytes at `step` of `slot_embedding_on_rank` (GLOBAL_BATCH samples):
    `theory.distributed_slot_reduce_scatter_step_bytes` (the default scheme) or
    `theory.distributed_slot_step_bytes` (`scheme="all_to_all"`, which has no mean term)."""
    to = split_counts(data, step, world, GLOBAL_BATCH, placement)
    bags = GLOBAL_BATCH // world * data.slots
    return [_slot_step_bytes(to, r, dim, bags, scheme, mode) for r in range(world)]


@tour_row("distributed slots (HugeCTR)", lesson=11)
def hash_embedding_row(world_size: int, out_dir: Path) -> TourRow:
    from .plots import plot_bytes_per_step, plot_load_imbalance

    data = ctr_data(seed=0, samples=STEPS * GLOBAL_BATCH)
    n = world_size if GLOBAL_BATCH % world_size == 0 else 1
    runs = launch(
        slot_embedding_on_rank, n, data, PLACEMENTS, STEPS, GLOBAL_BATCH, CAPACITY_PER_RANK
    )
    ref = reference(data, STEPS, GLOBAL_BATCH, n * CAPACITY_PER_RANK)
    diff = max(max_diff_vs_reference(runs, p, ref) for p in PLACEMENTS)
    dim = runs[0]["hashed"]["dump"][1].shape[1]
    last = STEPS - 1
    measured = {p: [r[p]["sent"][last] for r in runs] for p in PLACEMENTS}
    predicted = {p: step_bytes_theory(data, last, n, p, dim) for p in PLACEMENTS}
    _save(plot_load_imbalance(data.keys(), n), out_dir / "embedding_load_imbalance.png")
    _save(plot_bytes_per_step(measured, predicted), out_dir / "embedding_bytes_per_step.png")
    return TourRow(
        f"distributed slots (HugeCTR, N={n})",
        diff <= 1e-6,
        diff,
        memory_per_rank=runs[0]["hashed"]["memory"],
        memory_theory=theory.embedding_state_bytes_per_rank(CAPACITY_PER_RANK, dim, "adagrad"),
        bytes_per_rank=measured["hashed"][0],
        bytes_theory=predicted["hashed"][0],
    )


@tour_row("localized slots (HugeCTR)", lesson=11)
def localized_slots_row(world_size: int, out_dir: Path) -> TourRow:
    data = ctr_data(seed=0, samples=STEPS * GLOBAL_BATCH)
    n = world_size if GLOBAL_BATCH % world_size == 0 else 1
    runs = launch(
        slot_embedding_on_rank, n, data, ("localized",), STEPS, GLOBAL_BATCH, CAPACITY_PER_RANK
    )
    ref = reference(data, STEPS, GLOBAL_BATCH, n * CAPACITY_PER_RANK)
    diff = max_diff_vs_reference(runs, "localized", ref)
    dim = runs[0]["localized"]["dump"][1].shape[1]
    last = STEPS - 1
    bags_to, keys_to = localized_counts(data, last, n, GLOBAL_BATCH)
    bags_from = [bags_to[r][0] for r in range(n)]  # what rank 0's slots get from each rank
    return TourRow(
        f"localized slots (HugeCTR, N={n})",
        diff <= 1e-6,
        diff,
        memory_per_rank=runs[0]["localized"]["memory"],
        memory_theory=theory.embedding_state_bytes_per_rank(CAPACITY_PER_RANK, dim, "adagrad"),
        bytes_per_rank=runs[0]["localized"]["sent"][last],
        bytes_theory=theory.localized_slot_step_bytes(bags_to[0], keys_to[0], bags_from, 0, dim),
    )


def ctr_step_bytes_theory(
    data, step: int, world: int, dims, psi: int, scheme: str = "reduce_scatter"
) -> list[float]:
    """Bytes each rank sends in CTR training step `step`: every table's distributed-slot
    step (hashed placement, `scheme`, sum combiner) and DDP's all-reduce of the Ψ = `psi`
    MLP gradients."""
    import torch

    from ..data_parallel import theory as dp_theory
    from .distributed import key_owner

    local = CTR_BATCH // world
    to = []
    for r in range(world):
        lo = step * CTR_BATCH + r * local
        values = data.batch(lo, lo + local)[1]
        to.append(torch.bincount(key_owner(values, world, "hashed"), minlength=world).tolist())
    bags = local * data.slots
    return [
        sum(_slot_step_bytes(to, r, d, bags, scheme, "sum") for d in dims)
        + dp_theory.bytes_sent_per_step(psi, world)
        for r in range(world)
    ]


@tour_row("Wide&Deep (hash emb. + DDP)", lesson=11)
def wide_deep_row(world_size: int, out_dir: Path) -> TourRow:
    import torch

    from .criteo import criteo_data
    from .ctr import (
        build_ctr,
        ctr_on_rank,
        dump_diff,
        make_optimizers,
        merge_dumps,
        predict,
        train_steps,
    )
    from .plots import plot_ctr_losses

    data = criteo_data(seed=0, samples=(CTR_STEPS + 1) * CTR_BATCH)
    n = world_size if CTR_BATCH % world_size == 0 else 1
    held_out = (CTR_STEPS * CTR_BATCH, data.samples)
    runs = launch(
        ctr_on_rank,
        n,
        "wide_deep",
        "distributed",
        data,
        CTR_STEPS,
        CTR_BATCH,
        held_out,
        capacity=CTR_CAPACITY,
    )
    one = build_ctr(
        "wide_deep", "hash", slots=data.slots, dense=data.dense.shape[1], capacity=n * CTR_CAPACITY
    )
    losses = train_steps(one, make_optimizers(one), data, CTR_STEPS, CTR_BATCH)
    world_losses = [sum(r["losses"][i] for r in runs) / n for i in range(CTR_STEPS)]
    diff = max(abs(a - b) for a, b in zip(world_losses, losses))
    for name, dump in one.dumps().items():
        diff = max(diff, dump_diff(merge_dumps([r["dumps"][name] for r in runs]), dump))
    for name, p in one.dense.named_parameters():
        diff = max(diff, float((runs[0]["dense"][name] - p.detach()).abs().max()))
    logits = torch.cat([r["logits"] for r in runs])
    diff = max(diff, float((logits - predict(one, data, *held_out)).abs().max()))
    psi = sum(p.numel() for p in one.dense.parameters())
    predicted = ctr_step_bytes_theory(data, CTR_STEPS - 1, n, one.dims.values(), psi)
    curves = {f"{n} ranks": world_losses, "one process": losses}
    _save(plot_ctr_losses(curves, "Wide&Deep, hash embeddings + DDP"), out_dir / "ctr_losses.png")
    memory = sum(
        theory.embedding_state_bytes_per_rank(CTR_CAPACITY, d, "adagrad") for d in one.dims.values()
    )
    return TourRow(
        f"Wide&Deep (hash emb. + DDP, N={n})",
        diff <= CTR_TOL,
        diff,
        memory_per_rank=runs[0]["memory"],
        memory_theory=memory,
        bytes_per_rank=runs[0]["sent"],
        bytes_theory=predicted[0],
    )


@bench("embedding")
def bench_embedding(world_size: int, rounds: int, steps: int) -> dict:
    """Keys per second of the hash table (torch back end) over a Python dict's, for find and
    insert (above 1: the table is faster); 4 new keys into a 1k- and a 2M-slot table (the
    ratio near 1: an insert costs O(keys), not O(slots)); the pooled lookup's time (find +
    embedding bag) over `nn.EmbeddingBag` on pre-mapped rows (above 1: hashing costs that
    factor); on a GPU the Triton kernels' keys/s and bytes/s next to HierarchicalKV's
    published A100 figures.

    One process, one torch thread: `world_size` is not used."""
    import torch

    from . import bench as measure

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # per core: the dict has one, and a shared CPU stalls the rest
    try:
        out = measure.table_vs_dict(BENCH_KEYS, rounds, steps)
        out |= measure.small_inserts(max(rounds * steps, 20))
        out |= measure.bag_vs_dense(BENCH_SAMPLES, rounds, steps)
    finally:
        torch.set_num_threads(threads)
    out["cpu_threads"] = 1
    if torch.cuda.is_available():
        out |= measure.gpu_figures(rounds)
    return out
