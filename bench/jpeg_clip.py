"""A training clip of JPEG frames end to end: what the training loop waits for,
step by step, against simplejpeg's full decode of the clip's 16 frames.

    python -m bench.jpeg_clip [--videos 8] [--n_frames 160] [--batches 12]
                              [--rounds 5] [--quality 90] [--clock wall|cpu]

Camera-like frames (bench/loading_frames.py's photo frames: scikit-image's
photographs panned and zoomed, 320x240, JPEG quality 90, 4:2:0; pip install -r
requirements-dev.txt) in jpg folders. The training data set as main.py builds
it for a CPU run (TemporalRandomCrop 16, random resized crop to 112 + flip,
normalized in the item: --normalize_on_device auto on a CPU), batch 8.

Rows, each a prefix of the path (ms a clip; the same clips, frames and crops in
every row: each item is drawn under its sample seed, as SeededSamples does):
  full decode   simplejpeg's decode of the clip's 16 frames at 1/1 from bytes in
                memory (the issue's yardstick), nothing else
  read          open and read the 16 files, the first header (loader.read)
  + plan        the crop box drawn from the frame size (the temporal crop too)
  + decode      the frames decoded at the scale the plan allows
  + crop        the resized crop (uint8, channels-last)
  + flip        the flip, into contiguous memory (FlipToContiguous)
  + float       the normalized float (C, T, H, W) (NormalizeToInput): the item
  + collate     8 items stacked into the batch (collate), a clip's share
  loop wait     what train_epoch times: next() on main.py's training loader
                (VideoDataLoader over SeededSamples, --n_threads 0, DeviceLoader
                to the CPU): sampler, seeding, items, collation, ToDevice
Each round runs every row on one batch of clips, the rows in an order rotated
from batch to batch; a row's time for a batch is its median over the rounds.
--clock cpu counts this process's CPU time (a shared machine: other jobs stretch
wall time far more).
"""
import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import simplejpeg
import torch

from datasets.annotation import load_annotations
from datasets.device_batches import DeviceLoader, ToDevice
from datasets.loader import JpgClipLoader
from datasets.spatial_transforms import build_train_transform, get_mean_std
from datasets.temporal_transforms import TemporalRandomCrop
from datasets.videodataset import VideoClipDataset, collate
from utils.resumable_data import SeededSamples, sample_seed, seed_cpu_generators

CLIP, BATCH, SIZE = 16, 8, 112
CLOCKS = {'wall': time.perf_counter, 'cpu': time.process_time}
STEPS = ('read', 'plan', 'decode', 'crop', 'flip', 'float')
ROWS = ('full_decode', *STEPS, 'collate', 'loop', 'slots')
LABELS = {'full_decode': 'full decode (simplejpeg, 1/1, bytes in memory)', 'read': 'read',
          'plan': '+ plan', 'decode': '+ decode at the plan\'s scale', 'crop': '+ resized crop',
          'flip': '+ flip (contiguous)', 'float': '+ float (normalized): the item',
          'collate': '+ collate (batch of 8)', 'loop': 'loop wait (train_epoch\'s next())',
          'slots': 'candidate: items to the flip, each normalized into its slot of the batch'}


def write_frames(root: Path, n_videos: int, n_frames: int, quality: int) -> Path:
    """jpg folders of photo frames and their ucf101-style annotation."""
    from bench.loading_frames import encode_photo_jpeg, photo_frames
    database = {}
    for v in range(n_videos):
        folder = root / 'jpg' / 'cls' / f'video_{v}'
        folder.mkdir(parents=True)
        for f, img in enumerate(photo_frames(v, n_frames, (240, 320))):
            (folder / f'image_{f + 1:05d}.jpg').write_bytes(encode_photo_jpeg(img, quality))
        database[f'video_{v}'] = {'subset': 'training', 'annotations': {
            'label': 'cls', 'segment': [1, n_frames + 1]}}
    annotation = root / 'train.json'
    annotation.write_text(json.dumps({'labels': ['cls'], 'database': database}))
    return annotation


def training_set(root: Path, annotation: Path):
    records, _ = load_annotations(annotation, 'training', root / 'jpg', 'ucf101', file_type='jpg')
    mean, std = get_mean_std(1)
    spatial = build_train_transform(SIZE, mean=mean, std=std)
    return VideoClipDataset(records, JpgClipLoader(), TemporalRandomCrop(CLIP), spatial)


def seeded(index, fn):
    """fn() under sample ``index``'s seed (epoch 0, seed 1), as SeededSamples draws it."""
    with torch.random.fork_rng(devices=[]):
        seed_cpu_generators(sample_seed(1, 0, index))
        return fn()


def prefix(dataset, index, upto: str):
    """The item's path up to step ``upto`` (one of STEPS)."""
    record, spatial, loader = dataset.records[index], dataset.spatial_transform, dataset.loader
    positions = dataset.temporal_transform(record.positions)
    encoded = loader.read(record.path, positions)
    if upto == 'read':
        return encoded
    plan = spatial.plan(encoded.frame_size)
    factor = plan.reduction(encoded.factors)
    if upto == 'plan':
        return plan
    frames = encoded.decode(factor)
    if upto == 'decode':
        return frames
    clip = spatial.geometry(frames, plan, factor)
    if upto == 'crop':
        return clip
    clip = spatial.augment_transform(clip).as_subclass(torch.Tensor)
    return clip if upto == 'flip' else spatial.finish(clip)


