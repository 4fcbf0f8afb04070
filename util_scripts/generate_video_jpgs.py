"""Extract the frames of every video as JPEG files with ffmpeg.

python -m util_scripts.generate_video_jpgs dir_path dst_path dataset [--n_jobs N] [--fps F] [--size 240]

dir_path/<class>/<video>.<ext> becomes dst_path/<class>/<video>/image_00001.jpg,
... (ActivityNet: dir_path/<video>.<ext> -> dst_path/<video>/...). For
Kinetics give each split folder (train/, val/) in turn with the same dst_path;
a flat test/ folder of unlabelled videos goes to dst_path/test/, where the
annotation JSON expects it, with: test/ dst_path/test activitynet (flat layout).
Videos already converted are skipped, so an interrupted run can be resumed.
"""
import argparse
import os
import shutil
from pathlib import Path

from .utils import (
    DATASETS,
    extract_frames,
    fail,
    list_videos,
    n_jobs_value,
    require_dir,
    require_ffmpeg,
    run_conversions,
)


def is_done(dst_dir):
    # Output folders appear only by rename after ffmpeg succeeded, so a
    # folder with a first frame is complete.
    return (dst_dir / 'image_00001.jpg').is_file()


def convert_video(job):
    """Extract one video; return (video, status, message)."""
    video, dst_dir, fps, size, threads = job
    if is_done(dst_dir):
        return video, 'skipped', None
    # Write into a hidden sibling and rename it when ffmpeg has finished,
    # so an interrupted run never leaves a half-extracted folder behind.
    tmp = dst_dir.with_name(f'.{dst_dir.name}.tmp')
    shutil.rmtree(tmp, ignore_errors=True)
    n, error = extract_frames(video, tmp, fps, size, threads)
    if error is not None:
        shutil.rmtree(tmp, ignore_errors=True)
        return video, 'failed', error
    if dst_dir.exists():
        shutil.rmtree(dst_dir)  # an empty or foreign leftover
    os.rename(tmp, dst_dir)
    return video, 'converted', f'{n} frames'


def make_jobs(dir_path, dst_path, dataset, fps, size, n_jobs):
    # One ffmpeg thread per job when several run side by side.
    threads = 1 if n_jobs_value(n_jobs) > 1 else 0
    jobs = []
    for rel, video in list_videos(dir_path, dataset):
        dst_dir = Path(dst_path) / rel / video.stem
        jobs.append((video, dst_dir, fps, size, threads))
    return jobs


def build_parser():
    parser = argparse.ArgumentParser(
        description='Extract video frames to <dst>/<class>/<video>/'
        'image_00001.jpg... with ffmpeg.')
    parser.add_argument('dir_path', type=Path,
                        help='video root: <class>/<video>.<ext> '
                        '(flat for activitynet)')
    parser.add_argument('dst_path', type=Path, help='frame root (created)')
    parser.add_argument('dataset', choices=DATASETS,
                        help='dataset name; decides the folder layout')
    parser.add_argument('--n_jobs', type=int, default=-1,
                        help='parallel ffmpeg processes (-1: all cores)')
    parser.add_argument('--fps', type=float, default=-1,
                        help='output frame rate (-1: keep the original)')
    parser.add_argument('--size', type=int, default=240,
                        help='short side of the frames in pixels '
                        '(<= 0: keep the original size)')
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    require_ffmpeg()
    require_dir(args.dir_path, 'dir_path', 'give the folder of the videos')
    jobs = make_jobs(args.dir_path, args.dst_path, args.dataset, args.fps,
                     args.size, args.n_jobs)
    if not jobs:
        fail(f'no video file found in {args.dir_path} for dataset '
             f'{args.dataset} (expected '
             f'{"<video>" if args.dataset == "activitynet" else "<class>/<video>"}'
             '.mp4/.avi/.webm/.mkv/...)')
    run_conversions(jobs, convert_video, args.n_jobs)


if __name__ == '__main__':
    main()
