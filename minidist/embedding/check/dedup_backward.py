"""Embedding checker, exercise 3: the sort/dedup backward (`check_dedup_backward`).

HugeCTR's embedding backward (Wang et al. 2022, "Merlin HugeCTR", section 3; `backward.py`):
`sort_and_dedup(rows)` returns (order, unique_rows, run_offsets): a stable sort of the key
occurrences by row, the distinct rows ascending, and the U + 1 offsets of the runs of equal
rows in the sorted order; `row_gradients(rows, bags, grad_pooled, weights, loss_scale)`
returns (unique_rows, row_grads), row_grads[u] = Σ over the occurrences i of row
unique_rows[u] of weights[i]·grad_pooled[bags[i]] / loss_scale. Compared with
`backward.sort_and_dedup` and with the gradient of a dense table (autograd through
`index_add`). Named mistakes: run lengths instead of offsets, offsets without the first 0 or
the last len(rows), an unstable order (torch.argsort's default: the 40-occurrence case shows
it), the sorted rows returned for the order, unique rows sorted but not deduplicated, or
descending, duplicates not summed (the last occurrence wins) or averaged, one gradient per
occurrence, the top gradient indexed by occurrence instead of bag, the weights (mean's
1/count) left out or applied twice, the loss scale not divided out (or multiplied in). The
learner's exceptions are reported with their line and likely cause.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...course.check import fail, passed
from ...pipeline.check_call import learner_call
from ._shared import as_list

EXAMPLE = [4, 5, 1, 2, 3, 5, 1, 3, 2, 1]  # the worked example of notebook 11
# 40 occurrences of 5 rows: enough for torch.argsort's default (unstable) sort to reorder ties
MANY = torch.randint(0, 5, (40,), device="cpu", generator=torch.Generator().manual_seed(0)).tolist()
DEDUP_CASES = (EXAMPLE, [7], [3, 3, 3], [9, 0, 9, 2, 0, 9, 11, 2], MANY)
HINTS = {
    "IndexError": "grad_pooled has one row per bag: occurrence i reads grad_pooled[bags[i]], "
    "not grad_pooled[i]; unique_rows and run_offsets index runs 0..U-1",
    "TypeError": "sort_and_dedup(rows) and row_gradients(rows, bags, grad_pooled, weights, "
    "loss_scale) get int64 tensors (rows, bags), float tensors and a float",
}


def _want_dedup(rows: torch.Tensor):
    order = torch.argsort(rows, stable=True)
    unique, counts = torch.unique_consecutive(rows[order], return_counts=True)
    offsets = torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)])
    return order, unique, offsets, counts


def _diagnose_dedup(sort_and_dedup: Callable) -> str | None:
    for case in DEDUP_CASES:
        rows = torch.tensor(case, device="cpu")
        got = learner_call(
            sort_and_dedup, rows.clone(), call=f"sort_and_dedup({case})", hints=HINTS
        )
        if not isinstance(got, tuple) or len(got) != 3:
            return "sort_and_dedup must return a tuple (order, unique_rows, run_offsets)."
        order, unique, offsets = (as_list(t) for t in got)
        w_order, w_unique, w_offsets, counts = (t.tolist() for t in _want_dedup(rows))
        where = f"rows {case}"
        if unique != w_unique:
            if unique == sorted(case) and len(case) > len(w_unique):
                return (
                    f"{where}: unique_rows {unique} is sorted but not deduplicated: each "
                    f"distinct row once, {w_unique} (torch.unique_consecutive of the sorted "
                    "rows, or torch.unique)."
                )
            if unique == w_unique[::-1]:
                return f"{where}: unique_rows {unique} is descending; ascending: {w_unique}."
            if sorted(unique) == w_unique:
                return f"{where}: unique_rows {unique} must be ascending: {w_unique}."
            return (
                f"{where}: unique_rows {unique}, expected {w_unique}: each distinct row once, "
                "ascending (the first row of every run of the sorted rows)."
            )
        if offsets != w_offsets:
            if offsets == counts:
                return (
                    f"{where}: run_offsets {offsets} are the run lengths; the offsets are their "
                    f"running sum starting at 0: {w_offsets} (run u is sorted[offsets[u]:"
                    "offsets[u+1]])."
                )
            if offsets in (w_offsets[1:], w_offsets[:-1]):
                return (
                    f"{where}: run_offsets {offsets} has {len(offsets)} entries; it needs "
                    f"U + 1 = {len(w_offsets)}: a first 0 and a last len(rows): {w_offsets}."
                )
            return f"{where}: run_offsets {offsets}, expected {w_offsets}."
        if order == sorted(case) and order != w_order:
            return (
                f"{where}: order {order} holds the sorted rows (torch.sort(rows).values); "
                f"order is the indices that sort them, torch.argsort(rows, stable=True): "
                f"{w_order}."
            )
        if sorted(order) != list(range(len(case))):
            return f"{where}: order {order} is not a permutation of 0..{len(case) - 1}."
        if [case[i] for i in order] != sorted(case):
            return f"{where}: rows[order] = {[case[i] for i in order]} is not sorted."
        if order != w_order:
            return (
                f"{where}: order {order} sorts the rows but is not stable ({w_order}): equal "
                "rows must keep their occurrence order (torch.argsort(rows, stable=True)), "
                "as HugeCTR's radix sort does, so the sums are the same on every run."
            )
    return None


def _grad_case(seed: int, n: int, bags: int, dim: int, table: int):
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(0, table, (n,), device="cpu", generator=g)
    bag = torch.sort(torch.randint(0, bags, (n,), device="cpu", generator=g)).values
    counts = torch.bincount(bag, minlength=bags).clamp(min=1)
    weights = 1.0 / counts[bag].float()  # the mean combiner's weights
    grad = torch.randn(bags, dim, device="cpu", generator=g)
    return rows, bag, grad, weights


def _want_grads(rows, bag, grad, weights, loss_scale, table):
    dense = torch.zeros(table, grad.shape[1], requires_grad=True, device="cpu")
    pooled = torch.zeros(grad.shape[0], grad.shape[1], device="cpu").index_add(
        0, bag, dense[rows] * weights[:, None]
    )
    (pooled * grad).sum().backward()
    unique = rows.unique()
    return unique, dense.grad[unique] / loss_scale


def _variants(rows, bag, grad, weights, loss_scale):
    """What common mistakes compute, by name."""
    unique = rows.unique()
    index = {int(r): u for u, r in enumerate(unique)}
    last = torch.zeros(unique.numel(), grad.shape[1], device="cpu")
    plain, twice, mean = torch.zeros_like(last), torch.zeros_like(last), torch.zeros_like(last)
    counts = torch.zeros(unique.numel(), device="cpu")
    for i, r in enumerate(rows.tolist()):
        last[index[r]] = weights[i] * grad[bag[i]] / loss_scale
        plain[index[r]] += grad[bag[i]] / loss_scale
        twice[index[r]] += weights[i] ** 2 * grad[bag[i]] / loss_scale
        mean[index[r]] += weights[i] * grad[bag[i]] / loss_scale
        counts[index[r]] += 1
    per_occurrence = weights[:, None] * grad[bag] / loss_scale
    return {
        "last": last,
        "plain": plain,
        "twice": twice,
        "mean": mean / counts[:, None],
        "occurrence": per_occurrence,
    }


def _close(a, b) -> bool:
    return a.shape == b.shape and bool(torch.allclose(a, b, atol=1e-5, rtol=1e-5))


def _diagnose_grads(row_gradients: Callable) -> str | None:
    table = 12
    for seed, (n, bags, dim, scale) in enumerate([(10, 4, 3, 1.0), (30, 7, 2, 8.0)]):
        rows, bag, grad, weights = _grad_case(seed, n, bags, dim, table)
        if seed == 0:
            rows = torch.tensor(EXAMPLE, device="cpu")
        call = f"row_gradients on {n} occurrences of {bags} bags"
        got = learner_call(
            row_gradients,
            rows.clone(),
            bag.clone(),
            grad.clone(),
            weights.clone(),
            scale,
            call=call,
            hints=HINTS,
        )
        unique, want = _want_grads(rows, bag, grad, weights, scale, table)
        if not isinstance(got, tuple) or len(got) != 2:
            return "row_gradients must return a tuple (unique_rows, row_grads)."
        got_rows, got_grads = got[0], torch.as_tensor(got[1]).float()
        if as_list(got_rows) != unique.tolist():
            return (
                f"rows {rows.tolist()}: unique_rows {as_list(got_rows)}, expected "
                f"{unique.tolist()}: one gradient per distinct row, rows ascending."
            )
        if _close(got_grads, want):
            continue
        wrong = _variants(rows, bag, grad, weights, scale)
        case = f"rows {rows.tolist()}, bags {bag.tolist()}, loss_scale {scale}"
        if _close(got_grads, want * scale) and scale != 1.0:
            return (
                f"{case}: your gradients are loss_scale = {scale} times too large: divide the "
                "sums by loss_scale (the loss was scaled up for mixed precision)."
            )
        if _close(got_grads, want * scale * scale) and scale != 1.0:
            return f"{case}: you multiplied by loss_scale = {scale}; divide by it."
        if _close(got_grads, wrong["last"]):
            return (
                f"{case}: a row that occurs several times got only its last occurrence's "
                "gradient: sum over the run (index_add_, or a sum per run of the sorted "
                "occurrences), do not assign."
            )
        if _close(got_grads, wrong["plain"]):
            return (
                f"{case}: the weights are missing: occurrence i contributes "
                "weights[i]·grad_pooled[bags[i]] (the mean combiner's 1/count)."
            )
        if _close(got_grads, wrong["twice"]):
            return (
                f"{case}: the weights are applied twice (weights[i]²): occurrence i "
                "contributes weights[i]·grad_pooled[bags[i]] once."
            )
        if _close(got_grads, wrong["mean"]):
            return (
                f"{case}: you averaged the occurrences of a row; its gradient is their sum "
                "(each occurrence added the row once to the forward)."
            )
        if _close(got_grads, wrong["occurrence"]):
            return (
                f"{case}: you returned one gradient per occurrence ({n} rows); the table "
                f"gets one per distinct row, {unique.numel()}: sum each run of equal rows."
            )
        if got_grads.shape == want.shape:
            c = float((got_grads * want).sum() / (want * want).sum().clamp_min(1e-30))
            if _close(got_grads, c * want):
                return (
                    f"{case}: your row gradients are {c:.4g} times the dense table's, on every "
                    "row: a stray factor (a count, a mean over occurrences, the loss scale "
                    "twice?). row_grads[u] = Σ weights[i]·grad_pooled[bags[i]] / loss_scale."
                )
        diff = _maxdiff(got_grads, want)
        return f"{case}: row_grads differ from the dense table's gradient by {diff}."
    return None


def _maxdiff(a, b) -> str:
    if a.shape != b.shape:
        return f"shape {tuple(a.shape)} vs {tuple(b.shape)}"
    return f"{float((a - b).abs().max()):.2e}"


def check_dedup_backward(sort_and_dedup: Callable, row_gradients: Callable) -> None:
    """`sort_and_dedup(rows)` and `row_gradients(rows, bags, grad_pooled, weights,
    loss_scale)` against the library and a dense table's autograd gradient."""
    problem = _diagnose_dedup(sort_and_dedup) or _diagnose_grads(row_gradients)
    if problem:
        fail(problem)
    order, unique, offsets = sort_and_dedup(torch.tensor(EXAMPLE, device="cpu"))
    passed(
        f"rows {EXAMPLE} -> sorted {[EXAMPLE[i] for i in as_list(order)]}, run_offsets "
        f"{as_list(offsets)}, {len(as_list(unique))} unique rows; row gradients equal the "
        "dense table's (sums over repeated rows, mean weights, loss scale divided out)"
    )
