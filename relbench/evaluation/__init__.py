"""Evaluation: perplexity at growing lengths (perplexity), every task of `relbench extrapolate`
(extrapolate) and reach over the seeds that learned (reach)."""
