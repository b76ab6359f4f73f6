"""docker-compose.yml, Dockerfile, .env.example and .dockerignore.

docker-compose.yml is resolved by a real Compose v2 (`make compose` fetches Debian's into
var/tools; `config` runs without a Docker engine), with an env file made from .env.example: Compose
itself interpolates it, validates the file and refuses an unset secret. The tests check on its
output what Compose cannot know: mxq's commands, secrets only where needed, health checks that ask
the right thing, the shared store, and the worker service's launcher pinning one Celery worker per
GPU of a recorded 4-GPU listing inside its container. The Dockerfile is checked as text.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from mxq.workers.hardware.devices import parse_nvidia_smi
from mxq.workers.launch.launcher import STOP_GRACE_SECONDS, schedule_spec
from mxq.workers.settings import Settings
from tests.conftest import FIXTURES, ROOT, missing, run_cli

COMPOSE_FILE = ROOT / "docker-compose.yml"
COMPOSE_PLUGIN = ROOT / "var/tools/compose/usr/libexec/docker/cli-plugins/docker-compose"
GPU_FIXTURE = FIXTURES / "nvidia-smi" / "a100x4.csv"
IMAGE_MXNET = "mxnet-cu112"  # the `gpu` extra's MXNet build
BASE_IMAGE = "python:3.11-slim-bookworm"
INFRA = {"redis", "postgres"}
MXQ_SERVICES = {"migrate", "api", "scheduler", "worker"}
SECRETS = ("POSTGRES_PASSWORD", "MXQ_API_TOKEN")
PASSWORD, TOKEN = "pw-0123abcd", "tok-4567efgh-89ab"
SECRET_NAME = re.compile(r"PASSWORD|TOKEN|SECRET|PASSWD|API_KEY|PRIVATE_KEY", re.I)
VARIABLE = re.compile(r"(?<!\$)\$\{?([A-Za-z_]\w*)")  # ${NAME…} or $NAME, not $$ (escaped)
# compose(env, *args): Compose v2 on docker-compose.yml, `env` as its env file.
Compose = Callable[..., subprocess.CompletedProcess[str]]


# ---------------------------------------------------------------------------------- Compose


def _env_example() -> dict[str, str]:
    values = {}
    for line in (ROOT / ".env.example").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, sep, value = line.partition("=")
            assert sep, f".env.example: {line!r} is not KEY=VALUE"
            values[key.strip()] = value.strip()
    return values


def _filled_env(**changes: str | None) -> dict[str, str]:
    """.env.example with its secrets set, as an operator's .env; a None change drops the key."""
    env = {**_env_example(), "POSTGRES_PASSWORD": PASSWORD, "MXQ_API_TOKEN": TOKEN, **changes}
    return {k: v for k, v in env.items() if v is not None}


def _process_env() -> dict[str, str]:
    """Only what finds the program: no variable of the caller reaches Compose's interpolation."""
    return {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "DOCKER_CONFIG")}


def _is_compose_v2(argv: list[str]) -> bool:
    try:
        proc = subprocess.run([*argv, "version", "--short"], capture_output=True, text=True,
                              timeout=60, env=_process_env())
    except OSError:
        return False
    major = proc.stdout.strip().lstrip("v").split(".")[0]
    return proc.returncode == 0 and major.isdigit() and int(major) >= 2


@pytest.fixture(scope="module")
def compose(tmp_path_factory: pytest.TempPathFactory) -> Compose:
    """`compose(env, *args)`: Compose v2 run on docker-compose.yml with `env` as its env file."""
    candidates = [[str(COMPOSE_PLUGIN)]] if COMPOSE_PLUGIN.exists() else []
    if exe := shutil.which("docker-compose"):
        candidates.append([exe])
    if exe := shutil.which("docker"):
        candidates.append([exe, "compose"])
    argv = next((c for c in candidates if _is_compose_v2(c)), None)
    if argv is None:
        missing("no Compose v2: `make compose` fetches one into var/tools (or install the docker "
                "compose plugin)")
    tmp = tmp_path_factory.mktemp("compose")

    def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
        env_file = tmp / f"{len(list(tmp.iterdir()))}.env"
        env_file.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
        return subprocess.run([*argv, "--env-file", str(env_file), "--project-directory", str(ROOT),
                               "-f", str(COMPOSE_FILE), *args], capture_output=True, text=True,
                              timeout=60, cwd=tmp, env=_process_env())

    return run


