"""Experiments made of many runs, each part its own sub-package: the driver every experiment runs on (``driver``: its
jobs, run identities and records, folders and locks, the loop), the grid of position setups x seeds and its summary
(``grid``), and the conjecture's dose-response experiment (``conjecture``). The commands: ``blindheads.cli.grid`` and
``blindheads.cli.conjecture``."""
