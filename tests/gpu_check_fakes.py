"""Checks that fail in each way a check can, for tests/test_gpu_check.py
(python -m util_scripts.gpu_check --extra_checks tests.gpu_check_fakes)."""
import os
import time

from util_scripts.gpu_checks.common import Check


def user_error(checker):
    import main
    main.main(['--dataset', 'synthetic', '--sample_size', '0'])  # exits 2, as a bad option does


def crash(checker):
    os._exit(3)  # no result line: the process died


def hang(checker):
    time.sleep(3600)


CHECKS = {
    'fake_user_error': Check(user_error, 120, 'main.main exits through SystemExit'),
    'fake_crash': Check(crash, 120, 'the check\'s process dies'),
    'fake_hang': Check(hang, 2, 'the check runs past its budget'),
}
