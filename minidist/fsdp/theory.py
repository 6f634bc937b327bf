"""What FSDP should cost, as functions: bytes per step by collective, parameter memory.

Zhao et al. 2023, "PyTorch FSDP", section 3.3: each unit's parameters are all-gathered
before its forward and, when they were freed after it (`reshard_after_forward`), again
before its backward; its gradient is reduce-scattered once. The root unit keeps its
parameters from forward to backward. With hybrid sharding (shard groups of F ranks) these
collectives run inside the shard group and each gradient chunk is then all-reduced across
the N/F replicas. Peak parameter memory: every chunk, Σψ/F, plus the units gathered at once
(the running unit and one prefetched).
"""

from __future__ import annotations

from .. import comm


def padded(numel: int, shard_size: int) -> int:
    """A unit's flat parameter padded to a multiple of the shard group's size."""
    return -(-numel // shard_size) * shard_size


def bytes_sent_per_step(
    unit_numels: list[int],
    world_size: int,
    reshard_after_forward: bool = True,
    shard_size: int | None = None,
    element_size: int = 4,
    has_root: bool = True,
) -> dict[str, float]:
    """Bytes one rank sends per step, by collective; the last unit is the root (unless
    `has_root` is False: the root module kept no parameters, every unit is resharded).

    all_gather: every unit once in forward, non-root units again in backward when resharded;
    reduce_scatter: every unit once; all_reduce (hybrid only): each rank's gradient chunks.
    Without hybrid sharding and with every unit resharded this is ZeRO's 3(N-1)/N·Ψ.
    """
    f = shard_size or world_size
    sizes = [padded(n, f) * element_size for n in unit_numels]
    resharded = sizes if not has_root else sizes[:-1]
    gathers = sum(sizes) + (sum(resharded) if reshard_after_forward else 0)
    out = {
        "all_gather": comm.ring_bytes("all_gather", gathers, f),
        "reduce_scatter": comm.ring_bytes("reduce_scatter", sum(sizes), f),
    }
    if f != world_size:
        chunk_bytes = sum(sizes) // f
        out["all_reduce"] = comm.ring_bytes("all_reduce", chunk_bytes, world_size // f)
    return out


def sharded_state_bytes(unit_numels: list[int], shard_size: int) -> dict[str, int]:
    """fp32 Adam state one rank keeps between steps: 4 + 4 + 8 bytes per owned element, plus
    Adam's 4-byte step counter per unit (one optimizer parameter each)."""
    owned = sum(padded(n, shard_size) // shard_size for n in unit_numels)
    return {"params": 4 * owned, "grads": 4 * owned, "optimizer": 8 * owned + 4 * len(unit_numels)}


def peak_param_bytes(
    unit_numels: list[int], shard_size: int, prefetch: bool = True, element_size: int = 4
) -> dict[str, int]:
    """The most parameter bytes one rank holds at once in a step (units resharded after
    forward); the last unit is the root.

    shards: this rank's chunk of every unit, Σψ/F (padded). gathered: the full flat
    parameters alive together: the root (kept from its forward to its backward), the unit
    that runs and, with prefetch, the next one (the two largest non-root units: exact when
    units are alike, as transformer blocks are; an upper bound otherwise).
    """
    sizes = [padded(n, shard_size) for n in unit_numels]
    others = sorted(sizes[:-1], reverse=True)
    gathered = sizes[-1] + sum(others[: 2 if prefetch else 1])
    return {
        "shards": element_size * sum(sizes) // shard_size,
        "gathered": element_size * gathered,
    }
