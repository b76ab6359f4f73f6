"""docker-compose.yml, Dockerfile, .env.example and .dockerignore, checked by parsing.

There is no Docker engine here, so the file is validated the way `docker compose config` would
as far as that goes without one: variables interpolated from .env.example (and refused while a
secret is unset), known keys only, every named volume declared, every dependency a service, no
dependency cycle. The worker-per-GPU layout is checked against a recorded `nvidia-smi` listing
parsed by the project's own parser.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import replace
from typing import Any

import pytest
import yaml

from tests.conftest import FIXTURES, ROOT
from workers.devices import incompatibility, parse_nvidia_smi, relabel
from workers.launcher import schedule_spec
from workers.settings import Settings

COMPOSE = ROOT / "docker-compose.yml"
# docker-compose.yml is laid out for a 4-GPU box: one worker service per GPU of this listing.
GPU_FIXTURE = FIXTURES / "nvidia-smi" / "a100x4.csv"
# The image's MXNet build (the `gpu` extra): every GPU in the fixture must be one it can run on.
IMAGE_MXNET = "mxnet-cu112"
INFRA = {"redis", "postgres"}
ONE_SHOT = {"migrate"}
SECRETS = ("POSTGRES_PASSWORD", "MXQ_API_TOKEN")
SECRET_NAME = re.compile(r"PASSWORD|TOKEN|SECRET|PASSWD|API_KEY|PRIVATE_KEY", re.I)
# Compose-file keys of the Compose Specification (services, healthcheck, depends_on, devices).
SERVICE_KEYS = frozenset("""
    annotations attach blkio_config build cap_add cap_drop cgroup cgroup_parent command configs
    container_name cpu_count cpu_percent cpu_period cpu_quota cpu_rt_period cpu_rt_runtime
    cpu_shares cpus cpuset credential_spec depends_on deploy develop device_cgroup_rules devices
    dns dns_opt dns_search domainname entrypoint env_file environment expose extends
    external_links extra_hosts gpus group_add healthcheck hostname image init ipc isolation
    label_file labels links logging mac_address mem_limit mem_reservation mem_swappiness
    memswap_limit models network_mode networks oom_kill_disable oom_score_adj pid pids_limit
    platform ports post_start pre_stop privileged profiles provider pull_policy
    pull_refresh_after read_only restart runtime scale secrets security_opt shm_size stdin_open
    stop_grace_period stop_signal storage_opt sysctls tmpfs tty ulimits use_api_socket user
    userns_mode uts volumes volumes_from working_dir""".split())
HEALTHCHECK_KEYS = {"test", "interval", "timeout", "retries", "start_period", "start_interval",
                    "disable"}
CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}
DEVICE_KEYS = {"capabilities", "count", "device_ids", "driver", "options"}
RESTART = re.compile(r"^(no|always|unless-stopped|on-failure(:\d+)?)$")
DURATION = re.compile(r"^(\d+(\.\d+)?(us|ms|s|m|h))+$")
# ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?error}, ${NAME?error}, ${NAME:+x}, $NAME, $$
VARIABLE = re.compile(r"\$(?:(?P<escaped>\$)|\{(?P<name>[A-Za-z_]\w*)(?:(?P<op>:?[-?+])"
                      r"(?P<arg>[^}]*))?\}|(?P<bare>[A-Za-z_]\w*))")


# ---------------------------------------------------------------------------------- helpers


def _raw() -> dict:
    """The file as YAML gives it: anchors and merge keys resolved, variables not."""
    return yaml.safe_load(COMPOSE.read_text())


def _env_example() -> dict[str, str]:
    values = {}
    for line in (ROOT / ".env.example").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, sep, value = line.partition("=")
            assert sep, f".env.example: {line!r} is not KEY=VALUE"
            values[key.strip()] = value.strip()
    return values


def _filled_env() -> dict[str, str]:
    """.env.example with its secrets set, as an operator's .env would be."""
    return {**_env_example(), "POSTGRES_PASSWORD": "pw-0123abcd", "MXQ_API_TOKEN": "tok-4567efgh"}


