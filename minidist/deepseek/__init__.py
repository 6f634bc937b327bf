"""Lesson 19, how DeepSeek-V3 was trained: latent attention, fine-grained experts balanced
without an auxiliary loss, DualPipe, FP8 (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report",
arXiv:2412.19437).

Each technique is a function on a transformers `DeepseekV3ForCausalLM` (or on lesson 17's
composed model), so the model's own forward runs; the composition is lesson 17's.
"""
