"""Classify your own videos with a trained checkpoint (or an exported .onnx file).

    python predict.py results/demo/save_15.pth my_video.mp4
    python predict.py results/demo/save_15.pth folder_of_videos --topk 3 --json
    python predict.py results/demo/save_15.pth data_root --annotation_path own.json
    python predict.py results/demo/save_15.pth https://host/shards --shard_cache /tmp/cache
    python predict.py results/demo/save_15.pth long.mp4 --timeline t.png --output_video out.mp4
    python predict.py results/demo/save_15.pth --stream udp://127.0.0.1:5000

VIDEO_OR_FOLDER is one video -- a video file (.mp4, .avi, .webm, .mkv), a
folder of frames (image_00001.jpg, ...) or an hdf5 file -- or a folder of
them, searched recursively (a data set root with class folders) -- or the
shards util_scripts.make_shards wrote: their folder (with its index.json), an
http(s):// or s3://bucket/prefix URL (--storage_options, --shard_cache as for
main.py); each video of the index is then classified, named as in a folder
tree and labelled by its class folder, its frames counted by the index. The
architecture, the input settings and the class names come from the checkpoint;
the views are those of --inference (--n_clips clips evenly spread over each
video, or a sliding window with --stride, times --crop crops) and the video's
score is the mean of their softmax. A video that cannot be read is reported
and skipped; the others are classified, and the run ends with the list of
failures and exit status 1. With true labels (--annotation_path, or class
folders named like the checkpoint's classes) it also prints the accuracy.
With --stream it classifies a live source as it plays instead (live.py).

This file parses the command line and hands the run to classify.py (files) or
live.py (--stream); -h and every argument error answer before torch is imported.
"""
# ruff: noqa: E402 -- the imports after the command-line parse are meant to be there
import argparse
import json
import sys
from pathlib import Path

from utils.cli import Parser
from utils.urls import redact_url, video_location

# datasets.spatial_transforms.EVAL_CROPS, named here: the parser runs before
# torch is imported (tests/test_cli.py checks that they are equal)
CROPS = ('center', 'nocrop', 'three')
LIVE_SCHEMES = ('rtsp', 'rtsps', 'rtmp', 'udp', 'tcp', 'srt')  # --stream's, not shard locations


