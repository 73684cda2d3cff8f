"""The decoder, its configuration and its swappable position components."""

from blindheads.modules.config import PRESETS, DecoderConfig
from blindheads.modules.decoder import Decoder

__all__ = ["PRESETS", "Decoder", "DecoderConfig"]
