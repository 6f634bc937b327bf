"""Lesson 18's asynchronous save: it keeps the step it was taken at while training goes on,
and a process killed in the middle of its background write leaves the previous checkpoint
whole and loadable (the dead rank named by `minidist.launch`)."""

import gc
import os
import signal
import threading

import pytest
import torch
import torch.distributed as dist

import minidist
from minidist.data import shard_batch
from minidist.data_parallel.fixture import build
from minidist.fsdp import FullyShardedDataParallel
from minidist.fsdp.fixture import UNITS
from minidist.resilience import TrainingState, load, save
from minidist.resilience.async_save import AsyncSaver
from minidist.resilience.lesson_pieces import (
    fsdp_pieces,
    materialize_optimizer_state,
    module_pieces,
)
from minidist.resilience.planners import ChunkSavePlanner
from minidist.training import train
from minidist.zero.fixture import ADAM


def fsdp_model():
    rank, world = dist.get_rank(), dist.get_world_size()
    model, batches, loss_fn = build("gpt")
    fsdp = FullyShardedDataParallel(model, wrap=UNITS["gpt"])
    opt = torch.optim.Adam(fsdp.sharded_parameters(), **ADAM)
    return fsdp, opt, [shard_batch(b, rank, world) for b in batches], loss_fn


def save_in_background_and_train_on(path):
    fsdp, opt, local, loss_fn = fsdp_model()
    train(fsdp, local[:2], loss_fn, opt)
    saver = AsyncSaver()
    saver.save(path, fsdp_pieces(fsdp, opt), TrainingState(step=2, samples=16))
    at_save = {k: v.clone() for k, v in fsdp.full_parameters().items()}
    train(fsdp, local[2:], loss_fn, opt)  # while the thread writes
    saver.wait()
    saver.close()
    return at_save, fsdp.full_parameters()


def one_process(path):
    model, _, _ = build("gpt", seed=3)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], **ADAM)
    materialize_optimizer_state(opt)
    report = load(path, module_pieces(model, opt))
    return dict(model.state_dict()), report.state


def test_an_async_save_keeps_the_step_it_was_taken_at(tmp_path):
    at_save, later = minidist.launch(save_in_background_and_train_on, 2, tmp_path / "ck")[0]
    state, training = minidist.launch(one_process, 1, tmp_path / "ck")[0]
    assert training == TrainingState(step=2, samples=16)
    assert all(torch.equal(state[k], at_save[k]) for k in at_save)
    assert any(not torch.equal(at_save[k], later[k]) for k in at_save)  # training went on


def killed_while_writing(path):
    """Save (step 1), then an async save (step 3) during which rank 1 is SIGKILLed."""
    fsdp, opt, local, loss_fn = fsdp_model()
    train(fsdp, local[:1], loss_fn, opt)
    save(path, fsdp_pieces(fsdp, opt), TrainingState(step=1, samples=8))
    train(fsdp, local[1:3], loss_fn, opt)
    writing = threading.Event()
    original = ChunkSavePlanner.resolve_data

    def slow(self, item):  # the write has begun: files half written
        writing.set()
        threading.Event().wait(30)
        return original(self, item)

    if dist.get_rank() == 1:
        ChunkSavePlanner.resolve_data = slow
    saver = AsyncSaver()
    saver.save(path, fsdp_pieces(fsdp, opt), TrainingState(step=3, samples=24))
    if dist.get_rank() == 1:
        writing.wait(60)
        os.kill(os.getpid(), signal.SIGKILL)
    saver.wait()  # rank 0 waits for rank 1 inside the write, until the world is stopped


def test_a_rank_killed_during_a_background_write_leaves_the_last_checkpoint_whole(tmp_path):
    path = tmp_path / "ck"
    with pytest.raises(minidist.RankFailedError, match=r"rank 1") as failure:
        minidist.launch(killed_while_writing, 2, path, timeout_s=120)
    assert "signal 9" in str(failure.value) or "SIGKILL" in str(failure.value), failure.value
    assert (tmp_path / ".ck.unfinished").is_dir()  # the interrupted write, never in place
    _, state = minidist.launch(one_process, 1, path)[0]
    assert state == TrainingState(step=1, samples=8)  # the previous checkpoint, whole


