"""Temporal sampling: which frame positions make up a clip.

Every transform is called as ``t(frames)`` with a sequence of 0-based
positions (a ``range`` is cheapest: ``VideoRecord.positions``) or as
``t(first_frame, n_frames)``, and returns a list of positions (one clip) or a
list of such lists (several clips).  A clip of ``size`` frames taken every
``t_stride`` frames spans ``(size - 1) * t_stride + 1`` frames; ``t_stride``
(``--sample_t_stride``) is applied by every transform, for training,
validation and inference alike.  When the video is shorter than the span,
the positions that exist are repeated cyclically up to ``size`` (loop
padding).

Randomness (:class:`TemporalRandomCrop` only) comes from Python's ``random``
module global state by default -- PyTorch's DataLoader seeds it differently
in each worker from the base seed -- or from the ``random.Random`` given as
``rng``.
"""
from __future__ import annotations

import random
from typing import Sequence

__all__ = ['TemporalRandomCrop', 'TemporalCenterCrop', 'TemporalEvenCrop', 'SlidingWindow',
           'clip_span']


def clip_span(size: int, t_stride: int = 1) -> int:
    """Number of consecutive frames a clip of ``size`` frames every ``t_stride`` covers."""
    return (size - 1) * t_stride + 1


def _frames(frames, n_frames) -> Sequence[int]:
    if n_frames is not None:
        return range(int(frames), int(frames) + int(n_frames))
    if isinstance(frames, int):
        raise TypeError('pass a sequence of positions, or (first_frame, n_frames)')
    if len(frames) == 0:
        raise ValueError('cannot sample a clip from a video with no frames')
    return frames


def _clip(frames: Sequence[int], start: int, size: int, t_stride: int) -> list[int]:
    """``size`` positions from index ``start`` every ``t_stride``, loop-padded."""
    avail = frames[start:start + clip_span(size, t_stride):t_stride]
    if len(avail) >= size:
        return list(avail[:size])
    m = len(avail)
    return [avail[i % m] for i in range(size)]


class _Base:
    def __init__(self, size: int, t_stride: int = 1):
        if size < 1 or t_stride < 1:
            raise ValueError(f'size ({size}) and t_stride ({t_stride}) must be >= 1')
        self.size = int(size)
        self.t_stride = int(t_stride)

    @property
    def span(self) -> int:
        return clip_span(self.size, self.t_stride)

    def __repr__(self):
        args = ', '.join(f'{k}={v}' for k, v in vars(self).items() if k != 'rng')
        return f'{type(self).__name__}({args})'


class TemporalRandomCrop(_Base):
    """A random window; every start 0 .. L - span (inclusive) is equally likely.
    Videos shorter than the span start at 0 and are loop-padded."""

    def __init__(self, size: int, t_stride: int = 1, rng: random.Random | None = None):
        super().__init__(size, t_stride)
        self.rng = rng

    def __call__(self, frames, n_frames: int | None = None) -> list[int]:
        frames = _frames(frames, n_frames)
        last_start = len(frames) - self.span
        rng = self.rng if self.rng is not None else random
        start = rng.randint(0, last_start) if last_start > 0 else 0
        return _clip(frames, start, self.size, self.t_stride)


class TemporalCenterCrop(_Base):
    """The window in the middle: start (L - span) // 2."""

    def __call__(self, frames, n_frames: int | None = None) -> list[int]:
        frames = _frames(frames, n_frames)
        return _clip(frames, max(0, (len(frames) - self.span) // 2), self.size, self.t_stride)


class TemporalEvenCrop(_Base):
    """``n_samples`` clips evenly spread: start i is ``i * (L - span) // (n_samples - 1)``
    (first at 0, last ending on the last frame); one sample is the center crop.
    Clips overlap (or coincide, loop-padded) on short videos.  Validation takes
    all clips of a video as one item; inference one clip an item
    (:meth:`n_windows`, :meth:`window`)."""

    def __init__(self, size: int, n_samples: int = 3, t_stride: int = 1):
        super().__init__(size, t_stride)
        if n_samples < 1:
            raise ValueError(f'n_samples must be >= 1, got {n_samples}')
        self.n_samples = int(n_samples)

    def starts(self, n_frames: int) -> list[int]:
        room = max(0, n_frames - self.span)
        if self.n_samples == 1:
            return [room // 2]
        return [i * room // (self.n_samples - 1) for i in range(self.n_samples)]

    def __call__(self, frames, n_frames: int | None = None) -> list[list[int]]:
        frames = _frames(frames, n_frames)
        return [_clip(frames, s, self.size, self.t_stride) for s in self.starts(len(frames))]

    # The window interface of SlidingWindow, so that inference can take the
    # clips one item at a time (--inference_n_clips).
    def n_windows(self, n_frames: int) -> int:
        return self.n_samples

    def start(self, n_frames: int, k: int) -> int:
        return self.starts(n_frames)[k]

    def window(self, frames, k: int, n_frames: int | None = None) -> list[int]:
        frames = _frames(frames, n_frames)
        return _clip(frames, self.start(len(frames), k), self.size, self.t_stride)


class SlidingWindow(_Base):
    """Windows starting at 0, window_stride, 2 * window_stride, ... until one
    reaches the last frame (that one is loop-padded if it runs past the end);
    windows = 1 + ceil(max(0, L - span) / window_stride).
    For inference; :meth:`n_windows` and :meth:`window` let a data set index
    windows without listing them."""

    def __init__(self, size: int, window_stride: int = 16, t_stride: int = 1):
        super().__init__(size, t_stride)
        if window_stride < 1:
            raise ValueError(f'window_stride must be >= 1, got {window_stride}')
        self.window_stride = int(window_stride)

    def n_windows(self, n_frames: int) -> int:
        room = max(0, n_frames - self.span)
        return 1 + -(-room // self.window_stride)

    def start(self, n_frames: int, k: int) -> int:
        """Index (into the video's positions) of the first frame of window ``k``.
        Normally ``k * window_stride``; only when a stride longer than the span
        would put the last window past the end is it moved back to end on the
        last frame."""
        s = k * self.window_stride
        return s if s < n_frames else max(0, n_frames - self.span)

    def window(self, frames, k: int, n_frames: int | None = None) -> list[int]:
        """Positions of window ``k``."""
        frames = _frames(frames, n_frames)
        return _clip(frames, self.start(len(frames), k), self.size, self.t_stride)

    def __call__(self, frames, n_frames: int | None = None) -> list[list[int]]:
        frames = _frames(frames, n_frames)
        n = len(frames)
        return [_clip(frames, self.start(n, k), self.size, self.t_stride)
                for k in range(self.n_windows(n))]
