"""Bad input gives one clear error naming the file, video or option (exit code 2),
raised before training where it can be checked up front."""
import json
import shutil

import pytest

import main
from tests.conftest import tiny_args


@pytest.fixture
def data_copy(tiny_synthetic, tmp_path):
    video_path, annotation_path = tiny_synthetic
    videos = tmp_path / 'jpg'
    shutil.copytree(video_path, videos)
    annotation = tmp_path / 'annotation.json'
    shutil.copy(annotation_path, annotation)
    return videos, annotation


def fails_with(capsys, args, *needles):
    with pytest.raises(SystemExit) as exc:
        main.main(args)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    for needle in needles:
        assert needle in err, err
    assert 'Traceback' not in err and 'worker process' not in err  # the worker's own message
    assert err.startswith('error: ')
    return err


def first_training_video(annotation):
    data = json.loads(annotation.read_text())
    for vid, entry in data['database'].items():
        if entry['subset'] == 'training':
            return vid, entry, data
    raise AssertionError


def test_n_classes_mismatch(data_copy, tmp_path, capsys):
    args = tiny_args(*data_copy, tmp_path / 'r')
    args[args.index('--n_classes') + 1] = '7'
    fails_with(capsys, args, '--n_classes', '6 labels')


def test_missing_annotation_file(data_copy, tmp_path, capsys):
    fails_with(capsys, tiny_args(data_copy[0], tmp_path / 'nope.json', tmp_path / 'r'),
               'nope.json')


def test_label_not_in_labels(data_copy, tmp_path, capsys):
    videos, annotation = data_copy
    vid, entry, data = first_training_video(annotation)
    entry['annotations']['label'] = 'juggling'
    annotation.write_text(json.dumps(data))
    fails_with(capsys, tiny_args(videos, annotation, tmp_path / 'r'), 'juggling', vid)


def test_empty_subset(data_copy, tmp_path, capsys):
    videos, annotation = data_copy
    data = json.loads(annotation.read_text())
    data['database'] = {k: v for k, v in data['database'].items()
                        if v['subset'] != 'validation'}
    annotation.write_text(json.dumps(data))
    fails_with(capsys, tiny_args(videos, annotation, tmp_path / 'r'), 'validation')


def test_video_shorter_than_segment_fails_up_front(data_copy, tmp_path, capsys):
    videos, annotation = data_copy
    vid, entry, _ = first_training_video(annotation)
    folder = videos / entry['annotations']['label'] / vid
    frames = sorted(folder.glob('image_*.jpg'))
    frames[-1].unlink()
    fails_with(capsys, tiny_args(videos, annotation, tmp_path / 'r'), vid)
    assert not (tmp_path / 'r' / 'train.log').exists()  # nothing trained


def test_missing_frame_inside_video(data_copy, tmp_path, capsys):
    videos, annotation = data_copy
    vid, entry, _ = first_training_video(annotation)
    folder = videos / entry['annotations']['label'] / vid
    (folder / 'image_00003.jpg').unlink()  # the last frame is still there
    fails_with(capsys, tiny_args(videos, annotation, tmp_path / 'r', '--train_t_crop', 'center',
                                 '--sample_duration', '12'), 'image_00003.jpg')


def test_corrupt_frame(data_copy, tmp_path, capsys):
    videos, annotation = data_copy
    vid, entry, _ = first_training_video(annotation)
    folder = videos / entry['annotations']['label'] / vid
    (folder / 'image_00002.jpg').write_bytes(b'not a jpeg')
    fails_with(capsys, tiny_args(videos, annotation, tmp_path / 'r', '--train_t_crop', 'center',
                                 '--sample_duration', '12'), 'image_00002.jpg')


def test_missing_video_path(data_copy, tmp_path, capsys):
    _, annotation = data_copy
    fails_with(capsys, tiny_args(tmp_path / 'missing', annotation, tmp_path / 'r'), 'missing')


def test_unknown_ft_begin_module(data_copy, tmp_path, capsys):
    args = tiny_args(*data_copy, tmp_path / 'r', '--ft_begin_module', 'layer9')
    fails_with(capsys, args, '--ft_begin_module', 'layer4')


def test_resume_of_other_architecture(data_copy, tmp_path, capsys):
    import torch
    path = tmp_path / 'other.pth'
    torch.save({'epoch': 1, 'arch': 'resnet-50', 'state_dict': {}}, path)
    fails_with(capsys, tiny_args(*data_copy, tmp_path / 'r', '--resume_path', str(path)),
               'resnet-50', '--resume_path')


def test_checkpoint_with_pickled_code_is_refused(data_copy, tmp_path, capsys):
    import torch

    class Evil:
        def __reduce__(self):
            return (print, ('executed',))

    path = tmp_path / 'evil.pth'
    torch.save({'epoch': 1, 'arch': 'resnet-10', 'state_dict': {}, 'x': Evil()}, path)
    capsys.readouterr()
    fails_with(capsys, tiny_args(*data_copy, tmp_path / 'r', '--resume_path', str(path)),
               'evil.pth', 'weights_only')
    assert 'executed' not in capsys.readouterr().out
