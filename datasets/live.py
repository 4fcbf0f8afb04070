"""Live sources -- a camera, a network stream, a pipe -- read as they play.

A reader thread decodes the source's frames as they arrive and converts each
with the video loader's own conversion (datasets.frame_conversion.frame_array,
at the scale the eval crop plans: the frames a file of the same video would give),
keeping the last ``span`` of them in a ring. Each frame that completes a
window (every ``stride`` frames) puts the window into a one-slot mailbox. A
consumer slower than the stream finds only the newest window there: the ones
it could not serve are counted as skipped and their frames dropped with the
ring, so the lag never grows.

A network source that drops (end of data, an error, no data for ``timeout``
seconds) is reopened with backoff up to ``reconnect`` times; windows never
span the gap. Local files and http(s) files (not live themselves) are paced to
their timestamps, so they play as a live source would; an http(s) file that
drops goes on after the last frame read. Nor do windows span a change of frame
size; timestamps that do not advance are replaced by frames counted at the
stream's rate.
"""
from __future__ import annotations

import collections
import contextlib
import signal
import sys
import threading
import time
from dataclasses import dataclass

import numpy as np

from datasets.frame_conversion import frame_array, new_scaler, upright_size
from datasets.spatial_transforms import DCT_FACTORS
from datasets.video_stream import only_pictures, video_stream
from utils.errors import DataError
from utils.urls import redact_url

__all__ = ['LiveFrames', 'LiveWindow', 'eval_plan', 'open_source', 'is_reconnectable', 'source_name']

NETWORK_SCHEMES = ('rtsp', 'rtsps', 'rtmp', 'udp', 'tcp', 'srt', 'http', 'https')
# Sources that are live themselves: played as they come, never paced.
_LIVE_SCHEMES = ('rtsp', 'rtsps', 'rtmp', 'udp', 'tcp', 'srt')


def source_name(source: str) -> str:
    """The source as it may be printed or written (no password)."""
    return 'standard input' if source == '-' else redact_url(source)


def _scheme(source: str) -> str | None:
    head, sep, _ = source.partition('://')
    return head.lower() if sep else None


def is_reconnectable(source: str) -> bool:
    return _scheme(source) in NETWORK_SCHEMES


def _paced(source: str) -> bool:
    """A file (local or over http) plays at its frame rate, as a live source would;
    so does HLS, whose server publishes whole segments at once (their frames would
    come in one burst)."""
    if source == '-' or source.startswith('/dev/'):
        return False
    return _scheme(source) in (None, 'http', 'https')


def _open_options(source: str, timeout: float) -> tuple[dict, str | None]:
    """(FFmpeg options, format) for a live source: a read that gets no data for
    ``timeout`` seconds fails (and the source is reopened) instead of hanging."""
    us = str(int(timeout * 1e6))
    scheme = _scheme(source)
    # MPEG-TS has no header: FFmpeg would read 5 s of a live stream before the first frame
    probe = {'analyzeduration': '1000000'} if scheme in _LIVE_SCHEMES or source == '-' else {}
    if scheme in ('rtsp', 'rtsps'):
        return {'rtsp_transport': 'tcp', 'timeout': us, **probe}, None
    if scheme == 'udp':
        return {'timeout': us, 'overrun_nonfatal': '1', 'fifo_size': '50000', **probe}, None
    if scheme in NETWORK_SCHEMES:
        return {'rw_timeout': us, **probe}, None
    if source.startswith('/dev/video'):
        return {}, 'v4l2'
    return probe, None


@contextlib.contextmanager
def _ctrl_c_noted():
    """Ctrl-C during FFmpeg's wait is noted, then raised when the wait ends: av.open
    ends a wait with a Ctrl-C in it as it ends a timeout (ExitError), and no
    KeyboardInterrupt followed it. Only the main thread receives signals."""
    if threading.current_thread() is not threading.main_thread():
        yield []
        return
    noted = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: noted.append(signum))
    try:
        yield noted
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)
        if noted:
            raise KeyboardInterrupt  # in place of the error the wait ended with


