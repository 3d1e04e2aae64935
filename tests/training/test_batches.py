"""flowgp.training.batches.ArrayBatches: epochs cover every row once, seeded orders, exact mid-epoch resume."""
import pytest
import torch

from flowgp.training.batches import ArrayBatches, Batch


def _data(n=10):
    x = torch.arange(n, dtype=torch.float64)[:, None]
    return x, 10 * x, {"output": torch.arange(n) % 3}


def _epoch(sampler):
    return [b.index.tolist() for b in sampler]


def test_an_epoch_covers_every_row_once_and_rows_stay_aligned():
    x, y, extra = _data(10)
    sampler = ArrayBatches(x, y, 4, extra=extra, seed=0)
    assert (sampler.num_data, sampler.batch_size, sampler.steps_per_epoch) == (10, 4, 3)
    batches = list(sampler)
    assert [len(b) for b in batches] == [4, 4, 2]
    rows = torch.cat([b.index for b in batches])
    assert sorted(rows.tolist()) == list(range(10)) and rows.tolist() != list(range(10))
    for b in batches:
        assert isinstance(b, Batch)
        torch.testing.assert_close(b.x[:, 0], b.index.to(x.dtype))
        torch.testing.assert_close(b.y, 10 * b.x)
        assert torch.equal(b.extra["output"], b.index % 3)
    assert _epoch(sampler) != [b.index.tolist() for b in batches]  # a new order every epoch


def test_orders_follow_the_seed_or_generator():
    x, y, _ = _data(12)
    a = [_epoch(s) for s in [ArrayBatches(x, y, 5, seed=3)] for _ in range(3)]
    b = [_epoch(s) for s in [ArrayBatches(x, y, 5, generator=torch.Generator().manual_seed(3))] for _ in range(3)]
    assert a == b
    assert [_epoch(ArrayBatches(x, y, 5, seed=4))] != a[:1]


def test_full_batch_is_the_data_in_order_and_draws_nothing():
    x, y, _ = _data(7)
    gen = torch.Generator().manual_seed(0)
    state = gen.get_state()
    sampler = ArrayBatches(x, y, None, generator=gen)
    (batch,) = list(sampler)
    assert batch.x is x and batch.y is y and batch.index.tolist() == list(range(7))
    assert torch.equal(gen.get_state(), state)
    (shuffled,) = list(ArrayBatches(x, y, 100, shuffle=True, seed=0))
    assert sorted(shuffled.index.tolist()) == list(range(7)) and shuffled.index.tolist() != list(range(7))
    unshuffled = list(ArrayBatches(x, y, 3, shuffle=False))
    assert [b.index.tolist() for b in unshuffled] == [[0, 1, 2], [3, 4, 5], [6]]


@pytest.mark.parametrize("per_step", [False, True])
def test_state_resumes_in_the_middle_of_an_epoch(per_step):
    x, y, _ = _data(11)
    reference = ArrayBatches(x, y, 3, per_step=per_step, seed=5)
    ref = [b.index.tolist() for _ in range(3) for b in reference]  # 3 epochs of 4 steps
    sampler = ArrayBatches(x, y, 3, per_step=per_step, seed=5)
    taken = []
    for i, b in enumerate(iter(sampler)):
        taken.append(b.index.tolist())
        if i == 1:
            break
    state = sampler.state_dict()
    assert state["position"] == 2
    resumed = ArrayBatches(x, y, 3, per_step=per_step, seed=99)  # another seed: the state decides
    resumed.load_state_dict(state)
    rest = [b.index.tolist() for b in resumed] + [b.index.tolist() for _ in range(2) for b in resumed]
    assert taken + rest == ref


def test_per_step_draws_independent_subsets():
    x, y, _ = _data(20)
    sampler = ArrayBatches(x, y, 5, per_step=True, seed=0)
    batches = _epoch(sampler)
    assert len(batches) == 4 and all(len(set(b)) == 5 for b in batches)
    covered = set().union(*map(set, batches))
    assert len(covered) < 20  # independent subsets overlap (with this seed), unlike an epoch's partition


def test_bad_arguments():
    x, y, _ = _data(5)
    with pytest.raises(ValueError, match="batch_size"):
        ArrayBatches(x, y, 0)
    with pytest.raises(ValueError, match="rows"):
        ArrayBatches(x, y[:4])
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        ArrayBatches([1, 2, 3])
    with pytest.raises(ValueError, match="per_step"):
        ArrayBatches(x, y, 2, per_step=True, shuffle=False)
    with pytest.raises(ValueError, match="batch_size=2 but this sampler has batch_size=3"):
        ArrayBatches(x, y, 3).load_state_dict(ArrayBatches(x, y, 2).state_dict())
