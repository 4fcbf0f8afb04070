"""Every error a user can cause, and USER_ERRORS: the set the entry points
(main.py, predict.py, util_scripts) report as one line, exit status 2,
instead of a traceback. Each message names the file, video or option and
says what to do. Standard library only: the command lines import it before
torch."""


class DataError(ValueError):
    """Bad or missing data: the message names the file / video and says how to
    fix the file itself (re-extract, re-encode). What else can be done about
    it depends on who reads it -- a training run can leave the video out of
    its annotation file, predict.py skips it -- and is said by that caller."""


class OptionError(ValueError):
    """An option value that cannot work; the message names the option and the fix."""


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be loaded or used; the message names the file."""


class CheckpointWriteError(CheckpointError):
    """Writing a checkpoint failed (disk full, folder not writable); the previous
    checkpoints are untouched."""


class ResultFolderError(RuntimeError):
    """A result folder that cannot be used; the message names it and what to do."""


class ResultFolderBusy(ResultFolderError):
    """Another live run holds the result folder's lock."""


class LaunchError(RuntimeError):
    """A launch that cannot work (wrong launcher, options or GPU count); the
    message says what to change."""


class StorageError(RuntimeError):
    """Reading a data set's shards or index from its folder, HTTP or S3 failed
    (network down, server errors after the retries, a shard not found): the
    message names the URL (its password hidden) and what failed. Not a
    DataError: a run that skips bad videos must stop on it, never skip the
    videos it could not fetch."""


USER_ERRORS = (DataError, OptionError, CheckpointError, ResultFolderError, LaunchError, StorageError)
