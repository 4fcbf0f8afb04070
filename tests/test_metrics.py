"""Evaluation report: top-1/top-5, mean class accuracy, per-class P/R/F1 from
the confusion matrix, and the confusion picture, against hand-computed values."""
import json

import numpy as np
import pytest
from PIL import Image

from datasets.video_accuracy import evaluate_file
from util_scripts import eval_accuracy
from utils.metrics import (
    class_report,
    confusion_figure,
    confusion_matrix,
    evaluate_ranked,
    format_report,
    save_confusion_png,
)

# Annotation order (not alphabetical): the matrix and the report follow it.
LABELS = ['c', 'a', 'b', 'd', 'e', 'f']


def _entry(subset, label):
    return {'subset': subset, 'annotations': {'label': label, 'segment': [1, 9]}}


def _ranked(*labels):
    """Result entries with decreasing scores, written in a shuffled order."""
    entries = [{'label': name, 'score': round(1.0 - 0.1 * i, 2)} for i, name in enumerate(labels)]
    return entries[::-1]


@pytest.fixture
def report_files(tmp_path):
    truth = {'v1': 'a', 'v2': 'a', 'v3': 'b', 'v4': 'b', 'v5': 'c', 'v6': 'c', 'v7': 'd',
             'v8': 'f'}
    database = {v: _entry('validation', label) for v, label in truth.items()}
    database['t1'] = _entry('training', 'e')
    results = {
        'v1': _ranked('a', 'b', 'c', 'd', 'e', 'f'),  # right
        'v2': _ranked('b', 'c', 'd', 'e', 'a', 'f'),  # -> b, 'a' 5th: top-5 hit
        'v3': _ranked('b', 'a'),                      # right
        'v4': _ranked('a', 'c', 'd', 'e', 'f', 'b'),  # -> a, 'b' 6th: top-5 miss
        'v5': _ranked('c', 'a'),                      # right
        # v6 has no result: wrong, and in no column of the matrix
        'v7': _ranked('a', 'd'),                      # -> a, top-5 hit
        'v8': _ranked('f'),                           # right
        't1': _ranked('e')}                           # other subset: ignored
    gt = tmp_path / 'gt.json'
    gt.write_text(json.dumps({'labels': LABELS, 'database': database}))
    res = tmp_path / 'val.json'
    res.write_text(json.dumps({'results': results}))
    return gt, res


def test_confusion_matrix_counts():
    m = confusion_matrix([0, 0, 1, 2, 2, 2], [0, 1, 1, 2, 0, 2], 3)
    assert m.tolist() == [[1, 1, 0], [0, 1, 0], [1, 0, 2]]
    with pytest.raises(ValueError, match='2 targets but 1 predictions'):
        confusion_matrix([0, 1], [0], 3)


def test_class_report_by_hand():
    # rows: true, columns: predicted
    m = np.array([[3, 1, 0],
                  [2, 2, 0],
                  [0, 0, 0]])
    r = class_report(m, unscored=[0, 0, 1])
    # class 0: P 3/5, R 3/4; class 1: P 2/3, R 2/4; class 2: never predicted, 1 unscored
    np.testing.assert_allclose(r.precision, [3 / 5, 2 / 3, 0])
    np.testing.assert_allclose(r.recall, [3 / 4, 1 / 2, 0])
    np.testing.assert_allclose(r.f1, [2 * 0.6 * 0.75 / 1.35, 2 * (2 / 3) * 0.5 / (7 / 6), 0])
    assert r.support.tolist() == [4, 4, 1]
    assert r.mean_class_accuracy == pytest.approx((0.75 + 0.5 + 0) / 3)
    assert r.accuracy == pytest.approx(5 / 9)


