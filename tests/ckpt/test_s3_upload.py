"""Checkpoint uploads against a local S3-compatible server (moto's, on the loopback): multipart parts of the
chunk size with the ETag S3's rule gives (the MD5 of the parts' MD5s, "-", the count: worked here from that
rule, not from nxd's code), the bytes read back equal, and a server that is gone or a folder removed before its
upload reported without raising."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from nxd_ckpt import CheckpointUploader, S3Target

BUCKET = "checkpoints"
MIB = 2**20


@pytest.fixture
def s3_server(monkeypatch):
    """A moto S3 server on 127.0.0.1 with one bucket; boto3 pointed at it by AWS_ENDPOINT_URL."""
    import boto3
    from moto.server import ThreadedMotoServer

    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(name, raising=False)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{host}:{port}")
    client = boto3.client("s3")
    client.create_bucket(Bucket=BUCKET)
    yield server, client
    server.stop()


def _etag_by_the_rule(data: bytes, chunk: int) -> str:
    parts = [data[start : start + chunk] for start in range(0, len(data), chunk)] or [b""]
    return f"{hashlib.md5(b''.join(hashlib.md5(part).digest() for part in parts)).hexdigest()}-{len(parts)}"


def _checkpoint(tmp_path: Path) -> dict[str, bytes]:
    files = {"shard.distcp": os.urandom(12 * MIB + 5), "nested/marker.json": b'{"step": 2}', "empty": b""}
    for name, data in files.items():
        (tmp_path / "step=2" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "step=2" / name).write_bytes(data)
    return files


def test_each_file_goes_up_in_parts_with_its_digest(tmp_path, s3_server):
    _, client = s3_server
    files, said = _checkpoint(tmp_path), []
    uploader = CheckpointUploader(S3Target(f"s3://{BUCKET}/runs", chunk_size=5 * MIB), "tiny", said.append)
    uploader.submit(tmp_path / "step=2")
    assert uploader.close() == []
    for name, data in files.items():
        key = f"runs/tiny/step=2/{name}"
        head = client.head_object(Bucket=BUCKET, Key=key)
        assert head["ETag"].strip('"') == _etag_by_the_rule(data, 5 * MIB), name
        assert client.get_object(Bucket=BUCKET, Key=key)["Body"].read() == data, name
    assert _etag_by_the_rule(files["shard.distcp"], 5 * MIB).endswith("-3")  # 5 + 5 + 2 MiB
    assert said == [said[0]] and said[0].startswith(
        "s3: checkpoint step=2 uploaded to s3://checkpoints/runs/tiny/step=2/ (3 files, 12.0 MiB, digests checked)"
    )


def test_a_stopped_server_is_reported_after_the_retries(tmp_path, s3_server):
    server, _ = s3_server
    _checkpoint(tmp_path)
    server.stop()
    said = []
    uploader = CheckpointUploader(S3Target(f"s3://{BUCKET}", chunk_size=5 * MIB, retry_wait=0.01), "tiny", said.append)
    uploader.submit(tmp_path / "step=2")
    assert uploader.close() == ["step=2"]
    assert len(said) == 1 and said[0].startswith(f"s3: checkpoint step=2 was not uploaded to s3://{BUCKET}: ")
    assert "(tried 3 times)" in said[0]


def test_a_folder_removed_before_its_upload_is_reported(tmp_path, s3_server):
    said = []
    uploader = CheckpointUploader(S3Target(f"s3://{BUCKET}", chunk_size=5 * MIB), "tiny", said.append)
    uploader.submit(tmp_path / "step=4")  # retention removed it before the thread came to it
    assert uploader.close() == ["step=4"]
    assert said == [
        f"s3: checkpoint step=4 was not uploaded to s3://{BUCKET}: its folder was removed locally before "
        "it was uploaded (the checkpoint retention deleted it)"
    ]


def test_the_marker_goes_up_last_and_huge_files_in_larger_parts(tmp_path, s3_server):
    """A copy interrupted before the end lacks the completion marker, so it reads as half written; a file beyond
    10,000 parts of the chunk size (S3's limit) goes up in parts of size / 10,000, rounded up."""
    from nxd_ckpt.marker import MARKER
    from nxd_ckpt.s3_upload import part_size

    _, client = s3_server
    (tmp_path / "step=2").mkdir()
    for name in ("a.distcp", MARKER, "z.distcp"):
        (tmp_path / "step=2" / name).write_bytes(name.encode())
    uploader = CheckpointUploader(S3Target(f"s3://{BUCKET}", chunk_size=5 * MIB), "tiny", lambda line: None)
    order = []
    real = uploader._upload
    uploader._upload = lambda file, key: (order.append(file.name), real(file, key))[1]
    uploader.submit(tmp_path / "step=2")
    assert uploader.close() == [] and order == ["a.distcp", "z.distcp", MARKER]
    assert part_size(60 * 2**30, 5 * MIB) == -(-60 * 2**30 // 10_000) > 5 * MIB
    assert part_size(12 * MIB, 5 * MIB) == 5 * MIB
