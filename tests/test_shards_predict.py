"""predict.py and util_scripts.export's int8 calibration reading make_shards' output
from a local folder, an HTTP server that serves byte ranges and moto's S3 server
(all on 127.0.0.1, started here): every video of the index classified with the
scores, views and accuracy of predict.py on the jpg folders the shards were made
of, frame counts from the index, the calibration and validation clips equal to
those of the folders; a missing index, a server that is down and a window output
asked of shards each end in one line."""
import contextlib
import io
import json
from argparse import Namespace
from types import SimpleNamespace
from unittest import mock

import numpy as np
import pytest

import classify
import main
import predict
from datasets import storage
from datasets.shards import ShardIndex, encode_index
from tests.conftest import skip_curves, tiny_args
from tests.servers import faulty_http_server, free_port, http_server
from util_scripts import export, export_clips

pytestmark = pytest.mark.usefixtures('one_torch_thread')
VIEWS = ('--n_clips', '2', '--crop', 'three', '--topk', '0', '--json', '--no_progress')


@pytest.fixture(scope='module')
def checkpoint(tiny_synthetic, shards, tmp_path_factory, one_torch_thread):
    """One epoch of the tiny model trained from the shard folder: its options' video_path
    is that folder and its file_type 'jpg' (the index says hdf5)."""
    result = tmp_path_factory.mktemp('trained')
    with pytest.MonkeyPatch.context() as patch:
        skip_curves(patch)
        main.main(tiny_args(shards, tiny_synthetic[1], result, '--n_epochs', '1', '--no_val'))
    return result / 'save_1.pth'


def run_predict(*args):
    """(exit status, the JSON printed, stderr's lines) of predict.main(args)."""
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()) as err:
        code = predict.main([str(a) for a in args])
    return code, json.loads(out.getvalue()) if out.getvalue() else None, err.getvalue().splitlines()


@pytest.fixture(scope='module')
def from_folders(checkpoint, tiny_synthetic):
    """predict.py on the jpg folders: (its JSON, its stderr lines), without and with
    --annotation_path."""
    video_path, annotation = tiny_synthetic
    runs = {}
    for extra in ((), ('--annotation_path', annotation)):
        code, printed, err = run_predict(checkpoint, video_path, *VIEWS, '--n_threads', '0', *extra)
        assert code == 0 and len(printed['results']) == 39
        runs[bool(extra)] = printed, err
    return runs


def assert_same_predictions(expected, got):
    (mine, my_err), (theirs, their_err) = got, expected
    assert list(mine['results']) == list(theirs['results']) and mine['views'] == theirs['views']
    for video_id, entries in theirs['results'].items():
        scores = {e['label']: e['score'] for e in mine['results'][video_id]}
        assert scores == pytest.approx({e['label']: e['score'] for e in entries}, abs=1e-6), video_id
    assert [line for line in my_err if 'accuracy' in line or line.startswith(('note', '  '))] == \
        [line for line in their_err if 'accuracy' in line or line.startswith(('note', '  '))]
    assert any(line.startswith('accuracy over the 36 classified videos with a true label') for line in my_err)


def location(kind, shards, http, s3, tmp_path):
    if kind == 'folder':
        return [shards]
    if kind == 'http':  # with the cache, read by a loader worker
        return [http + '/', '--shard_cache', tmp_path / 'cache', '--n_threads', '1']
    return [s3[0], '--storage_options', json.dumps(s3[1]), '--n_threads', '0']


@pytest.mark.parametrize('kind', ['folder', 'http', 's3'])
def test_predict_on_shards_equals_the_folders(kind, checkpoint, from_folders, tiny_synthetic, shards, http, s3,
                                              tmp_path):
    where = location(kind, shards, http, s3, tmp_path)
    extra = ['--n_threads', '0'] if kind == 'folder' else []
    code, printed, err = run_predict(checkpoint, *where, *VIEWS, *extra)
    assert code == 0
    assert_same_predictions(from_folders[False], (printed, err))
    if kind == 'http':
        assert len(list((tmp_path / 'cache').glob('*.bin'))) == 39
    if kind == 'folder':  # the annotation's labels, as for the folders
        code, printed, err = run_predict(checkpoint, *where, *VIEWS, *extra, '--annotation_path',
                                         tiny_synthetic[1])
        assert code == 0
        assert_same_predictions(from_folders[True], (printed, err))


