"""Reading results back for analysis: TensorBoard runs and probe outputs, as pandas tables."""
