"""A Llama-style decoder whose position handling is a swappable ``PositionStack``. Readable top to bottom."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from blindheads.modules.backends import AttentionBackend, AttentionWeights, Eager, select_backend
from blindheads.modules.config import DecoderConfig
from blindheads.modules.position import PositionStack, build_position
from blindheads.numerics import resolve_dtype


class Attention(nn.Module):
    """Causal self-attention with grouped KV heads; the logits come from the shared position stack."""

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        assert config.hidden_size and config.num_heads and config.num_kv_heads  # DecoderConfig fills its shape
        self.num_heads, self.num_kv_heads, self.head_size = config.num_heads, config.num_kv_heads, config.head_size
        self.q_proj = nn.Linear(config.hidden_size, config.num_heads * config.head_size, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, config.num_kv_heads * config.head_size, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, config.num_kv_heads * config.head_size, bias=False)
        self.o_proj = nn.Linear(config.num_heads * config.head_size, config.hidden_size, bias=False)
        self.weights = AttentionWeights(resolve_dtype(config.softmax_dtype), config.gradient_floor)

    def forward(self, x: Tensor, position: PositionStack, backend: AttentionBackend) -> Tensor:
        batch, length, _ = x.shape
        q = self.q_proj(x).view(batch, length, self.num_heads, self.head_size).transpose(1, 2)
        k = self.k_proj(x).view(batch, length, self.num_kv_heads, self.head_size).transpose(1, 2)
        v = self.v_proj(x).view(batch, length, self.num_kv_heads, self.head_size).transpose(1, 2)
        q, k = position.rotate(q, k)
        y = backend.attend(q, k, v, position, self.weights)
        return self.o_proj(y.transpose(1, 2).reshape(batch, length, -1))


class SwiGLU(nn.Module):
    """The gated MLP of Llama: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        assert config.hidden_size and config.mlp_size  # DecoderConfig fills its shape
        self.gate_proj = nn.Linear(config.hidden_size, config.mlp_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.mlp_size, bias=False)
        self.down_proj = nn.Linear(config.mlp_size, config.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    """Pre-norm residual block: attention, then MLP."""

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.attn = Attention(config)
        self.mlp_norm = nn.RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.mlp = SwiGLU(config)

    def forward(self, x: Tensor, position: PositionStack, backend: AttentionBackend) -> Tensor:
        x = x + self.attn(self.attn_norm(x), position, backend)
        return x + self.mlp(self.mlp_norm(x))


class Decoder(nn.Module):
    """Token embedding, ``num_layers`` pre-norm blocks, final RMSNorm, (tied) LM head.

    One position stack serves every layer, so its bias or block mask is built once per forward, and kept for the
    next forward of the same length, device and dtype unless the stack has trainable parameters.
    """

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        assert config.hidden_size and config.num_heads and config.context_length and config.num_layers  # filled
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position = build_position(
            config.position, config.num_heads, config.context_length, config.dtype, config.threshold
        )
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.apply(self._init_weights)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self._backends: dict[type, AttentionBackend] = {}

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            assert self.config.init_std  # DecoderConfig fills its shape
            nn.init.normal_(module.weight, mean=0.0, std=self.config.init_std)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def backend_for(self, device: torch.device, attention: str | None = None) -> AttentionBackend:
        """The backend that runs on ``device`` (``attention`` overrides the configured name), with its cache."""
        kind = select_backend(attention or self.config.attention, self.position, device)
        if kind not in self._backends:
            self._backends[kind] = kind()
        return self._backends[kind]

    def _compute_dtype(self, device: torch.device) -> torch.dtype:
        if torch.is_autocast_enabled(device.type):
            return torch.get_autocast_dtype(device.type)
        return self.embed.weight.dtype

    def hidden_states(
        self, input_ids: Tensor, attention: str | None = None, softmax_dtype: torch.dtype | None = None
    ) -> Tensor:
        """Final-norm hidden states (batch, length, hidden); ``attention`` overrides the configured backend, and
        ``softmax_dtype`` runs the eager backend's softmax in that dtype for this call (the measurements of the
        callbacks: what a training precision computes in), leaving the model as it is."""
        device, length = input_ids.device, input_ids.shape[1]
        if softmax_dtype is not None and attention != "eager":
            raise ValueError(f"softmax_dtype applies to the eager backend only, got attention={attention!r}")
        backend = Eager(softmax_dtype) if softmax_dtype is not None else self.backend_for(device, attention)
        backend.prepare(self.position, length, device, self._compute_dtype(device))
        self.position.prepare(length, self.config.head_size, device)
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x, self.position, backend)
        return self.norm(x)

    def forward(self, input_ids: Tensor, attention: str | None = None) -> Tensor:
        """Logits (batch, length, vocab) for token ids (batch, length)."""
        return self.lm_head(self.hidden_states(input_ids, attention))
