"""predict.py --stream: live sources classified window by window with the
preprocessing and scores of predict.py's sliding windows over the same
frames; skipped windows and bounded latency when the model is slower than the
stream; a source that cannot be opened, a password in the URL."""
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import classify
import datasets.live as live_source
import live
import main
import predict
from datasets.live import LiveFrames, source_name
from datasets.temporal_transforms import clip_span
from opts import option_defaults
from tests.conftest import tiny_args
from tests.servers import free_port, wait_bound
from tests.video_files import write_video

ROOT = Path(__file__).resolve().parents[1]
FPS = 25
STRIDE = 3
pytestmark = pytest.mark.usefixtures('one_torch_thread')  # the in-process models, under load too


@pytest.fixture(scope='module')
def checkpoint(tiny_synthetic, tmp_path_factory):
    """The tiny model (8x32x32 clips) after one epoch."""
    out = tmp_path_factory.mktemp('live_ckpt')
    main.main(tiny_args(*tiny_synthetic, out, '--n_epochs', '1', '--no_val'))
    return out / 'save_1.pth'


@pytest.fixture(scope='module')
def clip_file(tmp_path_factory):
    """An H.264 file (B-frames, a keyframe every 5) at 128x96: the eval crop to 32
    converts its frames at 1/2, as the file loader does."""
    return write_video(tmp_path_factory.mktemp('live_video') / 'clip.mp4', n_frames=40,
                       width=128, height=96, fps=FPS)


def load(checkpoint):
    """(model, options, class names, device) as predict.py loads a checkpoint, on the CPU."""
    return classify.load_model(checkpoint, option_defaults(), None, torch.device('cpu'), 'raw')


def predict_windows(checkpoint, video, stride):
    """{first frame: softmax} of predict.py's sliding windows over the file."""
    args = predict.parse_args([str(checkpoint), str(video), '--stride', str(stride),
                               '--batch_size', '1', '--n_threads', '0', '--no_progress'])
    model, options, class_names, device = load(checkpoint)
    videos, failures = classify.find_inputs(video), {}
    records = classify.measure_videos(videos, failures)
    dataset = classify.build_dataset(records, videos, options, 1, stride, 'center')
    scores = classify.score_videos(dataset, model, device, args, failures, keep_views=True)
    return {segment[0]: probs for segment, _, probs in scores.views[0]}, class_names, records[0].n_frames


