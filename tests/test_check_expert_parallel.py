"""Lesson 16's checkers: right answers, written several ways, pass; each catalogued mistake is
named (one checker run per answer, all in this process)."""

import math

import numpy as np
import pytest
import torch

from minidist.course.check import Mistake, catalogue_messages, names_mistake
from minidist.expert_parallel.check import (
    check_dispatch,
    check_load_balancing_loss,
    check_priority,
)
from minidist.expert_parallel.routing import dispatch, load_balancing_loss

# -- exercise 1: dispatch -------------------------------------------------------------------


def _ceil(t, e, cf):
    return math.ceil(cf * t / e)


def _with(cap, order=lambda m, c: (m[:c], m[c:])):
    """The right dispatch with another capacity rule cap(T, E, cf, ids, expert's tokens)."""

    def fn(ids, e, cf):
        out = []
        for x in range(e):
            m = torch.nonzero(ids == x).flatten()
            out.append(order(m, max(cap(ids.numel(), e, cf, ids, m), 0)))
        return out

    return fn


def _right(t, e, cf, ids, m):
    return _ceil(t, e, cf)


def _shared(ids, e, cf):
    budget = _ceil(ids.numel(), e, cf) * e
    return [
        (m[m < budget], m[m >= budget]) for m in (torch.nonzero(ids == x)[:, 0] for x in range(e))
    ]


def _map(f):
    return lambda ids, e, cf: [f(k, d) for k, d in dispatch(ids, e, cf)]


def _sorts_input(ids, e, cf):
    out = dispatch(ids.clone(), e, cf)
    ids.copy_(ids.sort().values)
    return out


def _masks(ids, e, cf):
    c = _ceil(ids.numel(), e, cf)
    out = []
    for x in range(e):
        mask = ids == x
        pos = mask.long().cumsum(0) - 1
        out.append((mask & (pos < c), mask & (pos >= c)))
    return out


def _overflow_next(ids, e, cf):
    c = _ceil(ids.numel(), e, cf)
    kept, dropped = [[] for _ in range(e)], [[] for _ in range(e)]
    for t, x in enumerate(ids.tolist()):
        room = [(x + j) % e for j in range(e) if len(kept[(x + j) % e]) < c]
        (kept[room[0]] if room else dropped[x]).append(t)
    return list(zip(kept, dropped, strict=True))


def _unstable_sort(ids, e, cf):
    c, order = _ceil(ids.numel(), e, cf), torch.argsort(ids)  # not stable=True
    return [(order[ids[order] == x][:c], order[ids[order] == x][c:]) for x in range(e)]


def _index_past_end(ids, e, cf):
    buckets = [[] for _ in range(e)]
    for t in range(ids.numel() + 1):
        buckets[int(ids[t])].append(t)
    return buckets


def _never_ends(ids, e, cf):  # the one answer that waits out the time limit (5 s)
    while True:
        pass


