"""--on_bad_video skip: train on without a video that fails to load.

A sample whose video raises DataError (missing, empty or corrupt frame) is
replaced by the next sample of the data set that loads; each bad video is
reported once per run on stderr, and the number of replaced samples is
counted for the epoch summary. The counters live in shared memory, so the
DataLoader's worker processes update the ones the training loop reads. A bad
video is tried again every time it is drawn (never skipped from memory): the
random numbers drawn are then the same in a resumed run as in an
uninterrupted one.
"""
import ctypes
import multiprocessing as mp
import sys

from torch.utils.data import Dataset, get_worker_info

from datasets.videodataset import BadVideo
from utils.errors import DataError


class SkipBadVideos(Dataset):
    """Wraps a map-style data set of VideoRecord samples (``dataset.records``)."""

    def __init__(self, dataset, max_tries=16):
        self.dataset = dataset
        self.max_tries = max_tries
        self._reported = mp.RawArray(ctypes.c_bool, len(dataset))
        self._skipped = mp.Value(ctypes.c_int64, 0)

    def __len__(self):
        return len(self.dataset)

    @property
    def records(self):
        return self.dataset.records

    @property
    def spatial_transform(self):  # whose normalization the loader may run on the device
        return self.dataset.spatial_transform

    @property
    def loader(self):  # whose decoding the loader may run on the device
        return self.dataset.loader

    def __getitem__(self, i):
        n = len(self.dataset)
        first_error = None
        for k in range(min(self.max_tries, n)):
            j = (i + k) % n
            try:
                item = self.dataset[j]
            except DataError as e:
                item = BadVideo(str(e))
            if not isinstance(item, BadVideo) or item.storage:  # in a worker errors come back as values
                return item
            first_error = first_error or item.message
            self.record_bad(j, item.message)
        message = (f'{min(self.max_tries, n)} videos in a row failed to load '
                   f'(--on_bad_video skip), the first: {first_error}')
        if get_worker_info() is not None:
            return BadVideo(message)  # raised in the main process by the loader
        raise DataError(message)

    def record_bad(self, j, error):
        """Sample j's video failed to load, here or where its frames were
        decoded (the main process, --decode_device cuda): reported once, counted."""
        self._report(j, error)
        with self._skipped.get_lock():
            self._skipped.value += 1

    def _report(self, j, error):
        if not self._reported[j]:
            self._reported[j] = True
            video = self.dataset.records[j].video_id
            print(f'skipping video {video} (--on_bad_video skip): {error}', file=sys.stderr,
                  flush=True)

    def take_skipped(self):
        """Samples replaced since the last call (the epoch's count)."""
        with self._skipped.get_lock():
            n, self._skipped.value = self._skipped.value, 0
        return n

    @property
    def n_bad_videos(self):
        return sum(self._reported)