def open_source(source: str, timeout: float = 10.0):
    """An open PyAV container of the source with a video stream, or a DataError
    naming it (without its password); KeyboardInterrupt on Ctrl-C meanwhile."""
    import av
    options, fmt = _open_options(source, timeout)
    # the raw pipe: a buffered read(n) would wait for n bytes, seconds of a slow stream
    target = sys.stdin.buffer.raw if source == '-' else source
    with _ctrl_c_noted() as interrupted:
        try:
            container = av.open(target, format=fmt, options=options, timeout=timeout)
        except av.ExitError:  # PyAV's timeout (a Ctrl-C is raised in its place on leaving)
            raise DataError(f'stream {source_name(source)} cannot be opened: no data for {timeout:g} s '
                            '(--stream_timeout)') from None
        except (av.FFmpegError, OSError) as e:
            raise DataError(f'stream {source_name(source)} cannot be opened: '
                            f'{redact_url(str(e))}') from None
        if interrupted:
            container.close()
    if video_stream(container) is None:  # FFmpeg's pick, never a cover picture
        pictures = only_pictures(container)
        container.close()
        raise DataError(f'stream {source_name(source)} has no video stream' +
                        (', only a still picture (a cover)' if pictures else ''))
    return container


def _frame_rate(container) -> float | None:
    stream = video_stream(container)
    rate = stream.average_rate or stream.guessed_rate or stream.base_rate
    return float(rate) if rate else None


def _frame_size(container) -> tuple[int, int]:
    """(height, width) of the source's frames as its header says."""
    stream = video_stream(container)
    return stream.height, stream.width


def _seconds(frame) -> float:
    return frame.time if frame.time is not None else time.monotonic()


@dataclass
class LiveWindow:
    """The frames of one window: ``frames`` the sampled ones (every t_stride-th of
    the span), uint8 (H, W, 3) at 1/factor for ``plan``."""
    first_frame: int  # position of its first frame in the session (frames since the start)
    frames: list
    plan: object
    factor: int
    stream_time: float  # seconds of its last frame since the session's first
    arrival: float  # time.monotonic() when its last frame was decoded


class _Mailbox:
    """One slot: a window put while another waits replaces it (counted as skipped)."""

    def __init__(self):
        self.cond = threading.Condition()
        self.window = None
        self.closed = False
        self.skipped = 0

    def put(self, window):
        with self.cond:
            if self.window is not None:
                self.skipped += 1
            self.window = window
            self.cond.notify()

    def close(self):
        with self.cond:
            self.closed = True
            self.cond.notify()

    def take(self):
        """The newest window, or None once the reader ended and none is left."""
        with self.cond:
            while self.window is None and not self.closed:
                self.cond.wait()
            window, self.window = self.window, None
            return window


def eval_plan(spatial, size) -> tuple[object, int]:
    """(the eval transform's plan for frames of ``size`` (height, width), the
    reduction it allows): what the video loader decodes a file's frames at."""
    plan = spatial.plan(size)
    return plan, 1 if plan is None else plan.reduction(DCT_FACTORS)


class _Converter:
    """Frames as the video loader converts them, at the reduction the eval
    crop's plan allows (planned again when the frame size changes)."""

    def __init__(self, spatial, threads: int = 1):
        self.spatial, self.scaler = spatial, new_scaler(threads)
        self.size = self.plan = None
        self.factor = 1

    def __call__(self, frame) -> np.ndarray:
        size = upright_size(frame)
        if size != self.size:
            self.size = size
            self.plan, self.factor = eval_plan(self.spatial, size)
        return frame_array(frame, self.factor, self.scaler)


