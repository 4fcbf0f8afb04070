"""The video loader inside DataLoader worker processes: one decoder thread per
worker, and frame indexes kept across epochs (workers are re-forked every epoch)."""
import os

import torch
from torch.utils.data import DataLoader, Dataset

from datasets.video import VideoClipLoader
from tests.video_files import write_video


def n_threads() -> int:
    return len(os.listdir('/proc/self/task'))


class ClipsOf(Dataset):
    """Item i: a clip of video i, and what the worker looked like after it: (its
    thread count before the first clip, after this clip, whether the clip's video was
    demuxed to build its frame index)."""

    def __init__(self, paths, loader):
        self.paths, self.loader, self.first = paths, loader, None

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        if self.first is None:
            self.first = n_threads()
        scanned = self.loader.stats.get('scanned', 0)
        clip = self.loader(self.paths[i], list(range(4)))
        return clip.shape[0], self.first, n_threads(), self.loader.stats.get('scanned', 0) - scanned


def videos(folder, n, suffix='.mp4'):
    return [write_video(folder / f'v{i}{suffix}', n_frames=8, width=64, height=48)
            for i in range(n)]


def test_a_loader_worker_keeps_one_decoder_thread(tmp_path):
    """Clips of 12 H.264 videos in one worker (the loader keeps 8 open): its thread
    count grows by at most one (FFmpeg's automatic count started threads per open
    container before: 1 -> 20 threads on this 2-core machine)."""
    data = DataLoader(ClipsOf(videos(tmp_path, 12), VideoClipLoader()), batch_size=None,
                      num_workers=1)
    items = list(data)
    first, last = items[0][1], items[-1][2]
    assert [n for n, *_ in items] == [4] * 12
    assert last - first <= 1, f'worker threads {first} -> {last}'


def test_one_thread_decodes_the_frames_of_ffmpegs_count(tmp_path):
    loader = VideoClipLoader()  # the main process: FFmpeg's count
    path = videos(tmp_path, 1)[0]
    assert loader(path, [0, 1]).shape[0] == 2
    worker = VideoClipLoader(threads=1)
    worker(path, [0])
    assert worker._get(str(path)).stream.codec_context.thread_count == 1
    assert torch.equal(worker(path, [0, 1]), loader(path, [0, 1]))


def test_frame_indexes_are_kept_across_epochs_of_re_forked_workers(tmp_path):
    """Workers are not persistent (a new pair every epoch): the first epoch's workers
    demux each video once and write the indexes when they exit, the second epoch's
    map them and demux nothing."""
    from datasets.video_index import FrameTable
    paths = videos(tmp_path, 6)
    loader = VideoClipLoader(frame_table=FrameTable(tmp_path / 'frames'))
    data = DataLoader(ClipsOf(paths, loader), batch_size=None, num_workers=2)
    first, second = list(data), list(data)
    assert sum(item[3] for item in first) == 6
    assert sum(item[3] for item in second) == 0
    assert len(FrameTable(tmp_path / 'frames')) == 6


def test_workers_forked_after_the_main_process_decoded(tmp_path):
    """The main process decodes with FFmpeg's threads, then forks workers that use the
    same loader: a worker that freed the decoders it inherited waited forever for their
    threads (the DataLoader's timeout before); it now keeps them, unused."""
    paths = videos(tmp_path, 3)
    loader = VideoClipLoader()
    for p in paths:
        loader(p, [0, 1])
    data = DataLoader(ClipsOf(paths, loader), batch_size=None, num_workers=1, timeout=60)
    assert [item[0] for item in data] == [4, 4, 4]
    assert torch.equal(loader(paths[0], [2]), VideoClipLoader(threads=1)(paths[0], [2]))


def _collect_and_exit():
    import gc
    gc.collect()
    os._exit(0)


def test_a_forked_child_never_frees_garbage_it_inherited(tmp_path):
    """A container the main process decoded with FFmpeg's threads and dropped in a
    reference cycle (a traceback's frames hold one so) is garbage not yet
    collected when a worker forks: the child's collector must not free it (it
    waited forever for threads the child does not have)."""
    import multiprocessing

    from datasets.frame_conversion import new_scaler, to_array
    from datasets.video import _OpenVideo, _wanted_frames
    video = _OpenVideo(str(videos(tmp_path, 1)[0]), threads=0)
    scaler = new_scaler()
    for _, frame in _wanted_frames(video, [0, 1, 2], {}):
        to_array(frame, None, scaler)
    cycle = [video]
    cycle.append(cycle)
    del video, cycle
    child = multiprocessing.get_context('fork').Process(target=_collect_and_exit)
    child.start()
    child.join(60)
    if child.exitcode is None:
        child.kill()
    assert child.exitcode == 0
