"""Models and data: deterministic, tied where promised, clear errors for bad shapes."""

import pytest
import torch

from minidist.data import CharTokenizer, lm_batches, make_corpus, regression_batches, shard_batch
from minidist.models import GPT, MLP, GPTConfig, MLPConfig, count_params, lm_loss


def test_gpt_ties_input_and_output_embeddings():
    model = GPT(GPTConfig())
    assert model.lm_head.weight is model.tok_emb.weight
    names = [n for n, _ in model.named_parameters()]
    assert "lm_head.weight" not in names  # registered once
    logits = model(torch.randint(64, (2, 8)))
    assert logits.shape == (2, 8, 64)


def test_bad_configs_name_the_rule():
    with pytest.raises(ValueError, match="hidden=30 must be divisible by heads=4"):
        GPT(GPTConfig(hidden=30, heads=4))
    with pytest.raises(ValueError, match="seq_len"):
        GPT(GPTConfig(seq_len=4))(torch.zeros(1, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="world_size=3"):
        shard_batch((torch.zeros(8, 2),), 0, 3)


def test_data_is_deterministic_and_text_like():
    assert torch.equal(regression_batches(2, 4, 3, 2)[1][0], regression_batches(2, 4, 3, 2)[1][0])
    text = make_corpus(50, seed=1)
    assert text == make_corpus(50, seed=1) and text != make_corpus(50, seed=2)
    assert text[0].isupper() and "." in text
    tok = CharTokenizer(text)
    assert tok.decode(tok.encode(text[:40])) == text[:40]
    ((x, y),) = lm_batches(tok.encode(text), 1, 3, 10)
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_shards_concatenate_to_the_global_batch():
    x = torch.arange(12).view(6, 2)
    parts = [shard_batch((x,), r, 3)[0] for r in range(3)]
    assert torch.equal(torch.cat(parts), x)


def test_a_small_gpt_learns_the_corpus():
    torch.manual_seed(0)
    text = make_corpus(200)
    tok = CharTokenizer(text)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, seq_len=16, hidden=32, heads=2, layers=1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for x, y in lm_batches(tok.encode(text), 60, 16, 16):
        loss = lm_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.6 * losses[0]
    assert (
        count_params(MLP(MLPConfig(in_dim=2, hidden=3, out_dim=1, layers=2))) == 2 * 3 + 3 + 3 + 1
    )
