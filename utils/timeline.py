"""One video's scores over time, from its sliding windows (predict.py --timeline
and --output_video): the top classes' scores against the seconds as a picture
or a JSON file, and the video itself with each window's top label and score
drawn on its frames."""
import json
import math
from fractions import Fraction

import numpy as np
import torch

from utils.atomic import atomic_file, atomic_path

# Frames smaller than this (short side) are enlarged in the labelled video so
# that the label stays readable (the synthetic set's clips are 32x32).
MIN_SHORT_SIDE = 240


def window_scores(views):
    """[(start, end, softmax)] per window, in time order, the softmax averaged
    over the window's spatial crops; ``views``: [(segment, crop, softmax)] as
    inference.ViewScores keeps them (segments 0-based half-open)."""
    sums, counts = {}, {}
    for segment, _, p in views:
        key = (int(segment[0]), int(segment[1]))
        sums[key] = sums[key] + p.double() if key in sums else p.double()
        counts[key] = counts.get(key, 0) + 1
    return [(s, e, (sums[(s, e)] / counts[(s, e)]).float()) for s, e in sorted(sums)]


def timeline_data(video_id, windows, class_names, fps, topk=5):
    """The JSON form: the ``topk`` classes of the mean over the windows (all for
    topk <= 0), and per window its frames, seconds and those classes' scores."""
    mean = torch.stack([p for _, _, p in windows]).mean(0)
    k = len(class_names) if topk <= 0 else min(topk, len(class_names))
    top = mean.topk(k).indices.tolist()
    return {
        'video': video_id,
        'fps': float(fps),
        'classes': [class_names[i] for i in top],
        'windows': [{'frames': [s, e], 'start_s': s / fps, 'end_s': e / fps,
                     'scores': {class_names[i]: float(p[i]) for i in top}}
                    for s, e, p in windows],
    }


def write_timeline(path, data):
    """``data`` (timeline_data) as JSON (.json) or as a line chart (.png): one
    line per class, each window's score at its middle, seconds on the x axis."""
    path = str(path)
    if path.endswith('.json'):
        with atomic_file(path, 'w') as f:
            json.dump(data, f, indent=1)
        return
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global state
    fig = Figure(figsize=(10, 4), dpi=100, layout='constrained')
    ax = fig.add_subplot()
    middles = [(w['start_s'] + w['end_s']) / 2 for w in data['windows']]
    for name in data['classes']:
        ax.plot(middles, [w['scores'][name] for w in data['windows']], marker='.', label=name)
    ax.set_xlabel('time (s)')
    ax.set_ylabel('score (softmax)')
    ax.set_ylim(0, 1)
    end = data['windows'][-1]['end_s']
    ax.set_xlim(0, end if end > 0 else 1)
    ax.set_title(f'{data["video"]}: top classes per window')
    ax.legend(loc='upper right', fontsize=8)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format='png')


def frame_windows(windows, n_frames):
    """Index of the window whose middle is nearest to each frame's (the earlier
    on a tie): with overlapping windows each frame shows one of them."""
    middles = np.array([(s + e) / 2 for s, e, _ in windows])
    frames = np.arange(n_frames) + 0.5
    return np.abs(frames[:, None] - middles[None, :]).argmin(1)


def captions(windows, class_names, n_frames):
    """The text drawn on each frame: its window's top label and score."""
    tops = [(class_names[int(p.argmax())], float(p.max())) for _, _, p in windows]
    return [f'{tops[w][0]} {tops[w][1]:.2f}' for w in frame_windows(windows, n_frames)]


def _labelled(frame, text, scale, font):
    """One (C, H, W) uint8 frame enlarged ``scale`` times, even-sized (H.264),
    with a dark banner holding ``text`` at the top."""
    from PIL import Image, ImageDraw
    image = Image.fromarray(frame.permute(1, 2, 0).numpy())
    w, h = image.width * scale, image.height * scale
    image = image.resize((w, h), Image.NEAREST) if scale > 1 else image
    canvas = Image.new('RGB', (w + w % 2, h + h % 2))
    canvas.paste(image)
    draw = ImageDraw.Draw(canvas)
    box = draw.textbbox((0, 0), text, font=font)
    draw.rectangle((0, 0, min(canvas.width, box[2] + 8), box[3] + 8), fill=(0, 0, 0))
    draw.text((4, 4), text, fill=(255, 255, 255), font=font)
    return np.asarray(canvas)


def write_labelled_video(path, chunks, texts, fps):
    """H.264 video at ``path`` of the frames in ``chunks`` (uint8 (T, C, H, W)
    tensors, in order), frame i with ``texts[i]`` drawn on it; returns the
    number of frames written."""
    import av
    from PIL import ImageFont
    i = 0
    with av.open(str(path), 'w') as container:
        stream = scale = font = None
        for chunk in chunks:
            if stream is None:  # the size is known with the first frames
                size = chunk.shape[-2:]
                scale = max(1, math.ceil(MIN_SHORT_SIDE / min(size)))
                font = ImageFont.load_default(size=max(12, min(size) * scale // 14))
                stream = container.add_stream('libx264',
                                              rate=Fraction(fps).limit_denominator(1001))
                stream.height, stream.width = (d * scale + (d * scale) % 2 for d in size)
                stream.pix_fmt = 'yuv420p'
                stream.options = {'crf': '18'}
            for frame in chunk:
                array = _labelled(frame, texts[i], scale, font)
                for packet in stream.encode(av.VideoFrame.from_ndarray(array, format='rgb24')):
                    container.mux(packet)
                i += 1
        for packet in stream.encode() if stream is not None else ():
            container.mux(packet)
    return i
