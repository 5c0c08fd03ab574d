"""A setting: an aggregator option, the overrides it runs with and the variant it is reduced in; the one
home of how a setting is written (``OPTION:KEY=VALUE[,KEY=VALUE]``, an entry of a grid's ``grid.settings``),
named (``qsgd bits=2``, the report's), scoped (``OPTION:KEY=VALUE`` in a ``grid.set`` list applies to that
option only) and keyed in a bench record (:class:`BenchKey`).

    s = Setting.parse("qsgd:compressor.bits=2")            # option qsgd, ("aggregator.compressor.bits=2",)
    s.name                                                  # 'qsgd bits=2': what the report calls its runs
    Setting.parse("powersgd", common=["powersgd:aggregator.rank=4"]).overrides   # ('aggregator.rank=4',)

``gvq.bench`` names the modes it times with it, ``gvq.predict`` the settings it calibrates, ``gvq.report``
the runs it groups, so each finds the others' figures under one name.

:attr:`Setting.name` is the name as written (every ``aggregator.*`` override it was given); the name a
tool keys figures by is :func:`canonical_name` (``Setting.canonical``, :func:`canonical` of a written name):
every key whose value differs from the option's composed default, and no other, so ``powersgd`` set to
rank 6 by a grid's ``set`` is ``powersgd rank=6`` and ``qsgd bits=4`` (QSGD's default written out) is
``qsgd``.  Composing is the schema's (once per option a process); everything else here is pure.
"""
from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import NamedTuple

import yaml

#: how a setting is reduced (overlapped inside backward, at which bucket size), not what it sums: the
#: report and the bench carry it as the variant, beside the setting's name
VARIANT_KEYS = ("overlap", "bucket_cap_mb")

#: the format of what ``gvq.bench overlap --out`` writes; a file without ``version`` is 1 (read as is:
#: its records' names were already the report's)
BENCH_VERSION = 2

SYNTAX = "write OPTION or OPTION:KEY=VALUE[,KEY=VALUE] (keys under aggregator., e.g. qsgd:compressor.bits=2)"


def overrides_for(option: str, overrides, scoped_only: bool = False) -> list[str]:
    """The overrides that apply to the aggregator option ``option`` in a grid's ``grid.set`` syntax:
    ``key=value`` applies to every option, ``option:key=value`` to that one (returned without its scope);
    ``scoped_only``: just the latter, the ones that make a setting's name."""
    out = []
    for o in overrides:
        scope, colon, rest = o.partition(":")
        if not colon or "=" in scope:           # unscoped (a ':' inside the value is not a scope)
            if not scoped_only:
                out.append(o)
        elif scope == option:
            out.append(rest)
    return out


def setting_value(value) -> str:
    """A knob's value as a setting's name writes it, whether it came as override text (``true``, ``2``) or
    as a resolved config value (``True``, ``2``): YAML's reading, booleans and null lower-case."""
    if isinstance(value, enum.Enum):                            # a typed key composed: its override text
        return value.name
    if isinstance(value, str):
        try:
            value = yaml.safe_load(value)
        except yaml.YAMLError:
            return value
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    if isinstance(value, float) and value.is_integer():
        return str(int(value))                                  # 8.0 resolved, 8 typed: one setting
    return str(value)


def short(override: str) -> str:
    """``aggregator=orq`` -> ``orq``; ``aggregator.compressor.levels=5`` -> ``levels=5``; a ``_target_`` by
    its class (``_target_=ErrorFeedbackAggregator``); any other override as it is."""
    if override.startswith("aggregator="):
        return override.split("=", 1)[1]
    for prefix in ("aggregator.compressor.", "aggregator."):
        if override.startswith(prefix):
            key, _, value = override[len(prefix):].partition("=")
            return f"{key}={value.rsplit('.', 1)[-1] if key == '_target_' else value}"
    return override


def variant_name(variant: str, bucket_mb: float | None = None) -> str:
    """How tables name a variant: ``post``, ``overlap``, ``overlap@0.25MB``."""
    return variant if bucket_mb is None else f"{variant}@{bucket_mb:g}MB"