def _config(compose: Compose, env: dict[str, str], *args: str) -> dict:
    proc = compose(env, "config", "--format", "json", *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def services(compose: Compose) -> dict[str, dict]:
    """The services as `docker compose config` resolves them with an operator's .env."""
    return _config(compose, _filled_env())["services"]


@pytest.fixture(scope="module")
def raw(compose: Compose) -> dict:
    """The same, variables not interpolated (anchors and merge keys resolved)."""
    return _config(compose, _filled_env(), "--no-interpolate")


# --------------------------------------------------------------------------------- services


def test_services_exist_and_start_with_a_plain_up(compose: Compose, services: dict) -> None:
    assert set(services) == INFRA | MXQ_SERVICES
    proc = compose(_filled_env(), "config", "--profiles")
    # Only monitoring and object storage wait behind a profile: a plain `up` starts the rest.
    assert proc.returncode == 0 and sorted(proc.stdout.split()) == ["monitoring", "s3"], proc.stdout


def test_the_s3_profile_runs_minio_and_makes_the_bucket_with_credentials_from_a_file(
        compose: Compose) -> None:
    proc = compose(_filled_env(), "--profile", "s3", "config", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    services = json.loads(proc.stdout)["services"]
    assert set(services) == INFRA | MXQ_SERVICES | {"minio", "bucket"}
    assert services["minio"]["ports"][0]["host_ip"] == "127.0.0.1"  # loopback by default
    assert services["bucket"]["depends_on"]["minio"]["condition"] == "service_healthy"
    assert _extra_hosts(services["worker"])["minio"] == "127.0.0.1"  # on the host's network
    raw = yaml.safe_load(COMPOSE_FILE.read_text())
    for name in ("minio", "bucket"):  # no credential in the file: .env.s3 holds them
        assert raw["services"][name]["env_file"] == [{"path": ".env.s3", "required": False}]
        assert not SECRET_NAME.search(json.dumps(raw["services"][name].get("environment", {})))
    example = dict(line.split("=", 1) for line in (ROOT / ".env.s3.example").read_text().splitlines()
                   if line and not line.startswith("#"))
    assert example["MINIO_ROOT_PASSWORD"] == example["AWS_SECRET_ACCESS_KEY"] == ""  # to fill in
    fields: dict[str, Any] = {k.removeprefix("MXQ_").lower(): v for k, v in example.items()
                              if k.startswith("MXQ_") and k != "MXQ_S3_BUCKET"}
    settings = Settings(**fields)
    assert settings.s3_allowed_prefixes.entries == (("mxq-data", ""),)  # the example parses


def test_the_monitoring_profile_runs_prometheus_and_grafana_with_the_dashboard(compose: Compose) -> None:
    proc = compose(_filled_env(), "--profile", "monitoring", "config", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    services = json.loads(proc.stdout)["services"]
    assert set(services) == INFRA | MXQ_SERVICES | {"prometheus", "grafana", "flower"}
    flower = services["flower"]
    assert flower["command"][:2] == ["celery", "--broker=redis://redis:6379/0"]  # mxq's broker
    assert "FLOWER_UNAUTHENTICATED_API" not in flower["environment"]  # private: basic auth
    assert "FLOWER_BASIC_AUTH" in flower["environment"]
    mounts = {(m["source"], m["target"]) for name in ("prometheus", "grafana")
              for m in services[name]["volumes"] if m["type"] == "bind"}
    assert (str(ROOT / "deploy" / "prometheus.yml"), "/etc/prometheus/prometheus.yml") in mounts
    assert (str(ROOT / "deploy" / "grafana" / "dashboards"), "/var/lib/grafana/dashboards") in mounts
    scrape = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())["scrape_configs"][0]
    assert scrape["static_configs"][0]["targets"] == ["api:8470"]  # the api service, its port
    # /metrics needs a token: Prometheus reads MXQ_METRICS_TOKEN from the file compose mounts.
    token_file = scrape["authorization"]["credentials_file"]
    assert [c["target"] for c in services["prometheus"]["configs"]] == [token_file]
    source = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text())
    dashboard = json.loads((ROOT / "deploy/grafana/dashboards/mxq.json").read_text())
    uids = {t["datasource"]["uid"] for p in dashboard["panels"] for t in p["targets"]}
    assert uids == {source["datasources"][0]["uid"]}  # every panel asks the provisioned source
    for name in ("prometheus", "grafana", "flower"):
        assert services[name]["ports"][0]["host_ip"] == "127.0.0.1", name  # loopback by default


def test_commands_are_mxq_commands(services: dict) -> None:
    import typer.core
    import typer.main

    from mxq.cli.main import app

    group = typer.main.get_command(app)  # typer's own click (typer._click), not the click package
    assert isinstance(group, typer.core.TyperGroup)
    known = set(group.commands)
    for name in MXQ_SERVICES:
        assert services[name]["command"] == [name], name
        assert services[name]["command"][0] in known, name


def test_an_onnx_only_node_builds_its_image_with_the_gpu_onnx_extra(compose: Compose) -> None:
    """An H200-only node restart-looped: the image carried only the `gpu` extra (MXNet, which
    cannot run Hopper). MXQ_EXTRA picks the image's extra, `gpu` unless set."""
    default = _config(compose, _filled_env())["services"]
    onnx = _config(compose, _filled_env(MXQ_EXTRA="gpu-onnx"))["services"]
    for name in MXQ_SERVICES:
        assert default[name]["build"]["args"]["MXQ_EXTRA"] == "gpu"
        assert onnx[name]["build"]["args"]["MXQ_EXTRA"] == "gpu-onnx"
    assert re.search(r"^ARG MXQ_EXTRA=gpu$", (ROOT / "Dockerfile").read_text(), re.M)


def test_every_mxq_service_builds_from_the_dockerfile_with_the_env_image_tag(services: dict) -> None:
    for name in MXQ_SERVICES:
        build = services[name]["build"]
        assert Path(build["context"], build.get("dockerfile", "Dockerfile")) == ROOT / "Dockerfile"
        assert services[name]["image"] == _env_example()["MXQ_IMAGE"], name
    assert _env_example()["MXQ_IMAGE"] != "mxq:latest"  # so the tag above is not the default
    for name in INFRA:
        assert "build" not in services[name] and services[name]["image"], name


# ----------------------------------------------------------------------------------- GPUs


def test_the_worker_gets_every_gpu_and_runs_the_launcher(services: dict) -> None:
    worker = services["worker"]
    assert worker["command"] == ["worker"]
    (device,) = worker["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert device["count"] in (-1, "all") and "device_ids" not in device  # -1: Compose's "all"
    assert "MXQ_HOST_GPUS" not in worker["environment"]  # it sees the GPUs by their host index
    assert int(worker["stop_grace_period"].removesuffix("s")) > STOP_GRACE_SECONDS
    for name, svc in services.items():
        if name != "worker":
            assert not {"deploy", "gpus", "runtime"} & set(svc), f"{name} must not get a GPU"


def _fake_nvidia_smi(tmp_path: Path) -> Path:
    exe = tmp_path / "nvidia-smi"
    exe.write_text(f"#!/bin/sh\ncat '{GPU_FIXTURE}'\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe


def test_the_worker_container_pins_one_celery_worker_per_gpu(services: dict, tmp_path: Path) -> None:
    """`mxq worker` with the service's environment on the recorded 4-GPU host: one worker per GPU,
    pinned to its host index, so a 4-GPU training in this container sees all four."""
    env = {**services["worker"]["environment"], "MXQ_NVIDIA_SMI": str(_fake_nvidia_smi(tmp_path)),
           "MXQ_MXNET_BUILD": IMAGE_MXNET}
    proc = run_cli(["worker", "--dry-run", "--json"], env)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["refused"] == []
    node = _env_example()["MXQ_NODE"]
    gpus = parse_nvidia_smi(GPU_FIXTURE.read_text())
    assert len(gpus) == 4
    assert {w["worker"]: w["env"]["CUDA_VISIBLE_DEVICES"] for w in plan["workers"]} == {
        f"gpu{g.index}@{node}": g.uuid for g in gpus}  # by UUID: the container sees them too
    assert [w["device"] for w in plan["workers"]] == [g.label for g in gpus]
    # A container where nvidia-smi fails (no GPU given, no toolkit) stops instead of running CPUs.
    proc = run_cli(["worker", "--dry-run", "--json"], {**env, "MXQ_NVIDIA_SMI": str(tmp_path / "no")})
    assert proc.returncode != 0 and "GPUs are expected" in proc.stderr, (proc.stdout, proc.stderr)


def _worker_probe(services: dict, records: list[dict], node: str = "gpubox") -> int:
    """The worker health check's filter run on `mxq devices --json` output, as in the container."""
    kind, script = services["worker"]["healthcheck"]["test"]
    assert kind == "CMD-SHELL"
    producer, consumer = (part.strip() for part in script.split("|"))
    assert shlex.split(producer) == ["mxq", "devices", "--json"]
    argv = shlex.split(consumer)
    assert argv[:2] == ["python", "-c"] and len(argv) == 3
    return subprocess.run([sys.executable, "-c", argv[2]], input=json.dumps(records), text=True,
                          capture_output=True, timeout=60, env={"MXQ_NODE": node}).returncode


def test_worker_health_check_is_every_gpu_of_this_node_alive(services: dict) -> None:
    def gpu(i: int, alive: bool, node: str = "gpubox") -> dict:
        return {"device": f"gpu:{i}", "node": node, "alive": alive}

    four = [gpu(i, True) for i in range(4)]
    assert _worker_probe(services, four) == 0
    assert _worker_probe(services, [*four, gpu(0, False, "box2"),  # another node's GPU
                                    {"device": "cpu:0", "node": "gpubox", "alive": False}]) == 0
    assert _worker_probe(services, [*four[:3], gpu(3, False)]) != 0  # one GPU's worker is down
    assert _worker_probe(services, [gpu(0, True, "box2")]) != 0  # none of this node's
    assert _worker_probe(services, []) != 0


# ------------------------------------------------------------------- health and start order


def test_every_long_running_service_has_a_health_check_and_a_restart_policy(services: dict) -> None:
    for name, svc in services.items():
        if name == "migrate":
            assert "healthcheck" not in svc and svc["restart"] == "no"
            continue
        assert svc["healthcheck"]["test"][0] in ("CMD", "CMD-SHELL"), name
        assert svc["restart"] in ("unless-stopped", "always"), name
    assert services["redis"]["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    assert "pg_isready" in " ".join(services["postgres"]["healthcheck"]["test"])


def test_api_health_check_asks_the_api(services: dict) -> None:
    api = services["api"]
    env = api["environment"]
    assert env["MXQ_API_HOST"] == "0.0.0.0"
    cmd, program = api["healthcheck"]["test"][:3], api["healthcheck"]["test"][3]
    assert cmd == ["CMD", "python", "-c"]
    compile(program, "healthcheck", "exec")
    assert f"http://127.0.0.1:{env['MXQ_API_PORT']}/api/v1/devices" in program
    (port,) = api["ports"]
    assert (port["host_ip"], port["published"], port["target"]) == (
        "127.0.0.1", _env_example()["API_PORT"], int(env["MXQ_API_PORT"]))


def test_scheduler_health_check_pings_the_schedule_worker(services: dict) -> None:
    svc = services["scheduler"]
    kind, script = svc["healthcheck"]["test"]
    assert kind == "CMD-SHELL"
    # Compose hands `$$` to the container as `$`: its shell expands MXQ_NODE from the environment.
    node = svc["environment"]["MXQ_NODE"]
    argv = shlex.split(script.replace("$${MXQ_NODE}", node))
    assert argv[:5] == ["celery", "-A", "mxq.workers", "inspect", "ping"]
    assert argv[argv.index("-d") + 1] == schedule_spec(Settings(node=node)).name


def test_depends_on(services: dict) -> None:
    def conditions(name: str) -> dict[str, str]:
        return {t: spec["condition"] for t, spec in services[name].get("depends_on", {}).items()}

    assert conditions("migrate") == {"postgres": "service_healthy"}
    for name in MXQ_SERVICES - {"migrate"}:
        assert conditions(name) == {"redis": "service_healthy", "postgres": "service_healthy",
                                    "migrate": "service_completed_successfully"}, name
    for name in INFRA:
        assert conditions(name) == {}, name


# -------------------------------------------------------------------------------- volumes


def test_volumes(services: dict) -> None:
    def mounts(name: str) -> dict[str, dict]:
        return {m["target"]: m for m in services[name]["volumes"]}

    assert mounts("redis")["/data"]["source"] == "redis-data"
    assert services["redis"]["command"][services["redis"]["command"].index("--appendonly") + 1] == "yes"
    assert mounts("postgres")["/var/lib/postgresql/data"]["source"] == "postgres-data"
    for name in MXQ_SERVICES:
        env, found = services[name]["environment"], mounts(name)
        assert env["MXQ_HOME"] == "/var/lib/mxq", name
        home = found[env["MXQ_HOME"]]
        assert (home["type"], home["source"], home.get("read_only", False)) == (
            "volume", "mxq-home", False), name
        if name == "migrate":
            continue
        data = found[env["MXQ_DATA_ROOT"]]
        assert data["type"] == "bind" and data.get("read_only") is True, name
        assert Path(data["source"]) == ROOT / _env_example()["MXQ_DATA_DIR"], name


# -------------------------------------------------------------------------------- secrets


def test_every_variable_is_in_env_example(raw: dict) -> None:
    used = set(VARIABLE.findall(json.dumps(raw)))
    assert {*SECRETS, "MXQ_NODE", "MXQ_IMAGE", "REDIS_HOST", "POSTGRES_HOST", "MXQ_DATA_DIR"} <= used
    assert used <= set(_env_example()), f"not in .env.example: {used - set(_env_example())}"


@pytest.mark.parametrize("secret", SECRETS)
def test_compose_refuses_to_start_without_a_secret(compose: Compose, secret: str) -> None:
    assert _env_example()[secret] == "", f".env.example must leave {secret} empty"
    for env in (_filled_env(**{secret: None}), _filled_env(**{secret: ""})):
        proc = compose(env, "config", "-q")
        assert proc.returncode != 0
        assert f"required variable {secret} is missing a value" in proc.stderr, proc.stderr


def test_no_secret_in_the_compose_file(raw: dict) -> None:
    for name, svc in raw["services"].items():
        for key, value in svc.get("environment", {}).items():
            if SECRET_NAME.search(key):  # from .env: required, or optional with no default
                assert re.fullmatch(rf"\$\{{{key}(:\?[^}}]+|:-)\}}", value), (name, key, value)
    # A password in a URL must be a required variable too.
    credentials = re.findall(r'://([^:/@\s"]+):([^@"]+)@', json.dumps(raw))
    assert credentials, "the database URL carries the password"
    for user, password in credentials:
        assert re.fullmatch(r"\$\{POSTGRES_PASSWORD:\?[^}]+\}", password), (user, password)
    text = COMPOSE_FILE.read_text()
    assert PASSWORD not in text and TOKEN not in text and "change-me" not in text


def test_secrets_end_up_only_where_they_are_needed(services: dict) -> None:
    for name, svc in services.items():
        env = dict(svc.get("environment", {}))
        if name in MXQ_SERVICES:
            assert env.pop("MXQ_DATABASE_URL") == f"postgresql://mxq:{PASSWORD}@postgres:5432/mxq"
        if name == "postgres":
            assert env.pop("POSTGRES_PASSWORD") == PASSWORD
        if name == "api":
            assert env.pop("MXQ_API_TOKEN") == TOKEN
        rest = json.dumps({**svc, "environment": env})
        assert PASSWORD not in rest and TOKEN not in rest, name


def test_an_extra_node_points_its_worker_at_the_first_machine(compose: Compose) -> None:
    env = _filled_env(MXQ_NODE="box2", REDIS_HOST="10.0.0.5", POSTGRES_HOST="10.0.0.5")
    worker = _config(compose, env)["services"]["worker"]["environment"]
    assert worker["MXQ_BROKER_URL"] == "redis://10.0.0.5:6379/0"
    assert worker["MXQ_DATABASE_URL"] == f"postgresql://mxq:{PASSWORD}@10.0.0.5:5432/mxq"
    assert worker["MXQ_NODE"] == "box2"


def _extra_hosts(svc: dict) -> dict[str, str]:
    """name -> address; Compose writes an entry as `name=address` (older ones `name:address`)."""
    return dict(re.split(r"[=:]", entry, maxsplit=1) for entry in svc.get("extra_hosts", []))


def test_the_worker_is_on_the_hosts_network_for_multinode_training(compose: Compose, services: dict) -> None:
    """Multi-node training across hosts (issue 30, finding 6): ps-lite binds the very address it
    announces, so the worker must own an address the other hosts reach: the host's network. Its
    `redis` and `postgres`, which no project network resolves there, are the published ports."""
    worker = services["worker"]
    assert worker["network_mode"] == "host"
    assert not {"ports", "networks"} & set(worker)  # neither means anything on the host's network
    assert _extra_hosts(worker) == {"redis": "127.0.0.1", "postgres": "127.0.0.1", "minio": "127.0.0.1"}
    assert {services[n]["ports"][0]["host_ip"] for n in INFRA} == {"127.0.0.1"}
    first = _config(compose, _filled_env(SERVICES_BIND="10.0.0.5"))["services"]
    assert _extra_hosts(first["worker"]) == {"redis": "10.0.0.5", "postgres": "10.0.0.5", "minio": "10.0.0.5"}
    assert {first[n]["ports"][0]["host_ip"] for n in INFRA} == {"10.0.0.5"}
    for name in MXQ_SERVICES - {"worker"}:
        assert "network_mode" not in services[name], name  # they reach redis/postgres by name
    # MXQ_NODE_ADDRESS is left unset: on the host's network its default is the host's address
    assert "MXQ_NODE_ADDRESS" not in worker["environment"]
    assert Settings(**{k.removeprefix("MXQ_").lower(): v for k, v in worker["environment"].items()
                       if k.startswith("MXQ_")}).node_address is None


def test_deployment_page_covers_the_compose_file() -> None:
    section = (ROOT / "docs" / "deployment.md").read_text()
    for needed in ("cp .env.example .env", "docker compose up -d --build", "--no-deps worker",
                   "MXQ_NODE", "REDIS_HOST", "NFS", "6379", "5432", "mxq worker --node",
                   BASE_IMAGE, "NVIDIA_DRIVER_CAPABILITIES", "make compose", "network_mode: host",
                   "MXQ_NODE_ADDRESS", "--nodes 2"):
        assert needed in section, needed
    assert "worker-gpu" not in section and "MXQ_HOST_GPUS" not in section


# ------------------------------------------------------------------------------- Dockerfile


def _dockerfile() -> list[list[tuple[str, str]]]:
    """The instructions of each stage (continuations joined, global ARGs substituted)."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    global_args: dict[str, str] = {}
    stages: list[list[tuple[str, str]]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, rest = line.partition(" ")
        instruction, rest = instruction.upper(), rest.strip()
        if instruction == "ARG" and not stages:
            name, _, default = rest.partition("=")
            global_args[name] = default
        elif instruction == "FROM":
            rest = re.sub(r"\$\{?(\w+)\}?", lambda m: global_args[m[1]], rest)
            stages.append([])
        if stages:
            stages[-1].append((instruction, rest))
    return stages


def _all(stage: list[tuple[str, str]], instruction: str) -> list[str]:
    return [rest for i, rest in stage if i == instruction]


def test_dockerfile_builds_on_python_slim_bookworm_without_a_cuda_image() -> None:
    stages = _dockerfile()
    assert len(stages) >= 2
    assert [stage[0][1].split()[0] for stage in stages] == [BASE_IMAGE] * len(stages)
    code = [rest for stage in stages for _, rest in stage]
    assert not any("nvidia/cuda" in rest for rest in code)
    final = stages[-1]
    assert "--from=build /opt/mxq /opt/mxq" in _all(final, "COPY")
    assert re.search(r"apt-get install [^&]*\blibgomp1\b", " ".join(_all(final, "RUN")))


def test_dockerfile_sets_what_the_container_toolkit_and_mxq_read() -> None:
    env = dict(re.findall(r"(\w+)=(\S+)", " ".join(_all(_dockerfile()[-1], "ENV"))))
    assert {"compute", "utility"} <= set(env["NVIDIA_DRIVER_CAPABILITIES"].split(","))
    assert "NVIDIA_VISIBLE_DEVICES" not in env  # GPUs only where compose reserves them
    assert env["MXQ_HOME"] == "/var/lib/mxq" and env["MXQ_DATA_ROOT"] == "/data"
    assert env["PATH"].startswith("/opt/mxq/bin:")


def test_dockerfile_installs_the_gpu_extra_and_every_package() -> None:
    build_stage = _dockerfile()[0]
    runs = " ".join(_all(build_stage, "RUN"))
    assert re.search(r'pip install[^&]*"\.\[\$\{MXQ_EXTRA\}\]"', runs), runs
    assert "optional-dependencies'][sys.argv[1]]" in runs  # the wheels, from pyproject.toml first
    assert "gpu|gpu-onnx) ;;" in runs  # any other extra fails the build, saying which are allowed
    assert "MXQ_EXTRA" in _all(build_stage, "ARG")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    folders = set(project["tool"]["setuptools"]["package-dir"].values())  # core/, db/, workers/, ...
    copies = [rest.split()[0] for rest in _all(build_stage, "COPY")]
    assert copies[0] == "pyproject.toml"
    assert folders | {"README.md"} <= set(copies), f"not copied: {folders - set(copies)}"


def test_dockerfile_runs_mxq_as_a_non_root_user() -> None:
    final = _dockerfile()[-1]
    assert _all(final, "USER")[-1].split(":")[0] not in ("root", "0")
    runs = " ".join(_all(final, "RUN"))
    assert "useradd --uid \"${MXQ_UID}\"" in runs and "MXQ_UID=1000" in _all(final, "ARG")
    assert "/opt/mxq/bin/mxq --help" in runs  # the build's smoke check
    assert _all(final, "ENTRYPOINT") == ['["mxq"]']


def test_dockerfile_bakes_in_no_secret() -> None:
    for stage in _dockerfile():
        for instruction, rest in stage:
            if instruction in ("ENV", "ARG"):
                names = re.findall(r"(\w+)=", rest) or [rest.split()[0]]
                assert not any(SECRET_NAME.search(n) for n in names), (instruction, rest)
            if instruction in ("COPY", "ADD"):
                assert not any(p.startswith(".env") for p in rest.split()), rest


def test_dockerignore_keeps_state_and_secrets_out_of_the_build() -> None:
    patterns = [line.strip().rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]

    def ignored(path: str) -> bool:
        return any(fnmatch.fnmatch(path, p) for p in patterns)

    for path in ("var", ".venv", ".venv-gpu", ".env", ".git", "tests", ".pytest_cache"):
        assert ignored(path), path
    copied = [rest.split()[0] for rest in _all(_dockerfile()[0], "COPY")]
    assert {"pyproject.toml", "core", "db"} <= set(copied)
    for path in copied:
        assert not ignored(path), path  # what the Dockerfile copies
