"""``python -m gvq.predict project``: which aggregator is fastest per iteration at N = 2..1024 ranks x
B = 1 Mbit/s..100 Gbit/s x compute scale {1, 1/6, 1/50}, for each calibrated model: ``projection.csv``
(every cell, every aggregator, its bound) and one heatmap per model (``projection_<model>.png``, drawn by
:mod:`gvq.predict.heatmap`: the winner's colour, its margin over the second in the cell, and the line
beyond which GradiVeQ-RAR is no longer faster than uncompressed RAR), and ``crossovers.csv``: per N, the
link speed where GradiVeQ-RAR stops paying off and up to which link each aggregator stays
bandwidth-bound.  Aggregation does not depend on the compute scale (every rank starts it together), so it
is simulated once per (aggregator, N, B).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from gvq.predict import nccl
from gvq.predict import pricing as prices
from gvq.predict import cost_model as M
from gvq.predict.heatmap import plot
from gvq.predict.keys import cluster_of
from gvq.predict.sync import methods_asked, project_methods
from gvq.predict.table import row
from gvq.schema.tool import namespace
from gvq.predict.project_names import calibrated_name, priced_of, uncalibrated

LINKS = [1e6, 3e6, 1e7, 3e7, 1e8, 3e8, 1e9, 3e9, 1e10, 3e10, 1e11]
SCALES = [1.0, 1 / 6, 1 / 50]
FP16 = "fp16"                # overlapped, the reference every overlap=true gain (margin) is over
DDP = "ddp"                  # DDP's all-reduce hook: priced by baseline=nccl, its iterations RAR's


def grid(m: M.Calibrated, worlds, links, scales, alpha: float = 0.0, cluster=M.FLAT) -> pd.DataFrame:
    rows = [row(m, a, n, b, alpha, 1.0, c, cluster) for n in worlds for b in links for a in m.aggregators
            for c in scales]
    df = pd.DataFrame(rows).assign(model=m.cal["model"])
    return df if cluster.flat else df.assign(nodes=df["N"] // cluster.ranks_per_node)


def winners(df: pd.DataFrame) -> pd.DataFrame:
    """Per cell: the fastest aggregator, its margin (second's time / its time) and GradiVeQ vs RAR."""
    out = []
    for (n, b, c), g in df.groupby(["N", "link_bps", "compute_scale"]):
        g = g.sort_values("iter_s")
        t = g.set_index("aggregator")["iter_s"]
        gv = next((a for a in t.index if a.startswith("gradiveq")), None)
        out.append({"N": n, "link_bps": b, "compute_scale": c, "winner": g["aggregator"].iloc[0],
                    "margin": g["iter_s"].iloc[1] / g["iter_s"].iloc[0],
                    "winner_bound": g["bound"].iloc[0],
                    "gradiveq_vs_rar": t["rar"] / t[gv] if gv and "rar" in t else np.nan})
    return pd.DataFrame(out)


def crossovers(df: pd.DataFrame) -> pd.DataFrame:
    """Per (model, compute scale, N): the link speed beyond which GradiVeQ-RAR is no longer faster than
    RAR (geometric interpolation between grid links; NaN: it never pays off / pays off everywhere in
    the grid), and, per aggregator, the fastest link at which its iteration is still bandwidth-bound."""
    out = []
    gv = next((a for a in df["aggregator"].unique() if a.startswith("gradiveq")), None)
    for (model, c, n), g in df.groupby(["model", "compute_scale", "N"]):
        t = g.pivot(index="link_bps", columns="aggregator", values="iter_s").sort_index()
        rec = {"model": model, "compute_scale": c, "N": n,
               "gradiveq_pays_below_bps": _last_crossing(t["rar"] / t[gv]) if gv and "rar" in t else np.nan}
        for a, ga in g.groupby("aggregator"):
            bw = ga[ga["bound"] == "bandwidth"]["link_bps"]
            rec[f"{a}_bandwidth_bound_to_bps"] = bw.max() if len(bw) else np.nan
        out.append(rec)
    return pd.DataFrame(out)


def _last_crossing(ratio: pd.Series) -> float:
    """The link where ``ratio`` (indexed by link, ascending) falls through 1 for the last time."""
    above = (ratio >= 1).to_numpy()
    if above.all() or not above.any():
        return np.nan
    k = int(np.nonzero(above)[0].max())
    if k == len(ratio) - 1:
        return np.nan
    b0, b1 = np.log(ratio.index[k]), np.log(ratio.index[k + 1])
    r0, r1 = ratio.iloc[k], ratio.iloc[k + 1]
    return float(np.exp(b0 + (r0 - 1) / (r0 - r1) * (b1 - b0)))


#: what the number in a cell is, said in each heatmap
MARGIN = "number in a cell: the winner's margin, the runner-up's seconds per iteration / the winner's"
GAIN = ("number in a cell: the winner's gain over overlapped fp16, fp16 overlapped's seconds per iteration / "
        "the winner's")
TTA_GAIN = ("number in a cell: the winner's gain over overlapped fp16 in time to the target, fp16 overlapped's "
            "(iterations x seconds per iteration) / the winner's")


def predict_project(cfg, paths):
    """``python -m gvq.predict project``: the winners over N x link x compute, per model."""
    args = namespace(cfg, paths)
    args.out.mkdir(parents=True, exist_ok=True)
    def pricing(m):
        return prices.as_keys_price(m, args, args.aggregators)
    methods = methods_asked(args)            # beside every_step: projection_methods.csv (overlap=true: refused)
    if not args.overlap and (args.frontier or args.iterations_to_target):
        raise M.PredictError("gvq.predict project: time to the target (--frontier, iterations_to_target) is ranked "
                             "by overlap=true (on nodes: every setting post-backward); add overlap=true")
    if args.overlap:
        iters, spread, left = frontier_iterations(args.frontier) if args.frontier else ({}, {}, [])
        if left:
            print(f"gvq.predict project: from {args.frontier}, left out: {'; '.join(left)}", flush=True)
        typed = _iterations_to_target(args.iterations_to_target)
        try:
            return project_overlap(args.models, args.calibration, args.out, args.max_world_size,
                                   {**iters, **typed}, pricing, {k: v for k, v in spread.items() if k not in typed},
                                   frozenset(iters) - frozenset(typed), nccl.from_args(args), cluster_of(args))
        except FileNotFoundError as e:
            raise M.PredictError(f"gvq.predict project overlap=true: {e}") from None
    frames, cluster = [], cluster_of(args)
    for model in args.models:
        m, how = pricing(M.Calibrated.load(M.calibration_folder(args.calibration, model)))
        print(f"gvq.predict project: {model}: {how}", flush=True)
        per = cluster.ranks_per_node
        worlds = [n * per for n in m.world_sizes if n & (n - 1) == 0 and (n > 1 or per == 1)
                  and n * per <= args.max_world_size]
        df = grid(m, worlds, LINKS, SCALES, cluster=cluster)
        win = winners(df).assign(model=model)
        win = win if per == 1 else win.assign(nodes=win["N"] // per)
        for path, cells, axes in _heatmaps(args.out, model, win, per):
            plot(cells, f"{model}{'' if per == 1 else f', {per} ranks a node'}", path, caption=MARGIN, **axes)
            print(f"gvq.predict project: {model}: {len(cells)} cells -> {path}", flush=True)
        frames.append(df.merge(win, on=["N", "link_bps", "compute_scale", "model"] + ["nodes"] * (per > 1)))
    full = pd.concat(frames)
    full.to_csv(args.out / "projection.csv", index=False)
    cross = crossovers(full)
    cross.to_csv(args.out / "crossovers.csv", index=False)
    # compute is added alike to both sides, so the crossing hardly moves with the compute scale: show one
    show = cross[cross["compute_scale"] == cross["compute_scale"].max()].pivot(
        index="N", columns="model", values="gradiveq_pays_below_bps")
    print("# link (bit/s) below which GradiVeQ-RAR beats RAR, per N and model (virtual-time terms, compute "
          "x1; NaN: never or always in the grid; every scale in crossovers.csv)")
    print(show.to_markdown(floatfmt=".3g"))
    if methods:
        project_methods(args, pricing, methods, LINKS, SCALES)
    return frames


NODE_LINKS = [1e9, 1e10, 1e11]     # between nodes: a two-level projection's heatmaps, one each


def _heatmaps(out: Path, model: str, win: pd.DataFrame, per: int):
    """(path, cells, axes) of each heatmap: flat, one (N down, link across, a panel per compute scale);
    nodes of ``per`` ranks, one per inter-node link of :data:`NODE_LINKS` (nodes down, compute across)."""
    if per == 1:
        return [(out / f"projection_{model}.png", win, {})]
    return [(out / f"projection_{model}_nodes{per}_{b:.0e}.png", win[win["link_bps"] == b],
             {"rows": "nodes", "cols": "compute_scale", "panels": "link_bps"}) for b in NODE_LINKS]


OVERLAP_LINKS = [5e7, 1e8, 3e8, 1e9, 3e9, 1e10, 3e10, 1e11]
OVERLAP_SCALES = [1.0, 1 / 6]            # a CPU cluster; the GradiVeQ paper's GPUs


def overlap_grid(ov, worlds, links=OVERLAP_LINKS, scales=OVERLAP_SCALES, shared: bool = True,
                 baseline=None, cluster=M.FLAT) -> pd.DataFrame:
    """Every (N, link, compute scale, aggregator, mode): post-backward and overlapped at DDP's default
    buckets, seconds per iteration (the model of :mod:`gvq.predict.overlap`); ``baseline`` (a
    :class:`gvq.predict.nccl.Nccl`; None: ``gvq_ring``) prices overlapped fp16, and adds ``ddp``, in the
    cells it applies to; the ``baseline`` column says which priced each cell.  ``cluster`` of more than one
    rank a node: :func:`node_grid` (post-backward only)."""
    if not cluster.flat:
        return node_grid(ov, worlds, links, scales, cluster)
    rows = []
    for n in worlds:
        for b in links:
            for c in scales:
                nccl = baseline is not None and baseline.applies(c)
                cell = {"N": n, "link_bps": b, "compute_scale": c, "baseline": baseline.name if nccl else "gvq_ring"}
                for a in ov.m.aggregators:
                    post = ov.post_iteration(a, n, b, compute_scale=c)
                    over = (baseline.iteration(ov, a, n, b, c) if nccl and a == FP16
                            else ov.iteration(a, n, b, compute_scale=c, shared=shared))
                    rows += [{**cell, "aggregator": a, "mode": mode, **got}
                             for mode, got in (("post", post), ("overlap", over))]
                if nccl and FP16 in ov.m.aggregators:     # DDP's own all-reduce hook, fp32, beside it
                    rows.append({**cell, "aggregator": DDP, "mode": "overlap",
                                 **baseline.iteration(ov, DDP, n, b, c)})
    return pd.DataFrame(rows).assign(model=ov.m.cal["model"])


NODE_BASELINE = "post_only"      # a two-level cell's baseline column: nothing overlapped priced


def node_grid(ov, worlds, links, scales, cluster) -> pd.DataFrame:
    """:func:`overlap_grid`'s cells on nodes of ``cluster.ranks_per_node`` ranks: every setting post-backward
    only, priced as plain ``project ranks_per_node=R`` prices it (:func:`gvq.predict.cost_model.iteration`
    with the cluster: the calibration's compute + the hierarchical aggregation), so the two rankings share one
    iteration.  The overlapped model's buckets replay flat rings at N and NCCL's baseline is a flat ring:
    neither has a two-level form, so no mode is overlapped here and the gain (``margin``) is over fp16
    post-backward on the same nodes (:func:`node_line`)."""
    rows = [{"N": n, "link_bps": b, "compute_scale": c, "baseline": NODE_BASELINE, "aggregator": a, "mode": "post",
             **M.iteration(ov.m, a, n, b, compute_scale=c, cluster=cluster)}
            for n in worlds for b in links for c in scales for a in ov.m.aggregators]
    return pd.DataFrame(rows).assign(model=ov.m.cal["model"])


def node_line(cluster) -> str:
    """What a two-level ``project overlap=true`` priced, said in its table's head and every heatmap's."""
    return (f"nodes of {cluster.ranks_per_node} ranks ({cluster.intra_bandwidth_bps:.3g} bit/s inside, the link "
            "between nodes across): every setting post-backward (compute + hierarchical aggregation, as project "
            f"ranks_per_node={cluster.ranks_per_node} prices it); the "
            "overlapped model and NCCL's baseline price the flat ring only, so nothing is overlapped and each "
            "gain is over fp16 post-backward on the same nodes")


def overlap_winners(df: pd.DataFrame, iters: dict[str, float] | None = None,
                    spread: dict[str, float] | None = None) -> pd.DataFrame:
    """Per cell: the fastest (aggregator, mode), its gain over overlapped fp16 (``margin``: fp16
    overlapped / the winner), the runner-up and GradiVeQ's best mode against RAR's best; with ``iters``
    (iterations to the target accuracy per aggregator) also the winner by time to accuracy, and with
    ``spread`` (their std over seeds) the modes tied with it."""
    out = []
    if iters and "rar" in iters and DDP not in iters:     # the same fp32 sum as RAR's: the same iterations
        iters = {**iters, DDP: iters["rar"]}
        spread = {**(spread or {}), DDP: (spread or {}).get("rar", 0.0)}
    for (n, b, c), g in df.groupby(["N", "link_bps", "compute_scale"]):
        rec = _fastest(g)
        if iters:
            rec.update(_fastest_to_target(g, iters, spread or {}))
        out.append({"N": n, "link_bps": b, "compute_scale": c, "baseline": g["baseline"].iloc[0], **rec})
    return pd.DataFrame(out)


def _reference(g: pd.DataFrame, column: str) -> pd.Series:
    """The cell's gain reference in ``column``: overlapped fp16, or on nodes (where nothing is overlapped,
    :func:`node_grid`) fp16 post-backward."""
    fp16 = g[g["aggregator"] == FP16]
    over = fp16[fp16["mode"] == "overlap"]
    return (over if len(over) else fp16[fp16["mode"] == "post"])[column]


def _fastest(g: pd.DataFrame) -> dict:
    """One cell's fastest (aggregator, mode) per iteration, runner-up, gain over overlapped fp16, GradiVeQ vs RAR."""
    g = g.sort_values("iter_s")
    fp16 = _reference(g, "iter_s")
    best = g.groupby("aggregator")["iter_s"].min()
    gv = next((a for a in best.index if a.startswith("gradiveq")), None)
    return {"winner": f"{g['aggregator'].iloc[0]} {g['mode'].iloc[0]}", "winner_s": g["iter_s"].iloc[0],
            "runner_up": f"{g['aggregator'].iloc[1]} {g['mode'].iloc[1]}",
            "margin": fp16.iloc[0] / g["iter_s"].iloc[0] if len(fp16) else np.nan,
            "gradiveq_vs_rar": best["rar"] / best[gv] if gv and "rar" in best else np.nan}


def _fastest_to_target(g: pd.DataFrame, iters: dict[str, float], spread: dict[str, float]) -> dict:
    """Seconds to the target = iterations to it x seconds per iteration, over the aggregators ``iters``
    names; the gain over overlapped fp16's own time to the target; ``tta_tied``: the other modes whose
    band (iterations -+ their ``spread``, x seconds per iteration) reaches the winner's (a tie: no winner
    beyond the seed spread)."""
    g = g[g["aggregator"].isin(iters)]
    mean, std = g["aggregator"].map(iters), g["aggregator"].map(lambda a: spread.get(a, 0.0))
    g = g.assign(tta_s=mean * g["iter_s"], lo=(mean - std) * g["iter_s"], hi=(mean + std) * g["iter_s"])
    g = g.sort_values("tta_s")
    if not len(g):
        return {"tta_winner": None, "tta_s": np.nan, "tta_margin": np.nan, "tta_tied": ""}
    fp16 = _reference(g, "tta_s")
    tied = g.iloc[1:][g["lo"].iloc[1:] <= g["hi"].iloc[0]]
    return {"tta_winner": f"{g['aggregator'].iloc[0]} {g['mode'].iloc[0]}", "tta_s": g["tta_s"].iloc[0],
            "tta_margin": fp16.iloc[0] / g["tta_s"].iloc[0] if len(fp16) else np.nan,
            "tta_tied": ", ".join(f"{a} {m}" for a, m in zip(tied["aggregator"], tied["mode"]))}


def project_overlap(models, calibration: Path, out: Path, max_world: int,
                    iters: dict[str, float] | None = None, pricing=None, spread: dict[str, float] | None = None,
                    optional: frozenset = frozenset(), baseline=None, cluster=M.FLAT) -> pd.DataFrame:
    """``project overlap=true``: per model, the grid, the winners (``projection_overlap.csv``) and a heatmap
    (``projection_overlap_<model>.png``: the winner's colour, its gain over overlapped fp16); with
    ``iters`` (and ``spread``: ties), the winners by time to accuracy too (``projection_overlap_tta_<model>.png``);
    ``pricing``: the codec costs and message posting (``pricing.as_keys_price``); ``optional``: names of ``iters`` a
    model may lack (a frontier's settings that were not calibrated: left out, said so), where any other it lacks
    is refused in one line; ``baseline``: what prices overlapped fp16 in the GPU regime (:func:`baseline_line`),
    named in the table's head, the CSV and every heatmap's title; ``cluster``: nodes of ranks (:func:`node_grid`: every
    setting post-backward, ranked by the same rules)."""
    from gvq.predict.overlap import Overlap
    frames, per = [], cluster.ranks_per_node
    note = baseline_line(baseline) if cluster.flat else node_line(cluster)
    tag = "" if cluster.flat else f"_nodes{per}"
    for model in models:
        ov = Overlap.load(M.calibration_folder(calibration, model), pricing)
        iters, spread, optional = _as_calibrated(model, ov.m, iters, spread, optional)
        _refuse_uncalibrated(model, ov.m.aggregators, iters or {}, optional)
        worlds = overlap_worlds(ov.m.world_sizes, max_world, per)
        win = overlap_winners(overlap_grid(ov, worlds, baseline=baseline, cluster=cluster), iters, spread)
        win = win.assign(model=model) if cluster.flat else win.assign(model=model, nodes=win["N"] // per)
        title = f"{model}, " + ("post | overlapped" if cluster.flat else f"{per}/node, post")
        plot(win, title, out / f"projection_overlap_{model}{tag}.png", note, GAIN, modes=True)
        if iters:               # the same cells ranked by time to the target, ties within the seed spread marked
            plot(win.assign(winner=win["tta_winner"], margin=win["tta_margin"], tied=win["tta_tied"]),
                 f"{title}, time to target", out / f"projection_overlap_tta_{model}{tag}.png", note,
                 TTA_GAIN, modes=True)
        frames.append(win)
    full = pd.concat(frames).sort_values(["model", "compute_scale", "N", "link_bps"],
                                         ascending=[True, False, True, True])
    full.to_csv(out / f"projection_overlap{tag}.csv", index=False)
    show = full.assign(link=full["link_bps"].map(lambda b: f"{b / 1e9:g}G" if b >= 1e9 else f"{b / 1e6:g}M"))
    print("# winner (aggregator, mode) per cell and its gain over overlapped fp16 (virtual-time terms)")
    print(f"# {note}")
    cols = ["model", "compute_scale", "N"] + ["nodes"] * (per > 1) + ["link", "baseline", "winner", "margin",
                                                                   "runner_up"]
    if iters:          # an aggregator's iterations to the target taken as the same at every N and link
        print(f"# time to accuracy: iterations to the target {iters} x seconds per iteration")
        cols += ["tta_winner", "tta_margin"] + (["tta_tied"] if spread else [])
    print(show[cols].to_markdown(index=False, floatfmt=".3g"))
    return full


def overlap_worlds(calibrated: list[int], max_world: int, per: int = 1) -> list[int]:
    """``project overlap=true``'s N: the calibrated powers of two from 8 (one rank a node), or ``per`` x the
    calibrated powers of two from 2 nodes (the ring across nodes is calibrated at N = nodes)."""
    if per == 1:
        return [n for n in calibrated if n & (n - 1) == 0 and 8 <= n <= max_world]
    return [k * per for k in calibrated if k & (k - 1) == 0 and k > 1 and k * per <= max_world]


def baseline_line(baseline) -> str:
    """One line naming what priced overlapped fp16: every table and heatmap of ``project overlap=true`` says it."""
    old = f"gvq_ring, {nccl.BASELINES['gvq_ring']}"
    if baseline is None:
        return f"baseline: {old}, in both regimes"
    return f"{baseline.describe()}; CPU regime: {old}"


def _refuse_uncalibrated(model: str, have, iters: dict, optional: frozenset) -> None:
    """Iterations for a setting the calibration did not price are refused in one line naming what it did
    price of that option (a misspelt name, or ``powersgd`` at rank 2 beside a calibrated ``powersgd
    rank=6``, would otherwise drop out of the ranking unseen or be priced at another setting's seconds);
    a frontier's setting (``optional``) is left out, said so."""
    unknown = [k for k in iters if k not in have]
    wanted = [k for k in unknown if k not in optional]
    if wanted:
        raise M.PredictError(f"gvq.predict project: {model}: " + "; ".join(
            f"iterations_to_target {uncalibrated(k, have)}; calibrate {k} or give iterations for "
            f"{' or '.join(priced_of(k, have)) or 'a calibrated setting'}" for k in wanted))
    if unknown:
        print(f"gvq.predict project: {model}: left out: {'; '.join(uncalibrated(k, have) for k in unknown)}",
              flush=True)


def _as_calibrated(model: str, m, iters, spread, optional):
    """The report's names of ``iters``, ``spread`` and ``optional`` as the calibration ``m`` keys them (its
    default under ``qsgd``, the report's ``qsgd bits=4``: :func:`calibrated_name`), each renaming said; and
    a calibration without fp16, the reference every gain is over, said once."""
    if FP16 not in m.aggregators:
        print(f"gvq.predict project: {model}: fp16 not calibrated: no gain over overlapped fp16 (margin left "
              "empty); calibrate with aggregators=[fp16,...]", flush=True)
    names = {k: calibrated_name(k) for k in (iters or {})}
    for k, v in names.items():
        if k != v:
            print(f"gvq.predict project: {model}: {k!r} is the calibrated {v!r} (its defaults)", flush=True)
    return ({names[k]: v for k, v in (iters or {}).items()} if iters is not None else None,
            {names.get(k, k): v for k, v in spread.items()} if spread is not None else None,
            frozenset(names.get(k, k) for k in optional))


def frontier_iterations(path: Path) -> tuple[dict[str, float], dict[str, float], list[str]]:
    """Iterations to the target per setting from ``python -m gvq.report frontier RUNS``'s
    ``frontier.csv``: (mean, std over seeds, the settings left out and why).  A setting is taken where
    it is ranked (seeds enough for a band) and every seed reached the target: a mean over the seeds that
    did would flatter one that sometimes never does."""
    try:
        df = pd.read_csv(path)
        rows = list(zip(df["setting"], df["iters_to_target"], df["iters_to_target_std"], df["reached"], df["ranked"]))
    except (OSError, KeyError, ValueError, pd.errors.ParserError) as e:
        raise M.PredictError(f"--frontier {path}: not a `gvq.report frontier` frontier.csv ({e})") from None
    iters, spread, left = {}, {}, []
    for name, mean, std, reached, ranked in rows:
        k, n = (int(v) for v in str(reached).split("/"))
        if not ranked or k < n:
            left.append(f"{name} ({'unranked' if not ranked else f'reached in {reached}'})")
            continue
        iters[name], spread[name] = float(mean), float(std)
    return iters, spread, left


def _iterations_to_target(pairs: list[str]) -> dict[str, float]:
    out = {}
    for pair in pairs:
        name, _, value = pair.rpartition("=")     # a setting's name holds '=' itself: 'qsgd bits=2=140'
        try:
            out[name] = float(value)
        except ValueError:
            raise M.PredictError(f"iterations_to_target {pair!r}: expected AGGREGATOR=ITERATIONS (a number)") from None
        if not out[name] > 0:
            raise M.PredictError(f"iterations_to_target {pair!r}: iterations must be > 0")
    return out
