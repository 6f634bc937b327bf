"""`recompute(layer)` on real Hugging Face models (issue 33): every decoder layer of seven
transformers models (tests/hf_models.py) recomputed, called as a researcher calls them
(`model(ids, attention_mask=..., labels=...)`, the config's use_cache=True, -100 labels),
trains exactly as torch.utils.checkpoint(use_reentrant=False) and as the plain model: same
ops on the same values, so losses and every gradient over 3 Adam steps are equal bit for
bit. Before: the default reentrant form appended K/V to HF's cache a second time in backward
(k_proj/v_proj got zero gradients; a padding mask or Mistral's sliding window crashed)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from hf_models import MODELS, VOCAB, build, decoder_layers
from torch.utils.checkpoint import checkpoint as torch_checkpoint

import minidist
from minidist.data import shard_batch
from minidist.recompute import recompute
from minidist.training import max_abs_diff

ADAM = dict(lr=1e-2)
# Under DDP/FSDP against one process: float32, summation order only (the batch split over 2
# ranks, each half holding as many -100 labels): the first step's gradients (same
# parameters) within 1e-6; after 3 Adam steps, parameters within 1e-4.
GRAD_TOL, PARAM_TOL = 1e-6, 1e-4


def _batches(steps: int = 3, batch: int = 8, seq: int = 16, padded: int = 3):
    """(input_ids, labels, attention_mask): every other row's last `padded` tokens are padding
    (label -100, mask 0), so each half of a batch holds as many valid labels."""
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(steps):
        ids = torch.randint(3, VOCAB, (batch, seq), generator=g)
        labels = ids.clone()
        labels[::2, seq - padded :] = -100
        out.append((ids, labels, (labels != -100).long()))
    return out


def _wrap(model, how: str):
    """Every decoder layer plain, under torch's checkpoint (non-reentrant, the cache off, as
    torch's own crashes with it), or recomputed by minidist (the cache left as the model
    passes it)."""
    for layer in decoder_layers(model):
        if how == "torch":
            layer.forward = lambda *a, f=layer.forward, **k: torch_checkpoint(
                f, *a, use_reentrant=False, **k
            )
        elif how != "plain":
            recompute(layer, **({} if how == "default" else {"use_reentrant": how == "reentrant"}))
    return model


def _call(forward, ids, labels, mask, how):
    cache = {"use_cache": False} if how == "torch" else {}
    return forward(ids, attention_mask=mask, labels=labels, **cache).loss


def _steps(model, forward, opt, batches, how, grads_of):
    """Losses and the gradients of every step (not only the last)."""
    losses, grads = [], []
    for ids, labels, mask in batches:
        opt.zero_grad()
        loss = _call(forward, ids, labels, mask, how)
        loss.backward()
        grads.append({n: g.clone() for n, g in grads_of().items()})
        opt.step()
        losses.append(loss.item())
    return losses, grads, {n: p.detach().clone() for n, p in model.named_parameters()}


def one_process(name: str, how: str):
    model = _wrap(build(name), how)
    opt = torch.optim.Adam(model.parameters(), **ADAM)
    return _steps(model, model, opt, _batches(), how, lambda: _grads(model))


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def _same(a, b) -> float:
    """Largest difference between two runs: losses, each step's gradients, final parameters."""
    (la, ga, pa), (lb, gb, pb) = a, b
    diffs = [abs(x - y) for x, y in zip(la, lb, strict=True)]
    diffs += [max_abs_diff(x, y) for x, y in zip(ga, gb, strict=True)]
    return max(*diffs, max_abs_diff(pa, pb))


@pytest.mark.parametrize("name", MODELS)
def test_recompute_on_every_layer_equals_torch_checkpoint_exactly(name):
    """Both forms, and the default (non-reentrant), against torch's checkpoint and plain."""
    theirs = one_process(name, "torch")
    assert _same(one_process(name, "plain"), theirs) == 0.0
    for how in ("default", "non-reentrant", "reentrant"):
        assert _same(one_process(name, how), theirs) == 0.0, how


def test_the_cache_is_left_out_only_while_grad_is_enabled():
    """With grad on, a recomputed layer writes nothing to the cache (HF's own gradient
    checkpointing does the same); under no_grad (generation) it runs as is and fills it."""
    model = _wrap(build("llama"), "default")
    ids, labels, _ = _batches(1)[0]
    out = model(ids, labels=labels, use_cache=True)
    assert out.past_key_values.get_seq_length() == 0
    with torch.no_grad():
        out = model(ids, use_cache=True)
    assert out.past_key_values.get_seq_length() == ids.shape[1]


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_a_cache_holding_earlier_tokens_is_refused(use_reentrant):
    """Dropping a cache that already holds this layer's earlier tokens would change what the
    layer attends to: refused in one line, naming the argument and the way out."""
    model = build("llama")
    ids, labels, _ = _batches(1)[0]
    with torch.no_grad():
        past = model(ids[:, :4], use_cache=True).past_key_values
    for layer in decoder_layers(model):
        recompute(layer, use_reentrant=use_reentrant)
    with pytest.raises(ValueError, match=r"cache= holds 4 earlier tokens.*use_cache=False"):
        model(ids[:, 4:], labels=labels[:, 4:], past_key_values=past)


# -- under minidist's DDP and FSDP, 2 ranks ------------------------------------------------------
def on_rank(name: str, wrapper: str, how: str):
    from minidist.data_parallel import BucketedDataParallel
    from minidist.fsdp import FullyShardedDataParallel

    rank, world = dist.get_rank(), dist.get_world_size()
    model = _wrap(build(name), how)
    if wrapper == "ddp":
        par = BucketedDataParallel(model)
        opt = torch.optim.Adam(model.parameters(), **ADAM)
    else:
        layers = decoder_layers(model)
        par = FullyShardedDataParallel(model, wrap=lambda m: any(m is la for la in layers))
        opt = torch.optim.Adam(par.sharded_parameters(), **ADAM)

    def grads():
        par.finish_gradient_sync()
        return par.full_grads()

    local = [tuple(shard_batch(b, rank, world)) for b in _batches()]
    losses, step_grads, _ = _steps(model, par, opt, local, how, grads)
    return losses, step_grads, par.full_parameters()


@pytest.mark.parametrize("wrapper", ["ddp", "fsdp"])
@pytest.mark.parametrize("name", ["llama", "gpt2", "mixtral"])
def test_recompute_under_ddp_and_fsdp_equals_torch_checkpoint(name, wrapper):
    """On each rank, minidist's recompute (both forms) equals torch's checkpoint under the
    same wrapper bit for bit; the mean of the ranks' losses and the gradients equal one
    process to summation order (GPT-2 under FSDP with the reentrant form crashed before)."""
    ref = one_process(name, "plain")
    runs = {
        how: minidist.launch(on_rank, 2, name, wrapper, how)
        for how in ("torch", "default", "reentrant")
    }
    for how in ("default", "reentrant"):
        for ours, theirs in zip(runs[how], runs["torch"]):
            assert _same(ours, theirs) == 0.0, how
    for _, grads, params in runs["default"]:
        assert max_abs_diff(grads[0], ref[1][0]) < GRAD_TOL  # same parameters
        assert max_abs_diff(params, ref[2]) < PARAM_TOL
    mean = [sum(r[0][i] for r in runs["default"]) / 2 for i in range(3)]
    assert max(abs(a - b) for a, b in zip(mean, ref[0])) < 1e-5
