"""The configuration tree: precedence, every problem at once, mini-syntax, twins, round trip."""

from __future__ import annotations

import argparse
import dataclasses
import tomllib
from pathlib import Path

import pytest

from cortex.config import (
    ControlConfig,
    CortexConfig,
    ModelConfig,
    add_config_arguments,
    dump_toml,
    env_name,
    file_checks,
    flag_name,
    load_config,
)
from cortex.config.docs import DOCS, SECTIONS
from cortex.config.sources import keys
from cortex.errors import ConfigError
from cortex.front.limits import ServerLimits
from cortex.scheduling.cost import BoundedLoad
from cortex.scheduling.view import Role
from cortex.workers.discovery import DnsService
from cortex.workers.spec import WorkerSpec

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "packaging" / "cortex.toml"
TOKEN = "s3cret-token-of-the-admin-api"


def parser() -> argparse.ArgumentParser:
    result = argparse.ArgumentParser(allow_abbrev=False)
    add_config_arguments(result)
    return result


def flags(*argv: str) -> argparse.Namespace:
    return parser().parse_args(list(argv))


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "cortex.toml"
    path.write_text(text)
    return str(path)


def problems_of(*args, **kwargs) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config(*args, **kwargs)
    return caught.value.problems


def test_defaults_without_any_source():
    assert load_config(env={}) == CortexConfig()


def test_precedence_file_then_env_then_flag(tmp_path):
    path = write(tmp_path, """
[server]
port = 1001
host = "127.0.0.2"
[server.limits]
max_body_bytes = 1000
header_timeout_s = 1.5
[scheduler.watermarks]
max_in_flight = 10
[log]
json = false
""")
    env = {"CORTEX_SERVER_PORT": "2002", "CORTEX_SERVER_LIMITS_MAX_BODY_BYTES": "2000",
           "CORTEX_SCHEDULER_WATERMARKS_MAX_IN_FLIGHT": "none", "CORTEX_LOG_JSON": "true"}
    argv = ["--server-limits-max-body-bytes", "3000", "--log-json", "false"]

    only_file = load_config(env={}, path=path)
    assert (only_file.server.port, only_file.server.limits.max_body_bytes) == (1001, 1000)
    assert only_file.scheduler.watermarks.max_in_flight == 10
    assert only_file.log.json is False

    with_env = load_config(env=env, path=path)
    assert (with_env.server.port, with_env.server.limits.max_body_bytes) == (2002, 2000)
    assert with_env.scheduler.watermarks.max_in_flight is None
    assert with_env.log.json is True

    everything = load_config(flags(*argv), env=env, path=path)
    assert everything.server.port == 2002  # no flag: env wins over the file
    assert everything.server.limits.max_body_bytes == 3000
    assert everything.log.json is False
    # untouched keys keep the file's value or the default
    assert everything.server.host == "127.0.0.2"
    assert everything.server.limits.header_timeout_s == 1.5
    assert everything.server.limits.max_header_count == ServerLimits().max_header_count


def test_config_file_from_flag_or_env(tmp_path):
    path = write(tmp_path, "[health]\ninterval_s = 7\n")
    assert load_config(env={"CORTEX_CONFIG": path}).health.interval_s == 7.0
    assert load_config(flags("--config", path), env={}).health.interval_s == 7.0
    assert problems_of(env={"CORTEX_CONFIG": str(tmp_path / "missing.toml")})[0].startswith(
        f"config file {tmp_path / 'missing.toml'}")


def test_a_file_with_five_mistakes_gives_five_problems(tmp_path):
    path = write(tmp_path, """
[server]
prot = 8080                      # 1 unknown key
[server.limits]
max_body_bytes = "big"           # 2 wrong type
[control]
host = "0.0.0.0"                 # 3 admin token on a public host without allow_remote
admin_token = "s3cret-token-of-the-admin-api"
[upstream.limits]
max_idle_per_worker = 500        # 4 the section's own check (more idle than connections)
[[workers]]
name = "a"
url = "http://10.0.0.1:30000"
[[workers]]
name = "a"                       # 5 duplicate worker name
url = "http://10.0.0.2:30000"
""")
    problems = problems_of(env={}, path=path)
    assert len(problems) == 5, problems
    text = "\n".join(problems)
    assert "unknown key server.prot (did you mean port?)" in text
    assert "server.limits.max_body_bytes: expected an integer, got 'big'" in text
    assert "allow_remote" in text
    assert "upstream.limits: max_idle_per_worker must be <= max_connections_per_worker" in text
    assert "name 'a' is used by 2 workers" in text


