"""Typed option groups (gvq/schema/options.py): every option file of aggregator/, model/, dataset/ and net/
composes to its schema, and a misspelt key, an ill-typed value or a choice outside its enum is refused
at compose time in one line naming the key and what it takes (gvq/schema/errors.py)."""
from __future__ import annotations

import dataclasses
import enum
import inspect
import re
import typing

import pytest
import yaml
from hydra.errors import ConfigCompositionException
from hydra.utils import get_object
from omegaconf import OmegaConf

from gvq.schema.config import TYPED_GROUPS
from gvq.schema.errors import describe
from gvq.schema.options import OPTION_SCHEMAS, RUNTIME_KWARGS, SCHEDULE_KEYS, WRAPPING_KEYS
from tests.helpers.cli import ROOT, cli_in_process

OPTIONS = [(g, p.stem) for g in TYPED_GROUPS for p in sorted((ROOT / "conf" / g).glob("*.yaml"))]


def _schema_of(group: str, option: str) -> str:
    """The schema an option file names, or the one the option it extends names."""
    text = (ROOT / "conf" / group / f"{option}.yaml").read_text()
    named = re.search(rf"/schema/{group}/(\w+)", text)
    return named.group(1) if named else _schema_of(group, yaml.safe_load(text)["defaults"][0])


def _per_schema(options):
    """Every option; make test-fast checks the refusals on the first option of each schema (options
    sharing one, such as resnet20/32/56/110, are refused by the same class), make test on all."""
    seen, out = set(), []
    for g, o in options:
        key = (g, _schema_of(g, o))
        marks = [pytest.mark.slow] if key in seen else []
        seen.add(key)
        out.append(pytest.param(g, o, id=f"{g}={o}", marks=marks))
    return out


PER_SCHEMA = _per_schema(OPTIONS)


def _refusal(compose_cfg, *overrides) -> str:
    with pytest.raises(ConfigCompositionException) as e:
        compose_cfg(*overrides)
    line = describe(e.value)
    assert "\n" not in line
    return line


def _schema_nodes(node, where):
    """(path, typed node) for the option's node and its typed children (an aggregator's compressor)."""
    yield where, node
    for key, child in node.items_ex(resolve=False):     # a container child: its node
        if OmegaConf.is_dict(child) and dataclasses.is_dataclass(OmegaConf.get_type(child)):
            yield from _schema_nodes(child, f"{where}.{key}")


def _fields(schema, kind):
    hints = typing.get_type_hints(schema)
    return [(f.name, hints[f.name]) for f in dataclasses.fields(schema) if _kind(hints[f.name]) == kind]


def _kind(hint):
    if typing.get_origin(hint) is typing.Union:             # Optional[X]: X (a List[float] is a list)
        hint = [a for a in typing.get_args(hint) if a is not type(None)][0]
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return "enum"
    return {int: "int", float: "float", bool: "bool"}.get(hint, "other")


@pytest.mark.parametrize("group,option", PER_SCHEMA)
def test_every_option_composes_to_its_schema_and_refuses_a_misspelt_key(compose_cfg, group, option):
    cfg = compose_cfg(f"{group}={option}")
    for where, node in _schema_nodes(cfg[group], group):
        schema = OmegaConf.get_type(node)
        assert dataclasses.is_dataclass(schema), f"{where}: no schema (name one in its defaults list)"
        line = _refusal(compose_cfg, f"{group}={option}", f"{where}.no_such_knob=1")
        assert line.startswith(f"{where}.no_such_knob: unknown key"), line


@pytest.mark.parametrize("group,option", PER_SCHEMA)
def test_every_typed_knob_refuses_an_ill_typed_value_naming_its_type(compose_cfg, group, option):
    cfg = compose_cfg(f"{group}={option}")
    words = {"int": "integer", "float": "float", "bool": "boolean"}
    for where, node in _schema_nodes(cfg[group], group):
        for kind, word in words.items():
            for name, _ in _fields(OmegaConf.get_type(node), kind)[:1]:     # one knob of each type
                line = _refusal(compose_cfg, f"{group}={option}", f"{where}.{name}=abc")
                assert line.startswith(f"{where}.{name}=abc: expected {word}"), line


@pytest.mark.parametrize("group,option", PER_SCHEMA)
def test_every_choice_refuses_a_value_outside_its_enum_naming_the_choices(compose_cfg, group, option):
    cfg = compose_cfg(f"{group}={option}")
    accepted = []
    for where, node in _schema_nodes(cfg[group], group):
        for name, choices in _fields(OmegaConf.get_type(node), "enum"):
            allowed = ", ".join(m.value for m in choices)
            line = _refusal(compose_cfg, f"{group}={option}", f"{where}.{name}=nope")
            assert line == f"{where}.{name}=nope: expected one of {allowed}", line
            accepted.append((f"{where}.{name}", next(iter(choices)).value))
    # and each choice's first value is taken: all of them in one composition (a refusal would name its key)
    got = compose_cfg(f"{group}={option}", *(f"{key}={value}" for key, value in accepted))
    for key, value in accepted:
        taken = OmegaConf.select(got, key)
        assert (taken.value if isinstance(taken, enum.Enum) else taken) == value, (key, taken)


