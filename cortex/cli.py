"""The ``cortex`` command line.

Commands: ``serve`` (the gateway), ``check-config`` (validate file + environment + flags),
``sim`` (simulated engines), ``demo`` (simulated cluster feeding the ledger), ``--version``.

Rules:

* ``serve`` and ``check-config`` take the same configuration flags (``cortex.config``): one per
  key, each with its ``CORTEX_*`` environment twin, all listed by ``--help`` with defaults.
* Exit codes: 0 ok; 2 configuration or usage error, with every problem on its own stderr line;
  what a command returns otherwise (``serve``: the app's code).
* An unknown flag is refused by its command's parser (that command's usage line), with the
  closest flag it knows as a "did you mean" (``cortex serve --confg x``: ``--config``).
* ``--print-config`` prints the effective merged configuration as TOML, secrets masked; given
  without a command (``cortex --print-config [config flags]``) it means ``serve --print-config``.
* Heavy or optional modules (``cortex.app``, ``cortex.sim.cli``, trio) are imported inside the
  command that needs them, so ``check-config`` and ``--help`` stay quick.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from collections.abc import Sequence

import cortex
from cortex.config import CortexConfig
from cortex.config.sources import iter_flags
from cortex.config.walk import suggest
from cortex.errors import ConfigError

USAGE_ERROR = 2
COMMANDS = frozenset({"serve", "check-config", "sim", "demo"})


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--print-config" in argv and not COMMANDS.intersection(argv):
        argv.insert(0, "serve")
    with_sim = _first_command(argv) == "sim"
    if with_sim and importlib.util.find_spec("cortex.sim.cli") is None:
        return run_sim_missing(argparse.Namespace())
    parser = build_parser(with_sim=with_sim)
    try:
        args, unknown = parser.parse_known_args(argv)
        if unknown:
            refuse_unknown(args.command_parser, unknown, known=[*iter_flags(parser)])
    except SystemExit as exit_:  # --help, --version, usage errors: argparse's own code
        return exit_.code if isinstance(exit_.code, int) else USAGE_ERROR
    args.argv = argv  # server.processes: the other processes start with the same arguments
    return args.run(args)


def refuse_unknown(command: argparse.ArgumentParser, unknown: list[str],
                   known: list[str]) -> None:
    """``command``'s usage error for arguments it does not take (exits 2), each unknown flag
    with the closest of the command's flags (or ``known``, the top level's) as a "did you
    mean"."""
    choices = [*iter_flags(command), *known]
    hints = [suggest(arg.split("=", 1)[0], choices).strip()
             for arg in unknown if arg.startswith("--")]
    message = f"unrecognized arguments: {' '.join(unknown)}"
    command.error(" ".join([message, *filter(None, hints)]))


def build_parser(with_sim: bool = False) -> argparse.ArgumentParser:
    from cortex.config import add_config_arguments

    parser = argparse.ArgumentParser(prog="cortex", description=cortex.__doc__,
                                     allow_abbrev=False)
    parser.add_argument("--version", action="version", version=f"cortex {cortex.__version__}")
    parser.add_argument("--print-config", action="store_true",
                        help="print the effective configuration (file + environment + flags) as "
                             "TOML with secrets masked, and exit; same as 'serve --print-config'")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run the gateway", allow_abbrev=False,
                                description="Run the gateway in front of the configured workers.")
    serve.add_argument("--print-config", action="store_true",
                       help="print the effective configuration as TOML (secrets masked), exit")
    serve.add_argument("--dry-run", action="store_true",
                       help="validate the configuration and exit without serving")
    # what makes this process number I of server.processes, set by process 0 (not for people)
    serve.add_argument("--process-index", type=int, default=0, help=argparse.SUPPRESS)
    add_config_arguments(serve)
    serve.set_defaults(run=run_serve, argv=[])

    check = commands.add_parser(
        "check-config", help="validate the configuration, print every problem",
        allow_abbrev=False,
        description="Validate file + environment + flags, the files they name and the model "
                    "profiles those files make; print every problem (exit 2) or ok.")
    check.add_argument("--print-config", action="store_true",
                       help="print the effective configuration as TOML (secrets masked)")
    check.add_argument("--no-file-checks", action="store_true",
                       help="skip the disk: do not check that the tokenizer, template and "
                            "token files exist, nor load the model profiles")
    add_config_arguments(check)
    check.set_defaults(run=run_check_config)

    sim = commands.add_parser("sim", help="simulated SGLang / vLLM engines (no GPU)",
                              allow_abbrev=False)
    sim.set_defaults(run=run_sim_missing)
    if with_sim:
        from cortex.sim.cli import add_sim_arguments, run_sim

        add_sim_arguments(sim)
        sim.set_defaults(run=run_sim)

    demo = commands.add_parser("demo", help="simulated cluster feeding the ledger, with faults")
    demo.add_argument("--seconds", type=float, default=8.0, help="length of the traffic phase")
    demo.add_argument("--seed", type=int, default=7)
    demo.set_defaults(run=run_demo)
    for command in commands.choices.values():  # its own usage for flags it does not take
        command.set_defaults(command_parser=command)
    return parser


