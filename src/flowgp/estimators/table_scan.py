"""The one streaming pass of a streamed fit, split over the processes of a data-parallel run.

With W processes and sharded reads each rank reads only its share of the table's blocks (dealt by rows, as
`flowgp.training.batches.deal_pieces` deals them: the shares differ by at most one block), computes the part of
the statistics those rows give (`flowgp.data.sources.scan_blocks`), and the parts are gathered on every rank and
merged (`flowgp.data.sources.merge_scans`: counts, means and M2 combined pairwise as in Chan, Golub & LeVeque,
the bottom-k sample of the union, the blocks' digests). One process, or exact mode (`shard_reads=False`), scans
every block itself; the merged statistics are the same up to rounding (1e-12 relative) and the sample and digest
are identical, so a fit's checkpoint resumes with any number of processes.
"""
from __future__ import annotations

from typing import Optional

from ..data.sources import TableStats, merge_scans, scan_blocks
from ..training.batches import deal_pieces
from ..training.distributed import World, all_gather_objects, current_world

__all__ = ["blocks_of_rank", "scan_table"]


def blocks_of_rank(blocks, world: World) -> list:
    """The indices of the blocks ((start, stop) row ranges) rank `world.rank` scans: dealt in file order to the
    rank holding the fewest rows so far."""
    shares, _ = deal_pieces([(a, b) for a, b in blocks], world.size)
    first = {a: i for i, (a, _) in enumerate(blocks)}
    return [first[a] for a, _ in shares[world.rank]]


def scan_table(source, sample_size: int, seed: int, shard_reads: bool = True, *, name: str = "data",
               max_labels: Optional[int] = None, group_feature: Optional[int] = None,
               world: Optional[World] = None) -> TableStats:
    """The statistics of the whole table (`flowgp.data.sources.TableStats`), each rank reading only its blocks
    when `shard_reads` and the run has several processes (`world`, default the current process group)."""
    world = current_world() if world is None else world
    sharded = shard_reads and world.distributed
    mine = blocks_of_rank(source.blocks, world) if sharded else range(len(source.blocks))
    if not sharded:
        part = scan_blocks(source, mine, sample_size, seed, name=name, max_labels=max_labels,
                           group_feature=group_feature)
        return merge_scans([part], sample_size, name=name, max_labels=max_labels)
    try:
        part = scan_blocks(source, mine, sample_size, seed, name=name, max_labels=max_labels,
                           group_feature=group_feature)
    except ValueError as err:  # bad rows in this rank's blocks: every rank raises it, none waits for the others
        part = err
    parts = all_gather_objects(part, world)
    for p in parts:
        if isinstance(p, ValueError):
            raise ValueError(str(p))
    return merge_scans(parts, sample_size, name=name, max_labels=max_labels)
