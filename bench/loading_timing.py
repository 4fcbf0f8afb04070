"""How bench/data_loading.py times a clip: the clock (--clock), the clips every row
loads, each clip's best of interleaved rounds, and the clip our data set makes
from a JPEG loader (the crop planned first)."""
import random
import time

import torch

from datasets.temporal_transforms import TemporalRandomCrop

CLIP = 16
OUTPUTS = ('float', 'uint8')  # what a worker hands over: normalized (CPU runs) or uint8 (GPU)
# --clock cpu: this process's CPU time (all its threads) instead of the wall clock,
# for a machine that other jobs share (their load stretches wall time, far less CPU time)
CLOCKS = {'wall': time.perf_counter, 'cpu': time.process_time}
clock = CLOCKS['wall']  # --clock sets it; the sections read it as loading_timing.clock at each call


def timed_clips(n_clips, n_videos, n_frames, seed=0):
    """The clips every row loads: (video index, positions, seed of its random crop)."""
    rng = random.Random(seed)
    starts = TemporalRandomCrop(CLIP, rng=rng)
    return [(rng.randrange(n_videos), starts(0, n_frames), seed * 100_003 + i)
            for i in range(n_clips)]


def best_of_rounds(runs, paths, n_clips, n_frames, rounds, block=4):
    """{row: clips/s} of runs {row: (clip function, format)}: every row loads the same
    ``n_clips`` clips (the same frames, the same random crop: the seed is set per
    clip), in blocks of ``block`` clips: each round loads a block with every row in
    turn (the rows in an order rotated from block to block), and a clip's fastest
    round counts.  A row's block follows one untimed clip of that row (the clip
    before the block), so a row is timed in its own steady state, as a loader worker
    runs, not in the allocator and cache state the previous row left; and the rows
    of a block run within a fraction of a second of each other, so the machine's
    changing speed (other tenants' memory traffic: the same copy takes 0.43 ms in
    one minute, 0.75 ms in another) is left out of every row alike."""
    clips = timed_clips(n_clips, len(next(iter(paths.values()))), n_frames)
    rows = list(runs)
    best = {row: [float('inf')] * len(clips) for row in rows}

    def load(row, i):
        fn, fmt = runs[row]
        video, positions, seed = clips[i]
        torch.manual_seed(seed)
        start = clock()
        fn(paths[fmt][video], positions)
        return clock() - start
    starts = range(0, len(clips), block)
    for k in range(rounds):
        for b, first in enumerate(starts):
            shift = (b + k * 7) % len(rows)
            for row in rows[shift:] + rows[:shift]:
                load(row, first - 1)  # untimed: this row's steady state
                for i in range(first, min(first + block, len(clips))):
                    best[row][i] = min(best[row][i], load(row, i))
    return {row: len(clips) / sum(times) for row, times in best.items()}


def planned_clip(loader, transform, path, positions, finish=None):
    """What VideoClipDataset does with a JPEG loader: read the bytes, plan the crop
    from the header's frame size, decode at the plan's reduction, augment, then
    ``finish`` (default: the transform's own, normalizing to float)."""
    encoded = loader.read(str(path), positions)
    plan = transform.plan(encoded.frame_size)
    factor = plan.reduction(encoded.factors)
    return (finish or transform.finish)(transform.augment(encoded.decode(factor), plan, factor))
