"""Step 4 of `parallelize` for any decoder model: the model's experts placed over ep (the
course MoE's through lesson 16's `ExpertParallelMoE`; a transformers model's as below).

The seam is the experts module a transformers 5 MoE block calls after its router:
`experts(tokens [T, h], top_k_index [T, k], top_k_weights [T, k]) -> [T, h]`, every
parameter stacked over the E experts (Mixtral's `MixtralExperts`; Qwen-MoE, OLMoE and
DeepSeek-V3 use the same). The router, its softmax, top-k and normalisation stay the
model's. Rank r of the ep group keeps experts [r·E/e, (r+1)·E/e) (each stacked parameter
sliced along its first dimension, `ep_box` naming the slice) and in forward (as lesson 16,
Lepikhin et al. 2020 §2.2):
1. each (token, choice) pair becomes a row, sorted by expert; the counts per expert are
   exchanged (a small all-to-all), then the rows (one all-to-all);
2. the model's own experts forward runs on the rows received, each with its local expert and
   a weight of 1;
3. the rows come back (the reverse all-to-all), are weighted by their gate and summed into
   their token. Backward is the two exchanges reversed.
Gradients: an expert's gradient holds every token of its ep group; the engine sums it over
the ranks holding the same expert. Not composed: experts kept as an `nn.ModuleList` whose
block loops over them itself (transformers 4.x's Mixtral): refused, naming the block.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from .. import comm
from ..expert_parallel.gpt import MoEMLP
from ..expert_parallel.parallel import ExpertParallelMoE, _AllToAll
from ..megatron.sequence import gather_whole_sequence, scatter_to_sequence


def expert_modules(model: nn.Module, experts: int) -> list[tuple[str, nn.Module]]:
    """(name, module) of every experts module: named `experts`, each parameter stacked over
    the `experts` experts."""
    out = []
    for name, module in model.named_modules():
        if name.rpartition(".")[2] != "experts":
            continue
        params = list(module.parameters(recurse=False))
        if isinstance(module, nn.ModuleList) or not params:
            kind = type(module).__name__
            raise ValueError(
                f"parallelize: ep needs experts stacked in one module (as "
                f"transformers 5 keeps them); {name} is {kind}"
            )
        if any(p.shape[0] != experts for p in params):
            raise ValueError(
                f"parallelize: {name}'s parameters are not stacked over the {experts} experts"
            )
        out.append((name, module))
    return out


def _ep_forward(
    self, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    e, per, group = self._ep
    k = top_k_index.shape[-1]
    chosen = top_k_index.reshape(-1)
    order = torch.argsort(chosen, stable=True)  # rows by expert, then token
    token = torch.div(order, k, rounding_mode="floor")
    counts = torch.bincount(chosen, minlength=e * per).view(e, per)
    got = torch.empty_like(counts)
    comm.all_to_all(got, counts.contiguous(), group=group, tag="ep counts")
    send, recv = counts.sum(1).tolist(), got.sum(1).tolist()
    rows = _AllToAll.apply(hidden[token], recv, send, group, "ep dispatch")
    local = torch.arange(per, device=hidden.device).repeat(e)  # by source rank, then expert
    expert = torch.repeat_interleave(local, got.flatten()).unsqueeze(1)
    ones = torch.ones(expert.shape, dtype=hidden.dtype, device=hidden.device)
    done = type(self).__mro__[1].forward(self, rows, expert, ones)  # the model's own experts
    back = _AllToAll.apply(done, send, recv, group, "ep combine")
    gate = top_k_weights.reshape(-1)[order].unsqueeze(1).to(back.dtype)
    return torch.zeros_like(hidden).index_add(0, token, (back * gate).to(hidden.dtype))


def expert_parallel(module: nn.Module, experts: int, group) -> nn.Module:
    """`module` (an experts module) keeping this rank's experts, its forward exchanging the
    rows with the others (in place: its class becomes a subclass whose forward does)."""
    e, r = dist.get_world_size(group), dist.get_rank(group)
    per = experts // e
    for p in module.parameters(recurse=False):
        # the same Parameter keeps its hooks (sequence parallelism's sum over tp)
        p.data = p.data[r * per : (r + 1) * per].clone()
        p.ep_box = (r * per, experts)  # its rows of the stacked experts
    if "num_experts" in vars(module):
        module.num_experts = per
    module._ep = (e, per, group)
    cls = type(module)
    module.__class__ = type(f"ExpertParallel{cls.__name__}", (cls,), {"forward": _ep_forward})
    return module


def sequence_parallel_moe(model: nn.Module, group) -> None:
    """The course MoE under tp with sp (before `apply_tensor_parallel`): each MoE layer
    gathers the whole sequence (`gather_whole_sequence`: backward keeps the rank's block)
    and hands back the rank's block (`scatter_to_sequence`: backward gathers the blocks'
    gradients), so every tp rank routes the same tokens as without sp and computes the same
    gradients; its parameters are marked `tp_whole` (not summed over tp). Two all-gathers of
    s·b·h per MoE layer and micro-batch."""
    for module in model.modules():
        if isinstance(module, MoEMLP):
            module.register_forward_pre_hook(
                lambda m, args: (gather_whole_sequence(args[0], group), *args[1:])
            )
            module.register_forward_hook(lambda m, a, out: scatter_to_sequence(out, group))
            for p in module.parameters():
                p.tp_whole = True


def apply_expert_parallel(
    model: nn.Module,
    experts: int,
    group,
    expert_dp=None,
    world=None,
    pad_to_capacity: bool = False,
) -> int:
    """Every experts module of `model` over `group`, in place; how many. The course MoE's
    (`MoEMLP`) becomes lesson 16's `ExpertParallelMoE` (its router, its exchange, exact or
    padded to capacity), its experts reduced over `expert_dp` within `world` (the ranks
    holding this layer)."""
    course = [m for m in model.modules() if isinstance(m, MoEMLP)]
    for mlp in course:  # the block keeps its MLP slot; the rank's tokens form one group
        mlp.moe = ExpertParallelMoE(mlp.moe, group, expert_dp, pad_to_capacity, world=world)
        mlp.groups = None
    if course:
        return len(course)
    found = expert_modules(model, experts)
    for _, module in found:
        expert_parallel(module, experts, group)
    if not found:
        raise ValueError(f"parallelize: ep found no experts module in {type(model).__name__}")
    return len(found)
