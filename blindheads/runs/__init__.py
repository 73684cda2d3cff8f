"""Run safety: what keeps a run's folder, checkpoints and records whole whatever happens to it, delivered to
LightningCLI through its public hooks and to the Trainer as callbacks and a plugin (``cli.lightning``): the checks of
a run's names and checkpoint before it starts (``names``, ``resume``), one live run per folder (``lock``), its config
records (``config_records``), signals that save at a step's end (``interrupts``), ranks that outlive rank 0
(``watchdog``). The pieces a fit uses are gathered in ``safety.RunSafety``."""
