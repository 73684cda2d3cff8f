"""A run's folder names, settled before anything is written: a logger's ``save_dir``, ``name`` and ``version``."""

from __future__ import annotations

import os
import re

from blindheads.disk import check_writable


def check_run_names(config) -> None:
    """A logger's ``save_dir``, ``name`` and ``version`` become the run's folders. ``$VAR`` and ``~`` in them are
    expanded here, once, as a user expects (TensorBoard expands its own log path, while checkpoints, the run lock and
    ``--ckpt_path last`` would take them literally): a variable that is not set is refused. So are a name the file
    system cannot hold and a ``save_dir`` that cannot be written, before any run."""
    loggers = config.get("trainer", {}).get("logger")
    for logger in loggers if isinstance(loggers, list) else [loggers]:
        args = getattr(logger, "init_args", None) if logger not in (None, True, False) else None
        if args is None:
            continue
        for key in ("save_dir", "name", "version"):
            value, option = args.get(key), f"--trainer.logger.init_args.{key}"
            if not isinstance(value, str):
                continue
            expanded = os.path.expandvars(os.path.expanduser(value) if key == "save_dir" else value)
            unset = re.findall(r"\$\{?(\w+)", expanded)
            if unset:
                raise ValueError(
                    f"{option} {value}: environment variable {unset[0]} is not set; set it, or give the path"
                )
            if key != "save_dir" and len(expanded.encode()) > 255:
                raise ValueError(f"{option} is {len(expanded.encode())} bytes long: a folder name holds at most 255")
            args[key] = expanded
        if args.get("save_dir") is not None:
            check_writable(args.save_dir, "--trainer.logger.init_args.save_dir")
