"""Recall of held-out retrieval-mix episodes at fixed gaps: does the model use what lies that far back?"""

from __future__ import annotations

from functools import partial

import lightning as L
import torch

from blindheads.callbacks.periodic import PeriodicEvaluation, log_scalars
from blindheads.datamodules.retrieval_mix import EpisodeWriter, RetrievalMix
from blindheads.evaluation.contexts import evaluating, forward_hooks
from blindheads.evaluation.recall import recall_samples
from blindheads.evaluation.scoring import score_samples


class EpisodeRecall(PeriodicEvaluation):
    """Every ``every_n_steps``, on ``samples`` held-out episodes per gap (the mix's templates over held-out text, one
    training window long; the data module's ``retrieval_mix``, else the default mix), logs:

    - ``recall/gap{g}/exact``: share of recalled values predicted exactly (teacher-forced), and ``.../distance``,
      the mean distance from each answer back to its fact;
    - ``recall/gap{g}/weight/layer{l}/head{h}``: the mean attention weight from the token that predicts the
      answer to the fact's value, eager attention in the training precision (exactly 0 where the head is blind);
    - ``recall/slope/head{h}``: the slopes of learnable ALiBi heads, to follow them over training.
    """

    def __init__(
        self, every_n_steps: int | None = 50, gaps: list[int] = (8, 128), samples: int = 32, batch_size: int = 16
    ) -> None:
        if samples < 1 or batch_size < 1 or not gaps:
            raise ValueError(
                f"samples and batch_size must be >= 1 and gaps non-empty, got {samples}, {batch_size}, {gaps}"
            )
        super().__init__(every_n_steps)
        self.gaps, self.samples, self.batch_size = list(gaps), samples, batch_size
        self._episodes: dict[int, list] = {}

    def episodes(self, trainer: L.Trainer, gap: int) -> list:
        if gap not in self._episodes:
            data = trainer.datamodule
            writer = EpisodeWriter(data.retrieval_mix or RetrievalMix(), data.tokenizer.backend_tokenizer, data.seq_len)
            haystack = data.heldout_tokens(self.samples * data.seq_len).tolist()
            self._episodes[gap] = recall_samples(
                writer, haystack, data.tokenizer.eos_token_id, data.seq_len, gap, self.samples
            )
        return self._episodes[gap]

    def evaluate(self, trainer: L.Trainer, pl_module: L.LightningModule, prefix: str = "") -> dict | None:
        if not trainer.is_global_zero:
            return None
        decoder, scalars = pl_module.decoder, {}
        with evaluating(pl_module), torch.no_grad(), trainer.precision_plugin.forward_context():
            for gap in self.gaps:
                episodes = self.episodes(trainer, gap)
                samples = [sample for sample, _ in episodes]
                scores = score_samples(decoder, trainer.datamodule.tokenizer, samples, self.batch_size)
                scalars[f"{prefix}recall/gap{gap}/exact"] = sum(s.exact for s in scores) / len(scores)
                distances = [s.answer_start - fact_at for s, fact_at in episodes]
                scalars[f"{prefix}recall/gap{gap}/distance"] = sum(distances) / len(distances)
                for layer, weights in enumerate(self._answer_weights(decoder, episodes, pl_module.device)):
                    for head, value in enumerate(weights.tolist()):
                        scalars[f"{prefix}recall/gap{gap}/weight/layer{layer}/head{head}"] = value
        for component in decoder.position:
            if getattr(component, "learnable", False):
                for head, slope in enumerate(component.slopes.tolist()):
                    scalars[f"{prefix}recall/slope/head{head}"] = slope
        log_scalars(trainer, pl_module, scalars, prefix)
        return scalars

    def _answer_weights(self, decoder, episodes: list, device) -> list[torch.Tensor]:
        """Per layer, per head: the attention weight from each answer's predicting token to its fact's value, mean
        over episodes (the eager backend hands out the weights)."""
        queries = torch.tensor([s.answer_start - 1 for s, _ in episodes], device=device)
        keys = torch.tensor([fact_at for _, fact_at in episodes], device=device)
        modules = [block.attn.weights for block in decoder.blocks]
        sums = [torch.zeros(decoder.config.num_heads, dtype=torch.float64, device=device) for _ in modules]

        def keep(layer: int, rows: torch.Tensor):
            def hook(module, inputs, weights):  # (batch, heads, queries, keys): one entry per episode and head
                sums[layer] += (
                    weights[torch.arange(len(rows), device=device), :, queries[rows], keys[rows]].double().sum(0)
                )

            return hook

        for start in range(0, len(episodes), self.batch_size):
            rows = torch.arange(start, min(start + self.batch_size, len(episodes)), device=device)
            tokens = torch.stack([episodes[i][0].tokens for i in rows.tolist()]).to(device)
            with forward_hooks(modules, partial(keep, rows=rows)):
                decoder.hidden_states(tokens, attention="eager")
        return [s.cpu() / len(episodes) for s in sums]
