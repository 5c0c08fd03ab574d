"""gvq: an experiment runner for bandwidth-efficient gradient aggregation (GradiVeQ, ORQ/BinGrad).

The folder is the role, the file is the variant; imports run down this list, never up:

    report/       python -m gvq.report: curves, breakdowns, tables from run outputs (never the training code)
    analysis/     python -m gvq.analysis quantizers|correlation|peers: analyses of real gradients
    bench/        python -m gvq.bench aggregate|train|quantizers|netns; common.py is the shared core
    run/          what cli.py starts: launch (ranks from a warm fork server / spawn / torchrun), train loop, checkpoint, logs, schema, validate
    aggregators/  what the training loop calls: the Aggregator contract (base.py), one file per aggregator
    comm/         P2P transport and emulated links (p2p.py), the ring all-reduce variants (ring.py)
    compressors/  codecs only (one file each; GradiVeQ's is a subpackage); _bucketing/_packing are parts
    data.py, models.py   datasets and models
"""
__version__ = "0.1.0"
