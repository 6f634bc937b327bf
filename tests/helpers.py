"""Models, data and losses shared by the equivalence tests: the same on every rank."""

import torch
import torch.nn.functional as F

from minidist.data import CharTokenizer, lm_batches, make_corpus, regression_batches
from minidist.models import GPT, MLP, GPTConfig, MLPConfig, lm_loss

GLOBAL_BATCH = 8
STEPS = 5


def build(name: str, steps: int = STEPS, seed: int = 0):
    """(model, global batches, loss_fn), identical wherever it is called with the same seed."""
    torch.manual_seed(seed)
    if name == "mlp":
        cfg = MLPConfig(in_dim=16, hidden=32, out_dim=4, layers=3)
        model = MLP(cfg)
        model.layers[0].bias.requires_grad_(False)  # a frozen parameter
        batches = regression_batches(steps, GLOBAL_BATCH, cfg.in_dim, cfg.out_dim, seed=seed)
        return model, batches, F.mse_loss
    if name == "gpt":
        text = make_corpus(200, seed=seed)
        tok = CharTokenizer(text)
        cfg = GPTConfig(vocab_size=tok.vocab_size, seq_len=16, layers=2, heads=2, hidden=32)
        model = GPT(cfg)  # lm_head.weight is tok_emb.weight: a tied parameter
        model.ln_f.bias.requires_grad_(False)  # a frozen parameter
        batches = lm_batches(tok.encode(text), steps, GLOBAL_BATCH, cfg.seq_len, seed=seed)
        return model, batches, lm_loss
    raise ValueError(name)
