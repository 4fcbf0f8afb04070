"""What a run derives or finds at run time, kept apart from the options as given."""
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path


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
    video_path: Path | None  # resolved (the synthetic set's when --dataset synthetic)
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
    # What a resumed training changes of its checkpoint's schedule (--n_epochs,
    # --min_lr, ...): {option: {'checkpoint': its value, 'now': this run's}}.
    schedule_changes: dict = field(default_factory=dict)

    def to_dict(self):
        return {k: (os.fspath(v) if isinstance(v, Path) else v) for k, v in asdict(self).items()}
