"""What of a config never leaves the job in clear: secret-looking keys masked, credentials dropped
from URIs. The job's record (job_record.py), config.yaml, the run's params and every log line
that shows a tracking URI go through here."""
from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

SECRET_NAME = re.compile(r"(TOKEN|KEYS?|PASSWORDS?|SECRETS?|CREDENTIALS?)$", re.IGNORECASE)
"""A key naming a credential (hf_token, api_key, password). A count of tokens (train.batch_tokens,
max_tokens) is plural: masking it would hide a setting from config.yaml and from resume's comparison."""


def redact(value: str) -> str:
    """Drop credentials from a URI-looking string (user:password@host)."""
    if "://" not in value or "@" not in value:
        return value
    parts = urlsplit(value)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"***@{host}"))


def redact_config(value: Any, key: str = "") -> Any:
    """A copy of a (nested) config with secret-looking keys masked and URI credentials dropped."""
    if isinstance(value, dict):
        return {k: redact_config(v, k) for k, v in value.items()}
    if SECRET_NAME.search(key) and value is not None:
        return "***"
    return redact(value) if isinstance(value, str) else value