@dataclass(frozen=True)
class Setting:
    """An option, its overrides (``aggregator.*`` make its name; others, ``K=x1``, ride along) and the
    variant it is reduced in (``post``, ``overlap``, ``overlap@0.25MB``: beside the name, never in it)."""
    option: str
    overrides: tuple[str, ...] = ()
    variant: str = "post"

    @classmethod
    def parse(cls, spec: str, common=(), variant: str = "post") -> Setting:
        """``OPTION`` or ``OPTION:KEY=VALUE,...`` (keys under ``aggregator.``); its overrides start from
        ``common``'s for the option (``grid.set`` syntax: :func:`overrides_for`) and its own keys replace
        those of the same key.  A ValueError (one line, the syntax) for a malformed entry."""
        if not isinstance(spec, str):        # YAML read ``qsgd:`` or ``a: b`` inside a list as a mapping
            raise ValueError(f"grid.settings {spec}: not OPTION[:KEY=VALUE,...] (quote an entry holding ':')")
        option, colon, own = spec.partition(":")
        pairs = [kv for kv in own.split(",") if kv]
        if not option or (colon and not pairs) or any("=" not in kv or not kv.split("=", 1)[0] for kv in pairs):
            raise ValueError(f"grid.settings {spec}: {SYNTAX}")
        mine = tuple(f"aggregator.{kv}" for kv in pairs)
        keys = {o.split("=", 1)[0] for o in mine}
        base = tuple(o for o in overrides_for(option, list(common)) if o.split("=", 1)[0] not in keys)
        return cls(option, base + mine, variant)

    @property
    def name(self) -> str:
        """Its option and its ``aggregator.*`` overrides, short and sorted (``qsgd bits=2``), the variant's
        keys left out: the name the bench, the cost model and the report share."""
        return name_of(self.option, self.overrides)

    @property
    def canonical(self) -> str:
        """:func:`canonical_name` of its option and overrides: the name its figures are keyed by."""
        return canonical_name(self.option, self.overrides)

    @property
    def entry(self) -> str:
        """Back to the ``grid.settings`` syntax (its ``aggregator.*`` overrides only): ``qsgd:compressor.bits=2``."""
        own = [o[len("aggregator."):] for o in self.overrides if o.startswith("aggregator.")]
        return self.option + (":" + ",".join(own) if own else "")

    def scoped(self, common) -> Setting:
        """This setting with ``common`` (``grid.set`` syntax) applied after its own overrides."""
        return Setting(self.option, self.overrides + tuple(overrides_for(self.option, list(common))), self.variant)


def name_of(option: str, overrides) -> str:
    """:attr:`Setting.name` of ``option`` with ``overrides`` (any iterable of ``key=value``; only the
    ``aggregator.*`` ones name it)."""
    return " ".join([option, *sorted(f"{k}={v}" for k, v in _pairs(overrides).items())])


def _pairs(overrides) -> dict[str, str]:
    """The short ``key -> value`` pairs ``overrides`` name a setting by (the last of a key wins, as in Hydra)."""
    out = {}
    for o in overrides:
        if o.startswith("aggregator.") and "=" in o:
            key, value = short(o).split("=", 1)
            if key not in VARIANT_KEYS:
                out[key] = setting_value(value)
    return out


@functools.lru_cache(maxsize=None)
def option_defaults(option: str) -> dict[str, str] | None:
    """Option ``option``'s composed defaults as short ``key -> value`` text (its ``aggregator.*`` keys, then
    its compressor's; the aggregator's own where both hold a key, as :func:`short` names it); None where
    ``option`` is no aggregator option (``local``, ``torch_ddp``: nothing to compare against)."""
    from omegaconf import DictConfig, OmegaConf

    from gvq.schema.compose import compose
    from gvq.schema.errors import ConfigError
    try:
        cfg = compose([f"aggregator={option}"])
    except ConfigError:
        return None
    out = {}
    for node in ("aggregator.compressor", "aggregator"):
        sub = OmegaConf.select(cfg, node)
        if isinstance(sub, DictConfig):
            for key in sub:
                value = OmegaConf.select(cfg, f"{node}.{key}")
                if not isinstance(value, DictConfig):
                    out[str(key)] = short(f"aggregator.{key}={setting_value(value)}").split("=", 1)[1]
    return out


_ABSENT = object()        # a key the option does not have (``+aggregator.new=...``) differs from any default


def canonical_name(option: str, overrides=()) -> str:
    """The name every tool keys a setting's figures by: ``option`` and each ``aggregator.*`` override whose
    value differs from the option's composed default (:func:`option_defaults`), short and sorted, the
    variant's keys left out.  ``powersgd`` with ``aggregator.rank=6`` is ``powersgd rank=6``;
    ``qsgd`` with ``aggregator.compressor.bits=4`` (its default) is ``qsgd``."""
    defaults = option_defaults(option) or {}
    own = [f"{k}={v}" for k, v in _pairs(overrides).items() if defaults.get(k, _ABSENT) != v]
    return " ".join([option, *sorted(own)])


def canonical(name: str) -> str:
    """A written name (``OPTION KEY=VALUE ...``, a report's or a frontier's) as :func:`canonical_name`
    writes it: ``qsgd bits=4`` -> ``qsgd``."""
    option, pairs = split_name(name)
    return canonical_name(option, [f"aggregator.{k}={v}" for k, v in pairs])


