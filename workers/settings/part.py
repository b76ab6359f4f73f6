"""What every part of the settings shares: how a part is read from the environment (`MXQ_<FIELD>`,
finite numbers only), the bounds its numbers stay within, and the check of a URL's scheme."""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic_settings import BaseSettings, SettingsConfigDict

from mxq.workers.stack_record import without_password

# Upper bounds of the numeric settings: each far above any sensible value, so only a typo or a
# hostile value (inf, 1e308, a 400-digit count) meets them, before any timer or sum overflows.
HOUR, DAY = 3600.0, 86400.0
MAX_COUNT = 2**31 - 1  # what every SQL integer column and C int holds


class Part(BaseSettings):
    """A group of settings of one component; `Settings` is made of them all."""

    model_config = SettingsConfigDict(env_prefix="MXQ_", extra="ignore", allow_inf_nan=False)


def check_url(value: str, env: str, schemes: tuple[str, ...], example: str) -> str:
    """`value` if it is SCHEME://… with a scheme mxq runs with, else the one-line reason
    (naming the URL without its password)."""
    shown = without_password(value)[0] if "://" in value else value
    scheme = value.split("://", 1)[0].lower() if "://" in value else None
    if scheme is None or scheme not in schemes:
        what = f"scheme {scheme!r} is not supported" if scheme else "not a URL"
        raise ValueError(f"{env}={shown}: {what}; allowed schemes: {', '.join(schemes)} "
                         f"(e.g. {example})")
    try:
        urlsplit(value).port  # noqa: B018  # a port that is not a number raises here
    except ValueError as exc:
        raise ValueError(f"{env}={shown}: {exc} (e.g. {example})") from None
    return value
