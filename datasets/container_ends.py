"""Where a video file's data should end, by the container's own structure: the
byte-level facts that tell a download cut short from a whole file, for
datasets/video.py's truncation decision (FFmpeg's demuxers read past a cut
without a word). One function a container: MP4/MOV boxes, Matroska/WebM (EBML)
elements, ASF's Data Object, FLV's stated file size, Ogg pages."""
import os
import struct

__all__ = ['asf_data_end', 'flv_file_size', 'matroska_cut', 'mp4_index_cut', 'ogg_unfinished', 'read_head']


def read_head(path: str, n: int = 65536) -> tuple[bytes, int]:
    """(the first ``n`` bytes, the size) of a file; (b'', 0) if it cannot be read."""
    try:
        with open(path, 'rb') as f:
            return f.read(n), os.fstat(f.fileno()).st_size
    except OSError:
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


def ogg_unfinished(path: str) -> bool:
    """An Ogg file that does not end with a whole page flagged end-of-stream was cut
    (its header holds no length to compare with).  Pages are walked from the first
    in the last 64 KiB (a page is at most 65307 bytes), each by its own length."""
    try:
        with open(path, 'rb') as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 65536))
            tail = f.read()
    except OSError:
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


# Matroska/WebM (EBML) element ids: the Segment and the Cluster (the frames' data).
_EBML_SEGMENT, _EBML_CLUSTER = 0x18538067, 0x1F43B675


def _ebml_number(data: bytes, at: int, is_id: bool) -> tuple[int | None, int]:
    """(value, length) of the EBML variable-size number at ``at``: an element id
    (marker bit kept) or size (None: unknown, all ones).  IndexError past ``data``."""
    length = 9 - data[at].bit_length()
    if length > 8 or at + length > len(data):
        raise IndexError('not an EBML number')
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


def matroska_cut(path: str) -> bool:
    """A Matroska/WebM file lost frames when it ends inside a Cluster.  The common
    whole file ends where its Segment's size says (one read); else the Segment's
    elements are walked (a header read per Cluster): one running past the end of the
    file is cut if it is a Cluster, not if it is the Cues, tags or other metadata
    writers put after the Clusters (every frame is there).  A walk that ends at the
    end of the file, or meets an element of unknown size (a live writer's), says only
    what the Segment's size says: cut if it is known and larger."""
    try:
        with open(path, 'rb') as f:
            file_size = os.fstat(f.fileno()).st_size
            head = f.read(4096)
            at = 0
            while True:  # the EBML header, then the Segment
                element, size, n = _ebml_header(head, at)
                if element == _EBML_SEGMENT:
                    break
                if size is None:
                    return False
                at += n + size
            at += n
            promised = None if size is None else at + size
            if promised is not None and promised <= file_size:
                return False
            while at < file_size:
                f.seek(at)
                try:
                    element, size, n = _ebml_header(f.read(16))
                except IndexError:  # the file ends inside an element's header
                    return True
                if size is None:
                    break
                if at + n + size > file_size:
                    return element == _EBML_CLUSTER
                at += n + size
    except (OSError, IndexError):
        return False
    return promised is not None and promised > file_size


# The top-level boxes of an MP4/MOV file (ISO BMFF and QuickTime).
_MP4_BOXES = {b'ftyp', b'styp', b'wide', b'free', b'skip', b'mdat', b'moov', b'moof', b'mfra',
              b'sidx', b'pnot', b'uuid', b'meta', b'junk'}


def mp4_index_cut(path: str) -> bool:
    """An MP4/MOV file whose top-level boxes run past its end before a whole moov box
    (the index, which most writers put last): a download cut short (no demuxer opens it)."""
    try:
        with open(path, 'rb') as f:
            file_size, at = os.fstat(f.fileno()).st_size, 0
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
                at += length
    except OSError:
        return False
    return False