def test_problems_from_every_layer_are_reported_together(tmp_path):
    path = write(tmp_path, "[health]\nfailures_to_open = 0\n")
    env = {"CORTEX_SERVR_PORT": "1", "CORTEX_INGEST_RCVHWM": "lots"}
    problems = problems_of(flags("--log-level", "loud", "--worker", "ftp://x"), env=env, path=path)
    text = "\n".join(problems)
    assert len(problems) == 5, problems
    assert "health: failures_to_open must be >= 1" in text
    assert "unknown environment variable CORTEX_SERVR_PORT (did you mean CORTEX_SERVER_PORT?)" \
        in text
    assert "ingest.rcvhwm: expected an integer, got 'lots' (from env CORTEX_INGEST_RCVHWM)" in text
    assert "log.level: must be one of 'debug', 'info', 'warning', 'error', not 'loud' " \
           "(from --log-level)" in text
    assert "url must be http://host:port" in text


def test_foreign_cortex_variables_are_left_alone():
    env = {"CORTEX_SHARED_DIR": "/tmp", "CORTEX_CYTHON_DEBUG": "1", "PATH": "/bin",
           "CORTEX_SIM_PORT": "8000", "CORTEX_SIM_HOST": "0.0.0.0", "CORTEX_SIM_SERVER": "x"}
    assert load_config(env=env) == CortexConfig()
    assert "unknown environment variable CORTEX_SERVER_PROT" in problems_of(
        env={"CORTEX_SERVER_PROT": "1"})[0]


def test_toml_syntax_error_is_a_problem(tmp_path):
    problems = problems_of(env={}, path=write(tmp_path, "[server\nport = 1\n"))
    assert len(problems) == 1 and "not valid TOML" in problems[0]


def test_worker_mini_syntax():
    config = load_config(flags(
        "--worker", "http://10.0.0.1:30000",
        "--worker", "http://10.0.0.2:8000,name=gpu2,engine=vllm,model=m,role=prefill,dp_size=4,"
                    "events=tcp://10.0.0.2:5557,replay=tcp://10.0.0.2:5567,bootstrap-port=8998",
    ), env={})
    first, second = config.workers
    assert first == WorkerSpec(name="10.0.0.1:30000", url="http://10.0.0.1:30000")
    assert second == WorkerSpec(
        name="gpu2", url="http://10.0.0.2:8000", engine="vllm", model="m", role=Role.PREFILL,
        dp_size=4, events="tcp://10.0.0.2:5557", replay="tcp://10.0.0.2:5567",
        bootstrap_port=8998)


def test_worker_mini_syntax_problems():
    problems = problems_of(flags("--worker", "http://h:1,dp_size=two,stray,engine=tgi",
                                 "--worker", "name=x"), env={})
    text = "\n".join(problems)
    assert "workers[0].dp_size: expected an integer, got 'two' (from --worker #1)" in text
    assert "--worker #1: 'stray' is not key=value" in text
    assert "workers[0].engine: must be one of 'vllm', 'sglang', not 'tgi'" in text
    assert "--worker #2: url is required" in text
    assert len(problems) == 5, problems  # + "workers[1].url is required" from the build


def test_env_workers_and_models_and_list_precedence(tmp_path):
    path = write(tmp_path, '[[workers]]\nname = "file"\nurl = "http://f:1"\n')
    env = {"CORTEX_WORKERS": "http://e:1,name=e1  http://e:2,engine=vllm",
           "CORTEX_MODELS": "m1,tokenizer=/t.json,block_size=16 m2,passthrough=true"}
    from_env = load_config(env=env, path=path)
    assert [worker.name for worker in from_env.workers] == ["e1", "e:2"]
    assert from_env.models == (ModelConfig("m1", tokenizer="/t.json", block_size=16),
                               ModelConfig("m2", passthrough=True))
    from_flag = load_config(flags("--worker", "http://c:1,name=c"), env=env, path=path)
    assert [worker.name for worker in from_flag.workers] == ["c"]
    assert load_config(env={}, path=path).workers[0].name == "file"


def test_model_checks_and_worker_model_cross_check():
    problems = problems_of(flags(
        "--model", "m1,block_size=16",
        "--model", "m2,tokenizer=/t.json,block_size=0",
        "--worker", "http://h:1,model=m3",
        "--worker", "http://h:2,model=m1",
    ), env={})
    text = "\n".join(problems)
    assert "model m1: tokenizer is required (or set passthrough = true)" in text
    assert "model m2: block_size must be in [1, 65536]" in text
    # the cross check needs a built tree; it runs once the models are fixed
    fixed = problems_of(flags("--model", "m1,passthrough=true", "--worker", "http://h:1,model=m3",
                              "--worker", "http://h:2,model=m1"), env={})
    assert fixed == ["worker h:1: model 'm3' is not one of the configured models (m1)"]


