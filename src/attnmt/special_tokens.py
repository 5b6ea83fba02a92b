"""The special token ids, defined once: the vocabulary reserves them (data/tokenizer.py),
the model pads, masks and starts the target with them, decoding starts and stops on them.

Plain integers with no dependencies, so every layer (data without jax included) can share
them.
"""

PAD_ID = 0  # padding: masked out of attention and of the loss
EOS_ID = 1  # end of sentence: ends every source and target sequence
BOS_ID = 2  # beginning of sentence: the decoder's first input, never emitted
UNK_ID = 3  # a piece outside the vocabulary
NUM_SPECIAL_TOKENS = 4  # ids below this are the ones above; pieces start here
