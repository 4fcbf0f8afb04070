"""datasets/video.py: decoding .mp4/.avi/.mkv/.webm files written by the tests with PyAV."""
import fractions

import numpy as np
import pytest
import torch

from datasets.frame_conversion import scaled_size
from datasets.video import VideoClipLoader, read_video
from datasets.whole_videos import count_frames, iter_frames
from tests.video_files import frame_image, frame_level, red_levels, write_video
from utils.errors import DataError


@pytest.fixture(scope='module', params=['.mp4', '.avi', '.mkv', '.webm'])
def video40(request, tmp_path_factory):
    """40 frames, a keyframe every 5 (H.264 with B-frames in .mp4/.mkv)."""
    return write_video(tmp_path_factory.mktemp('v') / f'v{request.param}', n_frames=40, gop=5)


def test_every_frame_in_order(video40):
    clip = read_video(video40)
    assert clip.shape == (40, 3, 24, 32) and clip.dtype == torch.uint8
    assert red_levels(clip) == list(range(40))
    assert count_frames(video40)[0] == 40
    assert count_frames(video40, exact=True) == (40, 'decoded')


def test_seek_gives_the_frames_decoded_from_the_start(video40):
    full = read_video(video40)
    loader = VideoClipLoader()
    clip = loader(video40, list(range(22, 30)))
    assert torch.equal(clip, full[22:30])
    # the clip's keyframe is frame 20: frames 20..29 decoded, not 0..29
    assert loader.stats['decoded'] <= 12
    # repeats and any order; a second call reuses the open container
    clip = loader(video40, [31, 3, 3, 17])
    assert torch.equal(clip, full[[31, 3, 3, 17]])


def test_spread_clips_decode_the_video_at_most_once(video40):
    full = read_video(video40)
    loader = VideoClipLoader()
    positions = [0, 1, 2, 3, 18, 19, 20, 21, 36, 37, 38, 39]
    assert torch.equal(loader(video40, positions), full[positions])
    assert loader.stats['decoded'] < 40  # skipped the gaps by seeking forward


def test_clip_past_the_end_is_loop_padded(video40):
    full = read_video(video40)
    clip = VideoClipLoader()(video40, [37, 38, 39, 40, 41, 42])
    assert red_levels(clip) == [37, 38, 39, 37, 38, 39]
    assert torch.equal(clip[3:], full[37:40])
    # a clip wholly past the end takes the video's last frames
    assert red_levels(VideoClipLoader()(video40, [50, 51])) == [38, 39]


def test_short_video_and_resize(tmp_path):
    path = write_video(tmp_path / 'short.avi', n_frames=3, width=32, height=24)
    clip = read_video(path, list(range(8)), short_side=12)
    assert clip.shape == (8, 3, 12, 16)
    assert red_levels(clip) == [0, 1, 2, 0, 1, 2, 0, 1]


def test_rotated_video_comes_out_upright(tmp_path):
    img = frame_image(3, 32, 24)
    img[:4, :6] = (0, 255, 0)  # a green corner marks the orientation
    path = write_video(tmp_path / 'phone.mp4', images=[img] * 3, rotation=-90)
    upright = np.rot90(img, -1)  # display matrix -90: a quarter turn clockwise
    for clip in (read_video(path), read_video(path, [1])):
        assert clip.shape[2:] == (32, 24)
        diff = np.abs(clip[0].permute(1, 2, 0).numpy().astype(int) - upright)
        assert diff.mean() < 4
    assert read_video(path, short_side=12).shape[2:] == (16, 12)


def test_scaled_size():
    assert scaled_size(320, 240, 240) == (320, 240)
    assert scaled_size(176, 144, 240) == (293, 240)  # enlarges too
    assert scaled_size(240, 427, 112) == (112, 199)
    assert scaled_size(320, 240, None) == (320, 240)


def write_vfr(path, gaps):
    """H.264 with frame durations ``gaps`` (ms): a variable frame rate."""
    import av
    tb = fractions.Fraction(1, 1000)
    with av.open(str(path), 'w') as container:
        stream = container.add_stream('libx264', rate=25)
        stream.width, stream.height, stream.pix_fmt = 32, 24, 'yuv420p'
        stream.codec_context.time_base = tb
        t = 0
        for i, gap in enumerate(gaps):
            frame = av.VideoFrame.from_ndarray(frame_image(i, 32, 24), format='rgb24')
            frame.pts, frame.time_base = t, tb
            t += gap
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def test_variable_frame_rate(tmp_path):
    path = write_vfr(tmp_path / 'vfr.mp4', [40, 120, 40, 40, 120, 40])
    # every frame once, in order, whatever its duration
    assert red_levels(read_video(path)) == [0, 1, 2, 3, 4, 5]
    assert red_levels(read_video(path, [4, 5])) == [4, 5]
    # resampled to 25 fps: a 120 ms frame fills 3 slots of 40 ms; the last frame
    # lasts the mean duration (360 ms / 5 = 72 ms: 2 slots)
    levels = [frame_level(a) for a in iter_frames(path, fps=25)]
    assert levels == [0, 1, 1, 1, 2, 3, 4, 4, 4, 5, 5]
    # 12.5 fps: slots every 80 ms (0, 80, ..., 400 ms)
    levels = [frame_level(a) for a in iter_frames(path, fps=12.5)]
    assert levels == [0, 1, 2, 4, 4, 5]


