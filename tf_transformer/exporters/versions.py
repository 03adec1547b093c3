"""Export versions: integers, claimed atomically and never reused.

Each export takes the next number; EXPORT_DIR/.last_version remembers the
highest ever issued, so a deleted version is not handed out again. A version
is written under a temporary name beside it (".tmp-<version>", which TF
Serving ignores: not an integer) and renamed into place when complete.
"""

from __future__ import annotations

import os
import tempfile

LAST_VERSION_FILE = ".last_version"
TMP_PREFIX = ".tmp-"


def _versions(export_dir: str) -> list[int]:
    return [int(n) for n in os.listdir(export_dir) if n.isdigit()]


def _last_issued(export_dir: str) -> int:
    try:
        with open(os.path.join(export_dir, LAST_VERSION_FILE)) as f:
            return int(f.read().strip() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def claim_version(export_dir: str) -> tuple[int, str]:
    """Reserves the next version number: (version, its temporary directory).

    The temporary directory is created with os.mkdir, which fails if another
    exporter claimed the same number first; then the next number is tried.
    The claim is recorded in .last_version before anything is written, so a
    failed or deleted export never has its number reused.
    """
    os.makedirs(export_dir, exist_ok=True)
    version = max(_versions(export_dir) + [_last_issued(export_dir), 0]) + 1
    while True:
        tmp = os.path.join(export_dir, f"{TMP_PREFIX}{version}")
        if not os.path.exists(os.path.join(export_dir, str(version))):
            try:
                os.mkdir(tmp)
                break
            except FileExistsError:
                pass
        version += 1
    marker = os.path.join(export_dir, LAST_VERSION_FILE)
    fd, marker_tmp = tempfile.mkstemp(dir=export_dir, prefix=".last_version.")
    with os.fdopen(fd, "w") as f:
        f.write(f"{max(version, _last_issued(export_dir))}\n")
    os.chmod(marker_tmp, 0o644)
    os.replace(marker_tmp, marker)
    return version, tmp
