"""kafka-python's configuration names: which ones mean something here, and the check for the rest.

A Kafka user's ``KafkaProducer(**configs)`` / ``KafkaConsumer(**configs)`` /
``KafkaAdminClient(**configs)`` must run with
``root=`` added and nothing else changed, so every name kafka-python (2.x) knows is
accepted. The names that describe a network, a broker or its security cannot mean
anything on one machine and are accepted and ignored; a name kafka-python does not know
is a typo, and a typo that is silently ignored is a bug that hides: it is a ConfigError
naming the closest known name. The README's "Coming from Kafka" table says what each
honoured name does here.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypedDict

from ..errors import ConfigError

# The names are keys of TypedDicts, so that a type checker reports a misspelt one in a user's
# ``Producer(...)`` / ``Consumer(...)`` (``**configs: Unpack[ProducerConfigs]``), and the sets
# the run-time check uses are made from the same keys: one list of names.


class _Network(TypedDict, total=False):
    """Names about connections, brokers, security, metrics reporting and request retries: no
    meaning without a broker (``metadata_max_age_ms`` is one too, but the consumer honours it)."""

    api_version: Any
    api_version_auto_timeout_ms: Any
    bootstrap_servers: Any
    connections_max_idle_ms: Any
    kafka_client: Any
    max_in_flight_requests_per_connection: Any
    metric_reporters: Any
    metrics_enabled: Any
    metrics_num_samples: Any
    metrics_sample_window_ms: Any
    receive_buffer_bytes: Any
    reconnect_backoff_max_ms: Any
    reconnect_backoff_ms: Any
    request_timeout_ms: Any
    retry_backoff_ms: Any
    sasl_kerberos_domain_name: Any
    sasl_kerberos_name: Any
    sasl_kerberos_service_name: Any
    sasl_mechanism: Any
    sasl_oauth_token_provider: Any
    sasl_plain_password: Any
    sasl_plain_username: Any
    security_protocol: Any
    selector: Any
    send_buffer_bytes: Any
    sock_chunk_buffer_count: Any
    sock_chunk_bytes: Any
    socket_options: Any
    socks5_proxy: Any
    ssl_cafile: Any
    ssl_certfile: Any
    ssl_check_hostname: Any
    ssl_ciphers: Any
    ssl_context: Any
    ssl_crlfile: Any
    ssl_keyfile: Any
    ssl_password: Any


class _ProducerIgnored(_Network, total=False):
    """KafkaProducer's names with no meaning here, beyond the network's."""

    metadata_max_age_ms: Any
    bootstrap_topics_filter: Any  # which topics' metadata to prefetch: there is no metadata to fetch
    delivery_timeout_ms: int  # a send is written (or fails) at once; there is no delivery to time out
    enable_idempotence: bool  # each send is appended exactly once already: no retries that could duplicate
    max_block_ms: int  # send never waits for metadata or buffer space
    retries: int  # nothing to retry: there is no request that can fail transiently


class ProducerConfigs(_ProducerIgnored, total=False):
    """Every kafka-python KafkaProducer name ``Producer`` takes beyond its own arguments: the
    ignored ones, and those it honours through ``**configs`` (the README's table says how)."""

    acks: int | str
    allow_auto_create_topics: bool
    client_id: str | None
    compression_type: str | None
    max_request_size: int
    transaction_timeout_ms: int
    transactional_id: str | None


class _ConsumerIgnored(_Network, total=False):
    """KafkaConsumer's names with no meaning here, beyond the network's."""

    allow_auto_create_topics: bool  # a consumer never creates topics here
    check_crcs: bool  # always checked: every frame's CRC32C is verified on read
    enable_incremental_fetch_sessions: bool
    exclude_internal_topics: bool  # there are no internal topics: groups live in ROOT/.groups, not a topic
    fetch_max_wait_ms: int
    fetch_min_bytes: int
    metric_group_prefix: str


class ConsumerConfigs(_ConsumerIgnored, total=False):
    """Every kafka-python KafkaConsumer name ``Consumer`` takes beyond its own arguments: the
    ignored ones, and those it honours through ``**configs``."""

    client_id: str | None
    default_offset_commit_callback: Callable[..., Any] | None
    fetch_max_bytes: int
    group_instance_id: str | None
    isolation_level: str
    max_partition_fetch_bytes: int
    max_poll_interval_ms: int
    metadata_max_age_ms: int
    partition_assignment_strategy: Sequence[Any]


_NETWORK = _Network.__optional_keys__ | {"metadata_max_age_ms"}
PRODUCER_IGNORED = _ProducerIgnored.__optional_keys__
CONSUMER_IGNORED = _ConsumerIgnored.__optional_keys__

# KafkaAdminClient's names: all of them about a network or this client's name; none means anything here.
ADMIN_IGNORED = _NETWORK | {"client_id"}


def check_names(kind: str, configs: Mapping[str, Any], ignored: frozenset[str], honoured: tuple[str, ...]) -> None:
    """ConfigError for a name in ``configs`` that kafka-python's ``kind`` does not know."""
    known = ignored | set(honoured)
    for name in configs:
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{kind} has no setting {name!r}{hint} (the README's 'Coming from Kafka' table lists them)")
