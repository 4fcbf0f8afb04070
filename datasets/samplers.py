"""Samplers that shard evaluation work over ranks without padding.

torch's DistributedSampler pads the index list so every rank gets the same
count; for evaluation that counts some videos twice. These shard exactly:
every video is seen by exactly one rank.
"""
import numpy as np
from torch.utils.data import Sampler


class ShardSampler(Sampler):
    """Items rank, rank + world_size, ... (in order, no padding)."""

    def __init__(self, n_items, rank=0, world_size=1):
        self.indices = range(rank, n_items, world_size)

    def __iter__(self):
        return iter(self.indices)

    def __len__(self):
        return len(self.indices)


class VideoShardSampler(Sampler):
    """For datasets with several items per video (sliding windows): a rank gets
    every window of the videos it owns, so per-video averages stay on one rank.
    `video_of_item` is the video index of each item, non-decreasing."""

    def __init__(self, video_of_item, rank=0, world_size=1):
        video_of_item = np.asarray(video_of_item)
        self.indices = np.flatnonzero(video_of_item % world_size == rank).tolist()

    def __iter__(self):
        return iter(self.indices)

    def __len__(self):
        return len(self.indices)
