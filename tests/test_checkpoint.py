"""Sharded checkpoints (DCP): resume on another world or in one process loses nothing; a
checkpoint of another model is refused untouched; an interrupted save never loads."""

import json
import os
import pickle
import re
import shutil
from unittest import mock

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict
from torch.distributed.tensor import Shard

import minidist
from minidist import checkpoint_files, comm
from minidist.checkpoint_files import CHECKSUMS, CheckpointError, file_record, read_json, write_json
from minidist.data import shard_batch
from minidist.data_parallel.fixture import build
from minidist.fsdp import FullyShardedDataParallel, checkpoint
from minidist.fsdp.checkpoint_layout import FORMAT, LAYOUT_KEY
from minidist.fsdp.checkpoint_safe import write_checksums
from minidist.fsdp.fixture import UNITS
from minidist.training import max_abs_diff, train
from minidist.zero import FlatShard, ZeroDataParallel
from minidist.zero.fixture import ADAM, build_args, reference

# As in tests/test_fsdp.py: Adam's ±lr steps keep the relative error of near-cancelling
# gradients (float32 summation order differs between worlds), so parameters within 1e-4; a
# lost optimizer state or step counter moves parameters by ~lr = 1e-2.
PARAM_TOL = 1e-4
SAVED_AT = 3  # steps before the checkpoint; STEPS - SAVED_AT after it


# -- rank functions ----------------------------------------------------------------------------
def wrapped(name: str, kind: str = "fsdp", **options):
    """The fixture's model wrapped on this rank, its optimizer, this rank's batches, loss."""
    rank, world = dist.get_rank(), dist.get_world_size()
    model, batches, loss_fn = build(name, **build_args(name))
    if kind == "fsdp":
        wrapper = FullyShardedDataParallel(model, wrap=UNITS[name], **options)
        opt = torch.optim.Adam(wrapper.sharded_parameters(), **ADAM)
    else:  # ZeRO stage 1 or 2; tiny buckets: one per parameter, the 3-element bias on 4 ranks
        wrapper = ZeroDataParallel(model, stage=int(kind[-1]), bucket_cap_mb=1e-5, **ADAM)
        opt = wrapper.optimizer
    local = [shard_batch(b, rank, world) for b in batches]
    return wrapper, opt, local, loss_fn


def train_save_train(name, path, kind="fsdp", **options):
    """SAVED_AT steps, save, the remaining steps: the uninterrupted run (saving reads only)."""
    wrapper, opt, local, loss_fn = wrapped(name, kind, **options)
    train(wrapper, local[:SAVED_AT], loss_fn, opt)
    checkpoint.save(path, wrapper, opt)
    return train(wrapper, local[SAVED_AT:], loss_fn, opt).params


def load_train(name, path, kind="fsdp"):
    """A fresh model and optimizer on this world, the checkpoint, the remaining steps."""
    wrapper, opt, local, loss_fn = wrapped(name, kind)
    checkpoint.load(path, wrapper, opt)
    return train(wrapper, local[SAVED_AT:], loss_fn, opt).params


def continue_in_one_process(name, path):
    """`load_full` into the plain model and a plain Adam, then the remaining steps."""
    model, batches, loss_fn = build(name, **build_args(name))
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], **ADAM)
    model_state, optim_state = checkpoint.load_full(path)
    assert model_state.keys() == model.state_dict().keys()
    model.load_state_dict(model_state)
    set_optimizer_state_dict(model, opt, optim_state)
    assert all(s["step"] == SAVED_AT for s in opt.state.values())
    return train(model, batches[SAVED_AT:], loss_fn, opt).params


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """GPT checkpoints after 3 steps on 4 and on 2 ranks, the 2-rank run's 5 steps and the
    single-process reference's 5 steps."""
    # first: the reference's Adam imports torch._dynamo (~1 s), which forked ranks inherit
    ref = reference("gpt").params
    root = tmp_path_factory.mktemp("ckpt")
    minidist.launch(train_save_train, 4, "gpt", root / "on4")
    uninterrupted = minidist.launch(train_save_train, 2, "gpt", root / "on2")[0]
    return root, uninterrupted, ref


