"""Wide&Deep and DLRM on hash embeddings: the synthetic Criteo data, the exact AUC, equality
with the torch baseline (`nn.EmbeddingBag` over pre-mapped rows) and with a world of 2."""

import pytest
import torch

import minidist
from minidist.embedding.criteo import DENSE, SLOTS, criteo_data, slot_keys
from minidist.embedding.ctr import (
    auc,
    build_ctr,
    ctr_on_rank,
    dump_diff,
    make_optimizers,
    merge_dumps,
    predict,
    train_steps,
)

# torch's Adagrad on the baseline's sparse gradient warns once about its invariant checks
pytestmark = pytest.mark.filterwarnings("ignore:Sparse invariant checks")

GB, STEPS = 64, 3
# float32, the same sums in another order (nn.EmbeddingBag's kernel vs index_add_, DDP's mean
# over ranks, the owners' per-row sums); Adagrad's accumulators start at 0.1, so a rounding
# difference in a gradient moves a row by at most about lr·|δg|/sqrt(0.1): 1e-5 after a few
# steps (measured: below 1e-7).
TOL = 1e-5


@pytest.fixture(scope="module")
def data():
    return criteo_data(seed=0, samples=(STEPS + 1) * GB)


def brute_force_auc(scores, labels):
    pos = scores[labels > 0.5]
    neg = scores[labels <= 0.5]
    wins = (pos[:, None] > neg[None]).double() + 0.5 * (pos[:, None] == neg[None]).double()
    return float(wins.mean())


def test_auc_equals_the_pair_count():
    g = torch.Generator().manual_seed(0)
    for n in (2, 7, 50, 301):
        scores = torch.randint(0, 10, (n,), generator=g).float()  # many ties
        labels = (torch.rand(n, generator=g) < 0.4).float()
        labels[0], labels[1] = 0.0, 1.0
        assert auc(scores, labels) == pytest.approx(brute_force_auc(scores, labels), abs=1e-12)
        cont = torch.randn(n, generator=g)
        assert auc(cont, labels) == pytest.approx(brute_force_auc(cont, labels), abs=1e-12)
    labels = torch.tensor([0.0, 0.0, 1.0, 1.0])
    assert auc(torch.tensor([0.1, 0.2, 0.3, 0.4]), labels) == 1.0
    assert auc(torch.tensor([0.4, 0.3, 0.2, 0.1]), labels) == 0.0
    assert auc(torch.zeros(4), labels) == 0.5


def test_auc_bad_input():
    with pytest.raises(ValueError, match="both classes"):
        auc(torch.randn(3), torch.ones(3))
    with pytest.raises(ValueError, match="3 scores but 2 labels"):
        auc(torch.randn(3), torch.ones(2))


def test_criteo_data_shape_keys_and_determinism(data):
    assert data.dense.shape == (data.samples, DENSE) and data.slots == SLOTS
    assert data.row_offsets.numel() == data.samples * SLOTS + 1
    assert data.row_offsets[-1] == data.values.numel() and data.values.dtype == torch.int64
    lengths = (data.row_offsets[1:] - data.row_offsets[:-1]).view(data.samples, SLOTS)
    assert (lengths[:, :20] == 1).all() and lengths[:, 20:].min() >= 1 and lengths.max() == 3
    slot_of = (torch.arange(data.samples * SLOTS) % SLOTS).repeat_interleave(lengths.reshape(-1))
    for s in range(SLOTS):  # every key of slot s is a key of slot s, none of another slot
        ids = torch.arange(3000)
        assert torch.isin(data.values[slot_of == s], slot_keys(s, ids)).all()
    keys_of = [set(data.values[slot_of == s].tolist()) for s in range(SLOTS)]
    assert sum(map(len, keys_of)) == len(set().union(*keys_of))
    assert data.values.min() < 0 and data.values.max() > 1 << 61
    assert 0.2 < float(data.labels.mean()) < 0.6
    again = criteo_data(seed=0, samples=data.samples)
    assert torch.equal(again.values, data.values) and torch.equal(again.labels, data.labels)
    assert not torch.equal(criteo_data(seed=1, samples=data.samples).values, data.values)
    dense_x, values, offsets, labels = data.batch(2, 5)
    assert offsets[0] == 0 and offsets.numel() == 3 * SLOTS + 1 and values.numel() == offsets[-1]
    lo, hi = data.row_offsets[2 * SLOTS], data.row_offsets[5 * SLOTS]
    assert torch.equal(values, data.values[lo:hi])
    with pytest.raises(ValueError, match="hi=999"):
        data.batch(0, 999)
    with pytest.raises(ValueError, match="slots=27"):
        criteo_data(slots=27)


def _train(model, embedding, data, steps=STEPS, **kw):
    net = build_ctr(model, embedding, slots=data.slots, dense=DENSE, **kw)
    losses = train_steps(net, make_optimizers(net), data, steps, GB)
    return net, losses


