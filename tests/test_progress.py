"""Progress bars only on a terminal: written to a file, every redraw is a carriage return."""
import io
import os

import main
from tests.conftest import tiny_args
from utils.progress import on_terminal


def test_on_terminal_tells_a_terminal_from_a_file_or_pipe(tmp_path):
    leader, follower = os.openpty()
    read, write = os.pipe()
    try:
        with open(follower, 'w', closefd=False) as tty, open(write, 'w', closefd=False) as pipe:
            assert on_terminal(tty)
            assert not on_terminal(pipe)
        with open(tmp_path / 'log', 'w') as f:
            assert not on_terminal(f)
        assert not on_terminal(io.StringIO())
        assert not on_terminal(object())  # no isatty at all
    finally:
        for fd in (leader, follower, read, write):
            os.close(fd)


def test_a_run_off_a_terminal_prints_lines_and_no_bar(tiny_synthetic, tmp_path, capfd):
    args = [a for a in tiny_args(*tiny_synthetic, tmp_path, '--n_epochs', '1') if a != '--no_progress']
    main.main(args)
    out, err = capfd.readouterr()
    assert '\r' not in out + err  # no bar redraws in a log file
    assert 'epoch 1 [2/3] loss ' in out and 'epoch 1 [3/3] loss ' in out
