"""Workloads: what a run trains on, as one object every tool asks (loss, accuracy, a text run's bits per
byte, one input's shape and a synthetic batch).  :mod:`gvq.workloads.base` holds the contract, one file per
kind; :mod:`gvq.workloads.build` makes one from a run's data or a tool's model config."""
from gvq.workloads.base import Workload
from gvq.workloads.build import of_data, of_model, of_shape
from gvq.workloads.classification import Classification
from gvq.workloads.language import LanguageModelling

__all__ = ["Classification", "LanguageModelling", "Workload", "of_data", "of_model", "of_shape"]
