"""docker-compose.yml, checked by parsing (no Docker engine here)."""

from __future__ import annotations

import re

import yaml

from tests.conftest import ROOT


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_services_and_volumes() -> None:
    c = _compose()
    assert {"redis", "postgres", "migrate", "beat"} <= set(c["services"])
    assert c["services"]["beat"]["command"] == ["scheduler"]
    api = c["services"]["api"]
    assert api["command"] == ["api"] and api["healthcheck"]["test"]
    assert api["environment"]["MXQ_API_TOKEN"].startswith("${MXQ_API_TOKEN:?")
    assert c["services"]["postgres"]["volumes"] == ["postgres-data:/var/lib/postgresql/data"]
    for name in ("redis", "postgres"):
        assert c["services"][name]["healthcheck"]["test"]
    assert set(c["volumes"]) == {"redis-data", "postgres-data"}


def test_one_worker_per_gpu_each_reserving_its_own() -> None:
    services = _compose()["services"]
    workers = {n: s for n, s in services.items() if n.startswith("worker-gpu")}
    assert len(workers) >= 1
    seen = set()
    for name, svc in workers.items():
        index = re.fullmatch(r"worker-gpu(\d+)", name).group(1)
        (dev,) = svc["deploy"]["resources"]["reservations"]["devices"]
        assert dev["driver"] == "nvidia" and dev["capabilities"] == ["gpu"]
        assert dev["device_ids"] == [index], name
        assert svc["environment"]["MXQ_HOST_GPUS"] == index
        assert svc["command"] == ["worker"]
        assert svc["environment"]["MXQ_BROKER_URL"].startswith("redis://redis:")
        assert svc["environment"]["MXQ_DATABASE_URL"].startswith("postgresql://")
        assert svc["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        seen.add(index)
    assert seen == {str(i) for i in range(len(workers))}


def test_no_secret_in_the_file() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    assert "${POSTGRES_PASSWORD:?" in text
    assert "change-me" not in text
