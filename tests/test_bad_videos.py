"""--on_bad_video skip: a bad video found while training is replaced and counted."""
import pytest
import torch
from torch.utils.data import DataLoader

from datasets.annotation import VideoRecord
from datasets.bad_videos import SkipBadVideos
from datasets.loader import JpgClipLoader
from datasets.spatial_transforms import build_eval_transform
from datasets.videodataset import VideoClipDataset
from tests.test_datasets import write_jpg_video
from utils.errors import DataError


def make_dataset(tmp_path, bad=(2,), n=5):
    records = []
    for i in range(n):
        folder = write_jpg_video(tmp_path / f'v{i}', 4, size=8)
        if i in bad:
            (folder / 'image_00003.jpg').write_bytes(b'not a jpeg')
        records.append(VideoRecord(f'v{i}', str(folder), 0, 4, i, (1, 5)))
    return VideoClipDataset(records, JpgClipLoader())


def test_bad_sample_is_replaced_by_the_next_and_reported_once(tmp_path, capfd):
    data = SkipBadVideos(make_dataset(tmp_path, bad=(2, 4)))
    with pytest.raises(DataError, match='image_00003.jpg'):
        data.dataset[2]
    for _ in range(2):  # two epochs through two worker processes
        loader = DataLoader(data, batch_size=5, num_workers=2)
        [(clips, labels)] = list(loader)
        # 2 -> 3; 4 wraps around to 0
        assert labels.tolist() == [0, 1, 3, 3, 0]
        assert clips.shape == (5, 3, 4, 8, 8)
        assert data.take_skipped() == 2
    assert data.take_skipped() == 0
    assert data.n_bad_videos == 2
    err = capfd.readouterr().err
    assert err.count('skipping video v2') == 1 and err.count('skipping video v4') == 1
    assert '--on_bad_video skip' in err


def test_all_bad_gives_a_clear_error(tmp_path):
    data = SkipBadVideos(make_dataset(tmp_path, bad=(0, 1, 2), n=3))
    with pytest.raises(DataError, match='3 videos in a row failed to load'):
        data[0]


def test_the_wrapper_has_the_wrapped_sets_records_and_transform(tmp_path):
    inner = make_dataset(tmp_path, bad=())
    inner.spatial_transform = build_eval_transform(8, mean=[0.5] * 3, std=[0.25] * 3)
    data = SkipBadVideos(inner)
    assert data.records is inner.records and data.spatial_transform is inner.spatial_transform
    assert torch.equal(data[1][0], inner[1][0])