DISPATCH_MISTAKES = [
    Mistake("floor", (_with(lambda t, e, cf, i, m: math.floor(cf * t / e)),), "floor"),
    Mistake("floor division", (_with(lambda t, e, cf, i, m: int(cf * t // e)),), "floor"),
    Mistake("round", (_with(lambda t, e, cf, i, m: round(cf * t / e)),), "round"),
    Mistake("no division by E", (_with(lambda t, e, cf, i, m: math.ceil(cf * t)),), "by E"),
    Mistake("no capacity factor", (_with(lambda t, e, cf, i, m: math.ceil(t / e)),), "missing"),
    Mistake(
        "int(capacity_factor)",
        (_with(lambda t, e, cf, i, m: math.ceil(int(cf) * t / e)),),
        "truncated to an integer",
    ),
    Mistake(
        "E from the experts used",
        (_with(lambda t, e, cf, i, m: math.ceil(cf * t / len(torch.unique(i)))),),
        "experts that got a token",
    ),
    Mistake(
        "E from the largest expert id",
        (_with(lambda t, e, cf, i, m: math.ceil(cf * t / (int(i.max()) + 1))),),
        "taken from the data",
    ),
    Mistake(
        "C from the expert's own tokens",
        (_with(lambda t, e, cf, i, m: math.ceil(cf * len(m) / e)),),
        "own number of tokens",
    ),
    Mistake(
        "floor + 1 as a ceil",
        (_with(lambda t, e, cf, i, m: int(cf * t // e) + 1),),
        "only when cf·T/E is not a whole number",
    ),
    Mistake(
        "float capacity",
        (_with(lambda t, e, cf, i, m: math.ceil(t / e) * cf),),
        "C is not a whole number",
    ),
    Mistake("C + 1", (_with(lambda t, e, cf, i, m: _ceil(t, e, cf) + 1),), "one token too many"),
    Mistake("C - 1", (_with(lambda t, e, cf, i, m: _ceil(t, e, cf) - 1),), "one token too few"),
    Mistake("no capacity at all", (_with(lambda t, e, cf, i, m: t),), "nothing is dropped"),
    Mistake(
        "last C kept",
        (_with(_right, lambda m, c: (m[max(len(m) - c, 0) :], m[: max(len(m) - c, 0)])),),
        "LAST C",
    ),
    Mistake("reversed", (_map(lambda k, d: (k.flip(0), d.flip(0))),), "wrong order"),
    Mistake("unstable argsort", (_unstable_sort,), "stable=True"),
    Mistake("kept and dropped swapped", (_map(lambda k, d: (d, k)),), "swapped"),
    Mistake("nothing dropped reported", (_map(lambda k, d: (k, d[:0])),), "drops"),
    Mistake("dropped holds kept too", (_map(lambda k, d: (k, torch.cat([k, d]))),), "twice"),
    Mistake("one budget shared by all experts", (_shared,), "OWN capacity"),
    Mistake("overflow to the next expert", (_overflow_next,), "which chose expert"),
    Mistake(
        "experts with tokens only",
        (lambda ids, e, cf: [p for p in dispatch(ids, e, cf) if len(p[0])],),
        "no token included",
    ),
    Mistake(
        "E from max(expert)", (lambda ids, e, cf: dispatch(ids, int(ids.max()) + 1, cf),), "E ="
    ),
    Mistake("a generator", (lambda ids, e, cf: (p for p in dispatch(ids, e, cf)),), "generator"),
    Mistake("a dict", (lambda ids, e, cf: dict(enumerate(dispatch(ids, e, cf))),), "dict"),
    Mistake("None", (lambda ids, e, cf: None,), "NoneType"),
    Mistake("kept only", (lambda ids, e, cf: [k for k, _ in dispatch(ids, e, cf)],), "a pair"),
    Mistake(
        "all kept, all dropped",
        (lambda ids, e, cf: tuple(map(list, zip(*dispatch(ids, e, cf), strict=True))),),
        "one \\(kept, dropped\\) pair",
    ),
    Mistake("boolean masks", (_masks,), "boolean mask"),
    Mistake("nonzero not flattened", (_map(lambda k, d: (k[:, None], d[:, None])),), r"\[n, 1\]"),
    Mistake("float indices", (_map(lambda k, d: (k.float(), d.float())),), "dtype torch.float32"),
    Mistake("sorts the input in place", (_sorts_input,), "changed its input `expert` in place"),
    Mistake("index past the end", (_index_past_end,), "raised IndexError.*tokens are 0"),
    Mistake(
        "integer ceiling with a float cf",
        (_with(lambda t, e, cf, i, m: int((cf * t + e - 1) // e)),),
        r"integer ceiling is ⌈x/E⌉ only for a whole x",
    ),
    Mistake("never ends", (_never_ends,), "still running"),
]


def _lists_loop(ids, e, cf):
    c = math.ceil(cf * len(ids) / e)
    kept, dropped = [[] for _ in range(e)], [[] for _ in range(e)]
    for t, x in enumerate(ids.tolist()):
        (kept if len(kept[x]) < c else dropped)[x].append(t)
    return list(zip(kept, dropped, strict=True))


def _cumsum(ids, e, cf):
    c = -(-cf * ids.numel() // e)
    pos = (torch.nn.functional.one_hot(ids, e).cumsum(0) - 1).gather(1, ids[:, None])[:, 0]
    idx = torch.arange(ids.numel())
    return [(idx[(ids == x) & (pos < c)], idx[(ids == x) & (pos >= c)]) for x in range(e)]


def _sorted(ids, e, cf):
    c = math.ceil(cf * (ids.numel() / e))
    order, start, out = torch.argsort(ids, stable=True), 0, []
    for n in torch.bincount(ids, minlength=e).tolist():
        out.append(tuple(order[start : start + n].split([min(c, n), n - min(c, n)])))
        start += n
    return out


def _numpy(ids, e, cf):
    a, c = ids.numpy(), math.ceil(cf * ids.numel() / e)
    return [(list(np.flatnonzero(a == x)[:c]), np.flatnonzero(a == x)[c:]) for x in range(e)]


@pytest.mark.parametrize("answer", [dispatch, _lists_loop, _cumsum, _sorted, _numpy])
def test_right_dispatch_passes(answer, capsys):
    check_dispatch(answer)
    assert "PASSED" in capsys.readouterr().out


@pytest.fixture(scope="module")
def dispatch_messages():
    return catalogue_messages(check_dispatch, DISPATCH_MISTAKES)


@pytest.mark.parametrize("mistake", DISPATCH_MISTAKES, ids=lambda m: m.name)
def test_each_dispatch_mistake_is_named(mistake, dispatch_messages):
    assert names_mistake(mistake, dispatch_messages[mistake.name]) is None


# -- exercise 2: the load-balancing loss ----------------------------------------------------


def _f(probs, ids):
    return torch.bincount(ids, minlength=probs.shape[-1]).to(probs.dtype) / ids.numel()


def _gates(probs, ids):
    chosen = probs.gather(-1, ids[:, None]).squeeze(-1)
    return torch.zeros(probs.shape[-1], dtype=probs.dtype).index_add(0, ids, chosen) / ids.numel()


def _e(p):
    return p.shape[-1]


def _scales_probs(p, i):
    p *= 1.0
    return load_balancing_loss(p, i)


def _zeroes_expert(p, i):
    out = load_balancing_loss(p, i.clone())
    i.zero_()
    return out


def _straight_through(p, i):
    hard = torch.nn.functional.one_hot(i, _e(p)).to(p.dtype)
    return _e(p) * ((hard + p - p.detach()).mean(0) * p.mean(0)).sum()


def _swapped_shape(p, i):
    e, t = p.shape
    return e * (torch.bincount(i, minlength=t).to(p.dtype) / t * p.mean(0)).sum()


def _loop_int_over_int(p, i):
    t, e = p.shape
    total = p.new_zeros(())
    for x in range(e):  # (i == x).sum() / t is float32: wrong by ~1e-8 for float64 probs
        total = total + (i == x).sum() / t * p[:, x].sum() / t
    return (e * total).reshape(1)


AUX_MISTAKES = [
    Mistake("no E", (lambda p, i: (_f(p, i) * p.mean(0)).sum(),), "factor E is missing"),
    Mistake(
        "mean over experts", (lambda p, i: _e(p) * (_f(p, i) * p.mean(0)).mean(),), "became a mean"
    ),
    Mistake(
        "E squared", (lambda p, i: _e(p) ** 2 * (_f(p, i) * p.mean(0)).sum(),), "E appears twice"
    ),
    Mistake("divided by E", (lambda p, i: (_f(p, i) * p.mean(0)).sum() / _e(p),), "divided by E"),
    Mistake("counts", (lambda p, i: load_balancing_loss(p, i) * i.numel(),), "T times too large"),
    Mistake(
        "mean of all probs",
        (lambda p, i: _e(p) * (_f(p, i) * p.mean()).sum(),),
        "mean of ALL of probs",
    ),
    Mistake(
        "f over E",
        (lambda p, i: _e(p) * (torch.bincount(i, minlength=_e(p)) / _e(p) * p.mean(0)).sum(),),
        "count / E",
    ),
    Mistake(
        "P over the wrong dimension",
        (lambda p, i: _e(p) * (_f(p, i) * p.mean(1)).sum(),),
        r"probs is \[T, E\]",
    ),
    Mistake("sum of probs", (lambda p, i: _e(p) * (_f(p, i) * p.sum(0)).sum(),), "T times"),
    Mistake("T and E swapped", (_swapped_shape,), "T and E swapped"),
    Mistake(
        "gates instead of fractions",
        (lambda p, i: _e(p) * (_gates(p, i) * p.mean(0)).sum(),),
        "gates",
    ),
    Mistake("f times f", (lambda p, i: _e(p) * (_f(p, i) ** 2).sum(),), "f_e · f_e"),
    Mistake("P times P", (lambda p, i: _e(p) * (p.mean(0) ** 2).sum(),), "P_e · P_e"),
    Mistake(
        "P over routed tokens",
        (
            lambda p, i: (
                _e(p)
                * (_gates(p, i) * i.numel() / torch.bincount(i, minlength=_e(p)).clamp_min(1))
                .mul(_f(p, i))
                .sum()
            ),
        ),
        "routed to e only",
    ),
    Mistake(
        "E times the chosen probability",
        (lambda p, i: _e(p) * p.gather(1, i[:, None]).mean(),),
        "mean_t p\\[t, expert\\[t\\]\\]",
    ),
    Mistake("argmax, not expert", (lambda p, i: load_balancing_loss(p, p.argmax(-1)),), "argmax"),
    Mistake(
        "softmax again", (lambda p, i: load_balancing_loss(torch.softmax(p, -1), i),), "softmax"
    ),
    Mistake(
        "integer division",
        (
            lambda p, i: (
                _e(p) * ((torch.bincount(i, minlength=_e(p)) // i.numel()) * p.mean(0)).sum()
            ),
        ),
        "integer division",
    ),
    Mistake("alpha inside", (lambda p, i: 0.01 * load_balancing_loss(p, i),), "α = 0.01"),
    Mistake("detached", (lambda p, i: load_balancing_loss(p.detach(), i),), "no gradient"),
    Mistake("straight-through f", (_straight_through,), "f_e must be a constant"),
    Mistake(
        "python float", (lambda p, i: float(load_balancing_loss(p, i).detach()),), "one-element"
    ),
    Mistake("per-expert vector", (lambda p, i: _e(p) * _f(p, i) * p.mean(0),), "one-element"),
    Mistake("None", (lambda p, i: None,), "NoneType"),
    Mistake("float32 always", (lambda p, i: load_balancing_loss(p.float(), i),), "probs' dtype"),
    Mistake("float64 always", (lambda p, i: load_balancing_loss(p.double(), i),), "probs' dtype"),
    Mistake(
        "one_hot without num_classes",
        (
            lambda p, i: (
                _e(p) * (torch.nn.functional.one_hot(i).to(p.dtype).mean(0) * p.mean(0)).sum()
            ),
        ),
        "num_classes=E",
    ),
    Mistake("scales probs in place", (_scales_probs,), "in-place operation on an input"),
    Mistake("zeroes expert in place", (_zeroes_expert,), "changed its input `expert`"),
    Mistake("index past the end", (lambda p, i: p[i.numel() + 50],), "raised IndexError"),
    Mistake("f in float32 (int / int)", (_loop_int_over_int,), "f_e was computed in float32"),
    Mistake(
        "P in float32",
        (lambda p, i: _e(p) * (_f(p, i) * p.mean(0).float().to(p.dtype)).sum(),),
        "P_e was computed in float32",
    ),
    Mistake(
        "minlength given, P over the tokens",
        (lambda p, i: _e(p) * (_f(p, i) * p.mean(1)).sum(),),
        r"^(?![\s\S]*minlength)[\s\S]*probs is \[T, E\]",
    ),
    Mistake(
        "bincount without minlength",
        (lambda p, i: _e(p) * (torch.bincount(i).to(p.dtype) / i.numel() * p.mean(0)).sum(),),
        "minlength=E",
    ),
    Mistake("numpy", (lambda p, i: load_balancing_loss(p, i).detach().numpy(),), "ndarray"),
    Mistake("a pair", (lambda p, i: (load_balancing_loss(p, i), None),), "got tuple"),
]


def _einsum(p, i):
    f = torch.nn.functional.one_hot(i, _e(p)).to(p.dtype).mean(0)
    return _e(p) * torch.einsum("e,e->", f, p.mean(0))


def _bincount_truncated(p, i):
    f = torch.bincount(i).to(p.dtype) / i.numel()  # missing experts have f_e = 0 anyway
    return _e(p) * (f * p.mean(0)[: len(f)]).sum()


def _histc(p, i):
    f = i.to(p.dtype).histc(bins=_e(p), min=0, max=_e(p) - 1) / i.numel()
    return (_e(p) * f @ p.mean(0)).reshape(1, 1)


def _loop_in_dtype(p, i):
    t, e = p.shape
    total = p.new_zeros(())
    for x in range(e):
        total = total + (i == x).sum().to(p.dtype) / t * p[:, x].sum() / t
    return (e * total).reshape(1)


@pytest.mark.parametrize(
    "answer", [load_balancing_loss, _einsum, _loop_in_dtype, _bincount_truncated, _histc]
)
def test_right_aux_loss_passes(answer, capsys):
    check_load_balancing_loss(answer)
    assert "PASSED" in capsys.readouterr().out


@pytest.fixture(scope="module")
def aux_messages():
    return catalogue_messages(check_load_balancing_loss, AUX_MISTAKES)


@pytest.mark.parametrize("mistake", AUX_MISTAKES, ids=lambda m: m.name)
def test_each_aux_mistake_is_named(mistake, aux_messages):
    assert names_mistake(mistake, aux_messages[mistake.name]) is None


# -- exercise 3: top-k slots and capacity ----------------------------------------------------


def _slots(order, e):
    onehot = torch.nn.functional.one_hot(order, e)
    return ((onehot.cumsum(0) - 1) * onehot).sum(-1)


def _priority(x, e, cf, order="choice", cap=lambda t, k, e, cf: math.ceil(cf * t * k / e)):
    """Slots in the given order, kept = slot < cap(T, k, E, cf)."""
    t, k = x.shape
    if order == "choice":
        slot = _slots(x.t().reshape(-1), e).view(k, t).t()
    elif order == "token":
        slot = _slots(x.reshape(-1), e).view(t, k)
    elif order == "tokens reversed":
        slot = _slots(x.flip(0).t().reshape(-1), e).view(k, t).t().flip(0)
    elif order == "second first":
        slot = _slots(x.flip(1).t().reshape(-1), e).view(k, t).t().flip(1)
    else:  # one count per choice
        slot = torch.stack([_slots(x[:, j], e) for j in range(k)], 1)
    return slot, slot < cap(t, k, e, cf)


def _p(**kw):
    return lambda x, e, cf: _priority(x, e, cf, **kw)


def _from_one(x, e, cf):
    slot, _ = _priority(x, e, cf)
    return slot + 1, slot + 1 <= math.ceil(cf * x.numel() / e)


def _minus_one_dropped(x, e, cf):
    slot, kept = _priority(x, e, cf)
    return slot.masked_fill(~kept, -1), kept


def _token_dropped_whole(x, e, cf):
    slot, kept = _priority(x, e, cf)
    return slot, kept.all(1, keepdim=True).expand_as(kept)


def _sorts_experts(x, e, cf):
    out = _priority(x.clone(), e, cf)
    x.copy_(x.sort(1).values)
    return out


def _clamped(x, e, cf):
    slot, kept = _priority(x, e, cf)
    return slot.clamp_max(math.ceil(cf * x.numel() / e)), kept


def _two_choices(x, e, cf):
    t = x.shape[0]
    c = math.ceil(cf * t * 2 / e)
    slot = _slots(torch.stack([x[:, 0], x[:, 1]]).reshape(-1), e).view(2, t).t()
    return slot, slot < c


def _argsort_slots(x, e, cf):
    t, k = x.shape
    order = x.t().reshape(-1)
    idx = torch.argsort(order)  # not stable=True: equal experts come back in any order
    starts = torch.searchsorted(order[idx], torch.arange(e))
    slot = torch.empty_like(order)
    slot[idx] = torch.arange(order.numel()) - starts[order[idx]]
    slot = slot.view(k, t).t()
    return slot, slot < math.ceil(cf * t * k / e)


PRIORITY_MISTAKES = [
    Mistake("priority by token", (_p(order="token"),), "priority by token"),
    Mistake("tokens reversed", (_p(order="tokens reversed"),), "reverse order"),
    Mistake(
        "(kept, slot)",
        (lambda x, e, cf: _priority(x, e, cf)[::-1],),
        r"came back as \(kept, slot\)",
    ),
    Mistake("second choices first", (_p(order="second first"),), "second choices before first"),
    Mistake("one count per choice", (_p(order="per choice"),), "its own count"),
    Mistake(
        "C without k", (_p(cap=lambda t, k, e, cf: math.ceil(cf * t / e)),), r"k·T assignments"
    ),
    Mistake(
        "C with k twice", (_p(cap=lambda t, k, e, cf: math.ceil(cf * t * k * k / e)),), "k twice"
    ),
    Mistake("floor", (_p(cap=lambda t, k, e, cf: math.floor(cf * t * k / e)),), "floor"),
    Mistake(
        "kept = slot <= C",
        (_p(cap=lambda t, k, e, cf: math.ceil(cf * t * k / e) + 1),),
        "one assignment too many",
    ),
    Mistake("slots from 1", (_from_one,), "count from 1"),
    Mistake("-1 for dropped", (_minus_one_dropped,), "not a negative marker"),
    Mistake("a token dropped whole", (_token_dropped_whole,), "kept is not slot < C"),
    Mistake(
        "kept as int", (lambda x, e, cf: tuple(t.long() for t in _priority(x, e, cf)),), "bool"
    ),
    Mistake(
        "slot as float",
        (lambda x, e, cf: (_priority(x, e, cf)[0].float(), _priority(x, e, cf)[1]),),
        "int64",
    ),
    Mistake(
        "transposed [k, T]",
        (lambda x, e, cf: tuple(t.t() for t in _priority(x, e, cf)),),
        r"want \[T, k\]",
    ),
    Mistake("slot only", (lambda x, e, cf: _priority(x, e, cf)[0],), r"pair \(slot, kept\)"),
    Mistake(
        "lists",
        (lambda x, e, cf: tuple(t.tolist() for t in _priority(x, e, cf)),),
        "must be a tensor",
    ),
    Mistake("sorts experts in place", (_sorts_experts,), "changed its input `experts`"),
    Mistake(
        "capacity factor ignored (integer ceiling)",
        (_p(cap=lambda t, k, e, cf: (t * k + e - 1) // e),),
        "slot < C, but your C is wrong: .*capacity_factor",
    ),
    Mistake(
        "integer ceiling with a float cf",
        (_p(cap=lambda t, k, e, cf: int((cf * t * k + e - 1) // e)),),
        "your C is wrong: .*integer ceiling is ⌈x/E⌉ only for a whole x",
    ),
    Mistake(
        "C from the first case's rule, another C",
        (_p(cap=lambda t, k, e, cf: math.ceil(cf * t * k / e) + (t % 2)),),
        r"your C is .*and C = ⌈cf·T·k/E⌉",
    ),
    Mistake("slots clamped to C", (_clamped,), "clamped to C"),
    Mistake(
        "int32 slot",
        (lambda x, e, cf: (_priority(x, e, cf)[0].int(), _priority(x, e, cf)[1]),),
        r"torch.int32; the exercise asks for int64",
    ),
    Mistake("hard-coded k = 2", (_two_choices,), r"experts.shape\[1\]"),
    Mistake("unstable argsort", (_argsort_slots,), "stable=True"),
    Mistake("None", (lambda x, e, cf: None,), "NoneType"),
    Mistake(
        "numpy slot",
        (lambda x, e, cf: (_priority(x, e, cf)[0].numpy(), _priority(x, e, cf)[1]),),
        "slot is a numpy.ndarray",
    ),
    Mistake("a triple", (lambda x, e, cf: (*_priority(x, e, cf), None),), "a tuple of 3"),
]


def _priority_loop(x, e, cf):
    t, k = x.shape
    c, used = math.ceil(cf * t * k / e), [0] * e
    slot = torch.empty(t, k, dtype=torch.long)
    for j in range(k):
        for i in range(t):
            slot[i, j] = used[int(x[i, j])]
            used[int(x[i, j])] += 1
    return slot, slot < c


def _priority_offsets(x, e, cf):
    t, k = x.shape
    before = torch.zeros(e, dtype=torch.long)  # assignments of the earlier choices per expert
    slots = []
    for j in range(k):
        onehot = torch.nn.functional.one_hot(x[:, j], e)
        slots.append(((onehot.cumsum(0) - 1 + before) * onehot).sum(-1))
        before += onehot.sum(0)
    slot = torch.stack(slots, 1)
    return slot, slot < -(-cf * t * k // e)


@pytest.mark.parametrize("answer", [_p(), _priority_loop, _priority_offsets])
def test_right_priority_passes(answer, capsys):
    check_priority(answer)
    assert "PASSED" in capsys.readouterr().out


@pytest.fixture(scope="module")
def priority_messages():
    return catalogue_messages(check_priority, PRIORITY_MISTAKES)


@pytest.mark.parametrize("mistake", PRIORITY_MISTAKES, ids=lambda m: m.name)
def test_each_priority_mistake_is_named(mistake, priority_messages):
    assert names_mistake(mistake, priority_messages[mistake.name]) is None


def test_catalogues_have_at_least_eight():
    assert min(len(DISPATCH_MISTAKES), len(AUX_MISTAKES), len(PRIORITY_MISTAKES)) >= 8
