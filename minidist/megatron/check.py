"""Checkers for the exercises of lessons 07 (tensor parallelism) and 08 (the parallel layout).

Lesson 07 (Shoeybi et al. 2019, "Megatron-LM", section 3):

1. `check_reduce_from_tp(ReduceFromTP)`: g as a `torch.autograd.Function`:
   `forward(ctx, x, group)` all-reduces (sums) the partial outputs over the tp group,
   `backward(ctx, grad)` is the identity. Run on a world of 2 (the group is the world) and
   of 4 (two tp groups of 2); rank r's input at element i is (i + 1) + 100·2^q (q its tp
   rank), so a sum, a world-wide sum, a mean and a rank's own values all differ. Named
   mistakes: all-reduce in backward instead of forward (that is f), identity both ways,
   all-reduced the input in place (no clone), all-reduce in both directions, summed over
   the world instead of the group, averaged, the wrong number of gradients.
2. `check_vocab_parallel_cross_entropy(fn)`: `fn(logits, targets, group, start,
   vocab_size)` gets this rank's columns [start, start + V'/t) of the logits (vocabulary
   padded to V'; columns >= vocab_size are padding) and returns the mean cross entropy, the
   value of `F.cross_entropy` on the full logits, with three all-reduces of one number per
   token. Three cases: ordinary logits on 2 ranks, padded vocabulary on 4, large logits
   (around 1000) on 2. Named mistakes: no MAX all-reduce (overflow, or each rank's own
   max), target logit not masked outside the rank's range, forgot the SUM of exp, forgot to
   all-reduce the target logit, padding not masked, a sum instead of a mean, the full
   logits gathered.

Lesson 08 (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM", section 3):

3. `check_parallel_groups(my_parallel_groups)`: `my_parallel_groups(world_size, tp, pp)`
   returns {"tp", "pp", "dp"}: lists of ranks, compared with `parallel_groups` as a pure
   function (no world). Named mistakes: DP groups taken as contiguous blocks, PP groups
   contiguous, tp and pp swapped, ranks missing or repeated, groups of the wrong size.
4. `check_average_dp_gradients(average_dp_gradients)`: on a world of 4 (t = 2 inside, d = 2
   across), after a backward of `TensorParallelGPT` on this rank's data-parallel slice,
   `average_dp_gradients(model, dp_group)` must leave in every gradient the mean over the dp
   group, the dense GPT's gradient of the whole batch. Named mistakes: reduced over the
   world or over the tp group, forgot to divide, divided by the world size, skipped
   parameters, bytes sent beyond one all-reduce of the gradients.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.distributed as dist

from .. import comm
from ..course.check import close, diagnose_values, fail, passed, run_on_world
from ..data import shard_batch
from ..runtime import RankFailedError
from .fixture import build_dense
from .layout import ParallelLayout, parallel_groups
from .model import TensorParallelGPT


def _and(items) -> str:
    names = [str(i) for i in items]
    return ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else names[0]


# -- exercise 1: g as an autograd Function ----------------------------------------------------

G_WORLDS = (2, 4)  # tp = 2: on 2 ranks the group is the world, on 4 two groups of 2
G_TP = 2
G_NUMEL = 6
G_HANG_HINT = (
    "g makes one all-reduce in forward, on every rank of the tp group, and none in backward."
)


def _g_input(tp_rank: int) -> torch.Tensor:
    """(i + 1) + 100·2^q at element i on tp rank q: every sum and every rank recognisable."""
    return torch.arange(1, G_NUMEL + 1, dtype=torch.float32) + 100 * 2**tp_rank


def _g_upstream() -> torch.Tensor:
    """The gradient arriving at g's output: the same on every rank (after g all is replicated)."""
    return torch.tensor([1.0, -2.0, 3.0, 0.5, -1.5, 2.0])[:G_NUMEL]