def stream_lines(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def check_equal_to_predict(lines, checkpoint, video, stride=STRIDE, every_window=False):
    """Each window's scores equal predict.py's window that starts at the same frame;
    the windows not classified were counted as skipped, never the stream's last."""
    expected, class_names, n_frames = predict_windows(checkpoint, video, stride)
    span = clip_span(8)
    assert lines, 'no window classified'
    for line in lines:
        probs = expected[line['first_frame']]
        got = {e['label']: e['score'] for e in line['results']}
        assert list(got) == [class_names[i] for i in probs.argsort(descending=True, stable=True)]
        np.testing.assert_allclose([got[name] for name in class_names], probs.numpy(), rtol=0,
                                   atol=1e-6)
    every = list(range(0, n_frames - span + 1, stride))  # the windows that fit in the file
    firsts = [line['first_frame'] for line in lines]
    # how many a real-time run skips depends on the machine's load (a hiccup of 2
    # strides skips 2 windows), so only a consumer that cannot fall behind
    # (lockstep) is held to all of them
    assert firsts == sorted(set(firsts)) and firsts[-1] == every[-1]
    assert len(firsts) + lines[-1]['skipped'] == len(every)
    if every_window:
        assert firsts == every and lines[-1]['skipped'] == 0


@pytest.fixture
def lockstep(monkeypatch):
    """The reader hands over a window only once the consumer took the one before:
    a consumer that always keeps up, whatever else runs on the machine."""
    put = live_source._Mailbox.put

    def put_once_taken(mailbox, window):
        deadline = time.monotonic() + 60
        while mailbox.window is not None:
            assert time.monotonic() < deadline, 'the consumer took no window for 60 s'
            time.sleep(0.001)
        put(mailbox, window)
    monkeypatch.setattr(live_source._Mailbox, 'put', put_once_taken)


def run_file_live(checkpoint, clip_file, out, capsys):
    started = time.monotonic()
    status = predict.main([str(checkpoint), '--stream', str(clip_file), '--stride', str(STRIDE),
                           '--topk', '0', '--output_json', str(out), '--no_progress'])
    took = time.monotonic() - started
    assert status == 0
    assert took > 39 / FPS - 0.1  # paced at the file's frame rate
    return stream_lines(out), capsys.readouterr()


def test_a_file_played_live_gives_predicts_windows(checkpoint, clip_file, tmp_path, capsys):
    lines, captured = run_file_live(checkpoint, clip_file, tmp_path / 'lines.jsonl', capsys)
    check_equal_to_predict(lines, checkpoint, clip_file)
    printed = captured.out.splitlines()
    assert len(printed) == len(lines) and all(re.search(r'latency [0-9.]+ s  skipped \d+$', p) for p in printed)
    assert re.search(r': 128x96 at 25 fps; (keeps up|cannot keep up): [0-9.]+ s per window, a window '
                     r'every 0\.120 s', captured.err), captured.err
    assert f'summary: the stream ended; 40 frames, {len(lines)} windows classified, ' \
        f'{lines[-1]["skipped"]} skipped' in captured.err
    assert 'latency: median' in captured.err and 'top classes:' in captured.err
    # paced at 25 fps: the last window's frame is at 39 / 25 s of stream time
    assert lines[-1]['time'] == pytest.approx((lines[-1]['first_frame'] + 7) / FPS, abs=1e-3)


def test_a_consumer_that_keeps_up_classifies_every_window(checkpoint, clip_file, tmp_path, capsys,
                                                          lockstep):
    lines, captured = run_file_live(checkpoint, clip_file, tmp_path / 'lines.jsonl', capsys)
    check_equal_to_predict(lines, checkpoint, clip_file, every_window=True)
    assert 'summary: the stream ended; 40 frames, 11 windows classified, 0 skipped' in captured.err


class SlowModel(torch.nn.Module):
    def __init__(self, model, seconds):
        super().__init__()
        self.model, self.seconds = model, seconds

    def forward(self, x):
        time.sleep(self.seconds)
        return self.model(x)


@pytest.mark.slow  # real-time streams, producer processes
def test_a_model_slower_than_the_stream_skips_windows_with_bounded_latency(checkpoint, tmp_path):
    """Windows every 2 frames (80 ms) and a model taking 250 ms a window: most
    windows are skipped, each one served is the newest (latency under a stride
    plus a window's time, the last one's under two windows' time), and the lag
    does not grow over the stream."""
    from tests.video_files import frame_image
    video = write_video(tmp_path / 'long.mp4', width=64, height=48, fps=FPS,
                        images=[frame_image(i % 80, 64, 48) for i in range(100)])
    model, options, class_names, device = load(checkpoint)
    slow = SlowModel(model, 0.25)
    settings = live.LiveSettings(stride=2, topk=1)
    out = tmp_path / 'lines.jsonl'
    err = _Lines()
    status = live.run_stream(str(video), slow, options, class_names, device, settings, out,
                             out=_Lines(), err=err)
    assert status == 0
    lines = stream_lines(out)
    assert re.search(r'cannot keep up: 0\.[2-9]\d* s per window, a window every 0\.080 s \(windows will '
                     r'be skipped\): use --stride \d+ or more', err.text), err.text
    latencies = np.array([line['latency'] for line in lines])
    per_window, stride_s = 0.25, 2 / FPS
    assert lines[-1]['skipped'] > 0.5 * len(lines)
    # a window waits at most until the next one replaces it, or (the last one)
    # until the model is free; the margins allow a loaded machine's hiccups, while
    # a queue (every window served in turn) would lag by 47 x (0.25 - 0.08) = 8 s at
    # the end. Loaded full suites here: 1.21 s, and 1.43 s at the 95th percentile
    margin = 3.0
    assert np.percentile(latencies[:-1], 95) < stride_s + per_window + margin
    assert latencies.max() < 2 * per_window + margin
    half = len(latencies) // 2
    assert latencies[half:-1].max() < stride_s + per_window + margin  # not growing
    assert f'{lines[-1]["skipped"]} skipped' in err.text
    assert (47 - 1) // 2 < lines[-1]['skipped'] + len(lines) <= (100 - 8) // 2 + 1


class _Lines:
    """A text stream for the loop's output."""

    def __init__(self):
        self.parts = []

    def write(self, text):
        self.parts.append(text)

    def flush(self):
        pass

    @property
    def text(self):
        return ''.join(self.parts)


@pytest.mark.slow  # real-time streams, producer processes
def test_smoothing_averages_the_last_windows(checkpoint, clip_file, tmp_path):
    """Each line averages the scores of the last 3 windows classified (predict.py's
    scores of those windows): compared by first frame, since a loaded machine may
    skip a different window in each run."""
    model, options, class_names, device = load(checkpoint)
    out = tmp_path / 'smooth3.jsonl'
    live.run_stream(str(clip_file), model, options, class_names, device,
                    live.LiveSettings(stride=STRIDE, smooth=3, topk=0), out, out=_Lines(), err=_Lines())
    lines = stream_lines(out)
    expected, _, _ = predict_windows(checkpoint, clip_file, STRIDE)
    firsts = [line['first_frame'] for line in lines]
    assert len(lines) >= 3
    away_from_raw = 0.0
    for i, line in enumerate(lines):
        got = np.array([{e['label']: e['score'] for e in line['results']}[name] for name in class_names])
        averaged = torch.stack([expected[f] for f in firsts[max(0, i - 2):i + 1]]).mean(0).numpy()
        np.testing.assert_allclose(got, averaged, rtol=0, atol=1e-6)
        away_from_raw = max(away_from_raw, np.abs(got - expected[firsts[i]].numpy()).max())
    assert away_from_raw > 1e-5  # the windows' scores differ, so the average is not the raw scores


def test_a_source_that_cannot_be_opened_is_one_line_without_its_password(checkpoint, tmp_path,
                                                                          capsys):
    for source, says in [(str(tmp_path / 'missing.mp4'), 'cannot be opened'),
                         ('rtsp://admin:s3cret@127.0.0.1:9/stream', 'cannot be opened'),
                         (str(_text_file(tmp_path)), 'cannot be opened'),
                         (str(_audio_file(tmp_path)), 'has no video stream')]:
        assert predict.main([str(checkpoint), '--stream', source, '--reconnect', '0']) == 2
        captured = capsys.readouterr()
        assert captured.err.count('\n') == 1 and captured.err.startswith('error: stream ') and \
            says in captured.err, captured.err
        assert 's3cret' not in captured.err + captured.out
        assert source_name(source) in captured.err
        assert ('admin:***@' in captured.err) == source.startswith('rtsp')
    assert source_name('rtsp://admin:s3cret@cam/x') == 'rtsp://admin:***@cam/x'


def test_a_live_source_that_sends_nothing_is_an_error_not_a_ctrl_c(checkpoint, capsys):
    """A UDP port nobody sends to: the open's timeout, which PyAV reports as an
    interrupt, was taken for Ctrl-C (exit status 0, 'stopped (Ctrl-C)')."""
    url = f'udp://127.0.0.1:{free_port(socket.SOCK_DGRAM)}'
    assert predict.main([str(checkpoint), '--stream', url, '--reconnect', '0', '--stream_timeout', '0.5']) == 2
    err = capsys.readouterr().err
    assert err == f'error: stream {url} cannot be opened: no data for 0.5 s (--stream_timeout)\n', err


def test_ctrl_c_while_a_live_source_opens_is_still_ctrl_c():
    """A Ctrl-C in the wait of the open above (in a process of its own: pytest's
    would stop the session) is raised as KeyboardInterrupt once the wait ends."""
    script = ('import os, signal, sys, threading\n'
              'from datasets.live import open_source\n'
              'threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()\n'
              'try:\n'
              f'    open_source("udp://127.0.0.1:{free_port(socket.SOCK_DGRAM)}", 1.5)\n'
              'except BaseException as e:\n'
              '    print(type(e).__name__)\n')
    # 1.5 s of waiting after the imports (torch, torchvision: 5-8 s at load 3-7 here, more
    # on a busier machine); the limit only tells a hang from a slow start
    proc = subprocess.run([sys.executable, '-c', script], cwd=ROOT, capture_output=True, text=True,
                          timeout=240)
    assert proc.stdout == 'KeyboardInterrupt\n', proc.stdout + proc.stderr


def _audio_file(tmp_path):
    import av
    path = tmp_path / 'sound.wav'
    with av.open(str(path), 'w') as container:
        stream = container.add_stream('pcm_s16le', rate=8000, layout='mono')
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 800), np.int16), format='s16', layout='mono')
        frame.sample_rate = 8000
        for packet in [*stream.encode(frame), *stream.encode()]:
            container.mux(packet)
    return path


