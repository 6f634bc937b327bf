"""Real transformers models from tiny configs (random weights, nothing downloaded).

Each has a feature the composition must keep: GQA (Llama), biases (Qwen2), a sliding window
shorter than the sequence (Mistral), experts (Mixtral), a tied head and an embedding scale
with an explicit head_dim (Gemma), fused projections (Phi3), Conv1D and a tied head with
learned positions (GPT-2). Vocabulary 128, hidden 32, 4 layers, 4 heads (2 KV heads).
"""

from __future__ import annotations

import torch

transformers = __import__("pytest").importorskip("transformers")

MODELS = ("llama", "qwen2", "mistral", "mixtral", "gemma", "phi3", "gpt2")
VOCAB = 128


def config(name: str, layers: int = 4, **extra):
    t = transformers
    ids = dict(bos_token_id=1, eos_token_id=2, pad_token_id=0)
    common = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        **ids,
    )
    if name == "gpt2":
        cfg = t.GPT2Config(
            vocab_size=VOCAB,
            n_embd=32,
            n_layer=layers,
            n_head=4,
            n_positions=64,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            **ids,
        )
    else:
        kind = {
            "llama": (t.LlamaConfig, {}),
            "qwen2": (t.Qwen2Config, {}),
            "mistral": (t.MistralConfig, {"sliding_window": 5}),
            "mixtral": (t.MixtralConfig, {"num_local_experts": 4, "num_experts_per_tok": 2}),
            "gemma": (t.GemmaConfig, {"head_dim": 16}),
            "phi3": (t.Phi3Config, {}),
            # routed experts beside a gated shared expert (Qwen1.5-MoE's block)
            "qwen2_moe": (
                t.Qwen2MoeConfig,
                {
                    "num_experts": 4,
                    "num_experts_per_tok": 2,
                    "moe_intermediate_size": 16,
                    "shared_expert_intermediate_size": 32,
                },
            ),
            # latent attention (q and K/V through low-rank latents, a shared rotary key) and
            # DeepSeekMoE (a shared expert beside 4 routed ones, sigmoid affinities)
            "deepseek_v3": (
                t.DeepseekV3Config,
                {
                    "moe_intermediate_size": 16,
                    "num_key_value_heads": 4,
                    "n_routed_experts": 4,
                    "n_shared_experts": 1,
                    "num_experts_per_tok": 2,
                    "n_group": 1,
                    "topk_group": 1,
                    "first_k_dense_replace": 1,
                    "q_lora_rank": 16,
                    "kv_lora_rank": 8,
                    "qk_rope_head_dim": 4,
                    "qk_nope_head_dim": 8,
                    "v_head_dim": 8,
                },
            ),
        }
        cls, own = kind[name]
        cfg = cls(**{**common, **own})
    for k, v in extra.items():
        setattr(cfg, k, v)
    cfg._attn_implementation = "sdpa"
    return cfg


def build(name: str, seed: int = 0, layers: int = 4, **extra):
    """The model `name`, float32, weights drawn from `seed`."""
    torch.manual_seed(seed)
    cfg = config(name, layers, **extra)
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").float()


def batches(steps: int, batch: int, seq: int, seed: int = 0, ignore: float = 0.2):
    """`steps` (input_ids, labels) pairs; a fraction `ignore` of the labels is -100."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        ids = torch.randint(3, VOCAB, (batch, seq), generator=g)
        labels = ids.clone()
        labels[torch.rand(batch, seq, generator=g) < ignore] = -100
        out.append((ids, labels))
    return out


BUILDERS = {name: (lambda seed=0, name=name, **kw: build(name, seed, **kw)) for name in MODELS}


def decoder_layers(model) -> list:
    """The model's decoder layers (`model.model.layers`, GPT-2's `transformer.h`), in order."""
    base = getattr(model, "model", None) or model.transformer
    return list(getattr(base, "layers", None) or base.h)


def qwen2_factory():
    """A `--model hf_models:qwen2_factory` for the trainer: a function of no arguments."""
    return build("qwen2", layers=2)


# transformers imports a model's classes at its first use (1.9 s for these nine, on this
# machine's core). Done once here, in the test process, a world's forked ranks inherit them
# instead of each importing them again. (The random weights drawn leave torch's seed as it was.)
with torch.random.fork_rng():
    for _name in (*MODELS, "qwen2_moe", "deepseek_v3"):
        transformers.AutoModelForCausalLM.from_config(config(_name, layers=1))
