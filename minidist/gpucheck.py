"""`python -m minidist gpucheck` (`make test-gpu`): every check that needs a GPU, in one run.

CI runs on CPUs; this is the script to run on a machine with one or more NVIDIA GPUs (under
10 minutes on one). It prints `name=value` lines, one per figure, and exits 1 if a check
failed. On a machine without a GPU it prints `gpu=none` and exits 0. In an image that
already holds torch and triton (no virtual environment to build), run it from the
repository root as `PYTHONPATH=. python -m minidist gpucheck` (TRITON_INTERPRET unset).
What it runs:

- `triton_*`: the Triton kernels compiled on the GPU against the torch back end on 10^6
  keys: the same keys found after insert, grow and insert again, the same vector per key
  (`HashEmbeddingBag.dump`), the same pooled output and the same gradient per key;
- `embedding_*`: `bench embedding`'s GPU half (`embedding.bench.gpu_figures`): keys/s and
  the fraction of a device-to-device copy's bandwidth, beside HierarchicalKV's published
  A100 figures;
- `world1_*`: every wrapper in a world of 1 under NCCL (the model, its data and every
  bookkeeping tensor on `cuda:0`), equal to the same run on a CPU world of 1: lessons 01-09's,
  the sequence-, context- and expert-parallel layers of lessons 14-16 and lesson 17's
  composed path on its three models;
- with one GPU, `cpu_tour_*`: the tour's rows on the usual CPU world of 4 (gloo);
- with two or more, `nccl_tour_*`: every tour row under NCCL on min(GPUs, 4) ranks (equal
  to its reference, memory and bytes against the theory, and rank 0's measured peak CUDA
  memory beside the memory formula), and `nccl_bench_*`: the ddp, zero, tp, pp, sp and cp benches
  against their torch-native equivalents under NCCL.
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable

import torch

# (name, module, rank function, args, tolerance): every wrapper, trained in a world of one.
WRAPPERS = (
    ("naive_dp", "minidist.data_parallel.fixture", "train_on_rank", ("naive", "gpt"), 1e-4),
    ("bucketed_ddp", "minidist.data_parallel.fixture", "train_on_rank", ("bucketed", "gpt"), 1e-4),
    ("zero1", "minidist.zero.fixture", "train_on_rank", (1, "gpt"), 1e-4),
    ("zero2", "minidist.zero.fixture", "train_on_rank", (2, "gpt"), 1e-4),
    ("fsdp", "minidist.fsdp.fixture", "train_on_rank", ("gpt",), 1e-4),
    ("fsdp_bf16", "minidist.mixed_precision.fixture", "train_on_rank", (torch.bfloat16,), 5e-2),
    ("fsdp_cpu_offload", "minidist.offload.fixture", "train_on_rank", ("cpu",), 1e-4),
    ("fsdp_recompute", "minidist.recompute.fixture", "fsdp_on_rank", (True,), 1e-4),
    ("tensor_parallel", "minidist.megatron.fixture", "train_on_rank", (), 1e-4),
    ("pipeline_1f1b", "minidist.pipeline.fixture", "pipeline_on_rank", ("1f1b", 2, 1), 1e-4),
    ("sequence_parallel", "minidist.sequence_parallel.fixture", "train_on_rank", (True,), 1e-4),
    ("context_parallel", "minidist.context_parallel.fixture", "train_on_rank", ("zigzag",), 1e-4),
    ("expert_parallel", "minidist.expert_parallel.fixture", "train_on_rank", (1, 2), 1e-4),
    ("composed_gpt", "minidist.compose.fixture", "run_rank", ("gpt", {}), 1e-4),
    ("composed_moe", "minidist.compose.fixture", "run_rank", ("moe", {}), 1e-4),
    ("composed_llama", "minidist.compose.fixture", "run_rank", ("llama", {}), 1e-4),
)
BENCHES = ("ddp", "zero", "tp", "pp", "sp", "cp")


def gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def section(name: str, fn: Callable[[], dict], emit: Callable[[str], None]) -> bool:
    """Run one check, print its figures as `name_key=value`; False (and `name_error=`) if it
    raised or reported `ok=False`."""
    t0 = time.perf_counter()
    try:
        figures = fn()
    except Exception as exc:  # a check that breaks is reported, the others still run
        last = traceback.format_exc().strip().splitlines()[-1]
        emit(f"{name}_error={type(exc).__name__}: {last}")
        figures = {"ok": False}
    for key, value in figures.items():
        emit(f"{name}_{key}={value:.4g}" if isinstance(value, float) else f"{name}_{key}={value}")
    emit(f"{name}_seconds={time.perf_counter() - t0:.1f}")
    return bool(figures.get("ok", True))


# -- the Triton kernels against the torch back end ----------------------------------------


def triton_vs_torch(n: int = 10**6, dim: int = 8, device="cuda") -> dict:
    """Both back ends on the same `n` keys: insert half, grow, insert the rest (and repeats),
    find them and absent keys, pool bags of 4 keys, backward. Rows may differ (each back end
    hands rows out in its own order); keys found, vectors per key and gradients may not."""
    from .embedding.bench import distinct_keys
    from .embedding.layers import HashEmbeddingBag

    keys = distinct_keys(n + n // 4, seed=3, device=device)
    keys, absent = keys[:n], keys[n:]
    g = torch.Generator(device="cpu").manual_seed(0)
    repeats = keys[torch.randperm(n, device="cpu", generator=g)[: n // 4].to(device)]
    values = torch.cat([keys[n // 2 :], repeats])
    values = values[: values.numel() // 4 * 4]
    offsets = torch.arange(0, values.numel() + 1, 4, device=device)
    weights = torch.randn(values.numel() // 4, dim, device="cpu", generator=g).to(device)
    out: dict = {}
    for backend in ("triton", "torch"):
        layer = HashEmbeddingBag(n // 2 + 1, dim, device=device, backend=backend)
        layer(keys[: n // 2], torch.arange(0, n // 2 + 1, device=device))  # insert half
        layer.grow(2 * n)
        pooled = layer(values, offsets)  # inserts the rest, finds the repeats
        (pooled * weights).sum().backward()
        probe = torch.cat([keys, absent])
        found = layer.table.find(probe) >= 0
        grad = layer.weight.grad
        grad = grad.to_dense() if grad.is_sparse else grad
        rows = layer.table.find(keys)
        out[backend] = (found, layer.dump(), pooled.detach(), grad[rows])
    t, c = out["triton"], out["torch"]
    same = {
        "same_keys_found": bool(torch.equal(t[0], c[0])) and int(t[0][:n].sum()) == n,
        "same_vectors": bool(torch.equal(t[1][0], c[1][0]) and torch.equal(t[1][1], c[1][1])),
        "same_bags": float((t[2] - c[2]).abs().max()) <= 1e-5,
        "same_grads": float((t[3] - c[3]).abs().max()) <= 1e-5,
    }
    return {"keys": n, **same, "ok": all(same.values())}


# -- every wrapper in a world of one -------------------------------------------------------


def _trace_of(result) -> tuple[list[float], dict[str, torch.Tensor]]:
    """(losses, final parameters) out of what a fixture's rank function returns. For a trace
    of steps without a loss (lesson 16's `EPRun`: one MoE layer's output per step), the mean
    square of each step's output stands in for its loss."""
    if hasattr(result, "losses") and hasattr(result, "params"):
        return list(result.losses), result.params
    if isinstance(getattr(result, "trace", None), list) and hasattr(result, "params"):
        return [float(s.out.double().square().mean()) for s in result.trace], result.params
    if isinstance(result, dict):
        if "trace" in result:
            return _trace_of(result["trace"])
        params = result["params"]
        return list(result["losses"]), params[-1] if isinstance(params, list) else params
    if isinstance(result, tuple):
        return _trace_of(result[0])
    raise TypeError(f"no training trace in a {type(result).__name__}")


