"""The per-device profile store: SQLAlchemy 2 models and the :class:`Store` that uses them.

One SQLite file by default (``sqlite:///autotune.db``); any SQLAlchemy URL works, so a fleet
can share PostgreSQL. Optuna keeps its own tables in the same database, so every table here
is prefixed ``autotune_``; there is no Alembic, the schema version lives in
``autotune_meta``. SQLite runs in WAL mode with a busy timeout so a tuner writing and a CLI
reading do not trip over each other.

Tables: ``autotune_devices`` (one row per fingerprint key), ``autotune_model_pairs`` (target
+ draft by content hash and drafter), ``autotune_measurements`` (the profiler's raw curves)
and ``autotune_profiles`` (the whole profile dict, plus a few columns for listing and lookup).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import JSON, DateTime, ForeignKey, String, UniqueConstraint, create_engine, event, select
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, IntegrityError, OperationalError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from profiles.errors import ProfileError, ProfileNotFound
from profiles.reading import SCHEMA_VERSION, TOOL_VERSION, check_schema_version, get
from profiles.schema import Profile

__all__ = ["SCHEMA_VERSION", "TOOL_VERSION", "Store", "redact_url"]

DEFAULT_URL = "sqlite:///autotune.db"
SQLITE_BUSY_TIMEOUT_MS = 30_000
_T = TypeVar("_T")


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON}


class MetaRow(Base):
    __tablename__ = "autotune_meta"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(String(255))


class DeviceRow(Base):
    __tablename__ = "autotune_devices"

    id: Mapped[int] = mapped_column(primary_key=True)
    key: Mapped[str] = mapped_column(String(128), unique=True)
    label: Mapped[str] = mapped_column(String(255))
    kind: Mapped[str] = mapped_column(String(32))
    fingerprint: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(DateTime)


class PairRow(Base):
    __tablename__ = "autotune_model_pairs"
    __table_args__ = (UniqueConstraint("target_hash", "draft_hash", "drafter"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    target_path: Mapped[str] = mapped_column(String(1024))
    draft_path: Mapped[str | None] = mapped_column(String(1024))
    drafter: Mapped[str] = mapped_column(String(16))
    target_hash: Mapped[str] = mapped_column(String(128))
    draft_hash: Mapped[str | None] = mapped_column(String(128))


class MeasurementRow(Base):
    __tablename__ = "autotune_measurements"

    id: Mapped[int] = mapped_column(primary_key=True)
    device_id: Mapped[int] = mapped_column(ForeignKey("autotune_devices.id"), index=True)
    pair_id: Mapped[int] = mapped_column(ForeignKey("autotune_model_pairs.id"), index=True)
    workload_hash: Mapped[str] = mapped_column(String(128))
    kind: Mapped[str] = mapped_column(String(32))
    data: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(DateTime)
    tool_version: Mapped[str] = mapped_column(String(64))


class ProfileRow(Base):
    __tablename__ = "autotune_profiles"

    id: Mapped[int] = mapped_column(primary_key=True)
    device_id: Mapped[int] = mapped_column(ForeignKey("autotune_devices.id"), index=True)
    pair_id: Mapped[int] = mapped_column(ForeignKey("autotune_model_pairs.id"), index=True)
    workload_hash: Mapped[str] = mapped_column(String(128))
    study_name: Mapped[str | None] = mapped_column(String(255))
    data: Mapped[dict[str, Any]]
    chosen_gamma: Mapped[int]
    tokens_per_second: Mapped[float | None]
    created_at: Mapped[datetime] = mapped_column(DateTime)
    tool_version: Mapped[str] = mapped_column(String(64))


def _check_json(data: Any, what: str) -> None:
    """Refuse what the JSON column cannot store (NaN metrics pass: SQLite keeps them)."""
    try:
        json.dumps(data)
    except (TypeError, ValueError) as exc:
        raise ProfileError(f"{what}: not JSON-serializable ({exc})") from None


def _utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None, microsecond=0)


def _parse_created_at(text: str) -> datetime:
    """ISO-8601 -> naive UTC (the form stored); a naive input is taken as UTC."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ProfileError(f"profile: 'created_at' must be an ISO-8601 time, got {text!r}") from None
    if moment.tzinfo is not None:
        moment = moment.astimezone(timezone.utc).replace(tzinfo=None)
    return moment


