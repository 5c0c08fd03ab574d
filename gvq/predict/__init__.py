"""``python -m gvq.predict``: which aggregator wins at N nodes and B bit/s -- an alpha-beta-gamma cost
model replaying the ring code's schedules on costs measured on this machine (``calibrate``), checked
against virtual-time benchmarks (``validate``) and projected to N = 1024 (``project``)."""
