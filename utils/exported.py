"""Models exported by util_scripts.export, run outside PyTorch: an .onnx file
through onnxruntime, with the class names and input settings from its
metadata (predict.py classifies videos with it)."""
import json
from argparse import Namespace

import numpy as np
import torch

from utils.errors import CheckpointError

# The options that say how a video becomes the network's input (stored by export).
INPUT_OPTIONS = ('input_type', 'sample_size', 'sample_duration', 'sample_t_stride',
                 'value_scale', 'mean_dataset', 'no_mean_norm', 'no_std_norm')


class OnnxClassifier:
    """An exported .onnx file run by onnxruntime on the CPU: called on a float
    batch of clips, it returns the logits; ``class_names`` and ``options`` (the
    input settings, as predict.view_transforms reads them) come from its
    metadata."""

    def __init__(self, path):
        import onnxruntime  # only needed for .onnx files
        try:
            self.session = onnxruntime.InferenceSession(str(path),
                                                        providers=['CPUExecutionProvider'])
        except Exception as e:  # noqa: BLE001 - onnxruntime raises its own types
            raise CheckpointError(f'{path} cannot be loaded by onnxruntime ({e})') from None
        props = self.session.get_modelmeta().custom_metadata_map
        if 'class_names' not in props or 'input' not in props:
            raise CheckpointError(f'{path} has no class_names/input metadata: export it with '
                                  f'python -m util_scripts.export')
        self.class_names = json.loads(props['class_names'])
        settings = json.loads(props['input'])
        self.options = Namespace(**{name: settings[name] for name in INPUT_OPTIONS},
                                 model='onnx')
        self.input_name = self.session.get_inputs()[0].name

    def __call__(self, clips):
        array = np.ascontiguousarray(clips.detach().float().cpu().numpy())
        return torch.from_numpy(self.session.run(None, {self.input_name: array})[0])

    def eval(self):
        return self