def test_evaluation_of_fixed_files(report_files):
    e = evaluate_file(*report_files)
    assert e.class_names == LABELS
    assert e.n_videos == 8
    assert e.topk(1) == 4 / 8 and e.topk(5) == 6 / 8
    idx = {name: i for i, name in enumerate(LABELS)}
    expected = np.zeros((6, 6), dtype=int)
    for t, p in [('a', 'a'), ('a', 'b'), ('b', 'b'), ('b', 'a'), ('c', 'c'), ('d', 'a'),
                 ('f', 'f')]:
        expected[idx[t], idx[p]] += 1
    np.testing.assert_array_equal(e.confusion, expected)
    assert e.unscored.tolist() == [1, 0, 0, 0, 0, 0]  # v6 (class c)
    r = e.report
    # in LABELS order: c, a, b, d, e, f
    np.testing.assert_allclose(r.precision, [1, 1 / 3, 1 / 2, 0, 0, 1])
    np.testing.assert_allclose(r.recall, [1 / 2, 1 / 2, 1 / 2, 0, 0, 1])
    np.testing.assert_allclose(r.f1, [2 / 3, 0.4, 0.5, 0, 0, 1])
    assert r.support.tolist() == [2, 2, 2, 1, 0, 1]
    assert r.mean_class_accuracy == pytest.approx(0.5)  # e has no video: left out


def test_evaluation_ignore_missing(report_files):
    e = evaluate_file(*report_files, ignore=True)
    assert e.n_videos == 7 and e.topk(1) == pytest.approx(4 / 7)
    assert e.report.support.tolist() == [1, 2, 2, 1, 0, 1]
    assert e.report.mean_class_accuracy == pytest.approx((1 + 0.5 + 0.5 + 0 + 1) / 5)


def test_top5_skipped_with_few_classes():
    e = evaluate_ranked({'v1': 'x', 'v2': 'y'}, {'v1': ['x', 'y'], 'v2': ['x', 'y']},
                        ['x', 'y'])
    assert e.topk(1) == 0.5 and e.topk(5) is None
    assert 'top-5 accuracy: skipped (only 2 classes)' in e.summary_lines()


def test_cli_report_and_confusion(report_files, tmp_path, capsys):
    gt, res = report_files
    png = tmp_path / 'confusion.png'
    eval_accuracy.main([str(gt), str(res), '--report', '--confusion', str(png)])
    out = capsys.readouterr().out
    assert 'top-1 accuracy: 0.5000 (4/8)' in out
    assert 'top-5 accuracy: 0.7500 (6/8)' in out
    assert 'mean class accuracy: 0.5000 (5 classes)' in out
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in [[n] for n in LABELS]]
    assert [r[0] for r in rows] == LABELS
    assert rows[1] == ['a', '0.3333', '0.5000', '0.4000', '2']
    assert 'macro avg' in out and 'weighted avg' in out
    with Image.open(png) as img:
        assert img.format == 'PNG' and img.size == (640, 490)


def test_format_report_weighted_mean():
    r = class_report(np.array([[1, 1], [0, 2]]))  # P 1, 2/3; R 1/2, 1; support 2, 2
    last = format_report(r, ['x', 'y']).splitlines()[-1].split()
    assert last[:2] == ['weighted', 'avg']
    assert [float(v) for v in last[2:5]] == pytest.approx([5 / 6, 3 / 4, 0.7333], abs=1e-4)


@pytest.mark.slow
def test_confusion_picture_for_101_classes(tmp_path):
    names = [f'class_{i:03d}_with_a_long_name' for i in range(101)]
    rng = np.random.default_rng(0)
    targets = rng.integers(0, 101, 2000)
    m = confusion_matrix(targets, np.where(rng.random(2000) < 0.7, targets, 0), 101)
    path = tmp_path / 'c101.png'
    save_confusion_png(m, names, path)
    with Image.open(path) as img:
        assert img.size == (1612, 1462)
    ax = confusion_figure(m, names).axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == names
    assert [t.get_text() for t in ax.get_xticklabels()] == names
    # row-normalized: every row with videos sums to 1
    np.testing.assert_allclose(ax.images[0].get_array().sum(1)[m.sum(1) > 0], 1)
