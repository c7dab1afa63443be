"""What one training step computes, wherever it runs: model, data, job, gradient sums, reference."""
