"""What a run derives or finds at run time, kept apart from the options as given."""
import copy
import os
from dataclasses import dataclass, field, fields
from pathlib import Path

from utils.urls import redact_url


@dataclass
class RunRecord:
    """Filled in by main.py's stages (prepare, then restore) and written to
    opts.json under "run", beside the options exactly as parsed."""
    device: str
    world_size: int
    batch_per_process: int
    learning_rate: float  # --learning_rate after --lr_scaling
    amp: bool  # --amp, off on CPU
    normalize_on_device: bool  # workers hand over uint8, the device normalizes
    video_path: Path | str | None  # resolved (the synthetic set's); a URL of shards as a str
    annotation_path: Path | None
    resume_path: Path | None  # --resume_path, or the checkpoint --auto_resume found
    begin_epoch: int = 1
    begin_batch: int = 0  # batches of begin_epoch a mid-epoch checkpoint covers
    n_parameters: int = 0
    gflops_per_clip: float = 0.0
    frozen_modules: tuple[str, ...] = ()
    # The options', or a resumed checkpoint's (a resumed run cannot change them);
    # n_classes None until load_data counts the annotation's labels (not given).
    n_classes: int | None = None
    ft_begin_module: str = ''
    ft_lr_ratio: float = 1.0
    decode_on_device: bool = False  # --decode_device cuda: workers hand over JPEG bytes
    file_type: str = 'jpg'  # --file_type, or the shard index's (make_shards' output)
    shards: object = None  # the ShardStore --video_path's shards are read through (datasets/storage.py)
    # What a resumed training changes of its checkpoint's schedule (--n_epochs,
    # --min_lr, ...): {option: {'checkpoint': its value, 'now': this run's}}.
    schedule_changes: dict = field(default_factory=dict)

    def to_dict(self):
        values = {f.name: copy.deepcopy(getattr(self, f.name)) for f in fields(self) if f.name != 'shards'}
        values = {k: (os.fspath(v) if isinstance(v, Path) else v) for k, v in values.items()}
        if values['video_path']:  # a URL's password never goes into opts.json
            values['video_path'] = redact_url(values['video_path'])
        return values
