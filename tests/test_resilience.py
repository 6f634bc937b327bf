"""Lesson 18's universal checkpoint: saved on one layout, loaded on another (ZeRO-1 on 4 ranks
-> FSDP on 2 and one process, tp 4 -> tp 2 and one process), equal to the full tensors; the
same layout resumes bit for bit; a checkpoint that cannot serve a layout, or whose bytes
changed, is refused before anything changes; each rank reads only what it needs."""

import dataclasses
import io
import os
import pickle
import re
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex

import minidist
from minidist.checkpoint_files import CheckpointError
from minidist.data import shard_batch
from minidist.data_parallel.fixture import build
from minidist.fsdp import FullyShardedDataParallel
from minidist.fsdp.checkpoint_safe import write_checksums
from minidist.fsdp.fixture import UNITS
from minidist.megatron import TensorParallelGPT
from minidist.megatron.fixture import build_dense
from minidist.pieces import Piece
from minidist.resilience import CheckpointLayoutError, TrainingState, load, save
from minidist.resilience.chunks import flat_range_boxes, piece_chunks
from minidist.resilience.lesson_pieces import (
    fsdp_pieces,
    materialize_optimizer_state,
    module_pieces,
    tensor_parallel_pieces,
    zero_pieces,
)
from minidist.resilience.universal import FORMAT
from minidist.training import make_optimizer, max_abs_diff, train
from minidist.zero import ZeroDataParallel
from minidist.zero.fixture import ADAM

# Loading copies bytes: right after a load the full tensors are equal, bit for bit. Training
# on after a change of layout sums gradients in another order (float32): as in
# tests/test_checkpoint.py, Adam's ±lr steps keep near-cancelling gradients' relative
# error, so parameters agree within 1e-4 (a lost moment or step moves them by ~lr = 1e-2);
# tensor parallelism with SGD + momentum within the megatron tests' 1e-5.
ADAM_TOL, TP_TOL = 1e-4, 1e-5
SAVED_AT = 3


# -- rectangles of a flat range: pure -----------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=0, max_size=4), st.data())
def test_a_flat_range_is_the_rectangles_it_fills_in_order(sizes, data):
    numel = 1
    for s in sizes:
        numel *= s
    lo = data.draw(st.integers(0, numel))
    hi = data.draw(st.integers(lo, numel))
    whole = torch.arange(numel).view(sizes)
    boxes = flat_range_boxes(tuple(sizes), lo, hi)
    got = [whole[tuple(slice(o, o + n) for o, n in zip(off, sz))].reshape(-1) for off, sz in boxes]
    expected = torch.arange(lo, hi)
    assert torch.equal(torch.cat(got) if got else expected[:0], expected)
    assert len(boxes) <= max(1, 2 * len(sizes) - 1)


def test_a_piece_inside_a_box_maps_to_global_rectangles():
    full = torch.arange(6 * 8.0).view(6, 8)
    box = full[1:5, 2:7]  # a box of (4, 5) at (1, 2)
    flat = box.reshape(-1)[3:17].clone()  # a flat range of it
    piece = Piece("w", (6, 8), (1, 2), (4, 5), (3, 17), flat)
    for c in piece_chunks(piece):
        rect = full[tuple(slice(o, o + n) for o, n in zip(c.offsets, c.sizes))]
        assert torch.equal(c.tensor, rect)


# -- rank functions -----------------------------------------------------------------------------
def zero_run(path, steps_after=0):
    """ZeRO-1 on this world: SAVED_AT steps, save, `steps_after` more; the full parameters."""
    rank, world = dist.get_rank(), dist.get_world_size()
    model, batches, loss_fn = build("gpt")
    zero = ZeroDataParallel(model, stage=1, bucket_cap_mb=1e-3, **ADAM)
    local = [shard_batch(b, rank, world) for b in batches]
    train(zero, local[:SAVED_AT], loss_fn, zero.optimizer)
    save(
        path,
        zero_pieces(zero),
        TrainingState(step=SAVED_AT, samples=8 * SAVED_AT),
        {"zero": 1, "dp": world},
    )
    saved = {k: v.clone() for k, v in zero.full_parameters().items()}
    train(zero, local[SAVED_AT : SAVED_AT + steps_after], loss_fn, zero.optimizer)
    return saved, zero.full_parameters()


