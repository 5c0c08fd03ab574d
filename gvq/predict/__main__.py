"""``python -m gvq.predict [command] [KEY=VALUE ...]``: predicted aggregation and iteration times per aggregator.

    python -m gvq.predict calibrate [model=resnet32]        # once per machine: costs + ring structure
    python -m gvq.predict calibrate-overlap [model=resnet32]    # then: backward profile + DDP's buckets
    python -m gvq.predict calibrate-overlap host_ranks=[4,8]     # ... + messages as N ranks here pay them
    python -m gvq.predict rings [model=resnet32]            # are the stored rings still the declared ones?
    python -m gvq.predict world_size=[6,16] bandwidth=[5e7,1e9] compute_scale=[0.16667]
    python -m gvq.predict validate                         # model vs virtual-time benchmarks
    python -m gvq.predict validate-overlap --bench BENCH.json      # model vs gvq.bench overlap --out BENCH.json
    python -m gvq.predict project                            # winners for N = 2..1024 x 1 Mbit/s..100 Gbit/s
    python -m gvq.predict project "methods=[every_step,diloco every=100]"   # ... and each method's iterations
    python -m gvq.predict utilization model=cnn              # the link for 50/80/95% compute utilization, N = 64

Every figure is on the virtual clock's terms (CPU time of this machine x the scales, plus the link model),
for the aggregators ``calibrate`` measured (make bench's settings: GradiVeQ bf16 pooled K/d = 8,
PowerSGD rank 6).  ``bound`` says what dominates a row: compute, bandwidth (bytes / B), latency
(messages x (alpha + posting)) or codec (the rest of the aggregation).
"""
from __future__ import annotations

from gvq.predict.codec_costs import CODEC_COSTS
from gvq.predict.cost_model import PredictError
from gvq.predict.keys import (CALIBRATION, PROJECT_PATHS, CalibrateKeys, CalibrateOverlapKeys, ProjectKeys, RingsKeys,
                              TableKeys, UtilizationKeys, ValidateKeys, ValidateOverlapKeys)
from gvq.schema.tool import Arg, Command, dispatch

COMMANDS = {
    "table": Command(TableKeys, "gvq.predict.table:predict_table", "predicted times per aggregator, N, link and "
                     "compute scale (the default command)", (CALIBRATION, CODEC_COSTS)),
    "calibrate": Command(CalibrateKeys, "gvq.predict.calibrate:predict_calibrate", "once per machine: costs and "
                         "ring structure", (Arg("--out", "default: runs/predict/<model>"),)),
    "calibrate-overlap": Command(CalibrateOverlapKeys, "gvq.predict.calibrate_overlap:predict_calibrate_overlap",
                                 "then: backward profile, DDP's buckets, host messages", (CALIBRATION,)),
    "rings": Command(RingsKeys, "gvq.predict.structure:predict_rings", "are the stored rings still the declared "
                     "ones? (exit 1 where not)", (CALIBRATION,)),
    "validate": Command(ValidateKeys, "gvq.predict.table:predict_validate", "the model against virtual-time "
                        "benchmarks, cell by cell", (CALIBRATION, Arg("--out", "also write the table as CSV here"),
                                                     CODEC_COSTS)),
    "validate-overlap": Command(ValidateOverlapKeys, "gvq.predict.table:predict_validate_overlap", "the model "
                                "against `gvq.bench overlap --out` JSONs, per mode",
                                (CALIBRATION, Arg("--bench", "the bench JSONs", nargs="+"),
                                 Arg("--out", "also write the table as CSV here"), CODEC_COSTS)),
    "project": Command(ProjectKeys, "gvq.predict.project:predict_project", "winners for N = 2..1024 x 1 Mbit/s.."
                       "100 Gbit/s", PROJECT_PATHS),
    "utilization": Command(UtilizationKeys, "gvq.predict.utilization:predict_utilization", "the link each setting "
                           "and method needs for a compute utilization (Streaming DiLoCo's Table 4)",
                           (CALIBRATION, Arg("--out", "also write the table as CSV here"), CODEC_COSTS)),
}


def main(argv=None):
    """``python -m gvq.predict [command] [KEY=VALUE ...]``; returns what the command returns; what it cannot
    answer ends it with one line (exit status 2)."""
    return dispatch("python -m gvq.predict", COMMANDS, argv, default="table", errors=(PredictError,))


if __name__ == "__main__":
    main()