def _run_on_rank(module: str, fn: str, args: tuple) -> tuple[list[float], dict]:
    """On a rank: the fixture's rank function, its trace brought to the CPU."""
    import importlib

    losses, params = _trace_of(getattr(importlib.import_module(module), fn)(*args))
    return losses, {k: v.detach().float().cpu() for k, v in params.items()}


def wrapper_in_world_of_one(case: tuple, device: str, reference_device: str = "cpu") -> dict:
    """One wrapper on `device` against the same run on `reference_device`."""
    from .runtime import launch

    name, module, fn, args, tol = case
    got = launch(_run_on_rank, 1, module, fn, args, device=device, timeout_s=300)[0]
    ref = launch(_run_on_rank, 1, module, fn, args, device=reference_device, timeout_s=300)[0]
    loss = max(abs(a - b) for a, b in zip(got[0], ref[0]))
    param = max(float((got[1][k] - ref[1][k]).abs().max()) for k in ref[1])
    return {"loss_diff": loss, "param_diff": param, "ok": max(loss, param) <= tol}


# -- the tour and the benches ---------------------------------------------------------------


def tour_rows(world_size: int) -> dict:
    """Every tour row on a world of `world_size` (the backend MINIDIST_BACKEND says): per row
    `key=matches/max diff`, `key_memory=measured/formula` (model-state bytes per rank),
    `key_bytes=measured/theory` and, for rows whose worlds ran under NCCL,
    `key_max_memory_allocated_rank0`: the most CUDA bytes rank 0 held in any of the row's
    worlds (`torch.cuda.max_memory_allocated`, reset before the rank function, read on the
    rank: `runtime.cuda_peaks`). It exceeds the formula by what the formula leaves out
    (activations, temporaries, the allocator's rounding)."""
    import tempfile
    from pathlib import Path

    from .registry import tour_rows as registered
    from .runtime import cuda_peaks

    out, ok = {}, True
    with tempfile.TemporaryDirectory() as folder:
        for name, row_fn in registered().items():
            key = "".join(c if c.isalnum() else "_" for c in name.lower()).strip("_")
            try:
                with cuda_peaks() as peaks:  # each NCCL world's ranks, measured on the ranks
                    row = row_fn(world_size, Path(folder))
            except Exception as exc:  # one row's failure is reported, the others still run
                out[key] = f"error: {type(exc).__name__}: {str(exc).strip().splitlines()[-1]}"
                ok = False
                continue
            theory_ok = row.bytes_theory is None or abs(row.bytes_per_rank - row.bytes_theory) <= (
                1e-6 * max(1.0, row.bytes_theory)
            )
            memory_ok = row.memory_theory is None or row.memory_per_rank == row.memory_theory
            out[key] = f"{'yes' if row.matches else 'NO'}/{row.max_abs_diff:.1e}"
            out[f"{key}_memory"] = f"{row.memory_per_rank}/{row.memory_theory}"
            if peaks:  # NCCL worlds: rank 0's peak CUDA bytes over the row's worlds
                out[f"{key}_max_memory_allocated_rank0"] = max(world[0] for world in peaks)
            out[f"{key}_bytes"] = f"{row.bytes_per_rank}/{row.bytes_theory}"
            ok = ok and row.matches and theory_ok and memory_ok
    return {**out, "ok": ok}


