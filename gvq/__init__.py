"""gvq: an experiment runner for bandwidth-efficient gradient aggregation (GradiVeQ, ORQ/BinGrad)."""
__version__ = "0.1.0"
