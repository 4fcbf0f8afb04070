"""A sampler that shards evaluation work over ranks without padding.

torch's DistributedSampler pads the index list so every rank gets the same
count; for evaluation that counts some videos twice. This one shards exactly:
every video is seen by exactly one rank. (Inference, with several windows per
video, uses VideoWindowDataset.shard.)
"""
from torch.utils.data import Sampler


class ShardSampler(Sampler):
    """Items rank, rank + world_size, ... (in order, no padding)."""

    def __init__(self, n_items, rank=0, world_size=1):
        self.indices = range(rank, n_items, world_size)

    def __iter__(self):
        return iter(self.indices)

    def __len__(self):
        return len(self.indices)
