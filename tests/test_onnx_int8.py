"""utils/onnx_int8.py on a small hand-made ONNX graph (no training, no
exporter): the quantized file, its metadata, the calibration's errors, and
the agreement and accuracy arithmetic; util_scripts/export_clips.py's choice
of calibration clips."""
import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from utils.onnx_int8 import (
    quantize_onnx_int8,
    time_onnx_per_clip,
    top1_agreement,
    video_accuracy,
)

SHAPE = (3, 4, 8, 8)  # one clip (C, T, H, W)


def _conv_net(path):
    """clips (batch, 3, 4, 8, 8) -> Conv3d(3->4, 3x3x3) -> Relu -> global mean -> Gemm -> 5 logits,
    with export's metadata keys."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
               for name, shape in (('w', (4, 3, 3, 3, 3)), ('b', (4,)), ('fc_w', (5, 4)), ('fc_b', (5,)))]
    nodes = [helper.make_node('Conv', ['clips', 'w', 'b'], ['conv'], pads=[1] * 6),
             helper.make_node('Relu', ['conv'], ['relu']),
             helper.make_node('GlobalAveragePool', ['relu'], ['pool']),
             helper.make_node('Flatten', ['pool'], ['flat']),
             helper.make_node('Gemm', ['flat', 'fc_w', 'fc_b'], ['logits'], transB=1)]
    graph = helper.make_graph(nodes, 'net', [helper.make_tensor_value_info('clips', TensorProto.FLOAT,
                                                                           ['batch', *SHAPE])],
                              [helper.make_tensor_value_info('logits', TensorProto.FLOAT, ['batch', 5])],
                              initializer=weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid('', 17)])
    model.metadata_props.add(key='class_names', value=json.dumps(list('abcde')))
    model.metadata_props.add(key='input', value='{"sample_size": 8}')
    onnx.save(model, str(path))
    return path


def _batches(n, batch=2, seed=1):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((batch, *SHAPE)).astype(np.float32) for _ in range(n)]


def test_quantized_file_is_qdq_int8_and_keeps_the_metadata(tmp_path):
    fp32 = _conv_net(tmp_path / 'fp32.onnx')
    int8 = tmp_path / 'int8.onnx'
    assert quantize_onnx_int8(fp32, int8, iter(_batches(3))) is None  # any iterable, read once
    model = onnx.load(str(int8))
    ops = [n.op_type for n in model.graph.node]
    assert 'QuantizeLinear' in ops and 'DequantizeLinear' in ops
    types = {t.name: t.data_type for t in model.graph.initializer}
    assert TensorProto.INT8 in types.values() and TensorProto.UINT8 in types.values()
    assert not any(t.name == 'w' and t.data_type == TensorProto.FLOAT for t in model.graph.initializer)
    props = {p.key: p.value for p in model.metadata_props}
    assert json.loads(props['class_names']) == list('abcde') and props['input'] == '{"sample_size": 8}'
    assert json.loads(props['quantization'])['calibration_batches'] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ['fp32.onnx', 'int8.onnx']  # no temporary left
    assert time_onnx_per_clip(int8, _batches(1, batch=1)[0][0], 1, min_runs=2, min_seconds=0) > 0


def test_calibration_errors_say_what_is_wrong(tmp_path):
    fp32 = _conv_net(tmp_path / 'fp32.onnx')
    with pytest.raises(ValueError, match='calibration_batches is empty'):
        quantize_onnx_int8(fp32, tmp_path / 'int8.onnx', [])
    with pytest.raises(ValueError, match=r'calibration batch 1: expected a float32 array .* float64'):
        quantize_onnx_int8(fp32, tmp_path / 'int8.onnx', [_batches(1)[0], np.zeros((1, *SHAPE))])
    assert sorted(p.name for p in tmp_path.iterdir()) == ['fp32.onnx']


def test_agreement_and_video_accuracy():
    reference = np.array([[2.0, 1, 0], [0, 3, 1], [1, 0, 2], [0, 1, 5]])
    flipped = reference.copy()
    flipped[1] = [3, 0, 1]
    assert top1_agreement(flipped, reference) == 0.75
    # videos 0 (clips 0, 1: mean softmax 0.35, 0.54, 0.10) and 1 (clips 2, 3: class 2);
    # video 2 has no clip, video 3 no label
    videos = np.array([0, 0, 1, 1])
    assert video_accuracy(reference, videos, [1, 2, 1, -1]) == 1.0
    assert video_accuracy(reference, videos, [0, 2, 1, -1]) == 0.5
    # the mean of the softmax (0.40, 0.53, 0.07), not of the logits (2, 1.33, 0)
    logits = np.array([[6.0, 0, 0], [0, 2, 0], [0, 2, 0]])
    assert video_accuracy(logits, np.array([0, 0, 0]), [1]) == 1.0
    assert video_accuracy(reference, videos, [-1, -1]) is None


def test_calibration_clips_spread_over_the_training_videos(tiny_synthetic):
    from argparse import Namespace

    from util_scripts.export_clips import calibration_set, validation_set
    video_path, annotation_path = tiny_synthetic
    options = Namespace(dataset='ucf101', file_type='jpg', input_type='rgb', sample_size=16,
                        sample_duration=4, sample_t_stride=1, value_scale=1, mean_dataset='0.5',
                        no_mean_norm=False, no_std_norm=False, n_val_samples=2)
    few = calibration_set(annotation_path, video_path, options, 5)  # 5 of the 24 videos, 1 clip each
    assert (len(few.records), few.clips_per_video, few.n_clips) == (5, 1, 5)
    assert len({r.video_id for r in few.records}) == 5 and len({r.label for r in few.records}) >= 4
    many = calibration_set(annotation_path, video_path, options, 30)  # every video, 2 clips, 30 in all
    batches = list(many.batches(options))
    assert [len(clips) for clips, _ in batches] == [8, 8, 8, 6]
    assert batches[0][0].dtype == np.float32 and batches[0][0].shape[1:] == (3, 4, 16, 16)
    assert np.concatenate([videos for _, videos in batches]).tolist() == sorted(list(range(15)) * 2)
    names = json.loads(annotation_path.read_text())['labels']
    held_out = validation_set(annotation_path, video_path, options, names[::-1])  # the checkpoint's order
    assert held_out.n_clips == 24 and held_out.labels == [len(names) - 1 - r.label for r in held_out.records]
