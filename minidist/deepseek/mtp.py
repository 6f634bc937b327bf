"""Multi-token prediction of depth 1 (DeepSeek-V3, arXiv:2412.19437 §2.2, eq. 21-25).

`add_multi_token_prediction(model, weight)` edits a transformers causal LM in place: one MTP
module (`model.mtp`) combines the main model's representation of token i (the last layer's
output, before the final norm) with the embedding of token i + 1 and predicts token i + 2,
through its own decoder layer and the model's SHARED embedding and head. With labels, the
model's loss becomes main + weight · (the MTP module's mean cross entropy), the paper's
λ/D · Σ_k L_MTP^k with D = 1; without labels the output is the main model's alone.

Not done here: depth D > 1 (a chain of modules), the pipeline split (the paper puts the MTP
module with the head on the last stage) and lesson 17's `parallelize` (its stages compute
the loss from the logits, without the MTP term); inference, where the module is dropped or
used for speculative decoding.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class MultiTokenPrediction(nn.Module):
    """h'_i = M [RMSNorm(h_i); RMSNorm(Emb(t_{i+1}))] (eq. 21), one decoder layer of the
    model's own kind (eq. 22), then the shared head after this module's norm (eq. 23; the
    released V3 weights give each MTP module its own `shared_head.norm`)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        cfg, base = model.config, model.model
        d, norm = cfg.hidden_size, type(base.norm)
        self.hidden_norm = norm(d, eps=cfg.rms_norm_eps)
        self.embedding_norm = norm(d, eps=cfg.rms_norm_eps)
        self.projection = nn.Linear(2 * d, d, bias=False)  # M_k, 2d -> d
        self.layer = type(base.layers[-1])(cfg, layer_idx=cfg.num_hidden_layers)
        self.norm = norm(d, eps=cfg.rms_norm_eps)

    def forward(
        self,
        model: nn.Module,
        hidden: torch.Tensor,
        input_ids: torch.Tensor,
        labels: torch.Tensor,
    ) -> torch.Tensor:
        """The mean cross entropy of predicting labels[:, i + 2] at positions i (labels as the
        model takes them, unshifted; -100 ignored)."""
        embedded = model.get_input_embeddings()(input_ids[:, 1:])  # Emb(t_{i+1}), shared
        x = torch.cat([self.hidden_norm(hidden[:, :-1]), self.embedding_norm(embedded)], -1)
        x = self.projection(x)
        positions = torch.arange(x.shape[1], device=x.device)[None]
        rotary = model.model.rotary_emb(x, position_ids=positions)
        # no mask: the attention kernel is causal when given none
        x = self.layer(x, position_ids=positions, position_embeddings=rotary)
        logits = model.get_output_embeddings()(self.norm(x))  # the shared head
        targets = F.pad(labels[:, 2:], (0, 1), value=-100)  # the last position has no t_{i+2}
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=-100)


def add_multi_token_prediction(model: nn.Module, weight: float = 0.3) -> nn.Module:
    """Give the transformers causal LM `model` (Llama-like: `model.model.layers`, `.norm`,
    `.rotary_emb`) a depth-1 MTP module (`model.mtp`) and the loss main + weight · MTP
    (the paper: λ = 0.3 for the first 10T tokens, 0.1 after). Returns `model`."""
    model.mtp = MultiTokenPrediction(model).to(next(model.parameters()).dtype)
    # as the model initialises its own modules (fused experts are made with torch.empty)
    model.mtp.apply(model._init_weights)
    seen: dict[str, torch.Tensor] = {}

    def keep_hidden(module, args):  # the final norm's input: the last layer's output
        seen["hidden"] = args[0]

    model.model.norm.register_forward_pre_hook(keep_hidden)
    main_forward = model.forward

    def forward(
        input_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None, **kwargs
    ):
        out = main_forward(input_ids=input_ids, labels=labels, **kwargs)
        if labels is not None:
            mtp_loss = model.mtp(model, seen.pop("hidden"), input_ids, labels)
            out.loss = out.loss + weight * mtp_loss
        seen.clear()
        return out

    model.forward = forward
    return model
