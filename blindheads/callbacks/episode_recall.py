"""Recall of held-out retrieval-mix episodes at fixed gaps and at answer distances inside and beyond the training
window: does the model use what lies that far back, and where it does not, could it even see it?"""

from __future__ import annotations

from collections import defaultdict

import lightning as L
import torch

from blindheads.callbacks.periodic import PeriodicEvaluation, autocast_dtype, log_scalars
from blindheads.datamodules.retrieval_mix import EpisodeWriter, RetrievalMix
from blindheads.evaluation.answer_paths import AnswerPaths, answer_paths
from blindheads.evaluation.contexts import evaluating
from blindheads.evaluation.recall import recall_samples
from blindheads.evaluation.scoring import score_samples


class EpisodeRecall(PeriodicEvaluation):
    """Every ``every_n_steps``, on ``samples`` held-out episodes per point (the mix's templates over held-out text;
    the data module's ``retrieval_mix``, else the default mix). The points: each of ``gaps`` (tokens of text between
    fact and recall, in one training window: ``recall/gap{g}/...``) and each of ``distances`` (the answer's distance
    back to its fact as a multiple of the training window, episodes as long as they need: ``recall/distance{f}x/...``).
    Per point it logs:

    - ``exact``: share of answers predicted exactly (teacher-forced); ``distance``: mean tokens from answer to fact;
    - ``blind``: share of episodes whose fact gets exactly 0 weight from the answer's query in every layer and head;
      ``unreachable``: share with no chain of non-zero weights from fact to answer (``evaluation/answer_paths.py``);
    - ``failed_blind`` / ``failed_reachable``: wrong answers whose fact was blind / was not (with ``exact`` they
      sum to 1): the split between blindness and everything else, out-of-context degradation included;
    - ``weight/layer{l}/head{h}``: the mean weight from the answer's query to its fact (eager attention in the
      training precision);

    and ``recall/slope/head{h}``, the slopes of learnable ALiBi heads, to follow them over training.
    """

    def __init__(
        self,
        every_n_steps: int | None = 50,
        gaps: list[int] = (8, 128),
        distances: list[float] = (),
        samples: int = 32,
        batch_size: int = 16,
    ) -> None:
        if samples < 1 or batch_size < 1 or not (gaps or distances) or any(d <= 0 for d in distances):
            raise ValueError(
                f"samples and batch_size must be >= 1, distances > 0, and gaps or distances non-empty; got {samples}, "
                f"{batch_size}, gaps {list(gaps)}, distances {list(distances)}"
            )
        super().__init__(every_n_steps)
        self.gaps, self.distances = list(gaps), list(distances)
        self.samples, self.batch_size = samples, batch_size
        self._episodes: dict[str, list] = {}

    def points(self, seq_len: int) -> dict[str, dict[str, int]]:
        """Tag name -> ``recall_samples`` argument: ``{"gap8": {"gap": 8}, "distance2x": {"distance": 128}}``."""
        points = {f"gap{gap}": {"gap": gap} for gap in self.gaps}
        points.update({f"distance{f:g}x": {"distance": round(f * seq_len)} for f in self.distances})
        return points

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Build the episodes now: a gap the window cannot hold fails before training, not at the first evaluation."""
        for name, where in self.points(trainer.datamodule.seq_len).items():
            try:
                self.episodes(trainer, name, where)
            except ValueError as error:
                raise ValueError(f"EpisodeRecall {name}: {error}") from None

    def episodes(self, trainer: L.Trainer, name: str, where: dict[str, int]) -> list:
        if name not in self._episodes:
            data = trainer.datamodule
            writer = EpisodeWriter(data.retrieval_mix or RetrievalMix(), data.tokenizer.backend_tokenizer, data.seq_len)
            text = max(self.samples * data.seq_len, where.get("distance", 0) + data.seq_len)
            haystack = data.heldout_tokens(text).tolist()
            self._episodes[name] = recall_samples(
                writer, haystack, data.tokenizer.eos_token_id, data.seq_len, self.samples, **where
            )
        return self._episodes[name]

    def evaluate(self, trainer: L.Trainer, pl_module: L.LightningModule, prefix: str = "") -> dict | None:
        if not trainer.is_global_zero:
            return None
        decoder, scalars = pl_module.decoder, {}
        with evaluating(pl_module), torch.no_grad(), trainer.precision_plugin.forward_context():
            for name, where in self.points(trainer.datamodule.seq_len).items():
                episodes = self.episodes(trainer, name, where)
                scores = score_samples(decoder, trainer.datamodule.tokenizer, [s for s, _ in episodes], self.batch_size)
                exact = torch.tensor([s.exact for s in scores])
                paths = self._answer_paths(decoder, episodes, pl_module.device, autocast_dtype(trainer))
                tag = f"{prefix}recall/{name}"
                scalars[f"{tag}/exact"] = exact.float().mean().item()
                scalars[f"{tag}/distance"] = sum(s.answer_start - at for s, at in episodes) / len(episodes)
                scalars[f"{tag}/blind"] = paths.blind.float().mean().item()
                scalars[f"{tag}/unreachable"] = (~paths.reachable).float().mean().item()
                scalars[f"{tag}/failed_blind"] = (~exact & paths.blind).float().mean().item()
                scalars[f"{tag}/failed_reachable"] = (~exact & ~paths.blind).float().mean().item()
                for layer, weights in enumerate(paths.weights.double().mean(0).tolist()):
                    for head, value in enumerate(weights):
                        scalars[f"{tag}/weight/layer{layer}/head{head}"] = value
        for component in decoder.position:
            if getattr(component, "learnable", False):
                for head, slope in enumerate(component.slopes.tolist()):
                    scalars[f"{prefix}recall/slope/head{head}"] = slope
        log_scalars(trainer, pl_module, scalars, prefix)
        return scalars

    def _answer_paths(self, decoder, episodes: list, device, dtype: torch.dtype) -> AnswerPaths:
        """The answer paths of every episode, in the episodes' order (batched by length)."""
        by_length = defaultdict(list)
        for index, (sample, _) in enumerate(episodes):
            by_length[sample.length].append(index)
        weights, reachable = [None] * len(episodes), [None] * len(episodes)
        for indices in by_length.values():
            for start in range(0, len(indices), self.batch_size):
                batch = indices[start : start + self.batch_size]
                tokens = torch.stack([episodes[i][0].tokens for i in batch]).to(device)
                queries = torch.tensor([episodes[i][0].answer_start - 1 for i in batch], device=device)
                facts = torch.tensor([episodes[i][1] for i in batch], device=device)
                paths = answer_paths(decoder, tokens, queries, facts, dtype)
                for row, i in enumerate(batch):
                    weights[i], reachable[i] = paths.weights[row], paths.reachable[row]
        return AnswerPaths(torch.stack(weights), torch.stack(reachable))
