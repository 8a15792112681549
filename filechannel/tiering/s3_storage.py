"""Chunk storage in an S3 bucket (``s3://bucket/prefix``) through botocore (boto3's core): AWS or any S3-compatible endpoint.

The object ``a/b`` is the key ``prefix/a/b``. What each operation does, and why:

- ``write``: one ``put_object`` up to ``multipart_threshold`` bytes, else a multipart upload of
  ``part_size`` parts (``max_concurrency`` in flight), aborted if any step fails. Both are
  atomic in S3: the key shows the old object or the whole new one.
- ``create_new``: one ``put_object`` with ``If-None-Match: *`` whatever the size (up to S3's 5 GiB
  for one PUT; a conditional create is for small control objects): the server refuses an existing
  key with 412 ``PreconditionFailed`` (False), atomically (``atomic_create``). A 409
  ``ConditionalRequestConflict`` (AWS: another conditional write to the key in flight) is tried
  again after a jittered wait, up to ``max_attempts`` times. SeaweedFS refuses an existing key too.
- ``read``: a ranged GET (``Range: bytes=a-b``). botocore retries a request that fails before its
  response, but not a body cut half-way; the reader then asks again from the byte it reached,
  with ``If-Match`` on the first answer's ETag (so a replaced object is never stitched to the old
  one), up to ``max_attempts`` consecutive failures without progress, waiting with full jitter.
  A range at or past the end (HTTP 416) is an empty result.
- ``concat``: a multipart upload whose parts are copied server side (``upload_part_copy``) from
  sources of at least 5 MiB; smaller pieces are read and uploaded as part data, merged with
  their neighbours so that every part but the last is at least 5 MiB (S3's rule).
  The sources stay. No ``append`` or ``truncate`` (S3 objects are immutable).
- ``delete`` of a missing key succeeds (S3 answers 204); ``list`` pages ``list_objects_v2``.

Credentials come from the options or boto3's usual chain; they are handed to botocore and never kept
in an attribute of ours, printed (``repr`` shows the URL) or logged. Every boto3/botocore error is
translated into filechannel's hierarchy with the operation, the bucket and key, the endpoint and
the server's error code. The client is thread-safe, and so is this class.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

import botocore.exceptions as bce
import botocore.loaders
import botocore.session
import urllib3.exceptions
from botocore.config import Config

from ..engine.clock import datetime_ms
from ..errors import (
    AccessDeniedError,
    ConfigError,
    ObjectNotFoundError,
    StorageFullError,
    StorageUnavailableError,
    TierError,
)
from .retry import Backoff
from .storage import ChunkStorage, ObjectInfo, is_valid_name, log, redact_url

if TYPE_CHECKING:  # boto3-stubs[s3] (the dev extra)
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import GetObjectRequestTypeDef, HeadObjectOutputTypeDef, UploadPartCopyRequestTypeDef

MIN_PART = 5 << 20  # S3: every part of a multipart upload but the last is at least 5 MiB
MAX_PART = 5 << 30  # S3: a part (and a copied range) is at most 5 GiB
_READ_CHUNK = 1 << 20
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")

_NOT_FOUND = {"NoSuchKey", "404", "NotFound", "NoSuchUpload"}
_DENIED = {
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "403",
    "Forbidden",
    "AllAccessDisabled",
    "ExpiredToken",
    "InvalidToken",
    "TokenRefreshRequired",
    "AccountProblem",
}
_FULL = {"EntityTooLarge", "QuotaExceeded", "XMinioStorageFull", "StorageFull", "InsufficientStorage", "507"}
_UNAVAILABLE = {"SlowDown", "ServiceUnavailable", "Throttling", "ThrottlingException", "RequestTimeout", "InternalError"}
# A response body that breaks half-way: botocore does not retry these, the reader resumes.
_BODY_ERRORS = (
    bce.ResponseStreamingError,
    bce.IncompleteReadError,
    bce.ReadTimeoutError,
    bce.ConnectionClosedError,
    urllib3.exceptions.HTTPError,
    OSError,
)
_UNREACHABLE = (bce.EndpointConnectionError, bce.ConnectionError, bce.ResponseStreamingError, urllib3.exceptions.HTTPError)


class _MissingBucket(Exception):
    """A HEAD answered 404 and the bucket itself is missing (translated with the operation and object)."""


@dataclass(frozen=True)
class Piece:
    """Bytes ``[start, end)`` of source number ``source`` of a concat."""

    source: int
    start: int
    end: int


@dataclass(frozen=True)
class Part:
    """One part of a concat's multipart upload: copied server side (one piece) or read and uploaded."""

    copy: bool
    pieces: tuple[Piece, ...]

    @property
    def length(self) -> int:
        return sum(p.end - p.start for p in self.pieces)


