"""When a landing partition arrived, against the end of its day."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from resources.storage import DataStore


def landed_hours_after_day_end(store: DataStore, dataset: str, date: str) -> float:
    """How long after its UTC day ended a landing partition's last file was written, in hours
    (negative when it landed before the day was over)."""
    files = store.landing_files(dataset, date)
    latest = max(info.mtime.timestamp() for info in store.fs.get_file_info(files) if info.mtime)
    day_end = datetime.fromisoformat(date).replace(tzinfo=UTC) + timedelta(days=1)
    return round((latest - day_end.timestamp()) / 3600.0, 3)
