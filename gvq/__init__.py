"""gvq: an experiment runner for bandwidth-efficient gradient aggregation (GradiVeQ, ORQ/BinGrad).

The folder is the role, the file is the variant; imports run down this list, never up
(tests/test_layout.py holds the rule; tests/test_docs.py checks this map and the README's list every room,
and the README's every file):

    report/       python -m gvq.report: curves, breakdowns, tables from run outputs (never the training code)
    analysis/     python -m gvq.analysis quantizers|correlation|peers|gradiveq_trace|frontier|dither: analyses
                  of real gradients
    predict/      python -m gvq.predict: the calibrated cost model (calibrate, validate, project)
    bench/        python -m gvq.bench aggregate|train|overlap|soak|codecs|quantizers|netns|clock|paper|startup|gpucheck;
                  common.py is the shared core; gpucheck/ is make gpu-check (the CUDA path, one table)
    run/          what cli.py starts: launch (ranks from a warm fork server / spawn / torchrun), train loop,
                  checkpoint, logs, errors.py (the CLI's one-line errors), validate, placement (GPUs)
    methods/      when ranks sync and what they average (every_step, local_sgd, diloco, streaming_diloco, demo): the
                  Method contract
    hooks/        the public DDP communication hook (GvqHookState, gvq_hook) and its per-rank thread
    aggregators/  what the training loop calls: the Aggregator contract (base.py), one file per aggregator
    comm/         p2p (transport), links (emulated / virtual), clock, ring, ring_batched, ring_steps, staging,
                  internals (the private Python/torch APIs gvq uses, in one place: every room above may read it)
    schema/       the typed config the CLI and the hook both compose through: schemas (config.py, options.py),
                  one-line errors, where conf/ is (a checkout's or the wheel's copy) and compose()
    compressors/  codecs only (one file each; GradiVeQ's is the gradiveq/ subpackage); _-prefixed files are parts
    workloads/    what a run trains on (loss, accuracy, bits per byte, one input's shape, a synthetic batch), one
                  object every tool asks: the Workload contract (base.py), one file per kind
    data/         one loader per source format (idx: Fashion-MNIST, sklearn_digits, cifar_python, gaussian,
                  r_lazyload: Austen from an R lazy-load database), TensorData (tensors.py), text as next-token windows
                  (tokens.py: TokenData, text_file) and the sharded, resumable batch stream (batches.py)
    models/       one file per model (cnn, resnet, gpt), shared layers in _layers.py; each declares its input
"""
__version__ = "0.1.0"
