"""What every experiment (``grid``, ``conjecture``) does with its runs: its options checked (``options``), each run
keyed by everything that decides its result (``identity``), its jobs launched as ``blindheads`` subprocesses with
signals passed on (``jobs``), its folders owned and its summary published whole (``folders``), its records written
atomically (``records``), the loop that ties them together (``loop``), and, with ``--launcher``, the runs as jobs of a submitit job array
(``launchers``)."""