# -- the layout ----------------------------------------------------------------------------------
def test_flat_chunks_are_torch_chunks_uneven_shard0():
    """FlatShard's valid elements per rank are exactly DTensor's uneven Shard(0) pieces,
    including empty ones when the flat length is below the world size."""
    for world in range(1, 9):
        for numel in range(1, 3 * world + 2):
            for rank in range(world):
                layout = FlatShard([torch.empty(numel)], world, rank)
                size, offset = Shard.local_shard_size_and_offset(numel, world, rank)
                assert checkpoint._valid(layout) == (offset, size)
                assert int(layout.valid().sum()) == size


# -- resume ----------------------------------------------------------------------------------------
def test_resume_on_the_same_world_is_bitwise_the_uninterrupted_run(saved):
    root, uninterrupted, _ = saved
    resumed = minidist.launch(load_train, 2, "gpt", root / "on2")[0]
    assert max_abs_diff(resumed, uninterrupted) == 0.0  # Adam's moments and steps all back


@pytest.mark.parametrize("save_on, load_on", [(4, 2), (2, 4)])
def test_resume_on_another_world_equals_uninterrupted(saved, save_on, load_on):
    root, uninterrupted, ref = saved
    for params in minidist.launch(load_train, load_on, "gpt", root / f"on{save_on}"):
        assert max_abs_diff(params, ref) < PARAM_TOL
        assert max_abs_diff(params, uninterrupted) < PARAM_TOL


@pytest.mark.parametrize("save_on", [4, 2])
def test_load_full_continues_in_one_process(saved, save_on):
    root, _, ref = saved
    model_state, optim_state = checkpoint.load_full(root / f"on{save_on}")
    assert model_state["lm_head.weight"] is model_state["tok_emb.weight"]  # tied, once
    assert optim_state["param_groups"][0]["lr"] == ADAM["lr"]
    params = continue_in_one_process("gpt", root / f"on{save_on}")
    assert max_abs_diff(params, ref) < PARAM_TOL


@pytest.mark.parametrize("stage", [1, 2])
def test_zero_checkpoint_reshards_too(tmp_path, stage):
    """ZeRO buckets: one parameter each, the 3-element bias leaving rank 3 an empty piece."""
    ref = reference("mlp")
    minidist.launch(train_save_train, 4, "mlp", tmp_path / "zero", f"zero{stage}")
    for params in minidist.launch(load_train, 2, "mlp", tmp_path / "zero", f"zero{stage}"):
        assert max_abs_diff(params, ref.params) < PARAM_TOL
    assert max_abs_diff(continue_in_one_process("mlp", tmp_path / "zero"), ref.params) < PARAM_TOL


def test_hybrid_sharded_checkpoint_loads_fully_sharded(saved, tmp_path):
    """Saved on a 2x2 mesh (Replicate, Shard(0)): each chunk written once, loads on 2 ranks."""
    _, _, ref = saved
    minidist.launch(train_save_train, 4, "gpt", tmp_path / "hsdp", hybrid_shard_size=2)
    meta = FileSystemReader(tmp_path / "hsdp").read_metadata().state_dict_metadata
    flat = [md for key, md in meta.items() if key.startswith(("model.flat[", "optim.flat["))]
    flat = [md for md in flat if md.size.numel() > 1]  # not Adam's step counters
    assert len(flat) == 3 * 3  # 3 units: parameters, exp_avg, exp_avg_sq
    for md in flat:  # two pieces (not four), the unpadded length, no padding written
        assert len(md.chunks) == 2 and sum(c.sizes[0] for c in md.chunks) == md.size[0]
    for params in minidist.launch(load_train, 2, "gpt", tmp_path / "hsdp"):
        assert max_abs_diff(params, ref) < PARAM_TOL


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor([1.5]))

    def forward(self, x):
        return x * self.scale


def tiny():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 3), Scaled(), nn.Linear(3, 2))


def tiny_batches():
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(12, 5, generator=g), torch.randn(12, 2, generator=g)) for _ in range(4)]