@pytest.mark.parametrize("model", ["wide_deep", "dlrm"])
def test_hash_model_equals_dense_embedding_bag_baseline(data, model):
    train_keys = data.values[: int(data.row_offsets[STEPS * GB * SLOTS])]
    hashed, loss_h = _train(model, "hash", data, capacity=4096)
    dense, loss_d = _train(model, "dense", data, keys=train_keys)
    assert max(abs(a - b) for a, b in zip(loss_h, loss_d)) <= TOL
    for name, dump in hashed.dumps().items():
        assert dump_diff(dump, dense.dumps()[name]) <= TOL, name
    for (n, p), q in zip(hashed.dense.named_parameters(), dense.dense.parameters()):
        assert float((p - q).detach().abs().max()) <= TOL, n
    held_out = STEPS * GB, (STEPS + 1) * GB  # keys unseen in training give zero in both
    diff = predict(hashed, data, *held_out) - predict(dense, data, *held_out)
    assert float(diff.abs().max()) <= TOL


# the distributed slots' default scheme (HugeCTR's reduce-scatter) and TorchRec's all-to-all
WORLD_CASES = [
    ("wide_deep", "distributed", None),
    ("wide_deep", "distributed", "all_to_all"),
    ("dlrm", "localized", None),
]


@pytest.mark.parametrize(("model", "embedding", "scheme"), WORLD_CASES)
def test_world_of_2_equals_one_process(data, model, embedding, scheme):
    ref, ref_losses = _train(model, "hash", data, capacity=4096)
    held_out = STEPS * GB, (STEPS + 1) * GB
    scheme = {} if scheme is None else {"scheme": scheme}
    runs = minidist.launch(
        ctr_on_rank, 2, model, embedding, data, STEPS, GB, held_out, capacity=2048, **scheme
    )
    losses = [sum(r["losses"][i] for r in runs) / 2 for i in range(STEPS)]
    assert max(abs(a - b) for a, b in zip(losses, ref_losses)) <= TOL
    for name, dump in ref.dumps().items():
        assert dump_diff(merge_dumps([r["dumps"][name] for r in runs]), dump) <= TOL, name
    for n, p in ref.dense.named_parameters():
        for r in runs:  # DDP keeps the replicas equal
            assert float((r["dense"][n] - p.detach()).abs().max()) <= TOL, n
    logits = torch.cat([r["logits"] for r in runs])
    assert float((logits - predict(ref, data, *held_out)).abs().max()) <= TOL


def test_wide_deep_learns():
    big = criteo_data(seed=0, samples=16 * 256 + 1024)
    net = build_ctr("wide_deep", "hash", slots=big.slots, dense=DENSE)
    losses = train_steps(net, make_optimizers(net), big, 16, 256)
    assert sum(losses[-4:]) < sum(losses[:4])
    score = auc(predict(net, big, 16 * 256, big.samples), big.labels[16 * 256 :])
    assert score > 0.68  # measured 0.748 on held-out samples; a constant model gives 0.5


def test_bad_arguments(data):
    with pytest.raises(ValueError, match="model='deepfm'"):
        build_ctr("deepfm", slots=SLOTS, dense=DENSE)
    with pytest.raises(ValueError, match="embedding='sharded'"):
        build_ctr("dlrm", "sharded", slots=SLOTS, dense=DENSE)
    with pytest.raises(ValueError, match="needs keys="):
        build_ctr("dlrm", "dense", slots=SLOTS, dense=DENSE)
    net = build_ctr("dlrm", slots=SLOTS, dense=DENSE)
    distributed = build_ctr("dlrm", "distributed", slots=SLOTS, dense=DENSE)
    assert distributed.embeddings["deep"].scheme == "reduce_scatter"  # HugeCTR's, the default
    with pytest.raises(ValueError, match="global_batch=63 must divide by world=2"):
        train_steps(net, make_optimizers(net), data, 1, 63, world=2)


def test_bench_runs_on_tiny_sizes():
    """The bench's functions run and their outputs are consistent (no time is asserted)."""
    from minidist.embedding import bench as measure
    from minidist.registry import benches

    assert "embedding" in benches()
    out = measure.table_vs_dict(512, rounds=1, steps=1)
    assert out["hash_bench_keys"] == 512 and out["hash_find_speedup_vs_dict"] > 0
    small = measure.small_inserts(rounds=2, capacities=(24, 96))
    assert set(small) == {
        "hash_insert_4_keys_ms_at_32_slots",
        "hash_insert_4_keys_ms_at_128_slots",
        "hash_small_insert_large_over_small",
    }
    bag = measure.bag_vs_dense(16, rounds=1, steps=1)
    assert bag["embedding_bag_same_output"] and bag["embedding_bag_keys"] > 16 * SLOTS - 1
    kernel = measure.kernel_throughput("cpu", "torch", 256, 64, rounds=1)
    assert kernel["load_factor"] == 0.5 and kernel["find_keys_per_s"] > 0
    keys = measure.distinct_keys(1000)
    assert keys.unique().numel() == 1000 and (keys < 0).any()
