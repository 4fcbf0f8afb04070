"""Which data format to train from: clip loading throughput, disk size, decode limits,
loader throughput with N workers, and the annotation index at Kinetics scale.

    python -m bench.data_loading [--frames noise photo] [--videos 8] [--n_frames 160]
                                 [--clips 60] [--quality 95] [--workers 1 2]
                                 [--index_entries 650000]
                                 [--sections formats jpeg steps layout workers index videos]
                                 [--clock wall|cpu] [--video_clips 120]

frames (--frames; both given: every frame section for each): noise, generated
  UCF-like videos (320x240, blocks of colour plus per-pixel noise moving; JPEG
  quality 95, 43 kB a frame), or photo, camera-like ones: a 320x240 window panning
  and slowly zooming across scikit-image's bundled photographs (a bench-only
  dependency: pip install -r requirements-dev.txt), JPEG quality 90 with 4:2:0
  chroma as cameras write (20.5 kB a frame).
formats: the generated videos written as H.264 .mp4 and MPEG-4 .avi with PyAV,
  jpg folders (noise: the .mp4 extracted with util_scripts.generate_video_jpgs,
  --size -1, --quality; photo: the frames encoded with simplejpeg, no second lossy
  pass) packed into hdf5 with util_scripts.generate_video_hdf5.  One process, one thread; each clip is 16
  random consecutive frames of a random video (video files opened afresh per
  clip, as in training over many videos), random resized crop to 112 + flip
  (training augmentation) -> float (3, 16, 112, 112).  Every row loads the same
  clips (the same frames and random crops), each in 5 interleaved rounds, and each
  clip's fastest round counts (other processes share the CPU).
    (a) the predecessor's path: per frame exists() + PIL open/convert, PIL
        crop/resize/flip, ToTensor, Normalize, stack (3D-ResNets-PyTorch)
    (b) ours on jpg, (c) ours on hdf5, (d) ours on .mp4, (e) ours on .avi (the
        crop planned first and the frames decoded at the scale it needs)
    (f) limit for (b)/(c): read the 16 JPEG files and decode them, nothing else
    (g) limit for (d)/(e): open the video, seek to the keyframe before the clip,
        decode to its last frame, convert the 16 frames to RGB, nothing else
  and, beyond the rows asked for, H.264 with a keyframe every 16 frames.
jpeg: the same jpg and hdf5 frames, today's path (torchvision decode_jpeg of the
  full frames + full-size augmentation, the code before simplejpeg, kept here
  only) against ours (simplejpeg, the crop planned first and the frames decoded
  at the scale it needs), for the training transform (random resized crop to
  112 + flip) and the evaluation one (short side to 112 + center crop), with
  the full-frame decode limits of both decoders, each with the worker's output as
  on CPU runs (normalized to float) and on GPU runs (uint8, normalized on the device);
  each clip's best of 5 interleaved rounds.
  Then the same for video files (.mp4 with a keyframe every 16, .avi): today's
  conversion to RGB (full size for training, short side 112 for evaluation)
  against ours (converted at the scale the planned crop needs, FFmpeg's scaler).
  And simplejpeg's decode time per frame at 1/1, 1/2, 1/4, 1/8: what DCT scaling
  can save on these frames.
steps: ours on the jpg frames (training and evaluation, float and uint8 output)
  against the sum of its unavoidable steps: read + decode at the scale the plan
  allows, + the resized crop, + the layout the model needs (the normalizer's or
  contiguous_clip's pass alone); and against full-size decoding alone and with the
  same crop (issue 25's targets: training at most 1.15x decode + crop, evaluation
  at least 1.6x faster than full decode + crop).
layout: where a clip's time goes after decoding, on decoded clips of the frames:
  the resized crop on uint8 against float, channels-last against channels-first;
  the flip and the layout (float (C, T, H, W) normalized, or contiguous uint8) by
  each candidate, today's and the rejected ones (a fused lookup table, numpy's
  transposing copy before the float conversion).
workers: a DataLoader (batch 8) over the training data set with 1, 2 worker
  processes feeding a model that does nothing: whether loading or compute
  bounds training.
videos: bench/video_clips.py (.mp4 and .avi clips on cache misses against plain
  PyAV, clip cost on a 10-minute video against a 10-second one, a loader worker's
  decoder threads).
index: a generated Kinetics-700-sized annotation (585k training + 65k
  validation entries): start-up time of the list of VideoRecords against the
  cached RecordTable, and the memory a forked worker dirties reading every entry.
"""
import argparse
import tempfile
from pathlib import Path

