"""FineWeb-Edu streaming in a fixed order, split across ranks and workers, with exact resume."""

from blindheads.datamodules.fineweb import FineWebEdu

__all__ = ["FineWebEdu"]
