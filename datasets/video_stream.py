"""Which of a file's video streams every reader takes: the one FFmpeg plays.

A file may hold more than one video stream: the cover picture a downloader
embedded (an *attached picture*: one still image, in an MP4 sometimes listed
first), another rendition, a camera's second angle.  ``container.streams.video[0]``
took whichever came first, so a clip could be the cover repeated or frames of the
wrong size, and a frame count another stream's.  :func:`video_stream` is the one
rule: FFmpeg's own choice, ``av_find_best_stream`` (what ffplay plays; PyAV's
``container.streams.best('video')``), which ranks the stream marked default
first, then one the probe saw several frames of (a still picture has one), then
the higher bit rate; never an attached picture while the file has moving video.
Every reader uses it: the clip loaders and frame index, the frame counters and
check, the preparation tools, predict.py, live sources and stream_file.

Imports nothing but the standard library: PyAV objects come from the caller.
"""
from __future__ import annotations

ATTACHED_PIC = 0x400  # AV_DISPOSITION_ATTACHED_PIC
_DEFAULT = 0x1  # AV_DISPOSITION_DEFAULT
_IMPAIRED = 0x80 | 0x100  # AV_DISPOSITION_HEARING_IMPAIRED | AV_DISPOSITION_VISUAL_IMPAIRED

__all__ = ['ATTACHED_PIC', 'is_attached_picture', 'only_pictures', 'video_stream']


def is_attached_picture(stream) -> bool:
    """Whether the stream is a still picture attached to the file (a cover)."""
    return bool(int(stream.disposition) & ATTACHED_PIC)


def _rank(stream) -> tuple[int, int]:
    """av_find_best_stream's ranking, less the probe's frame count PyAV does not show."""
    flags = int(stream.disposition)
    return (int(not flags & _IMPAIRED) + int(bool(flags & _DEFAULT)),
            int(stream.codec_context.bit_rate or 0))


def video_stream(container):
    """The video stream of an open PyAV container that every reader takes:
    ``av_find_best_stream``'s choice, or, where that is an attached picture while
    moving video exists, the moving stream that ranks first by its rules (the
    first of equals).  None when the container has no video stream but attached
    pictures (an audio file with cover art) or none at all."""
    moving = [s for s in container.streams.video if not is_attached_picture(s)]
    if not moving:
        return None
    best = container.streams.best('video')
    if best is not None and any(best is s for s in moving):
        return best
    return max(moving, key=_rank)  # max keeps the first of equals


def only_pictures(container) -> bool:
    """Whether the container's only video streams are attached pictures."""
    video = container.streams.video
    return bool(video) and all(is_attached_picture(s) for s in video)