def split_name(name: str) -> tuple[str, list[tuple[str, str]]]:
    """A name back to its option and its short ``(key, value)`` pairs: ``qsgd bits=2`` -> (qsgd, [(bits, 2)])."""
    option, *pairs = name.split(" ")
    return option, [tuple(kv.split("=", 1)) for kv in pairs]


def aliases(entries, common=()) -> dict[str, str]:
    """Each setting's second name, with every key that any setting of its family overrides written out at
    its resolved value, -> its :attr:`Setting.canonical` (``qsgd bits=4`` -> ``qsgd`` beside
    ``qsgd:compressor.bits=2``): a run that set a default explicitly (``aggregator.compressor.bits=4``),
    named as written, finds the seconds of the setting it ran."""
    from omegaconf import OmegaConf
    from gvq.schema.compose import compose
    parsed = [Setting.parse(e, common) for e in entries]
    keys: dict[str, set] = {}
    for s in parsed:
        keys.setdefault(s.option, set()).update(o.split("=", 1)[0] for o in s.overrides if o.startswith("aggregator."))
    out = {}
    for s in parsed:
        cfg = compose([f"aggregator={s.option}", *s.overrides])
        full = [f"{k}={setting_value(OmegaConf.select(cfg, k))}" for k in sorted(keys[s.option])]
        out[name_of(s.option, full)] = s.canonical
    return {k: v for k, v in out.items() if k != v}


class BenchKey(NamedTuple):
    """A bench record's cell and mode, the key its seconds are found under (equal to the plain tuple)."""
    N: int
    compute_scale: float           # rounded to 4 places: 1/6 written by two tools is one regime
    link_Mbps: float
    setting: str                   # :attr:`Setting.name`
    variant: str                   # :func:`variant_name`

    @classmethod
    def of(cls, rec: dict, setting: str | None = None) -> BenchKey:
        """The key of record ``rec``, under ``setting`` (one of its names) if given."""
        return cls(rec["N"], round(rec["compute_scale"], 4), rec["link_Mbps"], setting or rec["setting"],
                   rec["variant"])


def read_bench(bench: dict, where: str = "the bench JSON") -> dict:
    """A ``gvq.bench overlap --out`` file as this version reads it: ``version`` set (absent: 1), every
    record named (a record of a file older than settings carries only its option: named by it); a file
    from a newer gvq is refused in one line."""
    version = bench.get("version", 1)
    if version > BENCH_VERSION:
        raise ValueError(f"{where}: version {version}, newer than this gvq reads ({BENCH_VERSION}); update gvq")
    modes = [{**r, "setting": r.get("setting") or Setting(r["aggregator"]).name} for r in bench.get("modes", [])]
    return {**bench, "version": version, "modes": modes}


@functools.lru_cache(maxsize=None)
def method_defaults(option: str) -> dict[str, str]:
    """Method option ``option``'s composed knobs (conf/method/), as a name writes them; a method the
    options lack is refused as the CLI refuses it (:class:`gvq.schema.errors.ConfigError`)."""
    from omegaconf import OmegaConf

    from gvq.schema.compose import compose
    got = OmegaConf.to_container(compose([f"method={option}"]).method, resolve=True)
    return {str(k): setting_value(v) for k, v in got.items() if k != "_target_"}


def method_name(option: str, overrides=()) -> str:
    """A method's part of a setting's name (:attr:`gvq.report.runs.Run.named` appends it to the setting):
    ``option`` and each ``method.*`` override off its composed default (:func:`method_defaults`), sorted, as
    :func:`canonical_name` writes an aggregator's; "" for ``every_step``, the default no name carries."""
    defaults, own = method_defaults(option), {}
    for o in overrides:
        if o.startswith("method.") and "=" in o:
            key, value = o[len("method."):].split("=", 1)
            own[key] = setting_value(value)
    knobs = sorted(f"{k}={v}" for k, v in own.items() if defaults.get(k, _ABSENT) != v)
    return "" if option == "every_step" and not knobs else " ".join([option, *knobs])


def split_named(name: str) -> tuple[str, str]:
    """A setting's name with its method (``qsgd bits=2 diloco every=100``) -> (``qsgd bits=2``, ``diloco
    every=100``): the method starts at the first word after the option that is no ``KEY=VALUE``."""
    words = name.split(" ")
    at = next((i for i, w in enumerate(words[1:], 1) if "=" not in w), len(words))
    return " ".join(words[:at]), " ".join(words[at:])


def canonical_named(name: str) -> str:
    """:func:`canonical` of a name with its method (:func:`split_named`), each part keyed as its tool
    keys it: ``qsgd bits=4 diloco every=30`` -> ``qsgd diloco`` (both defaults)."""
    setting, method = split_named(name)
    if not method:
        return canonical(setting)
    option, pairs = split_name(method)
    return " ".join(filter(None, (canonical(setting), method_name(option, [f"method.{k}={v}" for k, v in pairs]))))
