"""Every metric tag's spelling, once. The callbacks build their tags with these functions and the readers (the test
report, the grid summary, comparisons, the conjecture runs, the TensorBoard layout, the run tables) parse them with
these patterns: a tag renamed here is renamed for all of them, where a reader spelling its own would print "n/a".

The strings are those of committed results and users' TensorBoard logs: change them only with a migration. Builders
also take regex pieces (``recall_tag(r"gap\\d+", "exact")``), which is how the layout draws charts of many tags;
the fixed parts hold no regex metacharacters. Patterns match an optional ``val/`` or ``test/`` stage as ``stage``."""

from __future__ import annotations

import re

STAGES = ("val/", "test/")
_STAGE = r"(?P<stage>val/|test/)?"
_HEAD = r"/head(?P<head>\d+)"


def _pattern(body: str) -> re.Pattern:
    return re.compile(rf"^{_STAGE}{body}$")


def loss_tag(prefix: str = "") -> str:
    """``train/``, ``val/`` or ``test/`` loss, as the module logs it."""
    return f"{prefix}loss"


def extrapolation_tag(factor: int | str, part: str = "loss", prefix: str = "") -> str:
    """Held-out loss at ``factor`` times the training length (``part`` ``loss`` or ``bucket{k}``)."""
    return f"{prefix}extrapolation/{factor}x/{part}"


EXTRAPOLATION = _pattern(r"extrapolation/(?P<factor>\d+)x/(?P<part>\w+)")


def gap_point(gap: int | str) -> str:
    """A recall point by the tokens between fact and answer."""
    return f"gap{gap}"


def distance_point(factor: float) -> str:
    """A recall point by answer distance, a multiple of the training window."""
    return f"distance{factor:g}x"


def recall_tag(point: str, part: str, prefix: str = "") -> str:
    """``EpisodeRecall``'s ``part`` (``exact``, ``blind``, ``weight/layer0/head1``...) at ``point``
    (``gap8``, ``distance2x``, or ``heads``/``slope`` for the attribution and learnable slopes)."""
    return f"{prefix}recall/{point}/{part}"


def recall_figure_tag(prefix: str = "") -> str:
    """The image of recall against answer distance (``EpisodeRecall``, every point of one evaluation)."""
    return f"{prefix}recall/by_distance"


def recall_weight_tag(point: str, layer: int | str, head: int | str, prefix: str = "") -> str:
    """The mean weight a layer-head gives the fact from the answer's query at ``point``."""
    return recall_tag(point, f"weight/layer{layer}/head{head}", prefix)


def recall_head_tag(layer: int | str, head: int | str, name: str, prefix: str = "") -> str:
    """A layer-head's attribution ``name`` (``ablation_cost``, ``blind_by``...)."""
    return recall_tag("heads", f"layer{layer}/head{head}/{name}", prefix)


RECALL = _pattern(r"recall/(?P<point>gap(?P<gap>\d+)|distance(?P<distance>[\d.]+)x|\w+)/(?P<part>.+)")
RECALL_HEAD = _pattern(rf"recall/heads/layer(?P<layer>\d+){_HEAD}/(?P<name>\w+)")


def underflow_tag(layer: int | str, head: int | str, at: str | None = None, prefix: str = "") -> str:
    """A head's share of causal weights exactly zero: at the training length, or at length label ``at`` (``4x``)."""
    return f"{prefix}underflow/{f'{at}/' if at else ''}layer{layer}/head{head}"


UNDERFLOW = _pattern(rf"underflow/(?:(?P<at>[\d.]+x)/)?layer(?P<layer>\d+){_HEAD}")


def deaf_tag(layer: int | str, head: int | str, at: str | None = None, prefix: str = "") -> str:
    """A head's share of causal weights past the learning horizon (below e^-H of their row's largest), as
    ``underflow_tag`` places its share exactly zero."""
    return f"{prefix}deaf/{f'{at}/' if at else ''}layer{layer}/head{head}"


DEAF = _pattern(rf"deaf/(?:(?P<at>[\d.]+x)/)?layer(?P<layer>\d+){_HEAD}")


def deaf_figure_tag(prefix: str = "") -> str:
    """The layer x head heatmap of the share past the learning horizon."""
    return f"{prefix}deaf/heatmap"


def underflow_mean_tag(at: str, prefix: str = "") -> str:
    """The share exactly zero over all layers and heads at length label ``at``."""
    return f"{prefix}underflow/mean_{at}"


UNDERFLOW_MEAN = _pattern(r"underflow/mean_(?P<at>[\d.]+x)")


def underflow_figure_tag(name: str, prefix: str = "") -> str:
    """An underflow image (``heatmap``, ``by_distance``)."""
    return f"{prefix}underflow/{name}"


def blind_distance_tag(layer: int | str, head: int | str, prefix: str = "") -> str:
    """A head's blind distance measured in its eager weights."""
    return f"{prefix}blind_distance/layer{layer}/head{head}"


def blind_distance_figure_tag(prefix: str = "") -> str:
    """The image of each head's measured blind distance (each layer) beside its predicted ones."""
    return f"{prefix}blind_distance/by_head"


BLIND_DISTANCE = _pattern(rf"blind_distance/layer(?P<layer>\d+){_HEAD}")


def predicted_tag(softmax: str, head: int | str, prefix: str = "") -> str:
    """A head's blind distance predicted from its bias alone, for the ``materialized`` or ``fused`` softmax."""
    return f"{prefix}blind_distance_predicted/{softmax}/head{head}"


PREDICTED = _pattern(rf"blind_distance_predicted/(?P<softmax>materialized|fused){_HEAD}")


def retrieval_tag(task: str, name: str, prefix: str = "") -> str:
    """A retrieval task's metric (``auc_in_domain``, ``samples_out_of_domain``...)."""
    return f"{prefix}{task}/{name}"


def retrieval_exact_tag(task: str, length: int | str, depth: int | str, prefix: str = "") -> str:
    """A retrieval task's exact share at one context length and depth (percent)."""
    return retrieval_tag(task, f"exact/len{length}/depth{depth}", prefix)


RETRIEVAL = _pattern(
    r"(?P<task>passkey|needle)/(?P<name>auc_\w+|samples_\w+|exact/len(?P<length>\d+)/depth(?P<depth>\d+))"
)


def gradient_tag(name: str, head: int | str, layer: int | str | None = None, prefix: str = "") -> str:
    """``GradientBlindness``'s per-head statistic ``name``, per layer where it has one."""
    return f"{prefix}{name}{'' if layer is None else f'/layer{layer}'}/head{head}"


GRADIENT = _pattern(rf"(?P<name>(?:grad|weight)_\w+|\w+_grad\w*)(?:/layer(?P<layer>\d+))?{_HEAD}")


def at_stage(pattern: re.Pattern, tags, stage: str = "test/") -> list[re.Match]:
    """The matches of ``pattern`` among ``tags`` logged at ``stage`` (``""``: during training, with no stage); a
    match's ``string`` is its tag."""
    return [m for m in map(pattern.match, tags) if m and (m["stage"] or "") == stage]
