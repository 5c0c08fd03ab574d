"""What a run trained and what a bench measured: ``tta`` prices runs only at seconds per iteration
timed on their own model, input shape and classes (:func:`check_bench`), and where the two differ says what
to re-run.  The run's side is read from its ``summary.json`` (``config``, and ``identity``'s classes); a key
a run does not record (an older run's) is not compared."""
from __future__ import annotations

import functools

import yaml

from gvq.report.runs import ReportError, Run
from gvq.schema.compose import conf_dir

#: the shape of one input of each image data set (its loader in gvq/data), which its config does not
#: write; ``gvq.data.synthetic`` writes its own (``channels``, ``image_size``); a text data set's inputs are
#: token windows, compared by model and vocabulary (classes) only
IMAGE_SHAPES = {"gvq.data.digits": (1, 8, 8), "gvq.data.fashion_mnist": (1, 28, 28),
                "gvq.data.cifar10": (3, 32, 32), "gvq.data.cifar100": (3, 32, 32)}


@functools.lru_cache(maxsize=None)
def _model_file(option: str) -> dict:
    """The keys ``conf/model/<option>.yaml`` writes, over those of the options of its group its ``defaults``
    list names (``gpt_small`` over ``gpt_tiny``; schema entries, ``/schema/...``, left out); {} for no file."""
    path = conf_dir() / "model" / f"{option}.yaml"
    keys = (yaml.safe_load(path.read_text()) if path.is_file() else None) or {}
    out = {}
    for base in keys.get("defaults", []):
        if isinstance(base, str) and not base.startswith("/") and base != "_self_":
            out.update(_model_file(base))
    return {**out, **{k: v for k, v in keys.items() if k != "defaults"}}


def model_name(node: dict) -> str:
    """A run's model as a command line names it: the ``conf/model`` option of its class, and each knob it
    set otherwise (``cnn model.width=32``); its class's name where no option file builds that class."""
    options = sorted(p.stem for p in (conf_dir() / "model").glob("*.yaml"))
    same_class = [o for o in options if _model_file(o).get("_target_") == node.get("_target_")]
    if not same_class:
        return str(node.get("_target_", "?")).rsplit(".", 1)[-1]
    best = min(same_class, key=lambda o: len(_knobs(o, node)))      # the option needing fewest knobs
    return " ".join([best, *_knobs(best, node)])


def _knobs(option: str, node: dict) -> list[str]:
    """The knobs in which ``node`` differs from what ``option``'s file writes, as overrides."""
    return [f"model.{k}={node.get(k)}" for k, v in _model_file(option).items() if node.get(k) != v]


def run_workload(run: Run) -> dict:
    """What ``run`` trained, as a bench's setting names it: ``model`` (:func:`model_name`), ``input_shape``,
    ``num_classes`` and its ``dataset``; a key the run does not record is absent."""
    data, model = run.config.get("dataset") or {}, run.config.get("model") or {}
    out = {"dataset": str(data.get("_target_", "?")).rsplit(".", 1)[-1]}
    if model.get("_target_"):
        out["model"] = model_name(model)
    shape = IMAGE_SHAPES.get(data.get("_target_"))
    if "image_size" in data and "channels" in data:
        shape = (data["channels"], data["image_size"], data["image_size"])
    if shape:
        out["input_shape"] = tuple(int(v) for v in shape)
    classes = (run.summary.get("identity") or {}).get("num_classes") or data.get("num_classes")
    if classes:
        out["num_classes"] = int(classes)
    return out


def differences(workload: dict, setting: dict) -> list[str]:
    """The keys of :func:`run_workload` in which a bench's ``setting`` is another workload."""
    bench = {"model": setting.get("model"), "input_shape": tuple(setting.get("input_shape") or ()),
             "num_classes": setting.get("num_classes")}
    return [k for k in bench if k in workload and workload[k] != bench[k]]


def _describe(w: dict) -> str:
    shape = "x".join(map(str, w["input_shape"])) if w.get("input_shape") else None
    return " ".join(filter(None, [f"model={w.get('model', '?')}", f"on {w['dataset']}" if w.get("dataset") else None,
                                  f"input {shape}" if shape else None,
                                  f"{w['num_classes']} classes" if w.get("num_classes") else None]))


def check_bench(runs: list[Run], setting: dict, bench_path: str) -> None:
    """Refuse, in one line, a bench measured on another workload than a run's (model, input shape,
    classes), naming both and the bench command that times the runs' own."""
    for r in runs:
        w = run_workload(r)
        diff = differences(w, setting)
        if not diff:
            continue
        bench = {"model": setting.get("model"), "input_shape": setting.get("input_shape"),
                 "num_classes": setting.get("num_classes")}
        flags = [f"model={w.get('model', setting.get('model')).split(' ')[0]}"]
        shape = w.get("input_shape") or setting.get("input_shape")
        flags.append(f"input_shape=[{','.join(map(str, shape))}]" if shape else "")
        flags.append(f"num_classes={w.get('num_classes', setting.get('num_classes'))}")
        if r.config.get("batch_size"):
            flags.append(f"batch_size={r.config['batch_size']}")
        raise ReportError(f"bench {bench_path} is {_describe(bench)}; the runs are {_describe(w)} ({r.path}; "
                          f"differs in {', '.join(diff)}): re-run `python -m gvq.bench overlap "
                          f"{' '.join(f for f in flags if f)} ...` with their settings")
