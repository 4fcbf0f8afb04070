"""Extract the frames of every video as JPEG files (PyAV: no ffmpeg binary).

python -m util_scripts.generate_video_jpgs dir_path dst_path dataset [--n_jobs N] [--fps F] [--size 240]

dir_path/<class>/<video>.<ext> becomes dst_path/<class>/<video>/image_00001.jpg,
... (ActivityNet: dir_path/<video>.<ext> -> dst_path/<video>/...): every
decoded frame once, in order (or resampled to --fps), upright for rotated
phone videos, short side resized to --size with the aspect ratio kept. For
Kinetics give each split folder (train/, val/) in turn with the same
dst_path; a flat test/ folder of unlabelled videos goes to dst_path/test/,
where the annotation JSON expects it, with: test/ dst_path/test activitynet.

Restartable: a video is written to a hidden temporary folder that is renamed
when complete, so a complete folder is skipped and a partial one redone. The
summary names every video that failed and why; the exit status is 1 if any did.
"""
import os
import shutil
from pathlib import Path

from datasets.formats import frame_file_name, frame_numbers
from utils.cli import Parser
from utils.errors import DataError

from .utils import (
    DATASETS,
    contiguous_frames,
    extract_frames,
    fail,
    list_videos,
    n_jobs_value,
    require_dir,
    run_conversions,
)


def is_done(dst_dir):
    # Output folders appear only by rename once complete; a folder without
    # frame 1 or with a gap (left by another tool) is redone.
    if not (dst_dir / frame_file_name(0)).is_file():
        return False
    numbers = frame_numbers(dst_dir)
    return contiguous_frames(numbers) == len(numbers)


def convert_video(job):
    """Extract one video; return (video, status, message)."""
    video, dst_dir, fps, size, quality, threads = job
    if is_done(dst_dir):
        return video, 'skipped', None
    # Write into a hidden sibling and rename it when complete, so an
    # interrupted run never leaves a half-extracted folder behind.
    tmp = dst_dir.with_name(f'.{dst_dir.name}.tmp')
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        n = extract_frames(video, tmp, fps, size, quality, threads)
    except DataError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        return video, 'failed', str(e)
    if dst_dir.exists():
        shutil.rmtree(dst_dir)  # an incomplete leftover
    os.rename(tmp, dst_dir)
    return video, 'converted', f'{n} frames'


def decoder_threads(n_jobs):
    # One decoder thread per job when several videos run side by side.
    return 1 if n_jobs_value(n_jobs) > 1 else 0


def make_jobs(dir_path, dst_path, dataset, fps, size, quality, n_jobs):
    threads = decoder_threads(n_jobs)
    return [(video, Path(dst_path) / rel / video.stem, fps, size, quality,
             threads) for rel, video in list_videos(dir_path, dataset)]


def frame_tool_parser(description, source_help, dst_help):
    """The command line of this tool and generate_video_hdf5: dir_path, dst_path,
    dataset, --n_jobs and the frame options."""
    parser = Parser(description=description)
    parser.add_argument('dir_path', type=Path, help=source_help)
    parser.add_argument('dst_path', type=Path, help=dst_help)
    parser.add_argument('dataset', choices=DATASETS,
                        help='dataset name; decides the folder layout')
    parser.add_argument('--n_jobs', type=int, default=-1,
                        help='parallel processes (-1: all cores)')
    parser.add_argument('--fps', type=float, default=-1,
                        help='output frame rate (-1: every decoded frame)')
    parser.add_argument('--size', type=int, default=240,
                        help='short side of the frames in pixels, aspect '
                        'ratio kept (<= 0: keep the original size)')
    parser.add_argument('--quality', type=int, default=95,
                        help='JPEG quality (1-100)')
    return parser


def parse_frame_tool_args(parser, argv, source_hint):
    args = parser.parse_args(argv)
    require_dir(args.dir_path, 'dir_path', source_hint)
    return args


def build_parser():
    return frame_tool_parser('Extract video frames to <dst>/<class>/<video>/image_00001.jpg... '
                             '(PyAV; no ffmpeg binary needed).',
                             'video root: <class>/<video>.<ext> (flat for activitynet)',
                             'frame root (created)')


def main(argv=None):
    args = parse_frame_tool_args(build_parser(), argv, 'give the folder of the videos')
    jobs = make_jobs(args.dir_path, args.dst_path, args.dataset, args.fps,
                     args.size, args.quality, args.n_jobs)
    if not jobs:
        fail(f'no video file found in {args.dir_path} for dataset '
             f'{args.dataset} (expected '
             f'{"<video>" if args.dataset == "activitynet" else "<class>/<video>"}'
             '.mp4/.avi/.webm/.mkv/...)')
    run_conversions(jobs, convert_video, args.n_jobs, processes=True)


if __name__ == '__main__':
    main()