def test_videos_of_the_index_are_named_counted_and_labelled_as_in_the_folders(tiny_synthetic, shards):
    """Ids, class folders and frame counts of the index's videos are those of the jpg
    tree's videos, and counting them reads no payload."""
    videos = classify.shard_inputs(storage.open_shards(shards))
    with mock.patch.object(storage.ShardStore, 'read_range', side_effect=AssertionError('a payload was read')):
        failures = {}
        records = classify.measure_videos(videos, failures)
    assert failures == {} and all(v.kind == 'hdf5' and v.path.count('/') == 1 for v in videos)
    folder = classify.find_inputs(tiny_synthetic[0])
    assert {(v.video_id, v.folder, classify.frame_count(v)) for v in folder} == \
        {(r.video_id, v.folder, r.n_frames) for v, r in zip(videos, records)}


def test_a_name_found_twice_is_named_by_its_rel():
    rows = [{'path': p, 'ext': 'hdf5', 'shard': 0, 'offset': 512, 'size': 1, 'meta_offset': 1024,
             'meta_size': 1, 'n_frames': n} for p, n in (('a/x', 5), ('a/y', 6), ('b/x', 7), ('v_z', 8))]
    index = ShardIndex.from_bytes(*encode_index('hdf5', [{'name': 'shard-000000.tar', 'size': 0, 'sha256': '',
                                                           'members': 8, 'n_videos': 4}], rows))
    videos = classify.shard_inputs(SimpleNamespace(index=lambda: index, location='s'))
    assert [(v.video_id, v.path, v.folder, v.n_frames) for v in videos] == [
        ('a/x', 'a/x', 'a', 5), ('y', 'a/y', 'a', 6), ('b/x', 'b/x', 'b', 7), ('v_z', 'v_z', None, 8)]


def one_error_line(code, err):
    lines = [line for line in err if line.startswith('error: ')]
    assert code == 2 and len(lines) == 1 and not any('Traceback' in line for line in err), err
    return lines[0]


def test_window_outputs_and_storage_options_without_shards_are_one_line(checkpoint, shards, tiny_synthetic,
                                                                        tmp_path):
    code, _, err = run_predict(checkpoint, shards, '--timeline', tmp_path / 't.json', '--no_progress')
    assert 'not shards' in one_error_line(code, err) and not (tmp_path / 't.json').exists()
    code, _, err = run_predict(checkpoint, tiny_synthetic[0], '--shard_cache', tmp_path / 'c')
    assert '--storage_options and --shard_cache are for shards' in one_error_line(code, err)
    with pytest.raises(SystemExit) as e, contextlib.redirect_stderr(io.StringIO()) as printed:
        predict.parse_args([str(checkpoint), 'https://host/x', '--storage_options', '{"secret": "s"}'])
    assert e.value.code == 2 and 'must not hold credentials' in printed.getvalue() and '"s"' not in printed.getvalue()


def test_no_index_at_the_url_and_a_server_down_are_one_line(checkpoint, tmp_path):
    with http_server(tmp_path) as url:
        line = one_error_line(*run_predict(checkpoint, url + '/nothing', '--no_progress')[::2])
    assert f'{url}/nothing/index.json not found' in line and 'check VIDEO_OR_FOLDER' in line, line
    down = f'http://127.0.0.1:{free_port()}/shards'
    with mock.patch.object(storage, 'BACKOFF_S', 0.01):
        line = one_error_line(*run_predict(checkpoint, down, '--no_progress')[::2])
    assert f'{down}/index.json' in line and f'after {storage.RETRIES + 1} tries' in line, line


@pytest.mark.parametrize('workers', ['0', '1'])
def test_shards_that_cannot_be_fetched_stop_the_run_instead_of_being_skipped(workers, checkpoint, shards, capsys):
    """The index loads, every shard request's connection is closed unanswered: one line
    after the retries, not a list of 'videos that could not be read'."""
    with mock.patch.object(storage, 'BACKOFF_S', 0.01), \
            faulty_http_server(shards, failures=10**6, status='drop', match='shard-') as (url, _):
        code, printed, err = run_predict(checkpoint, url, '--n_threads', workers, '--no_progress', '--json')
    line = one_error_line(code, err)
    assert f'{url}/shard-0000' in line and f'after {storage.RETRIES + 1} tries' in line, line
    assert printed is None and not any('could not be read' in e for e in err)


