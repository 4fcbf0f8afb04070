"""A checkpoint's class names against the annotation's, on every resume and
every --no_train run from a checkpoint: the same names in another order (the
labels would be swapped) stop the run in one line that says how to go on;
other names stop it too unless fine-tuning (--pretrain_path); a checkpoint
without class names (the predecessor's) keeps the class-count check only.
util_scripts.folder_json --labels_from writes the checkpoint's order."""
import json

import pytest
import torch

import main
from tests.conftest import tiny_args
from util_scripts import folder_json
from utils.checkpoint import load_checkpoint
from utils.logs import read_tsv

TRAINED_ORDER = ['move_left', 'move_right', 'move_up', 'move_down', 'grow', 'shrink']


def run(video_path, annotation_path, result, *extra):
    main.main(tiny_args(video_path, annotation_path, result, '--no_val', '--checkpoint', '1', *extra))


def refused(capsys, *args):
    with pytest.raises(SystemExit) as stop:
        run(*args)
    assert stop.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def rewritten_annotation(src, dst, labels, renamed=None):
    """src with `labels` as its label list, and the entries' labels renamed ({old: new})."""
    data = json.loads(src.read_text())
    renamed = renamed or {}
    for entry in data['database'].values():
        annotations = entry.get('annotations') or {}
        if annotations.get('label') in renamed:
            annotations['label'] = renamed[annotations['label']]
    data['labels'] = labels
    dst.write_text(json.dumps(data))
    return dst


def linked_tree(video_path, root, folders):
    """root/<name> linking to video_path/<source> for each {name: source}."""
    root.mkdir()
    for name, source in folders.items():
        (root / name).symlink_to(video_path / source, target_is_directory=True)
    return root


@pytest.fixture(scope='module')
def trained(tiny_synthetic, tmp_path_factory):
    """One epoch on tiny_synthetic: (video_path, annotation_path, result folder)."""
    video_path, annotation_path = tiny_synthetic
    assert json.loads(annotation_path.read_text())['labels'] == TRAINED_ORDER
    result = tmp_path_factory.mktemp('trained')
    run(video_path, annotation_path, result, '--n_epochs', '1')
    return video_path, annotation_path, result


@pytest.mark.slow
def test_permuted_labels_stop_resume_and_inference(trained, tmp_path, capsys):
    video_path, annotation_path, result = trained
    swapped = list(TRAINED_ORDER)
    swapped[1], swapped[3] = swapped[3], swapped[1]
    permuted = rewritten_annotation(annotation_path, tmp_path / 'permuted.json', swapped)
    checkpoint = result / 'save_1.pth'
    def outputs():  # the lock and the data-index cache are the run's, not results
        return {p.name: p.stat().st_mtime_ns for p in result.iterdir() if p.name not in ('.lock', 'data_index')}
    before = outputs()
    capsys.readouterr()
    for extra in (('--n_epochs', '2', '--resume_path', str(checkpoint)),
                  ('--n_epochs', '2', '--auto_resume'),
                  ('--no_train', '--inference', '--resume_path', str(checkpoint))):
        line = refused(capsys, video_path, permuted, result, *extra)
        assert line.startswith(f'error: {permuted} lists the classes of --resume_path {checkpoint} in '
                               f'another order'), line
        assert "'move_right' is label 1 in the checkpoint and 3 here, 'move_down' 3 and 1" in line
        assert f'--labels_from {checkpoint}' in line and f'--pretrain_path {checkpoint}' in line
    # nothing trained, scored or rewritten
    assert outputs() == before
    assert len(read_tsv(result / 'train_batch.log')) == 3


@pytest.mark.slow
def test_other_names_stop_unless_fine_tuning(trained, tmp_path, capsys):
    video_path, annotation_path, result = trained
    checkpoint = result / 'save_1.pth'
    renamed = [name if name != 'grow' else 'expand' for name in TRAINED_ORDER]
    other = rewritten_annotation(annotation_path, tmp_path / 'other.json', renamed, {'grow': 'expand'})
    video_path = linked_tree(video_path, tmp_path / 'renamed', {
        name: TRAINED_ORDER[renamed.index(name)] for name in renamed})
    capsys.readouterr()
    for extra in (('--n_epochs', '2'), ('--no_train', '--inference')):
        line = refused(capsys, video_path, other, tmp_path / 'refused', *extra,
                       '--resume_path', str(checkpoint))
        assert line.startswith(f'error: {other} has other classes than --resume_path {checkpoint}: '
                               f"'grow' is not in it, 'expand' is new"), line
        assert f'--pretrain_path {checkpoint}' in line
    # A fine-tuning run (it names --pretrain_path) expects new classes: it goes on, saying so.
    run(video_path, other, tmp_path / 'tuned', '--n_epochs', '2', '--resume_path', str(checkpoint),
        '--pretrain_path', str(checkpoint))
    assert "'grow' is not in it, 'expand' is new: fine-tuning (--pretrain_path)" in capsys.readouterr().out
    assert load_checkpoint(tmp_path / 'tuned' / 'save_2.pth')['class_names'] == renamed


@pytest.mark.slow
def test_checkpoint_without_class_names_keeps_the_count_check(trained, tmp_path, capsys):
    video_path, annotation_path, result = trained
    old = load_checkpoint(result / 'save_1.pth')
    del old['class_names']  # as the predecessor wrote them
    torch.save(old, tmp_path / 'old.pth')
    permuted = rewritten_annotation(annotation_path, tmp_path / 'permuted.json', TRAINED_ORDER[::-1])
    run(video_path, permuted, tmp_path / 'resumed', '--n_epochs', '2', '--resume_path', str(tmp_path / 'old.pth'))
    assert (tmp_path / 'resumed' / 'save_2.pth').exists()
    fewer = rewritten_annotation(annotation_path, tmp_path / 'fewer.json', TRAINED_ORDER + ['extra'])
    capsys.readouterr()
    line = refused(capsys, video_path, fewer, tmp_path / 'fewer', '--n_epochs', '2',
                   '--resume_path', str(tmp_path / 'old.pth'))
    assert 'has 6 classes but' in line and 'has 7 labels' in line


@pytest.mark.slow
def test_folder_json_labels_from_checkpoint_resumes(trained, tmp_path, capsys):
    """A class-folder tree rebuilt with folder_json: sorted labels (another order
    than the checkpoint's) are refused; --labels_from the checkpoint resumes."""
    video_path, _, result = trained
    checkpoint = result / 'save_1.pth'
    tree = linked_tree(video_path, tmp_path / 'tree', {name: name for name in TRAINED_ORDER})
    folder_json.main([str(tree), str(tmp_path / 'sorted.json')])
    assert json.loads((tmp_path / 'sorted.json').read_text())['labels'] == sorted(TRAINED_ORDER)
    capsys.readouterr()
    line = refused(capsys, tree, tmp_path / 'sorted.json', tmp_path / 'a', '--n_epochs', '2',
                   '--resume_path', str(checkpoint))
    assert 'in another order' in line
    folder_json.main([str(tree), str(tmp_path / 'ordered.json'), '--labels_from', str(checkpoint)])
    assert json.loads((tmp_path / 'ordered.json').read_text())['labels'] == TRAINED_ORDER
    run(tree, tmp_path / 'ordered.json', tmp_path / 'b', '--n_epochs', '2', '--resume_path', str(checkpoint))
    assert load_checkpoint(tmp_path / 'b' / 'save_2.pth')['class_names'] == TRAINED_ORDER