def plan_concat(sizes: list[int], min_part: int = MIN_PART, max_part: int = MAX_PART) -> list[Part]:
    """The parts that concatenate sources of ``sizes``, in order, with S3's part rules.

    Invariants: the pieces of all parts, in order, are exactly the sources' bytes in order;
    every part but the last is at least ``min_part`` bytes and at most ``max_part``; a copied
    part is a single range of a source of at least ``min_part`` bytes. Pieces smaller than
    ``min_part`` are gathered into data parts of exactly ``min_part`` bytes (topped up from the
    start of the next source), so no more than ``min_part`` bytes are ever held in memory.
    Needs ``max_part >= 2 * min_part`` (S3: 5 GiB and 5 MiB), so even parts are never too small.
    """
    parts: list[Part] = []
    pending: list[Piece] = []
    pending_bytes = 0
    for index, size in enumerate(sizes):
        pos = 0
        if pending and size:
            take = min(size, min_part - pending_bytes)
            pending.append(Piece(index, 0, take))
            pending_bytes += take
            pos = take
            if pending_bytes == min_part:
                parts.append(Part(False, tuple(pending)))
                pending, pending_bytes = [], 0
        remaining = size - pos
        if remaining >= min_part:  # pending is empty here: a top-up either completed it or took all of this source
            # Parts as even as can be: a ceil-sized step could leave a last piece below min_part.
            count = math.ceil(remaining / max_part)
            even, extra = divmod(remaining, count)
            for k in range(count):
                end = pos + even + (k < extra)
                parts.append(Part(True, (Piece(index, pos, end),)))
                pos = end
        elif remaining:
            pending.append(Piece(index, pos, size))
            pending_bytes += remaining
    if pending:
        parts.append(Part(False, tuple(pending)))
    return parts