def test_optional_values_are_spelled_empty_or_none(tmp_path):
    path = write(tmp_path, """
[scheduler]
seed = "none"
[scheduler.bounds]
factor = "none"
[scheduler.watermarks]
max_kv_usage_fraction = ""
[control]
admin_token = ""
""")
    config = load_config(env={"CORTEX_SCHEDULER_SEED": "42"}, path=path)
    assert config.scheduler.seed == 42
    assert config.scheduler.bounds == BoundedLoad(factor=None)
    assert config.scheduler.watermarks.max_kv_usage_fraction is None
    assert config.control.admin_token is None


def test_admin_token_rules():
    assert problems_of(flags("--control-admin-token", TOKEN, "--control-admin-token-file",
                             "/x"), env={}) == [
        "control: set admin_token or admin_token_file, not both"]
    remote = load_config(env={"CORTEX_CONTROL_ADMIN_TOKEN": TOKEN, "CORTEX_CONTROL_HOST": "::",
                              "CORTEX_CONTROL_ALLOW_REMOTE": "yes"})
    assert remote.control.read_admin_token() == TOKEN
    assert TOKEN not in repr(remote)
    # no token: a public control host is fine (the admin API is off)
    assert load_config(flags("--control-host", "0.0.0.0"), env={}).control.host == "0.0.0.0"


