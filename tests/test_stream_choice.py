"""Every reader takes the video stream FFmpeg picks (datasets/video_stream.py),
not the file's first: in a file with two video streams, the one marked default
second; in one whose first video stream is a cover picture, the moving video.
The frame counts, the clips (training loader, shards, predict.py, live), the
preparation tools and stream_file all read that stream, and it is
``av_find_best_stream``'s choice (``container.streams.best('video')``)."""
import io
import json
import struct
from pathlib import Path

import h5py
import numpy as np
import pytest
from PIL import Image

from datasets.video import VideoClipLoader, read_video
from datasets.video_stream import is_attached_picture, video_stream
from datasets.whole_videos import check_video_frames, container_frames, count_frames
from tests.video_files import frame_image, frame_level, red_levels
from utils.errors import DataError

N_CHOSEN, N_OTHER = 16, 12  # frames of the stream read, of the other one
FPS_CHOSEN, FPS_OTHER = 10, 15
SMALL, LARGE = (64, 48), (96, 64)
OTHER_LEVEL = 40  # the other stream's frame i shows frame_image(40 + i): told apart by frame_level


def _av():
    import av
    return av


def _add_video(container, size, fps, default: bool):
    av = _av()
    stream = container.add_stream('libx264', rate=fps)
    stream.width, stream.height, stream.pix_fmt = *size, 'yuv420p'
    stream.codec_context.gop_size = 5
    stream.options = {'bf': '2', 'crf': '10', 'keyint_min': '5', 'sc_threshold': '0'}
    stream.disposition = av.stream.Disposition.default if default else av.stream.Disposition(0)
    return stream


def _mux_frames(container, streams_levels):
    """Each (stream, first level, n) gets frames frame_image(first + i), interleaved."""
    av = _av()
    for i in range(max(n for _, _, n in streams_levels)):
        for stream, first, n in streams_levels:
            if i < n:
                image = frame_image(first + i, stream.width, stream.height)
                for packet in stream.encode(av.VideoFrame.from_ndarray(image, format='rgb24')):
                    container.mux(packet)
    for stream, _, _ in streams_levels:
        for packet in stream.encode():
            container.mux(packet)


def write_two_streams(path, chosen_size, other_size):
    """The other stream first, the chosen one second and marked default (as a
    muxer or mkvmerge marks the stream to play)."""
    with _av().open(str(path), 'w') as container:
        other = _add_video(container, other_size, FPS_OTHER, default=False)
        chosen = _add_video(container, chosen_size, FPS_CHOSEN, default=True)
        _mux_frames(container, [(other, OTHER_LEVEL, N_OTHER), (chosen, 0, N_CHOSEN)])
    return path


def _jpeg(size=(32, 32), level=70) -> bytes:
    """One JPEG picture (a cover), written by FFmpeg's MJPEG encoder."""
    av, out = _av(), io.BytesIO()
    with av.open(out, 'w', format='image2pipe') as container:
        stream = container.add_stream('mjpeg', rate=1)
        stream.width, stream.height, stream.pix_fmt = *size, 'yuvj420p'
        frame = av.VideoFrame.from_ndarray(frame_image(level, *size), format='rgb24')
        for packet in stream.encode(frame.reformat(format='yuvj420p')):
            container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return out.getvalue()


def _add_cover(container):
    """A one-frame MJPEG stream marked attached_pic (FFmpeg's form of a cover)."""
    av = _av()
    cover = container.add_stream('mjpeg', rate=1)
    cover.width, cover.height, cover.pix_fmt = 32, 32, 'yuvj420p'
    cover.disposition = av.stream.Disposition.attached_pic
    return cover


def _mux_cover(container, cover):
    av = _av()
    frame = av.VideoFrame.from_ndarray(frame_image(70, 32, 32), format='rgb24')
    for packet in cover.encode(frame.reformat(format='yuvj420p')):
        container.mux(packet)
    for packet in cover.encode():
        container.mux(packet)


def _boxes(data, start, end):
    out = []
    while start < end:
        size, kind = struct.unpack('>I4s', data[start:start + 8])
        out.append((kind, start, start + size))
        start += size
    return out


def _udta_first(path):
    """The MP4's moov with its udta box (the cover, 'covr') moved before the tracks:
    FFmpeg's demuxer then lists the cover as the first video stream, as it does for
    files whose tagger wrote the metadata first.  moov keeps its size and place
    (after mdat), so no chunk offset changes."""
    data = bytearray(Path(path).read_bytes())
    _, start, end = next(b for b in _boxes(data, 0, len(data)) if b[0] == b'moov')
    children = _boxes(data, start + 8, end)
    order = [c for c in children if c[0] == b'mvhd'] + [c for c in children if c[0] == b'udta'] + \
        [c for c in children if c[0] not in (b'mvhd', b'udta')]
    data[start + 8:end] = b''.join(bytes(data[a:b]) for _, a, b in order)
    Path(path).write_bytes(data)