def fsdp_resume(path, steps_after=0, seed=1):
    """A differently initialised FSDP model on this world, loaded, `steps_after` more."""
    rank, world = dist.get_rank(), dist.get_world_size()
    model, batches, loss_fn = build("gpt", seed=seed)
    fsdp = FullyShardedDataParallel(model, wrap=UNITS["gpt"])
    opt = torch.optim.Adam(fsdp.sharded_parameters(), **ADAM)
    materialize_optimizer_state(opt)
    report = load(path, fsdp_pieces(fsdp, opt), {"fsdp": 1, "dp": world})
    loaded = {k: v.clone() for k, v in fsdp.full_parameters().items()}
    _, batches, _ = build("gpt")
    start = report.state.samples // 8  # the global sample index -> the next global batch
    local = [shard_batch(b, rank, world) for b in batches[start : start + steps_after]]
    train(fsdp, local, loss_fn, opt)
    return loaded, fsdp.full_parameters(), report


def one_process_load(path, optimizer="adam", **sizes):
    """The plain GPT and its optimizer in one process, loaded: its state dict and the
    optimizer's first state tensor per parameter (Adam's exp_avg, SGD's momentum)."""
    model, _, _ = build("gpt", seed=2, **sizes)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, **ADAM) if optimizer == "adam" else make_optimizer(params)
    materialize_optimizer_state(opt)
    report = load(path, module_pieces(model, opt), {"one process": 1})
    key = "exp_avg" if optimizer == "adam" else "momentum_buffer"
    moments = {n: opt.state[p][key].clone() for n, p in model.named_parameters() if p.requires_grad}
    return dict(model.state_dict()), moments, report


def fsdp_same_layout(path, resume: bool):
    """FSDP on 2 ranks, 5 steps; with `resume` saved after 3 and the rest run by a new model."""
    rank, world = dist.get_rank(), dist.get_world_size()
    model, batches, loss_fn = build("gpt")
    fsdp = FullyShardedDataParallel(model, wrap=UNITS["gpt"])
    opt = torch.optim.Adam(fsdp.sharded_parameters(), **ADAM)
    local = [shard_batch(b, rank, world) for b in batches]
    first = train(fsdp, local[:SAVED_AT], loss_fn, opt)
    if resume:
        torch.manual_seed(1234 + rank)  # the streams the checkpoint keeps
        save(
            path,
            fsdp_pieces(fsdp, opt),
            TrainingState(SAVED_AT, 8 * SAVED_AT, rng=minidist.resilience.capture_rng()),
            {"fsdp": 2},
        )
        model, _, _ = build("gpt", seed=7)
        fsdp = FullyShardedDataParallel(model, wrap=UNITS["gpt"])
        opt = torch.optim.Adam(fsdp.sharded_parameters(), **ADAM)
        materialize_optimizer_state(opt)
        torch.manual_seed(99)
        report = load(path, fsdp_pieces(fsdp, opt), {"fsdp": 2})
        assert report.rng_restored
        minidist.resilience.restore_rng(report.state.rng)
    else:
        torch.manual_seed(1234 + rank)
    draw = torch.rand(3)
    rest = train(fsdp, local[SAVED_AT:], loss_fn, opt)
    return first.losses + rest.losses, fsdp.full_parameters(), draw


def streams_on_another_layout(path):
    """2 ranks save their random streams under {"fsdp": 2}; loaded back under the same layout
    and under another one of the same world size."""
    rank = dist.get_rank()
    model, _, _ = build("gpt")
    fsdp = FullyShardedDataParallel(model, wrap=UNITS["gpt"])
    opt = torch.optim.Adam(fsdp.sharded_parameters(), **ADAM)
    materialize_optimizer_state(opt)
    torch.manual_seed(1234 + rank)
    streams = TrainingState(1, 8, rng=minidist.resilience.capture_rng())
    save(path, fsdp_pieces(fsdp, opt), streams, {"fsdp": 2})
    same = load(path, fsdp_pieces(fsdp, opt), {"fsdp": 2})
    other = load(path, fsdp_pieces(fsdp, opt), {"zero": 2})
    return same.rng_restored, sorted(same.state.rng), other.rng_restored, other.state.rng