def tiny_rank(path, steps, load):
    """Units of 8, 1 and 18 elements: on 4 ranks the 1-element unit has 3 empty pieces."""
    rank, world = dist.get_rank(), dist.get_world_size()
    fsdp = FullyShardedDataParallel(tiny(), wrap=lambda m: isinstance(m, (Scaled, nn.Linear)))
    opt = torch.optim.AdamW(fsdp.sharded_parameters(), lr=0.05, weight_decay=0.1)
    if load:
        checkpoint.load(path, fsdp, opt)
    local = [shard_batch(b, rank, world) for b in tiny_batches()[steps]]
    params = train(fsdp, local, nn.functional.mse_loss, opt).params
    if not load:
        checkpoint.save(path, fsdp, opt)
    return params


def test_units_smaller_than_the_world_save_empty_pieces(tmp_path):
    model = tiny()
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)
    ref = train(model, tiny_batches(), nn.functional.mse_loss, opt).params
    minidist.launch(tiny_rank, 4, tmp_path / "tiny", slice(0, 2), False)
    for params in minidist.launch(tiny_rank, 3, tmp_path / "tiny", slice(2, 4), True):
        assert max_abs_diff(params, ref) < PARAM_TOL


# -- refusals ------------------------------------------------------------------------------------
def with_buffer():
    model = build("gpt").model
    model.register_buffer("extra", torch.zeros(3))
    return model


def adam(chunks):
    return torch.optim.Adam(chunks, lr=0.1)


def try_loading_others(path):
    """Load the GPT checkpoint into other models/optimizers; (errors, parameters unchanged)."""
    cases = {
        "wider": (build("gpt", hidden=48).model, UNITS["gpt"], adam),
        "mlp": (build("mlp").model, UNITS["mlp"], adam),
        "one unit": (build("gpt").model, None, adam),
        "buffer": (with_buffer(), UNITS["gpt"], adam),
        "sgd": (build("gpt").model, UNITS["gpt"], lambda c: torch.optim.SGD(c, lr=0.1)),
        "two groups": (
            build("gpt").model,
            UNITS["gpt"],
            lambda c: torch.optim.Adam([{"params": c[:1]}, {"params": c[1:]}], lr=0.1),
        ),
    }
    out = {}
    for case, (model, wrap, make_optimizer) in cases.items():
        fsdp = FullyShardedDataParallel(model, wrap=wrap)
        opt = make_optimizer(fsdp.sharded_parameters())
        before = fsdp.full_parameters()
        try:
            checkpoint.load(path, fsdp, opt)
            out[case] = "loaded"
        except checkpoint.CheckpointMismatchError as e:
            unchanged = max_abs_diff(fsdp.full_parameters(), before) == 0 and not opt.state
            out[case] = (str(e), unchanged, opt.param_groups[0]["lr"])
    return out


def test_a_checkpoint_of_another_model_is_refused_before_anything_changes(saved):
    root, _, _ = saved
    out = minidist.launch(try_loading_others, 2, root / "on4")[0]
    assert all(unchanged and lr == 0.1 for _, unchanged, lr in out.values())
    # units innermost first: blocks.1 is the checkpoint's first unit
    assert out["wider"][0] == (
        "checkpoint does not fit this model: trainable parameter blocks.1.ln1.weight: the "
        "checkpoint has [32] torch.float32, this model has [48] torch.float32"
    )
    assert out["mlp"][0].startswith(
        "checkpoint does not fit this model: trainable parameter layers.2.weight: the "
        "checkpoint has no such parameter, this model has [4, 32] torch.float32"
    )
    assert "flat unit 0 (the same parameters grouped otherwise" in out["one unit"][0]
    buffer = (
        "frozen parameter or buffer extra: the checkpoint has no such entry, this model has [3]"
    )
    assert buffer in out["buffer"][0]
    assert "optimizer class: the checkpoint has Adam, this optimizer has SGD" in out["sgd"][0]
    assert (
        "optimizer param_groups[0] units: the checkpoint has ['flat[blocks.0."
        in (out["two groups"][0])
    )


def test_save_refuses_to_replace_what_is_not_a_checkpoint(tmp_path):
    (tmp_path / "precious").mkdir()
    with pytest.raises(minidist.RankFailedError, match="not a checkpoint .* refusing"):
        minidist.launch(train_save_train, 1, "mlp", tmp_path / "precious")
    assert (tmp_path / "precious").is_dir()