def saves_in_a_row(path):
    """Three asynchronous saves, each taken while the previous one may still be writing."""
    fsdp, opt, local, loss_fn = fsdp_model()
    saver = AsyncSaver()
    for step, where in ((1, "a"), (2, "b"), (3, "a")):
        train(fsdp, local[step - 1 : step], loss_fn, opt)
        saver.save(path / where, fsdp_pieces(fsdp, opt), TrainingState(step=step, samples=8))
    saver.close()


def test_a_save_taken_while_one_is_in_flight_waits_for_it(tmp_path):
    """One save in flight at a time: the next waits for it (two writes sharing the writer's
    group would hang, or the second would find the first's staging folder held)."""
    minidist.launch(saves_in_a_row, 2, tmp_path, timeout_s=60)  # ~3 s alone: 20x for load
    assert minidist.launch(one_process, 1, tmp_path / "a")[0][1].step == 3
    assert minidist.launch(one_process, 1, tmp_path / "b")[0][1].step == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]  # nothing left half-done


def loads_in_a_row(path, times: int) -> tuple[int, int]:
    """Open descriptors after one load and after `times` more (each count after a garbage
    collection: a file object that only a collection closes is not what is measured)."""
    model, _, _ = build("gpt", seed=3)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], **ADAM)
    materialize_optimizer_state(opt)
    load(path, module_pieces(model, opt))
    gc.collect()
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(times):
        load(path, module_pieces(model, opt))
    gc.collect()
    return before, len(os.listdir("/proc/self/fd"))


def test_loads_close_every_file_they_pin(tmp_path):
    """A load holds one version's files open (`checkpoint_pin`) and closes them all: 20
    loads leave no more descriptors open than one (once 29 against 31: fewer is no leak)."""
    minidist.launch(save_in_background_and_train_on, 2, tmp_path / "ck")
    before, after = minidist.launch(loads_in_a_row, 1, tmp_path / "ck", 20)[0]
    assert after <= before


def saved_then_changed(path):
    """One rank: an asynchronous save whose background write is held until the live tensors
    have changed (deterministically what a write slower than the next step sees); then a
    save whose write fails. (the values saved, the values after, wait()'s error)."""
    from minidist.resilience import async_save

    model, _, _ = build("gpt")
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], **ADAM)
    materialize_optimizer_state(opt)
    changed, real = threading.Event(), async_save.write

    def held_write(where, chunks, group=None):
        changed.wait(60)
        real(where, chunks, group)

    def failing_write(where, chunks, group=None):
        raise OSError("no space left on device")

    saver = AsyncSaver()
    async_save.write = held_write
    saver.save(path, module_pieces(model, opt), TrainingState(step=1, samples=8))
    at_save = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # the next step, while the write has not started
    changed.set()
    saver.wait()
    async_save.write = failing_write
    saver.save(path.parent / "failed", module_pieces(model, opt), TrainingState(step=2))
    try:
        saver.wait()
        error = None
    except RuntimeError as e:
        error = str(e)
    async_save.write = real
    saver.close()
    return at_save, error


def test_the_background_write_holds_a_copy_and_its_failure_is_raised(tmp_path):
    """The write runs on a copy taken in `save` (on a CPU too, where `.to("cpu")` would hand
    over the live tensor itself): a step taken before the write starts does not leak into
    the checkpoint. A write that fails is raised by the next `wait`, never reported saved."""
    at_save, error = minidist.launch(saved_then_changed, 1, tmp_path / "ck", timeout_s=120)[0]
    state, _ = minidist.launch(one_process, 1, tmp_path / "ck")[0]
    assert all(torch.equal(state[k], at_save[k]) for k in at_save)
    assert error is not None and "no space left on device" in error
