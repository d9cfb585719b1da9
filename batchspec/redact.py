"""Secrets kept out of everything batchspec writes or prints.

Two rules, applied at any depth of a document:

- every URL in a string loses its password (`scheme://user:***@host`, a user alone `scheme://***@host`) and the values of the query
  parameters that sign or authorize it (`X-Amz-Signature`, `X-Amz-Credential`,
  `X-Amz-Security-Token`, `X-Goog-Signature`, Azure SAS `sig`, `token`, `key`, ...), so a signed or
  authenticated INPUT, OUTPUT or model URL can be shown and stored but not replayed (`redact_text`);
- in a mapping of credentials (storage options, environment variables, LLM options) a value whose
  key names a secret (`secret`, `password`, `token`, `key`, `credential`, ...: as a word of the
  name, so `max_tokens` is not one) is replaced by `***`, at any depth (`redact`).

`errors.one_line`, the formatter of every error line, applies the first rule, so an error that
quotes a URL never shows its secret either.
"""

from __future__ import annotations

import re
from typing import Any

MASK = "***"
SECRET_WORDS = frozenset({
    "secret", "password", "passwd", "pwd", "token", "credential", "credentials", "key", "apikey",
    "signature", "sig", "auth", "authorization", "private", "cookie",
})
# Query parameters that carry a signature, a credential or a token (lowercase).
SIGNED_QUERY = frozenset({
    "x-amz-signature", "x-amz-credential", "x-amz-security-token", "x-goog-signature", "x-goog-credential",
    "signature", "sig", "awsaccesskeyid", "policy", "key-pair-id", "googleaccessid", "token", "access_token",
    "auth", "authorization", "key", "api_key", "apikey", "password", "secret", "code",
})

_URL = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<rest>[^\s'\"<>]*)")
_WORD = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")


def redact_text(text: str) -> str:
    """`text` with every URL in it stripped of its password and signed query values."""
    if "://" not in text:
        return text
    return _URL.sub(_redact_url, text)


def _redact_url(m: re.Match) -> str:
    rest = m.group("rest")
    authority, sep, tail = _split_authority(rest)
    if "@" in authority:
        user, _, host = authority.rpartition("@")
        name, colon, _ = user.partition(":")  # a user alone may be a token (https://TOKEN@host)
        authority = f"{name}:{MASK}@{host}" if colon else f"{MASK}@{host}"
    query_at = tail.find("?")
    if query_at >= 0:
        path, query = tail[:query_at], tail[query_at + 1:]
        fragment = ""
        if "#" in query:
            query, fragment = query.split("#", 1)
            fragment = "#" + fragment
        tail = path + "?" + "&".join(_redact_param(p) for p in query.split("&")) + fragment
    return m.group("scheme") + authority + sep + tail


def _split_authority(rest: str) -> tuple[str, str, str]:
    """(user info and host, the separator, path + query): the authority ends at the first / ? #."""
    for i, ch in enumerate(rest):
        if ch in "/?#":
            return rest[:i], "", rest[i:]
    return rest, "", ""


def _redact_param(param: str) -> str:
    name, eq, _ = param.partition("=")
    return f"{name}={MASK}" if eq and name.lower() in SIGNED_QUERY else param


def is_secret_name(name: str) -> bool:
    """Whether a key names a secret: one of its words (snake, kebab or camel case) is a SECRET_WORD."""
    return any(w.lower() in SECRET_WORDS for w in _WORD.findall(str(name)))


def redact_strings(value: Any) -> Any:
    """`value` with every string in it, at any depth, through `redact_text`."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {k: redact_strings(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_strings(v) for v in value)
    return value


def redact(value: Any) -> Any:
    """A mapping of credentials (storage options, environment variables, LLM options) with the value
    of every key that names a secret replaced by MASK, at any depth, and every string through
    `redact_text`."""
    if isinstance(value, dict):
        return {k: MASK if is_secret_name(k) and v not in (None, "") else redact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact(v) for v in value)
    return redact_strings(value)
