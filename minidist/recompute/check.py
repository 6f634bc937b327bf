"""Checkers for the recomputation exercises of lesson 06 (Chen et al. 2016, "Training Deep
Nets with Sublinear Memory Cost", sections 3-4).

1. `check_checkpoint(Checkpoint)`: `Checkpoint` is a `torch.autograd.Function` with
   `forward(ctx, fn, x)`, which returns `fn(x)` keeping only `x` (and the RNG state) for
   backward, and `backward(ctx, grad_output)`, which recomputes `fn` on a detached copy of
   `x` with the RNG state restored, back-propagates `grad_output` through it and returns
   `(None, gradient of x)`. The checker wraps every block of the course GPT,
   `h = Checkpoint.apply(block, h)`, and compares one forward/backward with the same model
   run plainly: without dropout, then with dropout (the masks must be drawn again the same),
   the bytes saved in forward (`SavedActivations`), and the RNG state after backward.
2. `check_segments(peak_bytes, best_segment)`: `peak_bytes(layers, activation, boundary,
   segment)` is Chen et al.'s peak of saved bytes for L layers in recomputed segments of ℓ
   (`segment=None`: no recomputation), `best_segment(layers, activation, boundary)` the ℓ in
   1..L with the smallest peak. Compared with `theory.saved_bytes` and `theory.best_segment`
   on cases where ℓ divides L and where it does not, where M_act = M_in, M_act ≫ M_in and
   M_act ≪ M_in (M_act: the bytes a layer keeps, M_in: its input's).

Each names the likely mistake: RNG state not restored (dropout masks differ), recomputed
under no_grad, the saved input not detached, the wrong input gradient returned, parameters
left without gradients, activations saved anyway, the RNG left rewound; counting only the
boundaries, every segment's activations at once, or L/ℓ without rounding up; √L taken for
the best ℓ whatever a and b are.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..course.check import close, fail, passed
from ..data_parallel.fixture import build
from ..memory import SavedActivations
from . import theory
from .checkpoint import checkpoint
from .fixture import DROPOUT_GPT, embed, gpt_dims

# -- exercise 1: the checkpoint Function ------------------------------------------------------

SEED = 123
LAYERS = DROPOUT_GPT["layers"]


def _run(apply: Callable | None, dropout: float) -> dict:
    """One forward/backward of the course GPT (train mode), every block run through `apply`
    (None: plainly). Returns saved bytes, gradients, the RNG state after backward."""
    model, batches, loss_fn = build("gpt", **{**DROPOUT_GPT, "dropout": dropout})
    model.train()
    x, y = batches[0]
    torch.manual_seed(SEED)
    with SavedActivations(model) as saved:
        h = embed(model, x)
        for block in model.blocks:
            h = apply(block, h) if apply is not None else block(h)
        loss = loss_fn(model.lm_head(model.ln_f(h)), y)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    return dict(saved=saved.bytes, grads=grads, names=names, rng=torch.get_rng_state())


_ERRORS = [
    (
        "does not require grad and does not have a grad_fn",
        "backward failed: the recomputed output does not require grad. Autograd runs "
        "backward with grad mode off, so a recomputation there records no graph: recompute "
        "under `with torch.enable_grad():`.",
    ),
    (
        "backward through the graph a second time",
        "backward failed with 'backward through the graph a second time': the recomputation "
        "used the saved input itself, so back-propagating through it ran on into the blocks "
        "before (whose graphs are then gone). Recompute from a detached copy, "
        "`x = x.detach().requires_grad_(True)`: the inner backward stops at it, and the "
        "outer backward carries its gradient on.",
    ),
    (
        "incorrect number of gradients",
        "backward must return one gradient per argument of forward, in order: forward(ctx, "
        "fn, x) takes fn and x, so return (None, gradient of x).",
    ),
    (
        "differentiated Tensors does not require grad",
        "torch.autograd.grad was asked for the gradient of an input that does not require "
        "grad: detach the saved input and call requires_grad_(True) on it before recomputing.",
    ),
    (
        "can be implicitly created only for scalar outputs",
        "backward(y) on the recomputed output needs the gradient arriving from above: "
        "torch.autograd.backward(y, grad_output).",
    ),
]


def _call(apply: Callable, dropout: float) -> dict:
    try:
        return _run(apply, dropout)
    except RuntimeError as exc:
        for needle, message in _ERRORS:
            if needle in str(exc):
                fail(message)
        raise


def _block_of(name: str) -> int | None:
    parts = name.split(".")
    return int(parts[1]) if parts[0] == "blocks" else None


def _diagnose_grads(got: dict, ref: dict, names: list[str]) -> str | None:
    """What is wrong with the gradients of a run through the learner's Function."""
    wrong = [n for n in names if n not in got or not close(got[n], ref[n])]
    if not wrong:
        return None
    in_blocks = [n for n in names if _block_of(n) is not None]
    if all(n not in got for n in in_blocks):
        return (
            "the parameters inside the blocks got no gradient (grad is None), the rest did: "
            "torch.autograd.grad(y, x, grad_output) returns the input's gradient only. Use "
            "torch.autograd.backward(y, grad_output): it fills the .grad of every parameter "
            "fn used, then return x.grad."
        )
    last = [n for n in in_blocks if _block_of(n) == LAYERS - 1]
    earlier = [n for n in in_blocks if _block_of(n) < LAYERS - 1]
    if not any(n in wrong for n in last):
        silent = all(n not in got or not got[n].any() for n in earlier)
        if silent:
            return (
                f"block {LAYERS - 1}, the last, has the right gradients but blocks 0 to "
                f"{LAYERS - 2} got none (zero): the gradient you return for the input is None "
                "(x.grad stays None unless the detached input requires grad: "
                "x = x.detach().requires_grad_(True)), so nothing flows on to the blocks before."
            )
        return (
            f"block {LAYERS - 1}, the last, has the right gradients but every gradient before "
            "it is wrong: the gradient you return for the input is not the input's gradient. "
            "Return x.grad of the detached input you recomputed from (grad_output is the "
            "gradient of the output, not of the input)."
        )
    worst = max(wrong, key=lambda n: float((got[n] - ref[n]).abs().max()) if n in got else 0)
    return (
        f"the gradients differ from running the blocks without recomputation ({len(wrong)} "
        f"tensors, e.g. {worst}): recompute fn on the detached input, back-propagate "
        "grad_output through it, return (None, x.grad)."
    )


