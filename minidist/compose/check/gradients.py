"""Lesson 17's checker, exercise 2: over which group each parameter's gradient is summed.

The learner's `reduced_over(model_name, name, dims)` returns a set of group kinds (keys of
`grid_groups(dims)`: "dp_cp", "tp", "embedding", "expert_dp", ...). Two answers are the same
when they sum over the same ranks, so each is compared as the set of ranks every rank sums
with (`{"dp_replicate", "dp_shard", "cp"}` is `{"dp_cp"}`, and a kind of one rank adds
nothing). The right answer is `parallelize.py`'s table, read from lesson 07's plans
(`megatron.plan`, the splits the engine applies) and rules: dense weights over dp_cp; under
sp the parameters tensor parallelism does not split also over tp; K/V also over tp when t
does not divide the KV heads; the GPT's tied embedding also over the first and last stage;
an expert (ep > 1) over expert_dp. Every parameter of the GPT, its MoE form and the Llama
model is asked on sampled layouts (1 to 16 ranks, sp on and off, ep 1 to 4, interleaved
stages, replicated K/V). Every parameter is asked first; a catalogued slip (`READINGS`) is
named only when it gives the learner's ranks on every parameter and layout the learner got
wrong: cp, dp_shard or dp_replicate forgotten, a plan pattern matched against the
parameter's name (nothing matches), sp's norms not summed over tp, a split weight or a
replicated one without sp summed over tp, replicated K/V not summed over tp, the tied
embedding without its two stages, the Llama model's embedding taken as tied, pp added,
experts summed over all of dp, the ep group or ep_shard alone, the router taken for an
expert. Otherwise the message shows the first wrong answer and the ranks it sums with
against the ranks holding a copy."""

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


def mistaken_kinds(model_name: str, name: str, dims: ParallelDims, **how) -> set[str]:
    """`right_kinds`, or the kinds a learner with one slip (`how`, see `READINGS`) returns."""
    model = model_of(model_name)
    expert = ("moe." in name) if how.get("router_is_expert") else is_expert(name)
    if dims.ep > 1 and expert:
        return {how.get("expert", "expert_dp")}
    kinds = set(how.get("dense", ("dp_cp",))) | set(how.get("extra", ()))
    plan = LLAMA_PLAN if model_name == "llama" else GPT_PLAN
    # a plan's keys are module-name patterns: matched against the parameter's name, none fits
    module = name if how.get("full_name") else name.rpartition(".")[0]
    style = _style(plan, module)
    split = style is not None and (
        _split(model, plan, name, dims.tp) or (style == "colwise_kv" and how.get("kv_split"))
    )
    if dims.tp > 1:
        if how.get("split_over_tp") and dims.sp:
            kinds.add("tp")
        elif not split and (
            (dims.sp and not how.get("no_sp_tp"))
            or style == "colwise_kv"
            or how.get("tp_without_sp")
        ):
            kinds.add("tp")
    tied = (model_name != "llama" and name == "tok_emb.weight") or (
        how.get("llama_tied") and "embed_tokens" in name
    )
    if tied and not how.get("no_embedding") and dims.pp * dims.chunks > 1:
        kinds.add("embedding")
    return kinds


