"""Pack JPEG frames into one hdf5 file per video, from frame folders or
straight from the video files.

python -m util_scripts.generate_video_hdf5 dir_path dst_path dataset [--n_jobs N]
    [--from_video] [--fps F] [--size 240]

dir_path/<class>/<video>/image_00001.jpg, ... (output of generate_video_jpgs)
becomes dst_path/<class>/<video>.hdf5 with one dataset 'video' of
variable-length uint8: element i holds the unchanged JPEG bytes of
image_{i+1:05d}.jpg. ActivityNet is flat (dir_path/<video>/ ->
dst_path/<video>.hdf5). When dir_path holds the videos themselves
(<class>/<video>.<ext>, as for generate_video_jpgs and the predecessor's
tool) and no frame folder, or with --from_video, each video is decoded with
PyAV (no ffmpeg binary) and its frames JPEG-encoded straight into the file,
in one pass. Files are written under a temporary name and renamed, so
existing hdf5 files are complete and skipped; the summary names every video
that failed.
"""
import os
from pathlib import Path

import h5py
import numpy as np

from datasets.formats import HDF5_RGB_KEYS, frame_file_name, frame_numbers
from utils.atomic import atomic_path
from utils.errors import DataError

from .generate_video_jpgs import decoder_threads, frame_tool_parser, parse_frame_tool_args
from .utils import (
    contiguous_frames,
    encoded_frames,
    fail,
    list_videos,
    run_conversions,
)


def write_hdf5(frames, dst_file):
    """Write the JPEG byte strings `frames` as dataset 'video' of dst_file,
    under a temporary name renamed at the end, so an interrupted run leaves
    no half file that a rerun would take as done."""
    data = np.empty(len(frames), dtype=object)
    for i, jpeg in enumerate(frames):
        data[i] = np.frombuffer(jpeg, dtype=np.uint8)
    with atomic_path(dst_file) as tmp, h5py.File(tmp, 'w') as h5:
        h5.create_dataset(HDF5_RGB_KEYS[0], data=data, dtype=h5py.vlen_dtype(np.uint8))


def pack_frames(frame_dir, dst_file):
    """Write frame_dir's JPEGs into dst_file; return an error or None."""
    numbers = frame_numbers(frame_dir)
    n = contiguous_frames(numbers)
    if n == 0:
        return f'no image_00001.jpg in {frame_dir}'
    if n != len(numbers):
        # Element i must be frame i + 1; a hole would shift every later
        # frame, so refuse rather than write a misaligned file.
        return (f'{frame_file_name(n)} is missing in {frame_dir}; '
                'extract the video again')
    frames = []
    for i in range(n):
        with open(os.path.join(frame_dir, frame_file_name(i)), 'rb') as f:
            frames.append(f.read())
    write_hdf5(frames, dst_file)
    return None


def convert_frame_dir(job):
    frame_dir, dst_file = job
    if dst_file.exists():
        return frame_dir, 'skipped', None
    error = pack_frames(frame_dir, dst_file)
    return frame_dir, 'failed' if error else 'converted', error


def convert_video_file(job):
    video, dst_file, fps, size, quality, threads = job
    if dst_file.exists():
        return video, 'skipped', None
    try:
        frames = list(encoded_frames(video, fps, size, quality, threads))
    except DataError as e:
        return video, 'failed', str(e)
    if not frames:
        return video, 'failed', 'no frame decoded (no video frames?)'
    write_hdf5(frames, dst_file)
    return video, 'converted', f'{len(frames)} frames'


def list_frame_dirs(dir_path, dataset):
    """(relative folder, frame folder) pairs; hidden folders are skipped
    (generate_video_jpgs keeps unfinished extractions in .<name>.tmp)."""
    dir_path = Path(dir_path)

    def subdirs(path):
        return [d for d in sorted(path.iterdir())
                if d.is_dir() and not d.name.startswith('.')]

    if dataset == 'activitynet':
        return [(Path(), d) for d in subdirs(dir_path)]
    return [(Path(c.name), d) for c in subdirs(dir_path) for d in subdirs(c)]


def build_parser():
    parser = frame_tool_parser('Pack JPEG frame folders, or decode video files, into '
                               "<dst>/<class>/<video>.hdf5 (dataset 'video', JPEG bytes per frame).",
                               'frame root <class>/<video>/image_*.jpg, or video root '
                               '<class>/<video>.<ext> (flat for activitynet)', 'hdf5 root (created)')
    parser.add_argument('--from_video', action='store_true',
                        help='decode the video files (PyAV) even where frame '
                        'folders are found (a dir_path without frame folders is '
                        'decoded anyway); --fps/--size/--quality apply then')
    return parser


def main(argv=None):
    args = parse_frame_tool_args(build_parser(), argv, 'give the folder of the videos or of their frames')
    jobs, func = make_jobs(args)
    run_conversions(jobs, func, args.n_jobs, processes=True)


def make_jobs(args):
    """Frame folders are packed; video files are decoded, with --from_video or
    when dir_path holds videos and no frame folder (the predecessor's tool
    took the videos themselves: its command line runs as it was)."""
    layout = '<video>' if args.dataset == 'activitynet' else '<class>/<video>'
    frame_dirs = [] if args.from_video else list_frame_dirs(args.dir_path, args.dataset)
    if frame_dirs:
        return [(d, args.dst_path / rel / f'{d.name}.hdf5') for rel, d in frame_dirs], \
            convert_frame_dir
    videos = list_videos(args.dir_path, args.dataset)
    if not videos:
        found = 'video file' if args.from_video else \
            f'frame folder ({layout}/image_*.jpg) nor video file'
        fail(f'no {found} ({layout}.mp4/.avi/...) found in {args.dir_path}')
    if not args.from_video:
        print(f'{args.dir_path} holds video files and no frame folder: decoding them '
              f'(as --from_video)')
    threads = decoder_threads(args.n_jobs)
    return [(video, args.dst_path / rel / f'{video.stem}.hdf5', args.fps, args.size,
             args.quality, threads) for rel, video in videos], convert_video_file

if __name__ == '__main__':
    main()
