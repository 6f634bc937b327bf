"""The zero-bubble split of a stage's backward (Qi et al. 2024, section 2): B, the stage
input's gradient, which the previous stage waits for; W, the weights', which nobody waits
for and which the schedule places in the bubble.

B back-propagates from the stage's output to its input only, and catches the gradient
arriving at each node where a weight's path joins the input's path (a node prehook); W
back-propagates from those nodes (`GradientEdge`) to the weights. Nothing B ran runs again,
so W runs no collective of lessons 07, 14 and 15 (they lie on the input's path) and no
recomputation of lesson 08. torch's `pipelining/_backward.py` (`stage_backward_input`,
`stage_backward_weight`) splits the same way. A custom autograd Function that takes a
weight and a tensor of the input's path is itself a join: W runs its backward again, so it
must compute only the gradients asked for (lesson 14's `linear_with_sequence_gather` does:
its gather runs in B, its weight gradient in W).
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable

import torch
from torch.autograd.graph import GradientEdge

from ..recompute.checkpoint import retain_recomputed


def backward(out: torch.Tensor, grad, inputs=(), keep: bool = False) -> None:
    """Back-propagate from `out` (its data may have been freed: the node is what counts)."""
    grads = (grad,) if grad is not None else (torch.ones_like(out),)
    torch.autograd.Variable._execution_engine.run_backward(
        (out,), grads, keep, False, tuple(inputs), allow_unreachable=True, accumulate_grad=True
    )


def backward_input(out: torch.Tensor, grad, inp: torch.Tensor, params: list) -> Callable:
    """B: back-propagate from `out` to the stage input `inp` only. Returns W, which computes
    the gradients of `params` from the joins, fed what B sent into them; what W's nodes use
    of a recomputed layer (each Linear's input) B keeps for W, the rest it drops."""
    groups, weight_nodes = _weight_groups(out.grad_fn, _node(inp), params)
    received = {}  # join -> the gradients flowing into it in B
    joins = {join for group_joins, _ in groups for join in group_joins}
    hooks = [join.register_prehook(functools.partial(received.__setitem__, join)) for join in joins]
    with retain_recomputed(weight_nodes):  # what W's nodes use of a recomputed layer
        backward(out, grad, inputs=[inp], keep=True)  # keep: W runs the joins again
    for hook in hooks:
        hook.remove()

    def weights() -> None:
        for joins, group in groups:
            joins = [j for j in joins if j in received]
            edges = [
                (GradientEdge(j, k), g)
                for j in joins
                for k, g in enumerate(received[j])
                if g is not None
            ]
            # a join below another of the group would also get the upper one's share: each
            # gets exactly what it got in B
            clamps = [j.register_prehook(lambda _, g=received[j]: g) for j in joins]
            if edges:
                torch.autograd.backward([e for e, _ in edges], [g for _, g in edges], inputs=group)
            for clamp in clamps:
                clamp.remove()

    return weights


def _node(t: torch.Tensor):
    """The node `t`'s gradient enters: its grad_fn, or a leaf's gradient accumulator."""
    return t.grad_fn or t.view_as(t).grad_fn.next_functions[0][0]


def _weight_groups(root, inp, params: list) -> tuple[list[tuple[set, list]], set]:
    """[(joins, parameters)] and the nodes W runs: for each parameter the first nodes on its
    way up to `root` that also lead down to the input `inp` (through them B passes; below
    them lie the weight gradient's own nodes), parameters sharing a join in one group (a
    weight and its bias)."""
    above = collections.defaultdict(list)  # node -> the nodes whose gradient flows into it
    todo, seen = [root], {root}
    while todo:
        node = todo.pop()
        for below, _ in node.next_functions:
            if below is not None:
                above[below].append(node)
                if below not in seen:
                    seen.add(below)
                    todo.append(below)
    on_input_path, todo = {inp}, [inp]
    while todo:
        for node in above[todo.pop()]:
            if node not in on_input_path:
                on_input_path.add(node)
                todo.append(node)
    groups: list[tuple[set, list]] = []
    weight_nodes = set()
    for p in params:
        joins, todo, seen = set(), [_node(p)], set()
        while todo:  # up from the parameter until the input's path
            for node in above[todo.pop()]:
                if node in on_input_path:
                    joins.add(node)
                elif node not in seen:
                    seen.add(node)
                    todo.append(node)
        weight_nodes |= joins | seen
        if joins:  # none: this micro-batch did not use p (an expert no token chose)
            group = [p]
            for other in [g for g in groups if g[0] & joins]:
                groups.remove(other)
                joins |= other[0]
                group += other[1]
            groups.append((joins, group))
    return groups, weight_nodes