ROUTER = (
    "the router (and every non-expert parameter) is dense: every rank of dp_cp holds all "
    "of it, so it is summed over dp_cp; only experts use expert_dp"
)
FULL_NAME = (
    "no plan pattern matches your lookup: a plan's keys are module-name patterns, "
    "matched with fnmatchcase against the module's name ({module}), not the "
    "parameter's ({name}); so every parameter looked unsplit"
)
# A catalogued mistake: (what to say, the slip in `mistaken_kinds`). One is named only when it
# sums over the learner's ranks for every parameter and layout the learner got wrong; where
# two do, the first, so a slip that explains fewer wrong answers comes before a broader one.
READINGS = [
    (WHY_MISSING["cp"], dict(dense=("dp_replicate", "dp_shard"))),
    (WHY_MISSING["dp_replicate"], dict(dense=("dp_shard_cp",))),
    (WHY_MISSING["dp_shard"], dict(dense=("dp_replicate", "cp"))),
    (WHY_MISSING["tp_sp"], dict(no_sp_tp=True)),
    (WHY_EXTRA["tp_replicated"], dict(tp_without_sp=True)),
    (WHY_EXTRA["tp_split"], dict(split_over_tp=True)),
    (WHY_MISSING["tp_kv"], dict(kv_split=True)),
    (FULL_NAME, dict(full_name=True)),  # after the two it looks like on some layouts only
    (WHY_MISSING["embedding"], dict(no_embedding=True)),
    (WHY_EXTRA["embedding"], dict(llama_tied=True)),
    (WHY_EXTRA["pp"], dict(extra=("pp",))),
    (ROUTER, dict(router_is_expert=True)),
    (WHY_EXTRA["ep"], dict(expert="dp_cp")),
    (WHY_EXTRA["ep"], dict(expert="ep")),
    (WHY_MISSING["ep_shard"], dict(expert="ep_shard")),
]


def _fmt(model_name: str, name: str, dims: ParallelDims) -> dict:
    plan = LLAMA_PLAN if model_name == "llama" else GPT_PLAN
    module = name.rpartition(".")[0]
    return dict(
        name=name,
        module=module,
        style=_style(plan, module),
        t=dims.tp,
        kv=2,
        llama=" (the Llama model's embedding and head are untied)" if model_name == "llama" else "",
    )


def _diagnose(wrong: list) -> str:
    """The catalogued slip that gives the learner's ranks on every wrong (model, parameter,
    layout), said on the first; else the first one's ranks, the learner's and the right."""
    model_name, name, dims, got, want = wrong[0]
    head = (
        f"{model_name}, {name}, {dims}: you said {sorted(got)}, want {sorted(want)} (or "
        "the same ranks in other kinds)"
    )
    groups = {d: grid_groups(d) for _, _, d, _, _ in wrong}
    mine = [closure(g, groups[d]) for _, _, d, g, _ in wrong]
    for text, how in READINGS:
        if all(
            closure(mistaken_kinds(m, n, d, **how), groups[d]) == ranks
            for (m, n, d, _, _), ranks in zip(wrong, mine)
        ):
            return f"{head}: {text.format(**_fmt(model_name, name, dims))}."
    right = closure(want, groups[dims])[0]
    return (
        f"{head}: rank 0 sums {name}'s gradient with ranks {sorted(mine[0][0])}; the "
        f"ranks holding a copy of it are {sorted(right)}."
    )


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
        fail(
            f"{text}: {_and(bad)} is not a group kind; the kinds are {_and(sorted(valid))} "
            "(grid_groups(dims)'s keys)."
        )
    return got


def check_reduced_over(reduced_over) -> None:
    """`reduced_over(model_name, name, dims)` against `parallelize.py`'s table, for every
    parameter of the three models on every sampled layout."""
    asked, wrong = 0, []
    for model_name, sizes in GRAD_CASES:
        dims = ParallelDims(**sizes)
        groups = grid_groups(dims)
        for name, _ in model_of(model_name).named_parameters():
            got = _answer(reduced_over, model_name, name, dims, set(groups))
            want = right_kinds(model_name, name, dims)
            asked += 1
            if closure(got, groups) != closure(want, groups):
                wrong.append((model_name, name, dims, got, want))
    if wrong:
        first = wrong[0]
        fallback = (
            f"{first[0]}, {first[1]}, {first[2]}: you said {sorted(first[3])}, want "
            f"{sorted(first[4])}"
        )
        fail(guarded(_diagnose, fallback, wrong))
    passed(
        f"reduced_over sums each gradient over the ranks holding a copy: {asked} parameters "
        f"of the GPT, its MoE form and the Llama model on {len(GRAD_CASES)} layouts"
    )