def _interpolate(value: Any, env: dict[str, str], errors: list[str]) -> Any:
    """Compose's variable substitution over every string of the parsed file."""
    if isinstance(value, dict):
        return {k: _interpolate(v, env, errors) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, env, errors) for v in value]
    if not isinstance(value, str):
        return value

    def substitute(m: re.Match) -> str:
        if m["escaped"]:
            return "$"
        name, op, arg = m["name"] or m["bare"], m["op"], m["arg"]
        current = env.get(name)
        if op in (":?", "?") and (current is None or (op == ":?" and current == "")):
            errors.append(f"{name}: {arg}")
            return ""
        if op == ":-":
            return current or arg
        if op == "-":
            return arg if current is None else current
        if op in (":+", "+"):
            return arg if (current if op == ":+" else current is not None) else ""
        if current is None:
            errors.append(f"{name} is not set and has no default")
            return ""
        return current

    return VARIABLE.sub(substitute, value)


def _config(env: dict[str, str] | None = None) -> dict:
    """What `docker compose config` would print with this .env (raises on an unset secret)."""
    errors: list[str] = []
    config = _interpolate(_raw(), _filled_env() if env is None else env, errors)
    if errors:
        raise ValueError("; ".join(errors))
    return config


def _services() -> dict[str, dict]:
    return _config()["services"]


def _workers() -> dict[str, dict]:
    return {n: s for n, s in _services().items() if n.startswith("worker-gpu")}


def _mxq_services() -> dict[str, dict]:
    return {n: s for n, s in _services().items() if n not in INFRA}


def _long_running() -> dict[str, dict]:
    return {n: s for n, s in _services().items() if n not in ONE_SHOT}


def _mounts(service: dict) -> dict[str, tuple[str, str]]:
    """Container path -> (source, mode) for the short volume syntax."""
    out = {}
    for spec in service.get("volumes", []):
        parts = spec.split(":")
        source, target, mode = parts[0], parts[1], parts[2] if len(parts) > 2 else "rw"
        out[target] = (source, mode)
    return out


def _is_bind(source: str) -> bool:
    return source.startswith((".", "/", "~"))


