"""The old name of the GPU self-check, kept so that `python -m bench.gpu_check`
still works: it says the new name and runs util_scripts/gpu_check.py."""
import sys

from util_scripts.gpu_check import main

if __name__ == '__main__':
    print('note: the GPU self-check is now `python -m util_scripts.gpu_check`; running it',
          file=sys.stderr, flush=True)
    sys.exit(main())
