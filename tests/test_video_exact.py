"""Frame-exact video seeking: every frame the video loader returns is the frame asked
for, in every container and codec it accepts, or the clip fails with a DataError.

The corpus (tests/video_files.py, CORPUS) is written with PyAV in about a second;
each frame shows its own index as a binary code of black/white blocks, so a clip
is checked by reading the codes back."""
import random

import pytest

from datasets.video import VideoClipLoader
from datasets.whole_videos import count_frames
from tests.video_files import CORPUS, clip_codes, write_corpus_video
from utils.errors import DataError

N_FRAMES = 60
LONG_GOP = 'h264_mp4_default_gop'  # x264's default keyframe interval (250): 300 frames


def n_frames_of(name: str) -> int:
    return 300 if name == LONG_GOP else N_FRAMES


@pytest.fixture(scope='module')
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp('corpus')
    return {name: write_corpus_video(folder, name, n_frames_of(name)) for name in CORPUS}


def queries(n: int, seed: int = 0) -> list[list[int]]:
    """The first and last clip, strided positions, random 16-frame clips, random
    scattered positions and single frames (every one, or every 7th of a long video)."""
    rng = random.Random(seed)
    out = [list(range(16)), list(range(n - 16, n)), list(range(0, n, 3)), list(range(1, n, 7)),
           list(range(0, n, 2))[::-1]]
    out += [list(range(s, s + 16)) for s in (rng.randrange(n - 15) for _ in range(8))]
    out += [sorted(rng.sample(range(n), 6)) for _ in range(4)]
    singles = range(n) if n <= 100 else sorted({*range(0, n, 7), *range(245, 256), n - 1})
    out += [[p] for p in singles]
    return out


def wrong_frames(loader, path, n: int, hidden: int = 0) -> tuple[int, int, list]:
    """(frames returned that are not the ones asked for, frames asked for, examples);
    ``hidden``: frames the container hides (position p shows frame p + hidden)."""
    wrong, total, examples = 0, 0, []
    for positions in queries(n):
        total += len(positions)
        try:
            got = clip_codes(loader(path, positions))
        except DataError as e:
            wrong += len(positions)
            examples.append((positions[:4], str(e)[:120]))
            continue
        bad = [(p, g) for p, g in zip(positions, got) if p + hidden != g]
        wrong += len(bad)
        if bad:
            examples.append(bad[:4])
    return wrong, total, examples[:3]


@pytest.fixture(scope='module')
def stored(corpus, tmp_path_factory):
    """The corpus's frame indexes written to a FrameTable (as a first epoch does)."""
    from datasets.video_index import FrameTable
    folder = tmp_path_factory.mktemp('frames')
    first = VideoClipLoader(threads=1, frame_table=FrameTable(folder))
    for path in corpus.values():
        first(path, [0])
    first.frame_table.flush()
    return folder


@pytest.mark.parametrize('index', ['scanned', 'stored'])
@pytest.mark.parametrize('name', list(CORPUS))
def test_every_frame_is_the_one_asked_for(corpus, stored, name, index):
    """Through the index demuxed on open and through the stored one (FrameTable)."""
    from datasets.video_index import FrameTable
    path = corpus[name]
    loader = VideoClipLoader(threads=1, frame_table=FrameTable(stored) if index == 'stored' else None)
    wrong, total, examples = wrong_frames(loader, path, n_frames_of(name))
    assert wrong == 0, f'{name}: {wrong} of {total} frames wrong, e.g. {examples}'
    assert loader.stats == {'decoded': loader.stats['decoded'], index: 1}


def truncated_copies(corpus, folder) -> dict:
    """Every corpus video cut at 55% and 85% of its bytes, and an H.264 .mp4 with its
    index first (faststart, as web videos are: it still opens once cut)."""
    from tests.video_files import write_coded_video
    sources = dict(corpus)
    sources['h264_mp4_faststart'] = write_coded_video(
        folder / 'faststart.mp4', 'libx264', N_FRAMES, {'crf': '18', 'g': '16'},
        mux_options={'movflags': 'faststart'})
    out = {}
    for name, path in sources.items():
        data = path.read_bytes()
        for fraction in (0.55, 0.85):
            cut = folder / f'cut{int(fraction * 100)}_{path.name}'
            cut.write_bytes(data[:int(len(data) * fraction)])
            out[f'{name}@{fraction}'] = (cut, 300 if name == LONG_GOP else N_FRAMES)
    return out


