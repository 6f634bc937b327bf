"""Lesson 17's checker, exercise 2: over which group each parameter's gradient is summed.

The learner's `reduced_over(model_name, name, dims)` returns a set of group kinds (keys of
`grid_groups(dims)`: "dp_cp", "tp", "embedding", "expert_dp", ...). Two answers are the
same when they sum over the same ranks, so each is compared as the set of ranks every rank
sums with (`{"dp_replicate", "dp_shard", "cp"}` is `{"dp_cp"}`, and a kind of one rank adds
nothing). The right answer is `parallelize.py`'s table, read from the engine's own plan
(`megatron.plan`) and rules: dense weights over dp_cp; under sp the parameters tensor
parallelism does not split also over tp; K/V also over tp when t does not divide the KV
heads; the GPT's tied embedding also over the first and last stage; an expert (ep > 1) over
expert_dp. Every parameter of the GPT, its MoE form and the Llama model is asked on sampled
layouts (1 to 16 ranks, sp on and off, ep 1 to 4, interleaved stages, replicated K/V). A
wrong answer is named by what it adds or misses: cp, dp_shard or dp_replicate forgotten,
sp's norms not summed over tp, a split weight or a replicated one without sp summed over
tp, replicated K/V not summed over tp, the tied embedding without its two stages, pp where
stages hold different layers, experts summed over all of dp or over the ep group, the router
taken for an expert.
"""

from __future__ import annotations

from ...course.check import fail, passed
from ...course.guard import guarded
from ...expert_parallel.gpt import is_expert
from ...megatron.plan import GPT_PLAN, LLAMA_PLAN
from ..dims import ParallelDims, grid_groups
from ..fixture import build
from ..holdings import _split, _style
from ._shared import _and, call

GRAD_CASES = (
    ("gpt", dict(dp_shard=2, tp=2, sp=True, pp=2)),
    ("llama", dict(dp_shard=2, tp=2, sp=True, pp=2)),
    ("gpt", dict(dp_replicate=2, dp_shard=2, cp=2, tp=2)),
    ("llama", dict(tp=4, cp=2)),  # 2 KV heads: K and V replicated over t = 4
    ("moe", dict(dp_shard=2, cp=2, ep=2, pp=2)),
    ("moe", dict(dp_replicate=2, dp_shard=2, ep=2)),
    ("llama", dict(tp=4, sp=True, pp=2)),
    ("moe", dict(dp_shard=4, ep=4)),
    ("moe", dict(dp_shard=2, cp=2, pp=2)),  # ep = 1: the experts are dense
    ("gpt", dict(dp_shard=2, pp=2, schedule="interleaved", virtual=2)),
    ("gpt", dict(tp=2, sp=True, cp=2, pp=2, schedule="interleaved", virtual=2)),
    ("llama", dict(dp_replicate=2, dp_shard=2, tp=2, pp=2)),
    ("llama", dict(dp_shard=2, cp=2, tp=2, sp=True, pp=2)),
    ("moe", dict(dp_shard=2, cp=2, ep=4, pp=2)),
    ("gpt", dict(schedule="interleaved", virtual=2)),  # both copies on one rank
    ("llama", dict()),
)
_MODELS: dict = {}


def model_of(name: str):
    if name not in _MODELS:
        _MODELS[name] = build(name, steps=0)[0]
    return _MODELS[name]


def right_kinds(model_name: str, name: str, dims: ParallelDims) -> set[str]:
    """The engine's rule (`parallelize.py`'s table) for parameter `name`."""
    model = model_of(model_name)
    if dims.ep > 1 and is_expert(name):
        return {"expert_dp"}
    kinds = {"dp_cp"}
    plan = LLAMA_PLAN if model_name == "llama" else GPT_PLAN
    style = _style(plan, name.rpartition(".")[0])
    if dims.tp > 1 and not _split(model, plan, name, dims.tp):
        if dims.sp or style == "colwise_kv":
            kinds.add("tp")
    if model_name != "llama" and name == "tok_emb.weight" and dims.pp * dims.chunks > 1:
        kinds.add("embedding")
    return kinds


def closure(kinds: set[str], groups: dict) -> list[frozenset[int]]:
    """For every rank, the ranks its gradient is summed with under `kinds`."""
    n = len(groups["stage"]) * len(groups["stage"][0])
    of = {k: {r: g for g in groups[k] for r in g} for k in kinds}
    out = []
    for r in range(n):
        seen, todo = {r}, [r]
        while todo:
            x = todo.pop()
            for k in kinds:
                for y in of[k].get(x, ()):
                    if y not in seen:
                        seen.add(y)
                        todo.append(y)
        out.append(frozenset(seen))
    return out


def _neighbour(dims: ParallelDims, groups: dict, kind: str) -> int | None:
    """A rank that sums with rank 0 only through `kind` (None when `kind` has one rank)."""
    g = groups[kind][0]
    if kind == "embedding":
        return g[-1] if len(g) > 1 else None
    return g[1] if len(g) > 1 else None


