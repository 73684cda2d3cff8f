"""The grid: every position setup (``setups``) of an experiment config trained and tested at several seeds
(``runs``), then one summary (``summary``): tables, reports, figures and curves, comparisons with ALiBi seed by seed
(``comparisons``, ``retrieval_comparisons``, ``losses``) and the findings judged by stated rules (``findings``)."""