# -- interrupted saves ---------------------------------------------------------------------------
def fail_on_rank1(how: str):
    """Make rank 1's next save fail: raise or die while writing, or die before the rename."""
    if dist.get_rank() != 1:
        return
    write = FileSystemWriter.write_data

    def broken_write(self, plan, planner):
        if how == "raise":
            raise OSError("disk full (injected)")
        write(self, plan, planner).wait()  # its file is written, its result never sent
        os._exit(1)

    if how in ("raise", "kill-writing"):
        mock.patch.object(FileSystemWriter, "write_data", broken_write).start()
    else:  # killed between DCP's completion and the rename
        barrier, calls = comm.barrier, []

        def dying_barrier(*args, **kwargs):
            calls.append(1)
            if len(calls) == 1:  # the barrier after DCP wrote every file
                os._exit(1)
            return barrier(*args, **kwargs)

        mock.patch.object(comm, "barrier", dying_barrier).start()


def interrupted_rank(root, how):
    """Save twice to `root/ckpt` (the second replaces the first), write down what it holds,
    then a third save that fails on rank 1 (and, when it only raises, one to a new path)."""
    wrapper, opt, local, loss_fn = wrapped("mlp")
    for step in range(2):
        train(wrapper, local[step : step + 1], loss_fn, opt)
        checkpoint.save(root / "ckpt", wrapper, opt)
    params = wrapper.full_parameters()
    if dist.get_rank() == 0:
        torch.save(params, root / "expected.pt")
    train(wrapper, local[2:3], loss_fn, opt)
    fail_on_rank1(how)
    errors = []
    for path in (root / "ckpt", root / "new"):
        try:
            checkpoint.save(path, wrapper, opt)
        except RuntimeError as e:  # only reached when it raised: DCP tells every rank
            errors.append(str(e))
    for path in (root / "new", root / ".new.unfinished"):
        try:
            checkpoint.load(path, wrapper, opt)
        except (FileNotFoundError, ValueError) as e:
            errors.append(str(e))
    return errors


@pytest.mark.parametrize("how", ["raise", "kill-writing", "kill-before-rename"])
def test_an_interrupted_save_never_loads(tmp_path, how):
    if how == "raise":
        errors = minidist.launch(interrupted_rank, 2, tmp_path, how)[0]
        assert all("failed on ranks [1]" in e and "is unchanged" in e for e in errors[:2])
        assert "no checkpoint at" in errors[2] and ".new.unfinished is an unfinished" in errors[2]
        assert "is an unfinished save" in errors[3]
        assert not (tmp_path / "new").exists()
    else:
        with pytest.raises(minidist.RankFailedError, match="rank 1"):
            minidist.launch(interrupted_rank, 2, tmp_path, how)
    unfinished = tmp_path / ".ckpt.unfinished"
    assert unfinished.is_dir()  # the interrupted save's files, never renamed
    with pytest.raises(ValueError, match="is an unfinished save"):
        checkpoint.load_full(unfinished)
    # `ckpt` is still the second complete save, exactly
    expected = torch.load(tmp_path / "expected.pt")
    model_state, optim_state = checkpoint.load_full(tmp_path / "ckpt")
    assert max_abs_diff({n: model_state[n] for n in expected}, expected) == 0.0
    assert all(s["step"] == 2 for s in optim_state["state"].values())
    assert set(os.listdir(tmp_path)) == {".ckpt.unfinished", "ckpt", "expected.pt"} | (
        {".new.unfinished"} if how == "raise" else set()
    )


