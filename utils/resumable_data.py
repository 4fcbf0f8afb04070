"""What makes a training epoch resumable at any batch with the same result.

Two things decide what a step sees: the order of the samples (the sampler) and
each sample's random augmentation. The order comes from DistributedSampler
(--manual_seed and the epoch); ResumableSampler leaves out the batches a
checkpoint already covers. Each sample's augmentation is drawn from its own
seed (--manual_seed, epoch, index), so it does not depend on which worker
loads the sample or on what that worker loaded before: skipping batches
changes nothing that follows them. Every seed of a run is mixed here from
--manual_seed.
"""
import random

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler


def _mix(seed, value, prime):
    return (seed * prime + value) % (2**63)


def epoch_seed(manual_seed, rank, epoch):
    """The random state at the start of each (rank, epoch): model-side and
    mixup draws, so a resumed run draws what the uninterrupted run drew."""
    return _mix(manual_seed, rank * 10_007 + epoch, 1_000_003)


def restart_seed(seed, first_batch):
    """Fresh streams for the rest of an epoch resumed at ``first_batch`` from a
    checkpoint that holds no random state of this process."""
    return _mix(seed, first_batch, 1_000_033)


def sample_seed(manual_seed, epoch, index):
    """Sample ``index``'s augmentation seed in ``epoch`` (-1: the loader's own generator)."""
    return _mix(_mix(manual_seed, epoch, 1_000_003), index, 1_000_033)


def seed_everything(seed):
    """Python's, numpy's (32 bits) and torch's global generators from one seed."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def seed_cpu_generators(seed):
    """Python's, numpy's (32 bits) and torch's CPU generator from one seed: where
    a sample's augmentation draws. Not torch.manual_seed, which also reseeds
    every CUDA generator, and fork_rng(devices=[]) would not restore those."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.default_generator.manual_seed(seed)


class SeededSamples(Dataset):
    """The training set with each sample drawn under sample_seed(seed, epoch,
    index) on the CPU generators (seed_cpu_generators); the global random
    states are left as they were and the CUDA generators untouched (with no
    loader workers, the training step draws from them too). The wrapped data set is
    `dataset`."""

    def __init__(self, dataset, manual_seed):
        self.dataset = dataset
        self.manual_seed = manual_seed
        self.epoch = 0

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        seed = sample_seed(self.manual_seed, self.epoch, index)
        py_state, np_state = random.getstate(), np.random.get_state()
        try:
            with torch.random.fork_rng(devices=[]):
                seed_cpu_generators(seed)
                return self.dataset[index]
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)


class ResumableSampler(Sampler):
    """A sampler (DistributedSampler) whose epoch can start after its first
    `skip` samples: the order is the uninterrupted epoch's. The skip holds for
    one pass; a second pass in the same epoch (--precise_bn) starts at the
    beginning, as in the uninterrupted run."""

    def __init__(self, sampler):
        self.sampler = sampler
        self.skip = 0

    def set_epoch(self, epoch, skip=0):
        self.sampler.set_epoch(epoch)
        self.skip = skip

    def __iter__(self):
        order = iter(self.sampler)
        for _ in range(self.skip):
            next(order)
        self.skip = 0
        return order

    def __len__(self):
        return len(self.sampler) - self.skip


def start_epoch(loader, epoch, skip_batches=0):
    """Sets the epoch of a loader built on ResumableSampler and SeededSamples;
    with skip_batches, the epoch starts after that many batches."""
    loader.sampler.set_epoch(epoch, skip_batches * loader.batch_size)
    loader.dataset.epoch = epoch
    loader.generator.manual_seed(sample_seed(loader.dataset.manual_seed, epoch, -1))