def _text_file(tmp_path):
    path = tmp_path / 'notes.mp4'
    path.write_text('not a video\n')
    return path


@pytest.mark.parametrize('argv, says', [
    (['ckpt.pth'], 'give a video'),
    (['ckpt.pth', 'v.mp4', '--stream', 'udp://x:1'], 'give a video'),
    (['ckpt.pth', '--stream', 'udp://x:1', '--json'], '--json is for videos'),
    (['ckpt.pth', '--stream', 'udp://x:1', '--smooth', '0'], '--smooth'),
    (['ckpt.pth', 'v.mp4', '--output_json', 'a.jsonl'], 'goes with --stream'),
    (['ckpt.pth', '--stream', '-', '--half'], '--device cuda')])
def test_stream_options_are_checked(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        predict.parse_args(argv)
    assert e.value.code == 2 and says in capsys.readouterr().err


def eval_spatial():
    """The eval crop of 8x32x32 clips."""
    from argparse import Namespace

    from dataset import eval_views
    opts = Namespace(sample_size=32, sample_duration=8, sample_t_stride=1, value_scale=1,
                     mean_dataset='0.5', no_mean_norm=False, no_std_norm=False, input_type='rgb')
    return eval_views(opts, 0, 1, 'center')[1]


def test_the_reader_hands_over_the_newest_window_only(clip_file):
    """A consumer that takes no window until the stream ended finds the last one;
    every other window was counted as skipped."""
    frames = LiveFrames(str(clip_file), eval_spatial(), span=8, stride=4, notes=lambda text: None).start()
    frames._thread.join(timeout=30)
    window = frames.next_window()
    assert window.first_frame == 32 and len(window.frames) == 8 and window.factor == 2
    assert window.frames[0].shape == (48, 64, 3)
    assert frames.skipped == 8 and frames.next_window() is None and frames.ending == 'end'


def test_stop_returns_once_the_reader_has_ended(clip_file):
    """The file plays at its frame rate, so the reader is mid-stream when stopped.
    Before, stop() only asked it to end: a Ctrl-C'd predict.py exited with the
    reader still in FFmpeg, and now and then aborted ('terminate called without
    an active exception') or hung at exit."""
    frames = LiveFrames(str(clip_file), eval_spatial(), span=8, stride=4, notes=lambda text: None).start()
    assert frames.next_window() is not None
    frames.stop()
    assert not frames._thread.is_alive()  # its ending ('stopped', or 'end' on a machine stalled for 1.3 s)


def test_a_second_ctrl_c_while_the_reader_ends_still_gives_the_summary(checkpoint, clip_file, monkeypatch):
    model, options, class_names, device = load(checkpoint)
    frames = LiveFrames(str(clip_file), eval_spatial(), span=8, stride=4, notes=lambda text: None)

    def ctrl_c(*args):
        raise KeyboardInterrupt
    monkeypatch.setattr(frames, 'next_window', ctrl_c)  # the first, while it waits for a window
    monkeypatch.setattr(frames._thread, 'join', ctrl_c)  # the second, while stop() waits for the reader
    err = _Lines()
    status = live.run_stream(str(clip_file), model, options, class_names, device, live.LiveSettings(stride=4),
                             out=_Lines(), err=err, frames=frames)
    assert status == 0 and 'stopped (Ctrl-C)\nstopped again (Ctrl-C)' in err.text and 'summary: ' in err.text


def write_ts(path, images, first=0, zero_pts=False, container='mpegts'):
    """H.264 frames (no B-frames, a keyframe every 5) in MPEG-TS (or another
    ``container``), their timestamps counting frames from ``first`` at 25 fps
    (``zero_pts``: every packet stamped 0, as some encoders send them)."""
    import av
    height, width = images[0].shape[:2]
    with av.open(str(path), 'w', format=container) as out:
        stream = out.add_stream('libx264', rate=FPS)
        stream.width, stream.height, stream.pix_fmt = width, height, 'yuv420p'
        stream.codec_context.gop_size = 5
        stream.options = {'bf': '0', 'crf': '10'}
        for i, image in enumerate([*images, None]):
            frame = None
            if image is not None:
                frame = av.VideoFrame.from_ndarray(image, format='rgb24')
                frame.pts = first + i
            for packet in stream.encode(frame):
                if zero_pts:
                    packet.pts = packet.dts = 0
                out.mux(packet)
    return path


@pytest.fixture(scope='module')
def resized_stream(tmp_path_factory):
    """An MPEG-TS stream whose frames 20-39 are 160x120 instead of 128x96 (two
    streams' bytes one after the other, the second's timestamps going on), as
    when HLS switches bitrate: (path, frame where the size changes)."""
    from tests.video_files import frame_image
    folder = tmp_path_factory.mktemp('resized')
    halves = [write_ts(folder / 'small.ts', [frame_image(i, 128, 96) for i in range(20)]),
              write_ts(folder / 'large.ts', [frame_image(i, 160, 120) for i in range(20, 40)], first=20)]
    path = folder / 'resized.ts'
    path.write_bytes(b''.join(half.read_bytes() for half in halves))
    return path, 20


def test_a_window_never_mixes_two_frame_sizes(resized_stream, lockstep):
    """The ring starts again where the size changes: each window's frames share
    one size (and the crop plan made for it), and are the span of frames that
    follow its first. Before, the windows over the change held frames of both."""
    from tests.video_files import frame_level
    path, change = resized_stream
    noted = []
    frames = LiveFrames(str(path), eval_spatial(), span=8, stride=3, notes=noted.append).start()
    windows = []
    while (window := frames.next_window()) is not None:
        windows.append(window)
    assert frames.ending == 'end' and frames.frames_read == 40
    firsts = [w.first_frame for w in windows]
    assert firsts == [0, 3, 6, 9, 12, 20, 23, 26, 29, 32]  # none spans frame 20
    for window in windows:
        assert len({f.shape for f in window.frames}) == 1
        assert [frame_level(f) for f in window.frames] == list(range(window.first_frame, window.first_frame + 8))
        size = (96, 128) if window.first_frame < change else (120, 160)
        assert window.frames[0].shape[:2] == tuple(-(-n // window.factor) for n in size)
    assert [n for n in noted if 'size' in n] == [f'stream {path}: the frame size changed from 128x96 to '
                                                 f'160x120 at 0.800 s: windows start again at the new size']


def test_a_stream_that_changes_resolution_is_classified_to_its_end(checkpoint, resized_stream, tmp_path,
                                                                    capsys, lockstep):
    """Before, the first window over the change ended predict.py in a traceback
    (ValueError: all input arrays must have the same shape), without a summary."""
    path, _ = resized_stream
    out = tmp_path / 'resized.jsonl'
    assert predict.main([str(a) for a in live_args(checkpoint, path, out)]) == 0
    err = capsys.readouterr().err
    assert err.count('frame size changed') == 1
    assert 'summary: the stream ended; 40 frames, 10 windows classified, 0 skipped' in err, err
    assert [line['first_frame'] for line in stream_lines(out)][-5:] == [20, 23, 26, 29, 32]


def test_a_stream_whose_timestamps_do_not_advance_counts_frames(checkpoint, tmp_path, capsys, lockstep):
    """Every packet stamped 0: the stream time of a window is its frames counted at
    the stream's rate, said once. Before, every window line said 0.000 s (and the
    file was not paced)."""
    from tests.video_files import frame_image
    path = write_ts(tmp_path / 'zero.mkv', [frame_image(i, 128, 96) for i in range(40)], zero_pts=True,
                    container='matroska')
    out = tmp_path / 'zero.jsonl'
    assert predict.main([str(a) for a in live_args(checkpoint, path, out)]) == 0
    err = capsys.readouterr().err
    lines = stream_lines(out)
    assert [line['time'] for line in lines] == pytest.approx([(line['first_frame'] + 7) / FPS for line in lines])
    assert err.count('timestamps do not advance') == 1
    assert f'stream {path}: its timestamps do not advance: the stream time counts frames at 25 fps' in err, err


# ----------------------------------------------------------------------------- network sources

@pytest.fixture
def producer():
    """Starts util_scripts.stream_file processes; those still running when the
    test ends (it failed: a TCP one waits for a client forever) are killed."""
    started = []

    def start(video, url, *extra, stdout=subprocess.DEVNULL):
        started.append(subprocess.Popen([sys.executable, '-m', 'util_scripts.stream_file', str(video), url,
                                         *extra], cwd=ROOT, stdout=stdout, stderr=subprocess.PIPE, text=True))
        return started[-1]
    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


class Consumer(threading.Thread):
    """predict.main(argv) in a thread; ``status`` once joined."""

    def __init__(self, argv):
        super().__init__(daemon=True)
        self.argv, self.status = [str(a) for a in argv], None

    def run(self):
        self.status = predict.main(self.argv)

    def result(self, timeout=60):
        self.join(timeout)
        assert not self.is_alive(), 'the consumer did not end'
        return self.status


def live_args(checkpoint, source, out, *extra):
    return [checkpoint, '--stream', source, '--stride', STRIDE, '--topk', '0', '--output_json',
            out, '--no_progress', *extra]


@pytest.mark.slow  # real-time streams, producer processes
def test_a_udp_stream_gives_predicts_windows(checkpoint, clip_file, tmp_path, capsys, producer):
    port = free_port(socket.SOCK_DGRAM)
    out = tmp_path / 'udp.jsonl'
    # the timeout also bounds the wait for the producer's first datagram: a loaded
    # machine took more than 2 s to start it
    consumer = Consumer(live_args(checkpoint, f'udp://127.0.0.1:{port}', out, '--reconnect', '0',
                                  '--stream_timeout', '5'))
    consumer.start()
    wait_bound(port, 'udp')  # listening before the first datagram is sent
    sender = producer(clip_file, f'udp://127.0.0.1:{port}')
    assert consumer.result() == 1  # UDP has no end: the stream stopped coming
    assert sender.wait(timeout=30) == 0, sender.stderr.read()
    err = capsys.readouterr().err
    check_equal_to_predict(stream_lines(out), checkpoint, clip_file)
    assert 'summary: the source dropped (--reconnect 0); 40 frames' in err and 'latency: median' in err


@pytest.mark.slow  # real-time streams, producer processes
def test_a_tcp_stream_gives_predicts_windows(checkpoint, clip_file, tmp_path, capsys, producer):
    port = free_port()
    sender = producer(clip_file, f'tcp://127.0.0.1:{port}')
    wait_bound(port, 'tcp')
    out = tmp_path / 'tcp.jsonl'
    status = predict.main([str(a) for a in live_args(checkpoint, f'tcp://127.0.0.1:{port}', out,
                                                     '--reconnect', '0')])
    assert status == 1 and sender.wait(timeout=30) == 0
    check_equal_to_predict(stream_lines(out), checkpoint, clip_file)
    assert '40 frames' in capsys.readouterr().err


@pytest.mark.slow  # real-time streams, producer processes
def test_an_http_file_plays_live_to_its_end(checkpoint, clip_file, tmp_path, capsys):
    """An .mp4 over http (its index at the end: read with a range request) is
    paced to its frame rate and ends with the file (no reconnect)."""
    from tests.servers import http_server
    out = tmp_path / 'http.jsonl'
    with http_server(clip_file.parent) as url:
        started = time.monotonic()
        status = predict.main([str(a) for a in live_args(checkpoint, f'{url}/{clip_file.name}', out)])
        took = time.monotonic() - started
    assert status == 0
    check_equal_to_predict(stream_lines(out), checkpoint, clip_file)
    assert 'summary: the stream ended; 40 frames' in capsys.readouterr().err
    assert took > 39 / FPS - 0.1  # played at its frame rate


@pytest.mark.slow  # real-time streams
def test_an_http_file_that_drops_goes_on_where_it_dropped(tmp_path, lockstep):
    """The server cuts the connection halfway through the body: the file is
    reopened and goes on after the last frame read, each frame read once. Before,
    it played again from its start (59 frames of a 40-frame file) while the
    stream time went on counting."""
    from functools import partial

    from tests.servers import RangeHandler, _serve
    from tests.video_files import frame_image, frame_level
    path = write_ts(tmp_path / 'clip.ts', [frame_image(i, 128, 96) for i in range(40)])
    served = []

    class CutOnce(RangeHandler):
        def copyfile(self, source, outputfile):
            served.append(self.headers.get('Range'))
            if len(served) > 1:
                return super().copyfile(source, outputfile)
            outputfile.write(source.read(path.stat().st_size // 2))
            outputfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True

    noted = []
    with _serve(partial(CutOnce, directory=str(tmp_path))) as url:
        frames = LiveFrames(f'{url}/{path.name}', eval_spatial(), span=8, stride=4, notes=noted.append).start()
        windows = []
        while (window := frames.next_window()) is not None:
            windows.append(window)
    assert len(served) >= 2 and frames.ending == 'end' and frames.frames_read == 40, noted
    assert any(n.endswith('; the file goes on where it dropped') for n in noted), noted
    for window in windows:  # the session's frame n is the file's frame n
        assert [frame_level(f) for f in window.frames] == list(range(window.first_frame, window.first_frame + 8))
    assert len(frames.gaps) == 1


@pytest.mark.slow  # real-time streams, producer processes
def test_a_pipe_on_standard_input(checkpoint, clip_file, tmp_path, producer):
    out = tmp_path / 'pipe.jsonl'
    sender = producer(clip_file, '-', stdout=subprocess.PIPE)
    proc = subprocess.run([sys.executable, 'predict.py', *map(str, live_args(checkpoint, '-', out))],
                          cwd=ROOT, stdin=sender.stdout, capture_output=True, text=True, timeout=120)
    sender.stdout.close()
    assert proc.returncode == 0, proc.stderr
    assert sender.wait(timeout=30) == 0
    assert 'stream standard input: 128x96 at 25 fps; ' in proc.stderr  # then keeps up or not
    # the pipe held the whole stream while predict.py started: one burst
    check_equal_to_predict(stream_lines(out), checkpoint, clip_file)


@pytest.mark.slow  # real-time streams, producer processes
def test_a_killed_producer_is_reconnected_then_the_summary(checkpoint, clip_file, tmp_path, capsys, producer,
                                                          monkeypatch):
    """The first producer (looping) is killed after a few windows; a second one
    on the same port is found by the reconnect; when it ends and nothing comes
    back, the summary and exit status 1 (the source was lost). The reconnect
    waits until the second producer listens: a loaded machine can take longer to
    start it than the 1.5 s that --reconnect 2 waits.
    """
    listening = threading.Event()
    listening.set()
    opened = live_source.open_source

    def open_when_listening(*args, **kwargs):
        assert listening.wait(timeout=60), 'the second producer did not listen within 60 s'
        return opened(*args, **kwargs)
    monkeypatch.setattr(live_source, 'open_source', open_when_listening)
    port = free_port()
    url = f'tcp://127.0.0.1:{port}'
    first = producer(clip_file, url, '--loop')
    wait_bound(port, 'tcp')
    out = tmp_path / 'killed.jsonl'
    consumer = Consumer(live_args(checkpoint, url, out, '--reconnect', '2'))
    consumer.start()
    deadline = time.time() + 60
    while not (out.exists() and len(out.read_text().splitlines()) >= 3):
        assert time.time() < deadline and consumer.is_alive()
        time.sleep(0.02)
    listening.clear()
    first.kill()
    first.wait()
    before_kill = max(line['first_frame'] for line in stream_lines(out))
    second = producer(clip_file, url)
    wait_bound(port, 'tcp')
    listening.set()
    assert consumer.result(timeout=90) == 1
    assert second.wait(timeout=30) == 0
    err = capsys.readouterr().err
    assert f'stream {url} dropped: reconnecting in 0.5 s (attempt 1 of 2)' in err
    assert 'reconnected after a gap of' in err and 'reconnected 1 time(s), gaps:' in err
    assert 'summary: the source was lost (2 reconnects failed)' in err
    lines = stream_lines(out)
    times = [line['time'] for line in lines]
    assert times == sorted(times)
    # Windows from both producers, whatever the load: 3 or more before the kill, and the
    # last window (always served, however many a slow machine skips) starts within the
    # second producer's 40 frames, which all come after every frame seen before the kill.
    assert lines[-1]['first_frame'] >= before_kill + 40 - clip_span(8) - STRIDE


@pytest.mark.slow  # real-time streams, producer processes
def test_ctrl_c_gives_the_summary(checkpoint, clip_file, tmp_path, producer):
    port = free_port()
    url = f'tcp://127.0.0.1:{port}'
    producer(clip_file, url, '--loop')  # killed when the test ends
    wait_bound(port, 'tcp')
    proc = subprocess.Popen([sys.executable, 'predict.py', str(checkpoint), '--stream', url],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert 'latency' in proc.stdout.readline()
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f'still running 60 s after Ctrl-C; its standard error: {proc.communicate()[1][-3000:]}')
    assert proc.returncode == 0, err
    assert 'stopped (Ctrl-C)' in err and 'summary: ' in err and 'Traceback' not in err


@pytest.mark.slow  # real-time streams, producer processes
def test_a_source_that_opens_but_gives_no_frame_counts_as_a_failed_reconnect(checkpoint, tmp_path,
                                                                             capsys):
    """An .mp4 whose index is at its end, from a server without byte ranges (as
    python -m http.server): it opens, then every read fails. Before, each open
    counted as a reconnect that worked, and the run went on reopening forever."""
    import http.server
    from functools import partial

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    from tests.video_files import frame_image
    rng = np.random.default_rng(0)  # noise: a file past FFmpeg's buffers, so the index is out of reach
    clip_file = write_video(tmp_path / 'big.mp4', width=320, height=240, fps=FPS,
                            images=[np.clip(frame_image(i % 80, 320, 240) + rng.integers(0, 60, (240, 320, 3)),
                                            0, 255).astype(np.uint8) for i in range(60)])
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), partial(Quiet, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f'http://127.0.0.1:{server.server_address[1]}/{clip_file.name}'
        status = predict.main([str(checkpoint), '--stream', url, '--reconnect', '2'])
    finally:
        server.shutdown()
        server.server_close()
    err = capsys.readouterr().err
    assert status == 1, err
    assert 'summary: the source was lost (2 reconnects failed); 0 frames' in err
    assert 'attempt 2 of 2' in err and 'attempt 3' not in err
