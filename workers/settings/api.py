"""The HTTP API's settings: where it listens, the names it serves as Host, and its tokens (the
user `admin`'s and the scraper's)."""

from __future__ import annotations

import ipaddress

from pydantic import Field, SecretStr, ValidationInfo, field_validator

from mxq.workers.settings.part import Part

# The shortest API token accepted: an empty or guessable one must not open the API.
MIN_TOKEN_CHARS = 16


def is_loopback(host: str) -> bool:
    """A name or address of this machine only (127.0.0.0/8, ::1, localhost)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class ApiFields(Part):
    api_host: str = Field("127.0.0.1", description="Address the HTTP API listens on.")
    api_port: int = Field(8470, ge=1, le=65535)
    api_hosts: str | None = Field(None, description="More names (comma-separated) the API serves "
                                  "as Host, beside loopback and MXQ_API_HOST.")
    api_token: SecretStr | None = Field(None, description="The token of the user `admin` (the "
                                        "API's first token, before users had their own).")
    metrics_token: SecretStr | None = Field(None, description="Bearer token Prometheus sends to "
                                            "scrape /metrics (besides an admin's token).")

    @field_validator("metrics_token", mode="before")
    @classmethod
    def _empty_metrics_token_is_none(cls, value: object) -> object:
        """An empty MXQ_METRICS_TOKEN (compose passes it through, empty when the operator set
        none) is no token: /metrics then answers admins only."""
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("api_token", "metrics_token")
    @classmethod
    def _token_is_long_enough(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        """A set token that is empty or short would open the API beyond loopback to anyone who
        guesses it: refused, so no process starts with it (unset means no token, loopback only)."""
        if value is not None and len(value.get_secret_value().strip()) < MIN_TOKEN_CHARS:
            raise ValueError(
                f"MXQ_{str(info.field_name).upper()} has {len(value.get_secret_value().strip())} "
                f"characters; at least "
                f"{MIN_TOKEN_CHARS} are needed (e.g. `openssl rand -hex 24`), or leave it unset to "
                "serve on loopback only, where writes need no token"
            )
        return value

    @property
    def api_on_loopback(self) -> bool:
        """The API listens on this machine only (127.0.0.0/8, ::1, localhost)."""
        return is_loopback(self.api_host)
