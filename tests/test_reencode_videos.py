"""util_scripts.reencode_videos: every frame kept, in order, with its timestamp;
a keyframe every --gop frames; the short side at most --short_side; option errors."""
from fractions import Fraction

import av
import pytest

from datasets.video import VideoClipLoader
from datasets.whole_videos import count_frames
from tests.video_files import (
    clip_codes,
    grid_clip_codes,
    write_coded_video,
    write_timed_video,
)
from util_scripts import reencode_videos


def frame_times(path):
    """Seconds of each decoded frame, and the positions of the keyframe packets."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        keys = sorted(float(p.pts * p.time_base) for p in container.demux(stream)
                      if p.pts is not None and p.is_keyframe)
    with av.open(str(path)) as container:
        times = [float(f.pts * f.time_base) for f in container.decode(video=0)]
    return times, [times.index(k) for k in keys]


def test_frames_kept_in_order_with_a_keyframe_every_gop(tmp_path):
    n = 40
    write_coded_video(tmp_path / 'src' / 'cls' / 'a.mp4', 'libx264', n, gop=250,
                      options={'bf': '3'})
    reencode_videos.main([str(tmp_path / 'src'), str(tmp_path / 'dst'), '--gop', '8'])
    out = tmp_path / 'dst' / 'cls' / 'a.mp4'
    assert count_frames(out) == (n, 'container')
    loader = VideoClipLoader()
    assert clip_codes(loader(out, list(range(n)))) == list(range(n))  # every frame by position
    assert clip_codes(loader(out, [37, 3, 20])) == [37, 3, 20]
    times, keys = frame_times(out)
    assert times == frame_times(tmp_path / 'src' / 'cls' / 'a.mp4')[0]
    assert keys[0] == 0 and max(b - a for a, b in zip(keys, keys + [n])) <= 8
    # a rerun skips what is there
    reencode_videos.main([str(tmp_path / 'src'), str(tmp_path / 'dst'), '--gop', '8'])


def test_vfr_rotated_odd_sized_scaled_down(tmp_path):
    pts = [0, 1, 2, 4, 7, 8, 9, 10, 14, 15, 16, 17, 18, 25, 26, 27]  # dropped slots: VFR
    src = write_timed_video(tmp_path / 'src' / 'phone.mov', 'libx264', pts, Fraction(1, 30),
                            options={'crf': '10'}, size=(96, 70), rotation=90)
    out = tmp_path / 'dst' / 'phone.mp4'
    assert reencode_videos.reencode_video(src, out, gop=4, short_side=45) == len(pts)
    clip = VideoClipLoader()(out, list(range(len(pts))))
    # upright 70x96 -> short side 45: 45x61, the odd sides lose a column and a row
    assert tuple(clip.shape[-2:]) == (60, 44)
    assert grid_clip_codes(clip) == list(range(len(pts)))
    for path, rotation in ((src, 90), (out, 0)):  # written upright, no display matrix
        with av.open(str(path)) as container:
            assert (next(container.decode(video=0)).rotation or 0) == rotation
    times, _ = frame_times(out)
    assert times == pytest.approx([t / 30 for t in pts])
    assert count_frames(out) == (len(pts), 'container')


def test_small_frames_keep_their_size(tmp_path):
    src = write_coded_video(tmp_path / 'a.mp4', 'libx264', 5)
    out = tmp_path / 'b.mp4'
    reencode_videos.reencode_video(src, out, short_side=320)
    with av.open(str(out)) as container:
        stream = container.streams.video[0]
        assert (stream.width, stream.height) == (64, 64)


@pytest.mark.parametrize('args, option', [(['--gop', '0'], '--gop 0'),
                                          (['--short_side', '1'], '--short_side 1'),
                                          (['--codec', 'nonesuch'], '--codec nonesuch'),
                                          (['--crf', '-3'], '--crf -3'),
                                          (['--gop', 'x'], '--gop')])
def test_option_errors_in_one_line(tmp_path, capsys, args, option):
    (tmp_path / 'src').mkdir()
    with pytest.raises(SystemExit) as e:
        reencode_videos.main([str(tmp_path / 'src'), str(tmp_path / 'dst'), *args])
    message = str(e.value) if e.value.code not in (0, 2) else capsys.readouterr().err
    assert option in message and len(message.strip().splitlines()) == 1


def test_unreadable_source_is_named(tmp_path, capsys):
    write_coded_video(tmp_path / 'src' / 'cls' / 'good.mp4', 'libx264', 4)
    bad = tmp_path / 'src' / 'cls' / 'bad.mp4'
    bad.write_bytes(b'not a video at all' * 100)
    with pytest.raises(SystemExit, match='1 video'):
        reencode_videos.main([str(tmp_path / 'src'), str(tmp_path / 'dst')])
    assert str(bad) in capsys.readouterr().err
    assert (tmp_path / 'dst' / 'cls' / 'good.mp4').is_file()
    assert not (tmp_path / 'dst' / 'cls' / 'bad.mp4').exists()
    assert not list((tmp_path / 'dst' / 'cls').glob('.*'))  # no temporary left
