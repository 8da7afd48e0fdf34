"""Writing a file so that readers see the old content or the complete new one, never half of it."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import numpy as np


def new_temporary(directory: Path, prefix: str) -> tuple[int, str]:
    """A new file under a fresh random name in `directory` (an open descriptor and its path), created as a
    plain open creates files: mode 0666 less the umask, which the kernel applies (tempfile.mkstemp makes every
    file 0600, so a data set written for others to read would not be)."""
    while True:
        temporary = os.path.join(directory, f"{prefix}{secrets.token_hex(6)}")
        try:
            return os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666), temporary
        except FileExistsError:
            continue


def save_atomically(path: Path, content: np.ndarray | bytes) -> None:
    """Write `content` (raw bytes, or an array as .npy) to a temporary name beside `path`, then rename."""
    handle, temporary = new_temporary(path.parent, f".{path.name}.")
    try:
        with os.fdopen(handle, "wb") as file:
            if isinstance(content, bytes):
                file.write(content)
            else:
                np.save(file, content)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
