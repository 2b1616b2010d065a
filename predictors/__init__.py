"""whatif.predictors."""
