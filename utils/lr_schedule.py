"""The learning-rate schedule: one object that the training loop tells when an
optimizer step and an epoch end, whatever the kind of schedule."""
import math
from collections import Counter
from dataclasses import dataclass

from torch.optim.lr_scheduler import LambdaLR, MultiStepLR, ReduceLROnPlateau


@dataclass(frozen=True)
class ScheduleConfig:
    kind: str  # 'multistep' | 'plateau' | 'cosine'
    milestones: tuple[int, ...] = (50, 100, 150)
    plateau_patience: int = 10
    warmup_epochs: float = 0.0
    min_lr: float = 0.0
    n_epochs: int = 200


class LRSchedule:
    """multistep (x0.1 after each milestone epoch) and plateau (on the validation
    loss) change the rate once per epoch, after validation; cosine changes it
    after every optimizer step, following a linear warmup.

    state_dict() is that of the torch scheduler underneath, so checkpoints keep
    3D-ResNets-PyTorch's 'scheduler' entry.
    """

    def __init__(self, optimizer, config, steps_per_epoch):
        self.kind = config.kind
        if config.kind == 'multistep':
            self.scheduler = MultiStepLR(optimizer, list(config.milestones))
        elif config.kind == 'plateau':
            self.scheduler = ReduceLROnPlateau(optimizer, 'min', patience=config.plateau_patience)
        elif config.kind == 'cosine':
            base_lr = optimizer.param_groups[0]['lr']
            self.scheduler = LambdaLR(optimizer, _warmup_cosine(
                total=max(1, config.n_epochs * steps_per_epoch),
                warmup=int(round(config.warmup_epochs * steps_per_epoch)),
                floor=config.min_lr / base_lr if base_lr > 0 else 0.0))
        else:
            raise ValueError(f'unknown learning-rate schedule {config.kind!r}')

    def after_step(self):
        if self.kind == 'cosine':
            self.scheduler.step()

    def after_epoch(self, loss):
        """loss: the validation loss (the training loss when there is no validation)."""
        if self.kind == 'plateau':
            self.scheduler.step(loss)
        elif self.kind == 'multistep':
            self.scheduler.step()

    def state_dict(self):
        return self.scheduler.state_dict()

    def load_state_dict(self, state, milestones=None, patience=None):
        """milestones: replace the checkpoint's (--overwrite_milestones);
        patience: replace the checkpoint's (plateau)."""
        self.scheduler.load_state_dict(state)
        if milestones is not None and self.kind == 'multistep':
            self.scheduler.milestones = Counter(milestones)
        if patience is not None and self.kind == 'plateau':
            self.scheduler.patience = patience
        if self.kind == 'cosine':
            # The checkpoint's rate is its own schedule's: this run's (a new
            # --n_epochs, --min_lr or --warmup_epochs) applies from the next step.
            self._set_rates_at(self.scheduler.last_epoch)

    def _set_rates_at(self, step):
        scheduler = self.scheduler
        rates = [base * factor(step) for base, factor in zip(scheduler.base_lrs, scheduler.lr_lambdas)]
        for group, rate in zip(scheduler.optimizer.param_groups, rates):
            group['lr'] = rate
        scheduler._last_lr = rates  # what get_last_lr() reports

    @property
    def steps_done(self):
        """The schedule's steps so far: optimizer steps (cosine), epochs (the others)."""
        return self.scheduler.last_epoch


def schedule_kind(state):
    """'multistep', 'plateau' or 'cosine': which LRSchedule wrote a state_dict
    (a 3D-ResNets-PyTorch checkpoint's is MultiStepLR's), None when it cannot tell."""
    state = state or {}
    for key, kind in (('milestones', 'multistep'), ('patience', 'plateau'), ('lr_lambdas', 'cosine')):
        if key in state:
            return kind
    return None


def _warmup_cosine(total, warmup, floor):
    def factor(step):
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
    return factor


def steps_per_epoch(n_batches, accumulation_steps):
    return math.ceil(n_batches / accumulation_steps)