def _iso(moment: datetime) -> str:
    return moment.replace(tzinfo=timezone.utc).isoformat()


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _make_engine(url: str) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database
        if database and database != ":memory:" and not database.startswith("file:"):
            Path(database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(parsed)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(parsed)


def redact_url(url: str) -> str:
    """The URL with any password hidden, for error messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


def _basename(path: str | None) -> str | None:
    return None if path is None else (Path(path.rstrip("/")).name or path)


class Store:
    """Profiles, devices, model pairs and raw measurements in one SQLAlchemy database.

    Args:
        url: any SQLAlchemy URL; for SQLite the parent folder is created and WAL is enabled.

    Example:
        >>> store = Store("sqlite://")          # in memory
        >>> store.list_profiles()
        []
        >>> store.upsert_device({"key": "k1", "label": "NVIDIA H200", "kind": "cuda"}) > 0
        True
    """

    def __init__(self, url: str = DEFAULT_URL) -> None:
        self.url = url
        shown = redact_url(url)
        try:
            self.engine = _make_engine(url)
            Base.metadata.create_all(self.engine)
        except ImportError as exc:
            raise ProfileError(
                f"storage {shown}: its database driver is not installed ({exc.name or exc}); "
                f"install it, e.g. pip install 'psycopg[binary]' for PostgreSQL"
            ) from None
        except (ArgumentError, OperationalError, OSError) as exc:
            reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
            raise ProfileError(f"storage {shown}: cannot open the database ({reason})") from None
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._write(self._init_meta)

    def close(self) -> None:
        """Release the database connections."""
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transactions ---------------------------------------------------------------------

    def _write(self, work: Callable[[Session], _T]) -> _T:
        """Run ``work`` in one transaction; retry once if a concurrent writer won a unique key."""
        for attempt in (0, 1):
            try:
                with self._sessions.begin() as session:
                    return work(session)
            except IntegrityError:
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def _init_meta(self, session: Session) -> None:
        row = session.get(MetaRow, "schema_version")
        if row is None:
            session.add_all(
                [
                    MetaRow(key="schema_version", value=str(SCHEMA_VERSION)),
                    MetaRow(key="tool_version", value=TOOL_VERSION),
                ]
            )
        elif int(row.value) > SCHEMA_VERSION:
            raise ProfileError(
                f"{self.url}: store schema version {row.value} is newer than this "
                f"spec-autotune reads ({SCHEMA_VERSION}); upgrade spec-autotune"
            )

    def meta(self) -> dict[str, str]:
        """The ``autotune_meta`` rows: ``schema_version`` and the ``tool_version`` that created the store.

        Example:
            >>> Store("sqlite://").meta()["schema_version"]
            '2'
        """
        with self._sessions() as session:
            return {row.key: row.value for row in session.scalars(select(MetaRow))}

    # -- devices and pairs ----------------------------------------------------------------

    @staticmethod
    def _upsert_device(session: Session, fp: Mapping[str, Any], where: str) -> int:
        key = get({where: fp}, f"{where}.key", str)
        label = get({where: fp}, f"{where}.label", str)
        kind = get({where: fp}, f"{where}.kind", str)
        fingerprint = copy.deepcopy(dict(fp))
        row = session.scalars(select(DeviceRow).where(DeviceRow.key == key)).one_or_none()
        if row is None:
            row = DeviceRow(key=key, label=label, kind=kind, fingerprint=fingerprint, created_at=_utcnow())
            session.add(row)
        else:
            row.label, row.kind, row.fingerprint = label, kind, fingerprint
        session.flush()
        return row.id

    @staticmethod
    def _upsert_pair(
        session: Session,
        target_path: str,
        draft_path: str | None,
        drafter: str,
        target_hash: str,
        draft_hash: str | None,
    ) -> int:
        # NULL never equals NULL in SQL, so the unique constraint cannot catch two draft-less rows:
        # look up with IS NULL explicitly.
        draft_match = PairRow.draft_hash.is_(None) if draft_hash is None else PairRow.draft_hash == draft_hash
        row = session.scalars(
            select(PairRow).where(PairRow.target_hash == target_hash, draft_match, PairRow.drafter == drafter)
        ).first()
        if row is None:
            row = PairRow(
                target_path=target_path,
                draft_path=draft_path,
                drafter=drafter,
                target_hash=target_hash,
                draft_hash=draft_hash,
            )
            session.add(row)
        else:
            row.target_path, row.draft_path = target_path, draft_path
        session.flush()
        return row.id

    def upsert_device(self, fp: dict[str, Any]) -> int:
        """Insert or update a device by its fingerprint ``key``; returns its row id.

        ``fp`` needs ``key``, ``label`` and ``kind``; the whole dict is kept as the fingerprint.

        Example:
            >>> s = Store("sqlite://")
            >>> a = s.upsert_device({"key": "k1", "label": "H200", "kind": "cuda"})
            >>> a == s.upsert_device({"key": "k1", "label": "H200", "kind": "cuda", "driver": "570"})
            True
        """
        return self._write(lambda session: self._upsert_device(session, fp, "fingerprint"))

    def upsert_pair(
        self, target_path: str, draft_path: str | None, drafter: str, target_hash: str, draft_hash: str | None
    ) -> int:
        """Insert or find a model pair by (target_hash, draft_hash, drafter); paths are refreshed.

        Example:
            >>> s = Store("sqlite://")
            >>> first = s.upsert_pair("/m/t", None, "ngram", "th", None)
            >>> first == s.upsert_pair("/x/t", None, "ngram", "th", None)
            True
        """
        return self._write(
            lambda session: self._upsert_pair(
                session, target_path, draft_path, drafter, target_hash, draft_hash
            )
        )

    # -- measurements ---------------------------------------------------------------------

    def save_measurement(
        self, device_key: str, pair_id: int, workload_hash: str, kind: str, data: dict[str, Any]
    ) -> int:
        """Store the profiler's raw measurements (whole curves) for a known device and pair.

        Example:
            >>> s = Store("sqlite://")
            >>> _ = s.upsert_device({"key": "k1", "label": "H200", "kind": "cuda"})
            >>> pair = s.upsert_pair("/m/t", "/m/d", "model", "th", "dh")
            >>> s.save_measurement("k1", pair, "wh", "profiler", {"knee": 64}) > 0
            True
        """
        _check_json(data, "measurement data")

        def work(session: Session) -> int:
            device_id = session.scalars(select(DeviceRow.id).where(DeviceRow.key == device_key)).one_or_none()
            if device_id is None:
                raise ProfileError(f"device {device_key!r} is not in the store; call upsert_device first")
            if session.get(PairRow, pair_id) is None:
                raise ProfileError(f"model pair {pair_id} is not in the store; call upsert_pair first")
            row = MeasurementRow(
                device_id=device_id,
                pair_id=pair_id,
                workload_hash=workload_hash,
                kind=kind,
                data=copy.deepcopy(data),
                created_at=_utcnow(),
                tool_version=TOOL_VERSION,
            )
            session.add(row)
            session.flush()
            return row.id

        return self._write(work)

    def latest_measurement(
        self, device_key: str, pair_id: int, workload_hash: str, kind: str
    ) -> dict[str, Any] | None:
        """The newest matching measurement as ``{"id", ..., "created_at", "tool_version", "data"}``, or None.

        Example:
            >>> Store("sqlite://").latest_measurement("k1", 1, "wh", "profiler") is None
            True
        """
        with self._sessions() as session:
            found = session.execute(
                select(MeasurementRow, DeviceRow.key)
                .join(DeviceRow, MeasurementRow.device_id == DeviceRow.id)
                .where(
                    DeviceRow.key == device_key,
                    MeasurementRow.pair_id == pair_id,
                    MeasurementRow.workload_hash == workload_hash,
                    MeasurementRow.kind == kind,
                )
                .order_by(MeasurementRow.created_at.desc(), MeasurementRow.id.desc())
                .limit(1)
            ).first()
        if found is None:
            return None
        row = found[0]
        return {
            "id": row.id,
            "device_key": device_key,
            "pair_id": row.pair_id,
            "workload_hash": row.workload_hash,
            "kind": row.kind,
            "created_at": _iso(row.created_at),
            "tool_version": row.tool_version,
            "data": row.data,
        }

    # -- profiles -------------------------------------------------------------------------

    def save_profile(self, profile: dict[str, Any] | Profile) -> int:
        """Store a whole profile (its JSON, or a typed :class:`~profiles.schema.Profile`); its device and pair
        are upserted in the same transaction.

        Missing ``schema_version``, ``tool_version`` and ``created_at`` are filled in; the study
        name column comes from ``study.name`` (or a top-level ``study_name``). Any failure
        leaves nothing written. A top-level ``id`` (from :meth:`get_profile`) is dropped.

        Example:
            >>> s = Store("sqlite://")
            >>> pid = s.save_profile({"device": {"key": "k1", "label": "H200", "kind": "cuda"},
            ...     "pair": {"target": "/m/t", "draft": None, "drafter": "ngram", "target_hash": "th"},
            ...     "workload": {"hash": "wh"}, "chosen": {"gamma": 3}, "schedule": []})
            >>> s.get_profile(pid)["chosen"]["gamma"]
            3
        """
        if isinstance(profile, Profile):
            profile = profile.to_json()
        if not isinstance(profile, Mapping):
            raise ProfileError(f"profile must be a mapping, got {type(profile).__name__}")
        check_schema_version(profile)
        data = copy.deepcopy({k: v for k, v in profile.items() if k != "id"})
        data.setdefault("schema_version", SCHEMA_VERSION)
        data.setdefault("tool_version", TOOL_VERSION)
        data.setdefault("created_at", _iso(_utcnow()))
        device = get(data, "device", dict)
        for key in ("key", "label", "kind"):
            get(data, f"device.{key}", str)
        target = get(data, "pair.target", str)
        draft = get(data, "pair.draft", str, default=None, nullable=True)
        drafter = get(data, "pair.drafter", str)
        target_hash = get(data, "pair.target_hash", str)
        draft_hash = get(data, "pair.draft_hash", str, default=None, nullable=True)
        columns = {
            "workload_hash": get(data, "workload.hash", str),
            "study_name": get(data, "study.name", str, default=None, nullable=True)
            or get(data, "study_name", str, default=None, nullable=True),
            "chosen_gamma": get(data, "chosen.gamma", int),
            "tokens_per_second": get(data, "metrics.tokens_per_second", float, default=None, nullable=True),
            "created_at": _parse_created_at(get(data, "created_at", str)),
            "tool_version": get(data, "tool_version", str),
        }
        _check_json(data, "profile")

        def work(session: Session) -> int:
            device_id = self._upsert_device(session, device, "device")
            pair_id = self._upsert_pair(session, target, draft, drafter, target_hash, draft_hash)
            row = ProfileRow(device_id=device_id, pair_id=pair_id, data=data, **columns)
            session.add(row)
            session.flush()
            return row.id

        return self._write(work)

    def get_profile(self, profile_id: int) -> dict[str, Any]:
        """The stored profile dict with its ``id`` added; ProfileNotFound when there is none.

        Example:
            >>> Store("sqlite://").get_profile(7)
            Traceback (most recent call last):
            ...
            profiles.errors.ProfileNotFound: no profile with id 7 (see `autotune profiles list`)
        """
        with self._sessions() as session:
            row = session.get(ProfileRow, profile_id)
            if row is None:
                raise ProfileNotFound(f"no profile with id {profile_id} (see `autotune profiles list`)")
            return {**row.data, "id": row.id}

    def load_profile(self, profile_id: int) -> Profile:
        """:meth:`get_profile`, typed (:class:`~profiles.schema.Profile`, with its ``id``)."""
        return Profile.from_json(self.get_profile(profile_id))

    def list_profiles(self) -> list[dict[str, Any]]:
        """Summary rows, newest first: id, device, pair, workload_hash, gamma, tokens_per_second,
        created_at, backend.

        ``backend`` is what ran the trials (``engine`` for profiles written before backends existed).

        Example:
            >>> Store("sqlite://").list_profiles()
            []
        """
        with self._sessions() as session:
            rows = session.execute(
                select(ProfileRow, DeviceRow.label, PairRow)
                .join(DeviceRow, ProfileRow.device_id == DeviceRow.id)
                .join(PairRow, ProfileRow.pair_id == PairRow.id)
                .order_by(ProfileRow.created_at.desc(), ProfileRow.id.desc())
            ).all()
        summary = []
        for profile, label, pair in rows:
            second = _basename(pair.draft_path) if pair.draft_path else pair.drafter
            summary.append(
                {
                    "id": profile.id,
                    "device": label,
                    "pair": f"{_basename(pair.target_path)} / {second}",
                    "workload_hash": profile.workload_hash,
                    "gamma": profile.chosen_gamma,
                    "tokens_per_second": profile.tokens_per_second,
                    "created_at": _iso(profile.created_at),
                    "backend": (profile.data.get("backend") or {}).get("name", "engine"),
                }
            )
        return summary

    def delete_profile(self, profile_id: int) -> None:
        """Delete one profile (its device and pair rows stay); ProfileNotFound when there is none.

        Example:
            >>> Store("sqlite://").delete_profile(3)
            Traceback (most recent call last):
            ...
            profiles.errors.ProfileNotFound: no profile with id 3 (see `autotune profiles list`)
        """

        def work(session: Session) -> None:
            row = session.get(ProfileRow, profile_id)
            if row is None:
                raise ProfileNotFound(f"no profile with id {profile_id} (see `autotune profiles list`)")
            session.delete(row)

        self._write(work)

    def _newest(self, *where: Any) -> dict[str, Any] | None:
        with self._sessions() as session:
            row = session.scalars(
                select(ProfileRow)
                .join(DeviceRow, ProfileRow.device_id == DeviceRow.id)
                .join(PairRow, ProfileRow.pair_id == PairRow.id)
                .where(*where)
                .order_by(ProfileRow.created_at.desc(), ProfileRow.id.desc())
                .limit(1)
            ).first()
            return None if row is None else {**row.data, "id": row.id}

    @staticmethod
    def _pair_filter(target_hash: str, draft_hash: str | None) -> list[Any]:
        draft_match = PairRow.draft_hash.is_(None) if draft_hash is None else PairRow.draft_hash == draft_hash
        return [PairRow.target_hash == target_hash, draft_match]

    def current_profile(
        self, device_key: str, target_hash: str, draft_hash: str | None
    ) -> dict[str, Any] | None:
        """The newest profile for this host (fingerprint key) and pair (``draft_hash`` None = no draft model).

        Example:
            >>> Store("sqlite://").current_profile("k1", "th", None) is None
            True
        """
        return self._newest(DeviceRow.key == device_key, *self._pair_filter(target_hash, draft_hash))

    def nearest_profile(
        self,
        device_label_or_name: str,
        *,
        target_hash: str | None = None,
        draft_hash: str | None = None,
        exclude_device_key: str | None = None,
    ) -> dict[str, Any] | None:
        """The newest profile of the same device model, for warm starts; None when there is none.

        A device matches when its label or its fingerprint's ``name`` equals
        ``device_label_or_name`` (case-insensitive). With ``target_hash`` only that pair counts
        (``draft_hash`` None then means "no draft model"); ``exclude_device_key`` skips a host,
        e.g. this one, to warm-start from a sibling.

        Example:
            >>> Store("sqlite://").nearest_profile("NVIDIA H200") is None
            True
        """
        wanted = device_label_or_name.casefold()
        with self._sessions() as session:
            devices = session.execute(
                select(DeviceRow.id, DeviceRow.key, DeviceRow.label, DeviceRow.fingerprint)
            ).all()
        ids = [
            dev_id
            for dev_id, key, label, fp in devices
            if key != exclude_device_key
            and (label.casefold() == wanted or str((fp or {}).get("name", "")).casefold() == wanted)
        ]
        if not ids:
            return None
        where = [ProfileRow.device_id.in_(ids)]
        if target_hash is not None:
            where += self._pair_filter(target_hash, draft_hash)
        return self._newest(*where)
