"""The bytes and times a parameter server should produce, as functions: defined here once.

Per step (one clock) a worker sends the gradient of all Ψ keys and receives all Ψ parameters,
S pieces each (Li et al. 2014); server k receives W gradient slices of its range and sends W
parameter slices: W·Ψ/S each way. A ring all-reduce over N ranks sends 2(N-1)/N·Ψ per rank
(`minidist.comm.ring_bytes`). With one link per rank at bandwidth B, the busiest link sets the
step time: a server's, W·Ψ/S each way, so the parameter server needs S ≈ W servers to load its
links as lightly as the ring does. Headers (3 int64 per request, 1 int64 per answer) are
counted separately.
"""

from __future__ import annotations

from .. import comm
from ..network.theory import Link
from .keys import key_ranges

HEADER_BYTES = 3 * 8  # op, clock, read version
VERSION_BYTES = 8  # a pull's answer starts with the server's version


def worker_bytes_per_step(psi: int, element_size: int = 4) -> dict[str, int]:
    """{"pushed": gradient bytes sent, "pulled": parameter bytes received} per worker per clock."""
    return {"pushed": psi * element_size, "pulled": psi * element_size}


def server_bytes_per_step(
    psi: int, servers: int, workers: int, server: int, element_size: int = 4
) -> dict[str, int]:
    """{"received": W gradient slices, "sent": W parameter slices} of `server`'s range."""
    start, stop = key_ranges(psi, servers)[server]
    return {
        "received": workers * (stop - start) * element_size,
        "sent": workers * (stop - start) * element_size,
    }


def server_state_bytes(psi: int, servers: int, server: int, element_size: int = 4) -> int:
    """Bytes `server` holds after a step: its key range's values, their averaged gradient and
    SGD's momentum buffer, 3 × the range (a worker holds the whole model instead)."""
    start, stop = key_ranges(psi, servers)[server]
    return 3 * (stop - start) * element_size


def ring_bytes_per_step(psi: int, world_size: int, element_size: int = 4) -> float:
    """Bytes each rank sends per step in data parallelism by ring all-reduce: 2(N-1)/N·Ψ."""
    return comm.ring_bytes("all_reduce", psi * element_size, world_size)


def ps_step_time(psi: int, servers: int, workers: int, link: Link, element_size=4) -> float:
    """α-β seconds of a BSP step's communication on the busiest server link: W·Ψ/S of
    gradients in, then (pulls wait for the update) W·Ψ/S of parameters out, 2W messages."""
    busiest = -(-psi // servers) * workers * element_size
    return 2 * workers * link.alpha_s + 2 * busiest / link.bandwidth_bytes_per_s


def ring_step_time(psi: int, world_size: int, link: Link, element_size: int = 4) -> float:
    """α-β seconds of a ring all-reduce of Ψ values over N ranks: 2(N-1) steps."""
    return (
        2 * (world_size - 1) * link.alpha_s
        + ring_bytes_per_step(psi, world_size, element_size) / link.bandwidth_bytes_per_s
    )


def downpour_own_staleness(steps: int, n_fetch: int, n_push: int) -> list[int]:
    """Per push of one Downpour worker, its own pushes applied since its last fetch: the
    staleness the server records when the worker is alone (others' pushes only add to it).
    Fetches before steps 0, n_fetch, 2·n_fetch, ...; pushes after `downpour.push_steps`."""
    from .downpour import check_schedule, push_steps

    check_schedule(n_fetch, n_push)
    pushes = push_steps(steps, n_push)
    return [sum(1 for q in pushes if p - p % n_fetch <= q < p) for p in pushes]


# -- GeePS's parameter cache (Cui et al. 2016, sections 3-4; `cache.py`) ----------------------


def cache_window(layer: int, layers: int, prefetch: int, phase: str) -> list[int]:
    """Resident before `phase` of `layer`: it and the next `prefetch` layers in that pass's
    order (up in the forward, down in the backward), those that exist."""
    step = 1 if phase == "forward" else -1
    return sorted(j for j in range(layer, layer + step * (prefetch + 1), step) if 0 <= j < layers)


def cache_resident_trace(layer_bytes: list[int], prefetch: int) -> list[dict]:
    """Per (phase, layer) of one step, in order: the resident layers, their bytes and the
    bytes copied in (layers already resident stay; the step starts and ends empty)."""
    n, resident, out = len(layer_bytes), set(), []
    passes = [("forward", range(n)), ("backward", range(n - 1, -1, -1))]
    for phase, order in passes:
        for layer in order:
            want = set(cache_window(layer, n, prefetch, phase))
            moved = sum(layer_bytes[j] for j in want - resident)
            resident = want
            out.append(
                dict(
                    phase=phase,
                    layer=layer,
                    resident_layers=tuple(sorted(want)),
                    resident_bytes=sum(layer_bytes[j] for j in want),
                    moved_in=moved,
                )
            )
    return out


def cache_peak_resident_bytes(layer_bytes: list[int], prefetch: int) -> int:
    """max over layers l of the bytes of layers l..l+p: the device tier's peak."""
    n = len(layer_bytes)
    return max(sum(layer_bytes[l : min(l + prefetch + 1, n)]) for l in range(n))  # noqa: E741


def cache_bytes_moved_per_step(layer_bytes: list[int], grad_bytes: int) -> dict[str, int]:
    """{"host_to_device": every layer in the forward and again in the backward, but the last
    (still resident when the backward starts): 2·Σ b_l - b_(L-1), whatever the prefetch;
    "device_to_host": the gradients, `grad_bytes`}."""
    return {"host_to_device": 2 * sum(layer_bytes) - layer_bytes[-1], "device_to_host": grad_bytes}