class LiveFrames:
    """Decodes ``source`` in a thread (start()) into windows of ``span`` frames
    every ``stride`` frames, sampled every ``t_stride``; ``next_window()`` blocks
    for the newest one (None at the end). ``notes(text)`` is told of drops and
    reconnects; ``ending`` says why the reader stopped ('end', 'lost', 'error',
    'stopped': stop() was called)."""

    def __init__(self, source, spatial, span, stride, t_stride=1, reconnect=3, timeout=10.0,
                 notes=print, container=None):
        self.source, self.span, self.stride, self.t_stride = source, span, stride, t_stride
        self.reconnect, self.timeout, self._notes = reconnect, timeout, notes
        self.convert = _Converter(spatial)
        self.container = container if container is not None else open_source(source, timeout)
        self.frame_rate = _frame_rate(self.container)
        self.frame_size = _frame_size(self.container)
        self._stop = threading.Event()
        self.mailbox = _Mailbox()
        self.frames_read = 0
        self.gaps: list[float] = []  # seconds without frames, per reconnect
        self.ending = None
        self.error = None
        self._t_offset = 0.0  # stream time of a connection's first frame in the session
        self._read_error = False
        self._counting_noted = False
        # a file over http(s), not HLS: one that drops goes on where it was, not from its start
        self._a_file = _scheme(source) in ('http', 'https') and 'hls' not in self.container.format.name
        self._reached = self._resume = None  # (seconds, index) of the last frame read
        self._thread = threading.Thread(target=self._run, name='live_reader', daemon=True)

    def notes(self, text):
        if not self._stop.is_set():  # nothing after the consumer's summary
            self._notes(text)

    def stop(self):
        """Stops the reader after the frame it is decoding (or its wait to
        reconnect) and waits for it, at most a read's timeout: a process that
        exits with it still in FFmpeg can abort or hang (std::terminate)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self.timeout + 1.0)

    @property
    def skipped(self) -> int:
        return self.mailbox.skipped

    def start(self):
        self._thread.start()
        return self

    def next_window(self) -> LiveWindow | None:
        return self.mailbox.take()

    def _run(self):
        failures = 0  # reconnects in a row that gave no frame
        try:
            while True:
                before = self.frames_read
                last = self._read_connection()
                failures = 0 if self.frames_read > before else failures
                if self._stop.is_set():
                    self.ending = 'stopped'
                    return
                if not self._dropped():
                    self.ending = 'end'
                    return
                failures = self._reopen(last, failures)
                if failures is None:
                    self.ending = 'stopped' if self._stop.is_set() else 'lost'
                    return
        except Exception as e:  # noqa: BLE001 - reported by the consumer, not a thread traceback
            self.ending, self.error = 'error', f'{type(e).__name__}: {redact_url(str(e))}'
        finally:
            self.mailbox.close()

    def _dropped(self) -> bool:
        """Whether the connection just read dropped (to be reopened): an error on a
        network source, or the end of a live one (a file over http ends)."""
        if self._read_error:
            return is_reconnectable(self.source)
        return _scheme(self.source) in _LIVE_SCHEMES

    def _frames(self):
        """(frame, stream seconds since this connection's first frame) as decoded;
        a drop (an FFmpeg or socket error) ends them like the end of the data."""
        stream = video_stream(self.container)
        stream.thread_type = 'SLICE'  # frame threads would hold frames back (latency)
        resume, self._resume = self._resume, None
        first = previous = None  # stream seconds of the connection's first and last frames
        t, counting, self._read_error = 0.0, False, False
        for index, frame in self._decoded_from(stream, resume):
            seconds = _seconds(frame)
            if first is None:
                first = seconds
            elif counting or seconds <= previous:  # stamped alike (0) by some encoders
                counting = counting or self._count_frames()
                t += 1.0 / (self.frame_rate or 25.0)
            else:
                t = seconds - first
            previous = seconds
            self._reached = (None if counting else frame.time, index)
            yield frame, t

    def _decoded_from(self, stream, position):
        """(index in the file or None, frame) as decoded; a file reopened after a drop
        goes on after ``position`` (its last frame's seconds, or None where they do
        not advance; its index) instead of playing again from its start."""
        import av
        seconds, reached = position or (None, None)
        if seconds is not None:  # near it at once where the file seeks (byte ranges), else read through
            with contextlib.suppress(av.FFmpegError, OSError):
                self.container.seek(int(seconds / stream.time_base), stream=stream, backward=True)
        by_time = seconds is not None
        for index, frame in enumerate(self._decoded(stream)):
            if by_time:
                if seconds is not None and frame.time is not None and frame.time <= seconds:
                    continue
                seconds = None  # found: every frame from here on
                yield None, frame  # its index unknown after a seek
            elif reached is None or index > reached:
                yield index, frame

    def _count_frames(self) -> bool:
        """Says once a session that stream time counts frames from here on."""
        if not self._counting_noted:
            self._counting_noted = True
            self.notes(f'stream {source_name(self.source)}: its timestamps do not advance: the stream '
                       f'time counts frames at {self.frame_rate or 25.0:g} fps')
        return True

    def _decoded(self, stream):
        import av
        try:
            for packet in self.container.demux(stream):
                yield from packet.decode()
        except (av.FFmpegError, OSError) as e:
            self._read_error = True
            why = f'no data for {self.timeout:g} s' if isinstance(e, av.ExitError) else redact_url(str(e))
            self.notes(f'stream {source_name(self.source)}: {why}')
            try:  # the frames still in the decoder (B-frames) are the stream's too
                yield from stream.codec_context.decode(None)
            except (av.FFmpegError, OSError):
                pass

    def _read_connection(self) -> tuple[float, float] | None:
        """Reads one connection to its end; (arrival, stream time) of its last frame."""
        ring = collections.deque(maxlen=self.span)
        start, pace_from, last = self.frames_read, None, None
        for frame, t in self._frames():
            if self._stop.is_set():
                break
            if _paced(self.source):
                pace_from = pace_from or time.monotonic()
                delay = pace_from + t - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                elif delay < -1.0:  # fell behind (a slow source): pace from here on
                    pace_from -= delay
            last = (time.monotonic(), self._t_offset + t)
            size = self.convert.size
            array = self.convert(frame)
            if size is not None and self.convert.size != size:  # a window's frames share one size and crop plan
                self.notes(f'stream {source_name(self.source)}: the frame size changed from '
                           f'{size[1]}x{size[0]} to {self.convert.size[1]}x{self.convert.size[0]} at '
                           f'{last[1]:.3f} s: windows start again at the new size')
                ring.clear()
                start = self.frames_read
            ring.append(array)
            self.frames_read += 1
            n = self.frames_read - start
            if n >= self.span and (n - self.span) % self.stride == 0:
                self.mailbox.put(LiveWindow(self.frames_read - self.span, list(ring)[::self.t_stride],
                                            self.convert.plan, self.convert.factor, last[1], last[0]))
        self.container.close()
        return last

    def _reopen(self, last, failures: int) -> int | None:
        """The source opened again, with backoff: the attempts so far without a
        frame (a source that opens but gives none counts as failed too), or None
        after ``reconnect`` of them."""
        lost_at = last[0] if last is not None else time.monotonic()
        for attempt in range(failures + 1, self.reconnect + 1):
            wait = min(0.5 * 2 ** (attempt - 1), 8.0)
            self.notes(f'stream {source_name(self.source)} dropped: reconnecting in {wait:g} s '
                       f'(attempt {attempt} of {self.reconnect})')
            if self._stop.wait(wait):
                return None
            try:
                self.container = open_source(self.source, self.timeout)
            except DataError as e:
                self.notes(str(e))
                continue
            gap = time.monotonic() - lost_at
            self.gaps.append(gap)
            self._t_offset = (last[1] if last is not None else self._t_offset) + gap
            self._resume = self._reached if self._a_file else None
            self.notes(f'stream {source_name(self.source)} reconnected after a gap of {gap:.1f} s'
                       + ('; the file goes on where it dropped' if self._resume is not None else ''))
            return attempt
        return None
