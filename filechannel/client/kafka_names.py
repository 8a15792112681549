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
from typing import Any

from ..errors import ConfigError

# Names about connections, brokers, security, metrics reporting and request retries: no meaning without a broker.
_NETWORK = frozenset(
    {
        "bootstrap_servers",
        "api_version",
        "api_version_auto_timeout_ms",
        "connections_max_idle_ms",
        "kafka_client",
        "max_in_flight_requests_per_connection",
        "metadata_max_age_ms",
        "metric_reporters",
        "metrics_enabled",
        "metrics_num_samples",
        "metrics_sample_window_ms",
        "receive_buffer_bytes",
        "reconnect_backoff_max_ms",
        "reconnect_backoff_ms",
        "request_timeout_ms",
        "retry_backoff_ms",
        "sasl_kerberos_domain_name",
        "sasl_kerberos_name",
        "sasl_kerberos_service_name",
        "sasl_mechanism",
        "sasl_oauth_token_provider",
        "sasl_plain_password",
        "sasl_plain_username",
        "security_protocol",
        "selector",
        "send_buffer_bytes",
        "sock_chunk_buffer_count",
        "sock_chunk_bytes",
        "socket_options",
        "socks5_proxy",
        "ssl_cafile",
        "ssl_certfile",
        "ssl_check_hostname",
        "ssl_ciphers",
        "ssl_context",
        "ssl_crlfile",
        "ssl_keyfile",
        "ssl_password",
    }
)

# KafkaProducer's names with no meaning here, beyond the network's.
PRODUCER_IGNORED = _NETWORK | {
    "bootstrap_topics_filter",  # which topics' metadata to prefetch: there is no metadata to fetch
    "delivery_timeout_ms",  # a send is written (or fails) at once; there is no delivery to time out
    "enable_idempotence",  # each send is appended exactly once already: no retries that could duplicate
    "max_block_ms",  # send never waits for metadata or buffer space
    "retries",  # nothing to retry: there is no request that can fail transiently
    "transaction_timeout_ms",  # only with transactional_id, which is refused
}

# KafkaConsumer's names with no meaning here, beyond the network's (metadata_max_age_ms is honoured).
CONSUMER_IGNORED = (_NETWORK - {"metadata_max_age_ms"}) | {
    "allow_auto_create_topics",  # a consumer never creates topics here
    "check_crcs",  # always checked: every frame's CRC32C is verified on read
    "enable_incremental_fetch_sessions",
    "exclude_internal_topics",  # there are no internal topics: groups live in ROOT/.groups, not a topic
    "fetch_max_wait_ms",
    "fetch_min_bytes",
    "metric_group_prefix",
}

# KafkaAdminClient's names: all of them about a network or this client's name; none means anything here.
ADMIN_IGNORED = _NETWORK | {"client_id"}


def check_names(kind: str, configs: dict[str, Any], ignored: frozenset[str], honoured: tuple[str, ...]) -> None:
    """ConfigError for a name in ``configs`` that kafka-python's ``kind`` does not know."""
    known = ignored | set(honoured)
    for name in configs:
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{kind} has no setting {name!r}{hint} (the README's 'Coming from Kafka' table lists them)")
