"""bench.shards on a few tiny videos: every row of the table is there with an
epoch's clips, the clips read from shards (local, over HTTP cold and warm) are
the jpg folders' clips, the cold epoch asks the server once per video and the
warm one never, and the index section reads its record cache the second time.
Correctness only: no timing is asserted."""
import importlib.util

import pytest
import torch

from bench import shards as bench

pytestmark = pytest.mark.slow

SMALL = ['--videos', '8', '--frames', '16', '--rounds', '1', '--index_videos', '2000', '--workers', '2']
ROWS = ['jpg', 'hdf5', 'shards', 'remote_cold', 'remote_warm', 'mp4', 'mp4_shards']


def table_rows(printed):
    """The cells of the loader table's rows, from the printed output."""
    lines = printed.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('| row | data | clips/s |'))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith('|'):
            break
        rows.append([c.strip() for c in line.strip('|').split('|')])
    return rows


def test_a_small_run(capsys):
    result = bench.main(SMALL)
    rows = {r['row']: r for r in result['rows']}
    assert list(rows) == ROWS
    for r in rows.values():
        assert r['clips'] == 8 and r['round_clips'] == [8]  # one batch of 8: every video once an epoch
        assert r['clips_per_s'] > 0 and r['mb'] > 0 and len(r['rounds']) == 1
        if r['reference'] is not None:
            assert r['same_clips'] is True, r['row']
    assert [rows[r]['reference'] for r in ROWS] == [None, 'jpg', 'jpg', 'jpg', 'jpg', None, 'mp4']
    assert rows['remote_cold']['requests'] == 8 and rows['remote_warm']['requests'] == 0
    # the cold epoch fetched each video's payload and its 512-byte tar header once, the warm one nothing
    assert round((rows['remote_cold']['sent_mb'] - rows['remote_cold']['cache_mb']) * 1e6) == 8 * 512
    assert rows['remote_warm']['sent_mb'] == 0
    assert rows['remote_warm']['cache_mb'] > 0
    assert rows['hdf5']['vs_hdf5'] == 1
    expected = 'photo' if importlib.util.find_spec('skimage') else 'noise'
    assert result['frames'] == expected

    cells = table_rows(capsys.readouterr().out)
    assert [c[0] for c in cells] == [str(i) for i in range(1, 8)]
    assert [c[1] for c in cells] == [bench.ROWS[r][0] for r in ROWS]
    assert all(c[7] == '8' for c in cells)
    assert [c[4] for c in cells] == [f'{r["rounds"][0]:.1f}' for r in result['rows']]  # one round
    assert [c[8] for c in cells] == ['(reference)', '= jpg', '= jpg', '= jpg', '= jpg', '(reference)', '= mp4']
    assert [c[6].split(',')[0] for c in cells] == ['', '', '', '8', '0', '', '']

    ix = result['index']
    assert ix['videos'] == 2000 and ix['records'] == 1800  # 90% training
    assert ix['cached_b'] is False and ix['cached_c'] is True
    assert [g[0].split(' ')[0] for g in result['goals']] == ['local', 'remote', 'remote', 'index']


def test_shards_give_the_jpg_folders_clips(tmp_path):
    """The same seed, the same clips from the jpg folders and from their shards (the
    training loader in this process, no workers), a different seed other clips."""
    args = bench.parse_args(['--videos', '8', '--frames', '16', '--workers', '0', '--no_video'])
    folders, annotation = bench.prepare(tmp_path, args, 'noise')
    jpg, = bench.train_loader(tmp_path, 'jpg', folders, annotation, args)
    shard, = bench.train_loader(tmp_path, 'shards', folders, annotation, args)
    assert torch.equal(jpg[0], shard[0]) and torch.equal(jpg[1], shard[1])
    other = bench.parse_args(['--videos', '8', '--frames', '16', '--workers', '0', '--seed', '2'])
    reseeded, = bench.train_loader(tmp_path, 'shards', folders, annotation, other)
    assert jpg[0].shape == reseeded[0].shape == (8, 3, 16, 112, 112) and not torch.equal(jpg[0], reseeded[0])


def test_noise_frames_without_scikit_image(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, 'find_spec', lambda name, *a: None if name == 'skimage' else real(name, *a))
    kind, note = bench.frame_kind('photo')
    assert kind == 'noise' and 'scikit-image is missing' in note
    assert bench.frame_kind('noise')[0] == 'noise'
