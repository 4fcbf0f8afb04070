"""Static int8 quantization of an exported .onnx file with onnxruntime's tools
(util_scripts.export --quantize int8, bench/deploy.py), and the figures that
judge it: the top-1 agreement with the fp32 file, video accuracy, and the time
per clip of each file in onnxruntime on the CPU.

The quantized file is QDQ (QuantizeLinear/DequantizeLinear pairs around each
quantized operator, which onnxruntime's CPU provider fuses into QLinearConv,
QLinearAdd, QGemm), calibrated by min-max on the activations of the clips given,
with one scale per output channel for the weights. It keeps the fp32 file's
metadata (class names, input settings) that predict.py reads, and adds
"quantization", saying how it was made."""
import itertools
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from utils.atomic import atomic_path

# uint8 activations x int8 weights (U8S8): the pair onnxruntime's x86 int8
# kernels multiply (AVX2's VPMADDUBSW, AVX-VNNI/AVX-512 VNNI's VPDPBUSD take
# unsigned x signed bytes), and with it the CPU provider fused every QDQ Conv of
# resnet-10 into QLinearConv; with int8 activations (S8S8) 7 of its 12
# convolutions stayed float between DequantizeLinear and QuantizeLinear
# (onnxruntime 1.32, this machine's AVX-512 VNNI CPU). Without VNNI, AVX2's
# VPMADDUBSW can saturate the int16 sum of two products; export's agreement
# check reports what that costs.
ACTIVATION_TYPE = 'QUInt8'
WEIGHT_TYPE = 'QInt8'
QUANTIZATION = {'format': 'QDQ', 'activations': 'uint8, per tensor, min-max calibrated',
                'weights': 'int8, per output channel, symmetric', 'tool': 'onnxruntime.quantization'}


def _calibration_reader(input_name, batches):
    """A CalibrationDataReader feeding the batches, each checked (float32, 5-D)."""
    from onnxruntime.quantization import CalibrationDataReader

    class Batches(CalibrationDataReader):
        def __init__(self):
            self.batches = iter(batches)
            self.count = 0

        def get_next(self):
            batch = next(self.batches, None)
            if batch is None:
                return None
            if not isinstance(batch, np.ndarray) or batch.dtype != np.float32 or batch.ndim != 5:
                raise ValueError(f'calibration batch {self.count}: expected a float32 array '
                                 f'(batch, C, T, H, W), got {type(batch).__name__} '
                                 f'{getattr(batch, "dtype", "")} {getattr(batch, "shape", "")}')
            self.count += 1
            return {input_name: np.ascontiguousarray(batch)}
    return Batches()


def _copy_metadata(fp32_path, model, n_batches):
    """The fp32 file's metadata_props on ``model`` (onnx.ModelProto), and "quantization"."""
    import onnx
    props = {p.key: p.value for p in onnx.load(str(fp32_path), load_external_data=False).metadata_props}
    props.update({p.key: p.value for p in model.metadata_props if p.key not in props})
    props['quantization'] = json.dumps({**QUANTIZATION, 'calibration_batches': n_batches})
    del model.metadata_props[:]
    for key, value in props.items():
        model.metadata_props.add(key=key, value=value)


def quantize_onnx_int8(fp32_path, int8_path, calibration_batches):
    """Writes ``int8_path``: ``fp32_path`` statically quantized (QDQ, uint8
    activations, per-channel int8 weights), its activation ranges those of
    ``calibration_batches``, an iterable of float32 arrays shaped like the
    model's input (batch, C, T, H, W). Raises ValueError on an empty or
    malformed calibration."""
    import onnx
    from onnxruntime.quantization import QuantFormat, QuantType, quant_pre_process, quantize_static
    batches = iter(calibration_batches)
    first = next(batches, None)
    if first is None:
        raise ValueError('calibration_batches is empty: give at least one batch of clips')
    with tempfile.TemporaryDirectory(prefix='.int8.', dir=Path(int8_path).parent) as folder:
        prepared, quantized = Path(folder) / 'prepared.onnx', Path(folder) / 'int8.onnx'
        # shape inference (the quantizer leaves tensors of unknown shape in float)
        # and onnxruntime's graph optimizations (a BatchNorm the exporter left
        # folds into its convolution) first
        quant_pre_process(str(fp32_path), str(prepared))
        input_name = onnx.load(str(prepared), load_external_data=False).graph.input[0].name
        reader = _calibration_reader(input_name, itertools.chain([first], batches))
        quantize_static(str(prepared), str(quantized), reader, quant_format=QuantFormat.QDQ,
                        per_channel=True, activation_type=getattr(QuantType, ACTIVATION_TYPE),
                        weight_type=getattr(QuantType, WEIGHT_TYPE))
        model = onnx.load(str(quantized))
        _copy_metadata(fp32_path, model, reader.count)
        with atomic_path(int8_path) as out:
            onnx.save(model, str(out))


def onnx_session(path, n_threads=0):
    """An onnxruntime CPU session of ``path`` on ``n_threads`` intra-op threads
    (0: onnxruntime's default, one per core), one inter-op thread."""
    import onnxruntime
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = n_threads
    options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(str(path), options, providers=['CPUExecutionProvider'])


def onnx_logits(paths, batches, n_threads=0):
    """The logits of each .onnx file of ``paths`` on the same batches (float32
    arrays, each read once): one (clips, classes) array per file."""
    sessions = [onnx_session(path, n_threads) for path in paths]
    names = [session.get_inputs()[0].name for session in sessions]
    outputs = [[] for _ in sessions]
    for batch in batches:
        batch = np.ascontiguousarray(batch, dtype=np.float32)
        for session, name, out in zip(sessions, names, outputs):
            out.append(session.run(None, {name: batch})[0])
    return [np.concatenate(out) for out in outputs]


def top1_agreement(logits, reference):
    """The share of rows whose top-1 class in ``logits`` is that of ``reference``."""
    return float(np.mean(np.argmax(logits, 1) == np.argmax(reference, 1)))


def video_accuracy(logits, video_of_clip, labels):
    """Video accuracy as validation computes it: the softmax averaged over a
    video's clips, its top-1 against ``labels`` (per video; videos whose label
    is negative are not counted). None when no video has a label."""
    shifted = np.exp(logits - logits.max(1, keepdims=True))
    probs = shifted / shifted.sum(1, keepdims=True)
    labels = np.asarray(labels)
    counts = np.bincount(video_of_clip, minlength=len(labels))
    sums = np.zeros((len(labels), logits.shape[1]))
    np.add.at(sums, video_of_clip, probs)
    counted = (labels >= 0) & (counts > 0)
    if not counted.any():
        return None
    return float(np.mean(np.argmax(sums[counted], 1) == labels[counted]))


def time_onnx_per_clip(path, clip, n_threads, min_runs=5, min_seconds=0.5):
    """Seconds onnxruntime takes for one clip at batch 1 on ``n_threads``
    threads: the median over at least ``min_runs`` runs and ``min_seconds``,
    after one warm-up run. clip: (C, T, H, W) or (1, C, T, H, W) float32."""
    session = onnx_session(path, n_threads)
    feed = {session.get_inputs()[0].name:
            np.ascontiguousarray(clip.reshape(1, *clip.shape[-4:]), dtype=np.float32)}
    session.run(None, feed)  # warm-up: kernels, onnxruntime's memory arenas
    times = []
    while len(times) < min_runs or sum(times) < min_seconds:
        start = time.perf_counter()
        session.run(None, feed)
        times.append(time.perf_counter() - start)
    return statistics.median(times)