def _code(exc: bce.ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _status(exc: bce.ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def _millis(when: object) -> int | None:
    """A ``LastModified`` datetime as milliseconds since the epoch (None if absent)."""
    return datetime_ms(when, naive_is_utc=True) if isinstance(when, datetime) else None


def _positive(value: object, what: str, minimum: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"{what} must be an int >= {minimum}, not {value!r}")
    return value


@functools.cache
def _model_loader() -> botocore.loaders.Loader:
    """botocore's reader of its model files (S3's API, endpoints), shared by every client made here:
    it keeps what it parsed, where a session of its own read and parsed them again for each client,
    most of the cost of opening a storage (DESIGN.md, s3_storage.py). It holds no credential."""
    return botocore.loaders.create_loader()


class S3Storage(ChunkStorage):
    """Objects under ``prefix/`` in one S3 bucket (see the module docstring for how each operation behaves).

    Options:
        endpoint_url: an S3-compatible endpoint (path-style addressing is used with it); None for AWS.
        region_name: the region; "us-east-1" by default when an endpoint is given.
        aws_access_key_id, aws_secret_access_key, aws_session_token: credentials; None for boto3's chain.
        max_attempts: tries of one request (botocore's "standard" retries: throttling, 5xx, connection
            errors) and consecutive tries without progress of a read whose body breaks (default 5).
        multipart_threshold: objects above this many bytes are uploaded in parts (default 64 MiB).
        part_size: bytes per part, 5 MiB to 5 GiB (default 16 MiB).
        max_concurrency: parts uploaded at once (default 4).
        connect_timeout, read_timeout: seconds (default 10 and 60).
    """

    supports_concat = True
    atomic_create = True

    _OPTIONS = frozenset(
        {
            "endpoint_url",
            "region_name",
            "aws_access_key_id",
            "aws_secret_access_key",
            "aws_session_token",
            "max_attempts",
            "multipart_threshold",
            "part_size",
            "max_concurrency",
            "connect_timeout",
            "read_timeout",
        }
    )

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region_name: str | None = None,
        aws_access_key_id: str | None = None,
        aws_secret_access_key: str | None = None,
        aws_session_token: str | None = None,
        max_attempts: int = 5,
        multipart_threshold: int = 64 << 20,
        part_size: int = 16 << 20,
        max_concurrency: int = 4,
        connect_timeout: float = 10.0,
        read_timeout: float = 60.0,
    ) -> None:
        if not isinstance(bucket, str) or not _BUCKET.fullmatch(bucket):
            raise ConfigError(f"S3 bucket name {bucket!r} is not valid: 3 to 63 characters of [a-z0-9.-]")
        prefix = prefix.strip("/")
        if prefix and not is_valid_name(prefix):
            raise ConfigError(f"S3 prefix {prefix!r} is not valid: '/'-separated segments of [A-Za-z0-9._=-]")
        super().__init__(f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}")
        self.bucket = bucket
        self.prefix = prefix
        self.endpoint = redact_url(endpoint_url) if endpoint_url else "AWS (or boto3's configured endpoint)"
        self._backoff = Backoff(_positive(max_attempts, "max_attempts"))
        self._multipart_threshold = _positive(multipart_threshold, "multipart_threshold")
        self._part_size = _positive(part_size, "part_size", MIN_PART)
        if self._part_size > MAX_PART:
            raise ConfigError(f"part_size must be at most {MAX_PART} bytes (5 GiB), not {part_size}")
        if (aws_access_key_id is None) != (aws_secret_access_key is None):
            raise ConfigError(
                "give aws_access_key_id and aws_secret_access_key together, or neither (boto3's chain: environment, ~/.aws)"
            )
        self._max_concurrency = _positive(max_concurrency, "max_concurrency")
        for value, what in ((connect_timeout, "connect_timeout"), (read_timeout, "read_timeout")):
            if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{what} must be a number of seconds > 0, not {value!r}")
        if endpoint_url and not region_name:
            region_name = "us-east-1"
        config = Config(
            retries={"mode": "standard", "total_max_attempts": max_attempts},
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            max_pool_connections=max(10, 2 * max_concurrency),
            s3={"addressing_style": "path"} if endpoint_url else None,
        )
        try:
            # The credentials go to botocore only: the session is not kept, and nothing of ours holds them.
            session = botocore.session.get_session()
            session.register_component("data_loader", _model_loader())
            self._client = cast(
                "S3Client",
                session.create_client(
                    "s3",
                    region_name=region_name,
                    endpoint_url=endpoint_url,
                    aws_access_key_id=aws_access_key_id,
                    aws_secret_access_key=aws_secret_access_key,
                    aws_session_token=aws_session_token,
                    config=config,
                ),
            )
        except (bce.BotoCoreError, ValueError) as exc:
            raise ConfigError(f"cannot make an S3 client for {self.url} at {self.endpoint}: {exc}") from None
        # Where requests really go: without endpoint_url, boto3 may take one from AWS_ENDPOINT_URL
        # or ~/.aws/config, and an error saying "at AWS" would send the user to the wrong server.
        self.endpoint = redact_url(self._client.meta.endpoint_url)
        self._bucket_checked = False

    @classmethod
    def from_url(cls, url: str, **options: Any) -> S3Storage:
        """``s3://bucket`` or ``s3://bucket/prefix``; credentials in the URL are refused."""
        unknown = set(options) - cls._OPTIONS
        if unknown:
            raise ConfigError(f"unknown option(s) {sorted(unknown)} for {redact_url(url)}: use {sorted(cls._OPTIONS)}")
        parts = urlsplit(url)
        if "@" in parts.netloc:
            raise ConfigError(
                f"{redact_url(url)}: credentials do not belong in the URL; give them through boto3's chain "
                "(AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the environment, ~/.aws, an instance profile)"
            )
        if parts.query or parts.fragment or not parts.netloc:
            raise ConfigError(f"storage URL {url!r} is not valid: use s3://bucket or s3://bucket/prefix")
        return cls(parts.netloc, parts.path, **options)

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    # -- operations -----------------------------------------------------------------------------------

    def _head(self, name: str) -> HeadObjectOutputTypeDef:
        try:
            return self._client.head_object(Bucket=self.bucket, Key=self._key(name))
        except bce.ClientError as exc:
            if _code(exc) in _NOT_FOUND:
                self._check_bucket()  # a HEAD answers a bare 404 for a missing bucket too
            raise

    def _check_bucket(self) -> None:
        if self._bucket_checked:
            return
        try:
            self._client.head_bucket(Bucket=self.bucket)
        except bce.ClientError as exc:
            if _code(exc) in _NOT_FOUND | {"NoSuchBucket"}:
                raise _MissingBucket from None
            raise
        self._bucket_checked = True

    def _no_bucket_message(self) -> str:
        return f"the bucket {self.bucket!r} does not exist at {self.endpoint}: create it or fix the URL {self.url}"

    def _do_exists(self, name: str) -> bool:
        try:
            self._head(name)
        except bce.ClientError as exc:
            if _code(exc) in _NOT_FOUND:
                return False
            raise
        return True

    def _do_info(self, name: str) -> ObjectInfo:
        head = self._head(name)
        return ObjectInfo(name, int(head["ContentLength"]), _millis(head.get("LastModified")))

    def _do_read(self, name: str, offset: int, length: int) -> bytes:
        return self._read_key(self._key(name), offset, length)

    def _read_key(self, key: str, offset: int, length: int, etag: str | None = None) -> bytes:
        """Bytes ``[offset, offset + length)`` of ``key`` (fewer at the end), resuming a body cut half-way."""
        chunks: list[bytes] = []
        got = 0
        failures = 0
        last = offset + length - 1
        while True:
            request: GetObjectRequestTypeDef = {"Bucket": self.bucket, "Key": key, "Range": f"bytes={offset + got}-{last}"}
            if etag:
                request["IfMatch"] = etag
            try:
                response = self._client.get_object(**request)
            except bce.ClientError as exc:
                if _code(exc) == "InvalidRange" and not got:  # HTTP 416: the range starts at or past the end
                    return b""
                raise
            etag = response.get("ETag") or etag
            body = response["Body"]
            before = got
            try:
                while chunk := body.read(_READ_CHUNK):
                    chunks.append(chunk)
                    got += len(chunk)
                return b"".join(chunks)
            except _BODY_ERRORS as exc:
                failures = 0 if got > before else failures + 1
                if failures >= self._backoff.attempts:
                    raise
                log.debug("tier read %s %r: body cut at byte %d (%s), resuming", self.url, key, offset + got, exc)
                self._backoff.sleep(max(failures, 1))
            finally:
                body.close()

    def _do_list(self, prefix: str) -> list[ObjectInfo]:
        root = f"{self.prefix}/" if self.prefix else ""
        found = []
        for page in self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=root + prefix):
            for item in page.get("Contents", ()):
                name = item["Key"][len(root) :]
                if is_valid_name(name):
                    found.append(ObjectInfo(name, int(item["Size"]), _millis(item.get("LastModified"))))
        return found

    def _do_delete(self, name: str) -> None:
        self._client.delete_object(Bucket=self.bucket, Key=self._key(name))

    def _do_write(self, name: str, data: memoryview) -> None:
        key = self._key(name)
        if len(data) <= self._multipart_threshold:
            self._client.put_object(Bucket=self.bucket, Key=key, Body=bytes(data))
            return
        ranges = [(start, min(start + self._part_size, len(data))) for start in range(0, len(data), self._part_size)]
        self._multipart(key, len(ranges), lambda number, upload_id: self._upload_part(key, upload_id, number, data, ranges))

    def _do_create_new(self, name: str, data: memoryview) -> bool:
        if len(data) > MAX_PART:
            raise ConfigError(
                f"cannot create_new {name!r} in {self.url}: {len(data)} bytes is more than one S3 PUT takes (5 GiB); "
                "a conditional create is for small control objects"
            )
        body = bytes(data)
        failures = 0
        while True:
            try:
                self._client.put_object(Bucket=self.bucket, Key=self._key(name), Body=body, IfNoneMatch="*")
                return True
            except bce.ClientError as exc:
                if _code(exc) == "PreconditionFailed" or _status(exc) == 412:
                    return False
                if _code(exc) != "ConditionalRequestConflict" or failures + 1 >= self._backoff.attempts:
                    raise
                failures += 1
                log.debug("tier create_new %s %r: a concurrent conditional write (409), trying again", self.url, name)
                self._backoff.sleep(failures)

    def _upload_part(self, key: str, upload_id: str, number: int, data: memoryview, ranges: list[tuple[int, int]]) -> str:
        start, end = ranges[number - 1]
        response = self._client.upload_part(
            Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=bytes(data[start:end])
        )
        return response["ETag"]

    def _multipart(self, key: str, count: int, upload: Callable[[int, str], str], concurrency: int | None = None) -> None:
        """One multipart upload of ``count`` parts, ``upload(number, upload_id) -> etag`` each; aborted on failure."""
        upload_id = self._client.create_multipart_upload(Bucket=self.bucket, Key=key)["UploadId"]
        try:
            numbers = range(1, count + 1)
            workers = min(concurrency or self._max_concurrency, count)
            if workers > 1:
                with ThreadPoolExecutor(workers, thread_name_prefix="filechannel-s3-part") as pool:
                    etags = list(pool.map(lambda n: upload(n, upload_id), numbers))
            else:
                etags = [upload(n, upload_id) for n in numbers]
            self._client.complete_multipart_upload(
                Bucket=self.bucket,
                Key=key,
                UploadId=upload_id,
                MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e} for n, e in zip(numbers, etags, strict=True)]},
            )
        except BaseException:
            try:
                self._client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
            except Exception as exc:  # the original error matters more; a lifecycle rule cleans the rest
                log.debug("tier %s: cannot abort the multipart upload of %r: %s", self.url, key, exc)
            raise

    def _do_concat(self, target: str, sources: list[str]) -> None:
        heads = []
        for source in sources:
            try:
                heads.append(self._head(source))
            except bce.ClientError as exc:
                if _code(exc) in _NOT_FOUND:
                    raise ObjectNotFoundError(f"cannot concat into {target!r} in {self.url}: no source {source!r}") from None
                raise
        keys = [self._key(s) for s in sources]
        etags = [h.get("ETag") for h in heads]
        parts = plan_concat([int(h["ContentLength"]) for h in heads])

        def data_of(part: Part) -> bytes:
            return b"".join(self._read_key(keys[p.source], p.start, p.end - p.start, etags[p.source]) for p in part.pieces)

        key = self._key(target)
        if not any(part.copy for part in parts):  # at most one part of less than 5 MiB
            self._client.put_object(Bucket=self.bucket, Key=key, Body=b"".join(data_of(p) for p in parts))
            return

        def upload(number: int, upload_id: str) -> str:
            part = parts[number - 1]
            if not part.copy:
                return self._client.upload_part(
                    Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=data_of(part)
                )["ETag"]
            piece = part.pieces[0]
            request: UploadPartCopyRequestTypeDef = {
                "Bucket": self.bucket,
                "Key": key,
                "UploadId": upload_id,
                "PartNumber": number,
                "CopySource": {"Bucket": self.bucket, "Key": keys[piece.source]},
                "CopySourceRange": f"bytes={piece.start}-{piece.end - 1}",
            }
            if etag := etags[piece.source]:
                request["CopySourceIfMatch"] = etag
            response = self._client.upload_part_copy(**request)
            return response["CopyPartResult"]["ETag"]

        self._multipart(key, len(parts), upload, concurrency=1)  # sequential: data parts hold 5 MiB each

    def _do_close(self) -> None:
        self._client.close()

    # -- errors ---------------------------------------------------------------------------------------

    def _translate_error(self, exc: Exception, op: str, name: str) -> TierError | None:
        key = self._key(name) if name else self.prefix
        where = f"{op} {name!r} in {self.url} (key {key!r} of bucket {self.bucket!r} at {self.endpoint})"
        if isinstance(exc, bce.ClientError):
            code, status = _code(exc), _status(exc)
            message = exc.response.get("Error", {}).get("Message") or code
            said = f"{code}: {message}" if message != code else code
            if code == "NoSuchBucket":
                return TierError(f"cannot {where}: {self._no_bucket_message()}")
            if code in _NOT_FOUND and op == "list":  # a listing of a missing bucket, on some servers
                return TierError(f"cannot {where}: {self._no_bucket_message()}")
            if code in _NOT_FOUND:
                return ObjectNotFoundError(f"cannot {where}: no such object ({said})")
            if code == "PreconditionFailed":  # If-Match of a resumed read, or of a concat's source
                return TierError(f"cannot {where}: the object was replaced during the operation ({said}); do it again")
            if code == "ConditionalRequestConflict":  # 409: still conflicting after our own tries
                return StorageUnavailableError(
                    f"cannot {where}: concurrent conditional writes to the key kept conflicting ({said}); retry later"
                )
            if code in _FULL or status == 507:  # before 403: a quota can be refused with a 403
                return StorageFullError(f"cannot {where}: the storage is full or over quota ({said})")
            if code in _DENIED or status == 403:
                return AccessDeniedError(f"cannot {where}: access denied ({said}); check the credentials and the bucket policy")
            if code in _UNAVAILABLE or status >= 500:
                return StorageUnavailableError(f"cannot {where}: the server kept failing after retries ({said}); retry later")
            if code == "InvalidBucketName":
                return TierError(f"cannot {where}: the bucket name is refused by the server ({said})")
            return TierError(f"cannot {where}: {said}")
        if isinstance(exc, _MissingBucket):
            return TierError(f"cannot {where}: {self._no_bucket_message()}")
        if isinstance(exc, bce.NoCredentialsError | bce.PartialCredentialsError):
            return AccessDeniedError(
                f"cannot {where}: no usable credentials; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                "or configure boto3's chain (~/.aws, an instance profile)"
            )
        if isinstance(exc, _UNREACHABLE + _BODY_ERRORS):
            return StorageUnavailableError(f"cannot {where}: the storage is unreachable after retries ({exc}); retry later")
        if isinstance(exc, bce.BotoCoreError):
            return TierError(f"cannot {where}: {exc}")
        return None
