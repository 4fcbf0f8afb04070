"""predict.py: finding the videos, the model from the checkpoint alone, and the
same answer as --inference."""
import h5py
import numpy as np
import pytest

import predict
from datasets.annotation import DataError


def _frames(folder, n=3):
    folder.mkdir(parents=True)
    for i in range(n):
        (folder / f'image_{i + 1:05d}.jpg').write_bytes(b'')


def test_find_inputs_one_video_or_a_folder_of_them(tmp_path):
    _frames(tmp_path / 'clips' / 'walk_01')
    with h5py.File(tmp_path / 'clips' / 'run_02.hdf5', 'w') as f:
        f.create_dataset('video', data=np.zeros(2, dtype=h5py.vlen_dtype(np.uint8)))
    (tmp_path / 'clips' / 'jump_03.mp4').write_bytes(b'')
    (tmp_path / 'clips' / 'notes.txt').write_text('not a video')
    (tmp_path / 'clips' / 'empty_folder').mkdir()
    found = predict.find_inputs(tmp_path / 'clips')
    assert [(v.video_id, v.kind) for v in found] == [
        ('jump_03', 'video'), ('run_02', 'hdf5'), ('walk_01', 'jpg')]
    assert predict.frame_count(found[1]) == 2 and predict.frame_count(found[2]) == 3
    one = predict.find_inputs(tmp_path / 'clips' / 'walk_01')
    assert [(v.video_id, v.kind) for v in one] == [('walk_01', 'jpg')]


def test_find_inputs_errors(tmp_path):
    with pytest.raises(DataError, match='does not exist'):
        predict.find_inputs(tmp_path / 'nope')
    (tmp_path / 'a.txt').write_text('')
    with pytest.raises(DataError, match='is not a video this tool reads'):
        predict.find_inputs(tmp_path / 'a.txt')
    with pytest.raises(DataError, match='holds no video'):
        predict.find_inputs(tmp_path)
    _frames(tmp_path / 'x')
    (tmp_path / 'x.avi').write_bytes(b'')
    with pytest.raises(DataError, match="two videos named 'x'"):
        predict.find_inputs(tmp_path)
