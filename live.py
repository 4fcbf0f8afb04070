"""Classifying a live source as it plays (predict.py --stream).

The frames come from datasets/live.py's reader thread, windows of the
checkpoint's clip (``sample_duration`` frames every ``sample_t_stride``)
every ``stride`` frames. Each window is cut, resized and normalized exactly as
--inference does it (dataset.eval_views, datasets/videodataset.make_clips)
and scored like classify.py's windows (inference.score_views); ``smooth``
averages the last windows' scores. One line per window: the stream time of its
last frame, the top classes, the latency from that frame's decoding to the
result and the windows skipped so far (a model slower than the stream serves
the newest window; the lag stays bounded).
"""
from __future__ import annotations

import collections
import json
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import torch

import dataset as data
from datasets.device_batches import ToDevice
from datasets.frame_conversion import reduced_size
from datasets.live import LiveFrames, LiveWindow, eval_plan, source_name
from datasets.temporal_transforms import clip_span
from datasets.videodataset import make_clips
from inference import score_views, topk_entries

__all__ = ['LiveSettings', 'default_stride', 'run_stream']


@dataclass(frozen=True)
class LiveSettings:
    stride: int  # frames between windows
    smooth: int = 1  # windows averaged
    topk: int = 5
    crop: str = 'center'
    reconnect: int = 3
    timeout: float = 10.0  # seconds without data before a source counts as dropped
    half: bool = False  # fp16 autocast (a GPU)


@dataclass
class Session:
    """What the summary reports."""
    latencies: list = field(default_factory=list)
    top1: collections.Counter = field(default_factory=collections.Counter)
    classified: int = 0


