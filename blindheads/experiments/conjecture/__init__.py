"""The conjecture: where does learning through a small attention weight stop? Its arms (``far_head``: a bare head;
``far_decoder``: the project's decoder), its runs (``runs``) and its tables, figure and verdict (``report``)."""
