"""Complete checkpoints copied to S3 in the background (GPT-NeoX's s3_path and s3_chunk_size).

Each file of a checkpoint goes up as a multipart upload in parts of `chunk_size` bytes, under
`<s3 url>/<run folder>/<checkpoint folder>/<file>` (NeoX's layout: the save folder's name, then the
checkpoint's). After each upload the object's ETag is checked against the one S3 computes for those
parts (the MD5 of the parts' MD5s, then "-" and their count), so a part that arrived damaged fails the
upload. A failed file is tried again `attempts` times in all, waiting longer each time; a checkpoint that
still fails, or whose folder retention removed first, is reported and training goes on. boto3 finds
credentials and the endpoint as usual (AWS_* variables, ~/.aws, AWS_ENDPOINT_URL for S3-compatible
servers); it is the optional extra nxd-ckpt[s3].
"""

from __future__ import annotations

import contextlib
import hashlib
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from .marker import MARKER

MAX_PARTS = 10_000
"""S3's most parts in one upload: a file larger than chunk_size x this goes up in larger parts."""


@dataclass(frozen=True)
class S3Target:
    """Where checkpoints go: `url` is s3://bucket[/prefix]; parts of `chunk_size` bytes."""

    url: str
    chunk_size: int = 104_857_600
    attempts: int = 3
    retry_wait: float = 1.0

    @property
    def bucket(self) -> str:
        return urlparse(self.url).netloc

    @property
    def prefix(self) -> str:
        return urlparse(self.url).path.strip("/")


def part_size(size: int, chunk_size: int) -> int:
    """`chunk_size`, or larger where a file of `size` bytes would need more than S3's 10,000 parts."""
    return max(chunk_size, -(-size // MAX_PARTS))


def multipart_etag(path: Path, chunk_size: int) -> str:
    """The ETag S3 gives `path` uploaded in parts of `chunk_size` bytes: the MD5 of the parts' MD5s, "-", and
    how many parts there are (an empty file is one empty part)."""
    digests = []
    with path.open("rb") as file:
        while chunk := file.read(chunk_size):
            digests.append(hashlib.md5(chunk).digest())
    digests = digests or [hashlib.md5(b"").digest()]
    return f"{hashlib.md5(b''.join(digests)).hexdigest()}-{len(digests)}"


class CheckpointUploader:
    """A background thread that uploads each checkpoint handed to `submit`, in order; `close` waits for the
    ones queued. `say` tells what happened to each (uploaded, or not and why)."""

    def __init__(self, target: S3Target, run_name: str, say: Callable[[str], None], client: Any = None):
        self.target, self.run_name, self.say = target, run_name, say
        self.client = client if client is not None else _client()
        self.failed: list[str] = []
        self._pending: list[str] = []
        self._lock = threading.Lock()
        self._queue: queue.Queue[Path | None] = queue.Queue()
        self._thread = threading.Thread(target=self._work, name="nxd-s3-upload", daemon=True)
        self._thread.start()

    def submit(self, checkpoint: Path) -> None:
        with self._lock:
            self._pending.append(checkpoint.name)
        self._queue.put(checkpoint)

    @property
    def pending(self) -> list[str]:
        """The checkpoints queued or uploading now."""
        with self._lock:
            return list(self._pending)

    def close(self) -> list[str]:
        """Wait for every queued checkpoint; the names of those not uploaded."""
        self._queue.put(None)
        self._thread.join()
        return self.failed

    def remote(self, checkpoint: Path, file: Path) -> str:
        parts = [self.target.prefix, self.run_name, checkpoint.name, file.relative_to(checkpoint).as_posix()]
        return "/".join(part for part in parts if part)

    def _work(self) -> None:
        while (checkpoint := self._queue.get()) is not None:
            try:
                self._upload_checkpoint(checkpoint)
            except Exception as error:  # noqa: BLE001 - whatever happens, later checkpoints still go up
                self.failed.append(checkpoint.name)
                self.say(f"s3: checkpoint {checkpoint.name} was not uploaded to {self.target.url}: {error}")
            finally:
                with self._lock:
                    self._pending.remove(checkpoint.name)

    def _upload_checkpoint(self, checkpoint: Path) -> None:
        """Every file of `checkpoint`, its completion marker last (a copy without it reads as half written)."""
        started = time.monotonic()
        if not checkpoint.is_dir():
            raise UploadError(
                "its folder was removed locally before it was uploaded (the checkpoint retention deleted it)"
            )
        files = sorted(
            (path for path in checkpoint.rglob("*") if path.is_file()),
            key=lambda path: (path.name == MARKER, path.relative_to(checkpoint).as_posix()),
        )
        size = sum(file.stat().st_size for file in files) / 2**20
        for file in files:
            self._upload_with_retries(checkpoint, file)
        where = "/".join(part for part in (self.target.prefix, self.run_name, checkpoint.name) if part)
        self.say(
            f"s3: checkpoint {checkpoint.name} uploaded to s3://{self.target.bucket}/{where}/ ({len(files)} "
            f"files, {size:.1f} MiB, digests checked) in {time.monotonic() - started:.1f} s"
        )

    def _upload_with_retries(self, checkpoint: Path, file: Path) -> None:
        for attempt in range(1, self.target.attempts + 1):
            try:
                self._upload(file, self.remote(checkpoint, file))
                return
            except FileNotFoundError:
                raise UploadError(
                    f"{file.relative_to(checkpoint)} was removed locally before it was uploaded (the "
                    "checkpoint retention deleted it)"
                ) from None
            except Exception as error:  # noqa: BLE001 - botocore's, urllib3's and our own errors alike
                if attempt == self.target.attempts:
                    raise UploadError(f"{file.relative_to(checkpoint)}: {error} (tried {attempt} times)") from None
                time.sleep(self.target.retry_wait * 2 ** (attempt - 1))

    def _upload(self, file: Path, key: str) -> None:
        bucket, chunk = self.target.bucket, part_size(file.stat().st_size, self.target.chunk_size)
        upload = self.client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
        try:
            parts = []
            with file.open("rb") as handle:
                number = 1
                while (data := handle.read(chunk)) or number == 1:
                    answer = self.client.upload_part(
                        Bucket=bucket, Key=key, UploadId=upload, PartNumber=number, Body=data
                    )
                    parts.append({"ETag": answer["ETag"], "PartNumber": number})
                    number += 1
                    if not data:
                        break
            self.client.complete_multipart_upload(
                Bucket=bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": parts}
            )
        except BaseException:
            with contextlib.suppress(Exception):  # the server may be the reason: the failure is the news
                self.client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload)
            raise
        found = self.client.head_object(Bucket=bucket, Key=key)["ETag"].strip('"')
        expected = multipart_etag(file, chunk)  # S3's rule; servers that encrypt with KMS keys give other ETags
        if found != expected:
            raise UploadError(f"the uploaded object's digest {found} differs from the file's {expected}")


class UploadError(Exception):
    """A file did not reach S3 whole."""


def _client() -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client("s3", config=Config(connect_timeout=10, read_timeout=60, retries={"max_attempts": 2}))
