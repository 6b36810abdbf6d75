"""Models: the built-in decoder-only transformer (Flax NNX) and the character tokenizer."""
