"""util_scripts.folder_json: a class-folder tree of your own videos to an
annotation JSON that the training loader reads."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from datasets.annotation import load_annotations
from tests.test_util_scripts import make_frames, make_hdf5
from tests.video_files import write_video
from util_scripts import folder_json

REPO = Path(__file__).resolve().parents[1]


def read_json(path):
    return json.loads(Path(path).read_text())


def truncated_copy(src, dst):
    data = Path(src).read_bytes()
    Path(dst).write_bytes(data[:len(data) // 2])


@pytest.fixture(scope='module')
def mp4_tree(tmp_path_factory):
    """Two classes of five .mp4 files (frame counts 6..10), a truncated .mp4
    and a stray text file."""
    root = tmp_path_factory.mktemp('own') / 'videos'
    for label in ('walk', 'jump'):
        for i in range(5):
            write_video(root / label / f'{label}_{i}.mp4', n_frames=6 + i)
    truncated_copy(root / 'walk' / 'walk_0.mp4', root / 'walk' / 'broken.mp4')
    (root / 'jump' / 'notes.txt').write_text('not a video')
    return root


def test_video_tree_to_annotation(mp4_tree, tmp_path, capsys):
    out = tmp_path / 'own.json'
    folder_json.main([str(mp4_tree), str(out)])
    data = read_json(out)
    assert data['labels'] == ['jump', 'walk']
    database = data['database']
    assert sorted(database) == sorted(f'{c}_{i}' for c in ('walk', 'jump') for i in range(5))
    for video_id, entry in database.items():
        # 0-based [0, n] as the other builders write for video files
        assert entry['annotations']['segment'] == [0, 6 + int(video_id[-1])]
        assert entry['annotations']['label'] == video_id.split('_')[0]
    for label in ('walk', 'jump'):
        subsets = sorted(e['subset'] for e in database.values()
                         if e['annotations']['label'] == label)
        assert subsets == ['training'] * 4 + ['validation']  # round(5 * 0.2)
    captured = capsys.readouterr()
    assert 'walk/broken' in captured.err and 'cannot be decoded, skipped' in captured.err
    assert 'jump/notes.txt' in captured.err
    assert '10 from the container header' in captured.out
    assert '--file_type video' in captured.out

    # the same split on a re-run
    again = tmp_path / 'again.json'
    folder_json.main([str(mp4_tree), str(again)])
    assert again.read_bytes() == out.read_bytes()

    # the training loader reads it: every path exists, the counts are the files'
    for subset in ('training', 'validation'):
        records, names = load_annotations(out, subset, mp4_tree, 'ucf101', file_type='video')
        assert names == ['jump', 'walk']
        assert all(Path(r.path).is_file() and r.n_frames >= 6 for r in records)


@pytest.mark.slow
def test_command_line_and_exit_status(mp4_tree, tmp_path, capsys):
    """`python -m` once (the entry point); the failures in this process. Python
    prints a SystemExit's message to stderr and exits 1, or exits with its number."""
    ok = subprocess.run([sys.executable, '-m', 'util_scripts.folder_json', str(mp4_tree), str(tmp_path / 'a.json'),
                         '--val_fraction', '0.4'], cwd=REPO, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert 'walk/broken' in ok.stderr  # listed and skipped: the others are written
    assert '6 training' in ok.stdout and '4 validation' in ok.stdout

    def fails(*args):
        with pytest.raises(SystemExit) as e:
            folder_json.main([str(a) for a in args])
        code = e.value.code
        return (1, code) if isinstance(code, str) else (code, capsys.readouterr().err)
    empty = tmp_path / 'empty'
    (empty / 'walk').mkdir(parents=True)
    code, err = fails(empty, tmp_path / 'b.json')
    assert code == 1 and 'holds no video' in err
    assert not (tmp_path / 'b.json').exists()
    code, err = fails(mp4_tree, tmp_path / 'c.json', '--val_fraction', '0.7', '--test_fraction', '0.3')
    assert code == 2 and 'sum to less than 1' in err


def test_stratified_split_every_class_in_training_and_stable():
    keys = [('a', f'a{i}') for i in range(10)] + [('b', 'b0')] + \
        [('c', f'c{i}') for i in range(2)] + [('d', f'd{i}') for i in range(3)]
    split = folder_json.stratified_split(keys, 0.2, 0.1, seed=0)

    def count(label, subset):
        return sum(1 for (c, _), s in split.items() if c == label and s == subset)
    assert [count('a', s) for s in ('training', 'validation', 'testing')] == [7, 2, 1]
    assert [count('b', s) for s in ('training', 'validation', 'testing')] == [1, 0, 0]
    assert [count('c', s) for s in ('training', 'validation', 'testing')] == [1, 1, 0]
    assert [count('d', s) for s in ('training', 'validation', 'testing')] == [1, 1, 1]
    # a new class leaves the other classes' splits as they were; the order of
    # the input does not matter; another seed draws another split
    more = folder_json.stratified_split(list(reversed(keys)) + [('e', 'e0'), ('e', 'e1')],
                                        0.2, 0.1, seed=0)
    assert {k: v for k, v in more.items() if k[0] != 'e'} == split
    other = folder_json.stratified_split(keys, 0.2, 0.1, seed=1)
    assert other != split and sorted(other.values()) == sorted(split.values())


def test_frame_folders_hdf5_and_mixed_trees(tmp_path, capsys):
    jpg = tmp_path / 'jpg'
    make_frames(jpg / 'b' / 'v.with.dots', 4)
    make_frames(jpg / 'a' / 'v1', 3)
    make_frames(jpg / 'a' / 'v2', 2)
    (jpg / 'a' / 'no_frames').mkdir()
    folder_json.main([str(jpg), str(tmp_path / 'jpg.json'), '--val_fraction', '0'])
    assert read_json(tmp_path / 'jpg.json') == {
        'labels': ['a', 'b'],
        'database': {
            'v1': {'subset': 'training', 'annotations': {'label': 'a', 'segment': [1, 4]}},
            'v2': {'subset': 'training', 'annotations': {'label': 'a', 'segment': [1, 3]}},
            'v.with.dots': {'subset': 'training',
                            'annotations': {'label': 'b', 'segment': [1, 5]}}}}
    assert 'a/no_frames' in capsys.readouterr().err

    make_hdf5(jpg / 'b' / 'h.hdf5', 5)
    with pytest.raises(SystemExit, match='3 jpg and 1 hdf5 videos.*--file_type'):
        folder_json.main([str(jpg), str(tmp_path / 'x.json')])
    folder_json.main([str(jpg), str(tmp_path / 'h.json'), '--file_type', 'hdf5'])
    assert read_json(tmp_path / 'h.json')['database'] == {
        'h': {'subset': 'training', 'annotations': {'label': 'b', 'segment': [0, 5]}}}


def test_same_name_in_two_classes(tmp_path):
    root = tmp_path / 'phones'
    for label in ('wave', 'clap'):
        write_video(root / label / 'IMG_0001.mp4', n_frames=5)
        write_video(root / label / f'{label}.mp4', n_frames=5)
    out = tmp_path / 'a.json'
    folder_json.main([str(root), str(out), '--val_fraction', '0.5'])
    database = read_json(out)['database']
    assert database['wave/IMG_0001']['video_path'] == 'wave/IMG_0001.mp4'
    assert database['clap/IMG_0001']['video_path'] == 'clap/IMG_0001.mp4'
    assert 'video_path' not in database['wave']
    records = [r for subset in ('training', 'validation')
               for r in load_annotations(out, subset, root, 'kinetics', file_type='video')[0]]
    assert sorted(str(Path(r.path).relative_to(root)) for r in records) == [
        'clap/IMG_0001.mp4', 'clap/clap.mp4', 'wave/IMG_0001.mp4', 'wave/wave.mp4']


def test_splits_from_ucf_style_lists(mp4_tree, tmp_path, capsys):
    lists = tmp_path / 'lists'
    lists.mkdir()
    (lists / 'trainlist01.txt').write_bytes(
        b'walk/walk_0.avi 1\r\nwalk/walk_1.avi 1\r\njump/jump_0.avi 2\r\n'
        b'jump/jump_9.avi 2\r\n')
    (lists / 'testlist01.txt').write_bytes(b'walk/walk_2.avi\r\njump/jump_1.avi\r\n')
    out = tmp_path / 'listed.json'
    folder_json.main([str(mp4_tree), str(out), '--splits', str(lists)])
    database = read_json(out)['database']
    assert {k: v['subset'] for k, v in database.items()} == {
        'walk_0': 'training', 'walk_1': 'training', 'jump_0': 'training',
        'walk_2': 'validation', 'jump_1': 'validation'}
    err = capsys.readouterr().err
    assert '1 video(s) listed but not found or not readable, skipped: jump/jump_9' in err
    assert '5 video(s) on disk but in neither list, left out' in err
    with pytest.raises(SystemExit, match='trainlist02.txt'):
        folder_json.main([str(mp4_tree), str(out), '--splits', str(lists), '--split', '2'])


def test_upper_case_extensions(tmp_path, capsys):
    """Phones and cameras write IMG_0001.MP4, clip.MOV: found as .mp4 and .mov are (before:
    'holds no video' for a tree of them), and read by the training loader (two files of
    one name: refused, tests/test_datasets.py)."""
    from datasets.video import VideoClipLoader
    root = tmp_path / 'phones'
    for name in ('wave/IMG_0001.MP4', 'wave/clip.MOV', 'clap/d.AVI', 'clap/c.Mp4'):
        write_video(root / name, n_frames=5)
    out = tmp_path / 'a.json'
    folder_json.main([str(root), str(out), '--val_fraction', '0'])
    assert sorted(read_json(out)['database']) == ['IMG_0001', 'c', 'clip', 'd']
    records = load_annotations(out, 'training', root, 'kinetics', file_type='video')[0]
    assert sorted(str(Path(r.path).relative_to(root)) for r in records) == [
        'clap/c.Mp4', 'clap/d.AVI', 'wave/IMG_0001.MP4', 'wave/clip.MOV']
    loader = VideoClipLoader(threads=1)
    assert all(loader(r.path, [0, 4]).shape[0] == 2 for r in records)


def test_labels_from_a_checkpoint(tmp_path, capsys):
    """--labels_from CHECKPOINT: the checkpoint's class names in its order (a class
    without a folder kept at its label, warned); a folder it lacks is refused, as is
    a checkpoint without class names."""
    import torch
    root = tmp_path / 'jpg'
    for label in ('b', 'a'):
        make_frames(root / label / f'{label}1', 3)
    torch.save({'epoch': 1, 'class_names': ['b', 'c', 'a']}, tmp_path / 'save_1.pth')
    out = tmp_path / 'ordered.json'
    folder_json.main([str(root), str(out), '--val_fraction', '0', '--labels_from', str(tmp_path / 'save_1.pth')])
    data = read_json(out)
    assert data['labels'] == ['b', 'c', 'a']
    assert {k: e['annotations']['label'] for k, e in data['database'].items()} == {'a1': 'a', 'b1': 'b'}
    assert '1 class(es) have no training video: c' in capsys.readouterr().err
    records, names = load_annotations(out, 'training', root, 'ucf101', file_type='jpg')
    assert names == ['b', 'c', 'a'] and sorted(r.label for r in records) == [0, 2]

    make_frames(root / 'd' / 'd1', 3)
    with pytest.raises(SystemExit, match=r"has 1 class folder\(s\) that .*save_1.pth was not trained on: d: "):
        folder_json.main([str(root), str(tmp_path / 'x.json'), '--labels_from', str(tmp_path / 'save_1.pth')])
    torch.save({'epoch': 1}, tmp_path / 'old.pth')
    with pytest.raises(SystemExit, match='old.pth stores no class names'):
        folder_json.main([str(root), str(tmp_path / 'x.json'), '--labels_from', str(tmp_path / 'old.pth')])
    assert not (tmp_path / 'x.json').exists()
