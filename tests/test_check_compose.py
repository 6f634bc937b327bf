"""Lesson 17's checkers: right answers pass, stubs are reported as not implemented, a
learner's exception becomes a message, and each catalogued mistake is named (all in this
process: the exercises need no world)."""

import itertools
from fnmatch import fnmatchcase

import pytest

from minidist.compose.check import GRAD_CASES, check_build_groups, check_reduced_over
from minidist.course.check import Mistake, catalogue_messages, names_mistake
from minidist.megatron.plan import GPT_PLAN, LLAMA_PLAN

AXES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")


def stub(*args):
    raise NotImplementedError("exercise: replace this line with your code")


# -- exercise 1: the groups from the dims ------------------------------------------------------


def make_groups(
    order=AXES,
    shard_cp=("dp_shard", "cp"),
    dp_cp=("dp_replicate", "dp_shard", "cp"),
    ep_from="dp_shard_cp",
    ep_strided=False,
    drop_ones=False,
    base=0,
    leave_out=(),
    shifts=False,
    ep_scale=1,
):
    """A learner's `build_groups`, with the named parts changed: the grid's axis `order`
    (outermost first), ranks packed with bit shifts, the axes of dp_shard_cp and dp_cp, the
    kind ep is cut from (or "cp_outer": dp_shard × cp listed cp outermost), whether its
    blocks are strided and their size, size-1 kinds dropped, ranks counted from `base`,
    kinds left out."""

    def build_groups(pp, dp_replicate, dp_shard, cp, tp, ep):
        sizes = dict(pp=pp, dp_replicate=dp_replicate, dp_shard=dp_shard, cp=cp, tp=tp)

        def rank(coord):
            r = 0
            for axis in order:
                if shifts:
                    r = r << (sizes[axis] - 1).bit_length() | coord[axis]
                else:
                    r = r * sizes[axis] + coord[axis]
            return r + base

        def groups(moving):
            rest = [a for a in AXES if a not in moving]
            out = []
            for fixed in itertools.product(*(range(sizes[a]) for a in rest)):
                c = dict(zip(rest, fixed))
                moves = itertools.product(*(range(sizes[a]) for a in moving))
                out.append([rank({**c, **dict(zip(moving, m))}) for m in moves])
            return out

        out = {a: groups((a,)) for a in AXES}
        out["dp_shard_cp"] = groups(shard_cp)
        out["dp_cp"] = groups(dp_cp)
        src = groups(("cp", "dp_shard")) if ep_from == "cp_outer" else out[ep_from]
        ep *= ep_scale
        if ep_strided:
            out["ep"] = [g[i :: len(g) // ep] for g in src for i in range(len(g) // ep)]
        else:
            out["ep"] = [g[i : i + ep] for g in src for i in range(0, len(g), ep)]
        if drop_ones:
            out = {k: (v if len(v[0]) > 1 else []) for k, v in out.items()}
        return {k: v for k, v in out.items() if k not in leave_out}

    return build_groups


def _two_ep_slips(pp, dp_replicate, dp_shard, cp, tp, ep):
    """ep cut from dp_shard alone when there is cp, strided when not: each catalogued slip
    explains only some of the wrong layouts."""
    how = dict(ep_from="dp_shard") if cp > 1 else dict(ep_strided=True)
    return make_groups(**how)(pp, dp_replicate, dp_shard, cp, tp, ep)


def _index_past_the_end(pp, dp_replicate, dp_shard, cp, tp, ep):
    sizes = [pp, dp_replicate, dp_shard, cp, tp]
    return {"tp": [[sizes[i] for i in range(tp + 5)]]}


GROUP_MISTAKES = [
    Mistake(
        "tp_outermost",
        (make_groups(order=("tp", "pp", "dp_replicate", "dp_shard", "cp")),),
        r"tp must be innermost",
    ),
    Mistake(
        "pp_innermost",
        (make_groups(order=("dp_replicate", "dp_shard", "cp", "tp", "pp")),),
        r"pp must be outermost",
    ),
    Mistake(
        "dp_swapped",
        (make_groups(order=("pp", "dp_shard", "dp_replicate", "cp", "tp")),),
        r"dp_shard and dp_replicate are swapped",
    ),
    Mistake(
        "cp_outside_dp_shard",
        (make_groups(order=("pp", "dp_replicate", "cp", "dp_shard", "tp")),),
        r"cp sits inside dp_shard",
    ),
    Mistake(
        "shard_group_without_cp", (make_groups(shard_cp=("dp_shard",)),), r"dp_shard_cp forgot cp"
    ),
    Mistake(
        "shard_group_with_replicas",
        (make_groups(shard_cp=("dp_replicate", "dp_shard", "cp")),),
        r"dp_shard_cp includes dp_replicate",
    ),
    Mistake(
        "dense_copies_without_replicas",
        (make_groups(dp_cp=("dp_shard", "cp")),),
        r"dp_cp forgot dp_replicate",
    ),
    Mistake(
        "dense_copies_without_cp",
        (make_groups(dp_cp=("dp_replicate", "dp_shard")),),
        r"dp_cp forgot cp",
    ),
    Mistake(
        "ep_across_dp_replicate",
        (make_groups(ep_from="dp_cp", ep_strided=True),),
        r"ep is drawn across dp_replicate",
    ),
    Mistake("ep_strided", (make_groups(ep_strided=True),), r"ep groups are strided"),
    Mistake("ep_cp_outermost", (make_groups(ep_from="cp_outer"),), r"ep is cut with cp outermost"),
    Mistake(
        "ep_from_dp_shard", (make_groups(ep_from="dp_shard"),), r"ep is cut from dp_shard alone"
    ),
    Mistake("ep_twice_too_big", (make_groups(ep_scale=2),), r"an ep group has e = \d ranks"),
    Mistake("bit_shifts", (make_groups(shifts=True),), r"bit shifts.*power of two"),
    Mistake(
        "shard_group_without_dp_shard",
        (make_groups(shard_cp=("cp",)),),
        r"dp_shard_cp forgot dp_shard",
    ),
    Mistake(
        "dense_copies_with_tp",
        (make_groups(dp_cp=("dp_replicate", "dp_shard", "cp", "tp")),),
        r"dp_cp includes tp",
    ),
    Mistake(
        "no_single_slip", (_two_ep_slips,), r"ep: the group of rank \d+ is \[.*\], want \[.*\]\.$"
    ),
    Mistake("size_one_kinds_dropped", (make_groups(drop_ones=True),), r"even of one rank"),
    Mistake("ranks_from_one", (make_groups(base=1),), r"ranks \[0\] are in none"),
    Mistake("ep_left_out", (make_groups(leave_out=("ep",)),), r"no ep in your dict"),
    Mistake("a_list_not_a_dict", (lambda *sizes: [[0]],), r"returned a list.*dict"),
    Mistake("index_error", (_index_past_the_end,), r"IndexError.*index past the end"),
]


# -- exercise 2: over which group each gradient is reduced -------------------------------------

SPLIT = ("colwise", "colwise_qkv", "rowwise", "vocab")


def make_reduced(
    dense=("dp_cp",),
    sp_tp=True,
    tp_without_sp=False,
    tp_split_too=False,
    kv_rule=True,
    embedding=True,
    embedding_untied=False,
    expert="expert_dp",
    router_is_expert=False,
    extra=(),
    full_name=False,
):
    """A learner's `reduced_over` with the named parts changed."""

    def reduced_over(model_name, name, dims):
        is_expert = ("moe." in name) if router_is_expert else (".experts." in name)
        if dims.ep > 1 and is_expert:
            return {expert}
        kinds = set(dense) | set(extra)
        plan = LLAMA_PLAN if model_name == "llama" else GPT_PLAN
        module, _, kind = name.rpartition(".")
        looked_up = name if full_name else module
        style = next((s for p, s in plan.items() if fnmatchcase(looked_up, p)), None)
        if style == "colwise_kv" and kv_rule:
            split = 2 % dims.tp == 0
        else:
            split = (style in SPLIT or style == "colwise_kv") and not (
                style == "rowwise" and kind == "bias"
            )
        if dims.tp > 1:
            if tp_split_too and dims.sp:
                kinds.add("tp")
            elif not split and ((dims.sp and sp_tp) or tp_without_sp or style == "colwise_kv"):
                kinds.add("tp")
        tied = name == "tok_emb.weight" or (embedding_untied and "embed_tokens" in name)
        if embedding and tied and dims.pp * dims.chunks > 1:
            kinds.add("embedding")
        return kinds

    return reduced_over


def _two_dense_slips(model_name, name, dims):
    """cp forgotten on the GPT, dp_replicate on the Llama model: no one slip explains both."""
    dense = ("dp_replicate", "dp_shard") if model_name == "gpt" else ("dp_shard_cp",)
    return make_reduced(dense=dense)(model_name, name, dims)


def _plan_lookup(model_name, name, dims):
    return {GPT_PLAN[name]}


REDUCED_MISTAKES = [
    Mistake("forgets_cp", (make_reduced(dense=("dp_replicate", "dp_shard")),), r"forgot cp"),
    Mistake(
        "forgets_dp_replicate", (make_reduced(dense=("dp_shard_cp",)),), r"forgot dp_replicate"
    ),
    Mistake("sp_norms_not_over_tp", (make_reduced(sp_tp=False),), r"partial sum"),
    Mistake(
        "replicated_over_tp_without_sp",
        (make_reduced(tp_without_sp=True),),
        r"without sp.*multiplies it by t",
    ),
    Mistake("split_weights_over_tp", (make_reduced(tp_split_too=True),), r"is split over tp"),
    Mistake(
        "replicated_kv_not_over_tp",
        (make_reduced(kv_rule=False),),
        r"does not divide the 2 KV heads",
    ),
    Mistake(
        "tied_embedding_without_stages",
        (make_reduced(embedding=False),),
        r"first stage.*last.*'embedding' group",
    ),
    Mistake("llama_embedding_tied", (make_reduced(embedding_untied=True),), r"untied"),
    Mistake("experts_over_all_dp", (make_reduced(expert="dp_cp"),), r"hold different experts"),
    Mistake("experts_over_ep", (make_reduced(expert="ep"),), r"hold different experts"),
    Mistake("router_as_expert", (make_reduced(router_is_expert=True),), r"router.*dense"),
    Mistake("pp_in_dense", (make_reduced(extra=("pp",)),), r"stages hold different layers"),
    Mistake("forgets_dp_shard", (make_reduced(dense=("dp_replicate", "cp")),), r"forgot dp_shard"),
    Mistake(
        "plan_on_full_name",
        (make_reduced(full_name=True),),
        r"module-name patterns.*not the parameter's",
    ),
    Mistake(
        "experts_without_replicas",
        (make_reduced(expert="ep_shard"),),
        r"every replica's \(expert_dp\)",
    ),
    Mistake(
        "no_single_slip",
        (_two_dense_slips,),
        r"rank 0 sums .* with ranks \[.*\]; the ranks holding a copy of it are \[.*\]\.$",
    ),
    Mistake("unknown_kind", (lambda m, n, d: {"dp"},), r"'?dp'? is not a group kind"),
    Mistake("returns_none", (lambda m, n, d: None,), r"returned None.*set of group kinds"),
    Mistake("key_error", (_plan_lookup,), r"KeyError.*dictionary key"),
]


@pytest.fixture(scope="module")
def group_messages():
    return catalogue_messages(check_build_groups, GROUP_MISTAKES)


@pytest.fixture(scope="module")
def reduced_messages():
    return catalogue_messages(check_reduced_over, REDUCED_MISTAKES)


def test_catalogues_are_large_enough():
    assert len(GROUP_MISTAKES) >= 8 and len(REDUCED_MISTAKES) >= 8


@pytest.mark.parametrize("mistake", GROUP_MISTAKES, ids=[m.name for m in GROUP_MISTAKES])
def test_build_groups_names_the_mistake(mistake, group_messages):
    assert names_mistake(mistake, group_messages[mistake.name]) is None


@pytest.mark.parametrize("mistake", REDUCED_MISTAKES, ids=[m.name for m in REDUCED_MISTAKES])
def test_reduced_over_names_the_mistake(mistake, reduced_messages):
    assert names_mistake(mistake, reduced_messages[mistake.name]) is None


def test_the_catalogue_without_a_slip_is_the_engine_rule():
    """`mistaken_kinds` with no slip gives `right_kinds` on every parameter and layout."""
    from minidist.compose.check.gradients import mistaken_kinds, model_of, right_kinds
    from minidist.compose.dims import ParallelDims

    for model_name, sizes in GRAD_CASES:
        dims = ParallelDims(**sizes)
        for name, _ in model_of(model_name).named_parameters():
            assert mistaken_kinds(model_name, name, dims) == right_kinds(model_name, name, dims)


def test_right_answers_pass(capsys):
    check_build_groups(make_groups())
    check_reduced_over(make_reduced())
    out = capsys.readouterr().out
    assert out.count("PASSED") == 2


def test_stubs_are_not_implemented():
    for check in (check_build_groups, check_reduced_over):
        with pytest.raises(NotImplementedError):
            check(stub)
