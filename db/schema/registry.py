"""The model store's versions and the architectures' code."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, Boolean, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from mxq.db.schema.base import NEVER_REUSE_IDS, Base, utcnow
from mxq.json_types import JsonObject


class Model(Base):
    """One version of a named model in the store (`$MXQ_HOME/models/NAME/VERSION/`)."""

    __tablename__ = "models"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128))
    version: Mapped[int]
    arch: Mapped[str] = mapped_column(String(64))  # a built-in architecture, or "symbol"
    input_shape: Mapped[list[int]] = mapped_column(JSON)
    classes: Mapped[int]
    params_file: Mapped[str] = mapped_column(Text)
    symbol_file: Mapped[str | None] = mapped_column(Text)
    checksum: Mapped[str] = mapped_column(String(64))  # sha256 of the params file
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    source: Mapped[str] = mapped_column(String(256))
    promoted: Mapped[bool] = mapped_column(Boolean, default=False)
    metrics: Mapped[JsonObject] = mapped_column(default=dict)
    # The ONNX export: {"file", "max_diff", "argmax_agreement"} or {"file": None, "error"}.
    onnx: Mapped[JsonObject | None] = mapped_column(nullable=True)
    # Measured samples/s per device kind: {"cpu": {"mxnet": 4100.0, "onnx": 15800.0}}.
    engines: Mapped[dict[str, dict[str, float]] | None] = mapped_column(JSON, nullable=True)
    # How inputs are scaled before the model sees them: {"scale", "mean", "std", "layout"}.
    preprocess: Mapped[JsonObject | None] = mapped_column(nullable=True)
    # What the model outputs: "logits" (mxq applies a softmax) or "probabilities" (used as is).
    outputs: Mapped[str] = mapped_column(String(16), default="logits", server_default="logits")
    # Lower-precision builds of the ONNX export and how they agree with it (`mxq models
    # quantize`): {"int8": {"file", "sha256", "agreement", "max_diff", "accuracy", ...}}.
    variants: Mapped[dict[str, JsonObject] | None] = mapped_column(JSON, nullable=True)
    # Several outputs (migration 0030): [{"name", "kind", "width"}, ...] in order; `outputs` is
    # then "heads" and `classes` the widths' sum. NULL for one output.
    heads: Mapped[list[JsonObject] | None] = mapped_column(JSON, nullable=True)
    # Who may register and promote its versions (migration 0023): its owner (a user's name),
    # the members of `team`, admins; a model without an owner is the admins' alone.
    owner: Mapped[str | None] = mapped_column(String(128))
    team: Mapped[str | None] = mapped_column(String(64))
    # When the retention policy removed this unpromoted version's files (MXQ_KEEP_VERSIONS);
    # the row stays, so the history still names it (migration 0024).
    removed_at: Mapped[datetime | None]

    __table_args__ = (UniqueConstraint("name", "version", name="uq_models_name_version"),
                      NEVER_REUSE_IDS)


class Arch(Base):
    """One version of an architecture's code (`mxq arch add`, migration 0029): its file, stored
    by content (`$MXQ_HOME/models/STACK/.archs/SHA256.py`, and the bucket store), and the
    factory that builds its net; a training of NAME pins the newest version's checksum."""

    __tablename__ = "archs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(64))
    version: Mapped[int]
    sha256: Mapped[str] = mapped_column(String(64))
    factory: Mapped[str] = mapped_column(String(128))
    file_name: Mapped[str] = mapped_column(String(256))
    # What the trial forward at registration built it for.
    classes: Mapped[int]
    input_shape: Mapped[list[int]] = mapped_column(JSON)
    added_by: Mapped[str | None] = mapped_column(String(128))
    added_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (UniqueConstraint("name", "version", name="uq_archs_name_version"),
                      NEVER_REUSE_IDS)