def _g_rank(cls: type) -> dict:
    layout = ParallelLayout(tp=G_TP)
    group = layout.group("tp")
    leaf = _g_input(layout.tp_rank).requires_grad_()
    x = leaf * 1.0  # a partial output, as F.linear's would be: not a leaf
    before = x.detach().clone()
    with comm.record() as forward:
        y = cls.apply(x, group)
    out = dict(
        y=y.detach().clone() if isinstance(y, torch.Tensor) else type(y).__name__,
        x_after=x.detach().clone(),
        before=before,
        forward=[(r.op, r.group_ranks, r.payload_bytes) for r in forward.records],
        tp_ranks=layout.mine["tp"],
    )
    if not isinstance(y, torch.Tensor) or not y.requires_grad:
        out["grad"] = None
        out["backward"] = []
        return out
    with comm.record() as backward:
        y.backward(_g_upstream())
    out["grad"] = None if leaf.grad is None else leaf.grad.clone()
    out["backward"] = [(r.op, r.group_ranks, r.payload_bytes) for r in backward.records]
    return out


def _diagnose_g(res: dict, rank: int, world: int) -> str | None:
    tp_ranks = res["tp_ranks"]
    t = len(tp_ranks)
    q = tp_ranks.index(rank)
    own = _g_input(q)
    group_sum = sum(_g_input(j) for j in range(t))
    world_sum = sum(_g_input(j % t) for j in range(world))
    up = _g_upstream()
    y, grad = res["y"], res["grad"]
    where = f"on a world of {world} (tp group {tp_ranks}), rank {rank}"
    if not isinstance(y, torch.Tensor):
        return f"{where}: forward returned a {y}; return the all-reduced tensor."
    if y.shape != own.shape:
        return f"{where}: forward returned shape {tuple(y.shape)}; g keeps x's shape."
    mutated = not torch.equal(res["x_after"], res["before"])
    if close(y, own):
        if grad is not None and close(grad, t * up):
            return (
                f"{where}: forward returned this rank's own partial output, and backward "
                f"all-reduced the gradient ({t}x the upstream gradient): that is f, g's "
                "conjugate. g all-reduces in FORWARD (the partial outputs X_r·W_r of a "
                "row-parallel layer are summed) and is the identity in backward."
            )
        if grad is not None and close(grad, up):
            return (
                f"{where}: forward returned this rank's own partial output and backward passed "
                "the gradient through: identity both ways, nothing was all-reduced. g sums "
                "the partial outputs: comm.all_reduce(out, group=group) in forward."
            )
        return (
            f"{where}: forward returned this rank's own partial output; g returns the sum of "
            "every tp rank's partial output (comm.all_reduce in forward)."
        )
    if t < world and close(y, world_sum):
        return (
            f"{where}: forward returned the sum over all {world} ranks of the world; g sums "
            f"over the {t} ranks of its tp group {tp_ranks}: pass group=group to "
            "comm.all_reduce (the other tp groups hold other layers' or other batches' parts)."
        )
    if close(y, group_sum / t):
        return (
            f"{where}: forward returned the mean over the tp group; g returns the SUM: each "
            f"rank's partial output X_r·W_r is one of {t} terms of X·W, none is divided."
        )
    if not close(y, group_sum):
        return (
            f"{where}: forward returned {y.tolist()}; g's forward output is the sum of the tp "
            f"group's partial outputs, here {group_sum.tolist()}."
        )
    if mutated:
        return (
            f"{where}: the output is right, but your forward all-reduced its input x in place: "
            "the caller's x now holds the sum too. An autograd Function must not change its "
            "inputs (x may be kept by the caller or saved by the op that made it for its own "
            "backward): all-reduce a copy, out = x.clone()."
        )
    if grad is None:
        return (
            f"{where}: the forward is right, but no gradient reached x: backward must return "
            "the gradient for x (and None for group)."
        )
    if close(grad, t * up):
        return (
            f"{where}: the forward is right, but backward all-reduced the gradient too ({t}x "
            "the upstream gradient). After g every rank holds the same full output, so the "
            "gradient arriving at it is already the same on every rank: g's backward is the "
            "identity (its all-reduce of gradients is f's job, at the region's start)."
        )
    if not close(grad, up):
        return (
            f"{where}: the forward is right, but backward returned {grad.tolist()} for an "
            f"upstream gradient {up.tolist()}; g's backward is the identity: return grad, None."
        )
    return None


