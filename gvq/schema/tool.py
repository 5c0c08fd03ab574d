"""The command line of gvq's tools (``python -m gvq.bench|predict|report|analysis <command>``): a typed
config changed by ``key=value`` overrides, as ``cli.py``'s run config is; only file paths are flags.

    python -m gvq.report frontier runs/multirun/lm_frontier target_loss=2.4
    python -m gvq.report frontier --cfg        # the composed config (every key and its value), then exit
    python -m gvq.report frontier --help       # its keys with their defaults, and its path arguments

A tool's ``__main__`` is a table of :class:`Command` (its name -> the dataclass typing its keys, whose
defaults live there only; the grid its ``grid`` key starts from, ``conf/grid/<name>.yaml``; its path
arguments; the function run on the composed config) and :func:`dispatch` is its one entry point.  An
unknown or ill-typed key is refused before anything runs, in one line naming it.
"""
from __future__ import annotations

import argparse
import importlib
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from gvq.schema.errors import ConfigError, describe, keys_of, unknown_key


@dataclass(frozen=True)
class Arg:
    """A path argument: ``name`` a flag (``--out``) or, without dashes, positional; ``nargs`` as argparse's
    (``"*"``, ``"+"``) for several paths; ``default`` where it has one."""
    name: str
    help: str
    nargs: str | None = None
    default: str | None = None


@dataclass(frozen=True)
class Command:
    schema: type                       # a dataclass: the command's keys, typed, with their defaults
    run: str                           # "module:function" of (cfg, paths), imported on use (tools are heavy)
    help: str                          # one line, for the tool's usage
    paths: tuple[Arg, ...] = ()
    grid: str | None = None            # conf/grid/<grid>.yaml: the defaults of the schema's ``grid`` key


#: a ``key=value`` override: a dotted key, then ``=`` (a path such as ``runs/x/seed=0`` is not one)
OVERRIDE = re.compile(r"^[A-Za-z_][\w.]*=")


def compose_command(command: Command, overrides=()) -> DictConfig:
    """The command's config: its schema's defaults (the grid's, for ``grid``), then ``overrides``; a
    bad one raises :class:`ConfigError`, one line naming the key."""
    cfg = OmegaConf.structured(command.schema)
    if command.grid is not None:
        from gvq.schema.compose import load_grid
        cfg.grid = OmegaConf.structured(load_grid(command.grid))
    for o in overrides:
        if not OVERRIDE.match(o):
            raise ConfigError(f"{o!r}: an override is KEY=VALUE (keys: {', '.join(keys_of(command.schema))})")
    for o in overrides:
        _readable(o)
    try:
        return OmegaConf.merge(cfg, OmegaConf.from_dotlist(list(overrides)))
    except (ConfigKeyError, ConfigAttributeError) as e:
        if "." in str(e.full_key or ""):
            raise ConfigError(describe(e), source=e) from None
        raise ConfigError(unknown_key(str(e.full_key), keys_of(command.schema)), source=e) from None
    except OmegaConfBaseException as e:
        raise ConfigError(describe(e), source=e) from None


def _readable(override: str) -> None:
    """A ConfigError naming ``override`` where YAML cannot read its value (``'a',b``), before OmegaConf's
    parser raises its own multi-line error."""
    import yaml
    try:
        yaml.safe_load(override.split("=", 1)[1])
    except yaml.YAMLError as e:
        raise ConfigError(f"{override}: YAML cannot read the value ({str(e).splitlines()[0]}); quote it") from None


def parse_command(prog: str, command: Command, argv: list[str],
                  others: str = "") -> tuple[argparse.Namespace, DictConfig]:
    """``argv`` read: path arguments and ``--cfg`` as flags, ``key=value`` tokens as overrides (``others``:
    the tool's other commands, for ``--help``)."""
    p = argparse.ArgumentParser(prog=prog, description=command.help + others,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="keys (KEY=VALUE), with their defaults:\n" + _defaults_yaml(command))
    positional = next((a for a in command.paths if not a.name.startswith("-")), None)
    p.add_argument("tokens", nargs="*", metavar="KEY=VALUE" + (f" | {positional.name.upper()}" if positional else ""),
                   help="overrides of the keys below" + (f"; else {positional.help}" if positional else ""))
    p.add_argument("--cfg", action="store_true", help="print the composed config and exit")
    for a in command.paths:
        if a.name.startswith("-"):
            p.add_argument(a.name, type=Path, nargs=a.nargs, default=a.default, help=a.help)
    args = p.parse_intermixed_args(argv)     # KEY=VALUE tokens before, between and after the flags
    for a in command.paths:             # argparse gives a several-path flag the overrides after it too
        if a.name.startswith("-") and a.nargs in ("*", "+") and getattr(args, _dest(a)):
            given = getattr(args, _dest(a))
            args.tokens += [str(v) for v in given if _is_override(str(v))]
            setattr(args, _dest(a), [v for v in given if not _is_override(str(v))])
    overrides = [t for t in args.tokens if _is_override(t)]
    rest = [Path(t) for t in args.tokens if t not in overrides]
    if rest and positional is None:
        p.error(f"{rest[0]}: not KEY=VALUE, and {prog} takes no path here")
    if positional is not None:
        setattr(args, positional.name, rest or ([Path(positional.default)] if positional.default else []))
    return args, compose_command(command, overrides)


