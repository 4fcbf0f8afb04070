"""curves.png: read back from the figure's own lines, not from the pixels."""
from utils.logs import TsvLogger, curves_figure, draw_curves

TRAIN = ['epoch', 'loss', 'acc', 'lr']
VAL = ['epoch', 'loss', 'acc', 'clip_acc']


def write_logs(folder, val_losses, accuracies):
    train, val = TsvLogger(folder / 'train.log', TRAIN), TsvLogger(folder / 'val.log', VAL)
    for epoch, (loss, acc) in enumerate(zip(val_losses, accuracies), 1):
        train.log({'epoch': epoch, 'loss': 1.0 / epoch, 'acc': acc, 'lr': 0.1})
        val.log({'epoch': epoch, 'loss': loss, 'acc': acc, 'clip_acc': acc})
    train.close()
    val.close()


def panels(fig):
    return {ax.get_title(): ax for ax in fig.axes}


def test_a_spike_leaves_the_rest_of_the_loss_readable(tmp_path):
    write_logs(tmp_path, [55.0, 1.2, 6092.0, 0.8, 0.5], [0.2, 0.5, 0.3, 0.8, 0.9])
    fig, drawn = curves_figure(tmp_path)
    loss = panels(fig)['loss (log scale)']
    assert loss.get_yscale() == 'log'
    low, high = loss.get_ylim()
    assert low < 0.5 and high > 6092  # every point in view, the small ones spread over decades
    lines = {line.get_label(): list(line.get_ydata()) for line in loss.get_lines()}
    assert lines['validation'] == [55.0, 1.2, 6092.0, 0.8, 0.5]
    assert drawn['loss: validation'] == list(enumerate([55.0, 1.2, 6092.0, 0.8, 0.5], 1))


def test_equal_accuracy_lines_are_told_apart(tmp_path):
    write_logs(tmp_path, [1.0, 0.9, 0.8], [0.3, 0.6, 0.9])  # video and clip accuracy equal
    fig, _ = curves_figure(tmp_path)
    lines = {line.get_label(): line for line in panels(fig)['accuracy'].get_lines()}
    video, clip = lines['validation (video)'], lines['validation (clip)']
    assert list(video.get_ydata()) == list(clip.get_ydata())
    assert (video.get_linestyle(), video.get_marker()) != (clip.get_linestyle(), clip.get_marker())
    assert clip.get_markerfacecolor() == 'none'  # the earlier line shows through the later one


def test_draw_curves_writes_the_png(tmp_path):
    write_logs(tmp_path, [1.0, 0.5], [0.5, 0.7])
    drawn = draw_curves(tmp_path)
    assert (tmp_path / 'curves.png').read_bytes()[:4] == b'\x89PNG' and 'loss: train' in drawn