def _dockerfile() -> tuple[dict[str, str], list[list[tuple[str, str]]]]:
    """Global ARG defaults, and the instructions of each stage (continuations joined)."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    global_args: dict[str, str] = {}
    stages: list[list[tuple[str, str]]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, rest = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            stages.append([])
        if instruction == "ARG" and not stages:
            name, _, default = rest.strip().partition("=")
            global_args[name] = default
        if stages:
            stages[-1].append((instruction, rest.strip()))
    return global_args, stages


def _final_stage() -> list[tuple[str, str]]:
    return _dockerfile()[1][-1]


def _from_image(stage: list[tuple[str, str]]) -> str:
    global_args, _ = _dockerfile()
    image = stage[0][1].split()[0]
    return re.sub(r"\$\{?(\w+)\}?", lambda m: global_args[m[1]], image)


# --------------------------------------------------------------------------------- services


def test_services_exist() -> None:
    services = _services()
    assert {"redis", "postgres", "migrate", "api", "scheduler"} <= set(services)
    assert _workers(), "no worker-gpuN service"
    assert set(services) == {"redis", "postgres", "migrate", "api", "scheduler", *_workers()}


def test_every_service_uses_only_compose_keys() -> None:
    config = _config()
    assert {k for k in config if not k.startswith("x-")} <= {"services", "volumes", "networks"}
    for name, svc in config["services"].items():
        assert re.fullmatch(r"[a-zA-Z0-9._-]+", name)
        assert set(svc) <= SERVICE_KEYS, (name, set(svc) - SERVICE_KEYS)
        assert set(svc.get("healthcheck", {})) <= HEALTHCHECK_KEYS, name
        assert RESTART.match(str(svc.get("restart", "no"))), name
        for key in ("stop_grace_period",):
            assert key not in svc or DURATION.match(svc[key]), (name, key)
        for key in ("interval", "timeout", "start_period"):
            if key in svc.get("healthcheck", {}):
                assert DURATION.match(svc["healthcheck"][key]), (name, key)
        env = svc.get("environment", {})
        assert isinstance(env, dict), f"{name}: environment as a mapping"
        for key, value in env.items():
            assert isinstance(value, str | int | float | bool) or value is None, (name, key)
        for port in svc.get("ports", []):
            assert re.fullmatch(r"(\d+\.\d+\.\d+\.\d+:)?\d+:\d+(/tcp|/udp)?", port), (name, port)


def test_commands_are_mxq_commands() -> None:
    import typer.main

    from cli.main import app

    known = set(typer.main.get_command(app).commands)
    services = _services()
    assert services["migrate"]["command"] == ["migrate"]
    assert services["api"]["command"] == ["api"]
    assert services["scheduler"]["command"] == ["scheduler"]
    for name, svc in _workers().items():
        assert svc["command"] == ["worker"], name
    for name, svc in _mxq_services().items():
        assert svc["command"][0] in known, (name, svc["command"])


def test_every_mxq_service_builds_from_the_dockerfile() -> None:
    images = set()
    for name, svc in _mxq_services().items():
        build = svc["build"]
        context = build if isinstance(build, str) else build["context"]
        dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
        assert (ROOT / context / dockerfile).resolve() == ROOT / "Dockerfile", name
        images.add(svc["image"])
    assert len(images) == 1, f"one image for every mxq service, got {images}"
    for name in INFRA:
        assert "build" not in _services()[name] and _services()[name]["image"]


def test_image_tag_comes_from_env() -> None:
    env = {**_filled_env(), "MXQ_IMAGE": "registry.example/mxq:1.2.3"}
    assert {s["image"] for n, s in _config(env)["services"].items() if n not in INFRA} == {
        "registry.example/mxq:1.2.3"}


# ------------------------------------------------------------------------------- Dockerfile


def test_dockerfile_runs_on_a_cuda_11_2_runtime_image() -> None:
    image = _from_image(_final_stage())
    assert re.fullmatch(r"nvidia/cuda:11\.2(\.\d+)?-(cudnn\d+-)?runtime-ubuntu\d+\.\d+", image), image


def test_dockerfile_copies_python_3_11_built_for_the_same_glibc() -> None:
    _, stages = _dockerfile()
    assert len(stages) >= 2
    python = _from_image(stages[0])
    # Ubuntu 20.04 and Debian 11 "bullseye" share glibc 2.31: an interpreter built on bookworm
    # (2.36) would not run on the CUDA 11.2 image.
    assert re.fullmatch(r"python:3\.11[\w.-]*-bullseye", python), python
    assert "ubuntu20.04" in _from_image(_final_stage())
    copies = [rest for instruction, rest in _final_stage() if instruction == "COPY"]
    assert any(c.startswith("--from=build /usr/local") for c in copies)


def test_dockerfile_installs_the_gpu_extra_and_every_package() -> None:
    build_stage = _dockerfile()[1][0]
    runs = " ".join(rest for instruction, rest in build_stage if instruction == "RUN")
    assert re.search(r"pip install[^&]*'\.\[gpu\]'", runs), runs
    assert "optional-dependencies']['gpu']" in runs  # the wheels, from pyproject.toml
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {p.split(".")[0] for p in project["tool"]["setuptools"]["packages"]}
    copied = {rest.split()[0] for instruction, rest in build_stage if instruction == "COPY"}
    assert packages <= copied, f"not copied into the image: {packages - copied}"
    assert {"pyproject.toml", "README.md"} <= copied


def test_dockerfile_runs_as_a_non_root_user() -> None:
    users = [rest for instruction, rest in _final_stage() if instruction == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), users
    runs = " ".join(rest for instruction, rest in _final_stage() if instruction == "RUN")
    assert "useradd" in runs
    entry = [rest for instruction, rest in _final_stage() if instruction == "ENTRYPOINT"]
    assert entry == ['["mxq"]']


def test_dockerfile_bakes_in_no_secret() -> None:
    _, stages = _dockerfile()
    for stage in stages:
        for instruction, rest in stage:
            if instruction in ("ENV", "ARG"):
                names = re.findall(r"(\w+)=", rest) or [rest.split()[0]]
                assert not any(SECRET_NAME.search(n) for n in names), (instruction, rest)
            if instruction in ("COPY", "ADD"):
                assert ".env" not in rest.split(), rest
    text = (ROOT / "Dockerfile").read_text()
    assert "change-me" not in text


def test_dockerignore_keeps_state_and_secrets_out_of_the_build() -> None:
    patterns = {line.strip().rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")}
    assert {"var", ".venv", ".git", ".env", ".pytest_cache", "tests"} <= patterns
    # ...but not what the Dockerfile copies.
    needed = {"pyproject.toml", "README.md", "api", "cli", "db", "tasks", "workers"}
    assert not needed & patterns


# ----------------------------------------------------------------------------------- GPUs


def test_each_worker_reserves_exactly_its_own_gpu() -> None:
    seen = []
    for name, svc in _workers().items():
        index = re.fullmatch(r"worker-gpu(\d+)", name).group(1)
        (dev,) = svc["deploy"]["resources"]["reservations"]["devices"]
        assert set(dev) <= DEVICE_KEYS and "count" not in dev, name
        assert dev["driver"] == "nvidia" and dev["capabilities"] == ["gpu"], name
        assert dev["device_ids"] == [index], name
        assert svc["environment"]["MXQ_HOST_GPUS"] == index, name
        seen.append(index)
    assert len(seen) == len(set(seen))
    for name, svc in _services().items():
        if name not in _workers():
            assert "deploy" not in svc and "gpus" not in svc, f"{name} must not reserve a GPU"
            if name not in INFRA:
                assert svc["environment"].get("NVIDIA_VISIBLE_DEVICES") == "void", name


def test_one_worker_per_gpu_of_the_recorded_host() -> None:
    gpus = parse_nvidia_smi(GPU_FIXTURE.read_text())
    assert {str(g.index) for g in gpus} == {
        re.fullmatch(r"worker-gpu(\d+)", n).group(1) for n in _workers()}
    # ...and the image's MXNet can run on each of them (mxnet-cu112 stops at sm_86).
    assert [incompatibility(g, IMAGE_MXNET) for g in gpus] == [None] * len(gpus)


def test_a_worker_container_names_its_gpu_by_the_host_index() -> None:
    """Inside worker-gpuN nvidia-smi lists one GPU, as index 0; MXQ_HOST_GPUS makes it gpu:N."""
    host = parse_nvidia_smi(GPU_FIXTURE.read_text())
    for name, svc in _workers().items():
        index = int(svc["environment"]["MXQ_HOST_GPUS"])
        seen_inside = [replace(g, index=0, visible_index=0) for g in host if g.index == index]
        settings = Settings(host_gpus=svc["environment"]["MXQ_HOST_GPUS"], node="gpubox")
        (gpu,) = relabel(seen_inside, settings.host_gpu_ids)
        assert gpu.label == f"gpu:{index}" and gpu.visible_index == 0, name


def test_workers_share_one_environment() -> None:
    workers = list(_workers().values())
    envs = [{k: v for k, v in w["environment"].items() if k != "MXQ_HOST_GPUS"} for w in workers]
    assert all(e == envs[0] for e in envs)
    env = envs[0]
    assert env["MXQ_BROKER_URL"] == "redis://redis:6379/0"
    assert env["MXQ_DATABASE_URL"] == "postgresql://mxq:pw-0123abcd@postgres:5432/mxq"
    assert env["MXQ_NODE"] == _env_example()["MXQ_NODE"]
    Settings(**{k.removeprefix("MXQ_").lower(): v for k, v in env.items()  # all valid settings
                if k.startswith("MXQ_")})
    assert _raw()["services"]["worker-gpu0"]["environment"]["MXQ_NODE"].startswith("${MXQ_NODE:-")


def test_an_extra_node_points_its_workers_at_the_first_machine() -> None:
    env = {**_filled_env(), "MXQ_NODE": "box2", "REDIS_HOST": "10.0.0.5",
           "POSTGRES_HOST": "10.0.0.5"}
    worker = _config(env)["services"]["worker-gpu0"]["environment"]
    assert worker["MXQ_BROKER_URL"] == "redis://10.0.0.5:6379/0"
    assert worker["MXQ_DATABASE_URL"] == "postgresql://mxq:pw-0123abcd@10.0.0.5:5432/mxq"
    assert worker["MXQ_NODE"] == "box2"


# -------------------------------------------------------------------------------- volumes


def test_volumes() -> None:
    config = _config()
    services = config["services"]
    redis = services["redis"]
    assert _mounts(redis)["/data"] == ("redis-data", "rw")
    assert "--appendonly" in redis["command"]
    assert redis["command"][redis["command"].index("--appendonly") + 1] == "yes"
    assert _mounts(services["postgres"])["/var/lib/postgresql/data"] == ("postgres-data", "rw")
    assert {"redis-data", "postgres-data", "mxq-home"} <= set(config["volumes"])


def test_workers_api_and_scheduler_share_one_store_and_read_only_data() -> None:
    for name, svc in _long_running().items():
        if name in INFRA:
            continue
        env, mounts = svc["environment"], _mounts(svc)
        assert mounts[env["MXQ_HOME"]] == ("mxq-home", "rw"), name
        source, mode = mounts[env["MXQ_DATA_ROOT"]]
        assert _is_bind(source) and mode == "ro", name


def test_every_named_volume_is_declared_and_used() -> None:
    config = _config()
    used = {source for svc in config["services"].values()
            for source, _ in _mounts(svc).values() if not _is_bind(source)}
    assert used == set(config["volumes"]), (used, set(config["volumes"]))


# ------------------------------------------------------------------- health and start order


def test_every_long_running_service_has_a_health_check_and_a_restart_policy() -> None:
    for name, svc in _long_running().items():
        test = svc["healthcheck"]["test"]
        assert test[0] in ("CMD", "CMD-SHELL") and len(test) > 1, name
        assert svc["restart"] in ("unless-stopped", "always"), name
    migrate = _services()["migrate"]
    assert "healthcheck" not in migrate and migrate["restart"] == "no"


def test_infrastructure_health_checks() -> None:
    services = _services()
    assert services["redis"]["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    assert "pg_isready" in " ".join(services["postgres"]["healthcheck"]["test"])


def test_api_health_check_asks_the_api() -> None:
    api = _services()["api"]
    env = api["environment"]
    assert env["MXQ_API_HOST"] == "0.0.0.0"
    assert _raw()["services"]["api"]["environment"]["MXQ_API_TOKEN"].startswith("${MXQ_API_TOKEN:?")
    cmd, program = api["healthcheck"]["test"][:3], api["healthcheck"]["test"][3]
    assert cmd == ["CMD", "python", "-c"]
    compile(program, "healthcheck", "exec")
    assert f"http://127.0.0.1:{env['MXQ_API_PORT']}/api/v1/devices" in program
    assert api["ports"] == [f"127.0.0.1:8470:{env['MXQ_API_PORT']}"]


def test_scheduler_health_check_pings_the_schedule_worker() -> None:
    svc = _services()["scheduler"]
    kind, script = svc["healthcheck"]["test"]
    assert kind == "CMD-SHELL"
    node = svc["environment"]["MXQ_NODE"]
    expanded = script.replace("${MXQ_NODE}", node)
    name = schedule_spec(Settings(node=node)).name
    assert shlex.split(expanded)[:5] == ["celery", "-A", "workers", "inspect", "ping"]
    assert f"-d {name}" in " ".join(shlex.split(expanded))
    # `$$` in the file: compose leaves `$` for the container's shell, not its own interpolation.
    assert "$${MXQ_NODE}" in _raw()["services"]["scheduler"]["healthcheck"]["test"][1]


def _worker_probe(records: list[dict], node: str, host_gpu: str) -> int:
    """Run the worker health check's filter on `mxq devices --json` output, as the container would."""
    kind, script = _workers()["worker-gpu0"]["healthcheck"]["test"]
    assert kind == "CMD-SHELL"
    producer, consumer = (part.strip() for part in script.split("|"))
    assert shlex.split(producer) == ["mxq", "devices", "--json"]
    argv = shlex.split(consumer)
    assert argv[:2] == ["python", "-c"]
    import json

    proc = subprocess.run([sys.executable, "-c", argv[2]], input=json.dumps(records), text=True,
                          capture_output=True, timeout=60,
                          env={"MXQ_NODE": node, "MXQ_HOST_GPUS": host_gpu})
    return proc.returncode