def test_admin_token_file(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    control = ControlConfig(admin_token_file=str(token_file))
    assert control.read_admin_token() == TOKEN
    config = load_config(flags("--control-admin-token-file", str(tmp_path / "nope")), env={})
    assert file_checks(config) == [f"control.admin_token_file: no such file {tmp_path / 'nope'}"]


def test_port_clash_between_planes():
    assert problems_of(flags("--control-port", "8080"), env={}) == [
        "server and control both listen on port 8080"]
    assert load_config(flags("--server-port", "0", "--control-port", "0"), env={})


def test_every_scalar_key_has_an_env_twin_a_flag_and_a_meaning():
    options = {option for action in parser()._actions for option in action.option_strings}
    env_twins = {env_name(key.path) for key in keys()}
    for key in keys():
        assert flag_name(key.path) in options
        assert ".".join(key.path) in DOCS
    assert len(env_twins) == len(keys())
    generated = {option for option in options if option.startswith("--")} - {
        "--help", "--config", "--worker", "--model", "--discover"}
    assert {flag_name(key.path) for key in keys()} == generated
    for cls, prefix in ((WorkerSpec, "workers"), (ModelConfig, "models"),
                        (DnsService, "discovery")):
        for field in dataclasses.fields(cls):
            assert f"{prefix}.{field.name}" in DOCS


@pytest.mark.parametrize("key", keys(), ids=lambda key: ".".join(key.path))
def test_each_env_twin_and_flag_reaches_its_key(key):
    value, text = _sample(key)
    from_env = load_config(env={env_name(key.path): text})
    from_flag = load_config(flags(flag_name(key.path), text), env={})
    assert _get(from_env, key.path) == value
    assert _get(from_flag, key.path) == value


def test_print_config_round_trips(tmp_path):
    config = load_config(flags(
        "--model", "m,tokenizer=/t.json,block_size=32,bos_token=<s>,add_bos=true",
        "--model", 'p,passthrough=true,version=v"1\\',
        "--worker", "http://h:1,model=m,events=tcp://h:5557,replay=tcp://h:5567,dp_size=2",
        "--worker", "http://h:2,model=p,role=decode,weight=2.5,bootstrap_port=9000",
        "--control-admin-token", TOKEN, "--scheduler-bounds-factor", "none",
        "--scheduler-seed", "3", "--scheduler-cost-form", "linear",
        "--server-limits-body-timeout-s", "1e-3"), env={})
    text = dump_toml(config)
    assert TOKEN not in text and 'admin_token = "***"' in text
    reloaded = load_config(env={}, path=write(tmp_path, text))
    assert reloaded.control.admin_token == "***"
    assert reloaded == dataclasses.replace(
        config, control=dataclasses.replace(config.control, admin_token="***"))
    unmasked = load_config(env={}, path=write(tmp_path, dump_toml(config, mask_secrets=False)))
    assert unmasked == config
    commented = load_config(env={}, path=write(tmp_path, dump_toml(config, comments=True)))
    assert commented.workers == config.workers


def test_example_config_is_the_defaults_plus_its_workers_and_models():
    config = load_config(env={}, path=str(EXAMPLE))
    assert config.models and config.workers
    assert dataclasses.replace(config, models=(), workers=()) == CortexConfig()
    names = {model.name for model in config.models}
    assert all(worker.model in names for worker in config.workers)
    text = EXAMPLE.read_text()
    for key in keys():  # every key written with its meaning
        assert key.path[-1] in text
        assert DOCS[".".join(key.path)].split()[0] in text
    for section in SECTIONS:
        assert f"[{section}]" in text
    tomllib.loads(text)


def _get(config, path):
    for name in path:
        config = getattr(config, name)
    return config


def _sample(key):
    """A valid non-default value for ``key`` and its text spelling."""
    name = ".".join(key.path)
    special = {"server.port": (9999, "9999"), "control.port": (9998, "9998"),
               "scheduler.cost.form": ("linear", "linear"), "log.level": ("debug", "debug"),
               "control.host": ("::1", "::1"), "control.admin_token": (TOKEN, TOKEN),
               "scheduler.watermarks.max_kv_usage_fraction": (0.5, "0.5"),
               "upstream.limits.max_idle_per_worker": (3, "3"),
               "control.worker_hosts": ("10.0.0.0/8,gpu-a", "10.0.0.0/8,gpu-a"),
               "ledger.warm_start_url": ("http://10.0.0.2:8081", "http://10.0.0.2:8081"),
               "replicas.listen": ("tcp://0.0.0.0:5610", "tcp://0.0.0.0:5610"),
               "replicas.peers": ("tcp://10.0.0.2:5610,tcp://10.0.0.3:5610",
                                  "tcp://10.0.0.2:5610,tcp://10.0.0.3:5610")}
    if name in special:
        return special[name]
    if key.default is None or key.type in (str, str | None):
        return ("/etc/x", "/etc/x") if key.type in (str, str | None) else (7, "7")
    if isinstance(key.default, bool):
        return (not key.default, str(not key.default).lower())
    if isinstance(key.default, int):
        return key.default + 1, str(key.default + 1)
    if isinstance(key.default, float):
        return key.default * 2, repr(key.default * 2)
    raise AssertionError(f"no sample for {name}")


def test_nan_is_never_a_number():
    assert problems_of(flags("--scheduler-cost-affinity-tolerance-s", "nan"), env={}) == [
        "scheduler.cost.affinity_tolerance_s: expected a number, got 'nan' "
        "(from --scheduler-cost-affinity-tolerance-s)"]


def test_dp_rank_endpoints_are_derived_and_never_shared():
    problems = problems_of(flags(
        "--worker", "http://h:1,dp_size=2,events=tcp://h:5557,replay=tcp://h:5567",
        "--worker", "http://h:2,events=tcp://h:5558",  # rank 1 of the first worker
        "--worker", "http://h:3,dp_size=2,events=ipc:///run/ev",  # cannot be offset
        "--worker", "http://h:4,dp_size=3,events=tcp://h:65534",  # rank 2 past 65535
        "--worker", "http://h:1/,name=again",  # the first worker's url again
    ), env={})
    text = "\n".join(problems)
    assert len(problems) == 4, problems
    assert "worker h:2 rank 0 events and worker h:1 rank 1 events are both tcp://h:5558" in text
    assert "worker h:3: events: cannot offset endpoint 'ipc:///run/ev' by DP rank 1" in text
    assert "worker h:4: events: tcp://h:65534: rank 2 gives port 65536 > 65535" in text
    assert "workers: url http://h:1 is used by 2 workers" in text


def test_choices_are_case_insensitive():
    config = load_config(env={"CORTEX_LOG_LEVEL": "WARNING"}, path=None)
    assert config.log.level == "warning"
    assert load_config(flags("--worker", "http://h:1,engine=vLLM,role=Prefill"),
                       env={}).workers[0].engine == "vllm"


def test_tokenize_processes_from_every_layer_and_its_range(tmp_path):
    # no longer used (a warning at start): configurations naming it still load
    assert CortexConfig().server.tokenize_processes == 0
    path = write(tmp_path, "[server]\ntokenize_processes = 3\n")
    assert load_config(env={}, path=path).server.tokenize_processes == 3
    env = {"CORTEX_SERVER_TOKENIZE_PROCESSES": "2"}
    assert load_config(env=env, path=path).server.tokenize_processes == 2
    assert load_config(flags("--server-tokenize-processes", "1"), env=env,
                       path=path).server.tokenize_processes == 1
    for bad in ("-1", "257"):
        assert problems_of(flags("--server-tokenize-processes", bad), env={}) == [
            "server: tokenize_processes must be in [0, 256] (0: a worker thread)"]
