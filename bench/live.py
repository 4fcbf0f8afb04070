"""Whether a network keeps up with a live 25 fps source on this machine's CPU
(predict.py --stream): time per window, real-time factor, skipped windows and latency.

    python -m bench.live [--models resnet-18 x3d-xs] [--seconds 20] [--fps 25]
        [--threads N] [--repeats 5] [--json PATH]
    python -m bench.live --source udp://127.0.0.1:5000 [--seconds 20]   # a real stream instead

Each network gets bench.deploy's clip (resnet-18 16x112, the project's default
model and clip; x3d-xs 4x160, the smallest network of the zoo; --sample_duration
/ --sample_size override both), 400 classes, untrained weights (speed does not
depend on them). It classifies a generated 320x240 H.264 video of --seconds
seconds at --fps (a panning gradient under moving blocks, a keyframe every 25
frames, no B-frames, as a camera streams), played live: datasets/live.py paces a
local file at its frame rate, as a camera delivers its frames. The windows go
through live.run_stream in this process, as predict.py --stream runs them: a
window every half a window (--stream's default --stride), the center crop, top-1.
With --source the same runs against that stream (each network opens it anew and
reads it for --seconds, or to its end).

  ms per window     the model's time for one window after a warm-up (the mean of
                    --repeats windows, live.WindowScorer.time_per_window)
  window every      the stride's duration: stride / the stream's frame rate
  real-time factor  window every / ms per window: at least 1 keeps up
  classified, skipped  windows served and windows the model was too slow for
                    (the newest is served); their sum is the stream's windows
  latency           from a window's last frame decoded to its result: p50, p95, max

torch runs on --threads threads (default: every core); the reader thread decodes
beside it. Run it alone on the machine: other processes share the cores.
"""
import argparse
import io
import json
import os
import re
import sys
import tempfile
import threading
from argparse import Namespace
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch

import live
from bench.deploy import clip_shape, report
from dataset import eval_views
from datasets.live import LiveFrames, source_name
from datasets.temporal_transforms import clip_span
from util_scripts.model_summary import build
from utils.cli import Parser
from utils.errors import DataError

DEFAULT_MODELS = ('resnet-18', 'x3d-xs')
N_CLASSES = 400
WIDTH, HEIGHT, GOP = 320, 240, 25
KEEP_UP = re.compile(r'(keeps up|cannot keep up): ')


def frame_image(i, width=WIDTH, height=HEIGHT):
    """Frame i: a gradient panning right and down, four blocks moving at their own speeds."""
    x, y = np.arange(width)[None, :], np.arange(height)[:, None]
    img = np.empty((height, width, 3), np.uint8)
    img[..., 0] = (x + 4 * i) % 256
    img[..., 1] = (y + 2 * i) % 256
    img[..., 2] = ((x + y) // 2 + 3 * i) % 256
    side = height // 6
    for k in range(4):
        left = (i * (3 + 2 * k) + 70 * k) % (width - side)
        top = (i * (1 + k) + 50 * k) % (height - side)
        img[top:top + side, left:left + side] = (255 - 60 * k, 60 * k, 255 if k % 2 else 0)
    return img


def make_video(path, seconds, fps):
    """A 320x240 H.264 .mp4 of seconds * fps frame_image frames; its frame count."""
    import av
    n_frames = max(1, round(seconds * fps))
    with av.open(str(path), 'w') as container:
        stream = container.add_stream('libx264', rate=Fraction(fps).limit_denominator(1001))
        stream.width, stream.height, stream.pix_fmt = WIDTH, HEIGHT, 'yuv420p'
        stream.codec_context.gop_size = GOP
        stream.options = {'preset': 'veryfast', 'bf': '0', 'crf': '23', 'keyint_min': str(GOP),
                          'sc_threshold': '0'}
        for i in range(n_frames):
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame_image(i), format='rgb24')):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return n_frames


def live_options(shape):
    """The input settings eval_views reads, for a (C, T, H, W) clip (Kinetics' mean and std)."""
    return Namespace(sample_size=shape[2], sample_duration=shape[1], sample_t_stride=1, value_scale=1,
                     mean_dataset='kinetics', no_mean_norm=False, no_std_norm=False, input_type='rgb')


def open_frames(source, options, settings, seconds, notes):
    """The reader of ``source`` that run_stream is given: a generated file is read to its
    end, a --source stream for ``seconds``."""
    _, spatial = eval_views(options, 0, 1, settings.crop)
    span = clip_span(options.sample_duration, options.sample_t_stride)
    frame_args = (source, spatial, span, settings.stride, options.sample_t_stride, settings.reconnect,
                  settings.timeout, notes)
    return LiveFrames(*frame_args)


def window_count(n_frames, span, stride):
    """The windows a stream of n_frames frames has (a window every stride frames once span are in)."""
    return 0 if n_frames < span else (n_frames - span) // stride + 1


