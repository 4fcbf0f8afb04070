"""A torch and torchvision that were not built for each other (what pip leaves when
torch came from one index and torchvision from another) fail deep in an import:
`RuntimeError: operator torchvision::nms does not exist`. Checked once at start,
it is one line naming both versions and the command that installs the pair."""
import sys
from importlib import metadata


def installed(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return 'not installed'


def matching_torchvision(torch_version: str) -> str | None:
    """The torchvision release line built for ``torch_version`` (torch 2.N: 0.N+15),
    None where the version does not read as 2.N."""
    parts = torch_version.split('+')[0].split('.')
    if len(parts) < 2 or parts[0] != '2' or not parts[1].isdigit():
        return None
    return f'0.{int(parts[1]) + 15}'


def mismatch_line(error: BaseException) -> str:
    torch_version, vision_version = installed('torch'), installed('torchvision')
    pair = matching_torchvision(torch_version)
    fix = (f'pip install --force-reinstall --no-deps "torchvision=={pair}.*" from the index torch came from '
           f'(the CPU one: --index-url https://download.pytorch.org/whl/cpu)' if pair else
           'install torch and torchvision together from one index (README.md, Quick start)')
    reason = str(error).splitlines()[0] if str(error) else type(error).__name__
    return (f'error: torchvision {vision_version} does not work with torch {torch_version} ({reason}): '
            f'{fix}')


def check_torchvision() -> None:
    """Imports torchvision, or ends the process with mismatch_line (exit status 2)."""
    try:
        import torchvision  # noqa: F401
    except (ImportError, RuntimeError, OSError) as e:
        print(mismatch_line(e), file=sys.stderr)
        sys.exit(2)