def _is_override(token: str) -> bool:
    return bool(OVERRIDE.match(token)) and not _is_path(token)


def _is_path(token: str) -> bool:
    try:
        return Path(token).exists()
    except OSError:                     # a long list of settings is no file name (ENAMETOOLONG)
        return False


def _dest(arg: Arg) -> str:
    return arg.name.lstrip("-").replace("-", "_")


def _defaults_yaml(command: Command) -> str:
    try:
        return OmegaConf.to_yaml(compose_command(command))
    except ConfigError as e:             # a broken grid file: --help still prints
        return f"(not composed: {e})\n"


def dispatch(prog: str, table: dict[str, Command], argv=None, default: str | None = None,
             errors: tuple[type[BaseException], ...] = ()):
    """Run ``argv[0]``'s command of ``table`` (``default``'s where ``argv[0]`` names none) on its
    composed config; a ConfigError or one of ``errors`` is one line on stderr and exit status 2 (as
    argparse's usage errors).  Without a default command, ``--help`` lists the commands on stdout (exit 0;
    no command or an unknown one: the same on stderr, exit 2).  Returns what the command returns."""
    argv = sys.argv[1:] if argv is None else list(argv)
    name = argv[0] if argv and argv[0] in table else default
    asked = argv[:1] in (["-h"], ["--help"]) and default is None
    if name is None or asked:
        width = max(map(len, table))
        lines = "\n".join(f"  {n:<{width}}  {c.help}" for n, c in table.items())
        print(f"usage: {prog} {{{','.join(table)}}} [KEY=VALUE ...] [--cfg] [--help]\n{lines}",
              file=sys.stdout if asked else sys.stderr)
        raise SystemExit(0 if asked else 2)
    command = table[name]
    named = bool(argv) and argv[0] == name
    others = f"\n(the tool's commands: {', '.join(table)}; each has its own --help)"
    try:
        args, cfg = parse_command(f"{prog} {name}" if named else prog, command, argv[1:] if named else argv, others)
        if args.cfg:
            print(OmegaConf.to_yaml(cfg), end="")
            return None
        module, _, function = command.run.partition(":")
        paths = SimpleNamespace(**{k: v for k, v in vars(args).items() if k not in ("tokens", "cfg")})
        return getattr(importlib.import_module(module), function)(cfg, paths)
    except (ConfigError, *errors) as e:
        print(f"{prog.removeprefix('python -m ')}: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def exit_status(prog: str, table: dict[str, Command], argv=None, **kw) -> int:
    """:func:`dispatch` as a ``__main__``'s exit status: the command's own where it returns an int, else 0;
    2 where refused (its one line on stderr), 0 after ``--help``."""
    try:
        result = dispatch(prog, table, argv, **kw)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    return result if isinstance(result, int) else 0


def choose(key: str, given, allowed) -> None:
    """A :class:`ConfigError` naming ``key`` where ``given`` (a value or a list) holds one outside
    ``allowed``: a choice among names a schema cannot type as an enum (the option names of a registry)."""
    bad = [g for g in ([given] if isinstance(given, str) else given or []) if g not in allowed]
    if bad:
        raise ConfigError(f"{key}={bad[0]}: expected one of {', '.join(map(str, allowed))}")


def namespace(cfg: DictConfig, paths) -> SimpleNamespace:
    """The composed keys and the path arguments as one namespace of plain values (choices as their names):
    what a command's body reads (``args.world_size``, ``args.out``)."""
    return SimpleNamespace(**OmegaConf.to_container(cfg, resolve=True, enum_to_str=True), **vars(paths))


def keys(command: Command) -> list[str]:
    """Every key the command takes, dotted (``grid.world_sizes``): what its ``--help`` lists."""
    def walk(node, prefix=""):
        for k, v in node.items():
            yield from walk(v, f"{prefix}{k}.") if isinstance(v, DictConfig) else [f"{prefix}{k}"]
    return list(walk(compose_command(command)))

