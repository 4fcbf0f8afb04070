"""Progress bars are for a person at a terminal: written to a file (a cluster
job's log, `> run.log`) each redraw is a carriage return, and a short demo left
52 KB of them. Off a terminal the runs print their lines instead (a line per
--log_interval steps in training, per epoch in validation)."""
import sys


def on_terminal(stream=None) -> bool:
    """Whether ``stream`` (default: standard error, where the bars go) is a terminal."""
    stream = sys.stderr if stream is None else stream
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # replaced by an object without isatty, or closed
        return False
