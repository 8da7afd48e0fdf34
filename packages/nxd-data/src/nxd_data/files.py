"""Writing a file so that readers see the old content or the complete new one, never half of it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np


def save_atomically(path: Path, content: np.ndarray | bytes) -> None:
    """Write `content` (raw bytes, or an array as .npy) to a temporary name beside `path`, then rename."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "wb") as file:
            if isinstance(content, bytes):
                file.write(content)
            else:
                np.save(file, content)
        honour_umask(temporary)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def honour_umask(path: str | Path) -> None:
    """Give a file made by mkstemp (always 0600) the mode a plain open would have: 0666 less the umask."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, 0o666 & ~mask)