def test_bad_files_raise_a_data_error(tmp_path):
    with pytest.raises(DataError, match='not found'):
        read_video(tmp_path / 'none.mp4')
    (tmp_path / 'text.mp4').write_text('not a video')
    with pytest.raises(DataError, match='text.mp4 cannot be opened'):
        VideoClipLoader()(tmp_path / 'text.mp4', [0])
    good = write_video(tmp_path / 'good.mp4', n_frames=20, width=64, height=48)
    data = good.read_bytes()
    (tmp_path / 'cut.mp4').write_bytes(data[:len(data) // 3])
    with pytest.raises(DataError, match='cut.mp4'):
        read_video(tmp_path / 'cut.mp4', [5])


@pytest.fixture(scope='module')
def synthetic_videos(tiny_synthetic, tmp_path_factory):
    """tiny_synthetic written as .avi files (and one class as .mp4)."""
    from tests.video_files import videos_from_jpgs
    jpg, annotation = tiny_synthetic
    root = tmp_path_factory.mktemp('videos')
    videos_from_jpgs(jpg, root, '.avi', other_ext={'grow': '.mp4'})
    return root, annotation, root / 'grow' / 'val_grow_000.mp4'


def test_annotation_and_dataset_on_video_files(synthetic_videos):
    from datasets.annotation import load_annotations
    from datasets.frame_check import check_videos
    from datasets.loader import make_loader
    from datasets.temporal_transforms import TemporalEvenCrop
    from datasets.videodataset import VideoClipDataset
    root, annotation, mp4 = synthetic_videos
    records, names = load_annotations(annotation, 'validation', root, 'ucf101',
                                      file_type='video')
    paths = {r.path for r in records}
    assert all(p.endswith('.avi') or p.endswith('.mp4') for p in paths)
    training, _ = load_annotations(annotation, 'training', root, 'ucf101', file_type='video')
    assert str(mp4) in {r.path for r in records} | {r.path for r in training}
    check_videos(records, 'video')
    dataset = VideoClipDataset(records, make_loader('video'), TemporalEvenCrop(8, 2))
    clips, label = dataset[0]
    assert clips.shape == (2, 3, 8, 32, 32) and label == records[0].label
    full = read_video(records[0].path)
    assert len(full) == records[0].n_frames == 12
    # clip 2 is the last 8 frames (starts 0 and 12 - 8 = 4)
    assert torch.equal(clips[1], full[4:12].permute(1, 0, 2, 3))
    assert torch.equal(clips[0], full[0:8].permute(1, 0, 2, 3))


def test_check_videos_names_missing_and_broken_files(synthetic_videos, tmp_path):
    from datasets.annotation import load_annotations
    from datasets.frame_check import check_videos
    root, annotation, _ = synthetic_videos
    records, _ = load_annotations(annotation, 'validation', tmp_path, 'ucf101',
                                  file_type='video')
    with pytest.raises(DataError, match=r'(?s)12 of 12 videos.*val_move_left_000.mp4 not found'):
        check_videos(records, 'video')
    broken = tmp_path / 'broken.mp4'
    broken.write_bytes(b'x')
    from datasets.annotation import VideoRecord
    with pytest.raises(DataError, match='broken.mp4 cannot be opened'):
        check_videos([VideoRecord('b', str(broken), 0, 8, 0, (0, 8))], 'video')


@pytest.mark.slow
def test_train_validate_infer_from_video_files(synthetic_videos, tmp_path):
    """--file_type video end to end on the synthetic set written as .avi/.mp4, with
    a loader worker process; the record table is cached in the result folder."""
    import json

    import main
    from tests.conftest import tiny_args
    root, annotation, _ = synthetic_videos
    result = tmp_path / 'r'
    main.main(tiny_args(root, annotation, result, '--file_type', 'video', '--n_epochs', '1',
                        '--inference', '--inference_subset', 'val'))
    results = json.loads((result / 'val.json').read_text())['results']
    assert len(results) == 12
    assert all(len(top) == 5 and 0 < top[0]['score'] <= 1 for top in results.values())
    val_log = (result / 'val.log').read_text().splitlines()
    assert len(val_log) == 2  # header + epoch 1
    cached = sorted(p.name.split('_')[1] for p in (result / 'data_index').glob('*.npz'))
    assert cached == ['training', 'validation']
    # every video's frame index, written by the loader workers (datasets/video_index.py)
    from datasets.video_index import FrameTable
    assert len(FrameTable(result / 'data_index' / 'frames')) >= 24


def test_decoder_giving_fewer_frames_than_the_index(video40, monkeypatch):
    """A damaged tail: the demuxer lists 40 frames but the decoder stops early; the
    clip fails naming the video and the frames, never filled with other frames
    (it was loop-padded before: frames [33, 34, 33, 34, 33, 34] for 33..38)."""
    import datasets.video as video
    real = video._wanted_frames

    def stops_at_35(*args, **kwargs):
        return ((p, frame) for p, frame in real(*args, **kwargs) if p < 35)

    monkeypatch.setattr(video, '_wanted_frames', stops_at_35)
    with pytest.raises(DataError, match=rf'{video40.name}: frames 35, 36, 37, 38 \(0-based\) of 40 '
                                        r'could not be decoded'):
        VideoClipLoader()(video40, list(range(33, 39)))
    assert red_levels(VideoClipLoader()(video40, [30, 34])) == [30, 34]


def test_a_decoded_clip_is_freed_when_dropped(video40):
    """No reference cycle between a clip and its open video: the clip, and the
    decoder frames it holds, go as soon as the caller drops it (with a cycle they
    waited for the collector and every clip allocated its frames afresh)."""
    import gc
    import weakref
    loader = VideoClipLoader()
    loader(video40, [0])  # first uses (imports, the decoder's set-up) out of the way
    gc.disable()
    try:
        clip = loader.read(video40, list(range(6, 10)))
        assert red_levels(clip.decode()) == [6, 7, 8, 9]
        gone = weakref.ref(clip)
        del clip
        assert gone() is None
        # a clip read after it still decodes; one read before a later read of the same
        # video may not (its demuxer moved on)
        first = loader.read(video40, [1, 2])
        second = loader.read(video40, [3])
        with pytest.raises(RuntimeError, match='decoded after another read'):
            first.decode()
        assert red_levels(second.decode()) == [3]
    finally:
        gc.enable()


def test_frames_changing_size_within_a_clip(video40, monkeypatch):
    import datasets.frame_conversion as conversion
    real, calls = conversion.to_array, []

    def second_frame_smaller(frame, *args, **kwargs):
        calls.append(1)
        array = real(frame, *args, **kwargs)
        return array[:-2] if len(calls) == 2 else array

    monkeypatch.setattr(conversion, 'to_array', second_frame_smaller)
    with pytest.raises(DataError, match=rf'{video40.name}: its frames change size within the '
                                        r'clip \(24x32 and 22x32\)'):
        VideoClipLoader()(video40, [4, 5, 6])


@pytest.mark.slow
def test_every_accepted_container_is_found_by_its_stem_and_trains(tiny_synthetic, tmp_path):
    """One list of extensions for the annotation builders and the loader: a tree of
    .avi, .mov, .mkv and .MP4 videos -> ucf101_json -> --file_type video finds each
    file by its stem and trains.  (Before, the builder found 30 of the 36 videos,
    not the .MP4 ones, and the loader looked for the .mov ones as .mp4: missing.)"""
    import json

    import main
    from datasets.annotation import load_annotations
    from tests.conftest import tiny_args
    from tests.video_files import videos_from_jpgs
    from util_scripts import ucf101_json
    jpg, annotation = tiny_synthetic
    root = tmp_path / 'videos'
    videos_from_jpgs(jpg, root, '.avi', other_ext={'grow': '.mov', 'shrink': '.mkv',
                                                     'move_up': '.MP4'})
    database = json.loads(annotation.read_text())
    labels = database['labels']
    splits = tmp_path / 'splits'
    splits.mkdir()
    (splits / 'classInd.txt').write_text(''.join(f'{i + 1} {n}\n' for i, n in enumerate(labels)))
    for subset, name in (('training', 'trainlist01.txt'), ('validation', 'testlist01.txt')):
        (splits / name).write_text(''.join(
            f"{v['annotations']['label']}/{vid}.avi\n" for vid, v in database['database'].items()
            if v['subset'] == subset))
    ucf101_json.main([str(splits), str(root), str(tmp_path / 'ann')])
    built = tmp_path / 'ann' / 'ucf101_01.json'
    entries = json.loads(built.read_text())['database']
    assert len(entries) == 36 and all('segment' in e['annotations'] for e in entries.values())
    records, _ = load_annotations(built, 'training', root, 'ucf101', file_type='video')
    suffixes = {r.path.rsplit('.', 1)[1] for r in records}
    assert suffixes == {'avi', 'mov', 'mkv', 'MP4'}
    result = tmp_path / 'r'
    main.main(tiny_args(root, built, result, '--file_type', 'video', '--n_epochs', '1'))
    assert len((result / 'val.log').read_text().splitlines()) == 2
