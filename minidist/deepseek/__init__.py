"""Lesson 19, how DeepSeek-V3 was trained: latent attention, fine-grained experts balanced
without an auxiliary loss, DualPipe, FP8 (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report",
arXiv:2412.19437).

Each technique is a function on a transformers `DeepseekV3ForCausalLM` (or on lesson 17's
composed model), so the model's own forward runs; the composition is lesson 17's.
"""

from .fp8 import Fp8Linear, convert_to_fp8_training, fp8_matmul, quantize
from .mla import attention_from_cache, latent_cache
from .moe import count_expert_load, nodes_per_token, sequence_balance_loss, update_routing_bias
from .mtp import add_multi_token_prediction

__all__ = [
    "Fp8Linear",
    "add_multi_token_prediction",
    "attention_from_cache",
    "convert_to_fp8_training",
    "count_expert_load",
    "fp8_matmul",
    "latent_cache",
    "nodes_per_token",
    "quantize",
    "sequence_balance_loss",
    "update_routing_bias",
]