# ----------------------------------------------------------------------------- export's int8 clips

OPTIONS = dict(dataset='ucf101', file_type='jpg', input_type='rgb', sample_size=16, sample_duration=4,
               sample_t_stride=1, value_scale=1, mean_dataset='0.5', no_mean_norm=False, no_std_norm=False,
               n_val_samples=2)


def clip_sets(annotation, root, options, class_names):
    return export_clips.calibration_set(annotation, root, options, 30), \
        export_clips.validation_set(annotation, root, options, class_names)


def assert_same_clips(expected, got, options):
    assert [r.video_id for r in got.records] == [r.video_id for r in expected.records]
    assert got.labels == expected.labels and got.n_clips == expected.n_clips
    for (a, va), (b, vb) in zip(expected.batches(options), got.batches(options), strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(va, vb)


@pytest.mark.parametrize('kind', ['folder', 'http', 's3'])
def test_calibration_and_validation_clips_from_shards_equal_the_folders(kind, tiny_synthetic, shards, http, s3):
    video_path, annotation = tiny_synthetic
    names = json.loads(annotation.read_text())['labels'][::-1]
    options = Namespace(**OPTIONS, video_path=None)
    expected = clip_sets(annotation, export_clips.video_root(video_path, options, 'c.pth'), options, names)
    given, storage_options = {'folder': (shards, None), 'http': (http, None), 's3': s3}[kind]
    # the checkpoint's own video_path and storage options (a run that read the shards), or --video_path
    stored = Namespace(**OPTIONS, video_path=str(given),
                       storage_options=json.dumps(storage_options) if storage_options else None)
    root = export_clips.video_root(None, stored, 'c.pth')
    assert isinstance(root, storage.ShardStore) and root.location == str(given)
    if kind == 'http':
        root = export_clips.video_root(http, options, 'c.pth')
    got = clip_sets(annotation, root, stored, names)
    assert {got[0].file_type, got[1].file_type} == {'hdf5'} and got[0].store is root
    for a, b in zip(expected, got):
        assert_same_clips(a, b, options)


def test_export_video_path_errors_name_the_location(tiny_synthetic, tmp_path):
    options = Namespace(**OPTIONS, video_path=None)
    with pytest.raises(storage.StorageError, match='index.json not found'), http_server(tmp_path) as url:
        export_clips.video_root(url + '/x', options, 'c.pth')
    with pytest.raises(export_clips.OptionError,
                       match=r'rtsp://u:\*\*\*@cam/1: fsspec cannot open rtsp://.*\(--video_path\)'):
        export_clips.video_root('rtsp://u:pw@cam/1', options, 'c.pth')


@pytest.mark.slow
def test_int8_export_calibrated_from_the_checkpoints_shards_equals_the_folders(checkpoint, tiny_synthetic,
                                                                              tmp_path):
    """No --video_path: the checkpoint's (the shard folder, file_type jpg in its options,
    hdf5 in the index); the report equals that of --video_path the jpg folders."""
    video_path, annotation = tiny_synthetic
    reports = []
    for name, extra in (('shards', []), ('folders', ['--video_path', str(video_path)])):
        with contextlib.redirect_stdout(io.StringIO()):
            reports.append(export.main([str(checkpoint), '--output', str(tmp_path / f'{name}.onnx'), '--quantize',
                                        'int8', '--calibration', str(annotation), '--calibration_clips', '16',
                                        '--min_agreement', '0', *extra]))
    shards_report, folders_report = reports
    assert (tmp_path / 'shards.onnx').is_file()
    for field in ('agreement', 'n_clips', 'fp32_accuracy', 'int8_accuracy'):
        assert getattr(shards_report, field) == getattr(folders_report, field), field


# The session's shards and their servers (tests/conftest.py), under this module's names.
@pytest.fixture(scope='module')
def shards(tiny_shards):
    return tiny_shards


@pytest.fixture(scope='module')
def http(shards_http):
    return shards_http


@pytest.fixture(scope='module')
def s3(shards_s3):
    return shards_s3
