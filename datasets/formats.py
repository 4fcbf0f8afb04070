"""What a video looks like on disk: the one definition of each name the
annotation reader, the frame checks, the loaders, predict.py and the
preparation tools (util_scripts) share.

* ``jpg``: a folder of ``image_{p+1:05d}.jpg`` files; frame position ``p`` is 0-based.
* ``hdf5``: a file whose dataset ``video`` holds the JPEG bytes of frame ``p`` at
  element ``p`` (optical flow: ``video_u`` and ``video_v``, of equal length).
* ``video``: a file with one of :data:`VIDEO_EXTENSIONS` (in any case; two files of
  one name in a folder are refused: :func:`video_files`); position ``p`` is the
  ``p``-th frame in presentation order (datasets/video.py).

:func:`frame_count` counts the frames of a video of any of the three kinds.
"""
from __future__ import annotations

import errno
import os
from pathlib import Path

from utils.errors import DataError

__all__ = ['FILE_TYPES', 'VIDEO_EXTENSIONS', 'HDF5_RGB_KEYS', 'HDF5_FLOW_KEYS', 'HDF5_FRAME_KEYS',
           'HDF5_SUFFIXES', 'frame_file_name', 'frame_number', 'frame_numbers',
           'hdf5_frame_count', 'video_files', 'video_kind', 'frame_count']

FILE_TYPES = ('jpg', 'hdf5', 'video')
# The one list of video containers: the annotation builders (util_scripts) and
# predict.py accept these and the loader looks for <video_path>/<label>/<video_id><ext>
# with one of them (video_files).  Each is in the frame-exactness corpus
# (tests/video_files.py, CORPUS).
VIDEO_EXTENSIONS = ('.mp4', '.avi', '.webm', '.mkv', '.mov', '.m4v', '.flv', '.mpg', '.mpeg',
                    '.3gp', '.wmv', '.ogv')
HDF5_RGB_KEYS = ('video',)  # the hdf5 datasets of an RGB video: JPEG bytes per frame
HDF5_FLOW_KEYS = ('video_u', 'video_v')  # optical flow: grayscale JPEGs, equal lengths
HDF5_FRAME_KEYS = HDF5_RGB_KEYS + HDF5_FLOW_KEYS[:1]  # where a frame count looks
HDF5_SUFFIXES = ('.hdf5', '.h5')  # what predict.py takes for an hdf5 video
_FRAME_PREFIX, _FRAME_SUFFIX = 'image_', '.jpg'


def frame_file_name(position: int) -> str:
    """File name of 0-based frame ``position`` in a jpg folder."""
    return f'{_FRAME_PREFIX}{position + 1:05d}{_FRAME_SUFFIX}'


def frame_number(name: str) -> int | None:
    """N of a frame file ``image_N.jpg`` (1-based), None for any other name."""
    if not (name.startswith(_FRAME_PREFIX) and name.endswith(_FRAME_SUFFIX)):
        return None
    digits = name[len(_FRAME_PREFIX):-len(_FRAME_SUFFIX)]
    return int(digits) if digits.isdigit() else None


def frame_numbers(folder) -> list[int]:
    """Sorted numbers N of the image_N.jpg files in ``folder`` (OSError if it is
    missing or not a folder)."""
    with os.scandir(folder) as entries:
        numbers = [frame_number(e.name) for e in entries]
    return sorted(n for n in numbers if n is not None)


def hdf5_frame_count(h5file) -> int | None:
    """Frames in an open hdf5 video file, None when it has no frame dataset."""
    for key in HDF5_FRAME_KEYS:
        if key in h5file:
            return len(h5file[key])
    return None


def video_files(folder) -> dict[str, str]:
    """{stem: file name} of the video files in ``folder`` (one of VIDEO_EXTENSIONS, in
    any case; hidden names such as macOS '._x.mp4' forks left out), one listing; {}
    when the folder cannot be listed.  The one place where a video's file is found
    for its name, by the loader and the annotation builders alike: two files of one
    name (clip.MP4 and clip.avi) are a DataError, not a choice that either could make
    differently."""
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return {}
    found: dict[str, list[str]] = {}
    for name in names:
        stem, ext = os.path.splitext(name)
        if ext.lower() in VIDEO_EXTENSIONS and not name.startswith('.'):
            found.setdefault(stem, []).append(name)
    shared = [files for files in found.values() if len(files) > 1]
    if shared:
        files = shared[0]
        more = f' ({len(shared) - 1} more names there have several files)' if len(shared) > 1 else ''
        raise DataError(f'{os.fspath(folder)} holds {len(files)} videos named '
                        f'{os.path.splitext(files[0])[0]!r}, {" and ".join(files)}{more}: rename or '
                        f'remove {"one" if len(files) == 2 else "all but one"} (the loader and the '
                        f'annotation builders find a video by its name)')
    return {stem: files[0] for stem, files in found.items()}


def video_kind(path, hdf5_suffixes=HDF5_SUFFIXES) -> str | None:
    """'jpg' (a folder holding image_N.jpg files), 'hdf5', 'video' (by the file's
    extension, in any case: IMG_0001.MP4, as phones name them) or None."""
    path = Path(path)
    if path.is_dir():
        with os.scandir(path) as entries:
            return 'jpg' if any(frame_number(e.name) is not None for e in entries) else None
    suffix = path.suffix.lower()
    if suffix in hdf5_suffixes:
        return 'hdf5'
    return 'video' if suffix in VIDEO_EXTENSIONS else None


def frame_count(path, file_type: str) -> int | None:
    """Frames of one video on disk, numbered as the loaders number them: a jpg
    folder's image_N.jpg files, an hdf5 file's frame dataset (None when it has
    none), a video file's frames (datasets.whole_videos.count_frames: the container's
    count where it is exact, else by decoding).  OSError when the folder or file
    is missing or not of its kind; DataError when a video file does not decode."""
    path = os.fspath(path)
    if file_type == 'jpg':
        return len(frame_numbers(path))
    if file_type == 'hdf5':
        import h5py  # only for hdf5 data: jpg-only runs stay light
        with h5py.File(path, 'r') as f:
            return hdf5_frame_count(f)
    if file_type == 'video':
        if not os.path.isfile(path):
            raise FileNotFoundError(errno.ENOENT, 'no such video file', path)
        from datasets.whole_videos import count_frames  # PyAV only for video files
        return count_frames(path)[0]
    raise ValueError(f'file_type must be one of {FILE_TYPES}, got {file_type!r}')