def _diagnose_g_ledger(res: dict, rank: int, world: int) -> str | None:
    tp_ranks = tuple(res["tp_ranks"])
    size = 4 * G_NUMEL
    want = [("all_reduce", tp_ranks, size)]
    got = [(op, tuple(ranks), n) for op, ranks, n in res["forward"]]
    where = f"on a world of {world}, rank {rank}"
    if not got:
        return (
            f"{where}: the values are right, but the ledger saw no collective: call "
            "minidist's comm.all_reduce (torch.distributed called directly is invisible to it)."
        )
    if got != want:
        return (
            f"{where}: the values are right, but forward made {[op for op, _, _ in got]}; g is "
            f"one comm.all_reduce of x ({size} bytes) over its tp group {list(tp_ranks)}."
        )
    if res["backward"]:
        return f"{where}: backward made {[op for op, _, _ in res['backward']]}; g's makes none."
    return None


def check_reduce_from_tp(reduce_from_tp_cls: type) -> None:
    """g, `ReduceFromTP.apply(x, group)`, on worlds of 2 and 4 (tp groups of 2)."""
    for world in G_WORLDS:
        try:
            results = run_on_world(_g_rank, world, reduce_from_tp_cls, hang_hint=G_HANG_HINT)
        except RankFailedError as exc:
            if "incorrect number of gradients" in str(exc):
                fail(
                    "backward returned the wrong number of gradients: it returns one per input "
                    "of forward, (grad_x, None): None for `group`, which has no gradient."
                )
            raise
        for rank, res in enumerate(results):
            problem = _diagnose_g(res, rank, world) or _diagnose_g_ledger(res, rank, world)
            if problem:
                fail(problem)
    passed(
        f"g sums the tp group's partial outputs in forward (one all-reduce, input untouched) "
        f"and passes the gradient through in backward, on worlds of {_and(G_WORLDS)}"
    )


# -- exercise 2: the vocab-parallel cross entropy ---------------------------------------------

CE_TOKENS = 8
# (world, vocab, scale, offset): ordinary logits; a vocabulary that needs padding; large logits
CE_CASES = {
    "ordinary logits": (2, 12, 2.0, 0.0),
    "a padded vocabulary": (4, 30, 2.0, 0.0),
    "large logits": (2, 12, 5.0, 1000.0),
}
# float32: near 1000 a logit's ulp is 6e-5, so max + log Σ exp(...) - target carries ~1e-4
# of rounding; every named mistake moves the loss by 0.1 or more.
CE_RTOL, CE_ATOL = 1e-4, 5e-4
CE_HANG_HINT = "Every rank of the group makes the same three all-reduces, in the same order."