def benches(world_size: int) -> dict:
    from .registry import benches as registered

    out = {}
    for name in BENCHES:
        for key, value in registered()[name](world_size, 5, 3).items():
            out[f"{name}_{key}"] = value
    return out


def main(emit: Callable[[str], None] = print) -> int:
    gpus = gpu_count()
    if gpus == 0:
        emit("gpu=none")
        emit("gpucheck=skipped (no GPU on this machine; `make test` runs the CPU worlds)")
        return 0
    emit(f"gpus={gpus}")
    emit(f"torch={torch.__version__}")
    emit(f"cuda={torch.version.cuda}")
    if os.environ.get("TRITON_INTERPRET") == "1":
        emit("gpucheck=refused (TRITON_INTERPRET=1 is set: the kernels would not compile)")
        return 1
    ok = True
    if gpus == 1:  # first, while CUDA is not initialised here: the CPU worlds can fork
        ok &= section("cpu_tour", lambda: tour_rows(4), emit)
    emit(f"gpu={torch.cuda.get_device_name(0)}")
    ok &= section("triton", triton_vs_torch, emit)
    from .embedding.bench import gpu_figures

    ok &= section("embedding", lambda: gpu_figures(rounds=3), emit)
    for case in WRAPPERS:
        ok &= section(f"world1_{case[0]}", lambda c=case: wrapper_in_world_of_one(c, "cuda"), emit)
    if gpus > 1:
        os.environ["MINIDIST_BACKEND"] = "nccl"  # every world of the rows and benches
        world = min(gpus, 4)
        ok &= section("nccl_tour", lambda: tour_rows(world), emit)
        ok &= section("nccl_bench", lambda: benches(min(gpus, 2)), emit)
    emit(f"gpucheck={'ok' if ok else 'FAILED'}")
    return 0 if ok else 1
