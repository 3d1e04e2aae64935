"""flowgp.training.threads: the thread choice never oversubscribes, and the setting is restored after a block."""
import pytest
import torch

from flowgp.training import threads as T


@pytest.fixture
def idle_machine(monkeypatch):
    """16 cores, none busy with other processes, torch allowed as many threads as it likes."""
    monkeypatch.setattr(T, "available_cores", lambda: 16)
    monkeypatch.setattr(T, "busy_cores", lambda: 0)
    monkeypatch.setattr(T.torch, "get_num_threads", lambda: 64)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)


def test_an_explicit_count_or_none_is_used_as_given(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert T.choose_threads(3, work=1e12) == 3
    assert T.choose_threads(None, work=1e12) is None


def test_small_steps_get_one_thread(idle_machine):
    assert T.choose_threads("auto", work=T.step_work(512, 20)) == 1
    assert T.choose_threads("auto", work=T.step_work(4096, 500)) == 16


def test_auto_divides_the_cores_by_the_processes_sharing_them(idle_machine, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert T.choose_threads("auto", work=1e12) == 4
    assert T.choose_threads("auto", work=1e12, processes=3) == 5
    assert T.choose_threads("auto", work=1e12, processes=64) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # a joblib/loky worker's share
    assert T.choose_threads("auto", work=1e12) == 2


def test_auto_leaves_the_cores_other_processes_keep_busy(idle_machine, monkeypatch):
    monkeypatch.setattr(T, "busy_cores", lambda: 14)
    assert T.choose_threads("auto", work=1e12) == 2
    monkeypatch.setattr(T, "busy_cores", lambda: 40)  # more runnable tasks than cores: one thread
    assert T.choose_threads("auto", work=1e12) == 1


def test_auto_never_exceeds_torchs_own_setting(idle_machine, monkeypatch):
    monkeypatch.setattr(T.torch, "get_num_threads", lambda: 3)  # e.g. the user's torch.set_num_threads(3)
    assert T.choose_threads("auto", work=1e12) == 3
    assert T.choose_threads(8, work=1e12) == 8  # an explicit count is the user's choice


def test_busy_cores_reads_the_run_queue():
    busy = T.busy_cores()
    assert isinstance(busy, int) and busy >= 0


def test_step_work_is_batch_m_squared_plus_m_cubed_per_layer():
    assert T.step_work(10, 3) == 10 * 9 + 27
    assert T.step_work(10, 3, layers=2) == 2 * (10 * 9 + 27)


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-2, ValueError), (1.5, TypeError), ("4", TypeError),
                                        (True, TypeError)])
def test_bad_thread_counts_name_the_argument(bad, error):
    with pytest.raises(error, match="threads"):
        T.choose_threads(bad)


def test_thread_limit_restores_the_previous_setting_even_on_error():
    before = torch.get_num_threads()
    target = 1 if before != 1 else 2
    with pytest.raises(RuntimeError):
        with T.thread_limit(target):
            assert torch.get_num_threads() == target
            raise RuntimeError("inside the fit")
    assert torch.get_num_threads() == before
    with T.thread_limit(None):
        assert torch.get_num_threads() == before
