"""RunState: the training run's counters and history, round-tripped through a checkpoint's entries."""
from flowgp.training.run_state import RunState


def test_run_state_round_trips_through_its_checkpoint_entries():
    state = RunState(history=[3.0, 2.5], step=7, epoch_sum=1.25, epoch_count=3,
                     early_stop={"best": 2.5, "window_best": 3.0}, initial_lrs=[[0.01, 0.02]], earlier_seconds=4.0)
    entries = state.to_dict(finished=True)
    assert entries["training_seconds"] >= 4.0
    back = RunState.from_dict(entries)
    for name in ("history", "step", "epoch_sum", "epoch_count", "early_stop", "initial_lrs"):
        assert getattr(back, name) == getattr(state, name), name
    assert back.finished is True and RunState.from_dict(entries, extending=True).finished is False
    del entries["training_seconds"]  # files written before the count was kept
    assert RunState.from_dict(entries).earlier_seconds == 0.0