def check_checkpoint(function: type) -> None:
    """Run the course GPT with every block through `function.apply(block, h)`."""
    apply = function.apply
    plain = _run(None, 0.0)
    mine = _call(apply, 0.0)
    problem = _diagnose_grads(mine["grads"], plain["grads"], plain["names"])
    if problem:
        fail(f"without dropout: {problem}")
    expected = _run(lambda block, h: checkpoint(block, h), 0.0)["saved"]
    dims = gpt_dims(**DROPOUT_GPT)
    boundary = theory.boundary_bytes(dims["seq"], dims["batch"], dims["hidden"])
    kept, everything = mine["saved"], plain["saved"]
    if kept >= everything:
        fail(
            f"the gradients are right, but forward saved {kept} bytes for backward, as much as "
            f"without recomputation ({everything}): your forward kept the blocks' graphs. Run "
            "fn under torch.no_grad() in forward (a Function's forward already does) and save "
            "only its input, ctx.save_for_backward(x); backward recomputes the rest."
        )
    if kept > expected:
        fail(
            f"the gradients are right, but forward saved {kept} bytes, {kept - expected} more "
            f"than the {LAYERS} block inputs ({LAYERS}·{boundary} B) and what the embeddings, "
            "final norm, head and loss keep: save only x."
        )
    if kept < expected:
        fail(
            f"the gradients are right, but autograd saw {expected - kept} bytes fewer than the "
            f"{LAYERS} block inputs: you kept x as an attribute of ctx. Keep it with "
            "ctx.save_for_backward(x) (read back as ctx.saved_tensors): autograd then checks "
            "that nothing modified it in place, and saved-tensor hooks (CPU offload of "
            "activations, this checker) see it."
        )
    plain = _run(None, DROPOUT_GPT["dropout"])
    mine = _call(apply, DROPOUT_GPT["dropout"])
    if _diagnose_grads(mine["grads"], plain["grads"], plain["names"]):
        fail(
            f"without dropout the gradients are right, with dropout ({DROPOUT_GPT['dropout']} "
            "inside attention) they differ: the recomputation drew other dropout masks than "
            "forward did. Save the RNG state in forward (torch.get_rng_state()) and restore "
            "it before recomputing (torch.set_rng_state), inside torch.random.fork_rng()."
        )
    if not torch.equal(mine["rng"], plain["rng"]):
        fail(
            "the gradients are right, but after backward the random number generator is "
            "where block 1's forward began, not where the forward ended: backward recomputes "
            "block 0 last, after setting the generator back to where block 0's forward began, "
            "and its dropout draws leave it at block 1's start. The next dropout masks would "
            "differ from training without recomputation. Restore the state inside `with "
            "torch.random.fork_rng():`, which puts the generator back when it ends."
        )
    passed(
        f"Checkpoint gives the gradients of the plain model, dropout included; with dropout "
        f"{DROPOUT_GPT['dropout']} forward saves {mine['saved']} bytes instead of "
        f"{plain['saved']} ({kept} instead of {everything} without dropout): the {LAYERS} "
        f"blocks keep only their {boundary}-byte inputs (the embeddings, final norm, head and "
        f"loss the other {mine['saved'] - LAYERS * boundary})"
    )