import torch

from bench import loading_timing as timing
from bench import video_clips
from bench.loading_formats import format_rows, print_format_table
from bench.loading_frames import FORMATS, FRAME_NAMES, FRAMES, QUALITY, disk_mb, prepare
from bench.loading_index import index_rows
from bench.loading_jpeg import dct_scaling_costs, jpeg_rows, print_jpeg_table, print_video_scale_table, video_scale_rows
from bench.loading_layout import after_decoding_costs
from bench.loading_steps import print_step_table, step_rows
from bench.loading_timing import CLOCKS
from bench.loading_workers import print_worker_table, worker_rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--videos', type=int, default=8)
    p.add_argument('--n_frames', type=int, default=160)
    p.add_argument('--clips', type=int, default=60, help='clips per row (each timed in 5 rounds)')
    p.add_argument('--frames', nargs='+', choices=FRAMES, default=['noise'],
                   help='the frames of the generated videos: noise (blocks of colour plus per-pixel '
                        'noise), photo (scikit-image\'s photographs panned and zoomed: camera-like; '
                        'pip install -r requirements-dev.txt); both: every section for each')
    p.add_argument('--quality', type=int, default=None,
                   help='JPEG quality of the jpg/hdf5 frames (default: 95 for noise, '
                        'generate_video_jpgs\'s default; 90 for photo)')
    p.add_argument('--workers', type=int, nargs='+', default=[1, 2])
    p.add_argument('--batches', type=int, default=8, help='batches per worker count')
    p.add_argument('--index_entries', type=int, default=650_000)
    sections = ['formats', 'jpeg', 'steps', 'layout', 'workers', 'index', 'videos']
    p.add_argument('--sections', nargs='+', default=sections, choices=sections)
    p.add_argument('--video_clips', type=int, default=120,
                   help='clips per video row (bench/video_clips.py)')
    p.add_argument('--clock', choices=list(CLOCKS), default='wall',
                   help='time the clips by the wall clock or by this process\'s CPU time '
                        '(a shared machine; the workers section is always wall time)')
    args = p.parse_args(argv)
    timing.clock = CLOCKS[args.clock]
    torch.set_num_threads(1)
    for frames in dict.fromkeys(args.frames):
        quality = args.quality or QUALITY[frames]
        print(f'\n## frames: {frames} ({FRAME_NAMES[frames]}), JPEG quality {quality}')
        with tempfile.TemporaryDirectory() as tmp:
            frame_sections(Path(tmp), args, frames, quality)
    with tempfile.TemporaryDirectory() as tmp:  # independent of the frames
        if 'index' in args.sections:
            index_rows(Path(tmp), args.index_entries)
        if 'videos' in args.sections:  # bench/video_clips.py's own (noise) frames
            video_clips.run(n_clips=args.video_clips, clock=timing.clock)


def frame_sections(root, args, frames, quality):
    """The sections that time the generated videos of ``frames``."""
    if {'formats', 'jpeg', 'steps', 'workers'} & set(args.sections):
        paths = prepare(root, args.videos, args.n_frames, (240, 320), quality, frames)
        frame_kb = disk_mb(root / 'jpg') * 1e3 / (args.videos * args.n_frames)
    if 'formats' in args.sections:
        rates = format_rows(paths, args.clips, args.n_frames)
        sizes = {fmt: disk_mb(root / fmt) for fmt in ('jpg', 'hdf5', *FORMATS)}
        print_format_table(rates, sizes, args.videos, args.n_frames)
    if 'jpeg' in args.sections:
        print_jpeg_table(jpeg_rows(paths, args.clips, args.n_frames), args.videos,
                         args.n_frames, quality, frame_kb)
        print_video_scale_table(video_scale_rows(paths, args.clips, args.n_frames),
                                args.videos, args.n_frames)
        dct_scaling_costs(paths['jpg'][0], min(48, args.n_frames))
    if 'steps' in args.sections:
        print_step_table(step_rows(paths, args.clips, args.n_frames), frames, quality, frame_kb)
    if 'layout' in args.sections:
        after_decoding_costs(frames, quality)
    if 'workers' in args.sections:
        print_worker_table(worker_rows(root, args.workers, args.batches), args.workers)


if __name__ == '__main__':
    main()
