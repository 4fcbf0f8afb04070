"""Videos muxed the ways real files are (issue 24): a variable frame rate into AVI
(FFmpeg writes an empty chunk for each dropped slot), a last frame shown long in
MKV/WebM, a first timestamp far from 0, 29.97 fps with B-frames, open GOPs, 10-bit,
full-range MJPEG, rotated (a phone's display matrix) and odd-sized frames; each also
cut at 50, 90 and 99% of its bytes, as a broken download is.

Every frame shows its index as a 4x4 binary code (tests/video_files.py,
grid_code_image), so a clip is checked by reading the codes back.  A whole file must
be counted as the annotation builders count it, give exactly the frames asked for
and pass the frame check; a cut copy must give the right frames up to where it is
cut, then fail with the loader's "cut short" error naming the missing frames, and
the frame check (--check_frames all) must flag it before training does."""
import random
from fractions import Fraction

import av
import numpy as np
import pytest

from datasets.annotation import VideoRecord
from datasets.formats import frame_count
from datasets.frame_check import check_videos
from datasets.frame_index import scan_frame_index
from datasets.video import VideoClipLoader
from tests.video_files import CORPUS, grid_clip_codes, read_grid_code, write_timed_video
from utils.errors import DataError


def _dropped_slots(n: int = 60) -> list[int]:
    """Timestamps of a variable frame rate: one slot of 1/25 s skipped after every 10 frames."""
    return [i + i // 10 for i in range(n)]


def _irregular_with_a_still(n: int = 30, last_ms: int = 2000) -> tuple[list[int], dict]:
    """Millisecond timestamps 30-44 ms apart, the last frame shown ``last_ms``."""
    steps = np.random.default_rng(0).integers(30, 45, n - 1)
    pts = np.concatenate([[0], np.cumsum(steps)]).astype(int).tolist()
    return pts, {pts[-1]: last_ms}


_STILL_PTS, _STILL_DURATION = _irregular_with_a_still()
_CFR = list(range(60))
_FAR = [90_000 + i for i in range(60)]  # the first frame at one hour (in 1/25 s)
X264 = {'crf': '18', 'g': '12'}
VP9 = {'crf': '20', 'b': '0', 'g': '12', 'deadline': 'realtime', 'cpu-used': '8'}
OPEN_GOP = {'crf': '18', 'x264-params': 'open-gop=1:keyint=12:min-keyint=12:bframes=3:scenecut=0'}
MPEG4 = {'bit_rate': 2_000_000, 'gop': 12}

# name -> write_timed_video's arguments
REAL_FILES = {
    'vfr_mpeg4.avi': dict(codec='mpeg4', pts=_dropped_slots(), time_base=Fraction(1, 25),
                          options={'bf': '0'}, **MPEG4),
    'vfr_mpeg4_bframes.avi': dict(codec='mpeg4', pts=_dropped_slots(), time_base=Fraction(1, 25),
                                  options={'bf': '2'}, **MPEG4),
    'long_last_frame.mkv': dict(codec='libx264', pts=_STILL_PTS, time_base=Fraction(1, 1000),
                                options=X264, durations=_STILL_DURATION),
    'long_last_frame.webm': dict(codec='libvpx-vp9', pts=_STILL_PTS, time_base=Fraction(1, 1000),
                                 options=VP9, durations=_STILL_DURATION),
    'live.mkv': dict(codec='libx264', pts=_CFR, time_base=Fraction(1, 25), options=X264,
                     mux_options={'live': '1'}),  # a live writer's: no Segment size, no Cues
    # (FFmpeg still writes each Cluster's size; tests/test_cut_everywhere.py makes them unknown)
    'live.webm': dict(codec='libvpx-vp9', pts=_CFR, time_base=Fraction(1, 25), options=VP9,
                      mux_options={'live': '1'}),
    'far_start.mkv': dict(codec='libx264', pts=_FAR, time_base=Fraction(1, 25), options=X264),
    'far_start.mp4': dict(codec='libx264', pts=_FAR, time_base=Fraction(1, 25), options=X264),
    'ntsc_bframes.mp4': dict(codec='libx264', pts=_CFR, time_base=Fraction(1001, 30000),
                             options={**X264, 'bf': '3'}, mux_options={'movflags': 'faststart'}),
    'open_gop.mp4': dict(codec='libx264', pts=_CFR, time_base=Fraction(1, 25), options=OPEN_GOP),
    'open_gop.mkv': dict(codec='libx264', pts=_CFR, time_base=Fraction(1, 25), options=OPEN_GOP),
    'h264_10bit.mp4': dict(codec='libx264', pts=_CFR, time_base=Fraction(1, 25), options=X264,
                           pix_fmt='yuv420p10le'),
    'mjpeg_full_range.mov': dict(codec='mjpeg', pts=_CFR, time_base=Fraction(1, 25),
                                 pix_fmt='yuvj420p', bit_rate=2_000_000, color_range=2),
    'rotated90.mp4': dict(codec='libx264', pts=_CFR, time_base=Fraction(1, 30), options=X264,
                          size=(64, 48), rotation=90),
    'rotated270.mov': dict(codec='libx264', pts=_CFR, time_base=Fraction(1, 30), options=X264,
                           size=(64, 48), rotation=-90),
    'odd_33x31.webm': dict(codec='libvpx-vp9', pts=_CFR, time_base=Fraction(1, 25), options=VP9,
                           size=(33, 31)),
    'odd_33x31.mkv': dict(codec='libx264', pts=_CFR, time_base=Fraction(1, 25), options=X264,
                          size=(33, 31), pix_fmt='yuv444p'),  # x264 takes odd sizes in 4:4:4 only
}
CUTS = (0.5, 0.9, 0.99)


def n_written(name: str) -> int:
    return len(REAL_FILES[name]['pts'])


@pytest.fixture(scope='module')
def real_files(tmp_path_factory):
    """{name: whole file}, and {(name, fraction): the file cut at that fraction of its bytes}."""
    folder = tmp_path_factory.mktemp('real')
    whole, cut = {}, {}
    for name, kwargs in REAL_FILES.items():
        path = write_timed_video(folder / name, **kwargs)
        data = path.read_bytes()
        for fraction in CUTS:
            cut[name, fraction] = folder / f'cut{round(fraction * 100)}_{name}'
            cut[name, fraction].write_bytes(data[:int(len(data) * fraction)])
        whole[name] = path
    return whole, cut


def queries(n: int) -> list[list[int]]:
    """The first and last clip, strided positions, random 8-frame clips, scattered
    positions and every single frame."""
    rng = random.Random(0)
    out = [list(range(16)), list(range(n - 16, n)), list(range(0, n, 3)), list(range(1, n, 7)),
           list(range(0, n, 2))[::-1]]
    out += [list(range(s, s + 8)) for s in (rng.randrange(n - 7) for _ in range(6))]
    out += [sorted(rng.sample(range(n), 5)) for _ in range(3)]
    return out + [[p] for p in range(n)]


def wrong_frames(path, n: int) -> tuple[int, list]:
    """(frames returned that are not the ones asked for, or not returned, examples)."""
    loader = VideoClipLoader(threads=1)
    wrong, examples = 0, []
    for positions in queries(n):
        try:
            got = grid_clip_codes(loader(path, positions))
        except DataError as e:
            wrong += len(positions)
            examples.append(str(e)[:160])
            continue
        bad = [(p, g) for p, g in zip(positions, got) if p != g]
        wrong += len(bad)
        examples += bad[:2]
    return wrong, examples[:3]


def scanned(path):
    with av.open(str(path)) as container:
        return scan_frame_index(container, container.streams.video[0])


def intact_frames(path) -> int:
    """Ground truth: how many leading frames decode whole and right (in presentation
    order, until the data ends or breaks; a frame of a packet the cut split is not
    whole); 0 for a file that cannot be opened."""
    n = 0
    try:
        with av.open(str(path)) as container:
            for frame in container.decode(container.streams.video[0]):
                array = frame.to_ndarray(format='rgb24')
                turns = round((frame.rotation or 0) / 90) % 4
                if frame.is_corrupt or read_grid_code(np.rot90(array, turns)) != n:
                    break
                n += 1
    except av.FFmpegError:
        pass
    return n


def record(path, n: int) -> VideoRecord:
    return VideoRecord(path.name, str(path), 0, n, 0, (0, n))


@pytest.mark.parametrize('name', list(REAL_FILES))
def test_the_builders_count_the_frames_written(real_files, name):
    whole, _ = real_files
    assert frame_count(whole[name], 'video') == n_written(name)


@pytest.mark.parametrize('name', list(REAL_FILES))
def test_a_whole_file_is_not_cut_short_and_every_clip_is_right(real_files, name):
    whole, _ = real_files
    index = scanned(whole[name])
    assert (index.n_frames, index.truncated) == (n_written(name), False)
    wrong, examples = wrong_frames(whole[name], n_written(name))
    assert wrong == 0, f'{name}: {wrong} frames wrong, e.g. {examples}'


@pytest.mark.parametrize('name', list(REAL_FILES))
def test_a_cut_copy_gives_its_whole_frames_then_names_the_missing_ones(real_files, name):
    """Each cut copy: the frames it still holds whole are the right ones, and a clip
    past them fails with "cut short" naming the first missing frame.  A copy that lost
    only index bytes (an AVI's idx1 at the end) holds every frame: it reads as the whole
    file.  An MP4 whose index (moov) comes last cannot be opened once cut: cut short,
    no frame."""
    _, cut = real_files
    n = n_written(name)
    for fraction in CUTS:
        path = cut[name, fraction]
        try:
            index = scanned(path)
        except av.FFmpegError:
            with pytest.raises(DataError, match='is cut short.*no frame can be read'):
                VideoClipLoader(threads=1)(path, [0])
            continue
        intact = intact_frames(path)
        if intact == n:
            assert not index.truncated and index.n_frames == n, (name, fraction)
            assert wrong_frames(path, n)[0] == 0, (name, fraction)
            continue
        kept = index.n_frames
        assert index.truncated and 0 < kept <= intact, (name, fraction, kept, intact)
        with pytest.raises(DataError, match='is cut short') as info:
            VideoClipLoader(threads=1)(path, range(n))
        message = str(info.value)
        assert str(path) in message and f'holds {kept} whole frames' in message
        assert f'frames {kept}, {kept + 1}' in message or f'frames {kept} (0-based)' in message
        loader = VideoClipLoader(threads=1)
        assert grid_clip_codes(loader(path, range(kept))) == list(range(kept))
        for p in range(max(0, kept - 4), kept):  # alone, the decoder reads on past them
            assert grid_clip_codes(loader(path, [p])) == [p], (name, fraction, p)


def whole_by_its_index(path) -> bool:
    """The frame check's shortcut: the file's own index shows it whole (no demux pass)."""
    from datasets.cut_videos import whole_by_its_index
    with av.open(str(path)) as container:
        return whole_by_its_index(container, container.streams.video[0])


def test_the_frame_check_passes_whole_files_and_flags_every_cut_copy(real_files):
    """--check_frames all flags exactly the copies that lost frames, as the loader
    finds them: no file passes the check that training then calls cut short.  Whole
    files pass on their own index (the sample table, idx1, the Segment's size), without
    a demux pass, except a live writer's, which states no length: its frames are all
    kept, and a clip past them fails, as from a copy cut there; no cut copy that lost
    frames does."""
    whole, cut = real_files
    check_videos([record(path, n_written(name)) for name, path in whole.items()], 'video',
                 mode='all')
    assert [name for name, path in whole.items() if not whole_by_its_index(path)] == ['live.mkv', 'live.webm']
    for name in ('live.mkv', 'live.webm'):
        index = scanned(whole[name])
        assert (index.n_frames, index.truncated, index.open_end) == (n_written(name), False, True)
    disagree = []
    for (name, fraction), path in cut.items():
        n = n_written(name)
        lost = intact_frames(path) < n  # 0 if it cannot be opened
        if lost and intact_frames(path):
            assert not whole_by_its_index(path), path.name
        try:
            VideoClipLoader(threads=1)(path, range(n))
            loader_fails = False
        except DataError:
            loader_fails = True
        try:
            check_videos([record(path, n)], 'video', mode='all')
            flagged = False
        except DataError as e:
            assert str(path) in str(e) and 'is cut short' in str(e), str(e)
            flagged = True
        if not lost == loader_fails == flagged:
            disagree.append(f'{path.name}: frames lost {lost}, loader fails {loader_fails}, '
                            f'check flags {flagged}')
    assert not disagree, disagree


def test_a_packet_cut_in_two_is_not_decoded(real_files, tmp_path):
    """A file cut inside the packet after its last keyframe: the frames shown before
    that keyframe are kept, and the last of them, which the decoder gives out only
    once fed the packets after it (B-frames), still reads (before: the half packet was
    sent to the decoder and the clip failed with 'decoding failed')."""
    whole, _ = real_files
    source = whole['ntsc_bframes.mp4']
    with av.open(str(source)) as container:
        packets = [p for p in container.demux() if p.size]
        key = max(i for i, p in enumerate(packets) if p.is_keyframe)
        kept = sum(p.pts < packets[key].pts for p in packets)
        end = packets[key + 1].pos + packets[key + 1].size // 2
    path = tmp_path / 'cut_after_key.mp4'
    path.write_bytes(source.read_bytes()[:end])
    index = scanned(path)
    assert index.truncated and index.n_frames == kept
    loader = VideoClipLoader(threads=1)
    assert grid_clip_codes(loader(path, [kept - 1])) == [kept - 1]
    assert grid_clip_codes(loader(path, range(kept))) == list(range(kept))
    with pytest.raises(DataError, match=f'cut short.*holds {kept} whole frames of 60; frames {kept} '):
        loader(path, [kept])


@pytest.mark.parametrize('name, index_id', [('far_start.mkv', b'\x1c\x53\xbb\x6b'),
                                            ('vfr_mpeg4.avi', b'idx1')])
def test_a_copy_that_lost_only_its_index_holds_every_frame(real_files, tmp_path, name, index_id):
    """Cut inside the index writers put after the frames (Matroska's Cues, AVI's
    idx1): every frame is there, none is reported missing.  Cut 4 bytes before it
    (in the last frame's data): cut short."""
    whole, _ = real_files
    data = whole[name].read_bytes()
    at = data.rfind(index_id)
    assert at > len(data) // 2
    n = n_written(name)
    for end, cut_short in ((at + 10, False), (at - 4, True)):
        path = tmp_path / f'{end}_{name}'
        path.write_bytes(data[:end])
        index = scanned(path)
        assert index.truncated == cut_short, end
        if cut_short:
            assert index.n_frames < n
            with pytest.raises(DataError, match='is cut short'):
                VideoClipLoader(threads=1)(path, [n - 1])
        else:
            assert index.n_frames == n and wrong_frames(path, n)[0] == 0


# MPEG program streams state no length (no header count, size or index): a copy cut
# between frames cannot be told from a whole file there.
NO_STATED_LENGTH = ('.mpg', '.mpeg')
# ASF packets have a fixed size (FFmpeg's default: 3200 bytes), the last one padded: a
# copy that lost only padding is cut short by its Data Object's size though every frame
# is there.  Smaller packets make the test's cuts fall in frames.
MUX_OPTIONS = {'.wmv': {'packet_size': '500'}}


@pytest.mark.slow
@pytest.mark.parametrize('name', list(CORPUS))
def test_every_container_cut_copy_is_found_as_the_loader_finds_it(tmp_path, name):
    """The exactness corpus's containers and codecs (tests/video_files.py, CORPUS),
    frames holding data (noise): each copy cut at 50, 90 and 99% gives the right frames
    or a DataError, and, where the file states its length, the loader calls it cut
    short exactly when frames were lost, and so does the frame check."""
    suffix, codec, options, gop, fmt = CORPUS[name]
    bit_rate = 2_000_000 if codec in ('mpeg4', 'mjpeg', 'flv', 'mpeg2video', 'mpeg1video', 'wmv2') \
        else None
    n = 60
    source = write_timed_video(tmp_path / f'{name}{suffix}', codec, list(range(n)), Fraction(1, 25),
                               options, gop=gop, fmt=fmt, mux_options=MUX_OPTIONS.get(suffix),
                               bit_rate=bit_rate,
                               pix_fmt='yuvj420p' if codec == 'mjpeg' else 'yuv420p')
    data = source.read_bytes()
    assert intact_frames(source) == n
    assert whole_by_its_index(source) == (suffix in ('.mp4', '.mov', '.m4v', '.3gp', '.avi', '.mkv',
                                                     '.webm'))
    problems = []
    for fraction in CUTS:
        path = tmp_path / f'cut{round(fraction * 100)}_{source.name}'
        path.write_bytes(data[:int(len(data) * fraction)])
        wrong = 0
        loader = VideoClipLoader(threads=1)
        # without a stated length a cut copy is a shorter video: loop-padded past its end
        end = scanned(path).n_frames if suffix in NO_STATED_LENGTH else n
        for positions in [[p] for p in range(end)] + [list(range(s, min(end, s + 8)))
                                                       for s in range(0, end, 8)]:
            try:
                got = grid_clip_codes(loader(path, positions))
            except DataError as e:
                assert str(path) in str(e)
                continue
            wrong += sum(p != g for p, g in zip(positions, got))
        if wrong:
            problems.append(f'{path.name}: {wrong} wrong frames')
        if suffix in NO_STATED_LENGTH:
            continue
        lost = intact_frames(path) < n
        try:
            VideoClipLoader(threads=1)(path, range(n))
            loader_says = 'whole'
        except DataError as e:
            loader_says = 'cut short' if 'is cut short' in str(e) else str(e)
        try:
            check_videos([record(path, n)], 'video', mode='all')
            check_says = 'whole'
        except DataError as e:
            check_says = 'cut short' if 'is cut short' in str(e) else str(e)
        if not loader_says == check_says == ('cut short' if lost else 'whole'):
            problems.append(f'{path.name}: frames lost {lost}, loader: {loader_says}, '
                            f'check: {check_says}')
    assert not problems, problems