def run_model(model, options, source, seconds, args):
    """(time per window, frame rate, LiveFrames after the run, JSON lines, exit status, keep-up verdict)."""
    settings = live.LiveSettings(stride=live.default_stride(options), topk=1)
    err = io.StringIO()
    frames = open_frames(source, options, settings, seconds, lambda text: print(text, file=err))
    fps = frames.frame_rate or 25.0
    scorer = live.WindowScorer(model, options, torch.device('cpu'), settings.crop, settings.half)
    per_window = scorer.time_per_window(frames.frame_size, repeats=args.repeats)
    class_names = [f'class_{i:03d}' for i in range(N_CLASSES)]
    with tempfile.TemporaryDirectory() as folder:
        lines_path = Path(folder) / 'windows.jsonl'
        if seconds is not None:  # a camera or a live stream never ends: stopped after --seconds
            timer = threading.Timer(seconds, frames.stop)
            timer.daemon = True
            timer.start()
        status = live.run_stream(source, model, options, class_names, torch.device('cpu'), settings,
                                 lines_path, out=io.StringIO(), err=err, frames=frames)
        lines = [json.loads(line) for line in lines_path.read_text().splitlines()]
    verdict = KEEP_UP.search(err.getvalue())
    return per_window, fps, frames, lines, status, verdict.group(1) if verdict else None


def measure(name, shape, source, seconds, args, label=None):
    """One network's row, classifying ``source`` (read to its end, or for ``seconds``;
    ``label`` names it in the row)."""
    model = build(name, N_CLASSES, 3).eval()
    options = live_options(shape)
    per_window, fps, frames, lines, status, verdict = run_model(model, options, source, seconds, args)
    stride = frames.stride
    every = stride / fps
    latency = np.array([line['latency'] for line in lines]) * 1e3
    span = clip_span(options.sample_duration, options.sample_t_stride)
    pct = (lambda q: float(np.percentile(latency, q))) if len(latency) else (lambda q: None)
    row = dict(model=name, clip=f'{shape[1]}x{shape[2]}', threads=args.threads, source=label or source_name(source),
               fps=fps, stride=stride, ms_per_window=1e3 * per_window, window_every_ms=1e3 * every,
               real_time_factor=every / per_window, keeps_up=per_window <= every,
               keep_up_line=verdict, classified=len(lines), skipped=frames.skipped,
               windows=None if frames.gaps else window_count(frames.frames_read, span, stride),
               frames=frames.frames_read, reconnects=len(frames.gaps), status=status,
               latency_p50_ms=pct(50), latency_p95_ms=pct(95), latency_max_ms=pct(100))
    print(f'  {name} {row["clip"]}: {row["ms_per_window"]:.1f} ms per window, a window every '
          f'{row["window_every_ms"]:.0f} ms ({row["real_time_factor"]:.2f}x real time); '
          f'{row["classified"]} classified, {row["skipped"]} skipped', flush=True)
    return row


def _ms(value):
    return '' if value is None else f'{value:.0f}'


def table(rows):
    lines = ['| network | clip | threads | ms per window | window every (ms) | real-time factor | keeps up? '
             '| classified | skipped | latency p50 / p95 / max (ms) |',
             '|---|---|---:|---:|---:|---:|---|---:|---:|---:|']
    for r in rows:
        latency = ' / '.join(_ms(r[f'latency_{k}_ms']) for k in ('p50', 'p95', 'max'))
        lines.append(f'| {r["model"]} | {r["clip"]} | {r["threads"]} | {r["ms_per_window"]:.1f} | '
                     f'{r["window_every_ms"]:.0f} | {r["real_time_factor"]:.2f} | '
                     f'{"yes" if r["keeps_up"] else "no"} | {r["classified"]} | {r["skipped"]} | {latency} |')
    return '\n'.join(lines)


def parse_args(argv):
    p = Parser(prog='python -m bench.live', description=__doc__,
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--models', nargs='+', default=list(DEFAULT_MODELS),
                   help='util_scripts.model_summary names, and x3d-xs|s|m|l')
    p.add_argument('--seconds', type=float, default=20.0,
                   help='length of the generated video (with --source: how long each network reads it)')
    p.add_argument('--fps', type=float, default=25.0, help='frame rate of the generated video')
    p.add_argument('--source', default=None, metavar='URL',
                   help='classify this stream (as predict.py --stream takes it) instead of a generated video')
    p.add_argument('--threads', type=int, default=os.cpu_count())
    p.add_argument('--repeats', type=int, default=5, help='windows timed for the time per window')
    p.add_argument('--sample_duration', type=int, default=None)
    p.add_argument('--sample_size', type=int, default=None)
    p.add_argument('--json', type=Path, default=None, help='also write the rows here')
    args = p.parse_args(argv)
    if args.seconds <= 0 or args.fps <= 0 or args.threads < 1 or args.repeats < 1:
        p.error('--seconds and --fps must be positive, --threads and --repeats at least 1')
    return args


def main(argv=None):
    args = parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    print(f'torch {torch.__version__}, {args.threads} threads of {os.cpu_count()} cores', flush=True)
    rows = []
    try:
        with tempfile.TemporaryDirectory() as folder:
            source, seconds, label = args.source, args.seconds, None
            if source is None:
                source, seconds = str(Path(folder) / 'live.mp4'), None
                n = make_video(source, args.seconds, args.fps)
                label = f'generated {WIDTH}x{HEIGHT} H.264, {n} frames at {args.fps:g} fps'
                print(label, flush=True)
            for name in args.models:
                rows.append(measure(name, clip_shape(name, args.sample_duration, args.sample_size), source,
                                    seconds, args, label))
    except DataError as e:  # a --source that cannot be opened: one line
        print(f'error: {e}', file=sys.stderr)
        raise SystemExit(2) from None
    finally:
        torch.set_num_threads(threads)
    return report(rows, table(rows), args.json)


if __name__ == '__main__':
    main()
