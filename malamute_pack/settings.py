"""
The broker's settings, read from a ZPL config file (the C broker's
``malamute.cfg`` keys plus our own under ``malamute/``) and then overridden
by command-line options.

Keys of the C broker that are honoured:
``server/timeout`` (ms), ``server/auth/plain`` (password file),
``mlm_server/security/mechanism`` (``null`` or ``plain``),
``mlm_server/bind/endpoint`` (repeatable),
``mlm_server/mailbox/size-limit`` and ``mlm_server/service/queue/size-limit``
(bytes, or ``max``). Our own: ``malamute/data-dir``,
``malamute/match-cache`` and ``malamute/limits/<name>`` for each field of
L{Limits} with dashes (``malamute/limits/max-clients = 500``).

Tests: ``tests/test_tap.py``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from malamute_pack.broker.limits import Limits

DEFAULT_ENDPOINT = "ipc://@/malamute"
DEFAULT_DATA_DIR = Path("malamute-data")


class SettingsError(ValueError):
    """A setting with a value the broker cannot use."""


@dataclass(frozen=True)
class Settings:
    endpoints: tuple[str, ...] = (DEFAULT_ENDPOINT,)
    timeout_ms: int = 10_000
    mechanism: str = "null"
    passwords: Path | None = None
    data_dir: Path = DEFAULT_DATA_DIR
    match_cache: int = 10_000
    limits: Limits = field(default_factory=Limits)


def _int(key: str, value: str, allow_max: bool = False) -> int | None:
    if allow_max and value.strip().lower() == "max":
        return None
    try:
        number = int(value)
    except ValueError:
        raise SettingsError(f"{key}: {value!r} is not a whole number") from None
    if number < 0:
        raise SettingsError(f"{key}: {value!r} is negative")
    return number


def from_zpl(config: dict[str, list[str]], base: Settings = Settings()) -> Settings:
    """C{base} with every setting that C{config} gives replaced."""
    changes: dict[str, object] = {}
    limits: dict[str, int] = {}

    def last(key: str) -> str | None:
        values = config.get(key)
        return values[-1] if values else None

    if (value := last("server/timeout")) is not None:
        changes["timeout_ms"] = _int("server/timeout", value)
    if (value := last("server/auth/plain")) is not None:
        changes["passwords"] = Path(value)
    if (value := last("mlm_server/security/mechanism")) is not None:
        changes["mechanism"] = value.lower()
    if config.get("mlm_server/bind/endpoint"):
        changes["endpoints"] = tuple(config["mlm_server/bind/endpoint"])
    for key, name in (
        ("mlm_server/mailbox/size-limit", "mailbox_max_bytes"),
        ("mlm_server/service/queue/size-limit", "service_max_bytes"),
    ):
        if (value := last(key)) is not None and (n := _int(key, value, True)) is not None:
            limits[name] = n
    if (value := last("malamute/data-dir")) is not None:
        changes["data_dir"] = Path(value)
    if (value := last("malamute/match-cache")) is not None:
        changes["match_cache"] = _int("malamute/match-cache", value)
    known = {f.name for f in dataclasses.fields(Limits)}
    for key, values in config.items():
        if key.startswith("malamute/limits/"):
            name = key.removeprefix("malamute/limits/").replace("-", "_")
            if name not in known:
                raise SettingsError(f"{key}: unknown limit; known: {', '.join(sorted(known))}")
            n = _int(key, values[-1])
            assert n is not None
            limits[name] = n
    if limits:
        try:
            changes["limits"] = dataclasses.replace(base.limits, **limits)
        except ValueError as e:
            raise SettingsError(str(e)) from e
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def check(settings: Settings) -> Settings:
    """C{settings} if they are consistent, else L{SettingsError} saying why."""
    if settings.mechanism not in ("null", "plain"):
        raise SettingsError(
            f"security mechanism {settings.mechanism!r} is not supported (null or plain)"
        )
    if settings.mechanism == "plain" and settings.passwords is None:
        raise SettingsError("PLAIN security needs a password file (server/auth/plain)")
    if settings.timeout_ms < 1:
        raise SettingsError("the client timeout must be at least 1 ms")
    if not settings.endpoints:
        raise SettingsError("no endpoint to bind")
    return settings