class LoopRow:
    """main.py's training loader for a CPU run with --n_threads 0 (dataset.py's
    make_train_loader: SeededSamples, VideoDataLoader, DeviceLoader), its batches
    in the order given (the same indices as the other rows)."""

    def __init__(self, dataset, order):
        from dataset import VideoDataLoader
        spatial = dataset.spatial_transform
        data = VideoDataLoader(SeededSamples(dataset, 1), batch_size=BATCH, sampler=order,
                               num_workers=0)
        self.loader = DeviceLoader(data, ToDevice(torch.device('cpu'), spatial.device_normalizer),
                                   with_targets=True)
        self.order = order

    def batches(self):
        while True:
            yield from self.loader


def measure(dataset, n_batches: int, rounds: int, clock) -> dict:
    """{row: ms a clip}, each batch's median over the rounds, averaged over batches."""
    rng = random.Random(0)
    batches = [[rng.randrange(len(dataset)) for _ in range(BATCH)] for _ in range(n_batches)]
    order = batches[0] + [i for _ in range(rounds) for b in batches for i in b]
    loop = LoopRow(dataset, order).batches()
    next(loop)  # start-up: the first batch, again, not timed
    memory = {}

    def full_decode(batch):
        for i in batch:
            for data in memory[i].planes[0]:
                simplejpeg.decode_jpeg(data)

    def steps(upto):
        def run(batch):
            for i in batch:
                seeded(i, lambda i=i: prefix(dataset, i, upto))
        return run

    def collated(batch):
        items = [seeded(i, lambda i=i: dataset[i]) for i in batch]
        return collate(items)
    normalizer = dataset.spatial_transform.finish

    def into_slots(batch):
        out = None
        for k, i in enumerate(batch):
            clip = seeded(i, lambda i=i: prefix(dataset, i, 'flip'))  # uint8 (T, C, H, W)
            if out is None:
                out = torch.empty((len(batch), clip.shape[1], *clip.shape[:1], *clip.shape[2:]))
            c = clip.shape[1]
            torch.mul(clip.movedim(1, 0), normalizer._gain[:c].view(c, 1, 1, 1), out=out[k])
            out[k].sub_(normalizer._bias[:c].view(c, 1, 1, 1))
        return out
    runs = {'full_decode': full_decode, **{s: steps(s) for s in STEPS}, 'collate': collated,
            'loop': lambda batch: next(loop), 'slots': into_slots}
    times = {row: [[] for _ in batches] for row in ROWS}
    rows = list(ROWS)
    for k in range(rounds):
        for b, batch in enumerate(batches):
            for i in batch:  # the bytes the full-decode row decodes, read beforehand
                memory[i] = seeded(i, lambda i=i: prefix(dataset, i, 'read'))
            shift = (b + 3 * k) % len(rows)
            for row in rows[shift:] + rows[:shift]:
                start = clock()
                runs[row](batch)
                times[row][b].append((clock() - start) / BATCH * 1e3)
            memory.clear()
    return {row: statistics.fmean(statistics.median(t) for t in per_batch)
            for row, per_batch in times.items()}


def print_table(ms: dict, quality: int, frame_kb: float, clock_name: str):
    full = ms['full_decode']
    print(f'\nA training clip of photo frames (320x240, JPEG quality {quality}, {frame_kb:.1f} kB a '
          f'frame) -> 3x16x112x112, one process, --n_threads 0, batch 8 ({clock_name} clock, ms a clip)')
    print('| step | ms a clip | added by the step | x full decode |')
    print('|---|---:|---:|---:|')
    before = 0.0
    for row in ROWS:
        if row == 'slots':
            continue
        added = '' if row in ('full_decode', 'loop') else f'{ms[row] - before:.2f}'
        print(f'| {LABELS[row]} | {ms[row]:.2f} | {added} | {ms[row] / full:.2f}x |')
        if row != 'full_decode':
            before = ms[row]
    print(f'| loop wait less the collated items (sampler, seeding, DataLoader, ToDevice) '
          f'| {ms["loop"] - ms["collate"]:.2f} | | |')
    print(f'| {LABELS["slots"]} | {ms["slots"]:.2f} | {ms["slots"] - ms["flip"]:.2f} after the flip '
          f'(today: {ms["collate"] - ms["flip"]:.2f}) | {ms["slots"] / full:.2f}x |')
    print(f'\nloop wait / full decode: {ms["loop"] / full:.2f}x (issue 39\'s target: at most 1.33x)')


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--videos', type=int, default=8)
    p.add_argument('--n_frames', type=int, default=160)
    p.add_argument('--batches', type=int, default=12, help='batches of 8 clips, each timed in every round')
    p.add_argument('--rounds', type=int, default=5)
    p.add_argument('--quality', type=int, default=90)
    p.add_argument('--clock', choices=list(CLOCKS), default='wall')
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        annotation = write_frames(root, args.videos, args.n_frames, args.quality)
        frame_kb = sum(f.stat().st_size for f in (root / 'jpg').rglob('*.jpg')) / 1e3 / (
            args.videos * args.n_frames)
        ms = measure(training_set(root, annotation), args.batches, args.rounds, CLOCKS[args.clock])
    print_table(ms, args.quality, frame_kb, args.clock)


if __name__ == '__main__':
    main()
