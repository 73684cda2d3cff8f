"""Recall of held-out retrieval-mix episodes at fixed gaps and at answer distances inside and beyond the training
window: does the model use what lies that far back, and where it does not, could it even see it?"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from functools import partial
from typing import NamedTuple

import lightning as L
import torch

from blindheads.callbacks.charts import chart
from blindheads.callbacks.periodic import PeriodicEvaluation, autocast_dtype, log_figures, log_scalars
from blindheads.datamodules.retrieval_mix import EpisodeWriter, RetrievalMix
from blindheads.datamodules.text import datamodule_of
from blindheads.evaluation.answer_paths import AnswerPaths
from blindheads.evaluation.attribution import (
    CARRIES,
    NEAR_BLIND,
    ablation_costs,
    capped_bias,
    carrier_classes,
    episode_paths,
    floored_bias,
    in_float64,
    recall,
)
from blindheads.evaluation.contexts import evaluating
from blindheads.evaluation.figures import RECALL_SERIES, recall_by_distance_figure
from blindheads.evaluation.recall import Episode, episode_set, recall_samples
from blindheads.evaluation.scoring import score_samples, top_share
from blindheads.evaluation.tags import (
    distance_point,
    gap_point,
    recall_figure_tag,
    recall_head_tag,
    recall_tag,
    recall_weight_tag,
)
from blindheads.modules.lm import DecoderLM
from blindheads.running import running

CONSTANT = 0.9  # a point where one predicted answer is this share of the episodes is answered by rote


def bits(exact: torch.Tensor) -> str:
    """Per-episode outcomes as text, one ``0`` or ``1`` per episode: 512 episodes take 512 bytes of JSON."""
    return "".join("1" if e else "0" for e in exact.tolist())


def point_title(name: str, where: dict[str, int]) -> str:
    """A point's chart title: ``exact at 128 tokens (distance2x)``, ``exact at gap 8``."""
    return f"exact at {where['distance']} tokens ({name})" if "distance" in where else f"exact at gap {where['gap']}"


class Measured(NamedTuple):
    """One point's episodes, which were answered exactly, and their answer paths."""

    episodes: list[Episode]
    exact: torch.Tensor
    paths: AnswerPaths

    @property
    def distance(self) -> float:
        return sum(e.distance for e in self.episodes) / len(self.episodes)


