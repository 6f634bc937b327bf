"""DeepSeek-V3's own layout planned from its configuration: parameters, the model states per
GPU, and the all-to-all bytes of node-limited routing (DeepSeek-AI 2024, arXiv:2412.19437,
§3.2 and §4.2; the numbers the paper gives are in `PAPER`).

The layout is the paper's (§3.2): 2,048 H800 GPUs, 8 per node, pipeline 16, experts over 64
GPUs of 8 nodes, ZeRO-1 data parallelism over the rest, no tensor parallelism. Everything is
counted from a transformers `DeepseekV3Config` (its defaults are DeepSeek-V3's sizes), so a
tiny config gives numbers the tests check against the model built on the meta device.

What the paper does not give, and this module therefore assumes (each named where used):
how the 61 layers are split over 16 stages, the micro-batch size, and how tokens spread
over experts (a uniform routing is taken where an expectation needs one). The multi-token
prediction module (14B in the released weights) is not counted: the paper's 671B excludes it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# What the paper states, with where (DeepSeek-AI 2024, arXiv:2412.19437).
PAPER = {
    "total parameters": 671e9,  # abstract, §4.2
    "activated parameters per token": 37e9,  # abstract, §4.2
    "GPUs": 2048,  # §3.1
    "pipeline": 16,  # §3.2
    "expert parallel": 64,  # §3.2, "spanning 8 nodes"
    "nodes a token reaches at most": 4,  # §2.1.2 (M), §3.2.2
    "experts per node a token can select (NVLink/IB bandwidth)": 3.2,  # §3.2.2
    "experts a token could reach at the same cost": 13,  # §3.2.2, 4 nodes × 3.2
}

# Adam's bytes per parameter in the paper's mixed precision (§3.3.3): BF16 weights for the
# GEMMs, FP32 gradients (accumulated over micro-batches) and FP32 master weights, both AdamW
# moments in BF16. The optimizer's part (master + moments) is what ZeRO-1 shards.
WEIGHT_BYTES, GRAD_BYTES, OPTIMIZER_BYTES = 2, 4, 4 + 2 + 2


@dataclass(frozen=True)
class Recipe:
    """DeepSeek-V3's training layout (§3.1-3.2)."""

    gpus: int = 2048
    gpus_per_node: int = 8
    pp: int = 16
    ep: int = 64

    def __post_init__(self):
        for name in ("gpus", "gpus_per_node", "pp", "ep"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"Recipe: {name}={value!r} must be an int >= 1")
        if self.gpus % self.pp or (self.gpus // self.pp) % self.ep:
            raise ValueError(f"Recipe: pp={self.pp} · ep={self.ep} must divide gpus={self.gpus}")

    @property
    def dp(self) -> int:
        """GPUs per stage: each sees its own data; the dense weights are replicated on all."""
        return self.gpus // self.pp

    @property
    def expert_dp(self) -> int:
        """GPUs of a stage holding the same experts (they share the experts' ZeRO-1 group)."""
        return self.dp // self.ep

    @property
    def ep_nodes(self) -> int:
        return math.ceil(self.ep / self.gpus_per_node)


def attention_params(c) -> int:
    """One MLA layer (§2.1.1): the query's down and up projections (or one projection when
    q_lora_rank is None), the joint KV down projection with the shared rotary key, the KV up
    projection, the output, the two latent norms."""
    heads, qk = c.num_attention_heads, c.qk_nope_head_dim + c.qk_rope_head_dim
    h, kv = c.hidden_size, c.kv_lora_rank
    if c.q_lora_rank is None:
        query = h * heads * qk
    else:
        query = h * c.q_lora_rank + c.q_lora_rank + c.q_lora_rank * heads * qk
    keys = h * (kv + c.qk_rope_head_dim) + kv + kv * heads * (c.qk_nope_head_dim + c.v_head_dim)
    return query + keys + heads * c.v_head_dim * h + _attention_bias(c)


def _attention_bias(c) -> int:
    # `attention_bias` adds one to q_a_proj, kv_a_proj_with_mqa and o_proj (transformers'
    # q_proj, used when q_lora_rank is None, never has one)
    if not getattr(c, "attention_bias", False):
        return 0
    return (c.q_lora_rank or 0) + c.kv_lora_rank + c.qk_rope_head_dim + c.hidden_size


def mlp_params(hidden: int, ffn: int) -> int:
    """A SwiGLU MLP: gate, up, down."""
    return 3 * hidden * ffn


def parameter_counts(c) -> dict[str, int]:
    """The model's parameters by part, its total, and those one token activates: the dense
    parts, the shared experts and k of the routed ones per MoE layer."""
    h, layers, dense = c.hidden_size, c.num_hidden_layers, c.first_k_dense_replace
    moe = layers - dense
    expert = mlp_params(h, c.moe_intermediate_size)
    out = {
        "embedding": c.vocab_size * h,
        "head": 0 if c.tie_word_embeddings else c.vocab_size * h,
        "attention": layers * attention_params(c),
        "norms": (2 * layers + 1) * h,
        "dense MLPs": dense * mlp_params(h, c.intermediate_size),
        "shared experts": moe * c.n_shared_experts * expert,
        "routers": moe * c.n_routed_experts * h,  # the gate's weight (its bias is a buffer)
        "routed experts": moe * c.n_routed_experts * expert,
    }
    out["total"] = sum(out.values())
    routed_active = moe * c.num_experts_per_tok * expert
    out["activated per token"] = out["total"] - out["routed experts"] + routed_active
    # an embedding is a lookup, not a GEMM: the paper's 37B matches the count without it
    out["activated per token, without the embedding"] = (
        out["activated per token"] - out["embedding"]
    )
    return out


def layers_per_stage(layers: int, pp: int) -> list[int]:
    """The paper does not say how its 61 layers sit on 16 stages: an even split, the extra
    layers on the first stages (the last stage also holds the head, the first the
    embedding)."""
    return [layers // pp + (r < layers % pp) for r in range(pp)]


def stage_params(c, recipe: Recipe, stage: int) -> dict[str, int]:
    """Parameters one GPU of `stage` holds: its layers' dense parts whole, E/ep routed
    experts of each of its MoE layers, the embedding on stage 0, the head and final norm on
    the last."""
    if not 0 <= stage < recipe.pp:
        raise ValueError(f"stage_params: stage={stage} must be in [0, {recipe.pp})")
    if c.n_routed_experts % recipe.ep:
        raise ValueError(
            f"stage_params: ep={recipe.ep} must divide n_routed_experts={c.n_routed_experts}"
        )
    counts = layers_per_stage(c.num_hidden_layers, recipe.pp)
    first = sum(counts[:stage])
    held = range(first, first + counts[stage])
    h, expert = c.hidden_size, mlp_params(c.hidden_size, c.moe_intermediate_size)
    dense = routed = 0
    for i in held:
        dense += attention_params(c) + 2 * h
        if i < c.first_k_dense_replace:
            dense += mlp_params(h, c.intermediate_size)
        else:
            dense += c.n_shared_experts * expert + c.n_routed_experts * h
            routed += c.n_routed_experts // recipe.ep * expert
    if stage == 0:
        dense += c.vocab_size * h
    if stage == recipe.pp - 1:
        dense += h + (0 if c.tie_word_embeddings else c.vocab_size * h)
    return {"dense": dense, "routed experts": routed, "total": dense + routed}


def model_state_bytes(c, recipe: Recipe, stage: int) -> dict[str, float]:
    """Bytes of model states on one GPU of `stage` under ZeRO-1 (§3.2, §3.3.3): BF16
    weights and FP32 gradients whole; FP32 master weights and BF16 moments sharded over the
    GPUs holding the same parameters, dp for the dense ones, dp/ep for the experts."""
    held = stage_params(c, recipe, stage)
    weights = WEIGHT_BYTES * held["total"]
    grads = GRAD_BYTES * held["total"]
    optimizer = OPTIMIZER_BYTES * (
        held["dense"] / recipe.dp + held["routed experts"] / recipe.expert_dp
    )
    return {
        "weights": weights,
        "gradients": grads,
        "optimizer": optimizer,
        "total": weights + grads + optimizer,
    }


def expected_nodes(experts: int, nodes: int, k: int) -> float:
    """Distinct nodes k experts chosen uniformly without repetition span, E/nodes experts
    per node: nodes · (1 − C(E − E/nodes, k) / C(E, k))."""
    per = experts // nodes
    return nodes * (1 - math.comb(experts - per, k) / math.comb(experts, k))


def dispatch_bytes_per_token(c, nodes_reached: float, scale_block: int = 128) -> float:
    """Bytes one token sends across InfiniBand to dispatch (§3.2.2, §3.3.4): once per node
    reached other than its own (NVLink forwards it to the node's experts), its hidden state
    in FP8 with one FP32 scale per 1×128 tile."""
    h = c.hidden_size
    return nodes_reached * (h + 4 * math.ceil(h / scale_block))


def combine_bytes_per_token(c, nodes_reached: float) -> float:
    """Bytes coming back per token across InfiniBand: the combine stays BF16 (§3.3.4)."""
    return nodes_reached * 2 * c.hidden_size


def remote_nodes(c, recipe: Recipe) -> dict[str, float]:
    """Nodes other than its own that one token's dispatch crosses InfiniBand to, per MoE
    layer: at most M = `topk_group` with node-limited routing (§2.1.2; `n_group` groups, one
    per node), at most min(k, nodes) without; and without, uniform routing's expectation,
    (nodes − 1) · P(a given node is reached) (the token's node is one of the group's)."""
    nodes, k = recipe.ep_nodes, c.num_experts_per_tok
    reached = expected_nodes(c.n_routed_experts, nodes, k)
    return {
        "node-limited, at most": float(
            min(c.topk_group, nodes) if c.n_group > 1 else min(k, nodes)
        ),
        "unlimited, at most": float(min(k, nodes)),
        "unlimited, uniform routing": reached * (nodes - 1) / nodes,
    }


def routing_traffic(c, recipe: Recipe, tokens: int) -> dict[str, tuple[float, float]]:
    """{routing: (dispatch bytes, combine bytes)} a micro-batch of `tokens` tokens sends
    across InfiniBand per MoE layer, for each case of `remote_nodes`."""
    return {
        name: (tokens * dispatch_bytes_per_token(c, n), tokens * combine_bytes_per_token(c, n))
        for name, n in remote_nodes(c, recipe).items()
    }