def _ce_inputs(world: int, vocab: int, scale: float, offset: float):
    """Full padded logits [tokens, V'] (padding columns hold garbage, larger than the real
    ones), targets covering every rank's range, V' and columns per rank."""
    g = torch.Generator().manual_seed(7 + world + vocab)
    padded = -(-vocab // world) * world
    logits = offset + scale * torch.randn(CE_TOKENS, padded, generator=g)
    logits[:, vocab:] += 3 * scale  # vocab padding: not part of the vocabulary
    per = padded // world
    targets = torch.tensor([(i * per + i % per) % vocab for i in range(CE_TOKENS)])
    return logits, targets, padded, per


def _ce_rank(fn: Callable, case: str) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    logits, targets, _, per = _ce_inputs(world, *CE_CASES[case][1:])
    mine = logits[:, rank * per : (rank + 1) * per].clone()
    with comm.record() as ledger:
        loss = fn(mine, targets.clone(), None, rank * per, CE_CASES[case][1])
    value = loss.detach().clone().float() if isinstance(loss, torch.Tensor) else loss
    return dict(
        value=value if isinstance(value, torch.Tensor) else type(value).__name__,
        records=[(r.op, r.payload_bytes) for r in ledger.records],
    )


def _ce_variants(world: int, vocab: int, scale: float, offset: float) -> dict:
    """{variant: the loss on each rank} for the right answer and the named mistakes."""
    logits, targets, padded, per = _ce_inputs(world, vocab, scale, offset)
    real = logits.masked_fill(torch.arange(padded) >= vocab, float("-inf"))
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
    owner_peak = local_peaks[targets // per, torch.arange(CE_TOKENS)]
    lse_all = logits.logsumexp(-1)  # padding columns included
    same = {
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


CE_OVERFLOW = (
    "exp of logits around {offset:g} overflows float32 (exp(89) is already inf). Subtract "
    "each row's maximum over the WHOLE vocabulary before exp: the local row maxima, "
    "all-reduced with op=comm.ReduceOp.MAX; log-sum-exp = max + log Σ exp(logit - max)."
)
CE_MESSAGES = {
    "no_max": "the loss is {value}: " + CE_OVERFLOW,
    "sum_not_mean": (
        "the loss is {tokens}x the cross entropy: you summed over the {tokens} tokens; return the "
        "mean over tokens, as F.cross_entropy does."
    ),
    "local_max": (
        "each rank subtracted its OWN row maximum before exp: then rank r's exps are scaled by "
        "e^(-max_r), a different factor on every rank, and their sum over ranks means nothing. "
        "All-reduce the row maxima with op=comm.ReduceOp.MAX first and subtract that global "
        "maximum everywhere."
    ),
    "unmasked_zero": (
        "the target logit is summed over ranks, but the ranks that do not hold a token's target "
        "added a logit too (the one at the index you replaced the target by): after gathering, "
        "zero the target logit where the target is outside [start, start + columns) "
        "(masked_fill(~inside, 0)), so only the owner contributes to the SUM all-reduce."
    ),
    "unmasked_clamp": (
        "the target logit is summed over ranks, but the ranks that do not hold a token's target "
        "added a logit too (clamping the index picks a real column): zero the target logit where "
        "the target is outside [start, start + columns), so only the owner contributes."
    ),
    "local_sum": (
        "the ranks return different losses: each used the sum of exp over its own columns only. "
        "The softmax's denominator runs over the whole vocabulary: all-reduce (SUM) each row's "
        "sum of exp over the group."
    ),
    "no_target_reduce": (
        "the ranks return different losses: each used the target logit only where it holds the "
        "target (0 elsewhere). Every rank needs every token's target logit: all-reduce (SUM) "
        "the masked target logits."
    ),
    "no_padding_mask": (
        "the vocabulary padding took part: columns >= vocab_size (here the last {pad} of "
        "{padded}, on the last rank) are not words, but their exp entered the sum and their "
        "value the maximum. Mask them to -inf before the maximum "
        "(logits.masked_fill(column >= vocab_size, float('-inf')), column = start + "
        "arange(columns))."
    ),
}


def _diagnose_ce(case: str, results: list[dict]) -> str | None:
    world, vocab, scale, offset = CE_CASES[case]
    variants = _ce_variants(world, vocab, scale, offset)
    padded = -(-vocab // world) * world
    where = f"{case} ({CE_TOKENS} tokens, vocabulary {vocab} on {world} ranks)"
    values = []
    for rank, res in enumerate(results):
        v = res["value"]
        if not isinstance(v, torch.Tensor):
            return f"{where}: rank {rank} returned a {v}; return the loss as a tensor."
        if v.numel() != 1:
            return (
                f"{where}: rank {rank} returned shape {tuple(v.shape)}; return the mean over "
                "tokens, one number (a 0-dim tensor), as F.cross_entropy does."
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
            text = message.format(tokens=CE_TOKENS, pad=padded - vocab, padded=padded,
                                  offset=offset, value=float(values[0]))  # fmt: skip
            return f"{where}: {text}"
    if not all(math.isfinite(float(v)) for v in values) and offset:
        return f"{where}: the loss is {float(values[0])}: " + CE_OVERFLOW.format(offset=offset)
    want = float(variants["right"][0])
    got = ", ".join(f"{float(v):.6g}" for v in values)
    return (
        f"{where}: the ranks returned {got}; F.cross_entropy on the full logits gives "
        f"{want:.6g}. Per token: log Σ_v exp(logit_v - M) - (logit_target - M), with M the "
        "global maximum (all-reduce MAX), the sum of exp over every rank (all-reduce SUM) and "
        "the target logit from the rank that holds it (masked, all-reduce SUM); padding "
        "columns (>= vocab_size) masked to -inf."
    )


def _diagnose_ce_ledger(case: str, results: list[dict]) -> str | None:
    world = CE_CASES[case][0]
    for rank, res in enumerate(results):
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


def check_vocab_parallel_cross_entropy(fn: Callable) -> None:
    """`fn(logits, targets, group, start, vocab_size)` on ordinary, padded and large logits."""
    by_world: dict[int, list[str]] = {}
    for case, (world, *_) in CE_CASES.items():
        by_world.setdefault(world, []).append(case)
    results = {}
    for world, cases in by_world.items():
        for case in cases:
            results[case] = run_on_world(_ce_rank, world, fn, case, hang_hint=CE_HANG_HINT)
    for diagnose in (_diagnose_ce, _diagnose_ce_ledger):  # values first, in every case
        for case in CE_CASES:
            problem = diagnose(case, results[case])
            if problem:
                fail(problem)
    passed(
        "the vocab-parallel cross entropy equals F.cross_entropy on the full logits (ordinary, "
        "padded vocabulary, logits around 1000) with three all-reduces of one number per "
        "token: the full logits are never formed"
    )


# -- exercise 3: the group layout (pure) ------------------------------------------------------

GROUP_CASES = [(16, 2, 4), (8, 2, 2), (24, 2, 3), (12, 3, 2)]
GROUP_KINDS = ("tp", "pp", "dp")
GROUP_RULES = {
    "tp": "TP groups are blocks of t consecutive ranks (one node: TP all-reduces every layer)",
    "pp": "pipeline groups take every (n/p)-th rank: rank i, i + n/p, i + 2n/p, ...",
    "dp": (
        "DP groups sit inside one stage's block of n/p consecutive ranks and take every t-th "
        "rank of it: the ranks that hold the same tensor-parallel slice of the same stage"
    ),
}


def _normal(groups) -> list[list[int]] | None:
    try:
        return sorted(sorted(int(r) for r in g) for g in groups)
    except TypeError:
        return None


def _contiguous(world: int, size: int) -> list[list[int]]:
    return [list(range(i, i + size)) for i in range(0, world, size)]


def _diagnose_groups(got, world: int, tp: int, pp: int) -> str | None:
    where = f"my_parallel_groups({world}, tp={tp}, pp={pp})"
    dp = world // (tp * pp)
    if not isinstance(got, dict) or not all(k in got for k in GROUP_KINDS):
        keys = sorted(got) if isinstance(got, dict) else type(got).__name__
        return f"{where} returned {keys}; return a dict with the keys 'tp', 'pp' and 'dp'."
    want = parallel_groups(world, tp, pp)
    norm = {k: _normal(got[k]) for k in GROUP_KINDS}
    for kind in GROUP_KINDS:
        if norm[kind] is None:
            return f"{where}['{kind}'] is not a list of lists of ranks."
        if norm[kind] == _normal(want[kind]):
            continue
        swapped = parallel_groups(world, pp, tp) if world % (tp * pp) == 0 else None
        if swapped and all(norm[k] == _normal(swapped[k]) for k in GROUP_KINDS) and tp != pp:
            return (
                f"{where}: these are the groups of tp={pp}, pp={tp}: tp and pp are swapped "
                f"(your TP groups have {pp} ranks, they need t = {tp})."
            )
        flat = sorted(r for g in norm[kind] for r in g)
        if flat != list(range(world)):
            repeated = sorted({r for r in flat if flat.count(r) > 1})
            missing = sorted(set(range(world)) - set(flat))
            return (
                f"{where}['{kind}']: every rank must be in exactly one {kind} group; "
                + (f"ranks {repeated} appear more than once" if repeated else "")
                + ("; " if repeated and missing else "")
                + (f"ranks {missing} are in none" if missing else "")
                + "."
            )
        size = {"tp": tp, "pp": pp, "dp": dp}[kind]
        sizes = sorted({len(g) for g in norm[kind]})
        if sizes != [size]:
            return (
                f"{where}['{kind}'] has groups of {sizes} ranks; with t={tp}, p={pp}, "
                f"d = n/(t·p) = {dp}, each {kind} group has {size}: {GROUP_RULES[kind]}."
            )
        if kind == "dp" and norm[kind] == _contiguous(world, dp):
            same_as_tp = " (here the TP groups themselves)" if dp == tp else ""
            return (
                f"{where}: your DP groups are blocks of {dp} consecutive ranks{same_as_tp}, "
                f"e.g. {norm[kind][0]}. Consecutive ranks are one TP group: they hold "
                "DIFFERENT slices of the layers, so averaging their gradients mixes slices. "
                f"{GROUP_RULES['dp']}: rank 0's DP group is {_normal(want['dp'])[0]}."
            )
        if kind == "pp" and norm[kind] == _contiguous(world, pp):
            return (
                f"{where}: your pipeline groups are blocks of {pp} consecutive ranks, e.g. "
                f"{norm[kind][0]}: consecutive ranks are one TP group, one node, one stage. A "
                f"pipeline passes activations from stage to stage, and stage s is the block "
                f"of ranks [s·n/p, (s+1)·n/p): {GROUP_RULES['pp']}, rank 0's is "
                f"{_normal(want['pp'])[0]}."
            )
        mine = next(g for g in norm[kind] if 0 in g)
        return (
            f"{where}['{kind}']: rank 0's group is {mine}, Megatron-LM's is "
            f"{next(g for g in _normal(want[kind]) if 0 in g)}: {GROUP_RULES[kind]}."
        )
    return None


def check_parallel_groups(my_parallel_groups: Callable) -> None:
    """`my_parallel_groups(world_size, tp, pp)` against `parallel_groups`, as a pure function."""
    for world, tp, pp in GROUP_CASES:
        got = my_parallel_groups(world, tp, pp)
        problem = _diagnose_groups(got, world, tp, pp)
        if problem:
            fail(problem)
    cases = _and(f"({w}, t={t}, p={p})" for w, t, p in GROUP_CASES)
    passed(f"my_parallel_groups gives Megatron-LM's tp, pp and dp groups for {cases}")


# -- exercise 4: data parallelism across tensor-parallel groups ------------------------------

DP_WORLD, DP_TP = 4, 2
DP_HANG_HINT = (
    "Every rank of a dp group must all-reduce the same gradients in the same order (loop over "
    "model.parameters(), the same on every rank)."
)


def _dp_rank(fn: Callable) -> dict:
    layout = ParallelLayout(tp=DP_TP)
    model, batches, _ = build_dense()
    tp = TensorParallelGPT(model, layout.group("tp"))
    x, y = shard_batch(batches[0], layout.dp_rank, layout.dp_size)
    tp.loss(tp(x), y).backward()
    named = [(n, p) for n, p in tp.named_parameters() if p.grad is not None]
    local = {n: p.grad.detach().clone() for n, p in named}

    def mean_over(group) -> dict:
        out = {}
        for n, g in local.items():
            t = g.clone()
            comm.all_reduce(t, group=group)  # no ledger is open yet: the checker's own
            out[n] = t / dist.get_world_size(group)
        return out

    right = mean_over(layout.group("dp"))
    over_world, over_tp = mean_over(None), mean_over(layout.group("tp"))
    with comm.record() as ledger:
        fn(tp, layout.group("dp"))
    got = {n: p.grad.detach().clone() for n, p in named if p.grad is not None}
    return dict(
        got=got, right=right, local=local, over_world=over_world, over_tp=over_tp,
        records=[(r.op, r.group_ranks, r.ring_bytes) for r in ledger.records],
        dp_ranks=layout.mine["dp"], tp_ranks=layout.mine["tp"], tp_rank=layout.tp_rank,
        splits={n: getattr(p, "tp_split", None) for n, p in named},
        trainable=sum(p.numel() for _, p in named),
    )  # fmt: skip


def _dense_grads() -> dict[str, torch.Tensor]:
    """The dense GPT's gradients on the whole first batch (one process)."""
    model, batches, loss_fn = build_dense()
    x, y = batches[0]
    loss_fn(model(x), y).backward()
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def _part(full: torch.Tensor, split, tp_rank: int, tp: int) -> torch.Tensor:
    """Rank `tp_rank`'s part of a dense tensor, as the tensor-parallel layers cut it
    (`split` = (dim, blocks, size): `blocks` sections each cut in `tp`, padded to a multiple
    of `tp` along `dim`); the whole tensor where `split` is None (replicated)."""
    if split is None:
        return full
    dim, blocks, _ = split
    padded = -(-full.shape[dim] // (tp * blocks)) * tp * blocks
    if padded > full.shape[dim]:
        shape = list(full.shape)
        shape[dim] = padded - full.shape[dim]
        full = torch.cat([full, full.new_zeros(shape)], dim)
    return torch.cat([s.chunk(tp, dim)[tp_rank] for s in full.chunk(blocks, dim)], dim)


def _scaled(got: dict, ref: dict, factor: float) -> bool:
    return all(n in got and close(got[n], factor * ref[n]) for n in ref)


def _diagnose_dp(res: dict, rank: int) -> str | None:
    got, right, dp_ranks, tp_ranks = res["got"], res["right"], res["dp_ranks"], res["tp_ranks"]
    d, world = len(dp_ranks), DP_WORLD
    where = f"rank {rank} (tp group {tp_ranks}, dp group {dp_ranks})"
    for name, variant in (("over_world", res["over_world"]), ("over_tp", res["over_tp"])):
        n = world if name == "over_world" else len(tp_ranks)
        if right and any(_scaled(got, variant, f) for f in (1.0, n, n / d, n / world)):
            if name == "over_world":
                return (
                    f"{where}: you reduced over the whole world (group=None): ranks {tp_ranks} "
                    "hold DIFFERENT slices of every split weight, so the sum adds rank 0's "
                    "slice to rank 1's. Reduce over the ranks that hold the same slice: "
                    "comm.all_reduce(p.grad, group=dp_group)."
                )
            return (
                f"{where}: you reduced over the tp group {tp_ranks}: those ranks saw the SAME "
                "data slice and hold different parts of the model; the ranks that hold the "
                f"same part and saw other data are the dp group {dp_ranks}: group=dp_group."
            )
    if _scaled(got, right, d / world) and d / world != 1 / d:
        return (
            f"{where}: the gradients are {world // d}x too small: you divided by the world "
            f"size {world}; divide by the dp group's size, dist.get_world_size(dp_group) = {d}."
        )
    if _scaled(got, right, 1 / d):
        return (
            f"{where}: the gradients are {d}x too small: you divided by {d} twice, or by the "
            f"world size {world} instead of the dp group's size {d} "
            "(dist.get_world_size(dp_group))."
        )
    problem = diagnose_values(got, right, res["local"], d)
    if problem and f"divide by the world size N={d}" in problem:
        return (
            f"{where}: the gradients are {d}x too large: you summed over the dp group but did "
            f"not divide by its size, dist.get_world_size(dp_group) = {d}."
        )
    return f"{where}: {problem}" if problem else None


def check_average_dp_gradients(average_dp_gradients: Callable) -> None:
    """`average_dp_gradients(model, dp_group)` on a world of 4: t = 2 inside, d = 2 across."""
    results = run_on_world(_dp_rank, DP_WORLD, average_dp_gradients, hang_hint=DP_HANG_HINT)
    dense = _dense_grads()
    for rank, res in enumerate(results):
        problem = _diagnose_dp(res, rank)
        if problem:
            fail(problem)
        where = f"rank {rank}"
        dp_ranks = tuple(res["dp_ranks"])
        groups = {ranks for _, ranks, _ in res["records"]}
        sent = sum(b for _, _, b in res["records"])
        theory_bytes = comm.ring_bytes("all_reduce", 4 * res["trainable"], len(dp_ranks))
        if not res["records"]:
            fail(
                f"{where}: the values are right, but the ledger saw no collective: use "
                "minidist's comm.all_reduce (torch.distributed directly is invisible to it)."
            )
        if groups != {dp_ranks} or abs(sent - theory_bytes) > 1e-6 * theory_bytes:
            fail(
                f"{where}: the values are right, but the ledger shows {sent:.0f} bytes sent over "
                f"groups {sorted(groups)}; one all-reduce of this rank's {res['trainable']} "
                f"gradient elements over its dp group {list(dp_ranks)} sends "
                f"2(d-1)/d·4·{res['trainable']} = {theory_bytes:.0f}."
            )
        t = len(res["tp_ranks"])
        for n, split in res["splits"].items():
            if not close(res["got"][n], _part(dense[n], split, res["tp_rank"], t), atol=1e-6):
                fail(  # the mean over the dp group is right: the layout itself would be wrong
                    f"{where}: {n}'s gradient is the mean over the dp group, yet differs from "
                    "the dense GPT's on the whole batch: report this to the course authors."
                )
    passed(
        f"average_dp_gradients averages over the dp groups only: on {DP_WORLD} ranks (t = "
        f"{DP_TP} inside, d = {DP_WORLD // DP_TP} across) every rank's slices of the gradient "
        "equal the dense GPT's on the whole batch, with one all-reduce's bytes per gradient"
    )
