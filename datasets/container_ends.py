"""Where a video file's data should end, by the container's own structure: the
byte-level facts that tell a download cut short from a whole file, for
datasets/cut_videos.py's truncation decision (FFmpeg's demuxers read past a cut
without a word). One function a container: MP4/MOV boxes, Matroska/WebM (EBML)
elements, ASF's Data Object, FLV's stated file size, Ogg pages.

Each reads a ``source``: a path, the bytes of a payload, or an open seekable binary
file (a shard member, datasets/storage.py), whose position is put back after, so
that the demuxer reading the same file goes on where it was: a video is judged by
the bytes the loader reads, wherever they come from."""
import contextlib
import io
import os
import struct

__all__ = ['asf_data_end', 'flv_file_size', 'matroska_cut', 'matroska_duration', 'mp4_index_cut',
           'ogg_unfinished', 'read_head', 'source_size']


@contextlib.contextmanager
def _reading(source):
    """(binary file, its size) of a path, bytes or an open file (its position kept)."""
    if isinstance(source, (str, os.PathLike)):
        with open(source, 'rb') as f:
            yield f, os.fstat(f.fileno()).st_size
        return
    if isinstance(source, (bytes, bytearray, memoryview)):
        yield io.BytesIO(source), len(source)
        return
    position = source.tell()
    try:
        yield source, source.seek(0, io.SEEK_END)
    finally:
        source.seek(position)


def source_size(source) -> int | None:
    """The size in bytes of a path, bytes or open file; None if it cannot be read."""
    try:
        with _reading(source) as (_, size):
            return size
    except (OSError, ValueError):
        return None


def read_head(source, n: int = 65536) -> tuple[bytes, int]:
    """(the first ``n`` bytes, the size) of a file; (b'', 0) if it cannot be read."""
    try:
        with _reading(source) as (f, size):
            f.seek(0)
            return f.read(n), size
    except (OSError, ValueError):
        return b'', 0


_ASF_HEADER = bytes.fromhex('3026b2758e66cf11a6d900aa0062ce6c')
_ASF_DATA = bytes.fromhex('3626b2758e66cf11a6d900aa0062ce6c')


def asf_data_end(head: bytes) -> int | None:
    """Where an ASF file's Data Object (the packets; right after the Header Object)
    ends by its own size; None if the head does not say (0: a live writer's)."""
    if not head.startswith(_ASF_HEADER) or len(head) < 24:
        return None
    at = int.from_bytes(head[16:24], 'little')
    if head[at:at + 16] != _ASF_DATA or len(head) < at + 24:
        return None
    size = int.from_bytes(head[at + 16:at + 24], 'little')
    return at + size if size >= 50 else None


def flv_file_size(head: bytes) -> int | None:
    """The file size a FLV file's onMetaData states (FFmpeg writes it once done)."""
    at = head.find(b'\x00\x08filesize\x00') if head.startswith(b'FLV') else -1
    if at < 0 or len(head) < at + 19:
        return None
    size = struct.unpack('>d', head[at + 11:at + 19])[0]
    return int(size) if size > 0 else None


def ogg_unfinished(source) -> bool:
    """An Ogg file that does not end with a whole page flagged end-of-stream was cut
    (its header holds no length to compare with).  Pages are walked from the first
    in the last 64 KiB (a page is at most 65307 bytes), each by its own length."""
    try:
        with _reading(source) as (f, size):
            f.seek(max(0, size - 65536))
            tail = f.read()
    except (OSError, ValueError):
        return False
    start = tail.find(b'OggS')
    while start >= 0:
        at = last = start
        while at + 27 <= len(tail) and tail[at:at + 4] == b'OggS':
            lacing = tail[at + 27:at + 27 + tail[at + 26]]
            last, at = at, at + 27 + len(lacing) + sum(lacing)
        if at == len(tail):  # pages chained to the end: the last is whole
            return not tail[last + 5] & 0x04
        if at > len(tail) or (at + 27 > len(tail) and b'OggS'.startswith(tail[at:at + 4])):
            return True  # a page, or its header, cut by the end of the file
        start = tail.find(b'OggS', start + 1)  # not a page start: data that looks like one
    return False


# Matroska/WebM (EBML) element ids: the Segment, the Cluster (the frames' data), the
# Info (with the Duration, in TimestampScale units).
_EBML_SEGMENT, _EBML_CLUSTER = 0x18538067, 0x1F43B675
_EBML_INFO, _EBML_SCALE, _EBML_DURATION = 0x1549A966, 0x2AD7B1, 0x4489
# The EBML header and the Segment's children (level 1): where one starts, an element
# of unknown size before it (a live writer's Cluster: a browser's MediaRecorder, OBS) ends.
_EBML_TOP = {0x1A45DFA3, _EBML_SEGMENT, 0x114D9B74, _EBML_INFO, 0x1654AE6B, _EBML_CLUSTER, 0x1C53BB6B,
             0x1941A469, 0x1043A770, 0x1254C367}


def _ebml_number(data: bytes, at: int, is_id: bool) -> tuple[int | None, int]:
    """(value, length) of the EBML variable-size number at ``at``: an element id
    (marker bit kept) or size (None: unknown, all ones).  IndexError past ``data``,
    ValueError if it is none (no marker bit, or an id longer than 4 bytes)."""
    length = 9 - data[at].bit_length()
    if length > 8 or (is_id and length > 4):
        raise ValueError('not an EBML number')
    if at + length > len(data):
        raise IndexError('an EBML number cut off')
    value = int.from_bytes(data[at:at + length], 'big')
    if is_id:
        return value, length
    value &= (1 << 7 * length) - 1
    return (None if value == (1 << 7 * length) - 1 else value), length


