"""Section prediction: the section reward against next-token cross-entropy."""
