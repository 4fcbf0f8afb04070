"""Where a data set's shards are read from: a local folder, or any fsspec URL
(http(s)://host/prefix, s3://bucket/prefix).  :class:`ShardStore` reads whole
small files (index.json, index.npz), byte ranges and a video's payload through
the index (datasets/shards.py), so that no clip loader learns about HTTP or S3.

Faults: a network error or a server error (5xx, 408, 429) is retried with
exponential backoff, then raised as StorageError naming the URL (its password
hidden); a file not found is a StorageError at once; a payload shorter than the
index says (a truncated shard) is a DataError.  Fork safety: the filesystem
object, its sessions and the open fds belong to the process that made them; a
forked DataLoader worker makes its own.  A store pickles without them.

Credentials never come through storage_options (:func:`check_storage_options`):
S3's come from the environment or ~/.aws, as botocore finds them (none found: one
StorageError saying where they are looked for, not retried).  Messages hide the
options' values as well as a URL's credentials.  Torch-free;
fsspec (and s3fs, aiohttp) are imported only for a URL.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import sys
import tarfile
import time
from pathlib import Path

from datasets.shards import BLOCK, INDEX_JSON, INDEX_NPZ, ShardIndex, escape_key
from utils.atomic import write_atomic
from utils.errors import DataError, OptionError, StorageError
from utils.urls import redact_url

__all__ = ['ShardStore', 'MemberFile', 'open_shards', 'check_storage_options', 'SECRET_OPTIONS']

SECRET_OPTIONS = frozenset({'key', 'secret', 'token', 'password', 'passwd', 'session_token', 'authorization',
                            'aws_access_key_id', 'aws_secret_access_key', 'aws_session_token'})
MAX_OPEN_FILES = 64  # local shards kept open per process
MEMBER_BUFFER = 1 << 16  # read-ahead of a local member file: hdf5's and FFmpeg's small reads merged
RETRIES, BACKOFF_S = 4, 0.5  # a failed read is tried 4 more times, after 0.5, 1, 2 and 4 s
_INHERITED = []  # filesystems a forked child found: kept alive, so that their finalizers never close the parent's


def _after_fork_in_child():
    asyn = sys.modules.get('fsspec.asyn')
    if asyn is not None:  # fsspec's own hook resets its loop, not the lock get_loop() takes
        asyn.reset_lock()


if hasattr(os, 'register_at_fork'):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def check_storage_options(options) -> dict:
    """``options`` (a dict, a JSON object's text or None) as a dict for fsspec;
    OptionError naming the first key that would carry a secret (never its value)."""
    if options is None or options == '':
        return {}
    if isinstance(options, str):
        try:
            options = json.loads(options)
        except ValueError as e:
            raise OptionError(f'storage_options is not valid JSON ({e.msg} at character {e.pos})') from None
    if isinstance(options, list):  # what opts.json and checkpoints keep: the names
        raise OptionError(f'storage_options: only their names ({", ".join(map(str, options)) or "none"}) are kept '
                          'in opts.json and checkpoints, not their values: give --storage_options again')
    if not isinstance(options, dict):
        raise OptionError(f'storage_options must be a JSON object, got a {type(options).__name__}')
    secret = _secret_key(options, '')
    if secret is not None:
        raise OptionError(f'storage_options must not hold credentials ({secret!r}): give S3 credentials through '
                          'AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, ~/.aws/credentials '
                          'or AWS_PROFILE, HTTP ones as user:password@ in the URL')
    return options


def _secret_key(value, path):
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        name = str(k).lower().replace('-', '_')
        where = f'{path}.{k}' if path else str(k)
        if isinstance(k, str) and (name in SECRET_OPTIONS or ('client_kwargs' in path and name.startswith('aws_'))):
            return where
        found = _secret_key(v, where)
        if found is not None:
            return found
    return None


def _status(e):
    """The HTTP status behind an aiohttp or botocore error (s3fs chains the latter), or None."""
    for err in (e, e.__cause__):
        if isinstance(getattr(err, 'status', None), int):
            return err.status
        response = getattr(err, 'response', None)
        if isinstance(response, dict):
            return response.get('ResponseMetadata', {}).get('HTTPStatusCode')
    return None


def _transient_types():
    types = [OSError]
    for module, names in (('aiohttp', ('ClientError',)), ('fsspec.exceptions', ('FSTimeoutError',)),
                          ('botocore.exceptions', ('BotoCoreError', 'ClientError'))):
        mod = sys.modules.get(module)
        types += [getattr(mod, n) for n in names if mod is not None and hasattr(mod, n)]
    return tuple(types)


def _transient(e, status) -> bool:
    """Worth another try: a server error, a timeout, a connection lost (not a refusal)."""
    if status is not None:
        return status >= 500 or status in (408, 429)
    return not isinstance(e, (PermissionError, IsADirectoryError, NotADirectoryError))


def _one_line(e, options=None) -> str:
    """The error in one line, URL credentials and the storage options' values hidden."""
    text = redact_url(' '.join(f'{type(e).__name__}: {e}'.split()))
    for value in sorted(_option_values(options or {}), key=len, reverse=True):
        text = text.replace(value, '***')
    return text


def _option_values(value):
    """The option values a message must not repeat: every string but a URL's
    (redact_url hides what a URL may carry; an endpoint stays nameable)."""
    if isinstance(value, dict):
        return {v for item in value.values() for v in _option_values(item)}
    if isinstance(value, list):
        return {v for item in value for v in _option_values(item)}
    if isinstance(value, str) and len(value) >= 4 and '://' not in value:
        return {value}
    return set()


def _no_credentials(e) -> bool:
    """botocore found no S3 credentials (s3fs may chain it)."""
    return any(type(err).__name__ in ('NoCredentialsError', 'PartialCredentialsError')
               for err in (e, e.__cause__, e.__context__))


NO_CREDENTIALS = ('no S3 credentials found: botocore looks for them in AWS_ACCESS_KEY_ID and '
                  'AWS_SECRET_ACCESS_KEY (with AWS_SESSION_TOKEN), ~/.aws/credentials (AWS_PROFILE picks its '
                  'profile) and an instance or container role; set one of them, or give --storage_options '
                  '\'{"anon": true}\' for a public bucket')


class ShardStore:
    """Bytes of a shard folder at ``location`` (a folder, http(s)://..., s3://...).

    ``storage_options``: fsspec's options for the URL (e.g. {"endpoint_url": ...} for
    S3), checked by :func:`check_storage_options`.  ``cache_dir``: keep each payload
    read there, at most ``cache_bytes`` in all (least recently used evicted).
    ``retries``: further tries of a failed network read, after ``backoff``, 2 x
    ``backoff``, ... seconds."""

    def __init__(self, location, storage_options=None, cache_dir=None, cache_bytes=10 * 2**30, retries=None,
                 backoff=None):
        location = os.fspath(location)
        if location.startswith('file://'):
            location = location[len('file://'):]
        self.location = location
        self.remote = '://' in location
        self.storage_options = check_storage_options(storage_options)
        self.cache_dir = os.fspath(cache_dir) if cache_dir is not None else None
        self.cache_bytes = int(cache_bytes)
        self.retries = RETRIES if retries is None else int(retries)
        self.backoff = BACKOFF_S if backoff is None else float(backoff)
        self.cache_hits = self.cache_misses = 0
        self._index = None
        self._drop_handles()

    @staticmethod
    def _per_process() -> dict:
        """The state that is not pickled and is made anew after a fork (the bytes in
        cache_dir: unknown until scanned)."""
        return {'_pid': None, '_fs': None, '_fds': {}, '_cache_used': None, '_cache_unscanned': 0}

    def _drop_handles(self):
        self.__dict__.update(self._per_process())

    def __getstate__(self):
        return {**self.__dict__, **self._per_process()}  # the index too: a spawned worker need not fetch it

    def __repr__(self):
        return f'ShardStore({redact_url(self.location)!r})'

    def url(self, name) -> str:
        return f'{self.location.rstrip("/")}/{name}' if self.remote else os.path.join(self.location, name)

    # ------------------------------------------------------------ per process

    def _own(self):
        """Forget what another process (the parent of a fork) made."""
        if self._pid != os.getpid():
            if self._fs is not None:
                _INHERITED.append(self._fs)
            for fd in self._fds.values():
                os.close(fd)
            self._drop_handles()
            self._pid = os.getpid()

    def filesystem(self):
        """This process's fsspec filesystem of a URL location (made on first use)."""
        self._own()
        if self._fs is None:
            import fsspec
            protocol = self.location.split('://', 1)[0]
            try:
                self._fs = fsspec.filesystem(protocol, skip_instance_cache=True, **_with_our_retries(
                    protocol, self.storage_options))
                if protocol in ('s3', 's3a'):
                    self._fs.retries = 1  # s3fs's own loop (a class attribute, 5), not an option
            except (ValueError, ImportError, TypeError) as e:  # an unknown protocol, its package missing, an option
                raise OptionError(f'{redact_url(self.location)}: fsspec cannot open {protocol}:// '
                                  f'({_one_line(e, self.storage_options)}): '
                                  'give a shard folder, an http(s):// or s3:// URL (or install the package '
                                  'fsspec names), with --storage_options fsspec takes') from None
        return self._fs

    def _fd(self, name):
        self._own()
        fd = self._fds.get(name)
        if fd is None:
            if len(self._fds) >= MAX_OPEN_FILES:
                os.close(self._fds.pop(next(iter(self._fds))))
            fd = self._fds[name] = os.open(self.url(name), os.O_RDONLY)
        return fd

    def _local_range(self, name, offset, size):
        fd = self._fd(name)
        try:
            return _pread_all(fd, offset, size)
        except OSError:  # opened again on the next try (a stale NFS handle)
            del self._fds[name]
            with contextlib.suppress(OSError):
                os.close(fd)
            raise

    # ------------------------------------------------------------ reads

    def read_file(self, name) -> bytes:
        """A whole (small) file of the location: index.json, index.npz."""
        if not self.remote:
            return self._retrying(name, 'the file', lambda: Path(self.url(name)).read_bytes())
        return self._retrying(name, 'the file', lambda: self.filesystem().cat_file(self.url(name)))

    def read_range(self, name, offset, size) -> bytes:
        """``size`` bytes of file ``name`` from ``offset`` (fewer at its end)."""
        offset, size = int(offset), int(size)
        if size <= 0:
            return b''
        if not self.remote:
            return self._retrying(name, f'bytes {offset}-{offset + size - 1}',
                                  lambda: self._local_range(name, offset, size))
        data = self._retrying(name, f'bytes {offset}-{offset + size - 1}',
                              lambda: self.filesystem().cat_file(self.url(name), start=offset, end=offset + size))
        if len(data) > size:
            raise StorageError(f'{redact_url(self.url(name))}: {len(data)} bytes answered for a range of {size}: '
                               'the server does not serve byte ranges; use one that does')
        return data

    def _retrying(self, name, what, read):
        url = redact_url(self.url(name))
        for attempt in range(self.retries + 1):
            try:
                return read()
            except _transient_types() as e:
                status = _status(e)
                if isinstance(e, FileNotFoundError) or status == 404:
                    raise StorageError(f'{url} not found: check --video_path (the shard folder) and that '
                                       'its shards and index were all written or uploaded') from None
                if status == 416:
                    return b''  # a range past the end (S3's InvalidRange): the caller sees a short read
                if _no_credentials(e):  # not the network's: no retry mends it
                    raise StorageError(f'{url}: {NO_CREDENTIALS}') from None
                if not _transient(e, status):
                    raise StorageError(f'{url}: reading {what} failed ({_one_line(e, self.storage_options)})') \
                        from None
                if attempt == self.retries:
                    raise StorageError(f'{url}: reading {what} failed after {attempt + 1} tries '
                                       f'({_one_line(e, self.storage_options)}): '
                                       'check the network and the server, then run again') from None
            time.sleep(self.backoff * 2 ** attempt)

    def index(self) -> ShardIndex:
        """The folder's ShardIndex, read once per process."""
        if self._index is None:
            self._index = ShardIndex.from_bytes(self.read_file(INDEX_JSON), self.read_file(INDEX_NPZ),
                                                redact_url(self.location))
        return self._index

    def _entry(self, rel):
        try:
            return self.index().entry(rel)
        except KeyError:
            raise DataError(f'{redact_url(self.location)}: the shard index has no video {rel!r}: re-run '
                            'util_scripts.make_shards for this annotation (or check --video_path)') from None

    def read_member(self, rel, cached=True) -> bytes:
        """The payload of video REL: one ranged read of its member with the tar header
        before it (checked against the index: a shard that does not match its index is
        never decoded as another video), or the cache (``cached``: looked in)."""
        entry = self._entry(rel)
        shard, offset, size = entry.shard, entry.offset, entry.size
        cache_path = self._cache_path(shard, offset, size)
        data = self._cache_get(cache_path, size) if cached else None
        if data is not None:
            return data
        data = self.read_range(shard, offset - BLOCK, size + BLOCK)
        if len(data) < BLOCK:
            data = b''
        else:
            _check_header(data[:BLOCK], f'{escape_key(entry.path)}.{entry.ext}', size,
                          f'{redact_url(self.url(shard))}: video {entry.path!r}')
            data = data[BLOCK:]
        if len(data) < size:
            raise _cut_short(self.url(shard), entry, len(data))
        self._cache_put(cache_path, data)
        return data

    def open_member(self, rel):
        """Video REL's payload as a file object, what av.open and h5py.File take: from a
        URL read whole (one ranged read, cached); in a local shard a file of its own over
        the member's byte range, of which the decoders read only what a clip needs (an
        hdf5 payload's frames, a video's packets), as from the file it was made of; a
        payload in the cache (--shard_cache) is read so too, from its file there."""
        entry = self._entry(rel)
        if self.remote:  # the cached copy read in part, as a local member is
            cached = self._cache_open(self._cache_path(entry.shard, entry.offset, entry.size), entry.size)
            return cached if cached is not None else io.BytesIO(self.read_member(rel, cached=False))
        path = self.url(entry.shard)
        try:
            member = MemberFile(path, entry.offset, entry.size)
        except FileNotFoundError:
            raise StorageError(f'{path} not found: check the shard folder (--video_path): its shards and '
                               'index were not all written or copied') from None
        if member.available < entry.size:
            member.close()
            raise _cut_short(path, entry, max(member.available, 0))
        _check_header(member.header(), f'{escape_key(entry.path)}.{entry.ext}', entry.size,
                      f'{path}: video {entry.path!r}')
        return io.BufferedReader(member, MEMBER_BUFFER)

    def where(self, rel) -> str:
        """Video REL and the shard holding it, for messages."""
        try:
            shard = self.index().entry(rel).shard
        except KeyError:
            shard = 'no shard'
        return f'{rel} ({shard} of {redact_url(self.location)})'

    # ------------------------------------------------------------ the cache

    def _cache_path(self, shard, offset, size):
        if self.cache_dir is None:
            return None
        # the shard's sha256 (index.json): a shard made again with the same layout is another key
        digest = self.index().shard_sha256.get(shard, '')
        key = hashlib.sha256(f'{self.location}\0{shard}\0{digest}\0{offset}\0{size}'.encode()).hexdigest()[:40]
        return os.path.join(self.cache_dir, f'{key}.bin')

    def _cache_get(self, path, size):
        f = self._cache_open(path, size)
        if f is None:
            return None
        with f:
            data = f.read()
        return data if len(data) == size else None

    def _cache_open(self, path, size):
        """The cached payload's file, opened (None: not cached, or of another size)."""
        if path is None:
            return None
        try:
            f = open(path, 'rb')  # open, then checked: an eviction meanwhile leaves this copy readable
            whole = os.fstat(f.fileno()).st_size == size
        except OSError:
            f, whole = None, False
        if whole:
            with contextlib.suppress(OSError):  # evicted meanwhile by another process
                os.utime(path)  # its mtime says when it was last used
            self.cache_hits += 1
            return f
        if f is not None:
            f.close()
        self.cache_misses += 1
        return None

    def _cache_put(self, path, data):
        if path is None or len(data) > self.cache_bytes:
            return
        try:
            write_atomic(path, data)
        except OSError:  # a full or read-only cache folder: the read itself worked
            return
        # the other processes' writes are seen by a scan: the first, then one after each 1/16 of the bound
        # written here, or when the bound is reached
        used, self._cache_unscanned = (self._cache_used or 0) + len(data), self._cache_unscanned + len(data)
        if self._cache_used is None or used > self.cache_bytes or self._cache_unscanned > self.cache_bytes // 16:
            used, self._cache_unscanned = _evict(self.cache_dir, self.cache_bytes), 0
        self._cache_used = used


def _with_our_retries(protocol, options):
    """S3 tries once in s3fs and once in botocore (they retry 5 and 4 times by
    default, which multiplied by ours kept a run on a dead endpoint for minutes):
    the retries and their backoff are ShardStore's. The user's options win."""
    if protocol not in ('s3', 's3a'):
        return options
    config = {'retries': {'total_max_attempts': 1}, **options.get('config_kwargs', {})}
    return {**options, 'config_kwargs': config}


def _cut_short(url, entry, got) -> DataError:
    return DataError(f'{redact_url(url)}: video {entry.path!r} is cut short ({got} of {entry.size} bytes at offset '
                     f'{entry.offset}), the shard is truncated: re-run util_scripts.make_shards and re-upload '
                     f'{entry.shard}')


class MemberFile(io.RawIOBase):
    """A member of a local shard as a read-only file with its own descriptor: reads
    are preads of its byte range (``offset``, ``size``) of the shard."""

    def __init__(self, path, offset: int, size: int):
        super().__init__()
        self._fd = os.open(path, os.O_RDONLY)
        self._offset, self._size, self._pos = int(offset), int(size), 0
        self.available = os.fstat(self._fd).st_size - self._offset  # short of size: the shard is cut

    def header(self) -> bytes:
        """The 512-byte block before the member: its tar header."""
        return os.pread(self._fd, BLOCK, self._offset - BLOCK)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = min(len(buffer), self._size - self._pos)
        if n <= 0:
            return 0
        data = os.pread(self._fd, n, self._offset + self._pos)
        buffer[:len(data)] = data
        self._pos += len(data)
        return len(data)

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        if base + pos < 0:
            raise ValueError(f'negative seek position {base + pos}')
        self._pos = base + pos
        return self._pos

    def tell(self) -> int:
        return self._pos

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
        super().close()


def _check_header(block: bytes, name: str, size: int, what: str) -> None:
    """The tar header right before a payload names its member and gives its size
    (a long name's header holds its first 100 bytes: the GNU LongLink before it has the rest)."""
    try:
        info = tarfile.TarInfo.frombuf(block, 'utf-8', 'surrogateescape')
        found = (info.name, info.size)
    except tarfile.TarError:
        found = None
    expected = (name.encode('utf-8', 'surrogateescape')[:100].decode('utf-8', 'surrogateescape'), size)
    if found != expected:
        got = 'no tar header' if found is None else f'member {found[0]!r} of {found[1]} bytes'
        raise DataError(f'{what}: the index points at {got}, not {name!r} of {size} bytes: the shard and its '
                        'index do not match (a shard re-made or re-uploaded without its index?): upload '
                        'the shards and index.json/index.npz of one make_shards run')


def open_shards(video_path, storage_options=None, cache_dir=None, cache_bytes=10 * 2**30):
    """The ShardStore of a --video_path holding make_shards' output (any URL, or a folder
    with its index.json), its index read; None for a folder of videos or frames."""
    location = os.fspath(video_path)
    if '://' not in location and not os.path.isfile(os.path.join(location, INDEX_JSON)):
        return None
    store = ShardStore(location, storage_options, cache_dir, cache_bytes)
    store.index()  # a wrong URL or a missing index is one line at start-up, not in a worker
    return store


def _pread_all(fd, offset, size):
    parts = []
    while size > 0:
        part = os.pread(fd, size, offset)
        if not part:
            break
        parts.append(part)
        offset, size = offset + len(part), size - len(part)
    return b''.join(parts)


def _evict(folder, bound, stale_tmp_s=3600):
    """Remove the least recently used payloads (by mtime) while they take more than
    ``bound``, down to 3/4 of it, and the .tmp files of writers long gone; the bytes
    left.  Another process may remove the same files meanwhile."""
    files, now = [], time.time()
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for entry in entries:
            with contextlib.suppress(OSError):
                st = entry.stat()
                if entry.name.endswith('.bin'):
                    files.append((st.st_mtime, st.st_size, entry.path))
                elif entry.name.endswith('.tmp') and now - st.st_mtime > stale_tmp_s:
                    os.remove(entry.path)
    used = sum(size for _, size, _ in files)
    if used > bound:
        for _, size, path in sorted(files):
            if used <= bound * 3 // 4:
                break
            with contextlib.suppress(OSError):
                os.remove(path)
            used -= size
    return used