def write_cover_first(path, size=SMALL):
    """MP4: the cover as FFmpeg's muxer writes it ('covr', demuxed as an
    attached_pic stream), listed first.  Matroska lists attachments after its
    tracks, so a cover first there is what FFmpeg's muxer makes of an attached_pic
    stream: a one-frame MJPEG track before the video; an image attachment (an
    attached_pic stream, last) is added too."""
    path = Path(path)
    with _av().open(str(path), 'w') as container:
        cover = _add_cover(container)
        if path.suffix == '.mkv':
            container.add_attachment('cover.jpg', 'image/jpeg', _jpeg())
        video = _add_video(container, size, FPS_CHOSEN, default=True)
        _mux_cover(container, cover)
        _mux_frames(container, [(video, 0, N_CHOSEN)])
    if path.suffix == '.mp4':
        _udta_first(path)
    return path


def write_only_pictures(path):
    """Sound and a cover, no moving video (a song with its cover art)."""
    av = _av()
    path = Path(path)
    with av.open(str(path), 'w') as container:
        audio = container.add_stream('aac', rate=8000)
        cover = None if path.suffix == '.mkv' else _add_cover(container)
        if cover is None:
            container.add_attachment('cover.jpg', 'image/jpeg', _jpeg())
        else:
            _mux_cover(container, cover)
        samples = np.zeros((1, 8000), np.float32)
        frame = av.AudioFrame.from_ndarray(samples, format='fltp', layout='mono')
        frame.sample_rate = 8000
        for packet in [*audio.encode(frame), *audio.encode()]:
            container.mux(packet)
    return path


CASES = {  # name: (writer, chosen size)
    'mp4_small_then_large': (lambda p: write_two_streams(p, LARGE, SMALL), LARGE),
    'mp4_large_then_small': (lambda p: write_two_streams(p, SMALL, LARGE), SMALL),
    'mkv_small_then_large': (lambda p: write_two_streams(p, LARGE, SMALL), LARGE),
    'mkv_large_then_small': (lambda p: write_two_streams(p, SMALL, LARGE), SMALL),
    'mp4_cover_first': (write_cover_first, SMALL),
    'mkv_cover_first': (write_cover_first, SMALL),
}


@pytest.fixture(scope='module')
def videos(tmp_path_factory):
    """{case: (path, (width, height) of the stream to read)}, in a class folder each."""
    root = tmp_path_factory.mktemp('streams') / 'videos'
    out = {}
    for name, (write, size) in CASES.items():
        folder = root / name.split('_', 1)[1]
        folder.mkdir(parents=True, exist_ok=True)
        out[name] = (write(folder / f'{name}.{name[:3]}'), size)
    return out


@pytest.fixture(params=list(CASES))
def video(request, videos):
    return videos[request.param]


def test_the_files_hold_what_they_should(video):
    """Each file's first video stream is not the one to read (the test would prove
    nothing otherwise), and the chosen one is FFmpeg's pick."""
    path, size = video
    with _av().open(str(path)) as container:
        first, chosen = container.streams.video[0], video_stream(container)
        assert chosen is container.streams.best('video')  # av_find_best_stream, the reference
        assert chosen is not first and not is_attached_picture(chosen)
        assert (chosen.width, chosen.height) == size
        if 'cover' in path.name:
            assert first.codec_context.name == 'mjpeg'
            assert is_attached_picture(first) == path.name.endswith('.mp4')


def test_frame_counts(video):
    path, _ = video
    assert count_frames(path)[0] == N_CHOSEN
    assert count_frames(path, exact=True) == (N_CHOSEN, 'decoded')
    assert container_frames(path) == (N_CHOSEN if path.suffix == '.mp4' else None)
    assert check_video_frames(path, N_CHOSEN) is None


def test_clips_come_from_the_chosen_stream(video, tmp_path):
    from datasets.video_index import FrameTable
    path, (width, height) = video
    positions = [0, 3, 7, 8, 15]
    for table in (None, FrameTable(tmp_path), FrameTable(tmp_path)):  # scanned, then stored
        loader = VideoClipLoader(threads=1, frame_table=table)
        try:
            clip = loader(path, positions)
            assert loader._get(str(path)).index.n_frames == N_CHOSEN
        finally:
            loader.close()
            if table is not None:
                table.flush()
        assert tuple(clip.shape) == (5, 3, height, width)
        assert red_levels(clip) == positions
    whole = read_video(path)
    assert tuple(whole.shape) == (N_CHOSEN, 3, height, width)
    assert red_levels(whole) == list(range(N_CHOSEN))


def test_preparation_tools(videos, tmp_path):
    from util_scripts import folder_json, generate_video_hdf5, generate_video_jpgs
    root = next(iter(videos.values()))[0].parents[1]
    jpg, h5 = tmp_path / 'jpg', tmp_path / 'h5'
    generate_video_jpgs.main([str(root), str(jpg), 'kinetics', '--n_jobs', '1', '--size', '-1'])
    generate_video_hdf5.main([str(root), str(h5), 'kinetics', '--from_video', '--n_jobs', '1',
                              '--size', '-1'])
    annotation = tmp_path / 'own.json'
    folder_json.main([str(root), str(annotation), '--val_fraction', '0'])
    database = json.loads(annotation.read_text())['database']
    for name, (path, size) in videos.items():
        rel = Path(path.parent.name) / path.stem
        frames = sorted((jpg / rel).glob('image_*.jpg'))
        assert len(frames) == N_CHOSEN, name
        images = [Image.open(f) for f in frames]
        assert images[0].size == size and [frame_level(im) for im in images] == list(range(N_CHOSEN))
        with h5py.File(h5 / f'{rel}.hdf5', 'r') as f:
            assert len(f['video']) == N_CHOSEN
            assert frame_level(Image.open(io.BytesIO(f['video'][5].tobytes()))) == 5
        assert database[name]['annotations']['segment'] == [0, N_CHOSEN]