# -- a checkpoint is data: never run, every byte verified ----------------------------------------
class _Payload:
    """Unpickled, it would create `marker` (what a crafted checkpoint could do)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _copy(saved, tmp_path, name="copy"):
    root, _, _ = saved
    copy = tmp_path / name
    shutil.copytree(root / "on2", copy)
    return copy


def _reseal(path):
    """Rewrite the checksums to match the tampered files: an attacker can do that too."""
    write_checksums(path, FORMAT)


def test_a_crafted_checkpoint_never_runs_its_payload(saved, tmp_path):
    marker = tmp_path / "ran"
    crafted = _copy(saved, tmp_path)
    (crafted / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    write_json(crafted / CHECKSUMS, {"files": {".metadata": file_record(crafted / ".metadata")}})
    with pytest.raises(CheckpointError, match=r"refers to io\.open.*refused unread"):
        checkpoint.load_full(crafted)
    assert not marker.exists()
    # a crafted non-tensor entry: DCP itself would torch.load it with weights_only=False (an
    # object where the layout wants a tensor, `model.extra`, is refused before any read; a
    # param group's hyperparameter is an object, read by the safe planner)
    layout = {"format": FORMAT, "units": [], "aliases": {}, "optimizer": None}
    evil = {LAYOUT_KEY: json.dumps(layout), "optim.param_groups.0.extra": _Payload(marker)}
    dcp.save(evil, checkpoint_id=tmp_path / "evil", no_dist=True)
    _reseal(tmp_path / "evil")
    with pytest.raises(CheckpointError, match="reading failed"):
        checkpoint.load_full(tmp_path / "evil")
    assert not marker.exists()


def _damage(path, how):
    """Damage one file of the checkpoint at `path` as a disk, a copy or a person might."""
    shard = sorted(path.glob("*.distcp"))[-1]
    if how == "one float":  # the middle of a chunk's bytes; sealed checksums stay as saved
        entry = next(e for e in read_json(path / CHECKSUMS)["entries"] if e["length"] > 64)
        shard = path / entry["file"]
        data = bytearray(shard.read_bytes())
        data[entry["start"] + entry["length"] // 2] ^= 0x40
        shard.write_bytes(bytes(data))
        return shard.name, "tensor "
    if how == "truncated":
        shard.write_bytes(shard.read_bytes()[:-10])
    elif how == "empty":
        shard.write_bytes(b"")
    elif how == "missing":
        shard.unlink()
    elif how == "empty metadata":
        (path / ".metadata").write_bytes(b"")
        return ".metadata", "empty"
    return shard.name, how


@pytest.mark.parametrize("how", ["one float", "truncated", "empty", "missing", "empty metadata"])
def test_a_damaged_checkpoint_is_named_before_anything_loads(saved, tmp_path, how):
    damaged = _copy(saved, tmp_path)
    name, what = _damage(damaged, how)
    with pytest.raises(CheckpointError, match=f"{re.escape(name)}.*{what}") as info:
        checkpoint.load_full(damaged)
    assert isinstance(info.value, Exception)


def die_at_second_rename():
    renames = []

    def dying_rename(src, dst):
        renames.append(dst)
        if len(renames) == 2:  # `ckpt` moved aside, the new one not yet in place
            os._exit(1)
        os.rename(src, dst)

    mock.patch.object(checkpoint_files, "_rename", dying_rename).start()


def killed_between_renames(root):
    """Save twice; the third save's rank 0 dies between its two renames."""
    wrapper, opt, local, loss_fn = wrapped("mlp")
    for step in range(3):
        train(wrapper, local[step : step + 1], loss_fn, opt)
        params = wrapper.full_parameters()  # every rank: it gathers
        if step == 2 and dist.get_rank() == 0:
            torch.save(params, root / "expected.pt")
            die_at_second_rename()
        checkpoint.save(root / "ckpt", wrapper, opt)


def test_a_save_killed_between_its_renames_is_recovered(tmp_path):
    with pytest.raises(minidist.RankFailedError):
        minidist.launch(killed_between_renames, 2, tmp_path)
    assert not (tmp_path / "ckpt").exists() and (tmp_path / ".ckpt.replaced").is_dir()
    with pytest.warns(RuntimeWarning, match="stopped between its two renames"):
        model_state, optim_state = checkpoint.load_full(tmp_path / "ckpt")
    expected = torch.load(tmp_path / "expected.pt")
    assert max_abs_diff({n: model_state[n] for n in expected}, expected) == 0.0
    assert all(s["step"] == 3 for s in optim_state["state"].values())
    assert set(os.listdir(tmp_path)) == {"ckpt", "expected.pt"}