WHY_MISSING = {
    "cp": "forgot cp: the cp ranks hold the same weights and compute their gradients from "
    "other tokens of the same sequences, so a dense gradient is summed over dp_replicate × "
    "dp_shard × cp (dp_cp)",
    "dp_shard": "forgot dp_shard: its ranks hold the same weights and other sequences",
    "dp_replicate": "forgot dp_replicate: HSDP's replicas hold copies too (the all-reduce "
    "across replicas before the reduce-scatter)",
    "tp_sp": "under sequence parallelism each tp rank runs {name} on its own block of the "
    "sequence, so its gradient is a partial sum: sp norms (and every parameter tensor "
    "parallelism does not split) are also summed over tp",
    "tp_kv": "t = {t} does not divide the {kv} KV heads, so K and V are replicated over tp and "
    "each tp rank's gradient covers only its own query heads: also summed over tp",
    "embedding": "the tied embedding has a copy on the first stage (the input embedding) and "
    "one on the last (the output head): its gradient is also summed over those two ranks, the "
    "'embedding' group",
    "ep_shard": "forgot some of the ranks holding the same expert: its copies are the ranks e "
    "apart in dp_shard × cp (ep_shard) and every replica's (expert_dp)",
}
WHY_EXTRA = {
    "tp_split": "{name} is split over tp (its plan style is {style!r}): each tp rank holds its "
    "own piece and its gradient is complete there; nothing to sum over tp",
    "tp_replicated": "without sp every tp rank sees every token, so the gradient of a "
    "replicated {name} is already the same full sum on each tp rank: summing it over tp "
    "multiplies it by t",
    "tp_kv": "t = {t} divides the {kv} KV heads, so K and V are split like Q; nothing to sum "
    "over tp",
    "pp": "different pipeline stages hold different layers: only the tied embedding is shared, "
    "between the first and the last stage",
    "embedding": "only the GPT's tied embedding (tok_emb.weight) has a copy on two stages{llama}",
    "ep": "the ranks of an ep group hold different experts: an expert's gradient is summed "
    "only over the ranks holding the same expert (expert_dp), not over all of dp nor over the "
    "ep group",
}


def _diagnose(model_name: str, name: str, dims: ParallelDims, got: set, want: set) -> str:
    groups = grid_groups(dims)
    mine, right = closure(got, groups), closure(want, groups)
    plan = LLAMA_PLAN if model_name == "llama" else GPT_PLAN
    style = _style(plan, name.rpartition(".")[0])
    fmt = dict(name=name, style=style, t=dims.tp, kv=2,
               llama=" (the Llama model's embedding and head are untied)"
               if model_name == "llama" else "")  # fmt: skip
    if not is_expert(name) and dims.ep > 1 and mine == closure({"expert_dp"}, groups):
        return (
            "the router (and every non-expert parameter) is dense: every rank of dp_cp "
            "holds all of it, so it is summed over dp_cp; only experts use expert_dp"
        )
    said = []
    expert = dims.ep > 1 and is_expert(name)
    for kind in ("dp_replicate", "dp_shard", "cp", "tp", "embedding", "pp", "ep", "ep_shard"):
        r = _neighbour(dims, groups, kind)
        if r is None:
            continue
        if kind == "pp":
            r = groups["pp"][0][1]  # the next stage
            if r == _neighbour(dims, groups, "embedding"):
                continue  # two stages: the next is the last, judged as the embedding's
        has, needs = r in mine[0], r in right[0]
        if has == needs:
            continue
        if needs:
            key = {"tp": "tp_kv" if style == "colwise_kv" else "tp_sp"}.get(kind, kind)
            if expert and kind in ("cp", "dp_shard"):
                key = "ep_shard"
            said.append(WHY_MISSING.get(key, f"forgot {kind}").format(**fmt))
        else:
            if kind == "tp":
                split = _split(model_of(model_name), plan, name, dims.tp)
                key = "tp_kv" if style == "colwise_kv" else "tp_split" if split else (
                    "tp_replicated")  # fmt: skip
            elif kind in ("ep", "cp", "dp_shard") and expert:
                key = "ep"
            elif kind == "embedding" and "embedding" not in got:
                key = "pp"  # the last stage reached through pp (or the stage's kinds)
            else:
                key = kind
            said.append(WHY_EXTRA.get(key, f"{kind} does not hold a copy").format(**fmt))
    if not said:
        said.append("it sums over other ranks than the ranks holding a copy")
    unique = list(dict.fromkeys(said))
    return "; and ".join(unique)


def _answer(fn, model_name: str, name: str, dims: ParallelDims, valid: set) -> set[str]:
    text = f"reduced_over({model_name!r}, {name!r}, {dims})"
    out = call(fn, model_name, name, dims, what=text)
    if isinstance(out, str):
        out = {out}
    try:
        got = set(out)
    except TypeError:
        fail(f"{text} returned {out!r}; return a set of group kinds, e.g. {{'dp_cp', 'tp'}}.")
    bad = sorted(str(k) for k in got if k not in valid)
    if bad:
        fail(f"{text}: {_and(bad)} is not a group kind; the kinds are {_and(sorted(valid))} "
             "(grid_groups(dims)'s keys).")  # fmt: skip
    return got


def check_reduced_over(reduced_over) -> None:
    """`reduced_over(model_name, name, dims)` against `parallelize.py`'s table, for every
    parameter of the three models on every sampled layout."""
    asked = 0
    for model_name, sizes in GRAD_CASES:
        dims = ParallelDims(**sizes)
        groups = grid_groups(dims)
        for name, _ in model_of(model_name).named_parameters():
            got = _answer(reduced_over, model_name, name, dims, set(groups))
            want = right_kinds(model_name, name, dims)
            asked += 1
            if closure(got, groups) != closure(want, groups):
                why = guarded(_diagnose, "it sums over other ranks than the ranks holding a "
                              "copy", model_name, name, dims, got, want)  # fmt: skip
                fail(f"{model_name}, {name}, {dims}: you said {sorted(got)}, want "
                     f"{sorted(want)} (or the same ranks in other kinds): {why}.")  # fmt: skip
    passed(
        f"reduced_over sums each gradient over the ranks holding a copy: {asked} parameters "
        f"of the GPT, its MoE form and the Llama model on {len(GRAD_CASES)} layouts"
    )