def default_stride(options) -> int:
    """Half a window's span (at least one frame)."""
    return max(1, clip_span(options.sample_duration, options.sample_t_stride) // 2)


def window_positions(options) -> list[int]:
    """The window's sampled frames, as positions in its span."""
    return list(range(options.sample_duration))


class WindowScorer:
    """A window's frames -> softmax over the classes (the mean over its crops),
    through the same steps as classify.py's sliding windows (predict.py)."""

    def __init__(self, model, options, device, crop, half):
        self.model, self.device, self.half = model, device, half
        _, self.spatial = data.eval_views(options, 0, 1, crop)
        self.to_device = ToDevice(device, self.spatial.device_normalizer)
        self.positions = window_positions(options)

    def __call__(self, window) -> torch.Tensor:
        frames = torch.from_numpy(np.stack(window.frames)).permute(0, 3, 1, 2)
        clip = make_clips(frames, self.positions, [self.positions], self.spatial, False,
                          window.plan, window.factor)
        batch = [(self.to_device.clips(clip[None]), torch.tensor([0]),
                  [torch.tensor([0]), torch.tensor([0])])]
        (_, _, probs, _), = score_views(batch, self.model, amp=self.half, amp_dtype='fp16')
        return probs[0].double().mean(0).float()

    def time_per_window(self, frame_shape, repeats=2) -> float:
        """Seconds per window after a warm-up pass, on a blank window."""
        window = _blank_window(frame_shape, len(self.positions), self.spatial)
        self(window)
        start = time.perf_counter()
        for _ in range(repeats):
            self(window)
        return (time.perf_counter() - start) / repeats


def _blank_window(frame_shape, n, spatial):
    """A window of black frames as the reader would convert frames of that shape."""
    plan, factor = eval_plan(spatial, frame_shape[:2])
    h, w = reduced_size(*frame_shape[:2], factor)
    return LiveWindow(0, [np.zeros((h, w, 3), np.uint8)] * n, plan, factor, 0.0, 0.0)


def one_thread_time(scorer, frame_shape) -> float | None:
    """Seconds per window with one intra-op thread (None where torch has one already):
    on a busy machine a pool of threads waiting on each other can cost more than the model."""
    threads = torch.get_num_threads()
    if threads == 1:
        return None
    torch.set_num_threads(1)
    try:
        return scorer.time_per_window(frame_shape)
    finally:
        torch.set_num_threads(threads)


def keep_up_line(per_window, stride, fps, one_thread=None) -> str:
    """``one_thread``: seconds per window with one thread, where measured."""
    every = stride / fps
    if per_window <= every:
        return f'keeps up: {per_window:.3f} s per window, a window every {every:.3f} s'
    line = (f'cannot keep up: {per_window:.3f} s per window, a window every {every:.3f} s '
            f'(windows will be skipped): ')
    if one_thread is not None and one_thread < 0.8 * per_window:
        line += (f'the time is lost to threads, not the model ({one_thread:.3f} s per window with one): '
                 f'use --threads 1')
        if one_thread <= every:
            return line
        per_window = one_thread
        line += ' and '
    else:
        line += 'use '
    return line + f'--stride {int(np.ceil(per_window * fps))} or more, or a smaller model'


def format_window(t, entries, latency, skipped) -> str:
    labels = ', '.join(f'{e["label"]} {e["score"]:.3f}' for e in entries)
    return f'{t:9.3f} s  {labels}  latency {latency:.3f} s  skipped {skipped}'


def run_stream(source, model, options, class_names, device, settings: LiveSettings,
               output_json=None, out=None, err=None, frames=None) -> int:
    """Classifies ``source`` until it ends: a line per window on ``out``, notes
    and the summary on ``err`` (default: standard output and error). Returns the
    exit status: 0 at the end or on Ctrl-C, 1 when the source was lost."""
    out, err = out or sys.stdout, err or sys.stderr
    scorer = WindowScorer(model, options, device, settings.crop, settings.half)
    note = lambda text: print(text, file=err, flush=True)  # noqa: E731
    try:
        frames = frames or LiveFrames(source, scorer.spatial, clip_span(options.sample_duration,
                                                                        options.sample_t_stride),
                                      settings.stride, options.sample_t_stride, settings.reconnect,
                                      settings.timeout, note)
    except KeyboardInterrupt:
        note(f'stopped (Ctrl-C) before stream {source_name(source)} opened')
        return 0
    session = Session()
    sink = open(output_json, 'w') if output_json is not None else None
    try:
        fps = frames.frame_rate or 25.0
        height, width = frames.frame_size
        per_window = scorer.time_per_window((height, width))
        one_thread = one_thread_time(scorer, (height, width)) if per_window > settings.stride / fps else None
        note(f'stream {source_name(source)}: {width}x{height} at {fps:g} fps; '
             + keep_up_line(per_window, settings.stride, fps, one_thread))
        _classify_windows(frames.start(), scorer, class_names, settings, session, out, sink)
    except KeyboardInterrupt:
        note('stopped (Ctrl-C)')
    finally:
        try:
            frames.stop()  # waits for the reader: at most a read's timeout
        except KeyboardInterrupt:
            note('stopped again (Ctrl-C): not waiting for the reader')
        if sink is not None:
            sink.close()
    for line in summary_lines(session, frames, class_names):
        note(line)
    return 1 if frames.ending in ('lost', 'error') else 0


def _classify_windows(frames, scorer, class_names, settings, session, out, sink):
    recent = collections.deque(maxlen=settings.smooth)
    while (window := frames.next_window()) is not None:
        recent.append(scorer(window))
        scores = torch.stack(list(recent)).mean(0)
        entries = topk_entries(scores, class_names, settings.topk)
        latency = time.monotonic() - window.arrival
        session.latencies.append(latency)
        session.top1[entries[0]['label']] += 1
        session.classified += 1
        print(format_window(window.stream_time, entries, latency, frames.skipped), file=out,
              flush=True)
        if sink is not None:
            sink.write(json.dumps({'time': round(window.stream_time, 6), 'first_frame': window.first_frame,
                                   'results': entries, 'latency': round(latency, 6),
                                   'skipped': frames.skipped}) + '\n')
            sink.flush()


def summary_lines(session, frames, class_names) -> list[str]:
    lost = f'the source was lost ({frames.reconnect} reconnects failed)' if frames.reconnect \
        else 'the source dropped (--reconnect 0)'
    why = {'end': 'the stream ended', 'lost': lost,
           'error': f'reading failed: {frames.error}'}.get(frames.ending, 'stopped')  # Ctrl-C, stop()
    lines = [f'summary: {why}; {frames.frames_read} frames, {session.classified} windows '
             f'classified, {frames.skipped} skipped']
    if session.latencies:
        lat = np.array(session.latencies)
        lines.append(f'  latency: median {np.median(lat):.3f} s, p95 {np.percentile(lat, 95):.3f} s, '
                     f'max {lat.max():.3f} s')
    if frames.gaps:
        lines.append(f'  reconnected {len(frames.gaps)} time(s), gaps: '
                     + ', '.join(f'{g:.1f} s' for g in frames.gaps))
    if session.top1:
        lines.append('  top classes: ' + ', '.join(f'{label} ({n} windows)'
                                                   for label, n in session.top1.most_common(5)))
    return lines