def _ebml_header(data: bytes, at: int = 0) -> tuple[int, int | None, int]:
    """(id, size or None if unknown, header length) of the element at ``at``."""
    element, n = _ebml_number(data, at, True)
    size, m = _ebml_number(data, at + n, False)
    return element, size, n + m


def _segment(f) -> tuple[int, int | None, bytes]:
    """(where the Segment's data starts, its size or None, the first 4 KiB)."""
    f.seek(0)
    head = f.read(4096)
    at = 0
    while True:  # the EBML header, then the Segment
        element, size, n = _ebml_header(head, at)
        if element == _EBML_SEGMENT:
            return at + n, size, head
        if size is None:
            raise ValueError('an EBML header of unknown size')
        at += n + size


def matroska_cut(source) -> bool | None:
    """Whether a Matroska/WebM file lost frames (it ends inside a Cluster); None if
    that cannot be told.  The common whole file ends where its Segment's size says
    (one read); else the Segment's elements are walked (a 4 KiB read per Cluster):
    one running past the end of the file is cut if it is a Cluster, not if it is the
    Cues, tags or other metadata writers put after the Clusters (every frame is
    there).  A Cluster of unknown size (a live writer's) is walked block by block
    up to the next level-1 element: a block running past the end is cut.  A walk
    that ends at the end of the file, between two elements, is cut if the Segment's
    size is known (and larger); with no size stated, after a Cluster it cannot be
    told from a live recording that stopped there (None), after the Cues or other
    closing metadata the file is whole."""
    try:
        with _reading(source) as (f, file_size):
            at, size, _ = _segment(f)
            if size is not None and at + size <= file_size:
                return False
            return _walk_segment(f, at, file_size, size is not None)
    except (OSError, IndexError, ValueError):  # no Segment to walk: FFmpeg's word stands
        return False


def _walk_segment(f, at: int, file_size: int, sized: bool) -> bool | None:
    """matroska_cut's walk from ``at`` (the Segment's first child); ``sized``: the
    Segment states a size, larger than the file."""
    window, start = b'', 0
    in_cluster, last = False, None  # inside a Cluster of unknown size; the last level-1 id
    while at < file_size:
        if not start <= at <= start + len(window) - 16:  # 16: the longest element header
            f.seek(at)
            window, start = f.read(4096), at
        try:
            element, size, n = _ebml_header(window, at - start)
        except IndexError:  # the file ends inside an element's header
            return True
        except ValueError:  # not an element: only the Segment's size can tell
            return True if sized else None
        if element in _EBML_TOP:
            in_cluster, last = False, element
        if size is None:
            if element == _EBML_CLUSTER:
                in_cluster = True
            elif not in_cluster and element != _EBML_SEGMENT:  # not walked into
                return True if sized else None
            at += n
            continue
        if at + n + size > file_size:
            return in_cluster or element == _EBML_CLUSTER
        at += n + size
    if sized:
        return True
    return None if last == _EBML_CLUSTER else False


def matroska_duration(source) -> float | None:
    """The duration in seconds a Matroska/WebM file's Info states (a live writer
    states none), None if none is found before the first Cluster."""
    try:
        with _reading(source) as (f, file_size):
            at, _, _ = _segment(f)
            while at < file_size:
                f.seek(at)
                element, size, n = _ebml_header(f.read(16))
                if element == _EBML_CLUSTER or size is None:
                    return None
                if element == _EBML_INFO:
                    f.seek(at + n)
                    return _info_duration(f.read(min(size, 65536)))
                at += n + size
    except (OSError, IndexError, ValueError):
        return None
    return None


def _info_duration(info: bytes) -> float | None:
    scale, duration, at = 1_000_000, None, 0
    while at < len(info):
        element, size, n = _ebml_header(info, at)
        if size is None:
            return None
        value = info[at + n:at + n + size]
        if element == _EBML_SCALE:
            scale = int.from_bytes(value, 'big')
        elif element == _EBML_DURATION and size in (4, 8):
            duration = struct.unpack('>f' if size == 4 else '>d', value)[0]
        at += n + size
    return duration * scale / 1e9 if duration and duration > 0 else None


# The top-level boxes of an MP4/MOV file (ISO BMFF and QuickTime).
_MP4_BOXES = {b'ftyp', b'styp', b'wide', b'free', b'skip', b'mdat', b'moov', b'moof', b'mfra',
              b'sidx', b'pnot', b'uuid', b'meta', b'junk'}


def mp4_index_cut(source) -> bool:
    """An MP4/MOV file whose top-level boxes run past its end before a whole moov box
    (the index, which most writers put last), or end with an mdat and no moov (a
    recording stopped before it wrote its index: an mdat of size 0 or one ending at
    the end of the file): cut short, no demuxer opens it."""
    try:
        with _reading(source) as (f, file_size):
            at, data = 0, False
            while at + 8 <= file_size:
                f.seek(at)
                head = f.read(16)
                length, kind = int.from_bytes(head[:4], 'big'), head[4:8]
                if length == 1 and len(head) == 16:
                    length = int.from_bytes(head[8:16], 'big')
                elif length == 0:  # the box runs to the end of the file
                    length = file_size - at
                if kind not in _MP4_BOXES or length < 8:
                    return False
                if at + length > file_size:
                    return True
                if kind == b'moov':
                    return False
                data |= kind == b'mdat'
                at += length
    except (OSError, ValueError):
        return False
    return data