def load_or_report(args: argparse.Namespace, extra_checks: bool = False) -> CortexConfig | None:
    """The configuration, or ``None`` after writing every problem to stderr."""
    from cortex.config import file_checks, load_config

    try:
        config = load_config(args, os.environ)
    except ConfigError as error:
        problems = list(error.problems)
        if extra_checks and isinstance(error.partial, CortexConfig):  # one pass: files too
            problems += file_checks(error.partial)
        _report(problems)
        return None
    problems = file_checks(config) if extra_checks else []
    if problems:
        _report(problems)
        return None
    return config


def run_serve(args: argparse.Namespace) -> int:
    # --dry-run checks what a start reads (files, model profiles) as check-config does
    config = load_or_report(args, extra_checks=args.dry_run)
    if config is None:
        return USAGE_ERROR
    if args.print_config:
        from cortex.config import dump_toml

        sys.stdout.write(dump_toml(config, mask_secrets=True))
        return 0
    if args.dry_run:
        print("ok")
        return 0
    try:
        from cortex.app import serve
    except ModuleNotFoundError as error:
        if error.name != "cortex.app":
            raise
        print("cortex serve: the gateway (cortex.app) is not part of this build yet; "
              "--dry-run validates the configuration", file=sys.stderr)
        return 1
    from cortex.config import load_config
    from cortex.logs import configure

    configure(config.log, secrets=_secrets(config), process=args.process_index or None)
    return serve(config, reload=lambda: load_config(args, os.environ),  # SIGHUP: same sources
                 argv=args.argv, started_by_process_0=args.process_index > 0)


def _secrets(config: CortexConfig) -> list[str | None]:
    """What logs must never show: the admin token, inline or from its file, and the peer's
    token of the ledger warm start."""
    try:
        return [config.control.read_admin_token(), config.ledger.warm_start_token]
    except (ConfigError, OSError):
        return [config.control.admin_token, config.ledger.warm_start_token]


def run_check_config(args: argparse.Namespace) -> int:
    config = load_or_report(args, extra_checks=not args.no_file_checks)
    if config is None:
        return USAGE_ERROR
    if args.print_config:
        from cortex.config import dump_toml

        sys.stdout.write(dump_toml(config, mask_secrets=True))
    else:
        print("ok")
    return 0


def run_sim_missing(args: argparse.Namespace) -> int:
    print("cortex sim: not available in this build (cortex.sim.cli is missing)", file=sys.stderr)
    return USAGE_ERROR


def run_demo(args: argparse.Namespace) -> int:
    import trio

    from cortex.demo import run_demo as demo

    return 0 if trio.run(demo, args.seconds, args.seed) else 1


def _report(problems: list[str]) -> None:
    count = len(problems)
    print(f"cortex: {count} configuration problem{'s' if count != 1 else ''}:", file=sys.stderr)
    for problem in problems:
        print(f"  {problem}", file=sys.stderr)


def _first_command(argv: list[str]) -> str | None:
    return next((arg for arg in argv if not arg.startswith("-")), None)


if __name__ == "__main__":
    sys.exit(main())
