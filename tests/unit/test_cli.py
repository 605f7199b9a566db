"""The ``cortex`` command line: exit codes, problems on stderr, --print-config, complete --help."""

from __future__ import annotations

import importlib.machinery
import os
import subprocess
import sys
import tomllib
import types
from pathlib import Path

import pytest

import cortex
from cortex.cli import main
from cortex.config import CortexConfig, env_name, flag_name, load_config
from cortex.config.sources import keys

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = str(REPO / "packaging" / "cortex.toml")
TOKEN = "s3cret-token-of-the-admin-api"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    """The commands read os.environ: no CORTEX_* variable of the machine leaks in."""
    for name in list(os.environ):
        if name.startswith("CORTEX_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("COLUMNS", "200")  # argparse wraps help at the terminal width


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"cortex {cortex.__version__}"


def test_no_command_is_a_usage_error(capsys):
    assert main([]) == 2
    assert "usage: cortex" in capsys.readouterr().err


def test_check_config_ok(capsys):
    assert main(["check-config", "--config", EXAMPLE, "--no-file-checks"]) == 0
    assert capsys.readouterr().out == "ok\n"


def test_check_config_prints_every_problem_on_its_own_line(capsys, monkeypatch):
    monkeypatch.setenv("CORTEX_HEALTH_OPEN_S", "-1")
    code = main(["check-config", "--server-port", "x", "--log-level", "loud",
                 "--worker", "http://h:1,engine=tgi"])
    err = capsys.readouterr().err.splitlines()
    assert code == 2
    assert err[0] == "cortex: 4 configuration problems:"
    assert len(err) == 5
    assert any("(from --server-port)" in line for line in err)
    assert any("health: open_s must be > 0" in line for line in err)


def test_check_config_checks_the_files_named(capsys, tmp_path):
    assert main(["check-config", "--config", EXAMPLE]) == 2
    err = capsys.readouterr().err
    assert "models[0].tokenizer: no such file" in err
    assert main(["check-config", "--model",
                 f"m,tokenizer={tmp_path},chat_template={tmp_path / 'chat.jinja'},block_size=16"]) == 2
    err = capsys.readouterr().err
    assert "models[0].chat_template: no such file" in err
    assert "models[0].tokenizer" not in err  # a model directory is a tokenizer path
    tokenizer = tmp_path / "tokenizer.json"
    tokenizer.write_text("{}")
    assert main(["check-config", "--model", f"m,tokenizer={tokenizer},block_size=16"]) == 2
    assert f"models[0] (m): tokenizer {tokenizer}: cannot load" in capsys.readouterr().err


def test_check_config_print_config_round_trips(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("CORTEX_CONTROL_ADMIN_TOKEN", TOKEN)
    argv = ["--config", EXAMPLE, "--server-limits-max-body-bytes", "1234",
            "--scheduler-bounds-factor", "none"]
    assert main(["check-config", "--no-file-checks", "--print-config", *argv]) == 0
    text = capsys.readouterr().out
    assert TOKEN not in text
    tomllib.loads(text)
    printed = tmp_path / "printed.toml"
    printed.write_text(text)
    reloaded = load_config(env={}, path=str(printed))
    assert reloaded.server.limits.max_body_bytes == 1234
    assert reloaded.scheduler.bounds.factor is None
    assert reloaded.workers == load_config(env={}, path=EXAMPLE).workers
    assert reloaded.control.admin_token == "***"


def test_serve_dry_run_and_print_config(capsys):
    assert main(["serve", "--dry-run", "--worker", "http://127.0.0.1:30000"]) == 0
    assert capsys.readouterr().out == "ok\n"
    assert main(["serve", "--print-config", "--control-admin-token", TOKEN]) == 0
    out = capsys.readouterr().out
    assert 'admin_token = "***"' in out and TOKEN not in out


def test_top_level_print_config_shows_the_merged_configuration(capsys, monkeypatch):
    """``cortex --print-config`` (no command): file + environment + flags, secrets masked."""
    monkeypatch.setenv("CORTEX_SERVER_LIMITS_MAX_BODY_BYTES", "4321")
    assert main(["--print-config", "--config", EXAMPLE, "--control-admin-token", TOKEN]) == 0
    out = capsys.readouterr().out
    printed = tomllib.loads(out)
    assert printed["server"]["limits"]["max_body_bytes"] == 4321
    assert printed["control"]["admin_token"] == "***" and TOKEN not in out
    assert printed["workers"] == tomllib.loads(main_print(["--config", EXAMPLE], capsys))["workers"]
    assert main(["--print-config", "--server-limits-max-body-bytes", "0"]) == 2
    assert "max_body_bytes must be > 0" in capsys.readouterr().err


def main_print(argv, capsys):
    assert main(["check-config", "--no-file-checks", "--print-config", *argv]) == 0
    return capsys.readouterr().out


def test_serve_with_a_bad_configuration_exits_2(capsys):
    assert main(["serve", "--dry-run", "--server-limits-max-body-bytes", "0"]) == 2
    assert "server.limits: server limit max_body_bytes must be > 0" in capsys.readouterr().err
    assert main(["serve", "--dry-run", "--server-limits-client-watch-after-s", "-1",
                 "--server-limits-keepalive-idle-s", "0"]) == 2
    err = capsys.readouterr().err  # every problem reported at once
    assert "server limit client_watch_after_s must be >= 0" in err
    assert "server limit keepalive_idle_s must be > 0" in err


def test_serve_hands_the_config_to_the_app(monkeypatch):
    """``serve`` calls ``cortex.app.serve(config)`` and returns its code (a stand-in app here,
    so the test binds nothing)."""
    seen = []
    app = types.ModuleType("cortex.app")
    app.serve = lambda config, reload=None, **how: seen.append((config, reload, how)) or 3
    monkeypatch.setitem(sys.modules, "cortex.app", app)
    monkeypatch.setattr("cortex.logs.configure", lambda config, secrets, process: None)
    argv = ["serve", "--server-port", "0", "--worker", "http://127.0.0.1:30000"]
    assert main(argv) == 3
    config, reload, how = seen[0]
    assert config.server.port == 0 and config.workers[0].name == "127.0.0.1:30000"
    assert reload() == config  # SIGHUP reads the same sources again
    # server.processes: the others start with the same arguments; this is process 0
    assert how == {"argv": argv, "started_by_process_0": False}


@pytest.mark.parametrize("command", ["serve", "check-config"])
def test_help_lists_every_flag_its_env_twin_and_default(capsys, command):
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    for key in keys():
        assert flag_name(key.path) in out
        assert env_name(key.path) in out
    for twin in ("CORTEX_CONFIG", "CORTEX_WORKERS", "CORTEX_MODELS", "--worker", "--model"):
        assert twin in out
    assert "(default: 16777216;" in out  # server.limits.max_body_bytes
    assert TOKEN not in out


def test_sim_without_its_module_says_so(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "cortex.sim.cli", None)  # as if it were not installed
    assert main(["sim", "--anything"]) == 2
    assert "cortex.sim.cli is missing" in capsys.readouterr().err


def test_sim_hands_its_arguments_to_the_sim_module(monkeypatch):
    seen = []
    sim = types.ModuleType("cortex.sim.cli")
    sim.__spec__ = importlib.machinery.ModuleSpec("cortex.sim.cli", None)
    sim.add_sim_arguments = lambda parser: parser.add_argument("--count", type=int)
    sim.run_sim = lambda args: seen.append(args.count) or 0
    monkeypatch.setitem(sys.modules, "cortex.sim.cli", sim)
    assert main(["sim", "--count", "3"]) == 0
    assert seen == [3]


def test_defaults_validate():
    assert load_config(env={}) == CortexConfig()


def test_a_bool_flag_alone_means_true(capsys):
    assert main(["check-config", "--print-config", "--control-allow-remote",
                 "--log-json", "false"]) == 0
    out = capsys.readouterr().out
    assert "allow_remote = true" in out and "json = false" in out


def test_the_installed_entry_point_exits_with_the_code():
    """``python -m cortex`` in a real process: the code reaches the shell."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("CORTEX_")}
    ok = subprocess.run([sys.executable, "-m", "cortex", "check-config", "--config", EXAMPLE,
                         "--no-file-checks"], capture_output=True, text=True, env=env, timeout=60)
    assert (ok.returncode, ok.stdout) == (0, "ok\n")
    env["CORTEX_SERVER_PORT"] = "eighty"
    bad = subprocess.run([sys.executable, "-m", "cortex", "check-config"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert bad.returncode == 2
    assert "server.port: expected an integer, got 'eighty' (from env CORTEX_SERVER_PORT)" \
        in bad.stderr


def test_check_config_loads_each_profile_as_serve_would(capsys):
    from tests import deepseek_profile as ds

    good = f"m,tokenizer={ds.TOKENIZER_JSON},block_size=16,bos_token={ds.BOS}"
    assert main(["check-config", "--model", good]) == 0
    assert main(["check-config", "--model", good.replace(ds.BOS, "<no-such-token>")]) == 2
    err = capsys.readouterr().err
    assert "models[0] (m): bos_token" in err and "<no-such-token>" in err


def test_check_config_reports_every_problem_of_a_file_in_one_pass(capsys, tmp_path):
    """Issue 22 §10: an unknown key, a malformed worker url without a name, a good worker, and
    a model whose tokenizer file is missing — all reported at once, not in three passes."""
    config = tmp_path / "cortex.toml"
    config.write_text(f"""
unknown_section_key = 1

[[models]]
name = "m"
tokenizer = "{tmp_path / 'missing' / 'tokenizer.json'}"
block_size = 16

[[workers]]
url = "http//10.0.0.1:8000"
engine = "vllm"

[[workers]]
url = "http://10.0.0.2:8000"
engine = "vllm"
model = "not-configured"
""")
    assert main(["check-config", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "unknown key unknown_section_key" in err
    assert "http//10.0.0.1:8000" in err and "name is required" not in err
    assert "model 'not-configured' is not one of the configured models" in err
    assert "models[0].tokenizer: no such file" in err


def test_serve_does_not_start_on_a_profile_that_cannot_load(capsys, tmp_path):
    from cortex.app import serve
    from cortex.config import CortexConfig, ModelConfig, ServerConfig

    missing = str(tmp_path / "tokenizer.json")
    config = CortexConfig(server=ServerConfig(host="127.0.0.1", port=0),
                          models=(ModelConfig(name="m", tokenizer=missing, block_size=16),))
    assert serve(config) == 2
    err = capsys.readouterr().err
    assert "models (m): profile not loaded" in err and "tokenizer.json" in err
    assert main(["serve", "--dry-run", "--model", f"m,tokenizer={missing},block_size=16"]) == 2
    assert "no such file" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "command", "hint"), [
    (["serve", "--confg", "x.toml"], "serve", "--config"),
    (["check-config", "--server-prot=8080"], "check-config", "--server-port"),
    (["demo", "--secnds", "3"], "demo", "--seconds"),
])
def test_a_misspelt_flag_is_refused_by_its_command_with_a_did_you_mean(capsys, argv, command,
                                                                       hint):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"usage: cortex {command} " in err  # the command's usage, not the top level's
    assert f"cortex {command}: error: unrecognized arguments: {' '.join(argv[1:])}" in err
    assert f"(did you mean {hint}?)" in err


def test_an_unknown_flag_far_from_every_flag_gets_no_hint(capsys):
    assert main(["serve", "--zzzzzz"]) == 2
    err = capsys.readouterr().err
    assert "cortex serve: error: unrecognized arguments: --zzzzzz" in err
    assert "did you mean" not in err
