"""Opening a video file for the readers of datasets/ (the clip loader, the frame
index, the counters): a path, or a shard member of a ShardStore (datasets/storage.py),
with PyAV.  A file that cannot be opened, holds no moving video (only a cover
picture, datasets.video_stream) or is an MP4 cut before its index gives one
DataError naming it; ``set_threads`` sets the decoder threads every reader uses.
"""
from __future__ import annotations

from datasets import container_ends as ends
from datasets.video_stream import only_pictures, video_stream
from utils.errors import DataError

__all__ = ['EXACT_COUNT_FORMATS', 'REENCODE', 'container_source', 'open_video', 'pyav', 'set_threads']

# Containers whose header frame count is the number of coded frames (a sample table).
EXACT_COUNT_FORMATS = ('mov', 'mp4')
REENCODE = 're-download or re-encode the video'  # true wherever it is read (DataError)


def pyav():
    import av  # imported lazily: jpg/hdf5 runs do not need PyAV
    return av


def open_video(path: str, store=None):
    """The container of the video file at ``path``, or with a ShardStore
    (datasets/storage.py) of its payload REL ``path`` (one ranged read)."""
    av = pyav()
    if store is not None:
        return _open_member(av, path, store)
    try:
        container = av.open(path)
    except FileNotFoundError:
        raise DataError(f'video file {path} not found: check --video_path') from None
    except (av.FFmpegError, OSError, UnicodeDecodeError) as e:
        raise _open_error(path, path, e, '') from None
    return _with_video(container, path)


def _open_error(name: str, source, error, then: str) -> DataError:
    """Why the video ``name`` (bytes: ``source``, what it was opened from) cannot be
    opened: an MP4 without its index is cut short (container_ends.mp4_index_cut)."""
    if ends.mp4_index_cut(source):
        return DataError(f'video file {name} is cut short (a truncated download?): its index '
                         f'(the moov box, written last) is missing, no frame can be read: '
                         f'{REENCODE}{then}')
    return DataError(f'video file {name} cannot be opened ({error}): {REENCODE}{then}')


def _open_member(av, rel: str, store):
    payload = store.open_member(rel)
    try:
        container = av.open(payload)
    except (av.FFmpegError, OSError, UnicodeDecodeError) as e:
        error = _open_error(store.where(rel), payload, e, ', then util_scripts.make_shards again')
        payload.close()
        raise error from None
    return _with_video(container, store.where(rel))


def container_source(container):
    """What a container reads (for container_ends): the file object it was opened
    from (a shard member, a cached payload), else its path."""
    return container.file.file if container.file is not None else container.name


def _with_video(container, name: str):
    """The container, if it has a video stream to read (video_stream: FFmpeg's pick,
    never a cover picture); else closed, and a DataError naming the file."""
    if video_stream(container) is None:
        pictures = only_pictures(container)
        container.close()
        if pictures:
            raise DataError(f'video file {name} holds no moving video, only a still picture '
                            f'(a cover): leave it out of the data set, or re-download the video')
        raise DataError(f'video file {name} has no video stream: {REENCODE}')
    return container


def set_threads(stream, threads: int) -> None:
    """``threads`` decoder threads (0: FFmpeg picks one per core).  1 is set too:
    left alone, PyAV's default (0) starts a pool of threads per open container
    (a DataLoader worker had 19 more threads after clips of 12 videos)."""
    ctx = stream.codec_context
    ctx.thread_count = threads
    if threads != 1:
        ctx.thread_type = 'AUTO'
