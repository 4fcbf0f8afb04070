"""bench/video_peers.py's equality check: a peer returning other frames than ours is
reported and not timed; a peer that does not load is skipped and named; the peers
installed here (decord2, TorchCodec with FFmpeg's libraries) return ours; 'ours,
decoding only' decodes what ours decodes, is not compared and gives the ceiling column."""
import re

import pytest

from bench import video_peers as vp
from bench.video_clips import write_video


@pytest.fixture(scope='module')
def clips(tmp_path_factory):
    root = tmp_path_factory.mktemp('peers')
    path = root / 'clip.mp4'
    write_video(path, 24, 'libx264', {'crf': '23', 'g': '12', 'bf': '2'}, seed=0, size=(48, 64))
    return [(path, list(range(3, 9))), (path, list(range(14, 20)))]


def liar():
    """A peer whose frames are ours, one level brighter where they are not white."""
    ours = vp.ours_full()
    return lambda path, positions: ours(path, positions).clamp(max=254) + 1


def not_installed():
    import decord_that_is_not_there  # noqa: F401


def test_a_peer_returning_other_frames_is_reported_not_timed(clips, monkeypatch, capsys):
    monkeypatch.setattr(vp, 'PEERS', {'ours': vp.ours_full, 'liar': liar,
                                      'absent': not_installed, 'plain PyAV': vp.pyav_full})
    found, skipped = vp.available_peers(['ours', 'liar', 'absent', 'plain PyAV'])
    assert list(found) == ['ours', 'liar', 'plain PyAV']
    assert 'not installed' in skipped['absent']
    verdict = vp.check_equal(found, 'ours', clips)
    assert verdict['plain PyAV'] is None
    assert verdict['liar'].startswith('other frames: up to 1 levels apart')
    vp.run_task('a', found, skipped, {('H.264', '64x48'): clips}, rounds=1, workers=0)
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith('| H.264'))
    cells = [c.strip() for c in row.split('|')[3:6]]  # ours, liar, plain PyAV
    assert cells[1] == 'not timed' and '/' in cells[0] and '/' in cells[2]
    assert 'liar on H.264 64x48: other frames' in out
    assert 'skipped absent: not installed' in out


@pytest.mark.parametrize('peer', ['decord2', 'TorchCodec'])
def test_installed_peers_return_our_frames(clips, peer):
    found, skipped = vp.available_peers(['ours', peer])
    if peer in skipped:
        pytest.skip(f'{peer}: {skipped[peer]}')
    assert vp.check_equal(found, 'ours', clips) == {peer: None}


def test_torchcodec_without_ffmpeg_is_skipped_and_says_how_to_get_it(monkeypatch):
    """A fresh machine has no FFmpeg shared libraries: TorchCodec imports but cannot
    decode video; the bench skips it, naming apt-get install ffmpeg."""
    ops = pytest.importorskip('torchcodec._core.ops')
    monkeypatch.setattr(ops, '_FFMPEG_AVAILABLE', False)
    found, skipped = vp.available_peers(['TorchCodec'])
    assert not found and 'apt-get install ffmpeg' in skipped['TorchCodec']


def test_decoding_only_peer_decodes_what_ours_does_and_gives_the_ceiling(clips, monkeypatch,
                                                                         capsys):
    """'ours, decoding only' is ours without converting a frame: the same frames
    decoded, none returned (so not compared), the same function in task (b); the
    tables give its median over the fastest peer's beside ours'."""
    from datasets.video import VideoClipLoader
    only = vp.DECODING_ONLY
    monkeypatch.setattr(vp, 'PEERS', {'ours': vp.ours_full, only: vp.PEERS[only],
                                      'twin': vp.pyav_full})  # a peer with our frames
    found, skipped = vp.available_peers(['ours', only, 'twin'])
    assert vp.check_equal(found, 'ours', clips) == {'twin': None}
    ours = VideoClipLoader(threads=1)
    for path, positions in clips:
        ours(path, positions)
        assert found[only](path, positions) == len(set(positions))
    ours.close()
    assert found[only].stats['decoded'] == ours.stats['decoded'] >= 12
    assert vp.training_path(found[only], True, only) is found[only]
    for task in 'ab':
        vp.run_task(task, found, skipped, {('H.264', '64x48'): clips}, rounds=1, workers=0)
    out = capsys.readouterr().out
    heads = [line for line in out.splitlines() if line.startswith('| source')]
    rows = [line for line in out.splitlines() if line.startswith('| H.264')]
    assert len(heads) == len(rows) == 2
    for head, row in zip(heads, rows):
        cells = dict(zip((c.strip() for c in head.split('|')[1:-1]),
                         (c.strip() for c in row.split('|')[1:-1])))
        assert re.fullmatch(r'\d+\.\d\dx', cells['ours / fastest peer (median)'])
        assert re.fullmatch(r'\d+\.\d\dx', cells['ceiling: ours decoding only / fastest peer'])
        assert '/' in cells[only]
    assert out.count(f'{only}: not compared') == 2
