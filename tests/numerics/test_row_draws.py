"""flowgp.numerics.row_draws: a row's draw does not depend on which rows of the global batch a process holds."""
import torch

from flowgp.numerics.row_draws import draw_rows


def _draw(seed):
    g = torch.Generator().manual_seed(seed)
    return lambda shape: torch.randn(shape, generator=g, dtype=torch.float64)


def test_rows_by_offset_and_by_index_are_those_rows_of_the_global_draw():
    full = draw_rows(_draw(0), (3, 10, 2))  # one process: the whole batch of 10 rows
    torch.testing.assert_close(draw_rows(_draw(0), (3, 4, 2), (6, 10)), full[:, 6:10], rtol=0, atol=0)
    index = torch.tensor([7, 1, 4])
    torch.testing.assert_close(draw_rows(_draw(0), (3, 3, 2), (index, 10)), full[:, index], rtol=0, atol=0)
    last = draw_rows(_draw(0), (2, 10))  # rows on the last axis
    torch.testing.assert_close(draw_rows(_draw(0), (2, 3), (index, 10), dim=-1), last[:, index], rtol=0, atol=0)
