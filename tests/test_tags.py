"""The tag table: each family's pattern reads back what its builder writes, and no other module spells a tag itself
(a reader with its own spelling prints "n/a" when the writer's changes)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from blindheads.evaluation import tags
from blindheads.evaluation.tags import (
    BLIND_DISTANCE,
    EXTRAPOLATION,
    GRADIENT,
    PREDICTED,
    RECALL,
    RECALL_HEAD,
    RETRIEVAL,
    UNDERFLOW,
    UNDERFLOW_MEAN,
    at_stage,
    blind_distance_tag,
    distance_point,
    extrapolation_tag,
    gap_point,
    gradient_tag,
    predicted_tag,
    recall_head_tag,
    recall_tag,
    recall_weight_tag,
    retrieval_exact_tag,
    retrieval_tag,
    underflow_mean_tag,
    underflow_tag,
)

PACKAGE = Path(__file__).resolve().parent.parent / "blindheads"
# Pieces of tag spellings no module but the table may hold in a string (docstrings aside).
STAGED_LOSSES = ("train/loss", "val/loss", "test/loss")
SPELLINGS = ("recall/", "underflow/", "blind_distance/", "_predicted/", "extrapolation/", "/exact/len", "/auc_")
SPELLINGS += STAGED_LOSSES
ALLOWED = {  # (file under blindheads/, spelling): why it stays
    ("evaluation/recall.py", "recall/"): "an episode's random seed, not a tag",
    **{
        ("modules/lm.py", loss): "the module logs its losses and sits below evaluation: it cannot import the table"
        for loss in STAGED_LOSSES
    },
}


@pytest.mark.parametrize(
    ("tag", "pattern", "groups"),
    [
        (extrapolation_tag(4, prefix="test/"), EXTRAPOLATION, {"stage": "test/", "factor": "4", "part": "loss"}),
        (extrapolation_tag(2, "bucket1"), EXTRAPOLATION, {"stage": None, "factor": "2", "part": "bucket1"}),
        (recall_tag(gap_point(8), "exact", "val/"), RECALL, {"stage": "val/", "point": "gap8", "gap": "8"}),
        (recall_tag(distance_point(1.5), "blind"), RECALL, {"distance": "1.5", "gap": None, "part": "blind"}),
        (recall_weight_tag("gap64", 1, 3), RECALL, {"point": "gap64", "part": "weight/layer1/head3"}),
        (recall_head_tag(0, 2, "blind_by", "test/"), RECALL, {"point": "heads", "part": "layer0/head2/blind_by"}),
        (
            recall_head_tag(1, 7, "ablation_cost", "test/"),
            RECALL_HEAD,
            {"layer": "1", "head": "7", "name": "ablation_cost"},
        ),
        (recall_tag("slope", "head5"), RECALL, {"point": "slope", "gap": None, "part": "head5"}),
        (underflow_tag(1, 2), UNDERFLOW, {"stage": None, "at": None, "layer": "1", "head": "2"}),
        (underflow_tag(0, 7, at="1.5x", prefix="test/"), UNDERFLOW, {"at": "1.5x", "layer": "0", "head": "7"}),
        (underflow_mean_tag("4x", "test/"), UNDERFLOW_MEAN, {"stage": "test/", "at": "4x"}),
        (blind_distance_tag(3, 1, "test/"), BLIND_DISTANCE, {"layer": "3", "head": "1"}),
        (predicted_tag("fused", 6), PREDICTED, {"softmax": "fused", "head": "6"}),
        (retrieval_tag("needle", "auc_out_of_domain", "test/"), RETRIEVAL, {"task": "needle", "length": None}),
        (retrieval_exact_tag("passkey", 512, 25), RETRIEVAL, {"task": "passkey", "length": "512", "depth": "25"}),
        (gradient_tag("grad_blind_distance", 1, 0, "val/"), GRADIENT, {"name": "grad_blind_distance", "layer": "0"}),
        (gradient_tag("slope_grad_beyond_blind", 4), GRADIENT, {"name": "slope_grad_beyond_blind", "head": "4"}),
    ],
)
def test_each_pattern_reads_back_what_its_builder_writes(tag, pattern, groups):
    match = pattern.match(tag)
    assert match, f"{pattern.pattern} does not match {tag}"
    assert {name: match[name] for name in groups} == groups


def test_the_tags_stay_spelled_as_logged_runs_have_them():
    assert recall_tag(distance_point(2.0), "exact", "test/") == "test/recall/distance2x/exact"
    assert underflow_tag(0, 1, at="8x") == "underflow/8x/layer0/head1"
    assert predicted_tag("materialized", 3, "test/") == "test/blind_distance_predicted/materialized/head3"
    assert retrieval_exact_tag("passkey", 256, 50) == "passkey/exact/len256/depth50"
    assert not UNDERFLOW.match(underflow_mean_tag("1x")) and not RECALL.match("test/passkey/auc_in_domain")


def test_at_stage_keeps_only_that_stage():
    logged = [recall_tag("gap8", "exact", stage) for stage in ("", "val/", "test/")]
    assert [m.string for m in at_stage(RECALL, logged)] == [logged[2]]
    assert [m.string for m in at_stage(RECALL, logged, "")] == [logged[0]]


def strings(tree: ast.AST) -> list[str]:
    """Every string constant in the source (f-strings' literal parts too) but docstrings."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_no_module_but_the_table_spells_a_tag():
    table = Path(tags.__file__).resolve()
    found = sorted(
        (path.relative_to(PACKAGE).as_posix(), spelling)
        for path in PACKAGE.rglob("*.py")
        if path.resolve() != table
        for text in strings(ast.parse(path.read_text()))
        for spelling in SPELLINGS
        if spelling in text
    )
    assert set(found) - set(ALLOWED) == set(), "build or parse these tags with blindheads.evaluation.tags"
    assert set(ALLOWED) <= set(found), "an allowed spelling no longer occurs: remove it from ALLOWED"