class EpisodeRecall(PeriodicEvaluation):
    """Recall of a fact on held-out episodes, by gap within the window and by distance beyond it.

    Every ``every_n_steps``, on ``samples`` held-out episodes per point (the mix's templates over held-out text;
    the data module's ``retrieval_mix``, else the default mix), drawn by ``seed`` (``None``: the run's, which
    ``seed_everything`` sets; rank 0's on every rank): each seed of a grid answers its own episodes. The points: each
    of ``gaps`` (tokens of text between fact and recall, the whole episode in one training window:
    ``recall/gap{g}/...``) and each of ``distances`` (the answer's distance back to its fact as a multiple of the
    training window, episodes as long as they need: ``recall/distance{f}x/...``; from 1x on they outgrow the window).
    Per point it logs:

    - ``exact``: share of answers predicted exactly (teacher-forced, the number ending where the value does);
      ``baseline``: the share of the most common answer, what a constant answer scores; ``constant_answer``: 1 where
      one predicted answer is at least ``CONSTANT`` of the episodes (``exact`` is then that answer's share, not recall);
    - ``episodes``: how many; ``distance``: mean tokens from answer to fact; ``length``: the longest episode's
      tokens; ``in_window``: 1 where every episode fits a training window;
    - ``blind``: share of episodes whose fact gets exactly 0 weight from the answer's query in every layer and head;
      ``unreachable``: share with no chain of non-zero weights from fact to answer (``evaluation/answer_paths.py``);
    - ``failed_blind`` / ``failed_reachable``: wrong answers whose fact was blind / was not (with ``exact`` they
      sum to 1): the split between blindness and everything else, out-of-context degradation included;
    - ``weight/layer{l}/head{h}``: the mean weight from the answer's query to its fact (eager attention in the
      training precision); ``zeros``: the share of those weights (episodes x layers x heads) exactly 0;

    With ``zero_free``, the zeros removed and nothing else (``evaluation/attribution.py``): ``exact_zero_free``,
    ``exact`` with the model computed in float64, and ``zeros_zero_free``, the share of fact weights still exactly
    0 there (a bias past ~708 nats). With ``floor`` (a negative number), ``exact_floored``: ``exact`` with every head's
    bias held at or above ``floor``, weights small but never 0.

    With ``attribution`` (``evaluation/attribution.py``), which heads carry recall and whether the bias lost it:

    - ``recall/heads/layer{l}/head{h}/ablation_cost``: the share of the farthest in-window point's episodes that
      zeroing the head's output at the answer's query loses (that point's distance: ``recall/heads/ablation_distance``);
      heads costing at least ``CARRIES`` whose mean fact weight there is at least ``NEAR_BLIND`` (e^-H, absolute:
      a head past the learning horizon reads no fact) carry recall (``recall/heads/carriers``: how many);
    - per carrier, ``.../blind_by``: the distance of the nearest point where it gives every episode's fact exactly 0
      weight, and ``.../exact_at_blind_by``: the recall there;
    - per point, ``carriers_blind`` / ``carriers_near_blind`` / ``carriers_reachable``: shares of episodes whose
      fact every carrier gives exactly 0 weight / less than ``NEAR_BLIND`` / some carrier gives more;
    - per point beyond the window, ``exact_capped``: ``exact`` with every head's bias beyond the window's farthest
      key held at its value there: what returns was lost to the bias (stacks with no bias, NoPE and RoPE: none).

    and ``recall/slope/head{h}``, the slopes of learnable ALiBi heads, to follow them over training. ``results_fields``
    holds what ``ResultsFile`` adds to ``results.json``: ``episode_seed`` and ``episode_sets`` (point -> sha256 of
    its episodes' token ids), so runs can be checked to have answered the same episodes or others, and
    ``episode_outcomes`` (point -> ``exact``, ``exact_zero_free``, ``exact_floored`` -> one ``0``/``1`` per episode,
    in the episodes' order), so runs that answered the same episodes can be compared episode by episode.
    """

    def __init__(
        self,
        every_n_steps: int | None = 50,
        gaps: Sequence[int] = (8, 128),
        distances: Sequence[float] = (),
        samples: int = 32,
        batch_size: int = 16,
        seed: int | None = None,
        attribution: bool = False,
        zero_free: bool = False,
        floor: float | None = None,
    ) -> None:
        if samples < 1 or batch_size < 1 or not (gaps or distances) or any(d <= 0 for d in distances):
            raise ValueError(
                f"samples and batch_size must be >= 1, distances > 0, and gaps or distances non-empty; got {samples}, "
                f"{batch_size}, gaps {list(gaps)}, distances {list(distances)}"
            )
        if floor is not None and not -math.inf < floor < 0:
            raise ValueError(f"EpisodeRecall floor must be a finite negative bias, got {floor}")
        super().__init__(every_n_steps)
        self.gaps, self.distances = list(gaps), list(distances)
        self.samples, self.batch_size, self.seed, self.attribution = samples, batch_size, seed, attribution
        self.zero_free, self.floor = zero_free, floor
        self._episodes: dict[tuple[str, int], list[Episode]] = {}
        self.results_fields: dict = {}

    def points(self, seq_len: int) -> dict[str, dict[str, int]]:
        """Tag name -> ``recall_samples`` argument: ``{"gap8": {"gap": 8}, "distance2x": {"distance": 128}}``."""
        points = {gap_point(gap): {"gap": gap} for gap in self.gaps}
        points.update({distance_point(f): {"distance": round(f * seq_len)} for f in self.distances})
        return points

    def charts(self, trainer: L.Trainer, pl_module: L.LightningModule, categories: dict[str, dict]) -> None:
        """Recall by distance: one chart per point of every ``EpisodeRecall`` of the run, its exact recall over
        training (one line: TensorBoard gives every line of a run one colour). The image ``recall/by_distance`` sets
        the points side by side; the failures, blind or reachable, are under SCALARS."""
        seq_len = datamodule_of(trainer).seq_len
        recalls = [c for c in running(trainer).callbacks if isinstance(c, EpisodeRecall)]
        points = {name: where for c in recalls for name, where in c.points(seq_len).items()}
        categories["recall by distance"] = {
            point_title(name, where): chart(recall_tag(re.escape(name), "exact") + "$")
            for name, where in points.items()
        }

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Build the episodes now: a gap the window cannot hold fails before training, not at the first evaluation."""
        seed = self.seed if self.seed is not None else int(os.environ.get("PL_GLOBAL_SEED", 0))
        data = datamodule_of(trainer)
        seed = trainer.strategy.broadcast(seed, src=0)  # rank 0's: every rank answers the same episodes
        self.results_fields = {"episode_seed": seed, "episode_sets": self.draw(data, seed)}
        if self.attribution and not self._in_window(data.seq_len, self.points(data.seq_len)):
            raise ValueError(
                "EpisodeRecall attribution ablates heads at an in-window point: add a gap or a distance < 1"
            )

    def draw(self, data, seed: int) -> dict[str, str]:
        """Every point's episodes from the data module's held-out text, drawn by ``seed`` (what later evaluations
        answer), and each point's episode set (sha256 of its token ids)."""
        self._episode_seed, sets = seed, {}
        for name, where in self.points(data.seq_len).items():
            try:
                sets[name] = episode_set(self.episodes(data, name, where))
            except ValueError as error:
                raise ValueError(f"EpisodeRecall {name}: {error}") from None
        return sets

    def _in_window(self, seq_len: int, names) -> list[str]:
        """The points among ``names`` whose every episode fits a training window."""
        return [n for n in names if max(e.sample.length for e in self._episodes[(n, self._episode_seed)]) <= seq_len]

    def episodes(self, data, name: str, where: dict[str, int]) -> list[Episode]:
        """The episodes of point ``name`` (drawn by ``draw``'s seed), made once."""
        key = (name, self._episode_seed)
        if key not in self._episodes:
            writer = EpisodeWriter(data.retrieval_mix or RetrievalMix(), data.tokenizer.backend_tokenizer, data.seq_len)
            text = max(self.samples * data.seq_len, where.get("distance", 0) + data.seq_len)
            haystack = data.heldout_tokens(text).tolist()
            self._episodes[key] = recall_samples(
                writer, haystack, data.tokenizer.eos_token_id, data.seq_len, self.samples, seed=key[1], **where
            )
        return self._episodes[key]

    def evaluate(self, trainer: L.Trainer, pl_module: DecoderLM, prefix: str = "") -> dict | None:
        if not trainer.is_global_zero:
            return None
        decoder, scalars, measured = pl_module.decoder, {}, {}
        outcomes: dict[str, dict[str, str]] = {}
        # a model computing in float64 already is its own zero-free copy: its recall is re-scored as it is
        wide = in_float64(decoder) if self.zero_free and next(decoder.parameters()).dtype != torch.float64 else None
        with evaluating(pl_module), torch.no_grad(), trainer.precision_plugin.forward_context():
            for name, where in self.points(datamodule_of(trainer).seq_len).items():
                episodes = self.episodes(datamodule_of(trainer), name, where)
                samples = [e.sample for e in episodes]
                scores = score_samples(decoder, datamodule_of(trainer).tokenizer, samples, self.batch_size)
                exact = torch.tensor([s.exact for s in scores])
                paths = episode_paths(decoder, episodes, self.batch_size, autocast_dtype(trainer))
                measured[name] = Measured(episodes, exact, paths)
                tag = partial(recall_tag, name, prefix=prefix)
                length = max(s.length for s in samples)
                scalars[tag("exact")] = exact.float().mean().item()
                outcomes[name] = {"exact": bits(exact)}
                scalars[tag("episodes")] = len(episodes)
                scalars[tag("baseline")] = top_share(s.answer for s in samples)
                scalars[tag("constant_answer")] = float(top_share(s.predicted for s in scores) >= CONSTANT)
                scalars[tag("distance")] = measured[name].distance
                scalars[tag("length")] = length
                scalars[tag("in_window")] = float(length <= datamodule_of(trainer).seq_len)
                scalars[tag("blind")] = paths.blind.float().mean().item()
                scalars[tag("unreachable")] = (~paths.reachable).float().mean().item()
                scalars[tag("failed_blind")] = (~exact & paths.blind).float().mean().item()
                scalars[tag("failed_reachable")] = (~exact & ~paths.blind).float().mean().item()
                for layer, weights in enumerate(paths.weights.double().mean(0).tolist()):
                    for head, value in enumerate(weights):
                        scalars[recall_weight_tag(name, layer, head, prefix)] = value
                scalars[tag("zeros")] = (paths.weights == 0).double().mean().item()
                scalars.update(
                    self._interventions(
                        decoder, wide, datamodule_of(trainer).tokenizer, paths, episodes, tag, outcomes[name]
                    )
                )
            if self.attribution:
                scalars.update(self._attribute(trainer, decoder, measured, prefix))
        for name, values in decoder.position.learned_head_parameters().items():
            for head, value in enumerate(values.tolist() if values.dim() == 1 else []):
                scalars[recall_tag(name, f"head{head}", prefix)] = value
        log_scalars(trainer, pl_module, scalars, prefix)
        self.results_fields["episode_outcomes"] = outcomes
        by_distance = {
            m.distance: {part: scalars[t] for part in RECALL_SERIES if (t := recall_tag(name, part, prefix)) in scalars}
            for name, m in measured.items()
        }
        window = datamodule_of(trainer).seq_len
        log_figures(
            trainer, pl_module, {recall_figure_tag(prefix): lambda _: recall_by_distance_figure(by_distance, window)}
        )
        return scalars

    def _interventions(
        self, decoder, wide, tokenizer, paths: AnswerPaths, episodes: list[Episode], tag, outcomes: dict[str, str]
    ) -> dict:
        """``exact_zero_free`` and ``zeros_zero_free`` from ``wide``, the decoder in float64 (with ``zero_free``:
        where the training precision left no fact weight exactly 0, float64 leaves none either, so its weights are
        measured only where it did); ``exact_floored`` (with ``floor``). Each one's per-episode outcomes go into
        ``outcomes``."""
        scalars = {}
        if self.zero_free and wide is None:  # float64 already: the same computation, its values copied
            exact = recall(decoder, tokenizer, episodes, self.batch_size)
            scalars[tag("exact_zero_free")] = exact.double().mean().item()
            outcomes["exact_zero_free"] = bits(exact)
            scalars[tag("zeros_zero_free")] = (paths.weights == 0).double().mean().item()
        if wide is not None:
            with torch.autocast(next(wide.parameters()).device.type, enabled=False):
                exact = recall(wide, tokenizer, episodes, self.batch_size)
                if (paths.weights == 0).any():
                    paths = episode_paths(wide, episodes, self.batch_size, torch.float64)
            scalars[tag("exact_zero_free")] = exact.double().mean().item()
            outcomes["exact_zero_free"] = bits(exact)
            scalars[tag("zeros_zero_free")] = (paths.weights == 0).double().mean().item()
        if self.floor is not None and decoder.position.has_bias:
            with floored_bias(decoder, self.floor):
                exact = recall(decoder, tokenizer, episodes, self.batch_size)
            scalars[tag("exact_floored")] = exact.double().mean().item()
            outcomes["exact_floored"] = bits(exact)
        return scalars

    def _attribute(self, trainer: L.Trainer, decoder, measured: dict[str, Measured], prefix: str) -> dict[str, float]:
        """The attribution scalars (see the class docstring) from the points already measured."""
        tokenizer, seq_len, scalars = datamodule_of(trainer).tokenizer, datamodule_of(trainer).seq_len, {}
        inside = self._in_window(seq_len, measured)
        near = max(inside, key=lambda n: measured[n].distance)
        costs = ablation_costs(decoder, tokenizer, measured[near].episodes, self.batch_size)
        # a head whose fact weight there is past the learning horizon does not read the fact, whatever its cost
        carriers = (costs >= CARRIES) & (measured[near].paths.weights.double().mean(0) >= NEAR_BLIND)
        tag = partial(recall_tag, "heads", prefix=prefix)
        scalars[tag("ablation_distance")] = measured[near].distance
        scalars[tag("carriers")] = int(carriers.sum())
        for layer, row in enumerate(costs.tolist()):
            for head, cost in enumerate(row):
                scalars[recall_head_tag(layer, head, "ablation_cost", prefix)] = cost
        by_distance = sorted(measured.values(), key=lambda m: m.distance)
        for layer, head in carriers.nonzero().tolist():
            blind = next((m for m in by_distance if (m.paths.weights[:, layer, head] == 0).all()), None)
            if blind is not None:
                scalars[recall_head_tag(layer, head, "blind_by", prefix)] = blind.distance
                scalars[recall_head_tag(layer, head, "exact_at_blind_by", prefix)] = blind.exact.float().mean().item()
        for name, point in measured.items():
            if carriers.any():
                for kind, share in carrier_classes(point.paths.weights, carriers, NEAR_BLIND).items():
                    scalars[recall_tag(name, f"carriers_{kind}", prefix)] = share.float().mean().item()
            if name not in inside and decoder.position.has_bias:
                with capped_bias(decoder, seq_len - 1):
                    capped = recall(decoder, tokenizer, point.episodes, self.batch_size)
                scalars[recall_tag(name, "exact_capped", prefix)] = capped.float().mean().item()
        return scalars