def test_random_streams_come_back_only_on_the_layout_that_saved_them(tmp_path):
    """A rank's streams belong to its place in the saved layout: another layout of as many
    ranks gets none (its rank r is another shard of another grid), not rank r's."""
    for same, names, other, streams in minidist.launch(
        streams_on_another_layout, 2, tmp_path / "ck"
    ):
        assert same and names
        assert not other and streams == {}


# -- resharding ---------------------------------------------------------------------------------
def test_zero1_on_4_ranks_resumes_as_fsdp_on_2_and_in_one_process(tmp_path):
    path = tmp_path / "ck"
    runs = minidist.launch(zero_run, 4, path, 2)
    saved, uninterrupted = runs[0]
    resumed = minidist.launch(fsdp_resume, 2, path, 2)
    for loaded, after, report in resumed:
        assert loaded.keys() == saved.keys()
        assert all(torch.equal(loaded[k], saved[k]) for k in saved)  # copied, bit for bit
        assert max_abs_diff(after, uninterrupted) < ADAM_TOL
        assert report.state == TrainingState(step=SAVED_AT, samples=8 * SAVED_AT)
        assert report.bytes_wanted == report.shard_bytes  # each element asked for once
        assert report.payload_read >= report.bytes_wanted
    total = sum(f.stat().st_size for f in path.iterdir())
    assert all(r.bytes_read < 0.7 * total for _, _, r in resumed)  # never the whole of it
    state, moments, report = minidist.launch(one_process_load, 1, path)[0]
    assert all(torch.equal(state[k], saved[k]) for k in saved)
    assert report.payload_read == report.bytes_wanted  # one process reads every rectangle
    assert all(m.abs().max() > 0 for m in moments.values())  # Adam's moments came back


def tp_run(path, steps_after=0):
    model, batches, _ = build_dense()
    tp = TensorParallelGPT(model, None)
    opt = make_optimizer(tp.parameters())
    train(tp, batches[:SAVED_AT], tp.loss, opt)
    save(
        path,
        tensor_parallel_pieces(tp.module, opt),
        TrainingState(step=SAVED_AT),
        {"tp": dist.get_world_size()},
    )
    saved = {k: v.clone() for k, v in tp.full_parameters().items()}
    train(tp, batches[SAVED_AT : SAVED_AT + steps_after], tp.loss, opt)
    return saved, tp.full_parameters()


def tp_resume(path, steps_after=0):
    model, batches, _ = build_dense(seed=3)
    tp = TensorParallelGPT(model, None)
    opt = make_optimizer(tp.parameters())
    materialize_optimizer_state(opt)
    load(path, tensor_parallel_pieces(tp.module, opt), {"tp": dist.get_world_size()})
    loaded = {k: v.clone() for k, v in tp.full_parameters().items()}
    _, batches, _ = build_dense()
    train(tp, batches[SAVED_AT : SAVED_AT + steps_after], tp.loss, opt)
    return loaded, tp.full_parameters()


def test_tensor_parallel_4_resumes_on_tp_2_and_in_one_process(tmp_path):
    path = tmp_path / "ck"
    saved, uninterrupted = minidist.launch(tp_run, 4, path, 2)[0]  # vocab 30: padded at 4
    loaded, after = minidist.launch(tp_resume, 2, path, 2)[0]
    assert all(torch.equal(loaded[k], saved[k]) for k in saved)
    assert max_abs_diff(after, uninterrupted) < TP_TOL
    state, moments, _ = minidist.launch(one_process_load, 1, path, "sgd", heads=4)[0]
    assert all(torch.equal(state[k], saved[k]) for k in saved)
    assert all(m.abs().max() > 0 for m in moments.values())