@pytest.mark.parametrize("key", sorted(OPTION_SCHEMAS), ids=["/".join(k) for k in sorted(OPTION_SCHEMAS)])
def test_schema_fields_are_the_constructors_keyword_arguments(key):
    """Schema and constructor cannot drift apart: a field the constructor does not take (other than the
    run's wrapping keys, which never reach it), or a keyword argument no schema offers (other than what
    the launcher supplies), fails here."""
    for schema in _schema_classes(OPTION_SCHEMAS[key]):
        fields = {f.name: f for f in dataclasses.fields(schema) if f.name != "_target_"}
        if len(fields) == len(dataclasses.fields(schema)):
            continue                                   # no _target_ (net): read by the launcher, not built
        params = {n: p for n, p in inspect.signature(get_object(_default(schema, "_target_"))).parameters.items()
                  if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
        taken = set(fields) - set(WRAPPING_KEYS) - set(SCHEDULE_KEYS)
        assert taken <= set(params), f"{schema.__name__}: {taken - set(params)} not taken"
        assert set(params) - RUNTIME_KWARGS <= set(fields), f"{schema.__name__}: {set(params) - set(fields)} missing"
        for name in fields:
            if name not in params:
                continue                               # a wrapping key: the run's, no constructor default
            default = _default(schema, name)
            if params[name].default is not inspect.Parameter.empty and not dataclasses.is_dataclass(default):
                assert default == params[name].default, f"{schema.__name__}.{name}: {default!r}"


def _schema_classes(schema):
    yield schema
    for f in dataclasses.fields(schema):
        t = typing.get_type_hints(schema)[f.name]
        if dataclasses.is_dataclass(t):
            yield from _schema_classes(t)


def _default(schema, name):
    f = next(f for f in dataclasses.fields(schema) if f.name == name)
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


#: (option schema, constructor) of every aggregator, and ErrorFeedbackAggregator: the ``_target_`` a
#: compressed option takes for error feedback
AGGREGATOR_TARGETS = sorted({(k, _default(s, "_target_")) for k, s in OPTION_SCHEMAS.items() if k[0] == "aggregator"}
                            | {(("aggregator", "qsgd"), "gvq.aggregators.error_feedback.ErrorFeedbackAggregator")})


@pytest.mark.parametrize("key,target", AGGREGATOR_TARGETS, ids=[t.rpartition(".")[2] for _, t in AGGREGATOR_TARGETS])
def test_an_aggregators_knobs_have_their_default_in_the_schema_only(key, target):
    """One home per default: an aggregator's constructor takes every knob keyword-only and without a
    default of its own (one could differ from the schema's, or silently duplicate it); tests and tools
    build from the schema (``gvq.schema.options.knobs``)."""
    schema, params = OPTION_SCHEMAS[key], inspect.signature(get_object(target)).parameters
    offered = [f.name for f in dataclasses.fields(schema) if f.name != "_target_" and f.name in params]
    for name in offered:
        p, default = params[name], _default(schema, name)
        assert p.default is inspect.Parameter.empty, \
            f"{target}({name}={p.default!r}): the default is {schema.__name__}'s ({default!r}) only"
        assert dataclasses.is_dataclass(default) or p.kind is p.KEYWORD_ONLY, f"{target}: {name} not keyword-only"


def test_knobs_are_the_schemas_defaults_with_the_given_ones_instead():
    from gvq.aggregators.powersgd import PowerSGDAggregator
    from gvq.schema.options import GradiVeQAggregatorSchema, PowerSGDSchema, knobs
    got = knobs(PowerSGDSchema, rank=4)
    assert got == {"rank": 4, "start_iter": 10, "min_compression_rate": 2.0, "warm_start": True,
                   "kernels": "auto", "topology": "ring"}
    assert PowerSGDAggregator(**got).rank == 4
    g = knobs(GradiVeQAggregatorSchema)          # nested compressor and the run's overlap keys left out
    assert "compressor" not in g and "overlap" not in g and g["sampling"] == "qsgd" and type(g["sampling"]) is str
    with pytest.raises(TypeError, match="no knob rnk"):
        knobs(PowerSGDSchema, rnk=4)


def test_every_schema_is_named_by_an_option_file():
    named = {(p.parent.name, line.split("/schema/")[1].split("/")[1].split("@")[0])
             for g in TYPED_GROUPS for p in (ROOT / "conf" / g).glob("*.yaml")
             for line in p.read_text().splitlines() if "/schema/" in line}
    assert named == set(OPTION_SCHEMAS)


def test_the_schema_group_is_not_an_option(compose_cfg):
    line = _refusal(compose_cfg, "aggregator=schema")
    assert line.startswith("aggregator=schema: no such option")


def test_a_misspelt_aggregator_knob_is_one_line_from_the_cli():
    r = cli_in_process("aggregator=powersgd", "aggregator.rnk=4", "logger=csv")
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2, r.stderr[-2000:]
    assert lines == ["gvq: config error: aggregator.rnk: unknown key; did you mean aggregator.rank? "
                     "allowed: bucket_cap_mb, kernels, min_compression_rate, overlap, rank, start_iter, "
                     "topology, warm_start"], \
        r.stderr[-2000:]
    assert "Traceback" not in r.stderr
