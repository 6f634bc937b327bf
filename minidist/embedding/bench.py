"""What `python -m minidist bench embedding` measures (the `@bench` lives in `lesson.py`).

- `table_vs_dict`: the torch back end's `HashTable.insert` and `find` of distinct int64 keys
  (negative included) at load 0.5 against a Python dict doing the same job: int64 tensor of
  keys in, int64 tensor of rows out (so the dict side pays `tolist` and `torch.tensor`, as a
  layer using a dict would). A fresh table (dict) for every insert.
- `small_inserts`: a few new keys (4) inserted into a small table (1k slots) and a huge one
  (2M slots), median milliseconds: an insert must cost O(keys), not O(slots), so the ratio
  stays near 1 (it was 27 ms against 0.65 ms when every insert allocated a slot-sized claim
  array).
- `bag_vs_dense`: the pooled lookup of a Criteo-like batch (`criteo.criteo_data`): find +
  embedding bag (`HashEmbeddingBag` in eval mode) against `nn.EmbeddingBag` over rows mapped
  beforehand, forward only: the cost of hashing, as a ratio.
- `kernel_throughput` (GPU): the Triton back end's insert of a batch of new keys into a table
  at load 0.5, and find of those keys, in keys/s, with the bytes each key moves at the least
  (`MIN_BYTES_PER_KEY`) per second as a fraction of a device-to-device copy's bandwidth.
  HierarchicalKV's published A100 figures are printed beside them (`HKV_A100`: NVIDIA Merlin
  HierarchicalKV README, "Benchmark", D = 8, load factor 0.5, 1M-key batches).

The CPU figures are per core (`bench_embedding` sets one torch thread): the dict has one, and
on a shared machine torch's multi-threaded small ops stall on a busy core (measured: 20x
slower, run to run). Nothing here is asserted on in tests (timings on a shared machine); the
tests only run the functions on tiny sizes.
"""

from __future__ import annotations

import statistics
import time

import torch

from ..bench import interleaved_ab
from .hash_table import HashTable

# keys/s, A100-80GB, find and insert_or_assign, D = 8, load 0.5 (HierarchicalKV README)
HKV_A100 = {"find": 2.5e9, "insert": 1.1e9}
# find: the key (8 B), one probed slot's key and row (16 B), the row written (8 B); insert
# the same plus the slot claimed (16 B)
MIN_BYTES_PER_KEY = {"find": 32, "insert": 48}


