"""predict.py and the evaluation outputs of main.py: finding the videos, the model
from the checkpoint alone, the same answer as --inference for a frame folder, an
hdf5 file and an .mp4; the features file; the report after inference; a
validation-only run's val.log and TensorBoard confusion matrix."""
import argparse
import json
import shutil
import sys

import h5py
import numpy as np
import pytest
import torch

import classify
import main
import predict
from opts import build_parser
from tests.conftest import tiny_args
from utils.errors import DataError
from utils.logs import read_tsv

MAIN_VIEWS = ('--inference_n_clips', '2', '--inference_crop', 'three')
PREDICT_VIEWS = ('--n_clips', '2', '--crop', 'three')


@pytest.fixture(scope='module')
def trained(tiny_synthetic, tmp_path_factory):
    """One epoch of the tiny model, then 2-clip x 3-crop inference on the
    validation videos with every class's score and the features."""
    video_path, annotation_path = tiny_synthetic
    out = tmp_path_factory.mktemp('trained')
    main.main(tiny_args(video_path, annotation_path, out, '--n_epochs', '1', '--no_val',
                        '--inference', *MAIN_VIEWS, '--output_topk', '0',
                        '--extract_features', str(out / 'features.h5')))
    annotation = json.loads(annotation_path.read_text())
    val = [(v, e['annotations']['label']) for v, e in annotation['database'].items()
           if e['subset'] == 'validation']
    return video_path, annotation_path, out, val


def _scores(entries):
    return {e['label']: e['score'] for e in entries}


def _hdf5_from_jpgs(folder, path):
    frames = sorted(folder.glob('image_*.jpg'))
    with h5py.File(path, 'w') as f:
        data = f.create_dataset('video', (len(frames),), dtype=h5py.vlen_dtype(np.uint8))
        for i, frame in enumerate(frames):
            data[i] = np.frombuffer(frame.read_bytes(), dtype=np.uint8)


def _frames(folder, n=3):
    folder.mkdir(parents=True)
    for i in range(n):
        (folder / f'image_{i + 1:05d}.jpg').write_bytes(b'')


def test_find_inputs_one_video_or_a_folder_of_them(tmp_path):
    _frames(tmp_path / 'clips' / 'walk_01')
    with h5py.File(tmp_path / 'clips' / 'run_02.hdf5', 'w') as f:
        f.create_dataset('video', (2,), dtype=h5py.vlen_dtype(np.uint8))
    (tmp_path / 'clips' / 'jump_03.mp4').write_bytes(b'')
    (tmp_path / 'clips' / 'notes.txt').write_text('not a video')
    (tmp_path / 'clips' / 'empty_folder').mkdir()
    found = classify.find_inputs(tmp_path / 'clips')
    assert [(v.video_id, v.kind) for v in found] == [
        ('jump_03', 'video'), ('run_02', 'hdf5'), ('walk_01', 'jpg')]
    assert classify.frame_count(found[1]) == 2 and classify.frame_count(found[2]) == 3
    one = classify.find_inputs(tmp_path / 'clips' / 'walk_01')
    assert [(v.video_id, v.kind) for v in one] == [('walk_01', 'jpg')]


def test_find_inputs_errors(tmp_path):
    with pytest.raises(DataError, match='does not exist'):
        classify.find_inputs(tmp_path / 'nope')
    (tmp_path / 'a.txt').write_text('')
    with pytest.raises(DataError, match='is not a video this tool reads'):
        classify.find_inputs(tmp_path / 'a.txt')
    with pytest.raises(DataError, match='holds no video'):
        classify.find_inputs(tmp_path)
    _frames(tmp_path / 'x')
    (tmp_path / 'x.avi').write_bytes(b'')
    with pytest.raises(DataError, match="two videos named 'x'"):
        classify.find_inputs(tmp_path)


