"""Checkpoints, in one place: read safely (``reading``), written whole (``writing``: Lightning's checkpoint I/O and
the ``last.ckpt`` a resumed fit goes on writing), what a checkpoint's options replace (``options``), and a decoder
and tokenizer rebuilt from one (``rebuild``)."""