def test_the_same_layout_resumes_bit_for_bit(tmp_path):
    straight = minidist.launch(fsdp_same_layout, 2, tmp_path / "a", False)
    resumed = minidist.launch(fsdp_same_layout, 2, tmp_path / "b", True)
    for (l1, p1, d1), (l2, p2, d2) in zip(straight, resumed):
        assert l1 == l2  # every loss, to the last bit
        assert all(torch.equal(p1[k], p2[k]) for k in p1)
        assert torch.equal(d1, d2)  # the random streams went on where they stopped


# -- refusals before anything changes -------------------------------------------------------------
def one_process_save(path, **sizes):
    model, batches, loss_fn = build("gpt", **sizes)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], **ADAM)
    train(model, batches[:1], loss_fn, opt)
    save(path, module_pieces(model, opt), TrainingState(step=1, samples=8), {"one process": 1})


def attempt_load(path, **sizes):
    """FSDP on this world with `sizes`: the error a load raises, and whether nothing changed."""
    model, _, _ = build("gpt", seed=5, **sizes)
    fsdp = FullyShardedDataParallel(model, wrap=UNITS["gpt"])
    opt = torch.optim.Adam(fsdp.sharded_parameters(), **ADAM)
    materialize_optimizer_state(opt)
    pieces = fsdp_pieces(fsdp, opt)
    before = [p.tensor.clone() for p in pieces]
    try:
        load(path, pieces, {"fsdp": dist.get_world_size()})
        error = None
    except (CheckpointLayoutError, CheckpointError) as e:
        error = e
    return error, all(torch.equal(b, p.tensor) for b, p in zip(before, pieces))


@pytest.mark.parametrize(
    "sizes, words",
    [
        (dict(layers=3), r"has 2 layers, the model 3.*blocks\.2\.\S+ is not in the checkpoint"),
        (dict(hidden=64), r"qkv\.weight is \(96, 32\) in the checkpoint, \(192, 64\) here"),
        (dict(layers=1), r"has 2 layers, the model 1.*tensors no rank loads: \['blocks\.1\."),
    ],
)
def test_a_checkpoint_that_cannot_serve_the_layout_is_refused_untouched(tmp_path, sizes, words):
    minidist.launch(one_process_save, 1, tmp_path / "ck")
    for error, untouched in minidist.launch(attempt_load, 2, tmp_path / "ck", **sizes):
        assert isinstance(error, CheckpointLayoutError)
        assert untouched
        message = str(error)
        assert "saved by layout {'one process': 1} (1 ranks)" in message
        assert "cannot serve layout {'fsdp': 2} (2 ranks)" in message
        assert re.search(words, message), message


def test_a_changed_byte_is_refused_untouched_naming_the_file(tmp_path):
    path = tmp_path / "ck"
    minidist.launch(one_process_save, 1, path)
    data = path / "__0_0.distcp"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # inside some tensor's bytes: every rank reads some of them
    data.write_bytes(bytes(raw))
    for error, untouched in minidist.launch(attempt_load, 2, path):
        assert isinstance(error, CheckpointError), error
        assert "__0_0.distcp" in str(error) and "checksum" in str(error)
        assert untouched
    (path / "minidist.checksums.json").unlink()  # as a save killed before its last file
    error, untouched = minidist.launch(attempt_load, 1, path)[0]
    assert isinstance(error, CheckpointError) and "not a complete checkpoint" in str(error)


def _forge(path: Path, change) -> None:
    """Rewrite the checkpoint's metadata with `change` and recompute every checksum, as an
    attacker who can write the folder would: only the structural checks are left."""
    meta = pickle.loads((path / ".metadata").read_bytes())  # our own file, in the test
    change(meta)
    (path / ".metadata").write_bytes(pickle.dumps(meta))
    write_checksums(path, FORMAT)