def parse_args(argv=None):
    p = Parser(description='Classify videos with a trained checkpoint.',
               formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument('checkpoint', type=Path,
                   help='save_<epoch>.pth written by main.py, or an .onnx file written by '
                        'util_scripts.export')
    add_input_arguments(p)
    p.add_argument('--topk', type=int, default=5, help='classes printed per video (0: all)')
    p.add_argument('--json', action='store_true',
                   help='print the inference file\'s format: {"results": {video_id: '
                        '[{"label", "score"}, ...]}, "views": {video_id: n}} (and "failed": '
                        '{video_id: message} if a video could not be read)')
    p.add_argument('--n_clips', type=int, default=10,
                   help='clips evenly spread over each video (like --inference_n_clips)')
    p.add_argument('--stride', type=int, default=0,
                   help='sliding-window stride in frames instead of --n_clips '
                        '(like --inference_stride); 0: use --n_clips (with --timeline or '
                        '--output_video: windows side by side; with --stream: half a window)')
    p.add_argument('--crop', default='center', choices=CROPS,
                   help='spatial views (like --inference_crop)')
    p.add_argument('--batch_size', type=int, default=16, help='views per forward pass')
    p.add_argument('--n_threads', type=int, default=2, help='data-loading worker processes')
    p.add_argument('--threads', type=int, default=0,
                   help="the model's intra-op threads; 0: the CPUs this process may use, less one "
                        'per data-loading worker (or for the reader of --stream)')
    p.add_argument('--extract_features', type=Path, default=None, metavar='PATH.h5',
                   help='also write each video\'s pooled features (the classifier\'s input, '
                        'averaged over the views) to this HDF5 file')
    p.add_argument('--annotation_path', type=Path, default=None,
                   help='an annotation file: its videos\' labels are the true ones (top-1/top-5 '
                        'are printed), and its class names serve a checkpoint without them')
    p.add_argument('--timeline', type=Path, default=None, metavar='PATH.png|PATH.json',
                   help='one video: the top classes\' scores over time, per sliding window')
    p.add_argument('--output_video', type=Path, default=None, metavar='PATH.mp4',
                   help='one video: write it with each window\'s top label and score drawn')
    p.add_argument('--fps', type=float, default=25.0,
                   help='frame rate of frame folders and hdf5 files, for --timeline\'s seconds '
                        'and --output_video (video files give their own)')
    p.add_argument('--weights', default='raw', choices=['raw', 'ema'],
                   help='the trained weights, or their EMA (runs with --ema_decay)')
    p.add_argument('--no_cuda', action='store_true', help='run on the CPU')
    add_stream_arguments(p)
    p.add_argument('--device', default=None, choices=['cpu', 'cuda'],
                   help='where the model runs (default: cuda if there is a GPU)')
    p.add_argument('--half', action='store_true', help='fp16 autocast (needs --device cuda)')
    p.add_argument('--no_progress', action='store_true', help='no progress bar (on stderr)')
    args = p.parse_args(argv)
    check_stream_args(p, args)
    check_input_args(p, args)
    if args.n_clips < 1 or args.stride < 0 or args.batch_size < 1 or args.fps <= 0:
        p.error('--n_clips and --batch_size must be at least 1, --stride at least 0, '
                '--fps positive')
    if args.timeline is not None and args.timeline.suffix not in ('.png', '.json'):
        p.error(f'--timeline {args.timeline}: give a .png (picture) or .json file')
    if args.output_video is not None and args.output_video.suffix != '.mp4':
        p.error(f'--output_video {args.output_video}: give an .mp4 file')
    return args


def add_input_arguments(p):
    """VIDEO_OR_FOLDER and the options of shard locations (datasets/storage.py)."""
    p.add_argument('video', type=video_location, metavar='VIDEO_OR_FOLDER', nargs='?',
                   help='a video file, a frame folder, an hdf5 file, or a folder of them '
                        '(searched recursively: a data set root with class folders); or the shards '
                        'util_scripts.make_shards wrote: their folder, an http(s):// or s3://bucket/prefix URL')
    p.add_argument('--storage_options', default=None, metavar='JSON',
                   help='shards at a URL: JSON object of fsspec options, e.g. \'{"endpoint_url": '
                        '"http://127.0.0.1:9000"}\' for an S3-compatible server; never credentials (S3: the '
                        'AWS environment variables or ~/.aws; HTTP: user:password@ in the URL)')
    p.add_argument('--shard_cache', type=Path, default=None, metavar='DIR',
                   help='shards at a URL: folder that keeps the videos read (a second run reads them '
                        'from it), at most 10 GiB')


def check_input_args(p, args):
    """A live source's URL goes with --stream; --storage_options is a JSON object without
    credentials (numpy imported only when it is given)."""
    scheme = args.video.split('://', 1)[0].lower() if isinstance(args.video, str) else None
    if scheme in LIVE_SCHEMES:
        p.error(f'{scheme}:// is a live source: give it as --stream {redact_url(args.video)} (VIDEO_OR_FOLDER takes '
                f'shards at an http(s):// or s3:// URL)')
    if args.storage_options is None:
        return
    from datasets.storage import check_storage_options
    from utils.errors import OptionError
    try:
        check_storage_options(args.storage_options)
    except OptionError as e:
        p.error(f'--{e}')


def add_stream_arguments(p):
    """--stream and the options of live sources (live.py)."""
    p.add_argument('--stream', default=None, metavar='SOURCE',
                   help='classify a live source as it plays instead (rtsp://, udp://, tcp://, '
                        'http(s)://, /dev/video0, or - for a pipe on standard input): one line '
                        'per window (see docs/live.md)')
    p.add_argument('--smooth', type=int, default=1,
                   help='--stream: the scores printed are the mean of the last K windows\'')
    p.add_argument('--reconnect', type=int, default=3,
                   help='--stream: times a network source that drops is reopened')
    p.add_argument('--stream_timeout', type=float, default=10.0,
                   help='--stream: seconds without data after which a source counts as dropped')
    p.add_argument('--output_json', type=Path, default=None, metavar='PATH.jsonl',
                   help='--stream: also write each window\'s line as JSON (one object a line)')


def check_stream_args(p, args):
    if (args.video is None) == (args.stream is None):
        p.error('give a video (file, frame folder, hdf5 file or folder of them) or --stream SOURCE')
    if args.half and args.device != 'cuda':
        p.error('--half runs in fp16 on a GPU: give --device cuda too')
    if args.stream is None:
        if args.output_json is not None:
            p.error('--output_json goes with --stream (for videos: --json)')
        return
    others = [name for name in ('timeline', 'output_video', 'extract_features', 'annotation_path',
                                'storage_options', 'shard_cache')
              if getattr(args, name) is not None] + (['json'] if args.json else [])
    if others:
        p.error(f'--{others[0]} is for videos, not with --stream (--output_json writes its lines)')
    if args.smooth < 1 or args.reconnect < 0 or args.stream_timeout <= 0:
        p.error('--smooth must be at least 1, --reconnect at least 0, --stream_timeout positive')


if __name__ == '__main__':
    COMMAND_LINE = parse_args()

from utils.install_check import check_torchvision

check_torchvision()  # before the imports that need it: one line, not a traceback

import classify
from opts import option_defaults
from utils.errors import USER_ERRORS, OptionError
from utils.progress import on_terminal
from utils.threads import set_threads


def run_live(args):
    """--stream: live.py's loop; its exit status."""
    import live
    model, options, class_names, device = classify.load_model(
        args.checkpoint, option_defaults(), None, classify.chosen_device(args), args.weights)
    if options.input_type != 'rgb':
        raise OptionError(f'--stream classifies RGB frames; {args.checkpoint} takes '
                          f'{options.input_type}')
    settings = live.LiveSettings(stride=args.stride or live.default_stride(options),
                                 smooth=args.smooth, topk=args.topk, crop=args.crop,
                                 reconnect=args.reconnect, timeout=args.stream_timeout,
                                 half=args.half)
    return live.run_stream(args.stream, model, options, class_names, device, settings,
                           args.output_json)


def format_line(video_id, entries):
    return f'{video_id}: ' + ', '.join(f'{e["label"]} ({e["score"]:.3f})' for e in entries)


def report_failures(failures, videos):
    """The videos that could not be read, on stderr; exit status 1."""
    paths = {v.video_id: v.path for v in videos}
    print(f'{len(failures)} of {len(videos)} video(s) could not be read and were skipped:',
          file=sys.stderr)
    for video_id, message in failures.items():
        path = paths[video_id]
        print(f'  {message}' if path in message else f'  {path}: {message}', file=sys.stderr)
    n_done = len(videos) - len(failures)
    print(f'{n_done} other video(s) classified; re-encode or re-extract the ones listed, or '
          f'move them out of {"the folder" if len(videos) > 1 else "the way"}', file=sys.stderr)
    return 1


def print_outcome(out, args, accuracy, failures):
    if args.json:
        summary = {'results': out.results, 'views': out.views}
        if failures:
            summary['failed'] = failures
        print(json.dumps(summary))
    else:
        for video_id, entries in out.results.items():
            print(format_line(video_id, entries))
    for line in accuracy:
        print(line, file=sys.stderr if args.json else sys.stdout)



def main(argv=None, args=None):
    """args: the parsed command line (else parsed from argv)."""
    args = args if args is not None else parse_args(argv)
    set_threads(args.threads, decoders=1 if args.stream is not None else args.n_threads)
    failures = {}
    try:
        if args.stream is not None:
            return run_live(args)
        videos, out, accuracy = classify.run_files(args, option_defaults(), failures,
                                                   progress=not args.no_progress and on_terminal())
    except USER_ERRORS as e:
        print(f'error: {e}', file=sys.stderr)
        return 2
    print_outcome(out, args, accuracy, failures)
    return report_failures(failures, videos) if failures else 0


if __name__ == '__main__':
    sys.exit(main(args=COMMAND_LINE))