# -- exercise 2: choose the segments -------------------------------------------------------------

COURSE_A, COURSE_B = 313344, 16384  # the course GPT's block with dropout, and its input
# (layers, activation M_act, boundary M_in): M_act = M_in, uneven segments, M_act ≫ M_in, ≪
SEGMENT_CASES = [
    (16, 100, 100),
    (64, 1, 1),
    (10, 20, 20),
    (10, 5, 20),
    (9, 50, 1),
    (12, 1, 50),
    (16, COURSE_A, COURSE_B),
]


def _peak_mistake(got, layers: int, a: int, b: int, k: int | None) -> str | None:
    want = theory.saved_bytes(layers, a, b, k)["peak"]
    if got == want:
        return None
    where = f"peak_bytes({layers}, activation={a}, boundary={b}, segment={k})"
    if k is None:
        return (
            f"{where} returned {got}: without recomputation every layer keeps its activations "
            f"until backward reaches it, L·M_act = {want}."
        )
    m = math.ceil(layers / k)
    if got == m * b:
        return (
            f"{where} returned {got} = ⌈L/ℓ⌉·M_in, the segment inputs forward keeps: only the "
            "boundaries. During backward each segment is recomputed, and its ℓ·M_act bytes of "
            "activations are alive at once on top of the boundaries: ⌈L/ℓ⌉·M_in + ℓ·M_act = "
            f"{want}."
        )
    if got == min(k, layers) * a:
        return (
            f"{where} returned {got} = ℓ·M_act, one recomputed segment: the ⌈L/ℓ⌉ = {m} segment "
            f"inputs stay saved meanwhile, ⌈L/ℓ⌉·M_in + ℓ·M_act = {want}."
        )
    if got == m * b + layers * a:
        return (
            f"{where} returned {got} = ⌈L/ℓ⌉·M_in + L·M_act: backward recomputes one segment at a "
            f"time and frees it before the next, so only ℓ·M_act are alive at once: {want}."
        )
    if got in (layers / k * b + k * a, layers // k * b + k * a) and layers % k:
        return (
            f"{where} returned {got}: {layers} layers in segments of {k} make ⌈{layers}/{k}⌉ = "
            f"{m} segments (the last one shorter), each keeping its input: {want}."
        )
    return f"{where} returned {got}; Chen et al.'s peak is ⌈L/ℓ⌉·M_in + ℓ·M_act = {want}."


def check_segments(peak_bytes: Callable, best_segment: Callable) -> None:
    """Compare `peak_bytes` and `best_segment` with Chen et al.'s count (`theory.py`)."""
    for layers, a, b in SEGMENT_CASES:
        for k in [None, *range(1, layers + 1)]:
            problem = _peak_mistake(peak_bytes(layers, a, b, k), layers, a, b, k)
            if problem:
                fail(problem)
    for layers, a, b in SEGMENT_CASES:
        peaks = {k: theory.saved_bytes(layers, a, b, k)["peak"] for k in range(1, layers + 1)}
        best = min(peaks.values())
        got = best_segment(layers, a, b)
        where = f"best_segment({layers}, activation={a}, boundary={b})"
        if not isinstance(got, int) or not 1 <= got <= layers:
            fail(f"{where} returned {got!r}: return a segment length ℓ, an int in 1..{layers}.")
        if peaks[got] == best:
            continue
        right = [k for k, p in peaks.items() if p == best]
        below_l = min(p for k, p in peaks.items() if k < layers) if layers > 1 else None
        if layers in right and peaks[got] == below_l:
            fail(
                f"{where} returned {got}, but ℓ = L = {layers} (one segment) is best here, "
                f"with a peak of {best}: range(1, L) leaves out L; search 1..L."
            )
        if got in (math.isqrt(layers), round(math.sqrt(layers))):
            fail(
                f"{where} returned {got} ≈ √L, whose peak is {peaks[got]}; ℓ = {right[0]} gives "
                f"{best}. √L is best only when a layer keeps as much as its input (M_act = "
                "M_in); in general the best k is near √(L·M_in/M_act): take the k in 1..L with "
                "the smallest peak_bytes."
            )
        fail(
            f"{where} returned {got}, whose peak is {peaks[got]}; ℓ = {right[0]} gives {best}: "
            "take the k in 1..L with the smallest peak."
        )
    course = theory.best_segment(16, COURSE_A, COURSE_B)
    passed(
        "peak_bytes is ⌈L/ℓ⌉·M_in + ℓ·M_act and best_segment finds its minimum: ℓ = √L = 8 for 64 "
        f"layers that keep as much as their input, but ℓ = {course} for 16 blocks of the course "
        f"GPT (M_act = {COURSE_A} B, {COURSE_A / COURSE_B:.1f} times its {COURSE_B}-byte input)"
    )