def test_worker_health_check_is_its_own_device_alive() -> None:
    records = [
        {"device": "gpu:0", "node": "gpubox", "alive": True},
        {"device": "gpu:1", "node": "gpubox", "alive": False},
        {"device": "gpu:1", "node": "box2", "alive": True},
    ]
    assert _worker_probe(records, "gpubox", "0") == 0
    assert _worker_probe(records, "gpubox", "1") != 0  # its heartbeat is stale
    assert _worker_probe(records, "gpubox", "2") != 0  # never registered
    assert _worker_probe([], "gpubox", "0") != 0


def test_depends_on() -> None:
    services = _services()
    for name, svc in services.items():
        for target, spec in svc.get("depends_on", {}).items():
            assert target in services, (name, target)
            assert spec["condition"] in CONDITIONS, (name, target)
            if spec["condition"] == "service_healthy":
                assert "healthcheck" in services[target], (name, target)
    assert services["migrate"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    for name, svc in _long_running().items():
        if name in INFRA:
            assert "depends_on" not in svc
            continue
        assert svc["depends_on"] == {
            "redis": {"condition": "service_healthy"},
            "postgres": {"condition": "service_healthy"},
            "migrate": {"condition": "service_completed_successfully"},
        }, name


def test_no_dependency_cycle() -> None:
    services = _services()
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"dependency cycle {' -> '.join((*path, name))}"
        if name not in done:
            for target in services[name].get("depends_on", {}):
                visit(target, (*path, name))
            done.add(name)

    for name in services:
        visit(name, ())


# -------------------------------------------------------------------------------- secrets


def _strings(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []


def test_every_variable_is_in_env_example() -> None:
    defined = set(_env_example())
    used = {m["name"] or m["bare"] for s in _strings(_raw()) for m in VARIABLE.finditer(s)
            if not m["escaped"]}
    assert {"POSTGRES_PASSWORD", "MXQ_API_TOKEN", "MXQ_NODE", "MXQ_IMAGE"} <= used
    assert used <= defined, f"not in .env.example: {used - defined}"
    _config(_filled_env())  # and with them set, everything resolves


@pytest.mark.parametrize("secret", SECRETS)
def test_compose_refuses_to_start_without_a_secret(secret: str) -> None:
    assert _env_example()[secret] == "", f".env.example must leave {secret} empty"
    with pytest.raises(ValueError, match=secret):
        _config({**_filled_env(), secret: ""})
    env = _filled_env()
    del env[secret]
    with pytest.raises(ValueError, match=secret):
        _config(env)


def test_no_secret_in_the_compose_file() -> None:
    text = COMPOSE.read_text()
    assert "change-me" not in text
    for service in _raw()["services"].values():
        for key, value in (service.get("environment") or {}).items():
            if SECRET_NAME.search(key):
                assert re.fullmatch(rf"\$\{{{key}:\?[^}}]+\}}", str(value)), (key, value)
    # A password in a URL must be a required variable too.
    credentials = re.findall(r"://([^:/@\s]+):([^@\n]+)@", text)
    assert credentials, "the database URL carries the password"
    for user, password in credentials:
        assert re.fullmatch(r"\$\{[A-Z_]+:\?[^}]+\}", password), (user, password)
    assert "${POSTGRES_PASSWORD:?" in text


def test_secrets_end_up_only_where_they_are_needed() -> None:
    config = _config()
    for name, svc in config["services"].items():
        dumped = yaml.safe_dump(svc)
        assert ("tok-4567efgh" in dumped) == (name == "api"), name
        assert ("pw-0123abcd" in dumped) == (name != "redis"), name
        assert "pw-0123abcd" not in str(svc.get("healthcheck", "")), name
        if isinstance(svc.get("build"), dict):
            assert not any(SECRET_NAME.search(k) for k in svc["build"].get("args", {})), name


def test_readme_deployment_section_covers_the_compose_file() -> None:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Deployment", 1)[1].split("\n## ", 1)[0]
    for needed in ("cp .env.example .env", "docker compose up -d --build", "MXQ_HOST_GPUS",
                   "device_ids", "NFS", "6379", "5432", "mxq worker --node"):
        assert needed in section, needed
