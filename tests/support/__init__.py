"""What the tests share: the one place a test module imports from besides the package and libraries (no test module
imports another; ``test_suite_layout.py`` checks it). ``tests/`` is on ``sys.path`` (pytest's rootdir insertion for
``tests/conftest.py``; ``runs.run_cli`` puts it on a CLI subprocess's ``PYTHONPATH``), so this package is
``support``, and a callback in a subprocess is named ``support.callbacks.NAME``.

- ``runs``: CLI jobs in a subprocess (``run_cli``) or in this process (``in_process``, ``refusal``), the tiny run's
  arguments, copying runs, reading their TensorBoard scalars.
- ``callbacks``: callbacks that kill, signal, poison or fill the disk at a step.
- ``models``: the tiny LightningModule and a quiet CPU trainer.
- ``data``: parquet in FineWeb-Edu's schema, data modules on the builtin corpus, batches, resume states.
- ``backends``: tiny decoders under each attention backend, the specs they are checked on, the checks.
- ``softmax``: the real-softmax reference of the blindness calculator and its dtype x threshold cases.
- ``prompts``: a digest of retrieval prompts; ``oracles``: a decoder that answers from the context.
"""
