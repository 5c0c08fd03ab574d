"""Data sets held in memory as tensors, and the sharded, resumable batch stream each rank trains on.

Loaders are built from Hydra (``conf/dataset/*.yaml``) and return a :class:`TensorData`; one file per
source format, re-exported here so a config names ``gvq.data.<loader>``::

    python cli.py dataset=digits                     # scikit-learn's load_digits, no download
    python cli.py dataset=fashion_mnist              # IDX files (Debian's dataset-fashion-mnist), no download
    python cli.py dataset=cifar100 dataset.root=/data  # reads /data/cifar-100-python/{train,test}
    python cli.py dataset=synthetic                  # CIFAR-shaped random data, for benchmarks
    python cli.py dataset=austen model=gpt_tiny optim=adamw   # Austen's novels, bytes (language model)
    python cli.py dataset=text dataset.path=my.txt model=gpt_tiny optim=adamw   # any text file

Training is iteration-based: :func:`iterate_batches` yields ``(epoch, x, y)`` forever.  Every epoch
is one permutation shared by all ranks (seeded by ``(seed, epoch)``); rank r takes
``perm[r::world]`` cut to whole batches, so shards are disjoint and equally long.  Everything
random is a pure function of ``(seed, epoch, rank, batch)``, so starting at iteration ``i`` gives
exactly the batches a run that got there by stepping would see.  ``dataset.split`` (by_source: Austen's
novels; by_label: classes) gives the data ``groups``: the same epoch permutation, each rank keeping only
its own groups' examples (:func:`group_shard`), every rank cut to the smallest rank's batches.
"""
from gvq.data.batches import (AUG_PAD, augment_batch, batches_per_epoch, epoch_shard, group_batches_per_epoch,
                              group_owners, group_shard, group_sizes, iterate_batches, test_batches)
from gvq.data.cifar_python import CIFAR_LAYOUT, CIFAR_STATS, cifar10, cifar100
from gvq.data.r_lazyload import austen
from gvq.data.gaussian import synthetic
from gvq.data.idx import FASHION_FILES, fashion_mnist
from gvq.data.sklearn_digits import digits, digits_arrays, digits_cache_path, stratified_split
from gvq.data.tensors import TensorData, seeded_generator
from gvq.data.tokens import TokenData, text_file

__all__ = ["AUG_PAD", "CIFAR_LAYOUT", "CIFAR_STATS", "FASHION_FILES", "TensorData", "TokenData", "augment_batch",
           "austen", "batches_per_epoch", "cifar10", "cifar100", "digits", "digits_cache_path", "epoch_shard",
           "fashion_mnist", "group_batches_per_epoch", "group_owners", "group_shard", "group_sizes",
           "iterate_batches", "stratified_split", "synthetic", "test_batches", "text_file",
           "digits_arrays", "seeded_generator"]