def distinct_keys(n: int, seed: int = 0, device="cpu") -> torch.Tensor:
    """`n` distinct int64 keys spread over the whole range (negative ones too), shuffled."""
    g = torch.Generator().manual_seed(seed)
    keys = torch.randint(
        -(1 << 62), 1 << 62, (n + n // 8 + 16,), device="cpu", generator=g
    ).unique()
    keys = keys[torch.randperm(keys.numel(), device="cpu", generator=g)][:n]
    if keys.numel() < n:
        raise RuntimeError(f"distinct_keys: drew {keys.numel()} distinct keys, wanted {n}")
    return keys.to(device)


def table_vs_dict(n: int, rounds: int, steps: int) -> dict[str, float]:
    """Insert and find speedups of the torch back end over a Python dict, and keys/s."""
    keys = distinct_keys(n)
    table = HashTable(n, max_load=0.5, backend="torch")
    table.insert(keys)
    lookup = {k: r for k, r in zip(keys.tolist(), table.find(keys).tolist())}

    def dict_find():
        torch.tensor([lookup.get(k, -1) for k in keys.tolist()], dtype=torch.int64, device="cpu")

    def dict_insert():
        fresh: dict[int, int] = {}
        torch.tensor(
            [fresh.setdefault(k, len(fresh)) for k in keys.tolist()],
            dtype=torch.int64,
            device="cpu",
        )

    find = interleaved_ab(lambda: table.find(keys), dict_find, rounds, steps)
    insert = interleaved_ab(
        lambda: HashTable(n, max_load=0.5, backend="torch").insert(keys),
        dict_insert,
        rounds,
        steps,
    )
    return {
        "hash_find_speedup_vs_dict": 1 / find.ratio,
        "hash_insert_speedup_vs_dict": 1 / insert.ratio,
        "hash_find_keys_per_s": n / statistics.median(find.seconds_a),
        "dict_find_keys_per_s": n / statistics.median(find.seconds_b),
        "hash_insert_keys_per_s": n / statistics.median(insert.seconds_a),
        "dict_insert_keys_per_s": n / statistics.median(insert.seconds_b),
        "hash_bench_keys": n,
    }


def small_inserts(
    rounds: int, batch: int = 4, capacities: tuple[int, int] = (768, 1_500_000)
) -> dict[str, float]:
    """Median ms of inserting `batch` new keys into tables of the two capacities (1k and 2M
    slots at the default max_load 0.75), and their ratio (large over small)."""
    out, medians = {}, []
    for capacity in capacities:
        table = HashTable(capacity, backend="torch")
        table.insert(distinct_keys(min(1000, capacity // 2), seed=1))
        fresh = distinct_keys(batch * rounds, seed=2)
        seconds = []
        for r in range(rounds):
            start = time.perf_counter()
            table.insert(fresh[r * batch : (r + 1) * batch])
            seconds.append(time.perf_counter() - start)
        medians.append(statistics.median(seconds))
        out[f"hash_insert_{batch}_keys_ms_at_{table.num_slots}_slots"] = 1e3 * medians[-1]
    out["hash_small_insert_large_over_small"] = medians[1] / medians[0]
    return out


def bag_vs_dense(samples: int, rounds: int, steps: int, dim: int = 16) -> dict[str, float]:
    """Find + embedding bag over a hash table against nn.EmbeddingBag on pre-mapped rows."""
    from .criteo import criteo_data
    from .layers import HashEmbeddingBag

    data = criteo_data(seed=0, samples=samples)
    _, values, offsets, _ = data.batch(0, samples)
    distinct = values.unique().numel()
    layer = HashEmbeddingBag(distinct, dim, "sum", backend="torch")
    layer(values, offsets)  # training mode: inserts every key
    layer.eval()
    rows = layer.table.find(values)
    dense = torch.nn.EmbeddingBag(distinct, dim, mode="sum", include_last_offset=True)
    with torch.no_grad():
        dense.weight.copy_(layer.weight[:distinct])
        diff = float((layer(values, offsets) - dense(rows, offsets)).abs().max())
        ab = interleaved_ab(
            lambda: layer(values, offsets), lambda: dense(rows, offsets), rounds, steps
        )
    return {
        "embedding_bag_ratio_vs_dense": ab.ratio,
        "embedding_bag_ms_hash": 1e3 * statistics.median(ab.seconds_a),
        "embedding_bag_ms_dense": 1e3 * statistics.median(ab.seconds_b),
        "embedding_bag_keys": values.numel(),
        "embedding_bag_same_output": diff <= 1e-6,
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_bandwidth(device, numel: int = 1 << 26, rounds: int = 5) -> float:
    """Bytes/s of a device-to-device copy (read + write), the best of `rounds`."""
    device = torch.device(device)
    src = torch.empty(numel, dtype=torch.int64, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(rounds):
        _sync(device)
        t0 = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * 8 * numel / best


def kernel_throughput(device, backend: str, capacity: int, batch: int, rounds: int) -> dict:
    """keys/s of inserting `batch` new keys into a table of `capacity` keys at max_load 0.5
    already holding capacity - batch keys (so it ends at load 0.5), and of finding them."""
    device = torch.device(device)
    keys = distinct_keys(capacity, seed=1, device=device)
    old, new = keys[: capacity - batch], keys[capacity - batch :]
    insert_s, find_s = [], []
    for _ in range(rounds):
        table = HashTable(capacity, max_load=0.5, device=device, backend=backend)
        if old.numel():
            table.insert(old)
        _sync(device)
        t0 = time.perf_counter()
        table.insert(new)
        _sync(device)
        t1 = time.perf_counter()
        table.find(new)
        _sync(device)
        insert_s.append(t1 - t0)
        find_s.append(time.perf_counter() - t1)
    out = {"load_factor": table.load_factor, "batch": batch}
    for op, seconds in (("insert", insert_s), ("find", find_s)):
        out[f"{op}_keys_per_s"] = batch / statistics.median(seconds)
        out[f"{op}_bytes_per_s"] = out[f"{op}_keys_per_s"] * MIN_BYTES_PER_KEY[op]
    return out


def gpu_figures(rounds: int) -> dict[str, float]:
    """The Triton kernels on the GPU beside HierarchicalKV's A100 figures."""
    device = torch.device("cuda")
    bandwidth = copy_bandwidth(device)
    r = kernel_throughput(device, "triton", 1 << 24, 1 << 20, rounds)
    out = {
        "gpu": torch.cuda.get_device_name(device),
        "gpu_copy_bytes_per_s": bandwidth,
        "triton_load_factor": r["load_factor"],
    }
    for op in ("find", "insert"):
        out[f"triton_{op}_keys_per_s"] = r[f"{op}_keys_per_s"]
        out[f"triton_{op}_bandwidth_fraction"] = r[f"{op}_bytes_per_s"] / bandwidth
        out[f"hkv_a100_{op}_keys_per_s"] = HKV_A100[op]
    return out