def test_shards(videos, tmp_path):
    from datasets.shards import ShardIndex
    from datasets.storage import ShardStore
    from util_scripts import folder_json, make_shards
    root = next(iter(videos.values()))[0].parents[1]
    annotation, out = tmp_path / 'own.json', tmp_path / 'shards'
    folder_json.main([str(root), str(annotation), '--val_fraction', '0'])
    make_shards.main([str(annotation), str(root), str(out), '--dataset', 'kinetics',
                      '--file_type', 'video', '--no_progress'])
    index, store = ShardIndex.load(out), ShardStore(out)
    loader = VideoClipLoader(threads=1, store=store)
    try:
        for name, (path, (width, height)) in videos.items():
            rel = f'{path.parent.name}/{path.stem}'
            assert index.entry(rel).n_frames == N_CHOSEN, name
            clip = loader(rel, [1, 14])
            assert tuple(clip.shape) == (2, 3, height, width) and red_levels(clip) == [1, 14]
    finally:
        loader.close()


def test_predict_reads_the_chosen_stream(video):
    import argparse

    import classify
    from opts import build_parser
    path, (width, height) = video
    videos = classify.find_inputs(path)
    failures = {}
    records = classify.measure_videos(videos, failures)
    assert not failures and records[0].n_frames == N_CHOSEN
    assert classify.frame_rate(videos[0], 99) == FPS_CHOSEN
    options = argparse.Namespace(**{**vars(build_parser().parse_args([])), 'sample_size': 32,
                                    'sample_duration': 8, 'file_type': 'video'})
    dataset = classify.build_dataset(records, videos, options, 0, 8, 'center')
    assert len(dataset) == 2  # windows of 8 frames side by side in 16 frames
    clip = dataset.loader.read(str(path), [8, 15]).decode()  # what the windows are cut from
    assert tuple(clip.shape) == (2, 3, height, width) and red_levels(clip) == [8, 15]
    assert dataset[1] is not None


def test_live_source_and_stream_file(video):
    from bench.video_clips import plain_pyav
    from datasets.live import LiveFrames
    from util_scripts.stream_file import probe
    path, (width, height) = video
    live = LiveFrames(str(path), spatial=None, span=8, stride=8)
    try:
        assert live.frame_size == (height, width) and live.frame_rate == FPS_CHOSEN
        frames = [frame for frame, _ in live._frames()]
    finally:
        live.container.close()
    assert [(f.width, f.height) for f in frames] == [(width, height)] * N_CHOSEN
    assert [frame_level(f.to_ndarray(format='rgb24')) for f in frames] == list(range(N_CHOSEN))
    source = probe(path)
    assert (source.width, source.height, source.fps) == (width, height, FPS_CHOSEN)
    assert [frame_level(a) for a in plain_pyav(path, [2, 5])] == [2, 3, 4, 5]


@pytest.mark.parametrize('ext', ['mp4', 'mkv'])
def test_only_a_cover_is_no_video(tmp_path, ext):
    path = write_only_pictures(tmp_path / f'song.{ext}')
    with _av().open(str(path)) as container:
        assert container.streams.video and video_stream(container) is None
    for read in (count_frames, lambda p: VideoClipLoader(threads=1)(p, [0]), read_video):
        with pytest.raises(DataError, match=rf'{path} holds no moving video, only a still '
                                            r'picture \(a cover\)'):
            read(path)


def test_ffmpegs_pick_is_never_a_cover():
    """Where av_find_best_stream ranks a cover first (marked default, the video not),
    the moving stream that ranks first by its other rules is taken: the default one,
    then the higher bit rate, then the first."""
    from types import SimpleNamespace

    from datasets.video_stream import ATTACHED_PIC

    def stream(disposition, bit_rate):
        return SimpleNamespace(disposition=disposition,
                               codec_context=SimpleNamespace(bit_rate=bit_rate))

    def container(*streams, best=0):
        return SimpleNamespace(streams=SimpleNamespace(video=streams, best=lambda kind: streams[best]))

    cover = stream(ATTACHED_PIC | 1, 0)
    low, high, default = stream(0, 1000), stream(0, 5000), stream(1, 10)
    assert video_stream(container(cover, low, high)) is high
    assert video_stream(container(cover, low, default, high)) is default
    assert video_stream(container(cover, low, stream(0, 1000))) is low
    assert video_stream(container(low, high, best=0)) is low  # FFmpeg's own pick stands
    assert video_stream(container(cover)) is None
