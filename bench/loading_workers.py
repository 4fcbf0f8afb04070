"""bench/data_loading.py's workers section: a DataLoader over the training data set
with N worker processes feeding a model that does nothing (wall clock)."""
import json
import time

from torch.utils.data import DataLoader

from bench.loading_timing import CLIP
from datasets.annotation import load_annotations
from datasets.loader import Hdf5ClipLoader, JpgClipLoader
from datasets.spatial_transforms import build_train_transform, get_mean_std
from datasets.temporal_transforms import TemporalRandomCrop
from datasets.video import VideoClipLoader
from datasets.videodataset import VideoClipDataset


def worker_rows(root, workers, n_batches, batch=8):
    """clips/s of a DataLoader with each worker count, per format, model doing nothing."""
    mean, std = get_mean_std(1)
    transform = build_train_transform(112, mean=mean, std=std)
    loaders = {'jpg': JpgClipLoader(), 'hdf5': Hdf5ClipLoader(), 'mp4': VideoClipLoader()}
    results = {}
    for fmt, loader in loaders.items():
        annotation, video_path = write_bench_annotation(root, fmt)
        records, _ = load_annotations(annotation, 'training', video_path, 'ucf101',
                                      file_type='video' if fmt == 'mp4' else fmt)
        repeat = (n_batches + 2) * batch // len(records) + 1
        dataset = VideoClipDataset(records * repeat, loader, TemporalRandomCrop(CLIP), transform)
        for n in workers:
            data = DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=n,
                              prefetch_factor=4 if n else None)
            it = iter(data)
            next(it)  # start-up (worker fork, first batch) not counted
            start = time.perf_counter()
            count = 0
            for _ in range(n_batches):
                count += len(next(it)[0])
            results[fmt, n] = count / (time.perf_counter() - start)
            del it
    return results


def write_bench_annotation(root, fmt):
    videos = sorted((root / fmt / 'cls').iterdir())
    n = {'jpg': lambda p: len(list(p.iterdir()))}.get(fmt, lambda p: None)
    database = {}
    for v in videos:
        count = n(v)
        entry = {'subset': 'training', 'annotations': {'label': 'cls'}}
        if count:
            entry['annotations']['segment'] = [1, count + 1]
        database[v.name.split('.')[0]] = entry
    path = root / f'{fmt}.json'
    path.write_text(json.dumps({'labels': ['cls'], 'database': database}))
    return path, root / fmt


def print_worker_table(rates, workers):
    print('\nDataLoader (batch 8, random 16-frame clips, crop to 112) feeding a model '
          'that does nothing: clips/s')
    print('| format | ' + ' | '.join(f'{n} worker(s)' for n in workers) + ' |')
    print('|---|' + '---:|' * len(workers))
    for fmt in ('jpg', 'hdf5', 'mp4'):
        cells = ' | '.join(f'{rates[fmt, n]:.1f}' for n in workers)
        print(f'| {fmt} | {cells} |')