def _half_of(name):
    def change(meta):
        md = meta.state_dict_metadata[name]
        (c,) = md.chunks
        md.chunks[0] = ChunkStorageMetadata(c.offsets, torch.Size([c.sizes[0] // 2, *c.sizes[1:]]))

    return change


def _moved_outside(name):
    def change(meta):
        md = meta.state_dict_metadata[name]
        (c,) = md.chunks
        outside = torch.Size([md.size[0], *c.offsets[1:]])
        md.chunks[0] = ChunkStorageMetadata(outside, c.sizes)
        meta.storage_data[MetadataIndex(name, outside)] = meta.storage_data.pop(
            MetadataIndex(name, c.offsets)
        )

    return change


def _pickled_record(path):
    def change(meta):
        (index,) = [k for k in meta.storage_data if k.fqn == "minidist.record"]
        info = meta.storage_data[index]
        data = path / info.relative_path
        blob = io.BytesIO()
        torch.save(os.getcwd, blob)  # a global: what weights_only refuses to unpickle
        start = data.stat().st_size
        data.write_bytes(data.read_bytes() + blob.getvalue())
        meta.storage_data[index] = dataclasses.replace(
            info, offset=start, length=len(blob.getvalue())
        )

    return change


@pytest.mark.parametrize(
    "forge, words",
    [
        (lambda p: _half_of("tok_emb.weight"), r"tok_emb\.weight has chunks of \d+ elements, not"),
        (lambda p: _moved_outside("tok_emb.weight"), r"tok_emb\.weight has a chunk .* outside"),
        (_pickled_record, r"minidist\.record is not a record this format writes"),
    ],
)
def test_forged_metadata_is_refused_untouched(tmp_path, forge, words):
    """Metadata forged with its checksums recomputed: a rectangle outside its tensor, or
    covering half of it (the rest would be uninitialised memory), and a record that is a
    pickle of a global: a `CheckpointError` before anything changes, as the FSDP format."""
    path = tmp_path / "ck"
    minidist.launch(one_process_save, 1, path)
    _forge(path, forge(path))
    for error, untouched in minidist.launch(attempt_load, 2, path):
        assert isinstance(error, CheckpointError), error
        assert re.search(words, str(error)), error
        assert untouched


def test_save_refuses_what_is_not_a_piece_and_two_owners_of_one_place(tmp_path):
    minidist.launch(_bad_saves, 1, tmp_path / "ck")
    assert not Path(tmp_path / "ck").exists()


def _bad_saves(path):
    w = torch.zeros(4, 4)
    with pytest.raises(TypeError, match="pieces must be minidist.pieces.Piece"):
        save(path, [w])
    twice = [Piece("w", (4, 4), (0, 0), (4, 4), None, w)] * 2
    with pytest.raises(ValueError, match="two owned pieces of w start at"):
        save(path, twice)


# -- bf16 masters ---------------------------------------------------------------------------------
def bf16_save(path):
    model, batches, loss_fn = build("gpt")
    model.to(torch.bfloat16)  # bf16 parameters: the optimizer steps bf16 masters
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], **ADAM)
    train(model, [(x, y) for x, y in batches[:2]], loss_fn, opt)
    save(path, module_pieces(model, opt), TrainingState(step=2), {"bf16": 1})
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def bf16_fsdp_load(path, dtype):
    model, _, _ = build("gpt", seed=4)
    model.to(dtype)
    fsdp = FullyShardedDataParallel(model, wrap=UNITS["gpt"])
    opt = torch.optim.Adam(fsdp.sharded_parameters(), **ADAM)
    materialize_optimizer_state(opt)
    pieces = fsdp_pieces(fsdp, opt)
    try:
        load(path, pieces, {"fsdp": 2, "dtype": str(dtype)})
    except CheckpointLayoutError as e:
        return str(e)
    return fsdp.full_parameters(), {p.tensor.dtype for p in pieces if p.global_shape}


def test_bf16_masters_are_kept_across_a_change_of_layout(tmp_path):
    saved = minidist.launch(bf16_save, 1, tmp_path / "ck")[0]
    loaded, dtypes = minidist.launch(bf16_fsdp_load, 2, tmp_path / "ck", torch.bfloat16)[0]
    assert dtypes == {torch.bfloat16}  # the masters and Adam's moments, as saved
    assert loaded.keys() == saved.keys()
    # (FSDP's comparison contract hands frozen parameters back in float32: compare values)
    assert all(torch.equal(loaded[k].to(saved[k].dtype), saved[k]) for k in saved)
    refused = minidist.launch(bf16_fsdp_load, 2, tmp_path / "ck", torch.float32)[0]
    assert "is torch.bfloat16 in the checkpoint, torch.float32 here" in refused
