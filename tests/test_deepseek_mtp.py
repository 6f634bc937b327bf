"""Lesson 19's multi-token prediction of depth 1 (arXiv:2412.19437 §2.2): the edited model's
loss against one computed by hand, and under data parallelism (dp 2) against one process.

Tolerances: the hand computation differs from the module's only in float32 summation order
(1e-5 on a loss of ~5, measured ~1e-7); dp 2 as lesson 17's fp32 ones (losses 1e-5,
parameters 1e-3 after 3 Adam steps at lr 1e-2).
"""

import hf_models
import pytest
import torch
import torch.nn.functional as F
from worlds import HUNG_S

import minidist
from minidist.data_parallel.bucketed import BucketedDataParallel
from minidist.deepseek.mtp import add_multi_token_prediction

LAMBDA, LR, STEPS, BATCH, SEQ = 0.3, 1e-2, 3, 8, 16


def _rms(x, weight, eps):
    return weight * (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps))


def _by_hand(model, hidden, ids, labels):
    """Eq. 21-25 with explicit tensors: a hand-made causal mask, the head and embedding read
    from the main model, the cross entropy summed over (row, position) one at a time."""
    mtp, eps = model.mtp, model.config.rms_norm_eps
    s = ids.shape[1]
    emb = model.model.embed_tokens.weight[ids[:, 1:]]
    both = [
        _rms(hidden[:, :-1], mtp.hidden_norm.weight, eps),
        _rms(emb, mtp.embedding_norm.weight, eps),
    ]
    x = torch.cat(both, -1) @ mtp.projection.weight.t()
    pos = torch.arange(s - 1)[None]
    mask = torch.full((s - 1, s - 1), float("-inf")).triu(1)[None, None]
    x = mtp.layer(
        x,
        attention_mask=mask,
        position_ids=pos,
        position_embeddings=model.model.rotary_emb(x, position_ids=pos),
    )
    logits = _rms(x, mtp.norm.weight, eps) @ model.lm_head.weight.t()
    pairs = [(b, i) for b in range(ids.shape[0]) for i in range(s - 2) if labels[b, i + 2] != -100]
    terms = [-F.log_softmax(logits[b, i], -1)[labels[b, i + 2]] for b, i in pairs]
    return torch.stack(terms).mean()


@pytest.mark.parametrize("name", ["llama", "deepseek_v3"])
def test_mtp_loss_equals_hand_computation(name):
    plain = hf_models.build(name)
    model = add_multi_token_prediction(hf_models.build(name), weight=LAMBDA)
    # initialised as the model's own (DeepSeek-V3's fused experts start as torch.empty)
    assert all(p.abs().max() < 1 for p in model.mtp.parameters() if p.dim() > 1)
    ids, labels = hf_models.batches(1, 4, SEQ)[0]
    seen = {}
    model.model.norm.register_forward_pre_hook(lambda m, a: seen.__setitem__("h", a[0]))
    got = model(input_ids=ids, labels=labels).loss
    main = plain(input_ids=ids, labels=labels).loss
    want = main + LAMBDA * _by_hand(model, seen["h"], ids, labels)
    assert got.item() == pytest.approx(want.item(), abs=1e-5)
    assert model(input_ids=ids).loss is None  # no labels: the main model's output only
    got.backward()
    # the MTP module is trained, and through the shared embedding and the trunk the model
    assert all(p.grad is not None for p in model.mtp.parameters())
    main.backward()
    trunk = "model.layers.0.self_attn.o_proj.weight"
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert not torch.allclose(grads[trunk], dict(plain.named_parameters())[trunk].grad)
    keys = [k for k in model.state_dict() if k.startswith("mtp.")]
    assert keys and not any(k.endswith(("embed_tokens.weight", "lm_head.weight")) for k in keys)


def _batches():
    return hf_models.batches(STEPS, BATCH, SEQ, ignore=0.0)  # every rank as many targets


def _train(model, batches):
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    losses = []
    for ids, labels in batches:
        opt.zero_grad()
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        if hasattr(model, "finish_gradient_sync"):
            model.finish_gradient_sync()
        opt.step()
        losses.append(loss.item())
    return losses


def _dp2():
    rank = torch.distributed.get_rank()
    model = add_multi_token_prediction(hf_models.build("llama"), weight=LAMBDA)
    rows = slice(rank * BATCH // 2, (rank + 1) * BATCH // 2)
    losses = _train(BucketedDataParallel(model), [(x[rows], y[rows]) for x, y in _batches()])
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


def test_mtp_under_dp2_equals_one_process():
    """Each rank's loss is the mean over its own targets; with as many on every rank, the
    mean of the two (DDP's averaged gradients) is the global batch's."""
    model = add_multi_token_prediction(hf_models.build("llama"), weight=LAMBDA)
    want = _train(model, _batches())
    for losses, params in minidist.launch(_dp2, 2, timeout_s=300, idle_s=HUNG_S):
        rank_mean = sum(losses) / len(losses)
        assert rank_mean == pytest.approx(sum(want) / len(want), rel=0.05)
        for name, p in model.named_parameters():
            assert float((params[name] - p.detach()).abs().max()) < 1e-3, name
