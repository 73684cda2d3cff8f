"""The decoder, its configuration and its swappable position components."""

from blindheads.modules.config import SIZES, DecoderConfig
from blindheads.modules.decoder import Decoder

__all__ = ["SIZES", "Decoder", "DecoderConfig"]
