"""megatron checker: exercise 2: the vocab-parallel cross entropy."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import torch
import torch.distributed as dist

from ... import comm
from ...course.check import fail, passed, run_on_world
from ...runtime import RankFailedError
from ._shared import raised
from .ce_group import check_group_case
from .ce_messages import CE_MESSAGES, CE_OVERFLOW
from .ce_probe import probe_cross_entropy

CE_TOKENS = 8
# (world, vocab, scale, offset): ordinary logits; a vocabulary that needs padding; large logits
CE_CASES = {
    "ordinary logits": (2, 12, 2.0, 0.0),
    "a padded vocabulary": (4, 30, 2.0, 0.0),
    "large logits": (2, 12, 5.0, 1000.0),
    "targets on ranks 0 and 1 only": (3, 12, 2.0, 0.0),
}
# case -> the ranks whose columns hold every target (default: every rank holds some)
CE_OWNERS = {"targets on ranks 0 and 1 only": (0, 1)}
# float32: near 1000 a logit's ulp is 6e-5, so max + log Σ exp(...) - target carries ~1e-4
# of rounding; every named mistake moves the loss by 0.1 or more.
CE_RTOL, CE_ATOL = 1e-4, 5e-4
CE_HANG_HINT = (
    "Every rank of the group makes the same three all-reduces, in the same order, whatever "
    "its data: a rank that holds none of the targets (rank 2 in the case 'targets on ranks "
    "0 and 1 only') still joins the target logit's all-reduce with zeros. A collective "
    "made only `if inside.any()` leaves the other ranks waiting for it."
)


def _ce_inputs(world: int, vocab: int, scale: float, offset: float, owners=None):
    """Full padded logits [tokens, V'] (padding columns hold garbage, larger than the real
    ones), targets in the ranges of `owners` (default: every rank's), at the first, the last
    and the middle column of a range, V' and columns per rank."""
    g = torch.Generator().manual_seed(7 + world + vocab)
    padded = -(-vocab // world) * world
    logits = offset + scale * torch.randn(CE_TOKENS, padded, device="cpu", generator=g)
    logits[:, vocab:] += 3 * scale  # vocab padding: not part of the vocabulary
    per = padded // world
    owners = owners or range(world)
    where = (0, per - 1, per // 2)  # a range's first, last and middle column
    targets = torch.tensor(
        [
            min(owners[i % len(owners)] * per + where[i // len(owners) % 3], vocab - 1)
            for i in range(CE_TOKENS)
        ],
        device="cpu",
    )
    return logits, targets, padded, per


def _case_inputs(case: str):
    return _ce_inputs(*CE_CASES[case], owners=CE_OWNERS.get(case))


def _ce_rank(fn: Callable, case: str) -> dict:
    rank = dist.get_rank()
    logits, targets, _, per = _case_inputs(case)
    mine = logits[:, rank * per : (rank + 1) * per].clone()
    before = mine.clone()
    with comm.record() as ledger:
        loss = fn(mine, targets.clone(), None, rank * per, CE_CASES[case][1])
    value = loss.detach().clone().float() if isinstance(loss, torch.Tensor) else loss
    return dict(
        value=value if isinstance(value, torch.Tensor) else type(value).__name__,
        records=[(r.op, r.payload_bytes) for r in ledger.records],
        mutated=not torch.equal(mine, before),
    )


CE_GROUP_CASE = "ordinary logits"  # also run on 4 ranks as two tp groups of 2


def _ce_variants(case: str) -> dict:
    """{variant: the loss on each rank} for the right answer and the named mistakes."""
    world, vocab, *_ = CE_CASES[case]
    logits, targets, padded, per = _case_inputs(case)
    real = logits.masked_fill(torch.arange(padded, device="cpu") >= vocab, float("-inf"))
    parts = [real[:, r * per : (r + 1) * per] for r in range(world)]
    peak = real.max(dim=-1).values
    total = (real - peak[:, None]).exp().sum(-1)
    target = real.gather(1, targets[:, None]).squeeze(1)
    right = (total.log() - (target - peak)).mean()

    def unmasked(index_of) -> torch.Tensor:  # every rank adds the logit at its index
        summed = sum(
            (parts[r] - peak[:, None]).gather(1, index_of(targets - r * per)[:, None]).squeeze(1)
            for r in range(world)
        )
        return (total.log() - summed).mean()

    def owns(r: int) -> torch.Tensor:
        return (targets >= r * per) & (targets < (r + 1) * per)

    local_peaks = torch.stack([p.max(dim=-1).values for p in parts])
    local_total = sum((p - m[:, None]).exp().sum(-1) for p, m in zip(parts, local_peaks))
    owner_peak = local_peaks[targets // per, torch.arange(CE_TOKENS, device="cpu")]
    lse_all = logits.logsumexp(-1)  # padding columns included
    one_more = logits.masked_fill(torch.arange(padded, device="cpu") > vocab, float("-inf"))
    one_more_peak = one_more.max(dim=-1).values
    same = {
        "padding_off_by_one": (
            (one_more - one_more_peak[:, None]).exp().sum(-1).log() - (target - one_more_peak)
        ).mean(),
        "unshifted_target": (total.log() - target).mean(),
        "range_lower": (total.log() - (target - peak) * (targets % per != 0)).mean(),
        "sum_not_mean": right * CE_TOKENS,
        "no_max": (real.exp().sum(-1).log() - target).mean(),
        "local_max": (local_total.log() - (target - owner_peak)).mean(),
        "unmasked_zero": unmasked(lambda t: t.masked_fill((t < 0) | (t >= per), 0)),
        "unmasked_clamp": unmasked(lambda t: t.clamp(0, per - 1)),
        "no_padding_mask": (lse_all - target).mean(),
    }
    out = {"right": [right] * world} | {k: [v] * world for k, v in same.items()}
    out["local_sum"] = [
        ((p - peak[:, None]).exp().sum(-1).log() - (target - peak)).mean() for p in parts
    ]
    out["no_target_reduce"] = [
        (total.log() - (target - peak) * owns(r)).mean() for r in range(world)
    ]
    return out


def _diagnose_ce(case: str, results: list[dict], probe=lambda: None) -> str | None:
    """What is wrong with the losses of `case`: a shape, a predicted mistake, else what
    `probe()` (the crafted rows of `ce_probe.py`) finds, else the difference."""
    world, vocab, scale, offset = CE_CASES[case]
    variants = _ce_variants(case)
    padded = -(-vocab // world) * world
    where = f"{case} ({CE_TOKENS} tokens, vocabulary {vocab} on {world} ranks)"
    values = []
    for rank, res in enumerate(results):
        v = res["value"]
        if not isinstance(v, torch.Tensor):
            return f"{where}: rank {rank} returned a {v}; return the loss as a tensor."
        if v.numel() != 1 or v.dim() != 0:
            return (
                f"{where}: rank {rank} returned shape {tuple(v.shape)}; return the mean over "
                "tokens, one number (a 0-dim tensor: no keepdim), as F.cross_entropy does."
            )
        values.append(v.reshape(()))

    def same(name):
        return all(
            bool(torch.isclose(got, want.float(), rtol=CE_RTOL, atol=CE_ATOL))
            for got, want in zip(values, variants[name])
        )

    if same("right"):
        return None
    for name, message in CE_MESSAGES.items():
        if same(name):
            text = message.format(
                tokens=CE_TOKENS,
                pad=padded - vocab,
                padded=padded,
                offset=offset,
                value=float(values[0]),
                vocab=vocab,
            )
            return f"{where}: {text}"
    found = probe()
    if found:
        return f"{where} is wrong; {found}"
    if not all(math.isfinite(float(v)) for v in values) and offset:
        return f"{where}: the loss is {float(values[0])}: " + CE_OVERFLOW.format(offset=offset)
    want = float(variants["right"][0])
    got = ", ".join(f"{float(v):.6g}" for v in values)
    worst = max(range(world), key=lambda r: abs(float(values[r]) - want))
    return (
        f"{where}: the ranks returned {got}; F.cross_entropy on the full logits gives "
        f"{want:.6g} (rank {worst} is off by {float(values[worst]) - want:+.4g}, "
        f"{float(values[worst]) / want:.4g}x). Per token: log Σ_v exp(logit_v - M) - "
        "(logit_target - M), with M the "
        "global maximum (all-reduce MAX), the sum of exp over every rank (all-reduce SUM) and "
        "the target logit from the rank that holds it (masked, all-reduce SUM); padding "
        "columns (>= vocab_size) masked to -inf."
    )


def _diagnose_ce_ledger(case: str, results: list[dict]) -> str | None:
    world = CE_CASES[case][0]
    for rank, res in enumerate(results):
        if res.get("mutated"):
            return (
                f"{case}, rank {rank}: the loss is right, but your code changed the caller's "
                "logits in place (e.g. masked_fill_): the model's output is still needed (its "
                "backward, other losses): mask a copy (masked_fill, not masked_fill_)."
            )
        ops = [op for op, _ in res["records"]]
        sizes = {n for _, n in res["records"]}
        where = f"{case}, rank {rank}"
        if not ops:
            return (
                f"{where}: the values are right, but the ledger saw no collective: use "
                "minidist's comm.all_reduce (torch.distributed directly is invisible to it)."
            )
        if any(op != "all_reduce" for op in ops):
            return (
                f"{where}: the values are right, but the ledger shows {ops}: gathering the "
                "logits forms the [tokens, vocabulary] tensor on every rank, which is what the "
                f"vocab-parallel loss avoids; three all-reduces of {CE_TOKENS} numbers (one "
                "per token) are all it needs, whatever the vocabulary."
            )
        if len(ops) != 3 or sizes != {4 * CE_TOKENS}:
            return (
                f"{where}: the values are right, but the ledger shows {len(ops)} all-reduces of "
                f"{sorted(sizes)} bytes on {world} ranks; the loss needs exactly three of one "
                f"float32 per token ({4 * CE_TOKENS} bytes): MAX of the row maxima, SUM of the "
                "sums of exp, SUM of the masked target logits."
            )
    return None


def _ce_crash(case: str, exc: RankFailedError) -> str:
    """What a rank's exception most likely means in this exercise."""
    world, vocab, *_ = CE_CASES[case]
    last, broke = raised(exc)
    where = f"{case} (vocabulary {vocab} on {world} ranks)"
    if broke:
        return f"{where}: rank {exc.rank} failed inside a collective ({last}). {CE_HANG_HINT}"
    if "out of bounds" in last or "out of range" in last:
        per = -(-vocab // world)
        index = re.search(r"index (-?\d+) is out of bounds", last)
        at = int(index.group(1)) if index else per
        if at < 0:
            why = (
                "a negative index: target - start < 0 for a target below this rank's range. "
                "Test both ends, inside = (local >= 0) & (local < columns)"
            )
        elif at > per:
            why = (
                f"an index beyond the {per} columns a rank holds by more than one: a target "
                "used as a column index without subtracting this rank's start? local = "
                "target - start; a target is this rank's when 0 <= local < columns"
            )
        else:
            why = (
                f"an index at the {per} columns a rank holds, one past its last. Either the "
                "range test includes its end (not <=): a target is this rank's when start <= "
                "target < start + columns; or a target was used as the column index without "
                "subtracting this rank's start (local = target - start)"
            )
        return (
            f"{where}: rank {exc.rank} raised {last}: {why}; gather at target - start only "
            "there, at any valid index (0) elsewhere."
        )
    return f"{where}: rank {exc.rank}'s code raised {last}."


def check_vocab_parallel_cross_entropy(fn: Callable) -> None:
    """`fn(logits, targets, group, start, vocab_size)` on ordinary, padded and large logits."""
    by_world: dict[int, list[str]] = {}
    for case, (world, *_) in CE_CASES.items():
        by_world.setdefault(world, []).append(case)
    results = {}
    for world, cases in by_world.items():
        for case in cases:
            try:
                results[case] = run_on_world(_ce_rank, world, fn, case, hang_hint=CE_HANG_HINT)
            except RankFailedError as exc:
                fail(_ce_crash(case, exc))
    probed: list = []

    def probe() -> str | None:  # once, and only for a wrong answer no prediction names
        if not probed:
            probed.append(probe_cross_entropy(fn, CE_HANG_HINT))
        return probed[0]

    for case in CE_CASES:  # values first, in every case
        problem = _diagnose_ce(case, results[case], probe)
        if problem:
            fail(problem)
    for case in CE_CASES:
        problem = _diagnose_ce_ledger(case, results[case])
        if problem:
            fail(problem)
    case = CE_GROUP_CASE
    check_group_case(
        fn,
        _case_inputs(case),
        CE_CASES[case][1],
        float(_ce_variants(case)["right"][0]),
        lambda exc: _ce_crash(case, exc),
        CE_HANG_HINT,
    )
    passed(
        "the vocab-parallel cross entropy equals F.cross_entropy on the full logits (ordinary, "
        "padded vocabulary, logits around 1000, a rank holding no target) with three "
        "all-reduces of one number per token: the full logits are never formed"
    )