def test_truncated_videos_give_the_right_frames_or_a_data_error(corpus, tmp_path):
    """A video cut mid-file: each frame asked for is either the right one or the
    clip fails with a DataError naming the video; never garbage or another frame."""
    wrong = {}
    for name, (path, n) in truncated_copies(corpus, tmp_path).items():
        loader = VideoClipLoader(threads=1)
        bad = []
        for positions in [[p] for p in range(0, n, 1 if n <= 100 else 5)] + \
                [list(range(s, min(n, s + 8))) for s in range(0, n, 8)]:
            try:
                got = clip_codes(loader(path, positions))
            except DataError as e:
                assert path.name in str(e)
                continue
            bad += [(p, g) for p, g in zip(positions, got) if p != g]
        if bad:
            wrong[name] = (len(bad), bad[:3])
    assert not wrong, f'wrong frames returned (count, examples): {wrong}'


def test_frames_an_edit_list_hides_have_no_position(tmp_path):
    """An MP4 cut by stream copy starts with frames its edit list hides (decoded for
    reference, never shown): position 0 is the first frame shown."""
    from tests.video_files import write_coded_video
    path = write_coded_video(tmp_path / 'edit.mp4', 'libx264', N_FRAMES, {'crf': '18', 'g': '16'},
                             first_pts=-5)
    loader = VideoClipLoader(threads=1)
    wrong, total, examples = wrong_frames(loader, path, N_FRAMES - 5, hidden=5)
    assert wrong == 0, f'{wrong} of {total} frames wrong, e.g. {examples}'
    assert loader._get(str(path)).index.n_frames == N_FRAMES - 5
    # the annotation builders count them as the loader does (60 before: the header's count)
    assert count_frames(path) == (N_FRAMES - 5, 'container')
    assert count_frames(path, exact=True) == (N_FRAMES - 5, 'decoded')


@pytest.mark.parametrize('name', list(CORPUS))
def test_frames_converted_at_reduced_scale_are_the_ones_asked_for(corpus, name):
    """Converted at 1/2 (a crop planned before decoding, tests/test_video_scaling.py)
    the loader still returns exactly the frames asked for: the codes are read back
    from the half-size frames enlarged again."""
    path, n = corpus[name], n_frames_of(name)
    loader = VideoClipLoader(threads=1)
    wrong, total = 0, 0
    for positions in queries(n)[:13]:  # strided, reversed and random 16-frame clips
        half = loader.read(path, positions).decode(2)
        assert half.shape[-2:] == (32, 32)
        got = clip_codes(half.repeat_interleave(2, -1).repeat_interleave(2, -2))
        wrong += sum(p != g for p, g in zip(positions, got))
        total += len(positions)
    assert wrong == 0, f'{name}: {wrong} of {total} frames wrong at 1/2'


@pytest.mark.parametrize('name', ['h264_mp4_default_gop', 'hevc_mkv'])
def test_non_reference_frames_before_a_clip_are_not_decoded(corpus, name, monkeypatch):
    """H.264/HEVC pictures no other picture refers to, before the clip, are skipped
    (skip_frame NONREF): fewer frames come out of the decoder, the clip is the same
    bytes as with every frame decoded, and the context decodes every frame after it."""
    import torch

    from datasets import video
    path, n = corpus[name], n_frames_of(name)
    positions = list(range(n - 16, n))
    clips, decoded = [], []
    for skips in (video._SKIPS_NONREF, ()):
        monkeypatch.setattr(video, '_SKIPS_NONREF', skips)
        loader = VideoClipLoader(threads=1, max_open=1)
        clips.append(loader(path, positions))
        decoded.append(loader.stats['decoded'])
        assert clip_codes(loader(path, list(range(16)))) == list(range(16))
        assert loader._get(str(path)).stream.codec_context.skip_frame == 'DEFAULT'
        loader.close()
    assert torch.equal(clips[0], clips[1])
    assert clip_codes(clips[0]) == positions
    assert decoded[0] < decoded[1], f'{name}: {decoded[0]} frames decoded, {decoded[1]} without skipping'