@pytest.mark.slow
def test_predict_frame_folder_and_hdf5_equal_inference(trained, tmp_path, capsys):
    video_path, _, out, val = trained
    (v0, label0), (v1, label1) = val[0], val[3]
    inputs = tmp_path / 'inputs'
    shutil.copytree(video_path / label0 / v0, inputs / v0)
    _hdf5_from_jpgs(video_path / label1 / v1, inputs / f'{v1}.hdf5')
    features = tmp_path / 'f.h5'
    assert predict.main([str(out / 'save_1.pth'), str(inputs), *PREDICT_VIEWS, '--topk', '0',
                         '--json', '--n_threads', '0', '--extract_features', str(features)]) == 0
    printed = json.loads(capsys.readouterr().out)
    inferred = json.loads((out / 'val.json').read_text())
    assert sorted(printed['results']) == sorted([v0, v1])
    for v in (v0, v1):
        assert printed['views'][v] == inferred['views'][v] == 6
        assert printed['results'][v][0]['label'] == inferred['results'][v][0]['label']
        mine, theirs = _scores(printed['results'][v]), _scores(inferred['results'][v])
        assert mine == pytest.approx(theirs, abs=1e-5)
    with h5py.File(features) as mine, h5py.File(out / 'features.h5') as theirs:
        ids = [i.decode() for i in theirs['video_ids'][:]]
        for row, v in enumerate(i.decode() for i in mine['video_ids'][:]):
            np.testing.assert_allclose(mine['features'][row], theirs['features'][ids.index(v)],
                                       rtol=1e-4, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize('size', [None, (56, 44)], ids=['as_jpgs', 'larger'])
def test_predict_mp4_equals_inference_on_video_files(trained, tmp_path, capsys, size):
    """Also with frames larger than --sample_size: predict.py's loaders are
    main.py's (dataset.eval_views, dataset.clip_loader): video frames converted alike."""
    from tests.video_files import videos_from_jpgs
    video_path, annotation_path, out, val = trained
    mp4_root = videos_from_jpgs(video_path, tmp_path / 'mp4', size=size)
    result = tmp_path / 'r'
    main.main(tiny_args(mp4_root, annotation_path, result, '--no_train', '--no_val',
                        '--resume_path', str(out / 'save_1.pth'), '--inference', *MAIN_VIEWS,
                        '--file_type', 'video', '--output_topk', '0'))
    inferred = json.loads((result / 'val.json').read_text())['results']
    capsys.readouterr()
    v, label = val[1]
    mp4 = mp4_root / label / f'{v}.mp4'
    assert predict.main([str(out / 'save_1.pth'), str(mp4), *PREDICT_VIEWS, '--topk', '0',
                         '--json', '--n_threads', '0']) == 0
    printed = json.loads(capsys.readouterr().out)['results']
    assert list(printed) == [v]
    assert printed[v][0]['label'] == inferred[v][0]['label']
    assert _scores(printed[v]) == pytest.approx(_scores(inferred[v]), abs=1e-5)
    flow = argparse.Namespace(**{**vars(build_parser().parse_args([])), 'input_type': 'flow'})
    with pytest.raises(DataError, match=r'optical flow \(--input_type flow\) is read from hdf5'):
        classify.build_dataset([], [classify.VideoInput(v, str(mp4), 'video')], flow, 2, 0, 'center')


@pytest.mark.slow
def test_predict_text_output_and_checkpoint_without_class_names(trained, tmp_path, capsys):
    video_path, annotation_path, out, val = trained
    v, label = val[0]
    threads = torch.get_num_threads()
    try:
        assert predict.main([str(out / 'save_1.pth'), str(video_path / label / v), '--topk', '2',
                             '--n_threads', '0', '--threads', '2']) == 0
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
    line = capsys.readouterr().out.strip()
    assert line.startswith(f'{v}: ') and line.count('(') == 2
    old = torch.load(out / 'save_1.pth', weights_only=True)
    del old['class_names']
    torch.save(old, tmp_path / 'old.pth')
    assert predict.main([str(tmp_path / 'old.pth'), str(video_path / label / v)]) == 2
    assert 'stores no class names' in capsys.readouterr().err
    assert predict.main([str(tmp_path / 'old.pth'), str(video_path / label / v),
                         '--annotation_path', str(annotation_path), '--n_threads', '0']) == 0
    assert capsys.readouterr().out.strip().startswith(f'{v}: ')
    assert predict.main([str(out / 'save_1.pth'), str(video_path / label / v), '--weights',
                         'ema']) == 2
    err = capsys.readouterr().err
    assert 'holds no EMA weights' in err and 'use --weights raw' in err


@pytest.mark.slow
def test_features_file_shapes_and_ids(trained):
    _, _, out, val = trained
    with h5py.File(out / 'features.h5') as f:
        assert [i.decode() for i in f['video_ids'][:]] == [v for v, _ in val]
        # resnet-10 at width 0.25: 128 channels into the classifier
        assert f['features'].shape == (len(val), 128) and f['features'].dtype == np.float32
        assert f['n_views'][:].tolist() == [6] * len(val)


@pytest.mark.slow
def test_report_after_inference(trained):
    _, annotation_path, out, _ = trained
    report = (out / 'val_report.txt').read_text()
    assert 'top-1 accuracy' in report and 'mean class accuracy' in report
    assert report.count('\n') > 10 and 'macro avg' in report
    assert (out / 'val_confusion.png').read_bytes()[:4] == b'\x89PNG'


@pytest.mark.slow
def test_report_of_a_top_3_result_file_says_top_3(trained, tmp_path, capsys):
    """--output_topk 3 on 6 classes: main.py's report prints top-3 where top-5
    is asked for, and says why (it printed top-1 alone before)."""
    from inference import report_inference
    _, annotation_path, out, _ = trained
    full = json.loads((out / 'val.json').read_text())
    top3 = {v: sorted(entries, key=lambda e: -e['score'])[:3]
            for v, entries in full['results'].items()}
    (tmp_path / 'val.json').write_text(json.dumps({'results': top3, 'views': full['views']}))
    report_inference(tmp_path / 'val.json', annotation_path, 'validation')
    printed = capsys.readouterr().out.splitlines()
    # the lines keep their form (util_scripts/gpu_checks/single.py reads top-1 from them)
    assert printed[0].startswith('inference top-1 video accuracy on validation: 0.')
    assert printed[1].startswith('inference top-3 video accuracy on validation: 0.')
    assert printed[2].startswith('inference top-5 video accuracy on validation: not in the '
                                 'results, which rank 3 labels per video')
    assert printed[3].startswith('inference mean class accuracy on validation: 0.')
    report = (tmp_path / 'val_report.txt').read_text()
    assert 'top-5 accuracy: not in the results' in report
    table = report.split('\n\n', 1)[1].rstrip('\n')
    assert '\n'.join(printed).count(table) == 1  # 6 classes: the per-class report is printed too


@pytest.mark.slow
def test_validation_only_run_writes_val_log_and_tensorboard_confusion(trained, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    video_path, annotation_path, out, _ = trained
    result = tmp_path / 'val_only'
    main.main(tiny_args(video_path, annotation_path, result, '--no_train', '--tensorboard',
                        '--resume_path', str(out / 'save_1.pth')))
    rows = read_tsv(result / 'val.log')
    assert len(rows) == 1 and rows[0]['epoch'] == '1'
    assert 0 <= float(rows[0]['acc']) <= 1
    events = EventAccumulator(str(result), size_guidance={'images': 0}).Reload()
    assert 'val/confusion' in events.Tags()['images']
    assert 'val/class_accuracy' in events.Tags()['histograms']
    assert [e.step for e in events.Scalars('val/mean_class_accuracy')] == [1]


# ----------------------------------------------------------------------------- real folders

def _mp4_of(folder, path):
    from PIL import Image

    from tests.video_files import write_video
    images = [np.asarray(Image.open(f).convert('RGB')) for f in sorted(folder.glob('image_*.jpg'))]
    return write_video(path, width=images[0].shape[1], height=images[0].shape[0], images=images,
                       gop=6)


@pytest.fixture(scope='module')
def class_tree(trained, tmp_path_factory):
    """root/<class>/<video>.mp4 of four validation videos, a truncated .mp4 (it
    cannot be opened) and a frame folder whose fifth JPEG is garbage (it fails
    while its clips are decoded, in a loader worker)."""
    video_path, _, _, val = trained
    root = tmp_path_factory.mktemp('tree') / 'root'
    good = {}
    for v, label in val[:4]:
        good[v] = label
        _mp4_of(video_path / label / v, root / label / f'{v}.mp4')
    v0, label0 = val[0]
    data = (root / label0 / f'{v0}.mp4').read_bytes()
    (root / label0 / 'truncated.mp4').write_bytes(data[:len(data) // 2])
    shutil.copytree(video_path / label0 / v0, root / label0 / 'corrupt')
    (root / label0 / 'corrupt' / 'image_00005.jpg').write_bytes(b'\xff\xd8 not a jpeg')
    return root, good


@pytest.mark.slow
def test_folder_with_broken_videos_classifies_the_others(trained, class_tree, tmp_path, capsys, monkeypatch):
    _, _, out, _ = trained
    root, good = class_tree
    monkeypatch.setattr(predict, 'on_terminal', lambda: True)  # the bar is drawn, on stderr: stdout stays JSON
    code = predict.main([str(out / 'save_1.pth'), str(root), '--topk', '0', '--json',
                         '--n_clips', '2', '--n_threads', '1'])
    captured = capsys.readouterr()
    printed = json.loads(captured.out)
    assert code == 1
    assert sorted(printed['results']) == sorted(good)
    assert sorted(printed['failed']) == ['corrupt', 'truncated']
    err = captured.err
    assert '2 of 6 video(s) could not be read and were skipped' in err
    assert str(root / next(iter(good.values())) / 'truncated.mp4') in err and 'corrupt' in err
    assert 'annotation file' not in err  # the training hint does not apply here
    assert 'classifying' in err  # the progress bar, on stderr
    # the good videos' scores are those of a run without the broken ones
    for broken in ('truncated.mp4', 'corrupt'):
        shutil.move(root / good[next(iter(good))] / broken, tmp_path / broken)
    try:
        assert predict.main([str(out / 'save_1.pth'), str(root), '--topk', '0', '--json',
                             '--n_clips', '2', '--n_threads', '0', '--no_progress']) == 0
    finally:
        for broken in ('truncated.mp4', 'corrupt'):
            shutil.move(tmp_path / broken, root / good[next(iter(good))] / broken)
    alone = json.loads(capsys.readouterr().out)['results']
    for v in good:
        assert _scores(printed['results'][v]) == pytest.approx(_scores(alone[v]), abs=1e-6)


def _top1_line(results, truth):
    hits = sum(results[v][0]['label'] == label for v, label in truth.items())
    return f'top-1 accuracy: {hits / len(truth):.4f} ({hits}/{len(truth)})'


@pytest.mark.slow
def test_accuracy_from_class_folders_and_from_the_annotation(trained, class_tree, capsys):
    _, annotation_path, out, _ = trained
    root, good = class_tree
    assert predict.main([str(out / 'save_1.pth'), str(root), '--topk', '0', '--n_clips', '2',
                         '--n_threads', '0', '--json', '--no_progress']) == 1
    captured = capsys.readouterr()
    results = json.loads(captured.out)['results']
    assert _top1_line(results, good) in captured.err
    assert 'top-5 accuracy' in captured.err and '(2 that could not be read not counted)' in \
        captured.err
    # the annotation's labels, for videos found anywhere (here: the flat folder of mp4s)
    flat = root.parent / 'flat'
    flat.mkdir()
    for path in root.glob('*/*.mp4'):
        shutil.copy(path, flat / path.name)
    assert predict.main([str(out / 'save_1.pth'), str(flat), '--topk', '3', '--n_clips', '2',
                         '--n_threads', '0', '--no_progress',
                         '--annotation_path', str(annotation_path)]) == 1
    text = capsys.readouterr().out
    assert _top1_line(results, good) in text
    assert sum(line.startswith(tuple(good)) for line in text.splitlines()) == 4


@pytest.mark.slow
def test_timeline_of_a_long_video(trained, tmp_path, capsys):
    from tests.video_files import write_video
    _, _, out, _ = trained
    video = write_video(tmp_path / 'long.mp4', n_frames=40, width=32, height=32, fps=10)
    args = [str(out / 'save_1.pth'), str(video), '--topk', '0', '--json', '--n_threads', '0',
            '--no_progress']
    assert predict.main([*args, '--timeline', str(tmp_path / 't.json')]) == 0
    result = _scores(json.loads(capsys.readouterr().out)['results']['long'])
    timeline = json.loads((tmp_path / 't.json').read_text())
    # windows side by side (the span, 8 frames), seconds from the video's 10 fps
    assert [w['frames'] for w in timeline['windows']] == [[8 * k, 8 * k + 8] for k in range(5)]
    assert [w['start_s'] for w in timeline['windows']] == pytest.approx([0.8 * k for k in range(5)])
    assert timeline['fps'] == 10 and len(timeline['classes']) == 6
    # the video's score is the mean of the windows' scores
    mean = {c: np.mean([w['scores'][c] for w in timeline['windows']]) for c in timeline['classes']}
    assert mean == pytest.approx(result, abs=1e-6)
    assert predict.main([*args, '--timeline', str(tmp_path / 't.png')]) == 0
    assert (tmp_path / 't.png').read_bytes()[:4] == b'\x89PNG'


@pytest.mark.slow
def test_output_video_draws_each_windows_label(trained, tmp_path, capsys):
    from datasets.video import read_video
    from tests.video_files import frame_level, write_video
    _, _, out, _ = trained
    video = write_video(tmp_path / 'long.mp4', n_frames=30, width=32, height=24, fps=10)
    assert predict.main([str(out / 'save_1.pth'), str(video), '--output_video',
                         str(tmp_path / 'out.mp4'), '--n_threads', '0', '--no_progress']) == 0
    assert 'labelled video' in capsys.readouterr().err
    frames = read_video(tmp_path / 'out.mp4')
    assert frames.shape == (30, 3, 240, 320)  # enlarged 10x so that the label is readable
    # every frame once, in order: the picture below the banner is the input's frame i
    assert [frame_level(f[:, 120:].permute(1, 2, 0).numpy()) for f in frames] == list(range(30))
    banner = frames[:, :, 2:20, 2:60].float()
    assert banner.max() > 200 and (banner < 40).float().mean() > 0.5  # white text on black


def test_frames_take_the_nearest_window():
    from utils.timeline import captions, frame_windows
    windows = [(0, 8, None), (4, 12, None), (8, 16, None)]
    assert frame_windows(windows, 16).tolist() == [0] * 6 + [1] * 4 + [2] * 6
    p = torch.eye(3)
    texts = captions([(0, 4, p[2]), (4, 8, p[0] * 0.5)], ['a', 'b', 'c'], 8)
    assert texts == ['c 1.00'] * 4 + ['a 0.50'] * 4


@pytest.mark.slow
def test_help_shows_defaults_and_window_outputs_take_one_video(trained, class_tree, capsys):
    _, _, out, _ = trained
    with pytest.raises(SystemExit):
        predict.parse_args(['-h'])
    assert '(default: 10)' in capsys.readouterr().out
    root, _ = class_tree
    assert predict.main([str(out / 'save_1.pth'), str(root), '--timeline',
                         str(root / 't.png')]) == 2
    assert 'take one video' in capsys.readouterr().err


def test_accuracy_lines():
    ranked = {'a': ['x', 'y'], 'b': ['y', 'x']}
    lines = classify.accuracy_lines({'a': 'x', 'b': 'x', 'c': 'y'}, ranked, ['x', 'y'], {'c': 'bad'})
    assert lines[0] == ('accuracy over the 2 classified videos with a true label '
                        '(1 that could not be read not counted):')
    assert '  top-1 accuracy: 0.5000 (1/2)' in lines
    bad = classify.accuracy_lines({'a': 'zzz'}, ranked, ['x', 'y'], {})
    assert len(bad) == 1 and bad[0].startswith('accuracy not computed')


def _with(checkpoint_path, path, change):
    from utils.checkpoint import load_checkpoint, save_checkpoint_atomic
    checkpoint = load_checkpoint(checkpoint_path)
    change(checkpoint)
    save_checkpoint_atomic(checkpoint, path)
    return str(path)


@pytest.mark.slow
def test_predict_runs_on_averaged_checkpoints(trained, tmp_path, capsys):
    """average_checkpoints carries the options, class names, class count and
    architecture over: predict.py reads the averaged file alone."""
    from util_scripts import average_checkpoints
    video_path, _, out, val = trained
    v0, label0 = val[0]
    save = str(out / 'save_1.pth')

    def halved(checkpoint):  # other weights, same run
        checkpoint['state_dict'] = {k: v / 2 if v.is_floating_point() else v
                                    for k, v in checkpoint['state_dict'].items()}
    other = _with(save, tmp_path / 'save_2.pth', halved)
    average_checkpoints.main([save, save, '--output', str(tmp_path / 'same.pth')])
    average_checkpoints.main([save, other, '--output', str(tmp_path / 'avg.pth')])
    capsys.readouterr()
    args = [str(video_path / label0 / v0), *PREDICT_VIEWS, '--topk', '0', '--json',
            '--n_threads', '0']
    printed = {}
    for name, path in (('save', save), ('same', tmp_path / 'same.pth'),
                       ('avg', tmp_path / 'avg.pth')):
        assert predict.main([str(path), *args]) == 0, capsys.readouterr().err
        printed[name] = json.loads(capsys.readouterr().out)['results'][v0]
    assert printed['same'] == printed['save']  # the average of one file twice is that file
    assert printed['avg'] != printed['save']
    # and main.py resumes from it, its carried options checked as any checkpoint's
    main.main(tiny_args(video_path, trained[1], tmp_path / 'r', '--no_train', '--no_val',
                        '--resume_path', str(tmp_path / 'same.pth'), '--inference', *MAIN_VIEWS,
                        '--output_topk', '0'))
    inferred = json.loads((tmp_path / 'r' / 'val.json').read_text())['results']
    assert inferred == json.loads((out / 'val.json').read_text())['results']


@pytest.mark.parametrize('key, change', [
    ('class_names', lambda c: c['class_names'].reverse()),
    ('n_classes', lambda c: c.update(n_classes=c['n_classes'] + 1)),
    ('opts.sample_size', lambda c: c['opts'].update(sample_size=c['opts']['sample_size'] * 2)),
    ('opts.mean_dataset', lambda c: c['opts'].update(mean_dataset='kinetics'))])
@pytest.mark.slow
def test_averaging_refuses_checkpoints_of_other_settings(trained, tmp_path, capsys, key, change):
    from util_scripts import average_checkpoints
    save = str(trained[2] / 'save_1.pth')
    other = _with(save, tmp_path / 'other.pth', change)
    with pytest.raises(SystemExit):
        average_checkpoints.main([save, other, '--output', str(tmp_path / 'avg.pth')])
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and key in err and 'other.pth' in err and save in err
    assert not (tmp_path / 'avg.pth').exists()


# ----------------------------------------------------------------------------- reduced-scale decoding

@pytest.fixture(scope='module')
def large_frames(tiny_synthetic, tmp_path_factory):
    """tiny_synthetic's validation videos at 128x96 (4x the 32-pixel sample
    size on the long side, 3x on the short one: JPEG frames decode at 1/2) as
    frame folders, hdf5 files and .mp4 files, under one root per kind."""
    from PIL import Image

    from tests.video_files import videos_from_jpgs
    video_path, annotation_path = tiny_synthetic
    root = tmp_path_factory.mktemp('large')
    val = [v for v, e in json.loads(annotation_path.read_text())['database'].items()
           if e['subset'] == 'validation']
    for folder in sorted(p for p in video_path.glob('*/*') if p.name in val):
        target = root / 'jpg' / folder.parent.name / folder.name
        target.mkdir(parents=True)
        for frame in sorted(folder.glob('image_*.jpg')):
            Image.open(frame).convert('RGB').resize((128, 96), Image.BILINEAR).save(
                target / frame.name, quality=90)
        (root / 'hdf5' / folder.parent.name).mkdir(parents=True, exist_ok=True)
        _hdf5_from_jpgs(target, root / 'hdf5' / folder.parent.name / f'{folder.name}.hdf5')
    videos_from_jpgs(root / 'jpg', root / 'video')
    return root, annotation_path


@pytest.mark.parametrize('kind', ['jpg', 'hdf5', 'video'])
def test_predict_clips_equal_inference_on_frames_larger_than_the_sample_size(
        large_frames, tmp_path, kind):
    """predict.py's views of 128x96 frames at sample size 32 are --inference's:
    both decode at the scale the crop plans (1/2 here), not one at full size."""
    import dataset as data
    from tests.test_datasets import prepared
    root, annotation_path = large_frames
    opt, record = prepared((root / kind, annotation_path), tmp_path, '--file_type', kind,
                           '--inference', *MAIN_VIEWS)
    inferred, _ = data.get_inference_data(opt, record)
    videos = classify.find_inputs(root / kind)
    failures = {}
    records = classify.measure_videos(videos, failures)
    assert not failures and len(records) == len(inferred.records) == 12
    mine = classify.build_dataset(records, videos, opt, 2, 0, 'three')
    where = {r.video_id: v for v, r in enumerate(inferred.records)}
    for v, r in enumerate(records):
        theirs = where[r.video_id]
        ours = range(mine.video_offsets[v], mine.video_offsets[v + 1])
        assert len(ours) == inferred.n_windows[theirs] == 2
        for i, j in zip(ours, range(inferred.video_offsets[theirs], inferred.video_offsets[theirs + 1])):
            a, b = mine[i][0], inferred[j][0]
            assert a.shape == b.shape == (3, 3, 8, 32, 32)
            assert torch.equal(a, b), (r.video_id, (a - b).abs().max().item())


@pytest.mark.slow
def test_a_missing_annotation_file_names_predicts_own_option(trained, tmp_path, capsys):
    video_path, _, out, val = trained
    v, label = val[0]
    missing = tmp_path / 'nope.json'
    assert predict.main([str(out / 'save_1.pth'), str(video_path / label / v),
                         '--annotation_path', str(missing), '--n_threads', '0']) == 2
    err = capsys.readouterr().err.strip()
    assert err == f'error: annotation file {missing} not found: check --annotation_path'


def test_an_annotation_in_another_order_does_not_rename_the_outputs(trained, tmp_path, capsys):
    """The checkpoint's class names name its outputs: an --annotation_path listing them in
    another order (a class folder renamed, the annotation rebuilt) gave each score the
    name of another class. Its labels still count as the true ones, by name."""
    video_path, annotation_path, out, val = trained
    v, label = val[0]
    data = json.loads(annotation_path.read_text())
    data['labels'] = data['labels'][::-1]
    reversed_path = tmp_path / 'reversed.json'
    reversed_path.write_text(json.dumps(data))
    args = [str(out / 'save_1.pth'), str(video_path / label / v), '--topk', '0', '--json',
            '--n_threads', '0', '--no_progress']
    assert predict.main(args) == 0
    expected = _scores(json.loads(capsys.readouterr().out)['results'][v])
    predict.main([*args, '--annotation_path', str(reversed_path)])
    captured = capsys.readouterr()
    assert _scores(json.loads(captured.out)['results'][v]) == expected
    assert 'accuracy over the 1 classified videos' in captured.err


def test_one_run_enters_predict_once(trained, tmp_path, capsys):
    """predict.py parses and dispatches: a run of every files step (frames counted,
    windows loaded in this process, scored, true labels, --timeline, --output_video,
    --extract_features) calls into it once, from the caller of main(); nothing below
    it calls back up (a pipeline whose steps sat in predict.py was re-entered 12 times)."""
    from tests.video_files import write_video
    video_path, annotation_path, out, _ = trained
    video = write_video(tmp_path / 'long.mp4', n_frames=24, width=32, height=32, fps=10)
    here = predict.__file__
    entered = []

    def profile(frame, event, arg):
        caller = frame.f_back
        if event == 'call' and frame.f_code.co_filename == here and \
                (caller is None or caller.f_code.co_filename != here):
            entered.append(frame.f_code.co_name)

    argv = [str(out / 'save_1.pth'), str(video), '--n_threads', '0', '--no_progress',
            '--annotation_path', str(annotation_path), '--timeline', str(tmp_path / 't.json'),
            '--output_video', str(tmp_path / 'o.mp4'), '--extract_features', str(tmp_path / 'f.h5')]
    sys.setprofile(profile)
    try:
        code = predict.main(argv)
    finally:
        sys.setprofile(None)
    assert code == 0, capsys.readouterr().err
    assert entered == ['main']
